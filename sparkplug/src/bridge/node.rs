//! The bridge's own metrics: its counters, in its NBIRTH and, when they
//! changed, in NDATA at most once per `ndata_every_ms`.

use super::{Bridge, Kind, Now, Publish};
use crate::payload::{self, DataType, Point, Value};

/// A metric of the bridge itself: always a value, no unit.
pub(super) fn point(name: &str, datatype: DataType, value: Value, time: u64) -> Point {
    Point {
        name: name.into(),
        datatype,
        value: Some(value),
        unit: None,
        time,
    }
}

/// The bridge's own counters, its NDATA metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Counters {
    pub(super) frames_received: u64,
    pub(super) frames_refused: u64,
    /// GPU figures past any GPU's, published null.
    pub(super) fields_refused: u64,
    pub(super) commands_refused: u64,
    pub(super) rebirths_limited: u64,
    pub(super) publishes_dropped: u64,
    pub(super) devices_silent: u64,
    pub(super) frames_dropped_inbound: u64,
    pub(super) loopwarden_connected: bool,
    /// The broker refused this connection's NCMD subscription.
    pub(super) ncmd_refused: bool,
}

impl Bridge {
    /// The bridge's own metrics (those NDATA may carry).
    pub(super) fn node_metrics(&self, now: u64) -> Vec<Point> {
        let c = &self.counters;
        let point = |name, datatype, value| point(name, datatype, value, now);
        let online = self
            .devices
            .values()
            .filter(|d| d.published.is_some())
            .count();
        vec![
            point(
                "bridge/loopwarden_connected",
                DataType::Boolean,
                Value::Boolean(c.loopwarden_connected),
            ),
            point(
                "bridge/ncmd_refused",
                DataType::Boolean,
                Value::Boolean(c.ncmd_refused),
            ),
            point(
                "bridge/devices_online",
                DataType::UInt32,
                Value::UInt32(online as u32),
            ),
            point(
                "bridge/frames_received",
                DataType::UInt64,
                Value::UInt64(c.frames_received),
            ),
            point(
                "bridge/frames_refused",
                DataType::UInt64,
                Value::UInt64(c.frames_refused),
            ),
            point(
                "bridge/fields_refused",
                DataType::UInt64,
                Value::UInt64(c.fields_refused),
            ),
            point(
                "bridge/commands_refused",
                DataType::UInt64,
                Value::UInt64(c.commands_refused),
            ),
            point(
                "bridge/rebirths_limited",
                DataType::UInt64,
                Value::UInt64(c.rebirths_limited),
            ),
            point(
                "bridge/publishes_dropped",
                DataType::UInt64,
                Value::UInt64(c.publishes_dropped),
            ),
            point(
                "bridge/devices_silent",
                DataType::UInt64,
                Value::UInt64(c.devices_silent),
            ),
            point(
                "bridge/frames_dropped_inbound",
                DataType::UInt64,
                Value::UInt64(c.frames_dropped_inbound),
            ),
        ]
    }

    /// The bridge's metrics that changed, at most once per
    /// `ndata_every_ms`.
    pub(super) fn ndata(&mut self, at: Now) -> Option<Publish> {
        if at.mono.saturating_sub(self.node_published_at) < self.config.ndata_every_ms {
            return None;
        }
        let now = at.wall;
        let now_metrics = self.node_metrics(now);
        let changed: Vec<payload::Metric> = self
            .node_published
            .iter()
            .zip(&now_metrics)
            .filter(|(a, b)| a.value != b.value)
            .map(|(_, b)| b.to_data())
            .collect();
        if changed.is_empty() {
            return None;
        }
        self.node_published = now_metrics;
        self.node_published_at = at.mono;
        Some(self.publish(Kind::NData, None, now, changed))
    }
}
