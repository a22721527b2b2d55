//! Publishing: telemetry (with its JSON mirror now and then), the
//! retained health, events and acks (through the recorder, which keeps
//! them in the flash outbox first), and the flash reservation of sequence
//! numbers that keeps ahead of the bus.

use std::time::{Duration, Instant};

use loopwarden_protocol::{
    Event, GpuFlags, GpuTelemetry, HostTelemetry, Message, QueueDrops, TimestampMs,
};

use super::Agent;

impl Agent {
    /// Publishes a message and its JSON mirror. Telemetry and health
    /// (outside the outbox) go out from here at once; events and acks go
    /// through the recorder, which stores them in the outbox.
    pub(super) fn publish(&mut self, message: Message, time: TimestampMs, mirror: bool) {
        if matches!(message, Message::Event(_) | Message::Ack(_)) {
            self.recorder.publish(message, time, mirror);
            return;
        }
        let kind = message.kind().name();
        match self.bus.publish_mirrored(message, time, mirror) {
            Ok(_) | Err(loopwarden_bus::PublishError::Offline) => {}
            Err(e) => tracing::warn!("{kind} not published: {e}"),
        }
    }

    /// Logs an event to flash and publishes it, both through the
    /// recorder, in decision order (the frame's number is logged too, for
    /// a reader that asks for it again).
    pub(super) async fn emit(&mut self, event: Event, time: TimestampMs) {
        self.recorder.emit(event, time);
    }

    pub(super) fn publish_telemetry(&mut self, now: TimestampMs) {
        let sat = |n: u64| n.min(u64::from(u32::MAX)) as u32;
        let mut telemetry = HostTelemetry {
            gpus: heapless::Vec::new(),
            drops: QueueDrops {
                xids: sat(self.xid_stats.get().1),
                flash: sat(self.recorder.dropped()),
                bus: sat(self.bus.metrics().dropped()),
                acks_withheld: sat(self.node.acks_withheld()),
            },
        };
        for (i, g) in self.gpus.iter().enumerate() {
            let s = g.last.unwrap_or_default();
            let _ = telemetry.gpus.push(GpuTelemetry {
                gpu: Self::gpu_index(i),
                flags: s.flags.with(GpuFlags::RESPONSIVE, g.responsive),
                unsupported: s.unsupported,
                temp: s.temp,
                mem_temp: s.mem_temp,
                power: s.power,
                power_limit: s.power_limit,
                sm_clock: s.sm_clock,
                mem_clock: s.mem_clock,
                util: s.util,
                throttle: s.throttle,
                ecc: s.ecc,
                repair: s.repair,
                pcie_replay: s.pcie_replay,
                nvlink: s.nvlink,
            });
        }
        let mirror = self
            .last_json
            .is_none_or(|t| t.elapsed() + Duration::from_millis(50) >= self.config.json_period);
        if mirror {
            self.last_json = Some(Instant::now());
        }
        self.publish(Message::HostTelemetry(telemetry), now, mirror);
    }
}
