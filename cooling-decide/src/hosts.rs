//! The hosts' reports as the decision path believes them. Every GPU of a
//! report heard is checked against what a working GPU can report
//! ([`Bounds`]) before the core sees it: a GPU that fails is left out of
//! its host's report, and the rest still counts (one broken sensor does
//! not cost its host its capacity cap). The supply's bound stands down
//! where the hall outvotes the reading: two or more hosts, more than
//! those that say otherwise, whose every GPU reads colder than it
//! ([`supply_outvoted`]). A report that fails as a whole
//! (its stamp far from now) keeps the host's last believed report in
//! place (it ages as the core judges ages). Either says why, once per
//! change of the reason (as it reads: [`same_words`]). The shell hears
//! host telemetry from the bus, the twin its hosts' readings: both
//! through [`Hosts::hear`].
//!
//! Glossary:
//! - *heard*: one host's report as it arrived ([`Heard`]): the core's
//!   summary of its plausible GPUs, its stamp, the extremes plausibility
//!   is judged on, and the first GPU left out.
//! - *believed*: a heard report that passed [`implausible`]; the core
//!   sees only these.

use core::fmt;

use cooling_core::{HostReport, MAX_HOSTS};
use heapless::Vec;
use loopwarden_protocol::message::{GpuFlags, GpuTelemetry, HostTelemetry, ThrottleReasons};
use loopwarden_protocol::units::TimestampMs;
use serde::{Deserialize, Serialize};

use crate::said::same_words;

/// How far a host report's stamp may be from now, ms.
pub const REPORT_SKEW_MS: u64 = 60_000;
/// A GPU may draw this much above its TDP (transients) and be believed.
const TDP_MARGIN: f32 = 1.10;
/// A GPU may read this much below the supply (sensor offsets, and a GPU
/// lagging a supply that warms at the setpoint's slew), K.
const BELOW_SUPPLY_K: f32 = 5.0;

/// One GPU's figure and which GPU gave it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OfGpu {
    /// The GPU's index on its host.
    pub gpu: u8,
    /// The figure (°C or W).
    pub value: f32,
}

/// Why one GPU's figures cannot be a working GPU's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum GpuFault {
    /// It draws more than 10 % above its TDP.
    AboveTdp {
        /// The GPU.
        gpu: u8,
        /// What it draws, W.
        w: f32,
        /// Its TDP, W.
        tdp_w: f32,
    },
    /// It reads colder than 5 K under the supply that cools it.
    ColderThanSupply {
        /// The GPU.
        gpu: u8,
        /// Its temperature, °C.
        temp_c: f32,
        /// The supply believed, °C.
        supply_c: f32,
    },
}

impl fmt::Display for GpuFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuFault::AboveTdp { gpu, w, tdp_w } => {
                write!(f, "GPU {gpu} draws {w} W, above its {tdp_w} W TDP")
            }
            GpuFault::ColderThanSupply {
                gpu,
                temp_c,
                supply_c,
            } => write!(
                f,
                "GPU {gpu} at {temp_c} °C, colder than the {supply_c:.1} °C supply"
            ),
        }
    }
}

/// Why a report, or some of its GPUs, is not believed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Why {
    /// Its stamp is `s` seconds from now.
    Stamped {
        /// Seconds, whole.
        s: u64,
    },
    /// A GPU no working GPU could be.
    Gpu(GpuFault),
    /// `n` GPUs left out, the first for `first`.
    LeftOut {
        /// How many.
        n: u8,
        /// Why the first was.
        first: GpuFault,
    },
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Stamped { s } => write!(f, "stamped {s} s from now"),
            Why::Gpu(g) => g.fmt(f),
            Why::LeftOut { n: 1, first } => write!(f, "1 GPU left out: {first}"),
            Why::LeftOut { n, first } => write!(f, "{n} GPUs left out, the first: {first}"),
        }
    }
}

/// What a working GPU can report, for the figures of one report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// The GPUs' TDP, W: a GPU may draw up to 10 % above it.
    pub tdp_w: f32,
    /// The supply the controller believes, °C: a GPU may read up to 5 K
    /// below it (`None`: not known, no bound).
    pub supply_c: Option<f32>,
    /// The hall's hosts outvote that supply reading ([`supply_outvoted`]):
    /// it bounds no GPU, and is only what the report's vote is cast on.
    pub supply_outvoted: bool,
}

impl Bounds {
    /// No bound: every answering GPU is summed (the twin's own hosts).
    pub const ANY: Bounds = Bounds {
        tdp_w: f32::INFINITY,
        supply_c: None,
        supply_outvoted: false,
    };

    /// Why GPU `gpu`, at `temp_c` drawing `w`, cannot be working, if so.
    fn why_not(&self, gpu: u8, temp_c: f32, w: f32) -> Option<GpuFault> {
        let tdp_w = self.tdp_w;
        if w > tdp_w * TDP_MARGIN {
            return Some(GpuFault::AboveTdp { gpu, w, tdp_w });
        }
        match self.supply_c.filter(|_| !self.supply_outvoted) {
            Some(supply_c) if temp_c < supply_c - BELOW_SUPPLY_K => {
                Some(GpuFault::ColderThanSupply {
                    gpu,
                    temp_c,
                    supply_c,
                })
            }
            _ => None,
        }
    }
}

/// [`HostReport`] in a trace, field by field.
#[derive(Serialize, Deserialize)]
#[serde(remote = "HostReport")]
struct HostReportDef {
    gpus: u8,
    hottest_c: f32,
    gpu_power_w: f32,
    limit_w: f32,
    slowdown: bool,
    at_ms: u64,
}

/// One host's report as heard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heard {
    /// The core's summary of it (`at_ms`: when it was heard, ms on the
    /// decision path's clock).
    #[serde(with = "HostReportDef")]
    pub report: HostReport,
    /// The sender's stamp.
    pub stamped: TimestampMs,
    /// Its coldest answering GPU (`None`: none answered).
    pub coldest: Option<OfGpu>,
    /// Its answering GPU that draws most (`None`: none answered).
    pub most_drawn: Option<OfGpu>,
    /// GPUs left out as implausible, and why the first was.
    pub left_out: Option<(u8, GpuFault)>,
    /// Every answering GPU within the TDP, two or more, reads more than
    /// 5 K under the supply believed: this host's vote that the supply
    /// reading is the outlier ([`supply_outvoted`]).
    #[serde(default)]
    pub colder_than_supply: bool,
}

/// Whether the hall outvotes the supply reading: two or more hosts heard
/// lately say every GPU of theirs reads more than 5 K under it (`colder`,
/// [`Heard::colder_than_supply`]), more than those whose reports say
/// otherwise (`others`). No working GPU can, so either every one of them
/// reads wrong or the one sensor does (a high reading not yet confirmed
/// as a fault): the supply is then not used to judge GPUs, so they still
/// count, and the sensor's supervision still has the GPUs to judge it
/// by. One host, a broken or compromised agent's, cannot outvote it.
pub fn supply_outvoted(colder: usize, others: usize) -> bool {
    colder >= 2 && colder > others
}

/// Whether the answering GPUs of `t` within the TDP, two or more, all
/// read more than 5 K under `supply_c`.
fn all_colder(t: &HostTelemetry, b: &Bounds) -> bool {
    let Some(supply_c) = b.supply_c else {
        return false;
    };
    let mut within = answering(t).filter(|g| (g.power.get() as f32) <= b.tdp_w * TDP_MARGIN);
    let mut n = 0u8;
    let all = within.all(|g| {
        n = n.saturating_add(1);
        f32::from(g.temp.get()) < supply_c - BELOW_SUPPLY_K
    });
    all && n >= 2
}

/// The GPUs of `t` that answered their queries.
fn answering(t: &HostTelemetry) -> impl Iterator<Item = &GpuTelemetry> {
    t.gpus
        .iter()
        .filter(|g| g.flags.contains(GpuFlags::RESPONSIVE))
}

/// Host telemetry `t`, stamped `stamped`, heard at `at_ms`. GPUs that did
/// not answer their queries are left out, and so are GPUs outside
/// `bounds` (counted in `left_out`); a GPU in hardware slowdown (thermal
/// or not) sets `slowdown`.
pub fn heard_of(t: &HostTelemetry, stamped: TimestampMs, at_ms: u64, bounds: &Bounds) -> Heard {
    let mut h = Heard {
        report: HostReport {
            gpus: 0,
            hottest_c: 0.0,
            gpu_power_w: 0.0,
            limit_w: 0.0,
            slowdown: false,
            at_ms,
        },
        stamped,
        coldest: None,
        most_drawn: None,
        left_out: None,
        colder_than_supply: all_colder(t, bounds),
    };
    let slow = ThrottleReasons::HW_SLOWDOWN | ThrottleReasons::HW_THERMAL_SLOWDOWN;
    for g in answering(t) {
        let (gpu, temp, w) = (g.gpu.get(), f32::from(g.temp.get()), g.power.get() as f32);
        if let Some(why) = bounds.why_not(gpu, temp, w) {
            h.left_out = match h.left_out.take() {
                None => Some((1, why)),
                Some((n, first)) => Some((n.saturating_add(1), first)),
            };
            continue;
        }
        let r = &mut h.report;
        r.hottest_c = if r.gpus == 0 {
            temp
        } else {
            r.hottest_c.max(temp)
        };
        r.gpus = r.gpus.saturating_add(1);
        r.gpu_power_w += w;
        r.limit_w = r.limit_w.max(g.power_limit.get() as f32);
        r.slowdown |= g.throttle.bits() & slow.bits() != 0;
        if h.coldest.is_none_or(|c| temp < c.value) {
            h.coldest = Some(OfGpu { gpu, value: temp });
        }
        if h.most_drawn.is_none_or(|m| w > m.value) {
            h.most_drawn = Some(OfGpu { gpu, value: w });
        }
    }
    h
}

/// Why a host report heard at `now` cannot be believed, if it cannot: its
/// stamp is more than a minute from now, a GPU draws more than 10 % above
/// the TDP (`tdp_w`), or a GPU reads colder than the coolant that cools
/// it (5 K under the believed `supply_c`; `None` where the hall outvotes
/// the reading, [`supply_outvoted`]). None of these a working GPU can
/// report; a broken or compromised agent can.
pub fn implausible(h: &Heard, now: TimestampMs, supply_c: Option<f32>, tdp_w: f32) -> Option<Why> {
    let skew = h.stamped.0.abs_diff(now.0);
    if skew > REPORT_SKEW_MS {
        return Some(Why::Stamped { s: skew / 1000 });
    }
    if let Some(m) = h.most_drawn.filter(|m| m.value > tdp_w * TDP_MARGIN) {
        return Some(Why::Gpu(GpuFault::AboveTdp {
            gpu: m.gpu,
            w: m.value,
            tdp_w,
        }));
    }
    let cold = h.coldest.zip(supply_c);
    if let Some((c, s)) = cold.filter(|(c, s)| c.value < s - BELOW_SUPPLY_K) {
        return Some(Why::Gpu(GpuFault::ColderThanSupply {
            gpu: c.gpu,
            temp_c: c.value,
            supply_c: s,
        }));
    }
    None
}

/// What became of a heard report.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Believed: the core sees it.
    Believed,
    /// Believed without some of its GPUs, left out for `why`; `new` as
    /// for [`Verdict::Refused`].
    BelievedWithout {
        /// Which GPUs were left out and why.
        why: Why,
        /// A change of reason.
        new: bool,
    },
    /// Not believed, for `why`; `new`: a reason not said for this host
    /// since its last believed report (the caller logs it).
    Refused {
        /// Why.
        why: Why,
        /// A change of reason.
        new: bool,
    },
    /// The host index is past the layout's hosts.
    Unknown,
}

/// The believed reports by host index, and why each host's last report was
/// not, while it was not.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    reports: Vec<Option<HostReport>, MAX_HOSTS>,
    refused: Vec<Option<Why>, MAX_HOSTS>,
}

impl Hosts {
    /// No report yet from any of `hosts` hosts (at most [`MAX_HOSTS`]).
    pub fn new(hosts: usize) -> Self {
        let mut h = Self::NONE;
        h.reset(hosts);
        h
    }

    /// No host at all (what [`Hosts::reset`] makes room in).
    pub const NONE: Hosts = Hosts {
        reports: Vec::new(),
        refused: Vec::new(),
    };

    /// As [`Hosts::new`], in place.
    pub fn reset(&mut self, hosts: usize) {
        let n = hosts.min(MAX_HOSTS);
        self.reports.clear();
        self.refused.clear();
        // Within capacity by the bound above.
        let _ = self.reports.resize(n, None);
        let _ = self.refused.resize(n, None);
    }

    /// Host `h`'s report `heard` at `now` (its stamp's clock), judged with
    /// the believed `supply_c` and the GPUs' `tdp_w`.
    pub fn hear(
        &mut self,
        h: usize,
        heard: &Heard,
        now: TimestampMs,
        supply_c: Option<f32>,
        tdp_w: f32,
    ) -> Verdict {
        let (Some(slot), Some(refused)) = (self.reports.get_mut(h), self.refused.get_mut(h)) else {
            return Verdict::Unknown;
        };
        let mut say = |why: Why| {
            let new = refused.is_none_or(|was| !same_words(&was, &why));
            *refused = Some(why);
            new
        };
        match implausible(heard, now, supply_c, tdp_w) {
            Some(why) => Verdict::Refused { why, new: say(why) },
            None => {
                *slot = Some(heard.report);
                let Some((n, first)) = heard.left_out else {
                    *refused = None;
                    return Verdict::Believed;
                };
                let why = Why::LeftOut { n, first };
                Verdict::BelievedWithout { why, new: say(why) }
            }
        }
    }

    /// The believed reports, by host index.
    pub fn reports(&self) -> &[Option<HostReport>] {
        &self.reports
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::samples;
    use loopwarden_protocol::units::{Watts, WholeCelsius};
    use std::string::{String, ToString};

    const NOW: TimestampMs = TimestampMs(1_800_000_000_000);

    fn judged(t: &HostTelemetry, stamped: TimestampMs, supply_c: Option<f32>) -> Option<String> {
        implausible(&heard_of(t, stamped, 0, &Bounds::ANY), NOW, supply_c, 700.0)
            .map(|w| w.to_string())
    }

    #[test]
    fn reports_no_working_gpu_could_make_are_not_believed() {
        let t = samples::host_telemetry(8);
        let temp = f32::from(t.gpus[0].temp.get());
        assert_eq!(judged(&t, NOW, Some(30.0)), None);
        let e = judged(&t, TimestampMs(NOW.0 - 61_000), Some(30.0));
        assert_eq!(e.as_deref(), Some("stamped 61 s from now"));
        assert!(judged(&t, TimestampMs(NOW.0 + 61_000), None).is_some());
        let mut hot = t.clone();
        hot.gpus[3].power = Watts(2_000);
        let e = judged(&hot, NOW, None).unwrap();
        assert!(e.starts_with("GPU 3 draws 2000 W"), "{e}");
        // Colder than the water that cools it.
        let e = judged(&t, NOW, Some(temp + 8.0)).unwrap();
        assert!(e.contains("colder than"), "{e}");
        let mut cold = t.clone();
        cold.gpus[0].temp = WholeCelsius(20);
        assert!(judged(&cold, NOW, Some(24.0)).is_none(), "within 5 K");
    }

    #[test]
    fn a_gpu_that_does_not_answer_is_neither_summed_nor_judged() {
        let mut t = samples::host_telemetry(4);
        t.gpus[2].power = Watts(5_000);
        t.gpus[2].flags = t.gpus[2].flags.with(GpuFlags::RESPONSIVE, false);
        let h = heard_of(&t, NOW, 7, &Bounds::ANY);
        assert_eq!(h.report.gpus, 3);
        assert_eq!(h.report.at_ms, 7);
        assert_ne!(h.most_drawn.map(|m| m.gpu), Some(2));
        assert_eq!(implausible(&h, NOW, None, 700.0), None);
    }

    #[test]
    fn a_refused_report_keeps_the_last_believed_one_and_says_why_once() {
        let mut hosts = Hosts::new(2);
        let t = samples::host_telemetry(8);
        let good = heard_of(&t, NOW, 1_000, &Bounds::ANY);
        assert_eq!(hosts.hear(0, &good, NOW, None, 700.0), Verdict::Believed);
        let mut lying = t.clone();
        lying.gpus[1].power = Watts(9_000);
        let bad = heard_of(&lying, NOW, 2_000, &Bounds::ANY);
        let first = hosts.hear(0, &bad, NOW, None, 700.0);
        assert!(
            matches!(first, Verdict::Refused { new: true, .. }),
            "{first:?}"
        );
        let again = hosts.hear(0, &bad, NOW, None, 700.0);
        assert!(
            matches!(again, Verdict::Refused { new: false, .. }),
            "{again:?}"
        );
        assert_eq!(hosts.reports()[0].map(|r| r.at_ms), Some(1_000));
        assert_eq!(hosts.hear(0, &good, NOW, None, 700.0), Verdict::Believed);
        let after = hosts.hear(0, &bad, NOW, None, 700.0);
        assert!(
            matches!(after, Verdict::Refused { new: true, .. }),
            "said anew"
        );
        assert_eq!(hosts.hear(5, &good, NOW, None, 700.0), Verdict::Unknown);
    }

    #[test]
    fn an_implausible_gpu_is_left_out_and_the_rest_counts() {
        let mut hosts = Hosts::new(1);
        let t = samples::host_telemetry(8);
        let bounds = Bounds {
            tdp_w: 700.0,
            supply_c: Some(30.0),
            supply_outvoted: false,
        };
        let whole = heard_of(&t, NOW, 1_000, &bounds);
        assert_eq!(whole.left_out, None);
        let mut broken = t.clone();
        broken.gpus[3].power = Watts(9_000);
        broken.gpus[5].temp = WholeCelsius(3);
        let h = heard_of(&broken, NOW, 2_000, &bounds);
        assert_eq!(h.report.gpus, 6, "two left out, six count");
        let w = |g: &loopwarden_protocol::message::GpuTelemetry| g.power.get() as f32;
        let sum: f32 = (t.gpus.iter().enumerate())
            .filter(|(i, _)| *i != 3 && *i != 5)
            .map(|(_, g)| w(g))
            .sum();
        assert!((h.report.gpu_power_w - sum).abs() < 0.5);
        let v = hosts.hear(0, &h, NOW, Some(30.0), 700.0);
        let Verdict::BelievedWithout { why, new: true } = v else {
            panic!("{v:?}");
        };
        assert_eq!(
            why.to_string(),
            "2 GPUs left out, the first: GPU 3 draws 9000 W, above its 700 W TDP"
        );
        assert_eq!(hosts.reports()[0].map(|r| r.at_ms), Some(2_000), "believed");
        assert!(matches!(
            hosts.hear(0, &h, NOW, Some(30.0), 700.0),
            Verdict::BelievedWithout { new: false, .. }
        ));
        assert_eq!(
            hosts.hear(0, &whole, NOW, Some(30.0), 700.0),
            Verdict::Believed
        );
    }

    #[test]
    fn a_reason_is_new_when_its_words_change_not_its_figures() {
        let mut hosts = Hosts::new(1);
        let t = samples::host_telemetry(8);
        let cold = f32::from(t.gpus.iter().map(|g| g.temp.get()).min().unwrap());
        let h = heard_of(&t, NOW, 1_000, &Bounds::ANY);
        // The supply the GPU is judged against drifts within its tenth of
        // a degree: the same words, said once.
        let supply = cold + 5.51;
        let first = hosts.hear(0, &h, NOW, Some(supply), 700.0);
        assert!(
            matches!(first, Verdict::Refused { new: true, .. }),
            "{first:?}"
        );
        let drifted = hosts.hear(0, &h, NOW, Some(supply + 0.02), 700.0);
        assert!(
            matches!(drifted, Verdict::Refused { new: false, .. }),
            "{drifted:?}"
        );
        let moved = hosts.hear(0, &h, NOW, Some(supply + 0.5), 700.0);
        assert!(
            matches!(moved, Verdict::Refused { new: true, .. }),
            "{moved:?}"
        );
    }
}
