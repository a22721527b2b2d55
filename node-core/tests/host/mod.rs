//! The agent's shell, played for the node's tests (`node_step.rs`,
//! `node_step_limits.rs`, `range_learned.rs`, `ceiling_properties.rs`,
//! `cooling_properties.rs`):
//! four fake GPUs with their power limits, a
//! fake flash (the commands logged, the limits, health, phases, pending
//! cooling-loss steps and replay floors kept), and a record of what went
//! on the bus; it carries out each effect of the node and answers it as
//! the agent does. A host restarts from its flash after a clean stop or
//! a crash ([`Host::restarted`], [`Host::crashed`]). A GPU's limit reads
//! and sets can be made to fail ([`Host::unreadable`],
//! [`Host::back_fails`], [`Host::sets_lost`]), as a worker busy past its
//! deadline or an NVML error makes them; a GPU's range can be other than
//! the one the node was given, and learned by a set ([`Host::nvml_range`]).
//!
//! Glossary:
//! - *pending*: a cooling-loss step handed out (its commands running)
//!   or kept from before a restart, and not known done, as the agent's
//!   shell keeps it in flash with the phase ([`Host::flash_pending`]).
//! - *boot*: how a host comes up: its GPUs' limits, a site limit, what its
//!   flash kept from before ([`Boot`], [`Start`]).
//! - *trail*: every effect, in the order carried out.

#![allow(dead_code)]

use std::collections::VecDeque;

use loopwarden_protocol::samples::{self, demo_signing_key, T0};
use loopwarden_protocol::{
    Ack, CapLease, CapSource, CommandAuth, CoolingStep, DurationMs, Event, Frame, GpuCap, GpuIndex,
    GpuSelector, HealthState, Ident, Message, NodeId, QuarantineRelease, ReasonCode, ReplayFloor,
    Role, Text, TimestampMs, Topic, Watts, WholeCelsius,
};
use node_core::caps::{GpuRange, LeaseLimits};
use node_core::commands::Authority;
use node_core::cooling_loss::Phase;
use node_core::guard::GuardSettings;
use node_core::health::{GpuStatus, Limits, Observation, Policy};
use node_core::node::{
    push_front, CoolantSource, Effect, GpuSetup, Input, KeptLimit, LimitResult, Node, Now, Reading,
    Setup,
};

pub const GPUS: usize = 4;
pub const DEFAULT: Watts = Watts(700);
pub const GRACE_MS: u64 = 30_000;
/// Every GPU's settable range.
pub const RANGE: GpuRange = GpuRange {
    min: Watts(200),
    max: Watts(800),
};
/// The thermal guard's settings.
pub const GUARD: GuardSettings = GuardSettings {
    engage: WholeCelsius(87),
    release: WholeCelsius(82),
    step: Watts(25),
};

/// The shell, played: fake GPUs, a fake flash, and what went out.
pub struct Host {
    pub node: Node,
    /// Each GPU's power limit.
    pub limits: [Watts; GPUS],
    /// Whether the flash takes a write.
    pub flash_ok: bool,
    /// Whether a GPU refuses a set (its limit stays).
    pub refuse_set: bool,
    /// The GPUs that refuse a set, whatever `refuse_set` says.
    pub refuses: [bool; GPUS],
    /// The GPUs whose limit cannot be read in a read of every GPU's
    /// limit ([`Effect::ReadLimits`]); a set still takes.
    pub unreadable: [bool; GPUS],
    /// The GPUs whose limit cannot be read back after a set (the set
    /// takes unless refused).
    pub back_fails: [bool; GPUS],
    /// The GPUs whose sets are never made (a worker busy past its
    /// deadline): each answers a timeout, the limit stays.
    pub sets_lost: [bool; GPUS],
    /// Each GPU's true lowest limit where it is above the one the node
    /// was given (the board's stood in for NVML's): a set below it is
    /// set at it instead, as the shell does after NVML's refusal.
    pub floor: [Option<Watts>; GPUS],
    /// Each GPU's settable range as NVML gives it, where it is not the
    /// one the node was given: a set outside it is set within it, and a
    /// set that took and read back at another limit than asked answers
    /// it ([`LimitResult::range`]), as the shell's description after
    /// such a set does.
    pub nvml_range: [Option<GpuRange>; GPUS],
    /// The GPUs whose limit reads just before a set that asks it
    /// ([`SetLimit::read_first`](node_core::node::SetLimit)) even while
    /// `unreadable` (a busy GPU that answered this once); any other reads
    /// then as `unreadable` says.
    pub reads_before_set: [bool; GPUS],
    /// What went on the bus or into flash, in order.
    pub acks: Vec<Ack>,
    pub events: Vec<Event>,
    pub health_published: usize,
    pub kept_health: Vec<u8>,
    pub quarantined: Vec<u8>,
    pub cooling: Vec<CoolingStep>,
    /// The cooling-loss phases kept in flash, each time (a host started
    /// with [`Kept`] begins with the phase it was given).
    pub kept_phase: Vec<Phase>,
    /// The cooling-loss steps pending in flash, in order: handed out
    /// (`true`: running until [`Host::cooling_ended`]) or kept from before
    /// the restart (`false`).
    pub flash_pending: Vec<(CoolingStep, bool)>,
    /// The replay floors kept in flash, each time (a host started with
    /// [`Kept`] begins with the floors it was given).
    pub kept_floors: Vec<(NodeId, ReplayFloor)>,
    /// The last CDU state's floor kept in flash.
    pub kept_state_floor: Option<(ReplayFloor, (u32, TimestampMs))>,
    pub logged_commands: usize,
    /// The command frames logged to flash, in order (a restart takes
    /// back the leases among them).
    pub logged: Vec<(TimestampMs, Frame)>,
    /// The limits kept in flash, each time.
    pub kept_limits: Vec<Vec<Option<KeptLimit>>>,
    /// What the flash holds of each GPU's limits now.
    pub flash_limits: [Option<KeptLimit>; GPUS],
    /// Each GPU's health as last kept in flash.
    pub kept_status: [Option<GpuStatus>; GPUS],
    /// Every effect in the order carried out.
    pub trail: Vec<Effect>,
}

/// How a host comes up: its GPUs' limits, a site limit, what its flash
/// kept from before.
#[derive(Clone, Copy)]
pub struct Boot {
    pub limits: Watts,
    pub site_limit: Option<Watts>,
    pub kept: Option<KeptLimit>,
}

impl Default for Boot {
    fn default() -> Self {
        Self {
            limits: DEFAULT,
            site_limit: None,
            kept: None,
        }
    }
}

/// As [`Boot`], GPU by GPU, with the commands the flash logged and the
/// time of the start.
#[derive(Clone)]
pub struct Start {
    /// Each GPU's power limit when the agent starts.
    pub limits: [Watts; GPUS],
    pub site_limit: Option<Watts>,
    /// What the flash kept of each GPU's limits.
    pub kept: [Option<KeptLimit>; GPUS],
    /// The command frames the flash logged, taken back in order.
    pub logged: Vec<(TimestampMs, Frame)>,
    /// When the agent starts (both clocks), ms.
    pub at: u64,
}

/// What else the flash kept and the agent gives back before its start:
/// the cooling-loss phase, the replay floors, each GPU's health.
#[derive(Clone, Default)]
pub struct Kept {
    pub phase: Option<Phase>,
    /// The cooling-loss steps pending, in order.
    pub pending: Vec<CoolingStep>,
    pub floors: Vec<(NodeId, ReplayFloor)>,
    /// The last CDU state taken: its seq and stamp.
    pub state_floor: Option<(ReplayFloor, (u32, TimestampMs))>,
    pub health: [Option<GpuStatus>; GPUS],
}

impl Host {
    pub fn new() -> Self {
        Self::boot(Boot::default())
    }

    pub fn boot(boot: Boot) -> Self {
        Self::start(Start {
            limits: [boot.limits; GPUS],
            site_limit: boot.site_limit,
            kept: [boot.kept; GPUS],
            logged: Vec::new(),
            at: T0.0,
        })
    }

    /// A host started as `boot` says, as the agent starts: the leases
    /// logged still valid taken back, the kept limits given, then the
    /// start's read and reconcile.
    pub fn start(boot: Start) -> Self {
        Self::start_kept(boot, Kept::default())
    }

    /// As [`Host::boot`], its state volatile (no flash file): nothing it
    /// keeps survives a stop.
    pub fn boot_volatile(boot: Boot) -> Self {
        let start = Start {
            limits: [boot.limits; GPUS],
            site_limit: boot.site_limit,
            kept: [boot.kept; GPUS],
            logged: Vec::new(),
            at: T0.0,
        };
        let mut host = Self::assemble(start, Kept::default(), LeaseLimits::default(), true);
        host.step(T0.0, Input::Start);
        host
    }

    /// As [`Host::start`], with the rest of what the flash kept given back
    /// first, as the agent gives it (a GPU's health only when not
    /// healthy).
    pub fn start_kept(boot: Start, kept: Kept) -> Self {
        Self::start_limited(boot, kept, LeaseLimits::default())
    }

    /// As [`Host::start_kept`], the host taking leases within `limits`.
    pub fn start_limited(boot: Start, kept: Kept, limits: LeaseLimits) -> Self {
        let at = boot.at;
        let mut host = Self::assemble(boot, kept, limits, false);
        host.step(at, Input::Start);
        host
    }

    /// As [`Host::boot`], the limits of the GPUs of `unreadable` not
    /// readable from the start on.
    pub fn boot_unreadable(boot: Boot, unreadable: [bool; GPUS]) -> Self {
        let mut host = Self::assemble(
            Start {
                limits: [boot.limits; GPUS],
                site_limit: boot.site_limit,
                kept: [boot.kept; GPUS],
                logged: Vec::new(),
                at: T0.0,
            },
            Kept::default(),
            LeaseLimits::default(),
            false,
        );
        host.unreadable = unreadable;
        host.step(T0.0, Input::Start);
        host
    }

    /// The host as [`Host::start_kept`] makes it, not started yet; its
    /// state `volatile` or in flash.
    fn assemble(boot: Start, kept: Kept, lease_limits: LeaseLimits, volatile: bool) -> Self {
        let setup = Setup {
            own_cmd: samples::command_topic(),
            authority: Authority::demo(Some(cdu())),
            lease_limits,
            gpus: vec![
                GpuSetup {
                    range: RANGE,
                    default_limit: DEFAULT,
                    site_limit: boot.site_limit,
                };
                GPUS
            ],
            guard: GUARD,
            health_limits: Limits {
                max_operating_c: 87.0,
            },
            policy: Policy::default(),
            cooling_grace_ms: GRACE_MS,
            coolant: Some(CoolantSource {
                topic: cdu_topic(),
                cdu: cdu(),
                rack: Some(2),
            }),
            started: T0,
            volatile_state: volatile,
        };
        let mut node = Node::new(setup);
        for (taken, f) in &boot.logged {
            node.restore_command(TimestampMs(boot.at), *taken, f);
        }
        for (i, k) in boot.kept.iter().enumerate() {
            if let Some(k) = k {
                node.restore_limit(i as u8, *k);
            }
        }
        for (i, status) in kept.health.iter().enumerate() {
            if let Some(st) = status.as_ref().filter(|s| s.state != HealthState::Healthy) {
                node.restore_health(i as u8, st.clone());
            }
        }
        node.restore_cooling(kept.phase.unwrap_or_default(), &kept.pending);
        for (sender, floor) in &kept.floors {
            node.restore_replay_floor(sender, *floor);
        }
        if let Some((floor, last)) = kept.state_floor {
            node.restore_state_floor(floor, last);
        }
        Self {
            node,
            limits: boot.limits,
            flash_ok: true,
            refuse_set: false,
            refuses: [false; GPUS],
            unreadable: [false; GPUS],
            back_fails: [false; GPUS],
            sets_lost: [false; GPUS],
            floor: [None; GPUS],
            nvml_range: [None; GPUS],
            reads_before_set: [false; GPUS],
            acks: Vec::new(),
            events: Vec::new(),
            health_published: 0,
            kept_health: Vec::new(),
            quarantined: Vec::new(),
            cooling: Vec::new(),
            kept_phase: kept.phase.into_iter().collect(),
            flash_pending: kept.pending.iter().map(|&s| (s, false)).collect(),
            kept_floors: kept.floors,
            kept_state_floor: kept.state_floor,
            logged_commands: 0,
            logged: boot.logged,
            kept_limits: Vec::new(),
            flash_limits: boot.kept,
            kept_status: kept.health,
            trail: Vec::new(),
        }
    }

    /// Gives the node `input` at `t` and carries out what it decides, as
    /// the agent's shell does.
    pub fn step(&mut self, t: u64, input: Input<'_>) {
        let now = Now::at(t);
        let command = match input {
            Input::Frame(_, f) => Some(f.clone()),
            _ => None,
        };
        let mut queue = VecDeque::from(self.node.step(now, input));
        while let Some(effect) = queue.pop_front() {
            self.trail.push(effect.clone());
            let answer = match effect {
                Effect::SetLimits(sets) => {
                    let results: Vec<LimitResult> =
                        sets.iter().map(|s| self.set_limit(s)).collect();
                    self.node.step(now, Input::LimitsSet(&results))
                }
                Effect::ReadLimits => {
                    let read: Vec<_> = (0..GPUS)
                        .map(|i| match self.unreadable[i] {
                            true => Err("Timeout".to_string()),
                            false => Ok(self.limits[i]),
                        })
                        .collect();
                    self.node.step(now, Input::LimitsRead(&read))
                }
                Effect::LogCommand => {
                    let logged = if self.flash_ok {
                        self.logged_commands += 1;
                        self.logged.extend(command.clone().map(|f| (now.wall(), f)));
                        Ok(())
                    } else {
                        Err("the flash is full")
                    };
                    self.node.step(now, Input::Logged(logged))
                }
                Effect::Acknowledge => self.node.step(now, Input::Acknowledge),
                Effect::Ack(ack) => {
                    self.acks.push(ack);
                    continue;
                }
                Effect::Emit(e) => {
                    self.events.push(e);
                    continue;
                }
                Effect::PublishHealth => {
                    self.health_published += 1;
                    continue;
                }
                Effect::KeepHealth(gpu) => {
                    self.kept_health.push(gpu);
                    self.kept_status[gpu as usize] = self.node.health().status(gpu).cloned();
                    continue;
                }
                Effect::Quarantine { gpu, .. } => {
                    self.quarantined.push(gpu);
                    continue;
                }
                Effect::RunCooling { step, .. } => {
                    // As the shell: the new run stands for the same step
                    // and the one it undoes, still pending.
                    let undo = undoing(step);
                    self.flash_pending.retain(|&(s, _)| s != step && s != undo);
                    self.flash_pending.push((step, true));
                    self.cooling.push(step);
                    continue;
                }
                Effect::DropCooling(step) => {
                    self.flash_pending.retain(|&(s, _)| s != step);
                    continue;
                }
                Effect::KeepCooling(phase) => {
                    self.kept_phase.push(phase);
                    continue;
                }
                Effect::KeepLimits(kept) => {
                    // A GPU given none keeps its record as it is.
                    for (f, k) in self.flash_limits.iter_mut().zip(&kept) {
                        if k.is_some() {
                            *f = *k;
                        }
                    }
                    self.kept_limits.push(kept);
                    continue;
                }
                Effect::KeepReplayFloor { sender, floor } => {
                    self.kept_floors.push((sender, floor));
                    continue;
                }
                Effect::KeepStateFloor { floor, last, .. } => {
                    self.kept_state_floor = Some((floor, last));
                    continue;
                }
                Effect::Say(..) | Effect::Reprobe => continue,
            };
            push_front(&mut queue, answer);
        }
    }

    /// One set of the node's, carried out as the shell does: a read just
    /// before it where asked, no set above the limit found, then the set
    /// and its read-back, each failing as this host is told to.
    fn set_limit(&mut self, s: &node_core::node::SetLimit) -> LimitResult {
        let i = s.gpu as usize;
        let first = s
            .read_first
            .then(|| match self.unreadable[i] && !self.reads_before_set[i] {
                true => Err("Timeout".to_string()),
                false => Ok(self.limits[i]),
            });
        // As the shell: no set above the limit found.
        if let Some(Ok(found)) = first
            .clone()
            .filter(|f| f.as_ref().is_ok_and(|&w| w < s.limit))
        {
            return LimitResult {
                gpu: s.gpu,
                limit: s.limit,
                set: Err(format!("not set: {} W found on it", found.0)),
                back: Ok(found),
                first,
                range: None,
            };
        }
        let set = if self.refuse_set || self.refuses[i] {
            Err("Not Supported".to_string())
        } else if self.sets_lost[i] {
            Err("Timeout".to_string())
        } else {
            let limit = self.floor[i].map_or(s.limit, |f| s.limit.max(f));
            self.limits[i] = self.nvml_range[i].map_or(limit, |r| limit.clamp(r.min, r.max));
            Ok(())
        };
        let back = if self.back_fails[i] {
            Err("Timeout".to_string())
        } else {
            Ok(self.limits[i])
        };
        // As the shell: a set that took and read back at another limit
        // than asked has the GPU described again.
        let range = match (&set, &back) {
            (Ok(()), Ok(b)) if *b != s.limit => self.nvml_range[i],
            _ => None,
        };
        LimitResult {
            gpu: s.gpu,
            limit: s.limit,
            set,
            back,
            first,
            range,
        }
    }

    /// The cooling-loss steps handed out ended well: pending no more.
    pub fn cooling_ended(&mut self) {
        self.flash_pending.retain(|&(_, running)| !running);
    }

    /// The host killed now, the first `done` of the cooling-loss steps
    /// running having ended well before (the rest cut, still pending),
    /// and started again at `at` from its flash (no stop).
    pub fn crashed(&mut self, done: usize, at: u64) -> Self {
        let mut ended = 0;
        self.flash_pending.retain(|&(_, running)| {
            let end = running && ended < done;
            ended += usize::from(end);
            !end
        });
        self.restarted(at)
    }

    /// The host started again at `at` from everything its flash kept
    /// (after a stop or a crash): the GPUs' limits as they are, the kept
    /// limits, the commands logged, the cooling-loss phase and steps
    /// pending, the replay floors and the health states.
    pub fn restarted(&self, at: u64) -> Self {
        let (start, kept) = self.flash_at(at);
        Self::start_kept(start, kept)
    }

    /// A start at `at` from what this host's flash kept, and the GPUs'
    /// limits as they are.
    fn flash_at(&self, at: u64) -> (Start, Kept) {
        let start = Start {
            limits: self.limits,
            site_limit: None,
            kept: self.flash_limits,
            logged: self.logged.clone(),
            at,
        };
        let kept = Kept {
            phase: self.kept_phase.last().copied(),
            pending: self.flash_pending.iter().map(|&(s, _)| s).collect(),
            floors: self.kept_floors.clone(),
            state_floor: self.kept_state_floor,
            health: self.kept_status.clone(),
        };
        (start, kept)
    }

    /// As [`Host::crashed`] (no cooling-loss step ended), the limits of
    /// the GPUs of `unreadable` still not readable at the new start.
    pub fn crashed_unreadable(&self, at: u64, unreadable: [bool; GPUS]) -> Self {
        let (start, kept) = self.flash_at(at);
        let mut host = Self::assemble(start, kept, LeaseLimits::default(), false);
        host.unreadable = unreadable;
        host.step(at, Input::Start);
        host
    }

    /// A round in which every GPU answers a quiet, healthy sample.
    pub fn healthy_round(&mut self, t: u64) {
        self.step(t, Input::Round(&healthy_readings()));
    }

    /// A round in which no GPU answers.
    pub fn silent_round(&mut self, t: u64) {
        let readings = vec![Reading::Missed("timed out".into()); GPUS];
        self.step(t, Input::Round(&readings));
    }

    pub fn state(&self, gpu: u8) -> HealthState {
        self.node.health().status(gpu).unwrap().state
    }
}

/// The cooling-loss step that undoes `step`.
pub fn undoing(step: CoolingStep) -> CoolingStep {
    match step {
        CoolingStep::Drain => CoolingStep::Resume,
        CoolingStep::Resume => CoolingStep::Drain,
        CoolingStep::PowerDown => CoolingStep::PowerUp,
        CoolingStep::PowerUp => CoolingStep::PowerDown,
    }
}

pub fn cdu() -> Ident {
    Ident::new("cdu-a").unwrap()
}

pub fn cdu_topic() -> Topic {
    Topic::new(
        &Ident::new("hall-1").unwrap(),
        Role::Cdu,
        &cdu(),
        loopwarden_protocol::Family::Health,
    )
}

/// The topic the node takes its commands on.
pub fn cmd_topic() -> Topic {
    samples::command_topic()
}

pub fn quiet() -> Observation {
    Observation {
        temp: 60.0,
        power: 450.0,
        power_limit: 700.0,
        sm_clock: 1_980.0,
        util: 95.0,
        ..Observation::default()
    }
}

/// Every GPU's quiet, healthy sample of a round.
pub fn healthy_readings() -> Vec<Reading> {
    (0..GPUS)
        .map(|_| Reading::Sample {
            observation: quiet(),
            temp: WholeCelsius(60),
            power: Watts(450),
        })
        .collect()
}

/// A lease from the CDU's controller: every GPU at `watts` for `ms`.
pub fn lease(seq: u32, t: u64, watts: u32, ms: u32) -> Frame {
    lease_caps(seq, t, &[(GpuSelector::All, watts)], ms)
}

/// A lease from the CDU's controller (its id `seq`): each of `caps`, GPUs
/// and watts, for `ms`.
pub fn lease_caps(seq: u32, t: u64, caps: &[(GpuSelector, u32)], ms: u32) -> Frame {
    let mut f = Frame {
        sender: NodeId::new(Role::Cdu, "cdu-a").unwrap(),
        seq,
        time: TimestampMs(t),
        message: Message::CapLease(CapLease {
            lease: seq,
            source: CapSource::Cooling,
            reason: ReasonCode::CAPACITY_SHORT,
            caps: caps
                .iter()
                .map(|&(gpus, w)| GpuCap {
                    gpus,
                    limit: Watts(w),
                })
                .collect(),
            duration: DurationMs(ms),
            auth: CommandAuth::default(),
        }),
    };
    f.sign(&samples::command_topic(), 1, &demo_signing_key())
        .unwrap();
    f
}

/// An operator's release of `gpu`, signed with the demonstration key.
pub fn release(seq: u32, t: u64, gpu: u8) -> Frame {
    let mut f = Frame {
        sender: NodeId::new(Role::Operator, "jdoe").unwrap(),
        seq,
        time: TimestampMs(t),
        message: Message::QuarantineRelease(QuarantineRelease {
            gpu: GpuIndex::new(gpu).unwrap(),
            operator: Ident::new("jdoe").unwrap(),
            note: Text::new("reseated, field diagnostics pass").unwrap(),
            auth: CommandAuth::default(),
        }),
    };
    f.sign(&samples::command_topic(), 1, &demo_signing_key())
        .unwrap();
    f
}

/// The limits set on GPU `gpu` in `trail`, in order.
pub fn sets_on(trail: &[Effect], gpu: u8) -> Vec<Watts> {
    trail
        .iter()
        .flat_map(|e| match e {
            Effect::SetLimits(sets) => sets.clone(),
            _ => Vec::new(),
        })
        .filter(|s| s.gpu == gpu)
        .map(|s| s.limit)
        .collect()
}
