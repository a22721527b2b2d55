//! The bounded queue of XID events from the source's watch thread to the
//! agent's loop.
//!
//! A failing GPU or a broken job can make the driver report thousands of
//! XIDs a second. The queue holds at most its capacity, so memory stays
//! bounded, and it counts what it drops. When it is full, what matters
//! most stays: a *vital* event (a fatal-hardware XID, or a change of the
//! watch's own state) takes the place of the oldest event that is not
//! vital, so a fatal XID still quarantines its GPU in a storm of benign
//! ones. An XID that is not vital is dropped when the queue is full. When
//! the queue holds nothing but vital events (a storm of fatal XIDs), a
//! fatal XID of a GPU that already has one queued is dropped, the new one
//! or a later one of a GPU queued twice, so the first fatal XID of every
//! GPU still gets through (each one quarantines its GPU; the others add
//! nothing). The loop takes the oldest vital event first, so a fatal XID
//! does not wait behind a storm, and says in its log when the queue
//! dropped events.
//!
//! Glossary:
//! - *vital*: an event that must not be lost to a storm (above).
//! - *sink*: the watch thread's end; the agent holds the queue.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use loopwarden_protocol::xid;

use crate::gpu::XidEvent;

/// Events held at most, by default: at 10,000 XIDs a second, a tenth of a
/// second of storm, far more than the loop leaves queued.
pub const XID_QUEUE_CAPACITY: usize = 1024;

struct Inner {
    queue: Mutex<VecDeque<XidEvent>>,
    capacity: usize,
    dropped: AtomicU64,
    closed: AtomicBool,
    ready: tokio::sync::Notify,
}

/// The watch thread's end of the queue.
#[derive(Clone)]
pub struct XidSink(Arc<Inner>);

/// The agent's end of the queue.
pub struct XidQueue(Arc<Inner>);

/// A reader of the queue's counters (for the console), which does not
/// hold the queue open.
#[derive(Clone)]
pub struct XidStats(Arc<Inner>);

impl XidStats {
    /// Events queued now, and dropped since the start.
    pub fn get(&self) -> (usize, u64) {
        let queued = self.0.queue.lock().expect("XID queue").len();
        (queued, self.0.dropped.load(Ordering::Relaxed))
    }
}

/// The agent is gone: nothing reads the queue any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// A queue of `capacity` events (at least 1), and its sink.
pub fn xid_queue(capacity: usize) -> (XidSink, XidQueue) {
    let inner = Arc::new(Inner {
        queue: Mutex::new(VecDeque::new()),
        capacity: capacity.max(1),
        dropped: AtomicU64::new(0),
        closed: AtomicBool::new(false),
        ready: tokio::sync::Notify::new(),
    });
    (XidSink(inner.clone()), XidQueue(inner))
}

/// Whether `e` must not be lost to a storm.
pub fn is_vital(e: &XidEvent) -> bool {
    match e {
        XidEvent::Xid(x) => xid::lookup(x.xid).is_some_and(|i| i.is_fatal_hardware()),
        XidEvent::WatchDown(_) | XidEvent::WatchUp => true,
    }
}

/// Puts `e` into `q` of `capacity`; returns whether an event was dropped
/// (the new one, the oldest that is not vital, or a vital XID of a GPU
/// with another one queued).
pub fn push(q: &mut VecDeque<XidEvent>, capacity: usize, e: XidEvent) -> bool {
    if q.len() < capacity {
        q.push_back(e);
        return false;
    }
    if !is_vital(&e) {
        return true;
    }
    let redundant = match q.iter().position(|x| !is_vital(x)) {
        Some(i) => Some(i),
        None if vital_xid_of(q, &e) => None,
        None => last_repeated_vital_xid(q),
    };
    if let Some(i) = redundant {
        q.remove(i);
        q.push_back(e);
    }
    true
}

/// Whether `e` is an XID of a GPU that has a vital XID in `q`.
fn vital_xid_of(q: &VecDeque<XidEvent>, e: &XidEvent) -> bool {
    let XidEvent::Xid(new) = e else {
        return false;
    };
    q.iter()
        .any(|x| matches!(x, XidEvent::Xid(o) if o.gpu == new.gpu && is_vital(x)))
}

/// The place of the last vital XID in `q` whose GPU has another vital XID
/// before it, if any.
fn last_repeated_vital_xid(q: &VecDeque<XidEvent>) -> Option<usize> {
    let mut seen = [false; 256];
    let mut last = None;
    for (i, x) in q.iter().enumerate() {
        if let (XidEvent::Xid(r), true) = (x, is_vital(x)) {
            if std::mem::replace(&mut seen[r.gpu as usize], true) {
                last = Some(i);
            }
        }
    }
    last
}

impl XidSink {
    /// Queues `e`, dropping by the rule of the module when full.
    pub fn send(&self, e: XidEvent) -> Result<(), Closed> {
        if self.0.closed.load(Ordering::Relaxed) {
            return Err(Closed);
        }
        let dropped = {
            let mut q = self.0.queue.lock().expect("XID queue");
            push(&mut q, self.0.capacity, e)
        };
        if dropped {
            self.0.dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.0.ready.notify_one();
        Ok(())
    }
}

impl XidQueue {
    /// The next event, waiting for one.
    pub async fn recv(&self) -> XidEvent {
        loop {
            if let Some(e) = self.try_recv() {
                return e;
            }
            self.0.ready.notified().await;
        }
    }

    /// The next event, waiting at most `timeout` on this thread (for
    /// tools and tests outside a runtime).
    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Option<XidEvent> {
        let until = std::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.try_recv() {
                return Some(e);
            }
            if std::time::Instant::now() >= until {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// The next event, if one is queued: the oldest vital one first, so a
    /// fatal XID behind a storm of benign ones is acted on at once.
    pub fn try_recv(&self) -> Option<XidEvent> {
        let mut q = self.0.queue.lock().expect("XID queue");
        match q.iter().position(is_vital) {
            Some(i) => q.remove(i),
            None => q.pop_front(),
        }
    }

    /// Events queued now, and dropped since the start.
    pub fn stats(&self) -> (usize, u64) {
        self.stats_reader().get()
    }

    /// A reader of the counters.
    pub fn stats_reader(&self) -> XidStats {
        XidStats(self.0.clone())
    }
}

impl Drop for XidQueue {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::XidReport;

    fn x(gpu: u8, code: u16) -> XidEvent {
        XidEvent::Xid(XidReport { gpu, xid: code })
    }

    #[test]
    fn a_storm_stays_bounded_and_a_fatal_xid_still_gets_through() {
        let (sink, queue) = xid_queue(8);
        // A storm of benign XIDs (13: a graphics engine exception).
        for _ in 0..10_000 {
            sink.send(x(1, 13)).unwrap();
        }
        sink.send(x(3, 79)).unwrap();
        for _ in 0..10_000 {
            sink.send(x(1, 13)).unwrap();
        }
        let (queued, dropped) = queue.stats();
        assert_eq!(queued, 8);
        assert_eq!(dropped, 20_001 - 8);
        assert_eq!(queue.try_recv(), Some(x(3, 79)), "the fatal XID first");
        let held: Vec<_> = std::iter::from_fn(|| queue.try_recv()).collect();
        assert_eq!(held, vec![x(1, 13); 7]);
    }

    #[test]
    fn only_vital_events_left_drops_the_new_one_and_the_watch_state_is_vital() {
        let mut q = VecDeque::new();
        for g in 0..4 {
            assert!(!push(&mut q, 4, x(g, 79)));
        }
        assert!(push(&mut q, 4, x(5, 48)), "full of vital: the new one goes");
        assert_eq!(q.back(), Some(&x(3, 79)));
        assert!(is_vital(&XidEvent::WatchDown("gone".into())));
        assert!(!is_vital(&x(0, 13)));
        assert!(is_vital(&x(0, 48)));
    }

    #[test]
    fn a_storm_of_fatal_xids_keeps_the_first_fatal_xid_of_every_gpu() {
        let (sink, queue) = xid_queue(64);
        // Seven GPUs repeat fatal XIDs until the queue holds nothing else.
        for n in 0..10_000u32 {
            sink.send(x((n % 7) as u8, [79, 48, 95][(n / 7 % 3) as usize]))
                .unwrap();
        }
        sink.send(x(7, 79)).unwrap();
        sink.send(x(7, 48)).unwrap();
        for n in 0..10_000u32 {
            sink.send(x((n % 7) as u8, 79)).unwrap();
        }
        let (queued, dropped) = queue.stats();
        assert_eq!((queued, dropped), (64, 20_002 - 64));
        let held: Vec<_> = std::iter::from_fn(|| queue.try_recv()).collect();
        let gpus: std::collections::BTreeSet<u8> = held
            .iter()
            .map(|e| match e {
                XidEvent::Xid(r) => r.gpu,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(gpus, (0..8).collect(), "every GPU's fatal XID kept");
        assert_eq!(held.iter().filter(|e| **e == x(7, 79)).count(), 1);
        assert!(!held.contains(&x(7, 48)), "GPU 7 was queued already");
    }

    #[test]
    fn a_full_queue_of_vital_events_of_distinct_gpus_drops_the_new_repeat() {
        let mut q = VecDeque::new();
        for g in 0..3 {
            push(&mut q, 4, x(g, 79));
        }
        push(&mut q, 4, XidEvent::WatchUp);
        assert!(
            push(&mut q, 4, x(1, 48)),
            "GPU 1 is queued: the new one goes"
        );
        assert!(
            push(&mut q, 4, x(9, 79)),
            "nothing repeated: the new one goes"
        );
        assert_eq!(
            q,
            VecDeque::from(vec![x(0, 79), x(1, 79), x(2, 79), XidEvent::WatchUp])
        );
    }

    #[tokio::test]
    async fn recv_waits_for_an_event_and_a_dropped_queue_closes_the_sink() {
        let (sink, queue) = xid_queue(4);
        let s2 = sink.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            s2.send(x(2, 79)).unwrap();
        });
        assert_eq!(queue.recv().await, x(2, 79));
        t.join().unwrap();
        drop(queue);
        assert_eq!(sink.send(x(0, 13)), Err(Closed));
    }
}
