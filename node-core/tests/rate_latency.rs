//! The worst detection latency of the rate rules, measured against what
//! `docs/health.md` section 5 promises: a rate just above its limit,
//! starting at every phase of the schedule, is detected no later than the
//! figure the table gives.
//!
//! PCIe replays, read every sample (the agent's field-value query carries
//! the counter), are measured at every whole-second period from 1 to
//! 60 s and at 59,999 ms, the rate starting at every fiftieth of a period
//! through the first minute (between samples as well as on one); the
//! slow counters' setting does not touch a counter read every sample
//! (`node-agent/tests/nvml_pcie_replay.rs` checks that through the
//! agent's NVML layer at settings from 1 to 60 s). Read with the
//! slow counters instead (a GPU with no other per-sample field value:
//! [`SlowCounters::pcie_with_slow`]), at every `slow_counters_s` from 1
//! to 60 s at 1, 7 and 45 s periods (read every `slow_counters_s`
//! rounded up to whole periods: intervals that divide the minute and
//! intervals that do not, 7, 35 or 90 s), at 60 s for every whole-second
//! period from 2 to 60 s (read every 60 to 118 s), and at the longest
//! read interval any accepted setting gives (60 s at 59,999 ms periods:
//! 119,998 ms).
//!
//! The documented worst case of a rate rule is its 1-minute window
//! filling (the streak starts only once the last minute's count is over
//! the limit), then its sustain, then 1 period. The PCIe replay rate is
//! counted between the counter's reads: read every sample, that bound
//! holds when the period divides the minute, plus two more periods when
//! it does not (measured: up to 2.36 periods past the minute and the
//! sustain, at 53 s periods; the rate starting between samples, one more
//! period was not enough); read with the slow counters, plus the time between their
//! reads, twice that time when it does not divide the minute: from the
//! first read after the onset (up to one interval late) to the first read
//! at least a minute after that, which is a minute later when the
//! interval divides the minute and up to a minute and one interval later
//! when it does not.
//!
//! Replays in bursts are placed in time only to the read interval: 18
//! every 2 minutes read every 45 s are measured against the figure
//! `docs/health.md` gives for them instead of the bound.

use loopwarden_protocol::{HealthState, ReasonCode, TimestampMs};
use node_core::health::{HealthEngine, Limits, Observation, Policy, SlowCounters};

const MINUTE_MS: u64 = 60_000;

/// A healthy, busy GPU whose counters are set by the caller.
fn quiet() -> Observation {
    Observation {
        temp: 60.0,
        power: 300.0,
        power_limit: 700.0,
        sm_clock: 1980.0,
        util: 90.0,
        ..Observation::default()
    }
}

/// When (ms after the onset) one GPU is degraded for `reason`, sampled
/// every `period_ms` with its slow counters read as `slow` reads them; the
/// rate starts at `onset_ms` (a phase of the schedule) and `count(ms
/// since the onset)` gives the counters. `None`: not within `limit_ms`.
fn detected(
    period_ms: u64,
    slow: SlowCounters,
    onset_ms: u64,
    limit_ms: u64,
    reason: ReasonCode,
    count: impl Fn(u64, &mut Observation),
) -> Option<u64> {
    let limits = Limits {
        max_operating_c: 87.0,
    };
    let mut engine = HealthEngine::new(1, limits, Policy::default(), TimestampMs(0));
    let mut slow = slow;
    let mut t = 0;
    while t <= onset_ms + limit_ms {
        let mut o = quiet();
        count(t.saturating_sub(onset_ms), &mut o);
        let seen = slow.read(t, 0, &o);
        engine.sample(TimestampMs(t), 0, &seen);
        let s = engine.status(0).expect("GPU 0");
        if s.state == HealthState::Degraded && s.reason == reason {
            return Some(t.saturating_sub(onset_ms));
        }
        t += period_ms;
    }
    None
}

/// The read schedules to try, (period, slow_counters) in ms, each as the
/// agent runs them: every `slow_counters_s` from 1 to 60 s at 1, 7 and
/// 45 s periods; 60 s at every whole-second period from 2 to 60 s
/// (rounded up to whole periods: read every 60 to 118 s); and the longest
/// read interval of all (60 s at 59,999 ms periods: read every 119,998
/// ms).
fn schedules() -> Vec<(u64, u64)> {
    let every_setting = [1_000, 7_000, 45_000]
        .into_iter()
        .flat_map(|p| (1..=60).map(move |s| (p, s * 1_000)));
    let every_period = (2..=60).map(|p| (p * 1_000, 60_000));
    let longest = std::iter::once((59_999, 60_000));
    every_setting.chain(every_period).chain(longest).collect()
}

/// Reads every `slow_counters_s` rounded up to whole periods, as
/// `Config::slow_every` does.
fn read_interval(period_ms: u64, slow_ms: u64) -> u64 {
    slow_ms.div_ceil(period_ms) * period_ms
}

/// `tenths`/10 PCIe replays a minute, steadily.
fn replays(tenths: u64) -> impl Fn(u64, &mut Observation) {
    move |ms, o| o.pcie_replay = tenths * ms / (10 * MINUTE_MS)
}

/// The periods to try with the counter read every sample: every whole
/// second from 1 to 60 s, and the longest a setting gives short of a
/// minute (59,999 ms).
fn periods() -> impl Iterator<Item = u64> {
    (1..=60).map(|s| s * 1_000).chain(std::iter::once(59_999))
}

/// Onsets to try at `period` ms: through the first minute (or period),
/// a fiftieth of a period apart, so the rate starts between samples as
/// well as on one.
fn sub_period_onsets(period: u64) -> impl Iterator<Item = u64> {
    (0..MINUTE_MS.max(period)).step_by((period / 50).max(1) as usize)
}

/// Read every sample, a rate just above the limit (9/min against 8) and
/// a storm (24/min) are detected within the minute, the sustain and a
/// period (plus two more periods when the period does not divide the
/// minute), at every onset a fiftieth of a period apart. Measured: the
/// worst was 0.98 of a period past the minute and the sustain at periods
/// that divide the minute (180.98 s at 1 s periods), 2.36 periods past
/// them at 53 s periods (305.3 s).
#[test]
fn pcie_replays_read_every_sample_are_detected_within_the_documented_worst_case() {
    let p = Policy::default();
    for period in periods() {
        let extra = if MINUTE_MS % period == 0 {
            0
        } else {
            2 * period
        };
        let worst = MINUTE_MS + p.pcie_sustain_ms + period + extra;
        for tenths in [p.pcie_replays_per_min * 10 + 10, 240] {
            for onset in sub_period_onsets(period) {
                let slow = SlowCounters::new(1, 30_000);
                let limit = 10 * MINUTE_MS;
                let reason = ReasonCode::PCIE_REPLAY_RATE;
                let found = detected(period, slow, onset, limit, reason, replays(tenths));
                let at = found.unwrap_or_else(|| {
                    panic!(
                        "{tenths}/10 per min, period {period} ms, onset {onset} ms: never detected"
                    )
                });
                assert!(
                        at <= worst,
                        "{tenths}/10 per min, period {period} ms, onset {onset} ms: detected after {at} ms, documented worst {worst} ms"
                    );
            }
        }
    }
}

/// A rate just above the limit starting between two samples at a period
/// that does not divide the minute: 9/min from 71,875 ms, sampled every
/// 23 s, was degraded 227.1 s after its onset, past the bound that gave
/// one period for it (226 s); the bound gives two (249 s).
#[test]
fn a_pcie_replay_rate_starting_between_samples_is_detected_within_the_documented_worst_case() {
    let p = Policy::default();
    let (period, onset) = (23_000, 71_875);
    let slow = SlowCounters::new(1, 30_000);
    let reason = ReasonCode::PCIE_REPLAY_RATE;
    let at = detected(period, slow, onset, 10 * MINUTE_MS, reason, replays(90));
    let worst = MINUTE_MS + p.pcie_sustain_ms + period + 2 * period;
    assert!(at.is_some_and(|at| at <= worst), "{at:?}");
}

/// A steady rate half a replay a minute above the limit (8.5/min), read
/// every sample at 1 s periods, is detected at every phase (an onset at
/// each sample through the first minute) within 4 minutes (it counts
/// 9 replays only in some minutes, so its streak starts later than
/// 9/min's). That it is so at every `slow_counters_s` is for the agent's
/// NVML layer to show (`node-agent/tests/nvml_pcie_replay.rs`): here the
/// setting does not touch a counter read every sample.
#[test]
fn a_pcie_replay_rate_just_above_the_limit_read_every_sample_is_detected_within_4_minutes() {
    let p = Policy::default();
    assert_eq!(p.pcie_replays_per_min, 8, "8.5/min is just above it");
    let reason = ReasonCode::PCIE_REPLAY_RATE;
    for onset in (0..MINUTE_MS).step_by(1_000) {
        let slow = SlowCounters::new(1, 30_000);
        let found = detected(1_000, slow, onset, 15 * MINUTE_MS, reason, replays(85));
        assert!(
            found.is_some_and(|ms| ms <= 4 * MINUTE_MS),
            "onset {onset} ms: {found:?}"
        );
    }
}

/// Read with the slow counters (a GPU with no other per-sample field
/// value), a rate just above the limit and a storm starting at every read
/// phase (onsets 51/50 of a period apart, each a little further between
/// samples) are detected within
/// the bound that adds the read interval, twice when it does not divide
/// the minute.
#[test]
fn pcie_replays_read_with_the_slow_counters_are_detected_within_the_documented_worst_case() {
    let p = Policy::default();
    let schedules = schedules();
    let longest = schedules.iter().map(|&(p, s)| read_interval(p, s)).max();
    assert_eq!(longest, Some(119_998), "the longest read interval tried");
    for (period, slow_ms) in schedules {
        let every = read_interval(period, slow_ms);
        // Just above the limit (9/min against 8), and a storm (24/min).
        for per_min in [p.pcie_replays_per_min + 1, 24] {
            let reads = if MINUTE_MS % every == 0 { 1 } else { 2 };
            let worst = MINUTE_MS + p.pcie_sustain_ms + period + reads * every;
            for onset in (0..every).step_by((period + period / 50) as usize) {
                let found = detected(
                    period,
                    SlowCounters::new(1, slow_ms).pcie_with_slow(),
                    onset,
                    10 * MINUTE_MS,
                    ReasonCode::PCIE_REPLAY_RATE,
                    |ms, o| {
                        o.pcie_replay = per_min * ms / MINUTE_MS;
                    },
                );
                let at = found.unwrap_or_else(|| {
                    panic!("{per_min}/min, period {period} ms, read every {every} ms, onset {onset} ms: never detected in 10 min")
                });
                assert!(
                    at <= worst,
                    "{per_min}/min, period {period} ms, read every {every} ms, onset {onset} ms: detected after {at} ms, documented worst {worst} ms"
                );
            }
        }
    }
}

#[test]
fn corrected_ecc_and_nvlink_crc_rates_just_above_the_limit_are_detected_within_the_documented_worst_case(
) {
    let p = Policy::default();
    for period in [1_000, 5_000] {
        let worst = MINUTE_MS + p.sbe_sustain_ms + period;
        for onset in (0..MINUTE_MS).step_by(period as usize * 7) {
            let per_min = p.sbe_per_min + 1;
            let at = detected(
                period,
                SlowCounters::new(1, 30_000),
                onset,
                10 * MINUTE_MS,
                ReasonCode::SBE_RATE_RISING,
                |ms, o| {
                    o.sbe_volatile = per_min * ms / MINUTE_MS;
                },
            );
            let at = at.expect("corrected ECC errors detected");
            assert!(
                at <= worst,
                "period {period}, onset {onset}: {at} ms > {worst} ms"
            );
            let per_s = p.nvlink_crc_per_s + 1;
            let worst = MINUTE_MS + p.nvlink_crc_sustain_ms + period;
            let at = detected(
                period,
                SlowCounters::new(1, 30_000),
                onset,
                10 * MINUTE_MS,
                ReasonCode::NVLINK_ERRORS,
                |ms, o| {
                    o.nvlink_crc = per_s * ms / 1_000;
                },
            );
            let at = at.expect("NVLink CRC errors detected");
            assert!(
                at <= worst,
                "period {period}, onset {onset}: {at} ms > {worst} ms"
            );
        }
    }
}

/// A steady PCIe replay rate at or just below the limit (7.9/min and
/// 8/min against 8) is never degraded, within 20 minutes at every onset
/// phase: read every sample at every whole-second period from 1 to 60 s
/// (onsets a fiftieth of a period apart through one period), and read
/// with the slow counters at every `slow_counters_s` from 1 to 60 s at
/// 1, 7 and 45 s periods (onsets 51/50 of a period apart through one read
/// interval: every read phase, each a little further between samples). The counter steps in whole replays: read at an interval that
/// does not divide the minute (22, 33, 37 s ...), a count between reads
/// more than a minute apart scaled to the minute read such a rate above
/// the limit (9 replays in 66 s); the minute is now counted from the
/// counter's value interpolated at exactly a minute before the read, and
/// the 2 minutes' sustain in whole replays.
#[test]
fn pcie_replays_at_or_below_the_limit_are_never_degraded_at_any_read_interval() {
    let p = Policy::default();
    let settings = [1_000, 7_000, 45_000]
        .into_iter()
        .flat_map(|p| (1..=60).map(move |s| (p, s * 1_000, true)));
    let every_sample = periods().map(|p| (p, 30_000, false));
    for (period, slow_ms, pcie_slow) in settings.chain(every_sample) {
        let every = if pcie_slow {
            read_interval(period, slow_ms)
        } else {
            period
        };
        // Tenths of a replay a minute: 7.9/min and the limit itself.
        for tenths in [p.pcie_replays_per_min * 10 - 1, p.pcie_replays_per_min * 10] {
            let step = if pcie_slow {
                period + period / 50
            } else {
                (period / 50).max(1)
            };
            for onset in (0..every).step_by(step as usize) {
                let slow = SlowCounters::new(1, slow_ms);
                let found = detected(
                    period,
                    if pcie_slow {
                        slow.pcie_with_slow()
                    } else {
                        slow
                    },
                    onset,
                    20 * MINUTE_MS,
                    ReasonCode::PCIE_REPLAY_RATE,
                    |ms, o| {
                        o.pcie_replay = tenths * ms / (10 * MINUTE_MS);
                    },
                );
                assert_eq!(
                    found,
                    None,
                    "{tenths}/10 per min, period {period} ms, read every {every} ms, onset {onset} ms: degraded"
                );
            }
        }
    }
}

/// A steady rate just above the limit (8.5 and 8.6/min against 8), read
/// every sample at periods that do not divide the minute, is detected at
/// every phase (onsets a fiftieth of a period apart through the first
/// minute) within 6 minutes, as at 1 s periods. Counted over reads that
/// do not fall on the 2 minutes, the interpolated start's fraction
/// dropped read 16 whole replays at some reads and ended the streak
/// there: 8.5/min was never detected at 11 or 23 s periods. The streak
/// now ends only once the interpolated 2 minutes, their fraction kept,
/// hold 16 replays or fewer.
#[test]
fn a_pcie_replay_rate_just_above_the_limit_is_detected_at_periods_that_do_not_divide_the_minute() {
    let reason = ReasonCode::PCIE_REPLAY_RATE;
    for period in [7_000, 11_000, 13_000, 23_000] {
        for tenths in [85, 86] {
            for onset in sub_period_onsets(period) {
                let slow = SlowCounters::new(1, 30_000);
                let found = detected(period, slow, onset, 15 * MINUTE_MS, reason, replays(tenths));
                assert!(
                    found.is_some_and(|ms| ms <= 6 * MINUTE_MS),
                    "{tenths}/10 per min, period {period} ms, onset {onset} ms: {found:?}"
                );
            }
        }
    }
}

/// 18 PCIe replays at once every 2 minutes (9/min on average against 8),
/// the first burst just after the onset.
fn bursts(ms: u64, o: &mut Observation) {
    o.pcie_replay = 18 * ms.div_ceil(2 * MINUTE_MS);
}

/// Replays in bursts are placed in time only to the read interval, so
/// their detection can exceed the documented bound (271 s read every
/// 45 s at 1 s periods). 18 replays every 2 minutes, read with the slow
/// counters every 45 s, the first burst at every phase 0.1 s apart
/// through a read interval, are detected after at most 405 s at the
/// default 1 s period (measured: 405.0 s, the burst 30 s after a read),
/// 411 s at 9 s periods (at 3, 5 and 15 s periods 405 s). Read every
/// sample at 45 s periods they went undetected (measured, not kept as a
/// test: a miss of a rate above the limit is a figure docs/health.md
/// section 5 gives, not a behaviour to hold).
#[test]
fn pcie_replays_in_bursts_read_every_45_s_are_detected_within_the_documented_figure() {
    let reason = ReasonCode::PCIE_REPLAY_RATE;
    for (period, worst) in [
        (1_000, 405_000),
        (3_000, 405_000),
        (5_000, 405_000),
        (9_000, 411_000),
        (15_000, 405_000),
    ] {
        for onset in (0..45_000).step_by(100) {
            let slow = SlowCounters::new(1, 45_000).pcie_with_slow();
            let found = detected(period, slow, onset, 15 * MINUTE_MS, reason, bursts);
            assert!(
                found.is_some_and(|ms| ms <= worst),
                "period {period} ms, first burst {onset} ms: {found:?}, documented {worst} ms"
            );
        }
    }
}

/// PCIe replays in bursts below the limit, 17 at once every 130 s
/// (7.85/min on average against 8), read every sample at 7 and 11 s
/// periods, the first burst at every phase 10 ms apart through a period,
/// are never degraded within 30 minutes. Counted between reads at least
/// 2 minutes apart, 17 replays read 126 s apart average 8.1/min though
/// the exact last 2 minutes hold none: a streak kept on that count was
/// taken on by the next burst and degraded the GPU.
#[test]
fn pcie_replays_in_bursts_below_the_limit_are_never_degraded() {
    let reason = ReasonCode::PCIE_REPLAY_RATE;
    for period in [7_000, 11_000] {
        for onset in (0..period).step_by(10) {
            let slow = SlowCounters::new(1, 30_000);
            let found = detected(period, slow, onset, 30 * MINUTE_MS, reason, |ms, o| {
                o.pcie_replay = 17 * ms.div_ceil(130_000)
            });
            assert_eq!(
                found, None,
                "17 replays every 130 s, period {period} ms, first burst {onset} ms: degraded"
            );
        }
    }
}
