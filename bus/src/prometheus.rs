//! Prometheus metrics for both agents: the text format ([`Exposition`]),
//! the `/metrics` server ([`serve`]) and the metrics of what the two
//! agents share, the bus, the recorder and the resender ([`write_bus`],
//! [`write_recorder`], [`write_resend`]).
//!
//! An agent serves `/metrics` only when given an address
//! (`metrics_listen`). Its render function reads what its loop already
//! publishes for the console, so a scrape never waits for the loop and
//! the loop never waits for a scrape.
//!
//! Glossary:
//! - *scrape*: one `GET /metrics` by Prometheus.
//! - *family*, *sample*: see [`text`].

mod http;
pub mod text;

pub use http::{bind, serve, serve_with, BindError, Limits, Render, CONTENT_TYPE};
pub use text::{Exposition, Metric, MetricKind};

use std::net::{Ipv4Addr, SocketAddr};

use crate::MetricsSnapshot;
use loopwarden_store::recorder::Recorder;

/// Reads a `metrics_listen` value: `IP:PORT` (`127.0.0.1:9400`,
/// `[::1]:9400`) or `:PORT` for every IPv4 interface. The error is the
/// sentence a config error shows.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let parsed = match s.strip_prefix(':') {
        Some(port) => port
            .parse::<u16>()
            .map(|p| SocketAddr::from((Ipv4Addr::UNSPECIFIED, p)))
            .ok(),
        None => s.parse().ok(),
    };
    parsed.ok_or_else(|| {
        format!(
            "metrics_listen = {s:?} is not an address: give IP:PORT (127.0.0.1:9400, [::1]:9400) or :PORT for every interface"
        )
    })
}

const BUS_CONNECTED: Metric = Metric::gauge(
    "loopwarden_bus_connected",
    "1 while connected to the broker with every subscription answered, else 0 (a refused one is counted in loopwarden_bus_subscriptions_refused_total).",
);
const BUS_CONNECTS: Metric = Metric::counter(
    "loopwarden_bus_connects_total",
    "Connections to the broker established, the first one included.",
);
const BUS_CONNECTION_ERRORS: Metric = Metric::counter(
    "loopwarden_bus_connection_errors_total",
    "Connections to the broker lost or refused.",
);
const BUS_PUBLISHED: Metric = Metric::counter(
    "loopwarden_bus_frames_published_total",
    "Frames handed to the MQTT client, QoS 0 and 1.",
);
const BUS_ACKED: Metric = Metric::counter(
    "loopwarden_bus_frames_acked_total",
    "QoS 1 publishes the broker acknowledged.",
);
const BUS_RECEIVED: Metric = Metric::counter(
    "loopwarden_bus_frames_received_total",
    "Frames received and decoded.",
);
const BUS_DROPPED: Metric = Metric::counter(
    "loopwarden_bus_frames_dropped_total",
    "Frames dropped, by reason: offline (telemetry while the broker was unreachable), queue_full (outgoing queue), offline_overflow (QoS 1 beyond the offline buffer), inbound_full (received, not taken in time), outbox (oldest non-critical frame dropped for room), at_stop (QoS 1 never acknowledged when the bus stopped, not in the outbox).",
);
const BUS_REJECTED: Metric = Metric::counter(
    "loopwarden_bus_frames_rejected_total",
    "Received frames refused, by reason: bad_crc, version, unknown_kind, malformed, topic.",
);
const BUS_OUTBOX_REFUSED: Metric = Metric::counter(
    "loopwarden_bus_outbox_refused_total",
    "Critical frames the flash outbox had no room for (neither stored nor sent).",
);
const BUS_OUTBOX_FAILED: Metric = Metric::counter(
    "loopwarden_bus_outbox_failed_total",
    "Publishes of a frame the flash outbox failed to store (the flash refused the write): sent without it while connected (not resent after a restart), else refused and offered again (each offer counts).",
);
const BUS_OUTBOX_RESENT: Metric = Metric::counter(
    "loopwarden_bus_outbox_resent_total",
    "Outbox frames handed over again from flash (after a restart, a reconnection or a deferral).",
);
const BUS_DELIVERY_MISMATCH: Metric = Metric::counter(
    "loopwarden_bus_delivery_mismatch_total",
    "Send events the bus could not match to a frame (a bookkeeping error; should stay 0).",
);
const BUS_PUBLISHED_QOS1: Metric = Metric::counter(
    "loopwarden_bus_frames_published_qos1_total",
    "Of the frames handed to the MQTT client, the QoS 1 publishes (the broker acknowledges each).",
);
const BUS_OUTBOX_ACKED: Metric = Metric::counter(
    "loopwarden_bus_outbox_acked_total",
    "Outbox frames the broker acknowledged, removed from flash.",
);
const BUS_OUTBOX_DEFERRED: Metric = Metric::counter(
    "loopwarden_bus_outbox_deferred_total",
    "Outbox frames stored but not handed to the MQTT client at once (not connected, older frames waiting, or its queue full); they go out later. Outbox frames only: health the full queue refused is not counted.",
);
const BUS_PRESENCE_CONNECTS: Metric = Metric::counter(
    "loopwarden_bus_presence_connects_total",
    "Presence connections to the broker established (json_presence), the first one included.",
);
const BUS_PRESENCE_ERRORS: Metric = Metric::counter(
    "loopwarden_bus_presence_errors_total",
    "Presence connections lost or refused: while it is down the host shows offline in the tree, whatever loopwarden_bus_connected says.",
);
const BUS_PRESENCE_RENUMBERED: Metric = Metric::counter(
    "loopwarden_bus_presence_renumbered_total",
    "Presence connections that came back while the main one stayed up, each with a fresh announcement and will: two sequence numbers no frame carries (only their JSON mirrors).",
);
const BUS_SUBSCRIPTIONS_REFUSED: Metric = Metric::counter(
    "loopwarden_bus_subscriptions_refused_total",
    "Subscription filters the broker refused; each is asked for again (1 s, doubling to 30 s) while the connection lasts, and what it carries is not heard meanwhile.",
);
/// Readers' requests to resend logged events, by outcome.
pub const RESEND_REQUESTS: Metric = Metric::counter(
    "loopwarden_resend_requests_total",
    "Readers' requests to resend logged events, by outcome: served (answered with the frames and a report), refused (answered with a refusal report), withheld (dropped without an answer: the resend budget was empty, the frame was not a request, or too many waited).",
);
/// The logged event frames published again for them.
pub const RESEND_FRAMES: Metric = Metric::counter(
    "loopwarden_resend_frames_total",
    "Logged event frames published again for readers' requests to resend them.",
);

/// Writes a node's resend counts (`docs/bus.md` §4.8), every sample with
/// `labels`.
pub fn write_resend(out: &mut Exposition, r: crate::resend::ResendCounts, labels: &[(&str, &str)]) {
    for (outcome, n) in [
        ("served", r.served),
        ("refused", r.refused),
        ("withheld", r.withheld),
    ] {
        let mut l = labels.to_vec();
        l.push(("outcome", outcome));
        out.sample(&RESEND_REQUESTS, &l, n as f64);
    }
    out.sample(&RESEND_FRAMES, labels, r.frames as f64);
}

const FLASH_QUEUE_DROPPED: Metric = Metric::counter(
    "loopwarden_flash_queue_dropped_total",
    "Events dropped because the flash recorder's queue was full (in a storm).",
);
const OUTBOX_WAITING: Metric = Metric::gauge(
    "loopwarden_outbox_waiting_frames",
    "Frames waiting in memory for room in the flash outbox.",
);
const OUTBOX_WAITING_DROPPED: Metric = Metric::counter(
    "loopwarden_outbox_waiting_dropped_total",
    "Frames dropped from the wait for room in the flash outbox (oldest first).",
);

/// Writes the bus's counters (`loopwarden_bus_*`) and whether it is
/// `connected`, every sample with `labels`.
pub fn write_bus(
    out: &mut Exposition,
    m: &MetricsSnapshot,
    connected: bool,
    labels: &[(&str, &str)],
) {
    out.flag(&BUS_CONNECTED, labels, connected);
    let plain = [
        (&BUS_CONNECTS, m.connects),
        (&BUS_CONNECTION_ERRORS, m.connection_errors),
        (&BUS_PUBLISHED, m.published),
        (&BUS_PUBLISHED_QOS1, m.published_qos1),
        (&BUS_ACKED, m.acked),
        (&BUS_RECEIVED, m.received),
        (&BUS_OUTBOX_ACKED, m.outbox_acked),
        (&BUS_OUTBOX_DEFERRED, m.deferred),
        (&BUS_OUTBOX_REFUSED, m.outbox_refused),
        (&BUS_OUTBOX_FAILED, m.outbox_failed),
        (&BUS_OUTBOX_RESENT, m.resent),
        (&BUS_DELIVERY_MISMATCH, m.delivery_mismatch),
        (&BUS_SUBSCRIPTIONS_REFUSED, m.subscriptions_refused),
        (&BUS_PRESENCE_CONNECTS, m.presence_connects),
        (&BUS_PRESENCE_ERRORS, m.presence_errors),
        (&BUS_PRESENCE_RENUMBERED, m.presence_renumbered),
    ];
    for (metric, value) in plain {
        out.sample(metric, labels, value as f64);
    }
    let dropped = [
        ("offline", m.dropped_offline),
        ("queue_full", m.dropped_queue_full),
        ("offline_overflow", m.dropped_offline_overflow),
        ("inbound_full", m.dropped_inbound_full),
        ("outbox", m.dropped_outbox),
        ("at_stop", m.dropped_at_stop),
    ];
    with_reason(out, &BUS_DROPPED, labels, &dropped);
    let rejected = [
        ("bad_crc", m.rejected_bad_crc),
        ("version", m.rejected_version),
        ("unknown_kind", m.rejected_unknown_kind),
        ("malformed", m.rejected_malformed),
        ("topic", m.rejected_topic),
    ];
    with_reason(out, &BUS_REJECTED, labels, &rejected);
}

/// Serves `/metrics` on `addr`, when given one, answering each scrape
/// with `render()`, in a task of its own that runs until aborted; `None`
/// when there is no address. Binding fails at once, naming the address.
pub async fn start(
    addr: Option<SocketAddr>,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> Result<Option<tokio::task::JoinHandle<()>>, BindError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = bind(addr).await?;
    let at = listener.local_addr().unwrap_or(addr);
    tracing::info!("metrics: serving http://{at}/metrics");
    Ok(Some(tokio::spawn(serve(listener, render))))
}

/// `base` followed by `more`: the labels of one sample.
pub fn with_labels<'a>(
    base: &[(&'a str, &'a str)],
    more: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut l = base.to_vec();
    l.extend_from_slice(more);
    l
}

/// Writes one sample of `metric` per reason, `labels` plus `reason`.
fn with_reason(out: &mut Exposition, metric: &Metric, labels: &[(&str, &str)], by: &[(&str, u64)]) {
    for (reason, value) in by {
        out.sample(
            metric,
            &with_labels(labels, &[("reason", reason)]),
            *value as f64,
        );
    }
}

/// Writes the recorder's counters: flash queue drops and the outbox wait.
pub fn write_recorder(out: &mut Exposition, recorder: &Recorder, labels: &[(&str, &str)]) {
    let (waiting, waiting_dropped) = recorder.waiting();
    out.sample(&FLASH_QUEUE_DROPPED, labels, recorder.dropped() as f64);
    out.sample(&OUTBOX_WAITING, labels, waiting as f64);
    out.sample(&OUTBOX_WAITING_DROPPED, labels, waiting_dropped as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen("127.0.0.1:9400"),
            Ok(([127, 0, 0, 1], 9400).into())
        );
        assert_eq!(parse_listen(":9400"), Ok(([0, 0, 0, 0], 9400).into()));
        assert_eq!(parse_listen("[::1]:9401").map(|a| a.port()), Ok(9401));
        for bad in ["9400", "localhost:9400", "127.0.0.1", ":", ":99999", ""] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.contains("is not an address"), "{bad}: {e}");
        }
    }

    #[test]
    fn bus_counters_are_labelled_and_drops_carry_their_reason() {
        let m = MetricsSnapshot {
            published: 7,
            dropped_queue_full: 2,
            rejected_bad_crc: 1,
            ..Default::default()
        };
        let mut out = Exposition::new();
        write_bus(&mut out, &m, true, &[("Hostname", "h07")]);
        let text = out.finish();
        assert!(
            text.contains("loopwarden_bus_connected{Hostname=\"h07\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("loopwarden_bus_frames_published_total{Hostname=\"h07\"} 7\n"));
        assert!(text.contains(
            "loopwarden_bus_frames_dropped_total{Hostname=\"h07\",reason=\"queue_full\"} 2\n"
        ));
        assert!(text.contains(
            "loopwarden_bus_frames_rejected_total{Hostname=\"h07\",reason=\"bad_crc\"} 1\n"
        ));
        assert_eq!(
            text.matches("# TYPE loopwarden_bus_frames_dropped_total counter")
                .count(),
            1
        );
    }

    /// A presence connection the broker refuses leaves the host offline
    /// in the tree while `connected` says 1: its counters say why.
    #[test]
    fn presence_and_outbox_counters_are_exported() {
        let m = MetricsSnapshot {
            presence_connects: 4,
            presence_errors: 3,
            presence_renumbered: 2,
            deferred: 5,
            outbox_acked: 6,
            published_qos1: 8,
            ..Default::default()
        };
        let mut out = Exposition::new();
        write_bus(&mut out, &m, true, &[("Hostname", "h07")]);
        let text = out.finish();
        for line in [
            "loopwarden_bus_presence_connects_total{Hostname=\"h07\"} 4\n",
            "loopwarden_bus_presence_errors_total{Hostname=\"h07\"} 3\n",
            "loopwarden_bus_presence_renumbered_total{Hostname=\"h07\"} 2\n",
            "loopwarden_bus_outbox_deferred_total{Hostname=\"h07\"} 5\n",
            "loopwarden_bus_outbox_acked_total{Hostname=\"h07\"} 6\n",
            "loopwarden_bus_frames_published_qos1_total{Hostname=\"h07\"} 8\n",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
