//! Bounds on a listener that people and other systems connect to (the
//! console socket, the northbound Modbus server): at most
//! [`Limits::max_connections`] connections open at once, and each closed
//! after [`Limits::idle`] without progress.
//!
//! A connection over the cap is closed at once, unread ([`Gate::admit`]
//! gives no [`Slot`]); the first refusal of a burst is logged, and when a
//! slot frees again a line says how many were refused meanwhile. A
//! connection that neither sends nor takes anything for the idle time is
//! closed ([`Bounded`]): its reads end (as if the peer had closed) and
//! its writes fail; each such close is logged once. Both are counted in
//! [`ListenStats`], which the agents' `/metrics` show ([`write_metrics`]).
//!
//! A TCP listener that cannot bind its address (taken, not an address of
//! this machine) does not stop the agent: [`bind_retrying`] logs an error
//! naming the address and the OS's reason, tries again in the background
//! ([`Backoff`]: 1 s doubling to a minute) while the agent controls, and
//! serves once bound. Failed tries are counted in [`ListenStats`] too.
//!
//! Glossary:
//! - *slot*: the right of one open connection; freed when the connection
//!   is dropped.
//! - *burst*: the refusals from the first one while at the cap until a
//!   slot frees.
//! - *progress*: a read or a write that completed (bytes, the peer's
//!   close, or an error); the time the peer is waited on counts from the
//!   last one, and time spent answering does not count.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use loopwarden_bus::prometheus::{with_labels, Exposition, Metric};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};

/// How many connections a listener keeps open, and for how long without
/// progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once; one more is closed at once.
    pub max_connections: usize,
    /// A connection waited on this long without progress is closed.
    pub idle: Duration,
}

impl Limits {
    /// The console socket's: `ctl` asks one question per connection and
    /// has its answer in well under a second, so 8 at once leave room for
    /// a few engineers and scripts; 60 s lets someone type a request by
    /// hand (`socat`) and frees a connection left open within a minute.
    pub const CONSOLE: Limits = Limits {
        max_connections: 8,
        idle: Duration::from_secs(60),
    };
}

/// What a listener refused and closed, shared between its [`Gate`] and
/// whoever reads the counts (`/metrics`).
#[derive(Debug, Clone, Default)]
pub struct ListenStats(Arc<Counts>);

#[derive(Debug, Default)]
struct Counts {
    open: AtomicUsize,
    refused: AtomicU64,
    idle_closed: AtomicU64,
    bind_failures: AtomicU64,
    unbound: AtomicBool,
}

impl ListenStats {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.0.open.load(Ordering::Relaxed)
    }

    /// Connections refused at the cap since the start.
    pub fn refused(&self) -> u64 {
        self.0.refused.load(Ordering::Relaxed)
    }

    /// Connections closed for idling since the start.
    pub fn idle_closed(&self) -> u64 {
        self.0.idle_closed.load(Ordering::Relaxed)
    }

    /// Tries to bind its address that failed since the start.
    pub fn bind_failures(&self) -> u64 {
        self.0.bind_failures.load(Ordering::Relaxed)
    }

    /// Whether it is not listening because its address could not be
    /// bound yet (and is being tried again).
    pub fn unbound(&self) -> bool {
        self.0.unbound.load(Ordering::Relaxed)
    }
}

/// The cap of one listener: hands out a [`Slot`] per connection while
/// fewer than the cap are open.
#[derive(Debug)]
pub struct Gate {
    /// The listener in words, for the log: "console socket
    /// /run/loopwarden/cooling-ctrl.sock", "northbound Modbus server".
    name: String,
    /// The configuration key of the cap, for the log.
    key: &'static str,
    limits: Limits,
    stats: ListenStats,
    /// Refusing since the first refusal of a burst.
    refusing: AtomicBool,
    /// Refusals in the current burst.
    burst: AtomicU64,
}

impl Gate {
    /// The gate of the listener `name` (its cap set by the configuration
    /// key `key`), counting in `stats`.
    pub fn new(
        name: impl Into<String>,
        key: &'static str,
        limits: Limits,
        stats: ListenStats,
    ) -> Arc<Gate> {
        Arc::new(Gate {
            name: name.into(),
            key,
            limits,
            stats,
            refusing: AtomicBool::new(false),
            burst: AtomicU64::new(0),
        })
    }

    /// The limits it keeps.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A slot for a connection from `peer` (for the log), or `None` at
    /// the cap: then the caller closes the connection at once. The refusal
    /// is counted; the first of a burst is logged.
    pub fn admit(self: &Arc<Self>, peer: &str) -> Option<Slot> {
        let max = self.limits.max_connections;
        let open = &self.stats.0.open;
        if open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
        {
            return Some(Slot { gate: self.clone() });
        }
        self.stats.0.refused.fetch_add(1, Ordering::Relaxed);
        self.burst.fetch_add(1, Ordering::Relaxed);
        if !self.refusing.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                "{}: {max} connections open, the most it takes ({}): a connection from {peer} \
                 closed at once, and so is every new one until one of those closes",
                self.name,
                self.key
            );
        }
        None
    }

    /// A slot was freed: ends a burst of refusals with a line saying how
    /// many there were.
    fn freed(&self) {
        self.stats.0.open.fetch_sub(1, Ordering::AcqRel);
        if self.refusing.swap(false, Ordering::AcqRel) {
            let n = self.burst.swap(0, Ordering::AcqRel);
            tracing::info!(
                "{}: a connection closed, new ones are taken again; {n} refused while at the cap",
                self.name
            );
        }
    }

    /// A connection from `peer` idled out: counted and logged.
    fn idled(&self, peer: &str) {
        self.stats.0.idle_closed.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            "{}: the connection from {peer} closed after {} s without a request or a read",
            self.name,
            self.limits.idle.as_secs_f64()
        );
    }
}

/// One open connection's place under the cap; freed when dropped.
#[derive(Debug)]
pub struct Slot {
    gate: Arc<Gate>,
}

impl Slot {
    /// The connection `stream` from `peer` in this slot, closed after the
    /// gate's idle time without progress. The slot is freed when the
    /// stream is dropped.
    pub fn bound<S>(self, stream: S, peer: impl Into<String>) -> Bounded<S> {
        let idle = self.gate.limits.idle;
        Bounded {
            slot: self,
            inner: stream,
            timer: Box::pin(tokio::time::sleep(idle)),
            waiting: false,
            expired: false,
            peer: peer.into(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gate.freed();
    }
}

/// A connection that holds a [`Slot`] and closes itself after the idle
/// time without progress: reads then end as if the peer had closed, and
/// writes fail with `TimedOut`.
///
/// One timer serves both directions; the connections it serves wait on
/// one direction at a time (a request, then its answer).
#[derive(Debug)]
pub struct Bounded<S> {
    /// First, so it is freed before the stream closes: a peer that sees
    /// the close and connects again finds the slot free.
    slot: Slot,
    inner: S,
    timer: Pin<Box<Sleep>>,
    /// The peer is waited on, since the timer was set.
    waiting: bool,
    /// The idle time ran out: closed.
    expired: bool,
    peer: String,
}

impl<S> Bounded<S> {
    /// Whether it was closed for idling.
    pub fn idled_out(&self) -> bool {
        self.expired
    }

    /// Something moved: the next wait counts from its own start.
    fn progress(&mut self) {
        self.waiting = false;
    }

    /// The peer is waited on: ready when that has lasted the idle time
    /// (then counted, logged, and the connection closed).
    fn idle_over(&mut self, cx: &mut Context<'_>) -> bool {
        if self.expired {
            return true;
        }
        if !self.waiting {
            self.waiting = true;
            let idle = self.slot.gate.limits.idle;
            self.timer.as_mut().reset(Instant::now() + idle);
        }
        if self.timer.as_mut().poll(cx).is_pending() {
            return false;
        }
        self.expired = true;
        self.slot.gate.idled(&self.peer);
        true
    }

    fn idle_error(&self) -> io::Error {
        let idle = self.slot.gate.limits.idle.as_secs_f64();
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("closed after {idle} s without progress"),
        )
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.expired {
            return Poll::Ready(Ok(()));
        }
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                self.progress();
                Poll::Ready(r)
            }
            // Idle: read as the end of the stream.
            Poll::Pending if self.idle_over(cx) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.expired {
            return Poll::Ready(Err(self.idle_error()));
        }
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(r) => {
                self.progress();
                Poll::Ready(r)
            }
            Poll::Pending if self.idle_over(cx) => Poll::Ready(Err(self.idle_error())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The waits between tries to bind a listener's address: from
/// [`Backoff::FIRST`], doubled after each failure, at most
/// [`Backoff::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff(Duration);

impl Backoff {
    /// The wait after the first failure.
    pub const FIRST: Duration = Duration::from_secs(1);
    /// The longest wait: a freed address is taken within a minute.
    pub const MAX: Duration = Duration::from_secs(60);

    /// The first wait.
    pub fn new() -> Backoff {
        Backoff(Self::FIRST)
    }

    /// The wait now, and the next one set.
    pub fn next_wait(&mut self) -> Duration {
        let now = self.0;
        self.0 = (now * 2).min(Self::MAX);
        now
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

/// Binds `addr` for the listener `name` (for the log: "metrics listener",
/// "northbound Modbus server") in a task of its own, then runs
/// `serve(listener)` in it. An address that cannot be bound is an error in
/// the log, naming it and the OS's reason, counted in `stats`, and tried
/// again after a [`Backoff`] wait until it binds; the agent goes on
/// meanwhile. The task runs until `serve` returns or it is aborted.
pub fn bind_retrying<F, Fut>(
    name: impl Into<String>,
    addr: SocketAddr,
    stats: ListenStats,
    serve: F,
) -> JoinHandle<()>
where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let name = name.into();
    tokio::spawn(async move {
        let mut backoff = Backoff::new();
        let listener = loop {
            match TcpListener::bind(addr).await {
                Ok(l) => break l,
                Err(e) => {
                    let wait = backoff.next_wait();
                    stats.0.bind_failures.fetch_add(1, Ordering::Relaxed);
                    stats.0.unbound.store(true, Ordering::Relaxed);
                    tracing::error!(
                        "{name} on {addr}: cannot listen: {e}; not served, tried again in {} s \
                         (the agent goes on without it)",
                        wait.as_secs()
                    );
                    tokio::time::sleep(wait).await;
                }
            }
        };
        if stats.0.unbound.swap(false, Ordering::Relaxed) {
            tracing::info!(
                "{name} on {addr}: listening, after {} failed tries",
                stats.bind_failures()
            );
        }
        serve(listener).await;
    })
}

const OPEN: Metric = Metric::gauge(
    "loopwarden_listener_connections",
    "Connections open now on the listener (console, northbound).",
);
const REFUSED: Metric = Metric::counter(
    "loopwarden_listener_refused_total",
    "Connections closed at once because the listener had its most connections open.",
);
const IDLE_CLOSED: Metric = Metric::counter(
    "loopwarden_listener_idle_closed_total",
    "Connections closed after the listener's idle time without a request or a read.",
);

const BIND_FAILURES: Metric = Metric::counter(
    "loopwarden_listener_bind_failures_total",
    "Tries to bind the listener's address that failed (in use, not an address of this machine).",
);
const UNBOUND: Metric = Metric::gauge(
    "loopwarden_listener_unbound",
    "1 while the listener's address could not be bound yet and is tried again; 0 listening.",
);

/// The listener `listener`'s counts as `loopwarden_listener_*{listener}`
/// series, besides `labels`.
pub fn write_metrics(
    out: &mut Exposition,
    listener: &str,
    stats: &ListenStats,
    labels: &[(&str, &str)],
) {
    let l = with_labels(labels, &[("listener", listener)]);
    out.sample(&OPEN, &l, stats.open() as f64);
    out.sample(&REFUSED, &l, stats.refused() as f64);
    out.sample(&IDLE_CLOSED, &l, stats.idle_closed() as f64);
    out.sample(&BIND_FAILURES, &l, stats.bind_failures() as f64);
    out.flag(&UNBOUND, &l, stats.unbound());
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn gate(max: usize, idle_ms: u64) -> (Arc<Gate>, ListenStats) {
        let stats = ListenStats::default();
        let limits = Limits {
            max_connections: max,
            idle: Duration::from_millis(idle_ms),
        };
        (
            Gate::new("test listener", "test_max", limits, stats.clone()),
            stats,
        )
    }

    #[test]
    fn slots_are_handed_out_up_to_the_cap_and_freed_when_dropped() {
        let (gate, stats) = gate(2, 1000);
        let a = gate.admit("a").expect("the first");
        let b = gate.admit("b").expect("the second");
        assert!(gate.admit("c").is_none(), "the third is over the cap");
        assert!(gate.admit("d").is_none());
        assert_eq!((stats.open(), stats.refused()), (2, 2));
        drop(a);
        assert_eq!(stats.open(), 1);
        let c = gate.admit("c").expect("a slot freed");
        assert!(gate.admit("e").is_none());
        drop((b, c));
        assert_eq!(
            (stats.open(), stats.refused(), stats.idle_closed()),
            (0, 3, 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_waited_on_for_the_idle_time_ends_and_progress_restarts_the_wait() {
        let (gate, stats) = gate(1, 1000);
        let (near, mut far) = tokio::io::duplex(64);
        let mut conn = gate.admit("far").unwrap().bound(near, "far");
        // The peer: a request after 900 ms; it takes the answer 900 ms
        // after the answer starts (5 s later: the time spent answering
        // does not count), and sends again 900 ms after that.
        let peer = async {
            tokio::time::sleep(Duration::from_millis(900)).await;
            far.write_all(b"x").await.unwrap();
            tokio::time::sleep(Duration::from_millis(5_900)).await;
            let mut answer = [0u8; 100];
            far.read_exact(&mut answer).await.unwrap();
            tokio::time::sleep(Duration::from_millis(900)).await;
            far.write_all(b"y").await.unwrap();
            far
        };
        let near_side = async {
            let mut b = [0u8; 1];
            conn.read_exact(&mut b).await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
            // More than the pipe holds: the write waits for the peer.
            conn.write_all(&[7u8; 100]).await.unwrap();
            conn.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"y");
            // Then nothing: the read ends after the idle time.
            let started = Instant::now();
            assert_eq!(conn.read(&mut b).await.unwrap(), 0);
            assert_eq!(started.elapsed(), Duration::from_millis(1000));
            conn
        };
        let (_far, mut conn) = tokio::join!(peer, near_side);
        assert_eq!(stats.idle_closed(), 1);
        let e = conn.write_all(b"late").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(stats.open(), 1, "held until dropped");
        drop(conn);
        assert_eq!((stats.open(), stats.idle_closed()), (0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_does_not_take_the_answer_is_closed_after_the_idle_time() {
        let (gate, stats) = gate(1, 1000);
        let (near, _far) = tokio::io::duplex(64);
        let mut conn = gate.admit("far").unwrap().bound(near, "far");
        let started = Instant::now();
        let e = conn.write_all(&[7u8; 100]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_millis(1000));
        assert_eq!(stats.idle_closed(), 1);
    }

    #[test]
    fn the_counts_are_series_per_listener() {
        let (gate, stats) = gate(1, 1000);
        let _a = gate.admit("a");
        assert!(gate.admit("b").is_none());
        let mut out = Exposition::new();
        write_metrics(&mut out, "console", &stats, &[("cdu", "cdu1")]);
        let text = out.finish();
        for line in [
            r#"loopwarden_listener_connections{cdu="cdu1",listener="console"} 1"#,
            r#"loopwarden_listener_refused_total{cdu="cdu1",listener="console"} 1"#,
            r#"loopwarden_listener_idle_closed_total{cdu="cdu1",listener="console"} 0"#,
            r#"loopwarden_listener_bind_failures_total{cdu="cdu1",listener="console"} 0"#,
            r#"loopwarden_listener_unbound{cdu="cdu1",listener="console"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
        }
    }

    #[test]
    fn the_wait_between_binds_doubles_from_a_second_to_a_minute() {
        let mut b = Backoff::new();
        let waits: Vec<u64> = (0..9).map(|_| b.next_wait().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    /// Sleeps (in the paused clock) until `f` holds.
    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..10_000 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what}: never");
    }

    #[tokio::test(start_paused = true)]
    async fn a_taken_address_is_tried_again_and_served_once_freed() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let stats = ListenStats::default();
        let task = bind_retrying("test listener", addr, stats.clone(), |l| async move {
            let (mut conn, _) = l.accept().await.unwrap();
            conn.write_all(b"served").await.unwrap();
        });
        until("two failed tries", || stats.bind_failures() >= 2).await;
        assert!(stats.unbound());
        assert!(!task.is_finished(), "still trying");
        let mut out = Exposition::new();
        write_metrics(&mut out, "metrics", &stats, &[]);
        let text = out.finish();
        assert!(
            text.contains(r#"loopwarden_listener_unbound{listener="metrics"} 1"#),
            "{text}"
        );
        drop(taken);
        until("listening", || !stats.unbound()).await;
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut got = String::new();
        conn.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "served");
        task.await.unwrap();
    }
}
