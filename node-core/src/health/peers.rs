//! The rules that judge a GPU against its peers: the thermal rule (hotter
//! than its peers predict at its power and coolant) and the straggler rule
//! (clocks behind loaded peers with nothing to explain it).
//!
//! Both hold their judgement while the cooling explains the heat (the
//! loop reports trouble, or most of the host's GPUs run hot together); the
//! GPUs that ran hot then are named once per episode in an attribution.
//!
//! A GPU is judged against its peers' samples of its own round, never
//! against older ones: at a 30 s period a GPU sampled first would
//! otherwise meet its peers as they were 30 s before, hotter or cooler
//! than now. So a sample waits until every other GPU has answered or
//! missed its round, or until the round is over (`round_ms` has passed),
//! and is judged then.
//!
//! Glossary:
//! - *excess*: how many kelvin hotter a GPU runs than the median of its
//!   peers' predictions.
//! - *attribution*: the note that the cooling explains the heat of some
//!   GPUs ([`Output::CoolingAttributed`]).
//! - *round*: the samples of every GPU of the host for one period, at
//!   most `round_ms` apart (`Policy::round_ms`).
//! - *waiting*: a sample whose round is not in yet, not judged yet.
//! - *not judged*: a sample the rule cannot read against its peers (too
//!   few of them predict its temperature, or are loaded), or a miss: it
//!   ends a streak, as a sample that clears the condition does, so two
//!   brief readings with samples not judged between them never make a
//!   sustained verdict; but a hot streak goes on through a sample not
//!   judged while the GPU runs hot itself (thermal slowdown, or at its
//!   maximum operating temperature).

use loopwarden_protocol::{HealthState, ReasonCode, ThrottleReasons, Unsupported, MAX_GPUS};

use super::rules::Streak;
use super::{At, HealthEngine, Limits, LoopState, Observation, Output, Policy, Track};

/// How long an attribution waits for the rest of a round of samples, ms.
const ATTRIBUTION_SETTLE_MS: u64 = 2_000;

/// Up to 16 values on the stack (one per GPU of a host).
#[derive(Clone, Copy)]
struct Few {
    v: [f64; MAX_GPUS],
    n: usize,
}

impl Few {
    fn new() -> Self {
        Self {
            v: [0.0; MAX_GPUS],
            n: 0,
        }
    }
    fn push(&mut self, x: f64) {
        if self.n < self.v.len() {
            self.v[self.n] = x;
            self.n += 1;
        }
    }
    fn median(&mut self) -> Option<f64> {
        median(&mut self.v[..self.n])
    }
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The peers of one GPU, by index, without copying their samples.
struct Peers<'a> {
    gpus: &'a [Track],
    idx: [usize; MAX_GPUS],
    n: usize,
}

impl<'a> Peers<'a> {
    /// The GPUs other than `g` that answered in the round of `t`: their
    /// last sample at most `round_ms` from `t`.
    fn of(gpus: &'a [Track], g: usize, t: u64, round_ms: u64) -> Self {
        let fresh = |tr: &Track| {
            tr.last
                .filter(|(lt, _)| t.abs_diff(*lt) <= round_ms && tr.missed == 0)
        };
        let mut idx = [0usize; MAX_GPUS];
        let mut n = 0;
        for (i, tr) in gpus.iter().enumerate() {
            if i != g && fresh(tr).is_some() && n < idx.len() {
                idx[n] = i;
                n += 1;
            }
        }
        Self { gpus, idx, n }
    }

    /// The peers' last samples, in GPU order.
    fn samples(&self) -> impl Iterator<Item = &'a Observation> + '_ {
        let gpus = self.gpus;
        self.idx[..self.n]
            .iter()
            .map(move |&i| &gpus[i].last.as_ref().expect("fresh peers have a sample").1)
    }
}

/// Whether a sample runs hot: at its max operating temperature or slowed
/// for heat.
fn runs_hot(ob: &Observation, limits: &Limits) -> bool {
    ob.temp >= limits.max_operating_c
        || ob.throttle.contains(ThrottleReasons::HW_THERMAL_SLOWDOWN)
        || ob.throttle.contains(ThrottleReasons::SW_THERMAL_SLOWDOWN)
}

/// Thermal: how much hotter `o` runs than its peers predict at its power,
/// K; `None` when it idles or too few peers predict it.
fn thermal_excess(peers: &Peers, o: &Observation, supply: Option<f64>, p: &Policy) -> Option<f64> {
    if o.power >= p.hot_min_power_w {
        let mut predicted = Few::new();
        for q in peers.samples() {
            match supply {
                // Peers' thermal resistance, applied to this GPU's power.
                Some(s) if q.power >= p.hot_min_power_w => {
                    predicted.push(s + (q.temp - s) / q.power * o.power)
                }
                // Without the coolant: peers at a similar power.
                None if (q.power - o.power).abs() <= 0.2 * o.power => predicted.push(q.temp),
                _ => {}
            }
        }
        if predicted.n >= p.min_peers {
            predicted.median().map(|m| o.temp - m)
        } else {
            None
        }
    } else {
        None
    }
}

/// The straggler rule's reading of one sample.
struct Straggling {
    /// Loaded, clocks behind the loaded peers, nothing to explain it.
    slow: bool,
    /// Clearly not straggling, or not judged for want of loaded peers
    /// (ends a streak).
    not_slow: bool,
    /// The loaded peers' median SM clock, MHz, when enough peers are
    /// loaded.
    peer_clock: Option<f64>,
}

/// Whether the straggler rule can read `o`: its clocks, load and
/// clock-event reasons are known.
fn clocks_known(o: &Observation) -> bool {
    !(o.unknown.contains(Unsupported::CLOCKS)
        || o.unknown.contains(Unsupported::UTIL)
        || o.unknown.contains(Unsupported::THROTTLE))
}

/// Straggler: clocks behind loaded peers, nothing to explain it. A GPU
/// whose clocks, load or clock-event reasons are not known is not judged
/// (a streak ends), nor counted among the peers.
fn straggling(peers: &Peers, o: &Observation, p: &Policy, limits: &Limits) -> Straggling {
    let explained = o.throttle.contains(ThrottleReasons::SW_POWER_CAP)
        || o.throttle.contains(ThrottleReasons::HW_THERMAL_SLOWDOWN)
        || o.throttle.contains(ThrottleReasons::SW_THERMAL_SLOWDOWN)
        || o.throttle.contains(ThrottleReasons::HW_POWER_BRAKE)
        || o.throttle.contains(ThrottleReasons::IDLE)
        || o.temp >= limits.max_operating_c
        || (o.power_limit > 0.0 && o.power >= 0.95 * o.power_limit);
    let mut peer_clocks = Few::new();
    for q in peers.samples() {
        if q.util >= p.straggler_min_util && clocks_known(q) {
            peer_clocks.push(q.sm_clock);
        }
    }
    let loaded = o.util >= p.straggler_min_util && clocks_known(o);
    let peer_clock = if peer_clocks.n >= p.min_peers {
        peer_clocks.median()
    } else {
        None
    };
    let slow = loaded
        && !explained
        && peer_clock.is_some_and(|m| o.sm_clock < p.straggler_clock_ratio * m);
    // An explained slow sample ends the streak too: only unexplained
    // slowness, sustained, makes a straggler. So does a sample not judged
    // (too few loaded peers): sustained means seen on every sample.
    let not_slow = !loaded || explained || peer_clock.is_none_or(|m| o.sm_clock >= 0.9 * m);
    Straggling {
        slow,
        not_slow,
        peer_clock,
    }
}

/// What the peer rules read of one sample against its peers and the
/// cooling.
struct PeerView {
    /// This GPU runs hot ([`runs_hot`]).
    hot_now: bool,
    /// GPUs of the host (this one and its peers) that run hot.
    hot_count: usize,
    /// The loop reports trouble (`degraded`, `failsafe`).
    loop_trouble: bool,
    /// The loop reports trouble or most of the host runs hot.
    cooling_explains: bool,
    /// See [`thermal_excess`].
    excess: Option<f64>,
    /// The excess is at or above the rule's threshold.
    is_hot: bool,
    /// The excess is clearly gone, the GPU idles, or too few peers
    /// predict it (ends a streak: sustained means seen on every sample).
    is_cool: bool,
    /// See [`straggling`].
    straggling: Straggling,
}

impl HealthEngine {
    /// Judges, at `now`, every sample waiting for its round whose round is
    /// over, or (`or_in`: after a sample or a miss was taken) in.
    pub(super) fn judge_rounds(&mut self, now: u64, or_in: bool, out: &mut Vec<Output>) {
        let mut left = self.waiting;
        while left != 0 {
            let g = left.trailing_zeros() as usize;
            left &= left - 1;
            let Some(t) = self.gpus[g].last.as_ref().map(|(t, _)| *t) else {
                // Released since: nothing to judge.
                self.waiting &= !(1 << g);
                continue;
            };
            let over = now > t.saturating_add(self.policy.round_ms);
            if over || (or_in && self.round_in(g, t)) {
                self.waiting &= !(1 << g);
                let o = self.gpus[g].last.expect("a waiting GPU has a sample").1;
                self.peer_rules(now, t, g, &o, out);
            }
        }
    }

    /// Whether every GPU other than `g` has answered or missed the round
    /// of `t`. From the last GPU down: a round is taken in GPU order, so
    /// the first one missing is found at once.
    fn round_in(&self, g: usize, t: u64) -> bool {
        let since = t.saturating_sub(self.policy.round_ms);
        self.gpus.iter().enumerate().rev().all(|(i, tr)| {
            i == g
                || tr.last.is_some_and(|(lt, _)| lt >= since)
                || tr.last_miss.is_some_and(|lm| lm >= since)
        })
    }

    /// The thermal and straggler rules at `now`, against the peers, for
    /// `g`'s sample `o` of time `t`.
    fn peer_rules(&mut self, now: u64, t: u64, g: usize, o: &Observation, out: &mut Vec<Output>) {
        let v = self.peer_view(t, g, o);
        let held = self.attribute_to_cooling(now, g, &v);
        self.say_attribution(now, out);
        if !held {
            self.judge_against_peers(now, t, g, o, &v, out);
        }
    }

    /// Reads `g`'s sample `o` of time `t` against its peers of that round
    /// and the loop's state.
    fn peer_view(&self, t: u64, g: usize, o: &Observation) -> PeerView {
        let p = self.policy;
        let limits = self.limits;
        let peers = Peers::of(&self.gpus, g, t, p.round_ms);

        // Is the host hot as a whole, or does the loop report trouble?
        let hot_now = runs_hot(o, &limits);
        let hot_count =
            peers.samples().filter(|q| runs_hot(q, &limits)).count() + usize::from(hot_now);
        let all = peers.n + 1;
        let host_hot = all >= 2 && hot_count * 2 > all;
        let coolant = self.fresh_coolant(t);
        let loop_trouble = coolant.is_some_and(|c| c.state != LoopState::Normal);

        let supply = coolant.and_then(|c| c.supply_c);
        let excess = thermal_excess(&peers, o, supply, &p);
        PeerView {
            hot_now,
            hot_count,
            loop_trouble,
            cooling_explains: loop_trouble || host_hot,
            excess,
            is_hot: excess.is_some_and(|e| e >= p.hot_excess_k),
            // Not judged (no peer near its power) ends a streak, but not
            // while the GPU itself runs hot: a bad cold plate that drops
            // its power in thermal slowdown stays on its streak.
            is_cool: excess.map_or(!hot_now, |e| e < p.hot_clear_k),
            straggling: straggling(&peers, o, &p, &limits),
        }
    }

    /// While the cooling explains the heat, no GPU is judged on it: `g`'s
    /// hot streak ends, and `g` joins the episode's attribution if it runs
    /// hot. Returns whether the cooling explains all of `g`'s sample (its
    /// clock loss too: then nothing is judged). Once the loop is normal
    /// and no GPU runs hot, the episode ends.
    fn attribute_to_cooling(&mut self, t: u64, g: usize, v: &PeerView) -> bool {
        if v.cooling_explains {
            let tr = &mut self.gpus[g];
            tr.hot = Streak::default();
            if v.hot_now || v.is_hot {
                let bit = 1u16 << g;
                if self.attributed & bit == 0 {
                    self.attributed |= bit;
                    self.unsaid.get_or_insert(t + ATTRIBUTION_SETTLE_MS);
                }
            }
            // Clock loss under thermal trouble is explained too.
            if !v.straggling.slow || v.hot_now {
                self.gpus[g].straggle = Streak::default();
                return true;
            }
        } else if !v.loop_trouble && v.hot_count == 0 {
            self.attributed = 0;
            self.unsaid = None;
        }
        false
    }

    /// Says which GPUs the cooling explains, once the round has settled.
    fn say_attribution(&mut self, t: u64, out: &mut Vec<Output>) {
        if self.unsaid.is_some_and(|due| t >= due) {
            self.unsaid = None;
            out.push(Output::CoolingAttributed {
                time: self.stamp(t),
                gpus: self.attributed,
                reason: ReasonCode::COOLING_FAULT,
            });
        }
    }

    /// The sustained verdicts, at `now`, on `g`'s sample `o` of time `t`:
    /// `hot-for-power` (not while the cooling explains the heat) and
    /// `straggler`.
    fn judge_against_peers(
        &mut self,
        now: u64,
        t: u64,
        g: usize,
        o: &Observation,
        v: &PeerView,
        out: &mut Vec<Output>,
    ) {
        let p = self.policy;
        let when = At(self.stamp(now));
        let tr = &mut self.gpus[g];
        if let Some(e) = v.excess {
            tr.hot_excess = e;
        }
        let hot_for = if v.cooling_explains {
            None
        } else {
            tr.hot.update(t, v.is_hot, v.is_cool)
        };
        let s = &v.straggling;
        let straggle_for = tr.straggle.update(t, s.slow, s.not_slow);
        if hot_for.is_some_and(|d| d >= p.hot_sustain_ms) {
            let e = tr.hot_excess;
            let temp = o.temp;
            let power = o.power;
            self.raise(now, g, HealthState::Degraded, ReasonCode::HOT_FOR_POWER,
                || format!("{temp:.0} C at {power:.0} W, {e:.0} K above its peers, at {when}: check the cold plate"), out);
        }
        if straggle_for.is_some_and(|d| d >= p.straggler_sustain_ms) {
            let clock = o.sm_clock;
            let m = s.peer_clock.unwrap_or(0.0);
            self.raise(now, g, HealthState::Degraded, ReasonCode::STRAGGLER,
                || format!("SM {clock:.0} MHz vs peers {m:.0} MHz at the same load, no power or thermal cause, at {when}"), out);
        }
    }
}

#[cfg(test)]
mod tests {
    use loopwarden_protocol::{HealthState, ReasonCode, TimestampMs};

    use crate::health::tests::engine;
    use crate::health::{Observation, Output, Policy};

    const PERIOD_MS: u64 = 30_000;

    /// A loaded GPU at `temp`, no coolant known.
    fn at(temp: f64) -> Observation {
        Observation {
            temp,
            power: 600.0,
            power_limit: 700.0,
            sm_clock: 1980.0,
            util: 95.0,
            ..Default::default()
        }
    }

    /// Four GPUs sampled every 30 s, GPU 0 first in each round (its
    /// peers 3 ms after it), at `temp(round, gpu)`; the changes.
    fn rounds(temp: impl Fn(u64, usize) -> f64) -> Vec<(u64, u8, HealthState, ReasonCode)> {
        let mut e = engine(4);
        e.policy = Policy::for_period(PERIOD_MS);
        let mut changes = Vec::new();
        for r in 1..=6u64 {
            for g in 0..4 {
                let t = r * PERIOD_MS + g as u64;
                for o in e.sample(TimestampMs(t), g as u8, &at(temp(r, g))) {
                    if let Output::Change(c) = o {
                        changes.push((c.time.0, c.gpu, c.to, c.reason));
                    }
                }
            }
        }
        changes
    }

    /// Four GPUs at a 1 s period for `secs`, each sample from
    /// `sample(second, gpu)` (`None`: a miss); the changes.
    fn seconds(
        secs: u64,
        sample: impl Fn(u64, usize) -> Option<Observation>,
    ) -> Vec<(u64, u8, HealthState, ReasonCode)> {
        let mut e = engine(4);
        let mut changes = Vec::new();
        for s in 1..=secs {
            for g in 0..4 {
                let now = TimestampMs(s * 1000 + g as u64);
                let outs = match sample(s, g) {
                    Some(o) => e.sample(now, g as u8, &o),
                    None => e.missed(now, g as u8),
                };
                for o in outs {
                    if let Output::Change(c) = o {
                        changes.push((c.time.0, c.gpu, c.to, c.reason));
                    }
                }
            }
        }
        changes
    }

    /// Two brief readings 100 s apart, the samples between them never
    /// judged (no peer near GPU 0's power, or a host stall), are no
    /// sustained streak; GPU 0 hot on every sample is one.
    #[test]
    fn samples_not_judged_end_a_streak() {
        let hot = Observation {
            power: 600.0,
            temp: 80.0,
            ..at(80.0)
        };
        let peer = |power: f64| Observation {
            power,
            temp: 60.0,
            ..at(60.0)
        };
        let brief = |s: u64, g: usize| {
            Some(match (g, s == 1 || s == 101) {
                (0, _) => hot,
                (_, true) => peer(600.0),
                (_, false) => peer(300.0),
            })
        };
        assert_eq!(seconds(101, brief), vec![]);
        // The host stalls between the two: no sample is seen.
        let stalled = |s: u64, g: usize| match (g, s == 1 || s == 101) {
            (_, false) => None,
            (0, true) => Some(hot),
            _ => Some(peer(600.0)),
        };
        assert_eq!(seconds(101, stalled), vec![]);
        let sustained = |_, g: usize| Some(if g == 0 { hot } else { peer(600.0) });
        assert_eq!(
            seconds(101, sustained),
            vec![(61_003, 0, HealthState::Degraded, ReasonCode::HOT_FOR_POWER)]
        );
    }

    /// A GPU that runs hot itself keeps its hot streak through a sample
    /// not judged: its thermal slowdown drops its power away from every
    /// peer's.
    #[test]
    fn a_gpu_in_thermal_slowdown_keeps_its_hot_streak_when_not_judged() {
        // No coolant state: GPU 0 runs 25 K hot at 600 W, and every tenth
        // second drops to 350 W in hardware thermal slowdown, where no
        // peer is near its power.
        let hot = |s: u64| Observation {
            power: if s % 10 == 0 { 350.0 } else { 600.0 },
            throttle: if s % 10 == 0 {
                loopwarden_protocol::ThrottleReasons::HW_THERMAL_SLOWDOWN
            } else {
                loopwarden_protocol::ThrottleReasons::empty()
            },
            ..at(85.0)
        };
        let changes = seconds(130, |s, g| Some(if g == 0 { hot(s) } else { at(60.0) }));
        assert!(
            changes.iter().any(|c| c.1 == 0
                && c.2 == HealthState::Degraded
                && c.3 == ReasonCode::HOT_FOR_POWER),
            "{changes:?}"
        );
    }

    /// The same for the straggler rule: too few loaded peers to judge
    /// between two slow readings 100 s apart.
    #[test]
    fn samples_not_judged_end_a_straggler_streak() {
        let slow = Observation {
            sm_clock: 1_000.0,
            ..at(60.0)
        };
        let peer = |util: f64| Observation { util, ..at(60.0) };
        let brief = |s: u64, g: usize| {
            Some(match (g, s == 1 || s == 101) {
                (0, _) => slow,
                (_, true) => peer(95.0),
                (_, false) => peer(10.0),
            })
        };
        assert_eq!(seconds(101, brief), vec![]);
        let sustained = |_, g: usize| Some(if g == 0 { slow } else { peer(95.0) });
        assert_eq!(
            seconds(101, sustained),
            vec![(61_003, 0, HealthState::Degraded, ReasonCode::STRAGGLER)]
        );
    }

    #[test]
    fn a_gpu_sampled_first_meets_its_peers_of_the_same_round() {
        // The whole host warms 12.5 K a round (below its max operating
        // temperature): against its peers of the round before, GPU 0 would
        // read 12.5 K hot in every round.
        assert_eq!(rounds(|r, _| 10.0 + 12.5 * r as f64), vec![]);
        // GPU 0 alone runs 20 K hot: judged once its round is in, at its
        // last peer's sample.
        let hot = rounds(|_, g| if g == 0 { 75.0 } else { 55.0 });
        assert_eq!(
            hot,
            vec![(
                3 * PERIOD_MS + 3,
                0,
                HealthState::Degraded,
                ReasonCode::HOT_FOR_POWER
            )]
        );
    }
}
