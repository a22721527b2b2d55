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

/// The controller board's own signals: each rack's rope (leak and rope
/// fault) in, the controller-healthy relay and the alarm beacon out.
/// [`loopwarden_boards::pins::BoardPins`] over any `embedded-hal` pins
/// implements it (Linux GPIO on a board, the simulated lines in the twin).
pub trait BoardIo: Send {
    /// Every rope: which are wet and which report a fault (cut or
    /// shorted); an error when any input line cannot be read.
    fn ropes(&mut self) -> Result<Ropes, String>;
    /// Racks with a rope on this board, bit n = rack n.
    fn roped(&self) -> u16;
    /// One pulse of the controller-healthy relay (a completed step).
    fn pulse_healthy(&mut self) -> Result<(), String>;
    /// Lights or darkens the beacon.
    fn beacon(&mut self, on: bool) -> Result<(), String>;
}

/// What the ropes read, bit n = rack n.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ropes {
    /// Ropes reading wet.
    pub wet: u16,
    /// Ropes whose rope controller reports a fault.
    pub faults: u16,
}

impl<I, O> BoardIo for loopwarden_boards::pins::BoardPins<I, O>
where
    I: embedded_hal::digital::InputPin + Send,
    O: embedded_hal::digital::OutputPin + Send,
{
    fn ropes(&mut self) -> Result<Ropes, String> {
        let mut r = Ropes::default();
        for rack in 0..16 {
            match self.rope(rack) {
                Some(Ok(s)) => {
                    r.wet |= u16::from(s.wet) << rack;
                    r.faults |= u16::from(s.fault) << rack;
                }
                Some(Err(e)) => return Err(format!("leak rope of rack {rack}: {e:?}")),
                None => {}
            }
        }
        Ok(r)
    }

    fn roped(&self) -> u16 {
        loopwarden_boards::pins::BoardPins::roped(self)
    }

    fn pulse_healthy(&mut self) -> Result<(), String> {
        loopwarden_boards::pins::BoardPins::pulse_healthy(self)
            .map_err(|e| format!("controller-healthy relay: {e:?}"))
    }

    fn beacon(&mut self, on: bool) -> Result<(), String> {
        self.set_alarm(on)
            .map_err(|e| format!("alarm beacon: {e:?}"))
    }
}

/// What an operator asks of the controller (from the console).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorAction {
    /// Reopen a rack whose leak is latched (refused while its rope or the
    /// CDU's leak input reads wet, or read wet when last heard, or its leak
    /// sensing is lost).
    ClearLeak {
        /// The rack.
        rack: usize,
    },
    /// Put a tripped or seized pump back in service (refused while the CDU
    /// still reports the pump's fault).
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
    /// Who asks: the console peer's user (`uid-1000`, or its name), or a
    /// serial login.
    pub operator: Ident,
    /// The answer.
    pub reply: tokio::sync::oneshot::Sender<Result<String, String>>,
}
