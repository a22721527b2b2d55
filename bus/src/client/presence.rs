//! The presence connection: a second, light MQTT connection per node
//! whose only job is the JSON mirror of `online`. MQTT gives a connection
//! one last will, and the main connection's is the `online: false` frame;
//! this one's is its JSON mirror, so a node that dies or hangs goes
//! offline in the JSON tree too, within the same keep-alive.
//!
//! It follows the main connection: once that one is ready it connects,
//! with the JSON mirror of the main connection's will as its will, and
//! publishes the JSON mirror of the main connection's announcement. When
//! the main connection is lost it drops its own without a goodbye, so the
//! broker publishes its will; on a clean shutdown it publishes the JSON
//! mirror of the goodbye frame and disconnects. Should it lose its own
//! connection while the main one stays up, its will has said `false`:
//! it connects again with a fresh announcement and will, numbered after
//! that will.
//!
//! Glossary:
//! - *main connection*: the one every frame goes over ([`super::event_loop`]).
//! - *generation*: one connection of the main connection (its count of
//!   connections); the presence connection of a generation announces and
//!   leaves the same `online` frames as it.
//! - *want*: what the main connection asks of this one ([`Want`]); only
//!   the latest counts.

use std::sync::Arc;
use std::time::Duration;

use loopwarden_protocol::Frame;
use rumqttc::{AsyncClient, Event, EventLoop, Incoming, Request};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::node::{Node, PresencePair};
use crate::backoff::ReconnectRng;
use crate::metrics::Metrics;

/// How long a goodbye waits for the broker's acknowledgement.
const GOODBYE_WAIT: Duration = Duration::from_secs(2);

/// What the main connection asks of the presence connection.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Want {
    /// The main connection is down: no presence connection (the last
    /// one's will, or its goodbye, is what the JSON tree holds).
    Down,
    /// The main connection is ready: connected, announcing `pair`'s
    /// announcement, with `pair`'s will.
    Up {
        /// The main connection's count of connections.
        generation: u64,
        /// The index of the broker it is connected to.
        broker: usize,
        /// Its announcement and will.
        pair: Box<PresencePair>,
    },
    /// The bus is ending: say this goodbye and disconnect cleanly, or,
    /// without one, drop the connection so its will speaks. Final.
    End(Option<Box<Frame>>),
}

/// The presence connection as the decision sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LinkState {
    /// The generation it was opened for.
    pub(super) generation: u64,
    /// The broker accepted it (its will is registered).
    pub(super) accepted: bool,
}

/// What the presence connection does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Nothing: wait for the next want.
    Idle,
    /// Drop the connection without a goodbye (its will speaks).
    Close,
    /// Open a connection for the wanted generation.
    Open,
    /// Keep driving the connection.
    Drive,
    /// Publish the goodbye, disconnect cleanly, end.
    Goodbye,
    /// End (dropping any connection).
    End,
}

/// The decision: what to do about `link` given `want`.
pub(super) fn step(want: &Want, link: Option<LinkState>) -> Step {
    match (want, link) {
        (Want::Down, None) => Step::Idle,
        (Want::Down, Some(_)) => Step::Close,
        (Want::Up { generation, .. }, Some(l)) if l.generation == *generation => Step::Drive,
        (Want::Up { .. }, Some(_)) => Step::Close,
        (Want::Up { .. }, None) => Step::Open,
        (Want::End(Some(_)), Some(l)) if l.accepted => Step::Goodbye,
        (Want::End(_), _) => Step::End,
    }
}

/// Sets what the presence connection should do; `End` is final.
#[derive(Debug)]
pub(super) struct Control(watch::Sender<Want>);

impl Control {
    /// A control and the receiver for [`run`].
    pub(super) fn new() -> (Control, watch::Receiver<Want>) {
        let (tx, rx) = watch::channel(Want::Down);
        (Control(tx), rx)
    }

    /// Asks for `want`, unless the bus is already ending.
    pub(super) fn set(&self, want: Want) {
        self.0.send_if_modified(|now| {
            if matches!(now, Want::End(_)) || *now == want {
                return false;
            }
            *now = want;
            true
        });
    }
}

/// The running presence task, joined when the bus task ends.
pub(super) struct Task(JoinHandle<()>);

impl Task {
    /// Starts the presence task for `node`, steered by `want`.
    pub(super) fn start(node: Arc<Node>, want: watch::Receiver<Want>) -> Task {
        Task(tokio::spawn(run(node, want)))
    }

    /// Waits for it to end (after `Want::End`), at most `timeout`.
    pub(super) async fn join(self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.0).await;
    }
}

/// One presence connection.
struct Link {
    state: LinkState,
    eventloop: EventLoop,
    /// Kept so the event loop's request channel stays open.
    _client: AsyncClient,
    /// What it announces once accepted.
    announce: Frame,
    opened: tokio::time::Instant,
}

/// What the task keeps between connections.
struct Presence {
    node: Arc<Node>,
    want: watch::Receiver<Want>,
    link: Option<Link>,
    backoff: crate::backoff::Backoff,
    rng: ReconnectRng,
    /// The generation whose given pair an accepted connection spent: a
    /// later connection of it needs fresh numbers.
    spent: Option<u64>,
    errors_in_a_row: u32,
}

/// The presence task: follows the wants until the bus ends.
async fn run(node: Arc<Node>, want: watch::Receiver<Want>) {
    let backoff = node.config.backoff.clone();
    let mut p = Presence {
        node,
        want,
        link: None,
        backoff,
        rng: ReconnectRng::new(),
        spent: None,
        errors_in_a_row: 0,
    };
    loop {
        let want = p.want.borrow_and_update().clone();
        match step(&want, p.link.as_ref().map(|l| l.state)) {
            Step::Idle => {
                if p.want.changed().await.is_err() {
                    return;
                }
            }
            Step::Close => p.close(),
            Step::Open => {
                if let Want::Up {
                    generation,
                    broker,
                    pair,
                } = want
                {
                    p.open(generation, broker, *pair);
                }
            }
            Step::Drive => p.drive().await,
            Step::Goodbye => {
                if let (Want::End(Some(bye)), Some(link)) = (want, p.link.take()) {
                    goodbye(&p.node, link, &bye).await;
                }
                return;
            }
            Step::End => return,
        }
    }
}

impl Presence {
    /// Drops the connection without a goodbye: the broker publishes its
    /// will (at once on a socket that closes).
    fn close(&mut self) {
        if self.link.take().is_some_and(|l| l.state.accepted) {
            debug!("presence connection dropped: its will says offline");
        }
    }

    /// Opens a connection for `generation` to broker `index` of the list:
    /// with `pair` unless a connection of that generation spent it, then
    /// with fresh numbers.
    fn open(&mut self, generation: u64, index: usize, pair: PresencePair) {
        let node = &self.node;
        let pair = if self.spent == Some(generation) {
            Metrics::add(&node.status.metrics.presence_renumbered);
            node.presence_pair()
        } else {
            pair
        };
        let mut options = node.options_as(&node.config.presence_client_id(), index);
        options.set_inflight(4);
        if let Some(will) = node.will_of(&pair.will, true) {
            options.set_last_will(will);
        }
        let (client, eventloop) = AsyncClient::new(options, 4);
        self.link = Some(Link {
            state: LinkState {
                generation,
                accepted: false,
            },
            eventloop,
            _client: client,
            announce: pair.announce,
            opened: tokio::time::Instant::now(),
        });
    }

    /// Drives the connection until the next want, or until it is lost.
    async fn drive(&mut self) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        let event = tokio::select! {
            e = link.eventloop.poll() => e,
            _ = self.want.changed() => return,
        };
        match event {
            Ok(Event::Incoming(Incoming::ConnAck(_))) => {
                link.state.accepted = true;
                self.spent = Some(link.state.generation);
                self.errors_in_a_row = 0;
                Metrics::add(&self.node.status.metrics.presence_connects);
                debug!("presence connection up");
                if let Some(p) = self.node.presence_publish(&link.announce, true) {
                    link.eventloop.pending.push_back(Request::Publish(p));
                    count_publish(&self.node);
                }
            }
            Ok(Event::Incoming(Incoming::PubAck(_))) => {
                Metrics::add(&self.node.status.metrics.acked)
            }
            Ok(_) => {}
            Err(e) => self.lost(e).await,
        }
    }

    /// After a lost or refused connection: waits the backoff (or until
    /// the next want) before the next attempt.
    async fn lost(&mut self, e: rumqttc::ConnectionError) {
        let Some(link) = self.link.take() else {
            return;
        };
        Metrics::add(&self.node.status.metrics.presence_errors);
        if link.opened.elapsed() > Duration::from_secs(10) {
            self.backoff.reset();
        }
        let wait = self.backoff.next_wait(&mut self.rng);
        self.errors_in_a_row += 1;
        if self.errors_in_a_row == 1 || self.errors_in_a_row % 20 == 0 {
            warn!(error = %e, retry_in_ms = wait.as_millis() as u64,
                  attempts = self.errors_in_a_row,
                  "presence connection lost or refused: the JSON tree says offline until it is back");
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = self.want.changed() => {}
        }
    }
}

/// Counts a presence publish the way the main connection counts its own.
fn count_publish(node: &Node) {
    Metrics::add(&node.status.metrics.published);
    Metrics::add(&node.status.metrics.published_qos1);
}

/// Publishes the JSON mirror of `bye`, waits (at most [`GOODBYE_WAIT`])
/// for the broker's acknowledgement, then disconnects cleanly so the
/// broker drops the will.
async fn goodbye(node: &Node, mut link: Link, bye: &Frame) {
    let Some(p) = node.presence_publish(bye, true) else {
        return;
    };
    link.eventloop.pending.push_back(Request::Publish(p));
    count_publish(node);
    let until = tokio::time::Instant::now() + GOODBYE_WAIT;
    let mut acked = false;
    while !acked {
        match tokio::time::timeout_at(until, link.eventloop.poll()).await {
            Ok(Ok(Event::Incoming(Incoming::PubAck(_)))) => {
                Metrics::add(&node.status.metrics.acked);
                acked = true;
            }
            Ok(Ok(_)) => {}
            Ok(Err(_)) | Err(_) => break,
        }
    }
    if !acked {
        warn!("the presence goodbye was not acknowledged: the will says offline instead");
        return;
    }
    link.eventloop
        .pending
        .push_back(Request::Disconnect(rumqttc::Disconnect));
    // Let the broker read the DISCONNECT and close the connection itself
    // (closing first could leave it unread, and the will would speak).
    let linger = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(Ok(_)) = tokio::time::timeout_at(linger, link.eventloop.poll()).await {}
    info!("presence connection closed cleanly");
}

#[cfg(test)]
mod tests {
    use loopwarden_protocol::{samples, MessageKind};

    use super::*;

    fn frame(seq: u32) -> Frame {
        Frame {
            seq,
            ..samples::frame(MessageKind::Online)
        }
    }

    fn up(generation: u64) -> Want {
        Want::Up {
            generation,
            broker: 0,
            pair: Box::new(PresencePair {
                announce: frame(1),
                will: frame(2),
            }),
        }
    }

    fn link(generation: u64, accepted: bool) -> Option<LinkState> {
        Some(LinkState {
            generation,
            accepted,
        })
    }

    #[test]
    fn the_presence_connection_follows_the_main_one() {
        assert_eq!(step(&Want::Down, None), Step::Idle);
        assert_eq!(step(&up(1), None), Step::Open);
        assert_eq!(step(&up(1), link(1, false)), Step::Drive);
        assert_eq!(step(&up(1), link(1, true)), Step::Drive);
        // The main connection was lost: drop ours, so its will speaks.
        assert_eq!(step(&Want::Down, link(1, true)), Step::Close);
        // Lost and back before we noticed: a new will for the new one.
        assert_eq!(step(&up(2), link(1, true)), Step::Close);
    }

    #[test]
    fn a_goodbye_goes_only_over_an_accepted_connection() {
        let bye = Want::End(Some(Box::new(frame(9))));
        assert_eq!(step(&bye, link(3, true)), Step::Goodbye);
        assert_eq!(step(&bye, link(3, false)), Step::End);
        assert_eq!(step(&bye, None), Step::End);
        assert_eq!(step(&Want::End(None), link(3, true)), Step::End);
    }

    #[test]
    fn the_end_is_final() {
        let (control, rx) = Control::new();
        control.set(up(1));
        assert_eq!(*rx.borrow(), up(1));
        control.set(Want::End(None));
        control.set(up(2));
        control.set(Want::Down);
        assert_eq!(*rx.borrow(), Want::End(None));
    }
}
