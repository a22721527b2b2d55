//! `node-agent probe`: what each GPU supports of the NVML calls the agent
//! makes, and what each call costs, so a field engineer can tell a GPU
//! that cannot report a field from one that fails, and size
//! `deadline_ms` from the slowest call.
//!
//! Read only: it never sets a limit and registers for no event. Each call
//! is made `tries` times in a row on one GPU; each field value of the
//! batched query is also asked alone, so a field the GPU does not
//! support is named. A last row is the field-value query the agent makes
//! every sample on that GPU, and says how the PCIe replay counter is read
//! there: in that query, or with the slow counters where the GPU answers
//! none of its other fields (no query is made every sample then, and
//! none is added for the counter alone: `nvml::sample`).
//!
//! Glossary:
//! - *probe*: one call made `tries` times, with its answer and its
//!   latency's median and maximum.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::sample::{pcie_rides, FAST_FIELDS};
use super::{field, NvmlApi, NvmlFailure, NvmlResult};
use node_core::health::NVLINK_LINKS;

/// What became of one call on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Probe {
    /// The GPU's NVML index.
    pub gpu: u32,
    /// The NVML call (and, for a field value, the field).
    pub call: String,
    /// `supported`, `not supported`, or the failure in NVML's words (of
    /// the first try that failed).
    pub answer: String,
    /// Tries made.
    pub tries: usize,
    /// Median latency, µs.
    pub median_us: u64,
    /// Slowest try, µs.
    pub max_us: u64,
}

/// A call to probe: its name and how to make it.
type Call<'a, A> = (String, Box<dyn Fn(&A, u32) -> NvmlResult<()> + 'a>);

/// Every call the agent makes on a GPU, the limit's set excepted.
fn calls<'a, A: NvmlApi>() -> Vec<Call<'a, A>> {
    fn ok<T>(r: NvmlResult<T>) -> NvmlResult<()> {
        r.map(|_| ())
    }
    let mut v: Vec<Call<'a, A>> = vec![
        (
            "nvmlDeviceGetName".into(),
            Box::new(|a: &A, i| ok(a.name(i))),
        ),
        (
            "nvmlDeviceGetUUID".into(),
            Box::new(|a: &A, i| ok(a.uuid(i))),
        ),
        (
            "nvmlDeviceGetPowerManagementDefaultLimit".into(),
            Box::new(|a: &A, i| ok(a.default_limit_mw(i))),
        ),
        (
            "nvmlDeviceGetPowerManagementLimitConstraints".into(),
            Box::new(|a: &A, i| ok(a.limit_constraints_mw(i))),
        ),
        (
            "nvmlDeviceGetPowerManagementLimit".into(),
            Box::new(|a: &A, i| ok(a.limit_mw(i))),
        ),
        (
            "nvmlDeviceGetEnforcedPowerLimit".into(),
            Box::new(|a: &A, i| ok(a.enforced_limit_mw(i))),
        ),
        (
            "nvmlDeviceGetTemperature".into(),
            Box::new(|a: &A, i| ok(a.temperature(i))),
        ),
        (
            "nvmlDeviceGetPowerUsage".into(),
            Box::new(|a: &A, i| ok(a.power_usage_mw(i))),
        ),
        (
            "nvmlDeviceGetTotalEnergyConsumption".into(),
            Box::new(|a: &A, i| ok(a.energy_mj(i))),
        ),
        (
            "nvmlDeviceGetClockInfo".into(),
            Box::new(|a: &A, i| ok(a.clocks_mhz(i))),
        ),
        (
            "nvmlDeviceGetUtilizationRates".into(),
            Box::new(|a: &A, i| ok(a.utilization(i))),
        ),
        (
            "nvmlDeviceGetCurrentClocksThrottleReasons".into(),
            Box::new(|a: &A, i| ok(a.throttle_bits(i))),
        ),
        (
            "nvmlDeviceGetEccMode".into(),
            Box::new(|a: &A, i| ok(a.ecc_enabled(i))),
        ),
    ];
    for (corrected, volatile) in [(true, true), (false, true), (true, false), (false, false)] {
        let name = format!(
            "nvmlDeviceGetTotalEccErrors ({}, {})",
            if corrected {
                "corrected"
            } else {
                "uncorrected"
            },
            if volatile { "volatile" } else { "aggregate" }
        );
        v.push((
            name,
            Box::new(move |a: &A, i| ok(a.ecc_total(i, corrected, volatile))),
        ));
    }
    let ids = field_ids();
    for &id in &ids {
        let name = format!("nvmlDeviceGetFieldValues {}", field::name(id));
        v.push((name, Box::new(move |a: &A, i| one_field(a, i, id))));
    }
    let name = format!("nvmlDeviceGetFieldValues, all {} fields at once", ids.len());
    v.push((name, Box::new(move |a: &A, i| ok(a.fields(i, &ids)))));
    v
}

/// Every field id the agent asks for.
fn field_ids() -> Vec<u32> {
    let mut ids: Vec<u32> = field::GROUPS.iter().map(|(id, _)| *id).collect();
    ids.push(field::NVLINK_RECOVERY_TOTAL);
    ids.push(field::RECOVERY_ACTION);
    for l in 0..NVLINK_LINKS {
        ids.push(field::nvlink_link(l, false));
        ids.push(field::nvlink_link(l, true));
    }
    ids
}

/// One field value asked alone: the field's own answer.
fn one_field<A: NvmlApi>(a: &A, gpu: u32, id: u32) -> NvmlResult<()> {
    match a.fields(gpu, &[id])?.into_iter().next() {
        Some(answer) => answer.map(|_| ()),
        None => Err(NvmlFailure::Other("no answer for the field".into())),
    }
}

/// Probes every call on GPU `gpu` of `api`, each `tries` times (at least
/// once).
pub fn probe<A: NvmlApi>(api: &A, gpu: u32, tries: usize) -> Vec<Probe> {
    let tries = tries.max(1);
    let mut probes: Vec<Probe> = calls::<A>()
        .into_iter()
        .map(|(call, make)| made(api, gpu, tries, call, make))
        .collect();
    probes.push(per_sample(api, gpu, tries, &probes));
    probes
}

/// `make` made `tries` times on GPU `gpu`, as `call`.
fn made<A: NvmlApi>(
    api: &A,
    gpu: u32,
    tries: usize,
    call: String,
    make: impl Fn(&A, u32) -> NvmlResult<()>,
) -> Probe {
    let mut times = Vec::with_capacity(tries);
    let mut answer = None;
    for _ in 0..tries {
        let began = Instant::now();
        let r = make(api, gpu);
        times.push(began.elapsed());
        if let (None, Err(e)) = (&answer, r) {
            answer = Some(words(&e));
        }
    }
    let (median_us, max_us) = spread(&mut times);
    Probe {
        gpu,
        call,
        answer: answer.unwrap_or_else(|| "supported".into()),
        tries,
        median_us,
        max_us,
    }
}

/// The field-value query the agent makes every sample on GPU `gpu`, as
/// the fields' own answers in `probes` make it: the per-sample fields the
/// GPU does not refuse, with the PCIe replay counter where it does not
/// refuse that either, and the row's name says how the counter is read,
/// decided as the agent decides it ([`pcie_rides`]; a field the agent
/// has lost, answered then refused, it leaves out until asked again,
/// which a probe cannot see).
/// A GPU that refuses every other per-sample field makes no such query
/// (no tries): the agent reads the counter with the slow counters.
fn per_sample<A: NvmlApi>(api: &A, gpu: u32, tries: usize, probes: &[Probe]) -> Probe {
    let asked = |id: u32| {
        let call = format!("nvmlDeviceGetFieldValues {}", field::name(id));
        probes.iter().any(|p| {
            p.call == call && !matches!(p.answer.as_str(), "not supported" | "invalid argument")
        })
    };
    // The query as a whole: refused, no field is asked in it.
    let call = !probes.iter().any(|p| {
        p.call.starts_with("nvmlDeviceGetFieldValues, all") && p.answer == "not supported"
    });
    let mut ids: Vec<u32> = FAST_FIELDS
        .into_iter()
        .filter(|&id| call && asked(id))
        .collect();
    let rides = pcie_rides(call, asked);
    let pcie = match (asked(field::PCIE_REPLAY_COUNTER), rides) {
        (false, _) => "PCIe replays not supported",
        (true, false) => "PCIe replays read with the slow counters",
        (true, true) => "PCIe replays read every sample",
    };
    if rides && asked(field::PCIE_REPLAY_COUNTER) {
        ids.push(field::PCIE_REPLAY_COUNTER);
    }
    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
    let call = format!(
        "nvmlDeviceGetFieldValues every sample ({}): {pcie}",
        if list.is_empty() {
            "none".into()
        } else {
            list.join(", ")
        }
    );
    if ids.is_empty() {
        return Probe {
            gpu,
            call,
            answer: "not made".into(),
            tries: 0,
            median_us: 0,
            max_us: 0,
        };
    }
    made(api, gpu, tries, call, move |a: &A, i| {
        a.fields(i, &ids).map(|_| ())
    })
}

/// An NVML failure as the table says it.
fn words(e: &NvmlFailure) -> String {
    match e {
        NvmlFailure::NotSupported => "not supported".into(),
        NvmlFailure::NoPermission => "no permission".into(),
        NvmlFailure::GpuLost => "GPU lost".into(),
        NvmlFailure::Timeout => "timeout".into(),
        NvmlFailure::InvalidArgument => "invalid argument".into(),
        NvmlFailure::Other(s) => s.clone(),
    }
}

/// Median and maximum of `times`, µs.
fn spread(times: &mut [Duration]) -> (u64, u64) {
    times.sort();
    let us = |d: Duration| d.as_micros().min(u128::from(u64::MAX)) as u64;
    let median = times.get(times.len() / 2).copied().map_or(0, us);
    let max = times.last().copied().map_or(0, us);
    (median, max)
}

/// The probes as a table for a person: one line per call.
pub fn table(probes: &[Probe]) -> String {
    let width = probes
        .iter()
        .map(|p| p.call.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = format!(
        "{:<3} {:<width$}  {:<15} {:>6} {:>11} {:>11}\n",
        "GPU", "CALL", "ANSWER", "TRIES", "MEDIAN µs", "MAX µs"
    );
    for p in probes {
        out.push_str(&format!(
            "{:<3} {:<width$}  {:<15} {:>6} {:>11} {:>11}\n",
            p.gpu, p.call, p.answer, p.tries, p.median_us, p.max_us
        ));
    }
    out
}
