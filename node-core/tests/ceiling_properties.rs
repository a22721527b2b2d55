//! Properties of each GPU's power ceiling (docs/node-agent.md section
//! 5.1) over random sequences played through the node's step by the
//! shell of `host/`: an administrator's limits set while the agent runs
//! and while it is stopped, the CDU's signed leases (several GPUs, watts
//! below, within and above the range, short, long and too long: those
//! shortened to the host's longest), renewed,
//! released (renewed with their caps lifted) and lapsing, hot GPUs under
//! the thermal guard, clean stops and restarts from what the flash kept,
//! with and without a site limit. After every step:
//!
//! 1. no limit is set above `min(the administrator's last limit, the site
//!    limit, the GPU's max)`, nor below the GPU's min or its ceiling where
//!    that is lower (an administrator's limit below the GPU's min is never
//!    raised);
//! 2. the limit in force is the one the sequence gives (the ceiling under
//!    the guard's cap and the leases in force): with no lease and no guard
//!    cap, the ceiling; an administrator's change is read within one
//!    re-read;
//! 3. a stop with no lease in force leaves the ceiling on every GPU, one
//!    with a lease leaves every limit as it was, and the next start keeps
//!    the caps of the leases still valid (2. then holds again; a lease
//!    holds to its asked end, or the host's longest from its sending if
//!    sooner, a restart never lengthening it);
//! 4. a `power_ceiling` event comes for every administrator's change that
//!    moves a ceiling, when the node reads it, and for nothing else (a
//!    restart never takes the agent's own limit for an administrator's).
//!
//! The model ([`Model`]) derives every expectation from the sequence: the
//! ceiling from the administrator's limits and the site limit, the caps
//! from the leases it sent, the guard's cap from the temperatures, what
//! the flash kept from the host's flash; never from the node's answers.
//! What the generator leaves out, and why, is said where it does.
//!
//! Glossary:
//! - *administrator's limit*: a limit set on a GPU outside the agent
//!   (`nvidia-smi -pl`); the limit found at the first start is one.
//! - *seen*: an administrator's change the node has read (at a start or
//!   a read of every GPU's limit); until then it is *unseen*.
//! - *reported*: the limit the host last answered the node for a GPU, in
//!   a read or a set's read-back.
//! - *target*: the limit the sequence says a GPU must have now.

mod host;

use host::{Host, Start, DEFAULT, GPUS, GUARD, RANGE};
use loopwarden_protocol::samples::{self, demo_signing_key, T0};
use loopwarden_protocol::{
    AckCode, CapLease, CapSource, CommandAuth, DurationMs, Event, Frame, GpuCap, GpuIndex,
    GpuSelector, Message, NodeId, ReasonCode, Role, TimestampMs, Watts, WholeCelsius,
};
use node_core::caps::GpuRange;
use node_core::guard::ThermalGuard;
use node_core::health::Observation;
use node_core::node::{Effect, Input, KeptLimit, Reading, REREAD_EVERY};
use proptest::prelude::*;

/// The longest lease a host takes (`LeaseLimits::default`), ms.
const MAX_LEASE_MS: u32 = 600_000;
/// A cap above every ceiling: a lease renewed with it releases its GPUs.
const LIFTED_W: u32 = 900;

/// One thing that happens to the host.
#[derive(Debug, Clone)]
enum Op {
    /// Rounds of cool, quiet samples, a second apart.
    Rounds(u8),
    /// Rounds with the GPUs of the bit mask at 90 °C (the guard engages).
    Hot { mask: u8, n: u8 },
    /// An administrator sets a GPU's limit while the agent runs.
    Admin { gpu: u8, watts: u32 },
    /// A lease from the CDU: its id (a held id renews it), its caps
    /// (`None`: every GPU; GPU 4 does not exist), its length.
    Lease {
        id: u32,
        caps: Vec<(Option<u8>, u32)>,
        ms: u32,
    },
    /// A held lease renewed with its caps lifted, for 10 s (or to its
    /// end, if later: see [`lease`]).
    Release(u32),
    /// The time goes on to the next lease's end.
    Expiry,
    /// A clean stop, the administrator's limits set while stopped, the
    /// time stopped, and a start from what the flash kept.
    Restart {
        admin: Vec<(u8, u32)>,
        stopped_s: u32,
    },
}

/// A lease the model holds as sent.
#[derive(Debug, Clone)]
struct Held {
    id: u32,
    caps: [Option<Watts>; GPUS],
    expires: u64,
}

/// What the sequence says of the host (see the module note).
#[derive(Debug)]
struct Model {
    /// Now (both clocks), ms.
    t: u64,
    site: Option<Watts>,
    /// Each GPU's administrator's last limit.
    admin: [Watts; GPUS],
    /// The ceiling the node must hold: the administrator's limit as of
    /// the last read of it, within the site limit and the range (one
    /// below the GPU's min stays).
    ceiling: [Watts; GPUS],
    /// The rounds since the start at an unseen change, per GPU.
    unseen: [Option<u64>; GPUS],
    reported: [Watts; GPUS],
    /// The last lease taken of each id (lapsed or not).
    leases: Vec<Held>,
    /// The CDU's last command's sequence number.
    seq: u32,
    /// Each GPU's thermal guard, fed the temperatures the node is fed.
    guard: [ThermalGuard; GPUS],
    /// Rounds since the start.
    rounds: u64,
    /// What the flash kept of each GPU's limits.
    flash: [Option<KeptLimit>; GPUS],
}

impl Model {
    fn new(site: Option<Watts>, found: [Watts; GPUS]) -> Self {
        let mut m = Self {
            t: T0.0,
            site,
            admin: found,
            ceiling: found,
            unseen: [None; GPUS],
            reported: found,
            leases: Vec::new(),
            seq: 0,
            guard: [ThermalGuard::default(); GPUS],
            rounds: 0,
            flash: [None; GPUS],
        };
        m.ceiling = found.map(|w| m.within(w));
        m
    }

    /// `w` as a ceiling: within the site limit and the range; but `w`
    /// below the GPU's min is never raised.
    fn within(&self, w: Watts) -> Watts {
        let capped = self.site.map_or(w, |s| w.min(s));
        capped.min(RANGE.max).max(RANGE.min.min(w))
    }

    /// The lowest limit `gpu` is capped to: its min, or its ceiling where
    /// that is lower.
    fn min_cap(&self, gpu: usize) -> Watts {
        RANGE.min.min(self.ceiling[gpu])
    }

    /// The highest limit the node may ever set on `gpu`.
    fn highest(&self, gpu: usize) -> Watts {
        self.within(self.admin[gpu])
    }

    fn in_force(&self) -> impl Iterator<Item = &Held> {
        self.leases.iter().filter(|l| l.expires > self.t)
    }

    /// The limit `gpu` must have now.
    fn target(&self, gpu: usize) -> Watts {
        let caps = self.in_force().filter_map(|l| l.caps[gpu]);
        caps.chain(self.guard[gpu].cap())
            .fold(self.ceiling[gpu], Watts::min)
            .max(self.min_cap(gpu))
    }
}

/// A lease from `cdu-a` sent at `t`, signed for the host.
fn lease_frame(seq: u32, t: u64, id: u32, caps: &[(Option<u8>, u32)], ms: u32) -> Frame {
    let caps = caps.iter().map(|&(gpu, w)| GpuCap {
        gpus: gpu.map_or(GpuSelector::All, |g| {
            GpuSelector::Gpu(GpuIndex::new(g).expect("a GPU index"))
        }),
        limit: Watts(w),
    });
    let mut f = Frame {
        sender: NodeId::new(Role::Cdu, "cdu-a").unwrap(),
        seq,
        time: TimestampMs(t),
        message: Message::CapLease(CapLease {
            lease: id,
            source: CapSource::Cooling,
            reason: ReasonCode::CAPACITY_SHORT,
            caps: caps.collect(),
            duration: DurationMs(ms),
            auth: CommandAuth::default(),
        }),
    };
    f.sign(&samples::command_topic(), 1, &demo_signing_key())
        .unwrap();
    f
}

/// Each GPU's `power_ceiling` moves in `events`: (GPU, ceiling, was).
fn ceiling_moves(events: &[Event]) -> Vec<(usize, Watts, Watts)> {
    let mut moves = Vec::new();
    for e in events {
        if let Event::PowerCeiling { gpus, ceiling, was } = e {
            moves.extend(
                (0..GPUS)
                    .filter(|i| gpus & (1 << i) != 0)
                    .map(|i| (i, *ceiling, *was)),
            );
        }
    }
    moves.sort();
    moves
}

/// Checks the step whose effects are `host.trail[from..]` and whose
/// events are `host.events[events..]` (properties 1 and 4), and moves the
/// model's ceilings as the reads in it saw them.
fn check_step(m: &mut Model, host: &Host, from: usize, events: usize) -> Result<(), TestCaseError> {
    let mut expected = Vec::new();
    let mut touched = [false; GPUS];
    for effect in &host.trail[from..] {
        match effect {
            Effect::ReadLimits => {
                touched = [true; GPUS];
                for i in 0..GPUS {
                    if m.unseen[i].take().is_some() {
                        let (now, was) = (m.highest(i), m.ceiling[i]);
                        if now != was {
                            expected.push((i, now, was));
                        }
                        m.ceiling[i] = now;
                    }
                }
            }
            Effect::SetLimits(sets) => {
                for s in sets {
                    let i = s.gpu as usize;
                    touched[i] = true;
                    prop_assert!(
                        s.limit <= m.highest(i) && s.limit >= m.min_cap(i),
                        "GPU {i} set to {} W; its ceiling is {} W (administrator {} W, site {:?})",
                        s.limit.0,
                        m.highest(i).0,
                        m.admin[i].0,
                        m.site
                    );
                    prop_assert!(
                        m.unseen[i].is_none(),
                        "GPU {i}: set to {} W with the administrator's {} W not read yet",
                        s.limit.0,
                        m.admin[i].0
                    );
                }
            }
            _ => {}
        }
    }
    for i in (0..GPUS).filter(|&i| touched[i]) {
        m.reported[i] = host.limits[i];
    }
    expected.sort();
    prop_assert_eq!(
        ceiling_moves(&host.events[events..]),
        expected,
        "power_ceiling events (GPU, ceiling, was)"
    );
    Ok(())
}

/// Property 2: every GPU the node has read since the administrator last
/// changed it is at its target, and no change waits past one re-read.
fn check_targets(m: &Model, host: &Host) -> Result<(), TestCaseError> {
    for i in 0..GPUS {
        match m.unseen[i] {
            Some(at) => prop_assert!(
                m.rounds - at < REREAD_EVERY,
                "GPU {i}: the administrator's {} W not read in {} rounds",
                m.admin[i].0,
                m.rounds - at
            ),
            None => {
                prop_assert_eq!(host.node.ceiling(i as u8), Some(m.ceiling[i]), "GPU {}", i);
                prop_assert_eq!(
                    host.limits[i],
                    m.target(i),
                    "GPU {}'s limit (ceiling {} W, guard {:?}, leases {:?})",
                    i,
                    m.ceiling[i].0,
                    m.guard[i].cap(),
                    m.in_force().collect::<Vec<_>>()
                );
            }
        }
    }
    Ok(())
}

/// Runs `input` at the model's time and checks the step.
fn step(m: &mut Model, host: &mut Host, input: Input<'_>) -> Result<(), TestCaseError> {
    let (from, events) = (host.trail.len(), host.events.len());
    host.step(m.t, input);
    check_step(m, host, from, events)
}

/// The time goes on to `t`: the shell's timer wakes the node at every
/// lease's end due by then (at once for one already due), as the agent
/// does, and each step is checked.
fn timer(m: &mut Model, host: &mut Host, t: u64) -> Result<(), TestCaseError> {
    while let Some(end) = host.node.next_expiry().filter(|e| e.0 <= t) {
        m.t = m.t.max(end.0);
        step(m, host, Input::Expiry)?;
        check_targets(m, host)?;
    }
    m.t = t;
    Ok(())
}

/// One round a second after the last, the GPUs of `hot` at 90 °C.
fn round(m: &mut Model, host: &mut Host, hot: u8) -> Result<(), TestCaseError> {
    timer(m, host, m.t + 1_000)?;
    let mut readings = Vec::new();
    for i in 0..GPUS {
        let temp = if hot & (1 << i) != 0 { 90 } else { 60 };
        // A GPU draws up to its limit.
        let power = host.limits[i].min(Watts(650));
        let range = GpuRange {
            min: m.min_cap(i),
            max: m.ceiling[i],
        };
        m.guard[i].update(&GUARD, range, WholeCelsius(temp), power);
        readings.push(Reading::Sample {
            observation: Observation {
                temp: f64::from(temp),
                power: f64::from(power.0),
                power_limit: f64::from(host.limits[i].0),
                sm_clock: 1_980.0,
                util: 95.0,
                ..Observation::default()
            },
            temp: WholeCelsius(temp),
            power,
        });
    }
    step(m, host, Input::Round(&readings))?;
    m.rounds += 1;
    check_targets(m, host)
}

/// The ack the model expects for a lease: `None` for one refused.
fn lease_code(m: &Model, caps: &[(Option<u8>, u32)], ms: u32) -> Option<AckCode> {
    if caps
        .iter()
        .any(|&(g, _)| g.is_some_and(|g| g as usize >= GPUS))
    {
        return None;
    }
    // Ids 0 to 5 never fill the host's 8 cooling leases.
    let below = caps.iter().any(|&(g, w)| {
        (0..GPUS).any(|i| g.is_none_or(|g| g as usize == i) && Watts(w) < m.min_cap(i))
    });
    // Above the highest settable limit: it caps nothing, said.
    let above = caps.iter().any(|&(_, w)| Watts(w) > RANGE.max);
    Some(if below || above || ms > MAX_LEASE_MS {
        AckCode::Clamped
    } else {
        AckCode::Ok
    })
}

/// A lease sent now: acked as the model expects, held if taken.
fn lease(
    m: &mut Model,
    host: &mut Host,
    id: u32,
    caps: &[(Option<u8>, u32)],
    ms: u32,
) -> Result<(), TestCaseError> {
    timer(m, host, m.t + 100)?;
    m.seq += 1;
    let frame = lease_frame(m.seq, m.t, id, caps, ms);
    let code = lease_code(m, caps, ms);
    if code.is_some() {
        let mut held = [None; GPUS];
        for &(gpu, w) in caps {
            for (i, h) in held.iter_mut().enumerate() {
                if gpu.is_none_or(|g| g as usize == i) {
                    *h = Some(h.map_or(Watts(w), |c: Watts| c.min(Watts(w))));
                }
            }
        }
        let t = m.t;
        m.leases.retain(|l| l.id != id);
        m.leases.push(Held {
            id,
            caps: held,
            expires: t + u64::from(ms.min(MAX_LEASE_MS)),
        });
    }
    let acks = host.acks.len();
    step(m, host, Input::Frame(&samples::command_topic(), &frame))?;
    check_targets(m, host)?;
    prop_assert_eq!(host.acks.len(), acks + 1, "one ack");
    let got = host.acks.last().unwrap().code;
    match code {
        Some(c) => prop_assert_eq!(got, c, "{}", host.acks.last().unwrap().detail.as_str()),
        None => prop_assert!(!matches!(got, AckCode::Ok | AckCode::Clamped), "{:?}", got),
    }
    Ok(())
}

/// An administrator sets `watts` on `gpu` while the agent runs.
fn admin_running(m: &mut Model, host: &mut Host, gpu: usize, watts: Watts) {
    // A limit equal to the one the node last read of the GPU (or to the
    // one on it) changes nothing it can see: the rules know an
    // administrator's change only by its difference (section 5.1).
    if watts == m.reported[gpu] || watts == host.limits[gpu] {
        return;
    }
    host.limits[gpu] = watts;
    m.admin[gpu] = watts;
    m.unseen[gpu] = Some(m.rounds);
}

/// A clean stop, the administrator's changes while stopped, the time
/// stopped, and the next start from what the flash kept.
fn restart(
    m: &mut Model,
    host: &mut Host,
    admin: &[(u8, u32)],
    stopped_s: u32,
) -> Result<(), TestCaseError> {
    timer(m, host, m.t + 100)?;
    let before = host.limits;
    let leases = m.in_force().count();
    let (from, events) = (host.trail.len(), host.events.len());
    host.step(m.t, Input::Stop);
    check_step(m, host, from, events)?;
    if leases == 0 {
        let ceilings: Vec<Watts> = (0..GPUS).map(|i| m.highest(i)).collect();
        prop_assert_eq!(host.limits.to_vec(), ceilings, "no lease: the ceilings");
    } else {
        prop_assert_eq!(host.limits, before, "{} leases: the limits stay", leases);
    }
    if let Some(kept) = host.kept_limits.last() {
        for (f, k) in m.flash.iter_mut().zip(kept) {
            if k.is_some() {
                *f = *k;
            }
        }
    }
    m.t += u64::from(stopped_s) * 1_000;
    for &(gpu, w) in admin {
        let (i, w) = (gpu as usize, Watts(w));
        // A limit the agent may have left itself (one of the three the
        // flash keeps) cannot be told from its own at the start: section
        // 5.1 takes it as the agent's.
        let left = m.flash[i]
            .is_some_and(|k| [Some(k.ceiling), Some(k.asked), k.before].contains(&Some(w)));
        if w == host.limits[i] || left {
            continue;
        }
        host.limits[i] = w;
        m.admin[i] = w;
        m.unseen[i] = Some(0);
    }
    let t = m.t;
    // Taken back until it ends as taken: a restart never lengthens it.
    m.leases.retain(|l| l.expires > t);
    m.guard = [ThermalGuard::default(); GPUS];
    m.rounds = 0;
    *host = Host::start(Start {
        limits: host.limits,
        site_limit: m.site,
        kept: m.flash,
        logged: host.logged.clone(),
        at: m.t,
    });
    prop_assert_eq!(
        host.node.leases().len(),
        m.leases.len(),
        "leases taken back"
    );
    check_step(m, host, 0, 0)?;
    check_targets(m, host)
}

fn play(m: &mut Model, host: &mut Host, op: &Op) -> Result<(), TestCaseError> {
    match op {
        Op::Rounds(n) => (0..*n).try_for_each(|_| round(m, host, 0)),
        Op::Hot { mask, n } => (0..*n).try_for_each(|_| round(m, host, *mask)),
        Op::Admin { gpu, watts } => {
            admin_running(m, host, *gpu as usize, Watts(*watts));
            Ok(())
        }
        Op::Lease { id, caps, ms } => lease(m, host, *id, caps, *ms),
        Op::Release(id) => {
            let t = m.t;
            if m.leases.iter().any(|l| l.id == *id && l.expires > t + 100) {
                lease(m, host, *id, &[(None, LIFTED_W)], 10_000)?;
            }
            Ok(())
        }
        Op::Expiry => {
            let t = m.t;
            match m.in_force().map(|l| l.expires).min() {
                Some(end) => timer(m, host, end.max(t)),
                None => Ok(()),
            }
        }
        Op::Restart { admin, stopped_s } => restart(m, host, admin, *stopped_s),
    }
}

/// An administrator's limit: within the GPUs' range, NVML's default, or
/// below the range's min (a board's min_cap_w above the limit found).
fn watts() -> impl Strategy<Value = u32> {
    prop_oneof![3 => 200u32..=800, 1 => Just(DEFAULT.0), 1 => 100u32..200]
}

fn op() -> impl Strategy<Value = Op> {
    let cap = (
        prop_oneof![2 => Just(None), 4 => (0u8..4).prop_map(Some), 1 => Just(Some(4))],
        100u32..=900,
    );
    let ms = prop_oneof![
        3 => 1_000u32..=30_000,
        2 => 60_000u32..=MAX_LEASE_MS,
        1 => MAX_LEASE_MS + 1..=700_000,
    ];
    prop_oneof![
        3 => prop_oneof![3 => 1u8..=5, 1 => 55u8..=65].prop_map(Op::Rounds),
        1 => (1u8..16, 1u8..=4).prop_map(|(mask, n)| Op::Hot { mask, n }),
        2 => (0u8..GPUS as u8, watts()).prop_map(|(gpu, watts)| Op::Admin { gpu, watts }),
        3 => (0u32..6, prop::collection::vec(cap, 1..=3), ms)
            .prop_map(|(id, caps, ms)| Op::Lease { id, caps, ms }),
        1 => (0u32..6).prop_map(Op::Release),
        1 => Just(Op::Expiry),
        1 => (prop::collection::vec((0u8..GPUS as u8, watts()), 0..=2), 0u32..=120)
            .prop_map(|(admin, stopped_s)| Op::Restart { admin, stopped_s }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn the_ceiling_holds_through_admins_leases_and_restarts(
        site in prop_oneof![Just(None), (200u32..=800).prop_map(|w| Some(Watts(w)))],
        found in prop::array::uniform4(watts()),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let found = found.map(Watts);
        let mut m = Model::new(site, found);
        let mut host = Host::start(Start {
            limits: found,
            site_limit: site,
            kept: [None; GPUS],
            logged: Vec::new(),
            at: m.t,
        });
        prop_assert!(
            ceiling_moves(&host.events).is_empty(),
            "nothing known before the first start: no change to announce"
        );
        check_step(&mut m, &host, 0, 0)?;
        check_targets(&m, &host)?;
        for op in &ops {
            play(&mut m, &mut host, op)?;
        }
    }
}
