//! Pure mappings between what the shell reads or sends and what the core
//! takes or gives: a host's telemetry as its report, a cap as a lease (the
//! CDU's readings and settings are the decision path's: [`crate::decide`]).
use super::*;

/// A host's telemetry as the core's report, at `at_ms` (shell time).
/// GPUs that did not answer their queries are left out; a GPU in hardware
/// slowdown (thermal or not) sets `slowdown`.
pub fn host_report(t: &HostTelemetry, at_ms: u64) -> HostReport {
    let mut r = HostReport {
        gpus: 0,
        hottest_c: 0.0,
        gpu_power_w: 0.0,
        limit_w: 0.0,
        slowdown: false,
        at_ms,
    };
    let slow = ThrottleReasons::HW_SLOWDOWN | ThrottleReasons::HW_THERMAL_SLOWDOWN;
    for g in t
        .gpus
        .iter()
        .filter(|g| g.flags.contains(GpuFlags::RESPONSIVE))
    {
        let temp = f32::from(g.temp.get());
        r.hottest_c = if r.gpus == 0 {
            temp
        } else {
            r.hottest_c.max(temp)
        };
        r.gpus = r.gpus.saturating_add(1);
        r.gpu_power_w += g.power.get() as f32;
        r.limit_w = r.limit_w.max(g.power_limit.get() as f32);
        r.slowdown |= g.throttle.bits() & slow.bits() != 0;
    }
    r
}

/// How far a host report's stamp may be from now, ms.
pub const REPORT_SKEW_MS: u64 = 60_000;
/// A GPU may draw this much above its TDP (transients) and be believed.
const TDP_MARGIN: f32 = 1.10;
/// A GPU may read this much below the supply (sensor offsets, and a GPU
/// lagging a supply that warms at the setpoint's slew), K.
const BELOW_SUPPLY_K: f32 = 5.0;

/// Why a host's telemetry, stamped `stamped` and heard at `now`, cannot
/// be believed, if it cannot: its stamp is more than a minute from now, a
/// GPU draws more than 10 % above the TDP (`tdp_w`), or a GPU reads
/// colder than the coolant that cools it (5 K under the trusted
/// `supply_c`). None of these a working GPU can report; a broken or
/// compromised agent can.
pub fn implausible(
    t: &HostTelemetry,
    stamped: TimestampMs,
    now: TimestampMs,
    supply_c: Option<f32>,
    tdp_w: f32,
) -> Option<String> {
    let skew = stamped.0.abs_diff(now.0);
    if skew > REPORT_SKEW_MS {
        return Some(format!("stamped {} s from now", skew / 1000));
    }
    for g in t
        .gpus
        .iter()
        .filter(|g| g.flags.contains(GpuFlags::RESPONSIVE))
    {
        let (i, w, temp) = (g.gpu.get(), g.power.get() as f32, f32::from(g.temp.get()));
        if w > tdp_w * TDP_MARGIN {
            return Some(format!("GPU {i} draws {w} W, above its {tdp_w} W TDP"));
        }
        if let Some(s) = supply_c.filter(|s| temp < s - BELOW_SUPPLY_K) {
            return Some(format!(
                "GPU {i} at {temp} °C, colder than the {s:.1} °C supply"
            ));
        }
    }
    None
}

/// A cap lease as the shell sends it (unsigned, `auth` zero).
pub fn cap_lease(lease: u32, reason: ReasonCode, watts: f32, duration: Duration) -> CapLease {
    let mut caps = heapless::Vec::new();
    let _ = caps.push(GpuCap {
        gpus: GpuSelector::All,
        limit: Watts(watts.round().max(0.0) as u32),
    });
    CapLease {
        lease,
        source: CapSource::Cooling,
        reason,
        caps,
        duration: DurationMs(duration.as_millis().min(u128::from(u32::MAX)) as u32),
        auth: CommandAuth::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::samples;
    use loopwarden_protocol::units::WholeCelsius;

    #[test]
    fn reports_no_working_gpu_could_make_are_not_believed() {
        let now = TimestampMs(1_800_000_000_000);
        let t = samples::host_telemetry(8);
        let temp = f32::from(t.gpus[0].temp.get());
        assert_eq!(implausible(&t, now, now, Some(30.0), 700.0), None);
        let e = implausible(&t, TimestampMs(now.0 - 61_000), now, Some(30.0), 700.0);
        assert_eq!(e.as_deref(), Some("stamped 61 s from now"));
        assert!(implausible(&t, TimestampMs(now.0 + 61_000), now, None, 700.0).is_some());
        let mut hot = t.clone();
        hot.gpus[3].power = Watts(2_000);
        let e = implausible(&hot, now, now, None, 700.0).unwrap();
        assert!(e.starts_with("GPU 3 draws 2000 W"), "{e}");
        // Colder than the water that cools it.
        let e = implausible(&t, now, now, Some(temp + 8.0), 700.0).unwrap();
        assert!(e.contains("colder than"), "{e}");
        let mut cold = t.clone();
        cold.gpus[0].temp = WholeCelsius(20);
        assert!(
            implausible(&cold, now, now, Some(24.0), 700.0).is_none(),
            "within 5 K"
        );
    }
}
