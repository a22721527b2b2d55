//! What every Modbus server of the project answers, and how: the simulated
//! CDU and the controller's northbound server each keep their own register
//! file (what a read returns, what a write does); the functions they offer
//! and the exception for the others are decided here once.
//!
//! Glossary:
//! - *register file*: a server's input and holding registers as clients
//!   see them.

use tokio_modbus::{ExceptionCode, Request, Response};

use crate::modbus_map::Kind;

/// A server's registers.
pub trait RegisterFile {
    /// `count` registers of `kind` from `addr`, or the exception to answer.
    fn read_registers(&self, kind: Kind, addr: u16, count: u16) -> Result<Vec<u16>, ExceptionCode>;
    /// Writes `words` into the holding registers from `addr` (all or
    /// nothing), or the exception to answer.
    fn write_registers(&self, addr: u16, words: &[u16]) -> Result<(), ExceptionCode>;
}

/// Answers one request: reads of input and holding registers, single and
/// multiple register writes; any other function is exception 1 (illegal
/// function).
pub fn answer(r: &impl RegisterFile, req: Request<'_>) -> Result<Response, ExceptionCode> {
    match req {
        Request::ReadInputRegisters(a, n) => r
            .read_registers(Kind::Input, a, n)
            .map(Response::ReadInputRegisters),
        Request::ReadHoldingRegisters(a, n) => r
            .read_registers(Kind::Holding, a, n)
            .map(Response::ReadHoldingRegisters),
        Request::WriteSingleRegister(a, w) => r
            .write_registers(a, &[w])
            .map(|()| Response::WriteSingleRegister(a, w)),
        Request::WriteMultipleRegisters(a, ws) => r
            .write_registers(a, &ws)
            .map(|()| Response::WriteMultipleRegisters(a, ws.len() as u16)),
        _ => Err(ExceptionCode::IllegalFunction),
    }
}
