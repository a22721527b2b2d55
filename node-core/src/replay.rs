//! `node-agent replay`: the health engine over a recorded trace.
//!
//! Reads a `gpu-trace/1` file (a header line, then samples, XIDs and
//! cooling records in time order; the format is described in
//! `docs/health.md`), runs the same [`HealthEngine`] the live agent runs in
//! simulated time, and writes one JSON line per state change:
//!
//! ```json
//! {"t_ms":7340,"gpu":3,"state":"quarantined","reason":"xid-79","evidence":"XID 79 (...) at t=7340 ms"}
//! ```
//!
//! The same input gives the same output, byte for byte. A line that cannot
//! be read stops the replay with its line number and the reason.
//!
//! Glossary:
//! - *trace*: what an agent would observe on one host, in order.
//! - *record*: one line after the header: a sample, an XID or a coolant
//!   report.

use std::io::{BufRead, Write};

use loopwarden_protocol::{HealthState, ThrottleReasons, TimestampMs};
use serde::Deserialize;

use crate::health::{
    Change, Coolant, HealthEngine, Limits, LoopState, Observation, Output, Policy, SlowCounters,
};

/// The sampling period of a trace whose header names none, ms (the
/// agent's default).
const DEFAULT_PERIOD_MS: u64 = 1_000;

/// The header line.
#[derive(Debug, Deserialize)]
pub struct Header {
    /// `gpu-trace/1`.
    pub format: String,
    /// Host name.
    #[serde(default)]
    pub host: String,
    /// GPUs on the host.
    pub gpus: usize,
    /// Sampling period, ms.
    #[serde(default)]
    pub period_ms: Option<u64>,
    /// The GPU model's limits.
    pub limits: TraceLimits,
}

/// `limits` of the header.
#[derive(Debug, Deserialize)]
pub struct TraceLimits {
    /// Max operating temperature, °C.
    pub max_operating_c: f64,
}

/// One sample as the trace gives it; a field left out keeps its value.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceSample {
    temp_c: Option<f64>,
    mem_temp_c: Option<f64>,
    power_w: Option<f64>,
    power_limit_w: Option<f64>,
    sm_clock_mhz: Option<f64>,
    mem_clock_mhz: Option<f64>,
    util_pct: Option<f64>,
    ecc_sbe_volatile: Option<u64>,
    ecc_dbe_volatile: Option<u64>,
    retired_sbe: Option<u64>,
    retired_dbe: Option<u64>,
    retired_pending: Option<bool>,
    remap_correctable: Option<u64>,
    remap_uncorrectable: Option<u64>,
    remap_pending: Option<bool>,
    remap_failure: Option<bool>,
    pcie_replay: Option<u64>,
    nvlink_crc: Option<u64>,
    nvlink_replay: Option<u64>,
    nvlink_recovery: Option<u64>,
    throttle: Option<ThrottleReasons>,
    recovery_action: Option<u8>,
    responsive: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct TraceCoolant {
    supply_c: Option<f64>,
    flow_lpm_per_gpu: Option<f64>,
    state: String,
}

#[derive(Debug, Deserialize)]
struct Record {
    t_ms: u64,
    gpu: Option<usize>,
    sample: Option<TraceSample>,
    xid: Option<u16>,
    #[serde(default)]
    #[allow(dead_code)]
    detail: Option<String>,
    coolant: Option<TraceCoolant>,
}

/// Why a trace could not be replayed.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ReplayError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

fn merge(o: &mut Observation, s: &TraceSample) {
    macro_rules! set {
        ($($field:ident <- $src:ident),+) => {
            $( if let Some(v) = s.$src { o.$field = v; } )+
        };
    }
    set!(temp <- temp_c, power <- power_w, power_limit <- power_limit_w,
        sm_clock <- sm_clock_mhz, util <- util_pct, sbe_volatile <- ecc_sbe_volatile,
        dbe_volatile <- ecc_dbe_volatile, retired_sbe <- retired_sbe, retired_dbe <- retired_dbe,
        retired_pending <- retired_pending, remap_pending <- remap_pending,
        remap_failure <- remap_failure, pcie_replay <- pcie_replay, nvlink_crc <- nvlink_crc,
        nvlink_replay <- nvlink_replay, nvlink_recovery <- nvlink_recovery, throttle <- throttle,
        recovery_action <- recovery_action);
    let _ = (
        s.mem_temp_c,
        s.mem_clock_mhz,
        s.remap_correctable,
        s.remap_uncorrectable,
    );
}

/// One verdict line, fields in the documented order.
pub fn verdict_line(c: &Change) -> String {
    let state = match c.to {
        HealthState::Healthy => "healthy",
        HealthState::Degraded => "degraded",
        HealthState::Quarantined => "quarantined",
    };
    let reason = serde_json::to_string(&c.reason).expect("a reason serialises");
    let evidence = serde_json::to_string(&c.evidence).expect("a string serialises");
    format!(
        "{{\"t_ms\":{},\"gpu\":{},\"state\":\"{state}\",\"reason\":{reason},\"evidence\":{evidence}}}",
        c.time.0, c.gpu
    )
}

/// Replays `input`, writing verdicts to `out` and notes (cooling
/// attributions) to `notes`, with `policy` set for the trace's sampling
/// period ([`Policy::with_period`]). Returns the number of records read.
pub fn replay(
    input: impl BufRead,
    policy: Policy,
    out: &mut impl Write,
    notes: &mut impl Write,
) -> Result<usize, ReplayError> {
    replay_scheduled(input, policy, 0, out, notes)
}

/// As [`replay`], with the slow counters read only every `slow_ms` as
/// the live agent reads them ([`SlowCounters`]; 0: at every sample, as the
/// trace gives them). The PCIe replay counter is fresh at every sample,
/// as the agent reads it on a GPU with a per-sample field value.
pub fn replay_scheduled(
    input: impl BufRead,
    policy: Policy,
    slow_ms: u64,
    out: &mut impl Write,
    notes: &mut impl Write,
) -> Result<usize, ReplayError> {
    replay_as_agent(input, policy, slow_ms, false, out, notes)
}

/// As [`replay_scheduled`], with the PCIe replay counter read with the
/// slow counters too when `pcie_with_slow` ([`SlowCounters::pcie_with_slow`]):
/// the schedule the agent runs on a GPU that answers none of the
/// per-sample field values (no HBM temperature, no NVLink; `node-agent
/// probe` says which).
pub fn replay_as_agent(
    input: impl BufRead,
    policy: Policy,
    slow_ms: u64,
    pcie_with_slow: bool,
    out: &mut impl Write,
    notes: &mut impl Write,
) -> Result<usize, ReplayError> {
    let mut input = input;
    let header = read_header(&mut input)?;
    let limits = Limits {
        max_operating_c: header.limits.max_operating_c,
    };
    let policy = policy.with_period(header.period_ms.unwrap_or(DEFAULT_PERIOD_MS));
    let mut engine = HealthEngine::new(header.gpus, limits, policy, TimestampMs(0));
    let mut state = vec![Observation::default(); header.gpus];
    let mut slow = SlowCounters::new(header.gpus, slow_ms);
    if pcie_with_slow {
        slow = slow.pcie_with_slow();
    }
    let mut last_t = 0;
    let mut count = 0;
    // One buffer for every line: a day of a host is close to a million.
    let mut line = String::new();
    let mut n = 1;
    loop {
        line.clear();
        n += 1;
        if input.read_line(&mut line).map_err(|e| read_error(n, e))? == 0 {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let r = parse_record(&line, n, last_t)?;
        last_t = r.t_ms;
        let outputs = step(&mut engine, &mut state, &mut slow, &r, n)?;
        count += 1;
        write_outputs(outputs, out, notes)?;
    }
    Ok(count)
}

/// A line that cannot be read.
fn read_error(line: usize, e: std::io::Error) -> ReplayError {
    ReplayError {
        line,
        message: format!("cannot read: {e}"),
    }
}

/// An output that cannot be written (line 0: no line of the trace).
fn write_error(e: std::io::Error) -> ReplayError {
    ReplayError {
        line: 0,
        message: format!("cannot write: {e}"),
    }
}

/// Reads and checks the header (line 1): a `gpu-trace/1` trace of 1 to 16
/// GPUs.
fn read_header(input: &mut impl BufRead) -> Result<Header, ReplayError> {
    let mut first = String::new();
    if input.read_line(&mut first).map_err(|e| read_error(1, e))? == 0 {
        return Err(ReplayError {
            line: 1,
            message: "empty trace: expected a gpu-trace/1 header".into(),
        });
    }
    let header: Header = serde_json::from_str(&first).map_err(|e| ReplayError {
        line: 1,
        message: format!("bad header: {e}"),
    })?;
    if header.format != "gpu-trace/1" {
        return Err(ReplayError {
            line: 1,
            message: format!("format {:?}, expected \"gpu-trace/1\"", header.format),
        });
    }
    if header.gpus == 0 || header.gpus > loopwarden_protocol::MAX_GPUS {
        return Err(ReplayError {
            line: 1,
            message: format!("gpus = {}: 1 to 16", header.gpus),
        });
    }
    if let Some(p @ (0 | 3_600_001..)) = header.period_ms {
        return Err(ReplayError {
            line: 1,
            message: format!("period_ms = {p}: 1 to 3,600,000 (one sample an hour)"),
        });
    }
    let _ = &header.host;
    Ok(header)
}

/// Parses record line `n`, which must not go back in time before `last_t`.
fn parse_record(line: &str, n: usize, last_t: u64) -> Result<Record, ReplayError> {
    let r: Record = serde_json::from_str(line).map_err(|e| ReplayError {
        line: n,
        message: format!("bad record: {e}"),
    })?;
    if r.t_ms < last_t {
        return Err(ReplayError {
            line: n,
            message: format!("t_ms {} goes back before {last_t}", r.t_ms),
        });
    }
    Ok(r)
}

/// The GPU a sample or XID record (line `n`) names, one of the host's
/// `gpus`.
fn record_gpu(r: &Record, n: usize, gpus: usize) -> Result<u8, ReplayError> {
    match r.gpu {
        Some(g) if g < gpus => Ok(g as u8),
        Some(g) => Err(ReplayError {
            line: n,
            message: format!("gpu {g}: the host has {gpus} GPUs"),
        }),
        None => Err(ReplayError {
            line: n,
            message: "a sample or XID without gpu".into(),
        }),
    }
}

/// Gives record `r` (line `n`) to the engine: a sample (merged into the
/// GPU's last known fields, or a missed sample when unresponsive), an XID
/// or a coolant report.
fn step(
    engine: &mut HealthEngine,
    state: &mut [Observation],
    slow: &mut SlowCounters,
    r: &Record,
    n: usize,
) -> Result<Vec<Output>, ReplayError> {
    let now = TimestampMs(r.t_ms);
    Ok(match (&r.sample, r.xid, &r.coolant) {
        (Some(s), None, None) => {
            let g = record_gpu(r, n, state.len())?;
            if s.responsive == Some(false) {
                engine.missed(now, g)
            } else {
                merge(&mut state[g as usize], s);
                let seen = slow.read(r.t_ms, g as usize, &state[g as usize]);
                engine.sample(now, g, &seen)
            }
        }
        (None, Some(x), None) => {
            let g = record_gpu(r, n, state.len())?;
            slow.xid(g as usize);
            engine.xid(now, g, x)
        }
        (None, None, Some(c)) => engine.coolant(now, coolant(c, n)?),
        _ => {
            return Err(ReplayError {
                line: n,
                message: "a record holds exactly one of sample, xid, coolant".into(),
            })
        }
    })
}

/// A coolant report (line `n`) as the engine takes it.
fn coolant(c: &TraceCoolant, n: usize) -> Result<Coolant, ReplayError> {
    let state = match c.state.as_str() {
        "normal" => LoopState::Normal,
        "degraded" => LoopState::Degraded,
        "failsafe" => LoopState::Failsafe,
        other => {
            return Err(ReplayError {
                line: n,
                message: format!("coolant state {other:?}: normal, degraded or failsafe"),
            })
        }
    };
    Ok(Coolant {
        supply_c: c.supply_c,
        flow_lpm_per_gpu: c.flow_lpm_per_gpu,
        state,
    })
}

/// Writes state changes to `out` as verdict lines, cooling attributions to
/// `notes`.
fn write_outputs(
    outputs: Vec<Output>,
    out: &mut impl Write,
    notes: &mut impl Write,
) -> Result<(), ReplayError> {
    for o in outputs {
        match o {
            Output::Change(c) => writeln!(out, "{}", verdict_line(&c)).map_err(write_error)?,
            Output::CoolingAttributed { time, gpus, .. } => writeln!(
                notes,
                "t={} ms: the cooling explains the heat of GPUs {gpus:#06x}; no GPU is marked for it",
                time.0
            )
            .map_err(write_error)?,
            Output::HostStall { time, since, gpus } => writeln!(
                notes,
                "t={} ms: every GPU ({gpus:#06x}) silent together since t={} ms: a host stall; no GPU is marked for it",
                time.0, since.0
            )
            .map_err(write_error)?,
            Output::HostStallEnded { time, since } => writeln!(
                notes,
                "t={} ms: the GPUs answer again after the stall since t={} ms",
                time.0, since.0
            )
            .map_err(write_error)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str =
        r#"{"format":"gpu-trace/1","gpus":2,"period_ms":1000,"limits":{"max_operating_c":87}}"#;

    /// The replay's refusal of `text`, as it prints it.
    fn refusal(text: &str) -> String {
        let (mut out, mut notes) = (Vec::new(), Vec::new());
        let policy = Policy::default();
        replay(text.as_bytes(), policy, &mut out, &mut notes)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn counters_at_the_top_of_their_range_are_judged_not_overflowed() {
        let max = u64::MAX;
        let text = [
            HEAD.to_string(),
            format!(r#"{{"t_ms":1000,"gpu":0,"sample":{{"pcie_replay":0,"retired_sbe":{max},"retired_dbe":{max}}}}}"#),
            format!(r#"{{"t_ms":2000,"gpu":0,"sample":{{"pcie_replay":{max}}}}}"#),
        ]
        .join("\n");
        let (mut out, mut notes) = (Vec::new(), Vec::new());
        replay(text.as_bytes(), Policy::default(), &mut out, &mut notes).expect("replays");
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains("retired-pages-limit"), "{out}");
    }

    /// The verdict lines of 12 PCIe replays a minute on GPU 0, read every
    /// second, replayed with the slow counters every 30 s, the PCIe
    /// replay counter with them or not.
    fn pcie_verdicts(pcie_with_slow: bool) -> String {
        let mut lines = vec![HEAD.to_string()];
        for s in 0..400u64 {
            let n = s / 5;
            lines.push(format!(
                r#"{{"t_ms":{},"gpu":0,"sample":{{"pcie_replay":{n}}}}}"#,
                s * 1000 + 700
            ));
        }
        let (mut out, mut notes) = (Vec::new(), Vec::new());
        let text = lines.join("\n");
        replay_as_agent(
            text.as_bytes(),
            Policy::default(),
            30_000,
            pcie_with_slow,
            &mut out,
            &mut notes,
        )
        .expect("replays");
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_replay_plays_the_pcie_counter_read_with_the_slow_counters_when_asked() {
        let fresh = pcie_verdicts(false);
        let with_slow = pcie_verdicts(true);
        assert!(fresh.contains("pcie-replay-rate"), "{fresh}");
        assert!(with_slow.contains("pcie-replay-rate"), "{with_slow}");
        let at = |out: &str| {
            let v: serde_json::Value = serde_json::from_str(out.lines().next()?).ok()?;
            v["t_ms"].as_u64()
        };
        let (fresh_at, slow_at) = (at(&fresh), at(&with_slow));
        assert!(
            fresh_at.is_some() && slow_at > fresh_at,
            "read every sample at {fresh_at:?}, with the slow counters at {slow_at:?}"
        );
    }

    #[test]
    fn a_bad_trace_is_refused_with_its_line_and_what_is_wrong() {
        let head = |from: &str, to: &str| HEAD.replace(from, to);
        let cases = [
            ("not json".to_string(), "line 1: bad header"),
            (
                head("gpu-trace/1", "gpu-trace/2"),
                "line 1: format \"gpu-trace/2\"",
            ),
            (
                head(r#""gpus":2"#, r#""gpus":0"#),
                "line 1: gpus = 0: 1 to 16",
            ),
            (
                head(r#""gpus":2"#, r#""gpus":17"#),
                "line 1: gpus = 17: 1 to 16",
            ),
            (head("1000", "0"), "line 1: period_ms = 0: 1 to 3,600,000"),
            (
                format!("{HEAD}\n{}", r#"{"t_ms":5,"gpu":2,"xid":79}"#),
                "line 2: gpu 2: the host has 2 GPUs",
            ),
            (
                format!(
                    "{HEAD}\n{}\n{}",
                    r#"{"t_ms":5,"gpu":0,"xid":13}"#, r#"{"t_ms":4,"gpu":0,"xid":13}"#
                ),
                "line 3: t_ms 4 goes back before 5",
            ),
            (
                format!("{HEAD}\n{}", r#"{"t_ms":5,"coolant":{"state":"boiling"}}"#),
                "line 2: coolant state \"boiling\"",
            ),
        ];
        for (text, want) in cases {
            let got = refusal(&text);
            assert!(
                got.starts_with(want),
                "{text}\n  refused as: {got}\n  expected: {want}"
            );
        }
    }
}
