//! The sampling timings (period, JSON mirror, deadline, slow counters,
//! unresponsiveness) and the thermal guard, checked against each other and
//! the board.

use std::time::Duration;

use loopwarden_field::common;
use loopwarden_field::config::{range, ConfigError, Sources};
use loopwarden_field::pick;
use loopwarden_protocol::{Watts, WholeCelsius};
use node_core::guard::GuardSettings;

use super::{FileConfig, GuardFile, Overrides};

/// The sampling timings, checked.
pub(super) struct Timings {
    pub(super) period: Duration,
    pub(super) json_period: Duration,
    pub(super) deadline: Duration,
    pub(super) slow_counters: Duration,
    pub(super) unresponsive_after: u32,
    pub(super) expected_gpus: Option<u8>,
}

/// The longest `slow_counters_s`. A GPU that answers none of the
/// per-sample field values (no HBM temperature, no NVLink; `node-agent
/// probe` says which) reads its PCIe replay counter with the slow
/// counters, not every sample: there the PCIe replay rate rule sees the
/// counter step only at these reads, so its worst detection latency
/// grows with the time between them: the minute's window, the 2-minute
/// sustain, a period and the read interval (twice that when it does not
/// divide the minute, docs/health.md section 5). On every GPU the
/// recovery action and the repairs that come with no ECC error or XID
/// are seen only at these reads. The cap keeps that bound at 241 s (read
/// every 60 s at 1 s periods); rounded up to whole
/// periods (at most 60 s each), reads stay under 2 minutes apart (a 59 s
/// period reads every 118 s). More was allowed before (up to 600 s): it
/// is read as this, and said, so that an upgraded host still starts.
const MOST_SLOW_COUNTERS_S: u64 = 60;

/// Why `slow_counters_s` is at most [`MOST_SLOW_COUNTERS_S`].
const SLOW_COUNTERS_WHY: &str = "on a GPU that reads its PCIe replay counter \
     with the slow counters (one answering none of the per-sample field values; \
     `node-agent probe` says which) the PCIe replay rate's detection bound grows \
     with the time between reads, and the recovery action and repairs without \
     an ECC error or XID are seen only at these reads (docs/health.md section 5)";

/// The sampling period, the JSON mirror's period (at least the sampling
/// period), the deadline of one GPU call (at most the sampling period),
/// the time between reads of the slow counters (1 to
/// [`MOST_SLOW_COUNTERS_S`] s, 30 by default, at least one period) and
/// the missed samples before a GPU is unresponsive, and how many GPUs the
/// host has (optional, 1 to 16).
pub(super) fn timings(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<Timings, ConfigError> {
    let period = common::period_ms(src, pick!(flags.period_ms, file.period_ms, "period-ms"))?;
    let json_period = range(
        src,
        pick!(flags.json_period_ms, file.json_period_ms, "json-period-ms"),
        "json_period_ms",
        (10 * period).min(3_600_000),
        period,
        3_600_000,
        " ms, at least the sampling period",
    )?;
    let deadline = range(
        src,
        pick!(flags.deadline_ms, file.deadline_ms, "deadline-ms"),
        "deadline_ms",
        (period / 4).max(10),
        10,
        period,
        " ms, at most the sampling period",
    )?;
    let slow_s = slow_counters_s(
        src,
        pick!(
            flags.slow_counters_s,
            file.slow_counters_s,
            "slow-counters-s"
        ),
    )?;
    let unresponsive_after = range(
        src,
        pick!(
            flags.unresponsive_after,
            file.unresponsive_after,
            "unresponsive-after"
        ),
        "unresponsive_after",
        3,
        1,
        100,
        " samples",
    )?;
    let expected = pick!(flags.expected_gpus, file.expected_gpus, "expected-gpus");
    let expected_gpus = match expected.0 {
        Some(_) => Some(range(src, expected, "expected_gpus", 8, 1, 16, " GPUs")?),
        None => None,
    };
    Ok(Timings {
        period: Duration::from_millis(period),
        json_period: Duration::from_millis(json_period),
        deadline: Duration::from_millis(deadline),
        slow_counters: Duration::from_secs(slow_s).max(Duration::from_millis(period)),
        unresponsive_after,
        expected_gpus,
    })
}

/// `slow_counters_s`: 1 to [`MOST_SLOW_COUNTERS_S`] s, 30 by default. A
/// value above the most (allowed up to 600 s before) is taken down to it
/// and said as an error naming the key, the value given and the value
/// used; 0 is refused.
fn slow_counters_s(
    src: &Sources,
    (given, flag): (Option<u64>, Option<&str>),
) -> Result<u64, ConfigError> {
    let most = MOST_SLOW_COUNTERS_S;
    let used = match given {
        Some(s) if s > most => {
            let said = src.error(
                flag,
                "slow_counters_s",
                format!(
                    "slow_counters_s = {s} is above {most} s: {most} s is used \
                     ({SLOW_COUNTERS_WHY}); write {most} or less to silence this"
                ),
            );
            tracing::error!("{said}");
            Some(most)
        }
        other => other,
    };
    range(
        src,
        (used, flag),
        "slow_counters_s",
        30,
        1,
        most,
        &format!(" s: {SLOW_COUNTERS_WHY}"),
    )
}

/// `[guard]`: engage under the board's shutdown temperature (by default
/// 2 °C under its max operating one), release below engage, and the step.
pub(super) fn guard(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    board: &loopwarden_boards::GpuBoard,
) -> Result<GuardSettings, ConfigError> {
    let none = GuardFile::default();
    let g = file.guard.as_ref().unwrap_or(&none);
    let max_op = board.thermal.max_operating_c.0;
    let engage = range(
        &src.section("guard"),
        pick!(flags.guard_engage_c, g.engage_c, "guard-engage-c"),
        "engage_c",
        max_op.saturating_sub(2),
        30,
        board.thermal.shutdown_c.0 - 1,
        " °C, under the board's shutdown temperature",
    )?;
    let release_pick = pick!(flags.guard_release_c, g.release_c, "guard-release-c");
    let release_flag = release_pick.1;
    let release = range(
        &src.section("guard"),
        release_pick,
        "release_c",
        engage.saturating_sub(5),
        20,
        100,
        " °C",
    )?;
    if release >= engage {
        return Err(src.section("guard").error(
            release_flag,
            "release_c",
            format!("release_c = {release} must be below engage_c = {engage}"),
        ));
    }
    let step = range(
        &src.section("guard"),
        pick!(flags.guard_step_w, g.step_w, "guard-step-w"),
        "step_w",
        25,
        1,
        200,
        " W",
    )?;
    Ok(GuardSettings {
        engage: WholeCelsius(engage),
        release: WholeCelsius(release),
        step: Watts(step),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::super::{resolve, Overrides};

    /// The PCIe replay rate's detection bound grows with the time between
    /// its counter's reads (node-core's `rate_latency` test measures the
    /// intervals accepted here). More than 60 s, allowed before, is read
    /// as 60 s (`tests/config_taken_down.rs` checks what is said); 0 is
    /// refused, naming the key, the range and why.
    #[test]
    fn slow_counters_above_a_minute_are_read_as_60_s_and_0_is_refused_naming_the_range() {
        let base = "site = \"a\"\nhost = \"b\"\ntwin_gpus = 8\n";
        let load = |s: u64| {
            let text = format!("{base}slow_counters_s = {s}\n");
            resolve(Some(Path::new("agent.toml")), &text, &Overrides::default())
        };
        for s in [60, 61, 150, 600] {
            let c = load(s).expect("taken");
            assert_eq!(c.slow_counters, Duration::from_secs(60), "{s}");
        }
        assert_eq!(
            load(1).expect("taken").slow_counters,
            Duration::from_secs(1)
        );
        let e = load(0).expect_err("0 s refused");
        assert_eq!(e.line, Some(4), "{e}");
        let said = e.to_string();
        assert!(
            said.contains("slow_counters_s = 0 is out of range (1 to 60 s: ")
                && said.contains("detection bound grows with the time between"),
            "{said}"
        );
    }
}
