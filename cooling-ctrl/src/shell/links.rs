//! How the shell meets the controller's other parts: the northbound
//! server's link, the board's pins and the operator's requests from the
//! console.
//!
//! Glossary:
//! - *link*: the channels between the shell and a task beside it.
use super::*;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// The northbound server's side of the shell: where each step's snapshot
/// goes, and the bounded writes the building management system made.
#[derive(Debug)]
pub struct NorthboundLink {
    /// Each step's snapshot for [`crate::northbound::serve`].
    pub snapshots: watch::Sender<NorthboundSnapshot>,
    /// Accepted writes, each request's together (`None`: writes are
    /// disabled).
    pub writes: Option<mpsc::Receiver<Vec<NorthboundWrite>>>,
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
/// `Err`: why not). Made with [`OperatorRequest::new`], whose
/// [`PendingRequest`] waits for the answer.
#[derive(Debug)]
pub struct OperatorRequest {
    /// What is asked.
    pub action: OperatorAction,
    /// Who asks: the console peer's user (`uid-1000`, or its name), or a
    /// serial login.
    pub operator: Ident,
    /// The answer.
    pub reply: tokio::sync::oneshot::Sender<Result<String, String>>,
    /// Who has it: the loop takes it to carry it out, or the asker
    /// withdraws it; whoever comes first (see [`OperatorRequest::take`]).
    claim: Arc<AtomicU8>,
}

const PENDING: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

impl OperatorRequest {
    /// `action` asked by `operator`, and its answer to wait for.
    pub fn new(action: OperatorAction, operator: Ident) -> (Self, PendingRequest) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let claim = Arc::new(AtomicU8::new(PENDING));
        let req = Self {
            action,
            operator,
            reply,
            claim: claim.clone(),
        };
        (req, PendingRequest { answer, claim })
    }

    /// The loop takes the request to carry it out: `false` when the asker
    /// withdrew it first (stopped waiting), and it must not be.
    pub fn take(&self) -> bool {
        self.claim
            .compare_exchange(PENDING, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// What became of an operator's request, as its asker saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOutcome {
    /// Carried out, or refused by the loop: its words.
    Answered(Result<String, String>),
    /// The loop did not take it in time: withdrawn, not carried out.
    Withdrawn,
    /// The loop stopped before answering.
    Dropped,
}

/// An operator's request handed to the loop, waiting for its answer.
#[derive(Debug)]
pub struct PendingRequest {
    answer: tokio::sync::oneshot::Receiver<Result<String, String>>,
    claim: Arc<AtomicU8>,
}

impl PendingRequest {
    /// Waits `within` for the loop to take the request; then withdraws it,
    /// unless the loop took it first, in which case it waits for the
    /// answer (the loop answers as soon as it carried it out). A request
    /// withdrawn is never carried out later.
    pub async fn outcome(mut self, within: std::time::Duration) -> RequestOutcome {
        if let Ok(answer) = tokio::time::timeout(within, &mut self.answer).await {
            return answer.map_or(RequestOutcome::Dropped, RequestOutcome::Answered);
        }
        let withdrawn = self
            .claim
            .compare_exchange(PENDING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if withdrawn {
            return RequestOutcome::Withdrawn;
        }
        self.answer
            .await
            .map_or(RequestOutcome::Dropped, RequestOutcome::Answered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn request() -> (OperatorRequest, PendingRequest) {
        let who = Ident::new("uid-1000").expect("an ident");
        OperatorRequest::new(OperatorAction::ClearLeak { rack: 2 }, who)
    }

    #[tokio::test]
    async fn a_request_taken_in_time_is_answered() {
        let (req, pending) = request();
        assert!(req.take());
        req.reply.send(Ok("cleared".into())).unwrap();
        assert_eq!(
            pending.outcome(Duration::from_secs(5)).await,
            RequestOutcome::Answered(Ok("cleared".into()))
        );
    }

    #[tokio::test]
    async fn a_request_not_taken_in_time_is_withdrawn_and_never_carried_out() {
        let (req, pending) = request();
        assert_eq!(
            pending.outcome(Duration::ZERO).await,
            RequestOutcome::Withdrawn
        );
        assert!(!req.take(), "the loop, late, must not carry it out");
    }

    #[tokio::test]
    async fn a_request_taken_just_before_the_asker_gives_up_is_waited_for() {
        let (req, pending) = request();
        assert!(req.take());
        let answered = tokio::spawn(async move {
            tokio::task::yield_now().await;
            req.reply.send(Err("still wet".into())).unwrap();
        });
        assert_eq!(
            pending.outcome(Duration::ZERO).await,
            RequestOutcome::Answered(Err("still wet".into()))
        );
        answered.await.unwrap();
    }
}
