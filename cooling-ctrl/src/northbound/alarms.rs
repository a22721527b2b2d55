//! The BMS's acknowledgement of the standing alarms (`alarm_ack`), kept
//! the same on `run` and on the gateway ([`AlarmAck`]): it covers what
//! the registers showed alarming when the BMS wrote it, and is cleared
//! as soon as a snapshot shows anything alarming it did not cover. The
//! server takes a write at once but the loop applies it only between
//! its steps, so the write carries what the registers showed as the
//! server took it (`NorthboundWrite::AlarmAck`'s `seen`, the snapshot's
//! [`alarms`](NorthboundSnapshot::alarms)): an alarm that rose while it
//! waited is not acknowledged by it, and `alarm_ack` reads 0. The
//! beacon is an OR of many conditions, so it may stay lit while a new
//! one rises (a cut rope on rack 1, then a real leak on rack 4): its
//! off-to-on edge alone would leave the new alarm reading acknowledged.
//!
//! What a snapshot shows alarming ([`Alarms::of`]): the racks with a
//! latched leak, with leak sensing lost, with a failed isolation, the
//! pumps out of service, the required sensors (supply, return, flow)
//! under a fault, the mode and reason while failsafe, the CDU refusing
//! writes (whatever reason the mode shows: a capacity cap comes first
//! there), a GPU above its maximum operating temperature, and the beacon
//! itself (for what lights it that the snapshot does not show: a valve
//! position input not believed). What clears goes out of the
//! acknowledgement too, so the same alarm rising again is new.

use loopwarden_protocol::message::CduMode;
use loopwarden_protocol::ReasonCode;

use cooling_core::sensors::Which;

use super::snapshot::{pump_bits, NorthboundSnapshot, FAULT_BIT};

/// The bits of [`NorthboundSnapshot::sensor_faults`] of the required
/// sensors under a fault (the beacon lights for them).
fn required_faults(word: u16) -> u16 {
    Which::ALL
        .iter()
        .filter(|w| w.required())
        .fold(0, |bits, w| bits | FAULT_BIT << (*w as u16))
        & word
}

/// What one snapshot shows alarming (see the module note).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Alarms {
    /// Racks with a latched leak, bit n = rack n.
    leaks_latched: u16,
    /// Racks whose leak sensing is lost.
    sensing_lost: u16,
    /// Racks whose isolation failed.
    isolation_failed: u16,
    /// The pumps out of service ([`pump_bits::A_FAILED`], `B_FAILED`).
    pumps_failed: u16,
    /// The required sensors under a fault ([`FAULT_BIT`] << n).
    sensor_faults: u16,
    /// The mode and reason while failsafe.
    mode: Option<(CduMode, ReasonCode)>,
    /// The CDU refuses writes.
    writes_refused: bool,
    /// A GPU above its maximum operating temperature.
    gpu_hot: bool,
    /// The beacon is lit.
    beacon: bool,
}

impl Alarms {
    /// What `s` shows alarming, a GPU counting above `gpu_max_c` (°C).
    pub fn of(s: &NorthboundSnapshot, gpu_max_c: f32) -> Self {
        Self {
            leaks_latched: s.leaks_latched,
            sensing_lost: s.leak_sensing_lost,
            isolation_failed: s.isolation_failed,
            pumps_failed: s.pumps & (pump_bits::A_FAILED | pump_bits::B_FAILED),
            sensor_faults: required_faults(s.sensor_faults),
            mode: (s.mode == CduMode::Failsafe).then_some((s.mode, s.reason)),
            writes_refused: s.cdu_refuses_writes || s.reason == ReasonCode::CDU_WRITES_REFUSED,
            gpu_hot: s.hottest_gpu_c.is_some_and(|c| c > gpu_max_c),
            beacon: s.beacon,
        }
    }

    /// Whether `self` shows anything alarming that `covered` does not.
    fn beyond(&self, covered: &Alarms) -> bool {
        let bits = |now: u16, was: u16| now & !was != 0;
        bits(self.leaks_latched, covered.leaks_latched)
            || bits(self.sensing_lost, covered.sensing_lost)
            || bits(self.isolation_failed, covered.isolation_failed)
            || bits(self.pumps_failed, covered.pumps_failed)
            || bits(self.sensor_faults, covered.sensor_faults)
            || (self.mode.is_some() && self.mode != covered.mode)
            || (self.writes_refused && !covered.writes_refused)
            || (self.gpu_hot && !covered.gpu_hot)
            || (self.beacon && !covered.beacon)
    }

    /// What of `self` still stands in `now`.
    fn still(&self, now: &Alarms) -> Alarms {
        Alarms {
            leaks_latched: self.leaks_latched & now.leaks_latched,
            sensing_lost: self.sensing_lost & now.sensing_lost,
            isolation_failed: self.isolation_failed & now.isolation_failed,
            pumps_failed: self.pumps_failed & now.pumps_failed,
            sensor_faults: self.sensor_faults & now.sensor_faults,
            mode: self.mode.filter(|m| now.mode == Some(*m)),
            writes_refused: self.writes_refused && now.writes_refused,
            gpu_hot: self.gpu_hot && now.gpu_hot,
            beacon: self.beacon && now.beacon,
        }
    }
}

/// The acknowledgement (see the module note): what it covers, and what
/// the registers last showed alarming.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlarmAck {
    /// What the acknowledgement covers; `None`: not acknowledged.
    covered: Option<Alarms>,
    /// What the last snapshot showed alarming.
    shown: Alarms,
}

impl AlarmAck {
    /// The BMS wrote `alarm_ack` 1 having read `seen` (what the registers
    /// showed alarming as the server took the write): it acknowledges
    /// what of `seen` still stands. Whether the alarms are acknowledged
    /// now, which `alarm_ack` then reads: not when the registers show
    /// anything alarming that `seen` did not (it rose after the BMS read
    /// them, while the write waited for the loop), and then an
    /// acknowledgement that stood before stands as it was.
    pub fn acknowledge(&mut self, seen: Alarms) -> bool {
        if self.shown.beyond(&seen) {
            return self.covered.is_some();
        }
        self.covered = Some(seen.still(&self.shown));
        true
    }

    /// A new snapshot `s` (a GPU above `gpu_max_c` counting): whether the
    /// acknowledgement still stands, which `s`'s `alarm_ack` then reads.
    /// `s` carries what it shows alarming ([`NorthboundSnapshot::alarms`]),
    /// which an `alarm_ack` written against it acknowledges.
    pub fn shown(&mut self, s: &mut NorthboundSnapshot, gpu_max_c: f32) -> bool {
        let now = Alarms::of(s, gpu_max_c);
        self.covered = self
            .covered
            .filter(|c| !now.beyond(c))
            .map(|c| c.still(&now));
        self.shown = now;
        s.alarms = now;
        s.settings.alarm_acknowledged = self.covered.is_some();
        s.settings.alarm_acknowledged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU_MAX_C: f32 = 87.0;

    fn lit(leaks: u16, sensing: u16) -> NorthboundSnapshot {
        NorthboundSnapshot {
            mode: CduMode::Degraded,
            reason: ReasonCode::LEAK,
            leaks_latched: leaks,
            leak_sensing_lost: sensing,
            beacon: true,
            ..NorthboundSnapshot::default()
        }
    }

    /// Acknowledges what `first` shows, then shows `then`: whether the
    /// acknowledgement stands.
    fn acked_then(first: NorthboundSnapshot, mut then: NorthboundSnapshot) -> bool {
        let mut a = AlarmAck::default();
        let mut read = first.clone();
        assert!(!a.shown(&mut read, GPU_MAX_C));
        assert!(a.acknowledge(read.alarms));
        assert!(a.shown(&mut first.clone(), GPU_MAX_C), "covers what it saw");
        a.shown(&mut then, GPU_MAX_C)
    }

    #[test]
    fn a_new_alarm_under_a_lit_beacon_clears_the_acknowledgement() {
        // A cut rope on rack 1 lights the beacon; rack 4 then leaks.
        let cut = lit(0, 1 << 1);
        assert!(!acked_then(cut.clone(), lit(1 << 4, 1 << 1)));
        // Another rack's sensing lost, a failed isolation, a pump out.
        assert!(!acked_then(cut.clone(), lit(0, 1 << 1 | 1 << 2)));
        let mut isolation = lit(0, 1 << 1);
        isolation.isolation_failed = 1 << 5;
        assert!(!acked_then(cut.clone(), isolation));
        let mut pump = lit(0, 1 << 1);
        pump.pumps = pump_bits::B_FAILED | pump_bits::A_RUNNING;
        assert!(!acked_then(cut.clone(), pump));
        // Failsafe, then failsafe for another reason.
        let mut failsafe = lit(0, 1 << 1);
        (failsafe.mode, failsafe.reason) = (CduMode::Failsafe, ReasonCode::SENSOR_LOST);
        assert!(!acked_then(cut.clone(), failsafe.clone()));
        let mut other = failsafe.clone();
        other.reason = ReasonCode::CDU_UNREACHABLE;
        assert!(!acked_then(failsafe.clone(), other));
        // A GPU above its maximum.
        let mut hot = lit(0, 1 << 1);
        hot.hottest_gpu_c = Some(GPU_MAX_C + 0.5);
        assert!(!acked_then(cut.clone(), hot));
        // What it covered, standing or partly cleared, stays acknowledged.
        assert!(acked_then(cut.clone(), cut.clone()));
        assert!(acked_then(lit(1 << 2 | 1 << 3, 1), lit(1 << 3, 0)));
        assert!(acked_then(failsafe.clone(), failsafe));
    }

    #[test]
    fn a_sensor_fault_or_refused_writes_under_a_lit_beacon_clear_the_acknowledgement() {
        let cut = lit(0, 1 << 1);
        // The supply sensor's loop breaks, then the return's.
        let mut supply = cut.clone();
        supply.sensor_faults |= FAULT_BIT << (Which::Supply as u16);
        assert!(!acked_then(cut.clone(), supply.clone()));
        let mut both = supply.clone();
        both.sensor_faults |= FAULT_BIT << (Which::Return as u16);
        assert!(!acked_then(supply.clone(), both.clone()));
        assert!(acked_then(both, supply.clone()), "what it covered");
        // The facility supply lights no beacon: no alarm of its own.
        let mut facility = cut.clone();
        facility.sensor_faults |= FAULT_BIT << (Which::FacilitySupply as u16);
        assert!(acked_then(cut.clone(), facility));
        // The CDU refuses writes while a capacity cap is the mode's reason.
        let mut capped = cut.clone();
        capped.reason = ReasonCode::CAPACITY_SHORT;
        let mut refused = capped.clone();
        refused.cdu_refuses_writes = true;
        assert!(!acked_then(capped, refused.clone()));
        assert!(acked_then(refused.clone(), refused));
    }

    #[test]
    fn an_alarm_that_clears_and_rises_again_is_new() {
        let mut a = AlarmAck::default();
        let mut both = lit(1 << 4, 1 << 1);
        a.shown(&mut both, GPU_MAX_C);
        a.acknowledge(both.alarms);
        // Rack 4's leak is cleared, the cut rope keeps the beacon lit;
        // then rack 4 leaks again.
        assert!(a.shown(&mut lit(0, 1 << 1), GPU_MAX_C));
        let mut leak = lit(1 << 4, 1 << 1);
        assert!(!a.shown(&mut leak, GPU_MAX_C));
        // The beacon going out and lighting again, as before.
        a.acknowledge(leak.alarms);
        let mut dark = NorthboundSnapshot::default();
        assert!(a.shown(&mut dark, GPU_MAX_C));
        let mut again = lit(1 << 4, 1 << 1);
        assert!(!a.shown(&mut again, GPU_MAX_C));
        assert!(!again.settings.alarm_acknowledged, "the snapshot reads it");
    }

    #[test]
    fn an_acknowledgement_covers_only_what_the_bms_had_read() {
        // The BMS reads rack 1's cut rope and writes alarm_ack; before the
        // loop takes the write, rack 4's sensing is lost too.
        let mut a = AlarmAck::default();
        let mut cut = lit(0, 1 << 1);
        a.shown(&mut cut, GPU_MAX_C);
        let mut more = lit(0, 1 << 1 | 1 << 4);
        assert!(!a.shown(&mut more.clone(), GPU_MAX_C));
        assert!(!a.acknowledge(cut.alarms), "rack 4 was not read");
        assert!(!a.shown(&mut more, GPU_MAX_C));
        // Read again, and acknowledged.
        assert!(a.acknowledge(more.alarms));
        assert!(a.shown(&mut more, GPU_MAX_C));
        // A late write that read less leaves a standing one as it was.
        assert!(a.acknowledge(cut.alarms));
        assert!(a.shown(&mut more, GPU_MAX_C), "rack 4 still covered");
        // What it read that has cleared since is no matter.
        let mut a = AlarmAck::default();
        let mut both = lit(1 << 4, 1 << 1);
        a.shown(&mut both, GPU_MAX_C);
        a.shown(&mut cut.clone(), GPU_MAX_C);
        assert!(a.acknowledge(both.alarms));
        assert!(a.shown(&mut cut.clone(), GPU_MAX_C));
        assert!(!a.shown(&mut lit(1 << 4, 1 << 1), GPU_MAX_C), "risen again");
    }
}
