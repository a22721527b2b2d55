//! What the bus shell did and, above all, what it dropped and why.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use loopwarden_protocol::DecodeError;

macro_rules! counters {
    ($( $(#[$m:meta])* $name:ident, )+) => {
        /// Live counters, shared between the bus task and its handles.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $( $(#[$m])* pub(crate) $name: AtomicU64, )+
        }

        /// A copy of the counters at one moment.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct MetricsSnapshot {
            $( $(#[$m])* pub $name: u64, )+
        }

        impl Metrics {
            /// Reads every counter.
            pub fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot { $( $name: self.$name.load(Ordering::Relaxed), )+ }
            }
        }

        impl fmt::Display for MetricsSnapshot {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                $( writeln!(f, "{:<28} {}", stringify!($name), self.$name)?; )+
                Ok(())
            }
        }
    };
}

counters! {
    /// Frames handed to the MQTT client.
    published,
    /// Of those, QoS 1 publishes (the broker acknowledges each).
    published_qos1,
    /// QoS 1 publishes the broker acknowledged.
    acked,
    /// Outbox frames removed after the broker acknowledged them.
    outbox_acked,
    /// Outbox frames stored but not yet handed to the client (not
    /// connected, or its queue was full); they go out later. Outbox frames
    /// only: the retained state (health) the full queue refused is kept
    /// in memory, not counted here, and counts `published` once sent.
    deferred,
    /// Outbox frames handed over from flash: after a restart, a
    /// reconnection, or a deferral.
    resent,
    /// Frames the outbox dropped to make room (oldest of a non-critical class).
    dropped_outbox,
    /// Critical frames the outbox had no room for (not stored, not sent).
    outbox_refused,
    /// Publishes of a frame the outbox's flash failed to store: sent
    /// without it while connected (not resent after a restart), else
    /// refused to be offered again (each offer counts).
    outbox_failed,
    /// Send events the shell could not match to a frame (bookkeeping error).
    delivery_mismatch,
    /// Subscription filters the broker refused (each asked for again).
    subscriptions_refused,
    /// Frames received and decoded.
    received,
    /// Connections established (the first one included).
    connects,
    /// Connections lost or refused.
    connection_errors,
    /// Presence connections established (`BusConfig::json_presence`).
    presence_connects,
    /// Presence connections lost or refused.
    presence_errors,
    /// Presence connections that, the main one staying up, needed a fresh
    /// announcement and will: two sequence numbers each that no frame
    /// carries (only their JSON mirrors).
    presence_renumbered,
    /// Telemetry dropped because the broker was unreachable (stale on arrival).
    dropped_offline,
    /// Publishes dropped because the outgoing queue was full.
    dropped_queue_full,
    /// Unacknowledged QoS 1 publishes dropped because more piled up during an
    /// outage than the offline buffer holds (oldest first).
    dropped_offline_overflow,
    /// Received frames dropped because the agent did not take them in time.
    dropped_inbound_full,
    /// QoS 1 publishes not acknowledged when the bus task ended (a
    /// shutdown, a lost connection during it): kept from a lost connection
    /// or waiting to be handed over, never sent again.
    dropped_at_stop,
    /// Received frames refused: bad CRC.
    rejected_bad_crc,
    /// Received frames refused: another major version.
    rejected_version,
    /// Received frames refused: unknown message kind.
    rejected_unknown_kind,
    /// Received frames refused: too short, too long, truncated, malformed.
    rejected_malformed,
    /// Received messages on a topic that is not ours.
    rejected_topic,
}

impl Metrics {
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a frame refused for `e`; returns the reason, as the metric's
    /// label says it (`bad_crc`, `version`, `unknown_kind`, `malformed`).
    pub(crate) fn rejected(&self, e: &DecodeError) -> &'static str {
        let (counter, reason) = match e {
            DecodeError::BadCrc { .. } => (&self.rejected_bad_crc, "bad_crc"),
            DecodeError::UnsupportedVersion { .. } => (&self.rejected_version, "version"),
            DecodeError::UnknownKind { .. } => (&self.rejected_unknown_kind, "unknown_kind"),
            _ => (&self.rejected_malformed, "malformed"),
        };
        Self::add(counter);
        reason
    }
}

impl MetricsSnapshot {
    /// Everything dropped, for whatever reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_offline
            + self.dropped_queue_full
            + self.dropped_offline_overflow
            + self.dropped_inbound_full
            + self.dropped_outbox
            + self.dropped_at_stop
    }
}
