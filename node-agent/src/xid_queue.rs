//! The bounded queue of XID events from the source's watch thread to the
//! agent's loop.
//!
//! A failing GPU or a broken job can make the driver report thousands of
//! XIDs a second. The queue holds at most its capacity, so memory stays
//! bounded, and it counts what it drops. Events rank in three *classes*,
//! by the state they change ([`node_core::xid_level`], the health
//! engine's own rule): 2, an XID that quarantines its GPU or a change of
//! the watch's own state; 1, an XID that degrades its GPU (92, or one
//! whose action is drain-and-reset or "follow the recovery action"); 0,
//! an XID that changes nothing (an application's 13, 31, 43). When the
//! queue is full, an XID of class 0 is dropped, and a new event of class
//! 1 or 2 takes the place of the oldest XID of class 0, so a fatal or
//! degrading XID still reaches the health engine in a storm of
//! application XIDs. With no XID of class 0 left, what goes is what adds
//! nothing: the new XID when its GPU has one of its class or above
//! queued, or a queued XID whose GPU has another of its class or above
//! (a repeat); failing that, the oldest event of a class below the new
//! one's, else the new one. So the first fatal and the first degrading
//! XID of every GPU get through (each raises its GPU; repeats add
//! nothing) while the queue holds more than two per GPU (1024 slots, at
//! most 256 GPUs). The
//! loop takes the oldest event of the highest class first, so a fatal XID
//! does not wait behind a storm, and says in its log when the queue
//! dropped events.
//!
//! Glossary:
//! - *class*: an event's rank in a storm (above); *vital*: of class 1 or
//!   2, an event that must not be lost to a storm.
//! - *sink*: the watch thread's end; the agent holds the queue.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use loopwarden_protocol::HealthState;

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

/// The rank of `e` in a storm: 2 for an event that quarantines its GPU
/// or changes the watch's own state, 1 for an XID that degrades its GPU,
/// 0 for one that changes nothing ([`node_core::xid_level`], the rule the
/// health engine applies).
pub fn class(e: &XidEvent) -> u8 {
    match e {
        XidEvent::Xid(x) => match node_core::xid_level(x.xid) {
            Some(HealthState::Quarantined) => 2,
            Some(HealthState::Degraded) => 1,
            _ => 0,
        },
        XidEvent::WatchDown(_) | XidEvent::WatchUp => 2,
    }
}

/// Whether `e` must not be lost to a storm (it changes a GPU's state or
/// the watch's).
pub fn is_vital(e: &XidEvent) -> bool {
    class(e) > 0
}

/// Puts `e` into `q` of `capacity`; returns whether an event was dropped.
/// Full, the one that goes is, in this order: the oldest of class 0 (or
/// the new one, of class 0 too); the new one, when its GPU has an XID of
/// its class or above queued; a queued XID that adds nothing (its GPU has
/// another of its class or above), of the lowest such class; the oldest
/// of the lowest class below the new one's; else the new one.
pub fn push(q: &mut VecDeque<XidEvent>, capacity: usize, e: XidEvent) -> bool {
    if q.len() < capacity {
        q.push_back(e);
        return false;
    }
    let c = class(&e);
    if c == 0 {
        // Full: an XID that changes nothing goes at once (a storm of
        // them costs no scan of the queue).
        return true;
    }
    let lowest = q.iter().map(class).min().unwrap_or(c);
    let evict = if lowest == 0 {
        oldest_of(q, 0)
    } else if gpu_queued_at(q, &e, c) {
        None
    } else {
        redundant(q, &e).or_else(|| (lowest < c).then(|| oldest_of(q, lowest)).flatten())
    };
    if let Some(i) = evict {
        q.remove(i);
        q.push_back(e);
    }
    true
}

/// The place of the oldest event of class `c` in `q`.
fn oldest_of(q: &VecDeque<XidEvent>, c: u8) -> Option<usize> {
    q.iter().position(|x| class(x) == c)
}

/// Whether `e` is an XID of a GPU that has an XID of class `c` or above
/// in `q`.
fn gpu_queued_at(q: &VecDeque<XidEvent>, e: &XidEvent, c: u8) -> bool {
    let XidEvent::Xid(new) = e else {
        return false;
    };
    q.iter()
        .any(|x| matches!(x, XidEvent::Xid(o) if o.gpu == new.gpu && class(x) >= c))
}

/// The place of an XID in `q` that adds nothing once `e` is queued (its
/// GPU has an XID of a higher class in `q` or in `e`, or one of its class
/// before it): the last of the lowest such class, if any.
fn redundant(q: &VecDeque<XidEvent>, e: &XidEvent) -> Option<usize> {
    let xid = |x: &XidEvent| match x {
        XidEvent::Xid(r) => Some((r.gpu as usize, class(x))),
        _ => None,
    };
    let mut top = [0u8; 256];
    for (g, k) in q.iter().chain(std::iter::once(e)).filter_map(xid) {
        top[g] = top[g].max(k);
    }
    let mut seen = [[false; 3]; 256];
    let mut best: Option<(u8, usize)> = None;
    for (i, (g, k)) in q.iter().enumerate().filter_map(|(i, x)| Some((i, xid(x)?))) {
        let repeat = std::mem::replace(&mut seen[g][k as usize], true);
        if (repeat || top[g] > k) && best.is_none_or(|(b, _)| k <= b) {
            best = Some((k, i));
        }
    }
    best.map(|(_, i)| i)
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

    /// The next event, if one is queued: the oldest of the highest class
    /// first, so a fatal or degrading XID behind a storm of benign ones is
    /// acted on at once (events of one class keep their order).
    pub fn try_recv(&self) -> Option<XidEvent> {
        let mut q = self.0.queue.lock().expect("XID queue");
        let top = q.iter().map(class).max()?;
        let i = q.iter().position(|x| class(x) == top)?;
        q.remove(i)
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
    fn a_storm_of_app_xids_does_not_crowd_out_a_degrading_xid() {
        let (sink, queue) = xid_queue(8);
        for _ in 0..10_000 {
            sink.send(x(1, 13)).unwrap();
        }
        sink.send(x(2, 92)).unwrap();
        assert_eq!(queue.try_recv(), Some(x(2, 92)), "XID 92 degrades GPU 2");
    }

    #[test]
    fn a_full_queue_evicts_the_lowest_class_and_hands_out_the_highest_first() {
        let mut q = VecDeque::new();
        for e in [x(1, 13), x(2, 92), x(1, 31), x(3, 92)] {
            push(&mut q, 4, e);
        }
        assert!(push(&mut q, 4, x(4, 79)), "the oldest inert XID goes");
        assert!(push(&mut q, 4, x(5, 92)), "then the next inert one");
        assert_eq!(
            q,
            VecDeque::from(vec![x(2, 92), x(3, 92), x(4, 79), x(5, 92)])
        );
        assert!(push(&mut q, 4, x(2, 92)), "GPU 2 has its 92 queued");
        assert!(push(&mut q, 4, x(6, 13)), "an inert XID goes when full");
        assert!(push(&mut q, 4, x(3, 79)), "GPU 3's 92 adds nothing now");
        assert_eq!(
            q,
            VecDeque::from(vec![x(2, 92), x(4, 79), x(5, 92), x(3, 79)])
        );
        assert!(push(&mut q, 4, x(7, 79)), "a degrading XID gives way");
        assert_eq!(
            q,
            VecDeque::from(vec![x(4, 79), x(5, 92), x(3, 79), x(7, 79)])
        );
        let (sink, queue) = xid_queue(4);
        for e in q {
            sink.send(e).unwrap();
        }
        let held: Vec<_> = std::iter::from_fn(|| queue.try_recv()).collect();
        assert_eq!(held, vec![x(4, 79), x(3, 79), x(7, 79), x(5, 92)]);
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
