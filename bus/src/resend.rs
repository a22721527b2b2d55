//! Repair from the source: a reader that missed some of a node's numbers
//! asks the node to publish its logged events again, and the node answers
//! from its flash log (`docs/bus.md` §4.8).
//!
//! - [`desk`]: which requests a node answers, and the budgets that bound
//!   what it publishes for them (pure);
//! - [`ask`]: when a reader asks, and for what (pure);
//! - [`Resender`]: the node's side, a task that reads the log through the
//!   recorder and publishes the frames and the report;
//! - [`request`]: the reader's side, one signed request.
//!
//! Glossary:
//! - *request*: a [`ResendRequest`] on the node's `resend` topic.
//! - *resent frame*: a logged event frame published again, unchanged (its
//!   own number, time and CRC), on the node's `resent` topic.
//! - *report*: the node's [`ResendReport`] after the frames, on the same
//!   topic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use loopwarden_protocol::auth::Signer;
use loopwarden_protocol::{
    CommandAuth, Family, Frame, Ident, Message, ResendCode, ResendReport, ResendRequest, Role,
    Topic,
};
use loopwarden_store::recorder::Recorder;
use tokio::sync::mpsc;

use crate::keys::SignKey;
use crate::{now_ms, Bus, Inbound, PublishError};

pub mod ask;
pub mod desk;

pub use ask::Asker;
pub use desk::{Answer, Desk};

/// Requests waiting for the resender at most; more are withheld.
const WAITING_MAX: usize = 64;

/// A node's resender: hand it the frames received on the node's `resend`
/// topic ([`Resender::offer`]); it answers them one at a time.
#[derive(Debug, Clone)]
pub struct Resender {
    requests: mpsc::Sender<Inbound>,
    counts: Arc<Counts>,
}

/// What the resender did, for the node's metrics and console.
#[derive(Debug, Default)]
pub struct Counts {
    /// Requests served (in whole or part).
    pub served: AtomicU64,
    /// Requests refused with a report.
    pub refused: AtomicU64,
    /// Requests withheld: no budget, not a request, or too many waiting.
    pub withheld: AtomicU64,
    /// Frames resent.
    pub frames: AtomicU64,
}

/// [`Counts`] read at one moment: what operators see on `/metrics` and
/// in `ctl status` (JSON `resend`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ResendCounts {
    /// Answered with the frames asked for (in whole or part) and a report.
    pub served: u64,
    /// Answered with a refusal report.
    pub refused: u64,
    /// Dropped without an answer: the resend budget was empty, the frame
    /// was not a request, or too many waited.
    pub withheld: u64,
    /// Logged event frames published again.
    pub frames: u64,
}

impl std::fmt::Display for ResendCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} served ({} frames), {} refused, {} withheld",
            self.served, self.frames, self.refused, self.withheld
        )
    }
}

impl Counts {
    /// The counts now.
    pub fn snapshot(&self) -> ResendCounts {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        ResendCounts {
            served: load(&self.served),
            refused: load(&self.refused),
            withheld: load(&self.withheld),
            frames: load(&self.frames),
        }
    }
}

impl Resender {
    /// Starts the task that answers requests for `bus`'s node from the
    /// log `recorder` keeps, to the readers of `signers` that may resend.
    pub fn start(bus: Bus, recorder: Recorder, signers: Vec<Signer>) -> Self {
        let (requests, rx) = mpsc::channel(WAITING_MAX);
        let counts = Arc::new(Counts::default());
        let own = bus.own_topic(Family::Resend).ok();
        if own.is_none() {
            tracing::error!(node = %bus.node(), "resend: this node has no resend topic; every request is refused");
        }
        let desk = Desk::new(own, signers);
        tokio::spawn(serve(bus, recorder, desk, rx, counts.clone()));
        Self { requests, counts }
    }

    /// Hands over a frame received on the node's `resend` topic; never
    /// waits (a full queue withholds it).
    pub fn offer(&self, inbound: Inbound) {
        if self.requests.try_send(inbound).is_err() {
            self.counts.withheld.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What it did so far.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }
}

async fn serve(
    bus: Bus,
    recorder: Recorder,
    mut desk: Desk,
    mut rx: mpsc::Receiver<Inbound>,
    counts: Arc<Counts>,
) {
    while let Some(inbound) = rx.recv().await {
        match desk.hear(now_ms(), &inbound.frame, &inbound.topic) {
            Answer::Serve {
                correlation,
                from,
                to,
                budget,
            } => {
                let report = resend(&bus, &recorder, from, to, budget).await;
                let report = ResendReport {
                    correlation,
                    ..report
                };
                desk.spent(report.resent);
                counts.served.fetch_add(1, Ordering::Relaxed);
                counts
                    .frames
                    .fetch_add(u64::from(report.resent), Ordering::Relaxed);
                publish(&bus, report);
            }
            Answer::Refuse(report) => {
                tracing::info!(
                    "resend request {} from {} refused: {}",
                    report.correlation.seq,
                    report.correlation.from,
                    report.code
                );
                counts.refused.fetch_add(1, Ordering::Relaxed);
                publish(&bus, report);
            }
            Answer::Withhold => {
                counts.withheld.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Resends the logged events of `from..=to`, at most `budget`; the report
/// to send after them (its correlation left for the caller).
async fn resend(bus: &Bus, recorder: &Recorder, from: u32, to: u32, budget: u32) -> ResendReport {
    let mut report = ResendReport {
        correlation: loopwarden_protocol::Correlation {
            from: bus.node().clone(),
            seq: 0,
        },
        code: ResendCode::Ok,
        from,
        to,
        resent: 0,
        held_from: None,
        next: None,
    };
    let found = match recorder.resendable(from, to, budget as usize).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("resend of frames {from}..={to}: the log could not be read: {e}");
            report.code = ResendCode::Unavailable;
            return report;
        }
    };
    report.held_from = found.held_from;
    let topic = bus.own_topic(Family::Resent).ok();
    for logged in found.frames {
        let frame = Frame {
            sender: bus.node().clone(),
            seq: logged.seq,
            time: logged.time,
            message: logged.message,
        };
        match topic.as_ref().map(|t| bus.publish_frame(t, &frame)) {
            Some(Ok(())) => report.resent += 1,
            Some(Err(e)) => {
                tracing::warn!("resend of frame {}: {e}", frame.seq);
                report.next = Some(frame.seq);
                break;
            }
            None => break,
        }
    }
    if found.next.is_some() && report.next.is_none() {
        report.next = found.next;
    }
    if report.next.is_some() {
        report.code = ResendCode::Limited;
    }
    report
}

fn publish(bus: &Bus, report: ResendReport) {
    if let Err(e) = bus.publish(Message::ResendReport(report), now_ms()) {
        tracing::warn!("resend report not published: {e}");
    }
}

/// Asks node `role`/`id` of `bus`'s site to resend its logged events of
/// `from..=to`, signed with `key` (which must be `bus`'s node's). Returns
/// the request as sent; its number is the correlation of the report.
pub fn request(
    bus: &Bus,
    key: &SignKey,
    role: Role,
    id: &Ident,
    from: u32,
    to: u32,
) -> Result<Frame, PublishError> {
    let topic = Topic::new(bus.site(), role, id, Family::Resend);
    let mut frame = bus.next_frame(request_message(from, to), now_ms());
    frame
        .sign(&topic, key.key_id, &key.key)
        .map_err(PublishError::Sign)?;
    bus.publish_frame(&topic, &frame)?;
    Ok(frame)
}

/// A request for `from..=to`, to be numbered and signed.
pub fn request_message(from: u32, to: u32) -> Message {
    Message::ResendRequest(ResendRequest {
        from,
        to,
        auth: CommandAuth::default(),
    })
}
