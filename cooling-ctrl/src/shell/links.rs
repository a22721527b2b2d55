//! How the shell meets the controller's other parts: the northbound
//! server's link, the board's pins and the operator's requests from the
//! console.
//!
//! Glossary:
//! - *link*: the channels between the shell and a task beside it.
use super::*;

/// The northbound server's side of the shell: where each step's snapshot
/// goes, and the bounded writes the building management system made.
#[derive(Debug)]
pub struct NorthboundLink {
    /// Each step's snapshot for [`crate::northbound::serve`].
    pub snapshots: watch::Sender<NorthboundSnapshot>,
    /// Accepted writes (`None`: writes are disabled).
    pub writes: Option<mpsc::Receiver<NorthboundWrite>>,
}

/// The controller board's own signals: leak ropes in, the pump-enable
/// relay and the alarm beacon out. [`loopwarden_boards::pins::BoardPins`]
/// over any `embedded-hal` pins implements it (Linux GPIO on a board, the
/// simulated lines in the twin).
pub trait BoardIo: Send {
    /// Racks whose leak rope reports a leak, bit n = rack n.
    fn leaks(&mut self) -> Result<u16, String>;
    /// Drives the relay and the beacon.
    fn drive(&mut self, pump_enable: bool, beacon: bool) -> Result<(), String>;
}

impl<I, O> BoardIo for loopwarden_boards::pins::BoardPins<I, O>
where
    I: embedded_hal::digital::InputPin + Send,
    O: embedded_hal::digital::OutputPin + Send,
{
    fn leaks(&mut self) -> Result<u16, String> {
        let mut bits = 0u16;
        for rack in 0..self.racks().min(16) {
            match self.leak(rack) {
                Some(Ok(true)) => bits |= 1 << rack,
                Some(Ok(false)) | None => {}
                Some(Err(e)) => return Err(format!("leak rope of rack {rack}: {e:?}")),
            }
        }
        Ok(bits)
    }

    fn drive(&mut self, pump_enable: bool, beacon: bool) -> Result<(), String> {
        self.set_pump_enable(pump_enable)
            .map_err(|e| format!("pump-enable relay: {e:?}"))?;
        self.set_alarm(beacon)
            .map_err(|e| format!("alarm beacon: {e:?}"))
    }
}

/// What an operator asks of the controller (from the console).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorAction {
    /// Reopen a rack whose leak is latched (refused while its rope or the
    /// CDU's leak input still reads wet).
    ClearLeak {
        /// The rack.
        rack: usize,
    },
    /// Put a tripped pump back in service.
    ClearPumpTrip {
        /// The pump.
        pump: Pump,
    },
}

/// An operator's request and where its answer goes (`Ok`: what was done,
/// `Err`: why not).
#[derive(Debug)]
pub struct OperatorRequest {
    /// What is asked.
    pub action: OperatorAction,
    /// The answer.
    pub reply: tokio::sync::oneshot::Sender<Result<String, String>>,
}
