//! Missed samples: a GPU that stops answering, or a host whose driver
//! stalls.
//!
//! When the driver or the host stalls, every GPU misses its samples in
//! the same rounds. That is not N GPU faults, and quarantining all eight
//! GPUs of a host for it would take a healthy host out of service. So a
//! GPU's miss counts against it only when a *witness* answered after the
//! GPU fell silent: then the driver works and this GPU does not. While
//! every GPU is silent together for `unresponsive_after` rounds, the host
//! is *stalled*. That is reported once as the host's monitoring state
//! ([`Output::HostStall`]) and ended when any GPU answers again
//! ([`Output::HostStallEnded`]). A GPU that stays silent after its peers
//! came back is quarantined after `unresponsive_after` misses of its own.
//!
//! A GPU the driver reports *lost* (fallen off the bus) is no stall's
//! silence: the driver answered, with its verdict on that GPU, which is
//! quarantined at once ([`HealthEngine::lost`]), however many of its
//! peers are lost with it (a baseboard or PCIe switch that fails takes
//! them all).
//!
//! A miss knows none of the rates' counters: each rate is judged as on a
//! failed read of its counter (`rules`), so a stall never counts towards
//! a rate's sustain as if the GPU had been read.
//!
//! The first miss of a lone silent GPU counts against it only if a
//! witness has already answered since, so at a 1 s period a GPU that
//! falls silent alone is quarantined about one period later than a plain
//! count of misses would quarantine it.
//!
//! Glossary:
//! - *witness*: another GPU of the host that is not quarantined; a host
//!   with none (one GPU, or all the others out) counts every miss.
//! - *own miss*: a miss while a witness answers, having answered since
//!   the GPU's previous miss (or, for the first, since the streak began);
//!   during a stall no miss is anyone's own, and when one begins the
//!   misses that led into it stop counting as anyone's own.
//! - *stall*: every non-quarantined GPU silent, one of them for at least
//!   `unresponsive_after` misses.

use loopwarden_protocol::{HealthState, ReasonCode, TimestampMs};

use super::{fmt_time, HealthEngine, Output};

impl HealthEngine {
    /// The driver answered `gpu`'s sample at `now` (engine time) that it
    /// lost the GPU: quarantined at once, reason `gpu-lost`, however many
    /// of its peers are lost with it (the caller counts the miss too).
    pub fn lost(&mut self, now: TimestampMs, gpu: u8) -> Vec<Output> {
        let mut out = Vec::new();
        let g = gpu as usize;
        if g >= self.gpus.len() {
            return out;
        }
        let t = now.0;
        let when = self.stamp(t);
        self.raise(
            t,
            g,
            HealthState::Quarantined,
            ReasonCode::GPU_LOST,
            || {
                format!(
                    "the driver reports it lost (fallen off the bus) at {}",
                    fmt_time(when)
                )
            },
            &mut out,
        );
        out
    }

    /// `gpu` did not answer its sample in time (a timeout or an error).
    pub fn missed(&mut self, now: TimestampMs, gpu: u8) -> Vec<Output> {
        let mut out = Vec::new();
        let g = gpu as usize;
        if g >= self.gpus.len() {
            return out;
        }
        let t = now.0;
        self.judge_rounds(t, false, &mut out);
        // The rates' counters are not known: their streaks do not grow
        // over the miss as if read.
        self.rates_not_known(t, g);
        let (first, previous) = {
            let tr = &mut self.gpus[g];
            tr.missed += 1;
            // A sample not seen breaks a sustained condition (`peers`).
            tr.hot = Default::default();
            tr.straggle = Default::default();
            let previous = tr.last_miss.replace(t);
            (*tr.first_miss.get_or_insert(t), previous)
        };
        // Own when a witness answered since this GPU's previous miss (or
        // since its streak began): then the driver answers, and it does not.
        if self.witnessed_since(g, previous.unwrap_or(first)) {
            self.gpus[g].own_missed += 1;
        }
        let (own, missed) = (self.gpus[g].own_missed, self.gpus[g].missed);
        let began = self.stamp(first);
        if own >= self.policy.unresponsive_after {
            self.raise(
                t,
                g,
                HealthState::Quarantined,
                ReasonCode::UNRESPONSIVE,
                || {
                    format!(
                        "missed {missed} samples in a row since {}, {own} while the other GPUs answered",
                        fmt_time(began)
                    )
                },
                &mut out,
            );
        }
        self.begin_stall(now, &mut out);
        // A miss may be the last of a round the peers wait for.
        self.judge_rounds(t, true, &mut out);
        out
    }

    /// Whether a witness of `g` answers now, having answered at or after
    /// `since`, or `g` has no witness. A witness silent now proves
    /// nothing: in the live agent every reading of a round has the
    /// round's time, so a witness's answer of the round a stall began in
    /// has the same time as the misses that follow it.
    fn witnessed_since(&self, g: usize, since: u64) -> bool {
        let mut witnesses = self
            .gpus
            .iter()
            .enumerate()
            .filter(|(i, tr)| *i != g && tr.status.state != HealthState::Quarantined)
            .peekable();
        if witnesses.peek().is_none() {
            return true;
        }
        witnesses.any(|(_, tr)| tr.missed == 0 && tr.last.is_some_and(|(at, _)| at >= since))
    }

    /// A stall begins when every non-quarantined GPU is silent and one of
    /// them has missed `unresponsive_after` samples.
    fn begin_stall(&mut self, now: TimestampMs, out: &mut Vec<Output>) {
        if self.stall.is_some() {
            return;
        }
        let live: Vec<_> = self
            .gpus
            .iter()
            .filter(|tr| tr.status.state != HealthState::Quarantined)
            .collect();
        let all_silent = live.len() >= 2 && live.iter().all(|tr| tr.missed > 0);
        let long = live
            .iter()
            .any(|tr| tr.missed >= self.policy.unresponsive_after);
        if all_silent && long {
            let since = live
                .iter()
                .filter_map(|tr| tr.first_miss)
                .min()
                .unwrap_or(now.0);
            let gpus = self
                .gpus
                .iter()
                .enumerate()
                .filter(|(_, tr)| tr.missed > 0)
                .fold(0u16, |m, (i, _)| m | 1 << i);
            self.forgive_into_stall();
            self.stall = Some(since);
            out.push(Output::HostStall {
                time: self.stamp(now.0),
                since: self.stamp(since),
                gpus,
            });
        }
    }

    /// The misses that led into a stall were the host's, not any GPU's
    /// own: each silent GPU's own misses are forgiven, but for a GPU
    /// silent alone before it (another live GPU answered in a round after
    /// its first miss), whose own misses stand.
    fn forgive_into_stall(&mut self) {
        let round_ms = self.policy.round_ms;
        let answered_after = |me: usize, t: u64| {
            self.gpus.iter().enumerate().any(|(i, tr)| {
                i != me
                    && tr.status.state != HealthState::Quarantined
                    && tr
                        .last
                        .is_some_and(|(at, _)| at > t.saturating_add(round_ms))
            })
        };
        let alone: Vec<bool> = (self.gpus.iter().enumerate())
            .map(|(i, tr)| tr.first_miss.is_some_and(|t| answered_after(i, t)))
            .collect();
        for (tr, alone) in self.gpus.iter_mut().zip(alone) {
            if tr.missed > 0 && !alone {
                tr.own_missed = 0;
            }
        }
    }

    /// A GPU answered: a stall, if any, is over.
    pub(super) fn end_stall(&mut self, now: TimestampMs, out: &mut Vec<Output>) {
        if let Some(since) = self.stall.take() {
            out.push(Output::HostStallEnded {
                time: self.stamp(now.0),
                since: self.stamp(since),
            });
        }
    }

    /// Since when the host has been stalled, if it is.
    pub fn stalled_since(&self) -> Option<TimestampMs> {
        self.stall.map(|t| self.stamp(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::Observation;

    use crate::health::tests::engine;

    fn ok() -> Observation {
        Observation {
            temp: 60.0,
            power: 500.0,
            power_limit: 700.0,
            sm_clock: 1980.0,
            util: 95.0,
            ..Default::default()
        }
    }

    /// One round at second `s`: the GPUs in `silent` miss, the others
    /// answer, in index order as the shell feeds them.
    fn round(e: &mut HealthEngine, s: u64, silent: &[u8]) -> Vec<Output> {
        let mut out = Vec::new();
        for g in 0..e.len() as u8 {
            let now = TimestampMs(s * 1000 + 5 + u64::from(g));
            if silent.contains(&g) {
                out.extend(e.missed(now, g));
            } else {
                out.extend(e.sample(now, g, &ok()));
            }
        }
        out
    }

    /// One round at second `s` as the live agent feeds it: every reading
    /// of the round at the same time, in index order.
    fn round_at(e: &mut HealthEngine, s: u64, silent: &[u8]) -> Vec<Output> {
        let now = TimestampMs(s * 1000);
        let mut out = Vec::new();
        for g in 0..e.len() as u8 {
            if silent.contains(&g) {
                out.extend(e.missed(now, g));
            } else {
                out.extend(e.sample(now, g, &ok()));
            }
        }
        out
    }

    fn engine_after(gpus: usize, unresponsive_after: u32) -> HealthEngine {
        let policy = crate::health::Policy {
            unresponsive_after,
            ..Default::default()
        };
        let limits = crate::health::Limits {
            max_operating_c: 87.0,
        };
        HealthEngine::new(gpus, limits, policy, TimestampMs(0))
    }

    /// A driver reload that begins mid-round (GPUs 2 and 3 miss while 0
    /// and 1 answered at the same time), stalls the host, then GPU 2 is
    /// the last to come back: its misses in the stall are no one's, so
    /// it is quarantined only after three misses while the others
    /// answer, and never during the stall.
    #[test]
    fn a_stall_begun_mid_round_at_one_time_blames_no_gpu() {
        let mut e = engine_after(4, 3);
        let mut outs = round_at(&mut e, 1, &[]);
        outs.extend(round_at(&mut e, 2, &[2, 3]));
        for s in 3..7 {
            outs.extend(round_at(&mut e, s, &[0, 1, 2, 3]));
        }
        assert!(e.stalled_since().is_some(), "{outs:?}");
        outs.extend(round_at(&mut e, 7, &[2]));
        outs.extend(round_at(&mut e, 8, &[2]));
        assert!(quarantined(&e).is_empty(), "{outs:?}");
        round_at(&mut e, 9, &[2]);
        assert_eq!(quarantined(&e), vec![2]);
        let st = e.status(2).unwrap();
        assert!(st.evidence.contains("3 while"), "{}", st.evidence);

        // At two misses, no GPU is quarantined during the stall itself.
        let mut e = engine_after(4, 2);
        let mut outs = round_at(&mut e, 1, &[]);
        outs.extend(round_at(&mut e, 2, &[2, 3]));
        for s in 3..7 {
            outs.extend(round_at(&mut e, s, &[0, 1, 2, 3]));
        }
        assert!(quarantined(&e).is_empty(), "{outs:?}");
        round_at(&mut e, 7, &[]);
        assert!(quarantined(&e).is_empty());
    }

    /// A GPU silent alone, every reading of a round at one time, is still
    /// quarantined after its misses while the others answer.
    #[test]
    fn a_lone_silent_gpu_at_one_time_per_round_is_quarantined() {
        let mut e = engine_after(4, 3);
        round_at(&mut e, 1, &[]);
        for s in 2..5 {
            round_at(&mut e, s, &[1]);
        }
        assert_eq!(quarantined(&e), vec![1]);
        assert_eq!(e.stalled_since(), None);
    }

    /// A GPU silent alone keeps its own misses when a stall begins: the
    /// others missing every second round (a GPU hung in the driver slows
    /// their calls too) never make it a host's silence.
    #[test]
    fn a_gpu_silent_alone_before_a_stall_keeps_its_own_misses() {
        let mut e = engine_after(4, 3);
        let mut outs = round_at(&mut e, 1, &[]);
        for s in 2..20 {
            let silent: &[u8] = if s % 2 == 0 { &[0, 1, 2, 3] } else { &[3] };
            outs.extend(round_at(&mut e, s, silent));
        }
        assert_eq!(quarantined(&e), vec![3], "{outs:?}");
    }

    fn quarantined(e: &HealthEngine) -> Vec<u8> {
        (0..e.len() as u8)
            .filter(|g| e.status(*g).unwrap().state == HealthState::Quarantined)
            .collect()
    }

    #[test]
    fn a_stall_of_every_gpu_quarantines_none_and_is_the_hosts() {
        let mut e = engine(8);
        let all: Vec<u8> = (0..8).collect();
        let mut outs = round(&mut e, 1, &[]);
        for s in 2..10 {
            outs.extend(round(&mut e, s, &all));
        }
        assert!(quarantined(&e).is_empty(), "{outs:?}");
        let stalls: Vec<_> = outs
            .iter()
            .filter(|o| matches!(o, Output::HostStall { .. }))
            .collect();
        assert_eq!(stalls.len(), 1, "said once: {outs:?}");
        assert!(matches!(
            stalls[0],
            Output::HostStall {
                since: TimestampMs(2005),
                gpus: 0xff,
                ..
            }
        ));
        assert_eq!(e.stalled_since(), Some(TimestampMs(2005)));
        let back = round(&mut e, 10, &[]);
        assert!(back.contains(&Output::HostStallEnded {
            time: TimestampMs(10_005),
            since: TimestampMs(2005)
        }));
        assert_eq!(e.stalled_since(), None);
    }

    /// Every GPU lost together (a baseboard or PCIe switch failed): each
    /// is the driver's verdict on its GPU, quarantined at its first lost
    /// sample with reason `gpu-lost`, not a stall that blames none.
    #[test]
    fn gpus_the_driver_reports_lost_are_quarantined_however_many() {
        let mut e = engine(8);
        round(&mut e, 1, &[]);
        let mut outs = Vec::new();
        for g in 0..8 {
            let now = TimestampMs(2_005 + g);
            outs.extend(e.lost(now, g as u8));
            outs.extend(e.missed(now, g as u8));
        }
        assert_eq!(quarantined(&e), (0..8).collect::<Vec<u8>>(), "{outs:?}");
        let s = e.status(3).unwrap();
        assert_eq!(s.reason, ReasonCode::GPU_LOST);
        assert!(
            s.evidence.starts_with("the driver reports it lost"),
            "{}",
            s.evidence
        );
        // A lost GPU among answering peers: the same, at once.
        let mut e = engine(4);
        round(&mut e, 1, &[]);
        e.lost(TimestampMs(2_005), 2);
        assert_eq!(quarantined(&e), [2]);
    }

    #[test]
    fn a_gpu_that_stays_silent_after_the_stall_is_quarantined() {
        let mut e = engine(4);
        round(&mut e, 1, &[]);
        for s in 2..8 {
            round(&mut e, s, &[0, 1, 2, 3]);
        }
        // The others come back; GPU 2 never does.
        round(&mut e, 8, &[2]);
        round(&mut e, 9, &[2]);
        assert!(quarantined(&e).is_empty(), "two misses of its own so far");
        let outs = round(&mut e, 10, &[2]);
        assert_eq!(quarantined(&e), vec![2], "{outs:?}");
        let st = e.status(2).unwrap();
        assert!(
            st.evidence.contains("missed 9 samples in a row") && st.evidence.contains("3 while"),
            "{}",
            st.evidence
        );
        assert!(!st.evidence.ends_with("..."), "fits whole: {}", st.evidence);
    }

    #[test]
    fn a_lone_silent_gpu_is_quarantined_one_round_after_three_misses() {
        let mut e = engine(8);
        round(&mut e, 1, &[]);
        for s in 2..5 {
            round(&mut e, s, &[5]);
        }
        assert!(
            quarantined(&e).is_empty(),
            "its first miss is not yet its own"
        );
        round(&mut e, 5, &[5]);
        assert_eq!(quarantined(&e), vec![5]);
        assert_eq!(e.stalled_since(), None, "never a stall");
    }

    #[test]
    fn staggered_recovery_after_a_stall_is_no_fault() {
        let mut e = engine(4);
        round(&mut e, 1, &[]);
        for s in 2..8 {
            round(&mut e, s, &[0, 1, 2, 3]);
        }
        round(&mut e, 8, &[1, 3]);
        round(&mut e, 9, &[3]);
        round(&mut e, 10, &[]);
        assert!(quarantined(&e).is_empty());
    }

    #[test]
    fn a_gpu_silent_a_round_before_a_stall_is_not_quarantined_during_it() {
        let mut e = engine(4);
        round(&mut e, 1, &[]);
        round(&mut e, 2, &[1]);
        for s in 3..10 {
            round(&mut e, s, &[0, 1, 2, 3]);
        }
        assert!(quarantined(&e).is_empty());
        round(&mut e, 10, &[]);
        assert!(quarantined(&e).is_empty(), "it came back with the others");
    }

    #[test]
    fn a_single_gpu_host_counts_every_miss() {
        let mut e = engine(1);
        round(&mut e, 1, &[]);
        for s in 2..5 {
            round(&mut e, s, &[0]);
        }
        assert_eq!(quarantined(&e), vec![0]);
        assert_eq!(e.stalled_since(), None);
    }
}
