//! # The node's step: every decision of the host agent, in one place
//!
//! [`Node`] owns the health engine, the command core (and its cap
//! arbiter), every GPU's thermal guard, what each GPU's limit is known to
//! be, and the cooling-loss decisions. The agent's shell gives it one
//! [`Input`] at a time with the time ([`Now`]) and carries out the
//! [`Effect`]s it returns, in order: set a limit, publish, log, keep a
//! record in flash, run an action. An effect that has a result (a limit
//! set and read back, a record logged) is answered by the shell with the
//! matching input ([`Input::LimitsSet`], [`Input::LimitsRead`],
//! [`Input::Logged`], [`Input::Acknowledge`]), whose effects it carries out
//! before the rest. So the whole agent replays without a runtime, a bus or
//! NVML: a test plays the inputs and reads the effects.
//!
//! What it guarantees (with the shell that reports truly):
//! - every limit it reports (an ack's `in_force`, `caps_applied`) is one
//!   read back from the GPU;
//! - a lease or a release is logged to flash before its ack goes out, and
//!   the ack says when that failed;
//! - a limit that could not be set is tried again after [`RETRY_MS`] (at
//!   once for a command, whose sender waits for the ack), and said once
//!   per target;
//! - it never sets a GPU above its ceiling: the limit found on it
//!   (an administrator's, kept over restarts), within any configured
//!   site limit; a limit someone else sets while it runs is the new
//!   ceiling, said in a `power_ceiling` event; every GPU's limit is read
//!   before any is set and at the stop, so no set overwrites such a
//!   limit unseen; a limit a sample sees in force above the one read
//!   back is read at that round's end; a limit found below the GPU's
//!   lowest cap is never raised; a GPU whose read failed is set only to
//!   a limit no higher than the lowest the agent may have left on it (a
//!   cap goes down), a raise waits for a good read;
//! - at a stop with no lease in force every GPU is given back its
//!   ceiling; at one with a lease, the limits stay as they are, for the
//!   next start to apply or lift as the kept leases say, unless the state
//!   is volatile ([`Setup::volatile_state`]: the leases are not kept, and
//!   a cap left on would be the next start's ceiling): then the ceilings
//!   are put back all the same, said, but never while the host's cooling
//!   is lost (its phase not cooled, or a cooling-loss lease in force):
//!   the caps stay, said as an error naming the commands that lift them.
//! - a cooling-loss step kept pending over a restart runs again once at
//!   the start; a power-down only once the CDU's first state taken after
//!   it leaves the rack powered down, or at the first round at or after
//!   the wait (on the time passed in: see `cooling`).
//!
//! Glossary:
//! - *round*: one sampling of every GPU ([`Input::Round`]).
//! - *reconcile*: set every GPU whose known limit differs from its target
//!   (after a read of every GPU's limit), then read it back.
//! - *ceiling*: the limit a GPU runs at uncapped (see [`KeptLimit`]).
//! - *pending command*: a command whose ack waits for its flash write and
//!   its limits; its limits' events go out after the ack.
//! - *steady*/*wall*: see [`Now`].

use std::collections::VecDeque;

use loopwarden_protocol::{
    CoolingStep, Event, Frame, GpuHealth, HostHealth, Ident, Monitoring, Text, TimestampMs, Topic,
    Watts, WholeCelsius,
};

use crate::caps::{GpuRange, LeaseLimits, LeaseView};
use crate::commands::{Authority, CommandCore};
use crate::cooling_loss::{CoolingLoss, Phase};
use crate::guard::{GuardSettings, ThermalGuard};
use crate::health::{GpuStatus, HealthEngine, Limits, Observation, Policy};

mod cooling;
mod frames;
mod health;
mod limits;
mod xid_log;

pub use limits::{KeptLimit, LimitResult, SetLimit};
use xid_log::XidLog;

/// How long a limit that could not be set waits before the next try, ms.
pub const RETRY_MS: u64 = 30_000;
/// Every this many rounds the limits are read back again, so a limit
/// changed behind the agent's back (`nvidia-smi -pl`) is seen: it is the
/// GPU's ceiling from then on. One raised above the limit read back is
/// read sooner: at the end of the first round whose sample sees it in
/// force.
pub const REREAD_EVERY: u64 = 60;
/// Every this many rounds the retained health is published again (a
/// publish lost in a full queue after a long outage is put right).
pub const HEALTH_EVERY: u64 = 60;

/// The time of a step: steady time for every window, timer and lease, and
/// how far the wall clock is from it, for stamps and a command's
/// freshness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Now {
    /// Ms in the wall's epoch as it was at start, plus the monotonic time
    /// since; never steps.
    pub steady: TimestampMs,
    /// Wall minus steady, ms: 0 until the wall clock steps or drifts.
    pub offset: i64,
}

impl Now {
    /// Both clocks at `t` (no step).
    pub fn at(t: u64) -> Self {
        Self {
            steady: TimestampMs(t),
            offset: 0,
        }
    }

    /// The wall clock.
    pub fn wall(self) -> TimestampMs {
        TimestampMs(self.steady.0.saturating_add_signed(self.offset))
    }
}

/// One GPU as the node is set up with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSetup {
    /// The limits it can be set to: its lowest settable limit, and its
    /// highest within the board.
    pub range: GpuRange,
    /// Its default limit (NVML's): its ceiling until a limit is read
    /// from it, where nothing was kept and no site limit is configured.
    pub default_limit: Watts,
    /// The site's configured ceiling for this board (`site_limit_w`), if
    /// any: never exceeded, whatever is found on the GPU.
    pub site_limit: Option<Watts>,
}

/// Where this host's cooling context comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoolantSource {
    /// The CDU's state topic.
    pub topic: Topic,
    /// The CDU that cools this host.
    pub cdu: Ident,
    /// This host's rack on it; `None`: a cooling loss is never acted on.
    pub rack: Option<u8>,
}

/// What the node is set up with.
#[derive(Debug, Clone)]
pub struct Setup {
    /// This host's `cmd` topic: what its commands are signed for.
    pub own_cmd: Topic,
    /// Who may command this host.
    pub authority: Authority,
    /// The bounds of a lease.
    pub lease_limits: LeaseLimits,
    /// Every GPU, in index order.
    pub gpus: Vec<GpuSetup>,
    /// The thermal guard's settings.
    pub guard: GuardSettings,
    /// The health engine's limits of the board.
    pub health_limits: Limits,
    /// The health engine's policy (its `unresponsive_after` also says when
    /// a GPU is reported unresponsive).
    pub policy: Policy,
    /// How long a rack without cooling waits before it is powered down,
    /// ms.
    pub cooling_grace_ms: u64,
    /// The CDU's state this host listens to.
    pub coolant: Option<CoolantSource>,
    /// When the agent started, in steady time (the wall clock at the
    /// start, where steady time is anchored): also the replay floor of a
    /// signer with none kept ([`CommandCore::set_started`]).
    pub started: TimestampMs,
    /// The state is volatile (no flash file): the leases are gone at a
    /// stop, so a stop puts the ceilings back even with leases in force,
    /// unless the host's cooling is lost (the caps then stay, said).
    pub volatile_state: bool,
}

/// One GPU's answer in a round.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// It answered.
    Sample {
        /// Its fields as the health engine reads them.
        observation: Observation,
        /// Die temperature, for the guard.
        temp: WholeCelsius,
        /// Power drawn, for the guard.
        power: Watts,
    },
    /// It did not answer within the deadline, or failed (why, in words).
    Missed(String),
    /// The driver answered that it lost the GPU (fallen off the bus; why,
    /// in words): a missed sample, and the driver's verdict on the GPU.
    Lost(String),
    /// Asked, not answered yet: its answer counts next round (a slow
    /// answer is not a missed one).
    Pending,
}

/// What happened, for [`Node::step`].
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// The agent starts: the cooling-loss steps kept pending from before
    /// the restart ([`Node::restore_cooling`]) run again, are dropped or
    /// (a power-down) held for the CDU's word; every GPU's limit is read,
    /// then the targets put in force.
    Start,
    /// A sampling round: one reading per GPU, in index order.
    Round(&'a [Reading]),
    /// A frame on `topic` (the CDU's state, a command to this host).
    Frame(&'a Topic, &'a Frame),
    /// The driver reported an XID.
    Xid {
        /// The GPU it names.
        gpu: u8,
        /// The XID.
        xid: u16,
    },
    /// The XID watch stopped (`Some(why)`) or runs again (`None`).
    XidWatch(Option<&'a str>),
    /// The next lease expiry ([`Node::next_expiry`]) came.
    Expiry,
    /// A GPU that could not say its UUID at start said it now: the health
    /// kept for it before the restart, if any was ([`Node::restore_health`]
    /// had nothing to match then).
    Identified {
        /// The GPU.
        gpu: u8,
        /// Its health kept in flash (`None`: none was).
        kept: Option<&'a GpuStatus>,
        /// Its limits kept in flash (`None`: none were).
        limit: Option<KeptLimit>,
    },
    /// Answers [`Effect::SetLimits`]: each limit set and read back.
    LimitsSet(&'a [LimitResult]),
    /// Answers [`Effect::ReadLimits`]: every GPU's limit as read, in index
    /// order (`Err`: why it could not be read).
    LimitsRead(&'a [Result<Watts, String>]),
    /// Answers [`Effect::LogCommand`]: whether it is in flash.
    Logged(Result<(), &'a str>),
    /// Answers [`Effect::Acknowledge`]: the pending command's ack is due.
    Acknowledge,
    /// The agent stops: every GPU's limit is read; then with no lease in
    /// force, or with volatile state and the cooling not lost, every
    /// GPU's ceiling is put back; with one (and a flash), or with
    /// volatile state while cooling is lost, the limits stay.
    Stop,
}

/// How loud a line of the log is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Routine.
    Info,
    /// A fault found and handled (a sick GPU, a refused frame).
    Warn,
    /// Something the agent failed to do itself.
    Error,
}

/// What the shell is to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Write a line to the log.
    Say(Level, String),
    /// Publish the retained health ([`Node::host_health`]).
    PublishHealth,
    /// Keep this GPU's health in flash ([`Node::gpu_health`]); a
    /// quarantine is waited for (in flash before the effects after it).
    KeepHealth(u8),
    /// Log an event to flash and publish it.
    Emit(Event),
    /// Start the quarantine actions of a GPU.
    Quarantine {
        /// The GPU.
        gpu: u8,
        /// Why, in words (`reason: evidence`).
        reason: String,
    },
    /// Ask every GPU again what it answered "not supported" (a reloaded
    /// driver may answer otherwise).
    Reprobe,
    /// Set these limits and read each back; answer [`Input::LimitsSet`].
    SetLimits(Vec<SetLimit>),
    /// Read every GPU's limit; answer [`Input::LimitsRead`].
    ReadLimits,
    /// Keep every GPU's ceiling and the limits it may be left at in
    /// flash, in index order, and wait until they are there: it comes
    /// before the [`Effect::SetLimits`] it covers, so a restart tells its
    /// own limits from an administrator's. `None`: nothing to keep for
    /// that GPU (never read, nothing kept before), its record left as is.
    KeepLimits(Vec<Option<KeptLimit>>),
    /// Keep the cooling-loss phase in flash (its time on the wall clock).
    KeepCooling(Phase),
    /// Keep in flash the floor of the commands taken from a signer, its
    /// highest seq and latest stamp ([`loopwarden_protocol::ReplayFloor`];
    /// [`Node::restore_replay_floor`] takes it back after a restart).
    KeepReplayFloor {
        /// The signer.
        sender: loopwarden_protocol::NodeId,
        /// The highest sequence number and the latest stamp taken from it.
        floor: loopwarden_protocol::ReplayFloor,
    },
    /// Keep in flash the floor of the CDU's states taken, the highest seq
    /// and the latest stamp ([`loopwarden_protocol::ReplayFloor`];
    /// [`Node::restore_state_floor`] takes it back after a restart), so
    /// that an older state sent again after a restart (a "cooled" that
    /// would end a loss, a "lost" that would start one) is refused as a
    /// replay, as it was before.
    KeepStateFloor {
        /// The CDU whose states they are.
        cdu: Ident,
        /// The highest sequence number and the latest stamp taken.
        floor: loopwarden_protocol::ReplayFloor,
        /// The seq and stamp of the last state taken (a copy of it is
        /// taken again).
        last: (u32, TimestampMs),
    },
    /// Forget a cooling-loss step kept pending from before the restart:
    /// it is not run (the host is no longer powered down, or the CDU said
    /// cooling is back while a power-down was held); the phase and the
    /// steps still pending are kept in flash again.
    DropCooling(CoolingStep),
    /// Run a cooling-loss step's configured commands, in order (a step
    /// kept pending from before the restart is pending no more: this run
    /// stands for it).
    RunCooling {
        /// The step.
        step: CoolingStep,
        /// Why, for the commands' `{reason}`.
        reason: String,
    },
    /// Log the command frame being handled to flash and wait until it is
    /// there; answer [`Input::Logged`].
    LogCommand,
    /// The pending command's effects are carried out: answer
    /// [`Input::Acknowledge`].
    Acknowledge,
    /// Publish this ack (its events follow).
    Ack(loopwarden_protocol::Ack),
}

/// What the node knows of one GPU's limit and guard.
#[derive(Debug, Clone)]
pub(crate) struct GpuCaps {
    setup: GpuSetup,
    guard: ThermalGuard,
    /// The limit read back after the last set (or at start); `None` when
    /// not known (never read, or the last read-back failed).
    applied: Option<Watts>,
    /// Whether `applied` was read back after a set as the limit asked
    /// (else it is the GPU's own, found under a set that did not take, or
    /// read).
    asked_back: bool,
    /// While the last read-back failed: the limit asked for and the one
    /// read before it, either of which the agent may have left on it.
    unconfirmed: Option<limits::Unconfirmed>,
    /// Who set it (`None`: nobody, or not as asked).
    source: Option<loopwarden_protocol::CapSource>,
    /// The limit it runs at uncapped, put back at a stop with no lease.
    ceiling: Watts,
    /// Whether `ceiling` was decided from a limit read from the GPU (else
    /// it is the kept, configured or default one, until a read).
    ceiling_read: bool,
    /// What the flash kept of it from before a restart.
    kept: Option<KeptLimit>,
    /// Whether what the flash kept of it could not be read (a damaged
    /// record, a lost config store): the first limit read is its ceiling
    /// then, said as an error, since it may be a cap left in force.
    kept_unreadable: bool,
    /// A target that could not be set, and when to try it again (steady
    /// ms).
    retry: Option<(Watts, u64)>,
    /// The limit a sample last saw in force above the one read back, that
    /// asked a read of every GPU's limit (asked once per figure).
    raised_seen: Option<Watts>,
    /// Samples missed in a row.
    missed: u32,
    /// Whether it was reported unresponsive.
    unresponsive_reported: bool,
}

impl GpuCaps {
    /// Whether `enforced`, the limit a sample saw in force on GPU `i`, is
    /// at least 1 W above the limit last read back: set outside the agent
    /// since (`nvidia-smi -pl`, a job's prolog), so every GPU's limit is to
    /// be read at this round's end. Asked once per enforced limit seen
    /// above it: a GPU that keeps reporting one above it (a driver that
    /// says otherwise than the read) is read again only when the figure
    /// changes. One below it (a board or firmware cap) asks nothing.
    fn raised_outside(&mut self, i: usize, enforced: f64, out: &mut Vec<Effect>) -> bool {
        let Some(applied) = self.applied else {
            return false;
        };
        // NaN (no figure) is not above.
        let above = enforced >= f64::from(applied.0) + 1.0;
        if !above {
            self.raised_seen = None;
            return false;
        }
        let seen = Watts(enforced as u32);
        if self.raised_seen == Some(seen) {
            return false;
        }
        self.raised_seen = Some(seen);
        out.push(Effect::Say(
            Level::Info,
            format!(
                "GPU {i}: {} W in force, above the {} W read back: its limit is read again",
                seen.0, applied.0
            ),
        ));
        true
    }
}

/// Every decision of the host agent (see the module note).
#[derive(Debug)]
pub struct Node {
    health: HealthEngine,
    commands: CommandCore,
    cooling: CoolingLoss,
    gpus: Vec<GpuCaps>,
    guard: GuardSettings,
    unresponsive_after: u32,
    coolant: Option<CoolantSource>,
    xid_watch_down: Option<TimestampMs>,
    xid_log: XidLog,
    rounds: u64,
    pending: Option<frames::Pending>,
    /// The rate limit on acks to refused commands.
    ack_limit: crate::ack_limit::AckLimit,
    /// Limits being set: the changes of source already known, and whether
    /// it is the stop's restoration.
    reconciling: Option<limits::Reconciling>,
    /// What waits for the read of the limits asked before a set.
    after_read: Option<limits::AfterRead>,
    /// Nothing kept survives a stop ([`Setup::volatile_state`]).
    volatile_state: bool,
}

impl Node {
    /// A node as `setup` says, every GPU healthy and uncapped.
    pub fn new(setup: Setup) -> Self {
        let ranges = setup
            .gpus
            .iter()
            .map(|g| GpuRange {
                min: g.range.min,
                max: limits::within(g, g.site_limit.unwrap_or(g.default_limit)),
            })
            .collect();
        let mut commands =
            CommandCore::with_limits(setup.own_cmd, ranges, setup.authority, setup.lease_limits);
        commands.set_started(setup.started);
        for (i, g) in setup.gpus.iter().enumerate() {
            commands.set_highest(gpu_index(i as u8), g.range.max);
        }
        let health = HealthEngine::new(
            setup.gpus.len(),
            setup.health_limits,
            setup.policy,
            setup.started,
        );
        let gpus = setup
            .gpus
            .iter()
            .map(|&g| GpuCaps {
                setup: g,
                guard: ThermalGuard::default(),
                applied: None,
                asked_back: false,
                unconfirmed: None,
                source: None,
                ceiling: limits::within(&g, g.site_limit.unwrap_or(g.default_limit)),
                ceiling_read: false,
                kept: None,
                kept_unreadable: false,
                retry: None,
                raised_seen: None,
                missed: 0,
                unresponsive_reported: false,
            })
            .collect();
        Self {
            health,
            commands,
            cooling: CoolingLoss::new(setup.cooling_grace_ms),
            gpus,
            guard: setup.guard,
            unresponsive_after: setup.policy.unresponsive_after,
            coolant: setup.coolant,
            xid_watch_down: None,
            xid_log: XidLog::default(),
            rounds: 0,
            pending: None,
            ack_limit: Default::default(),
            reconciling: None,
            after_read: None,
            volatile_state: setup.volatile_state,
        }
    }

    /// A lease or release logged before a restart, taken again at `now`
    /// (wall clock) if still valid; whether it was. `taken`: when it was
    /// taken (the log record's time). A lease taken back shortened or
    /// without some of its caps, or dropped though not expired, is said
    /// at the start ([`CommandCore::restore`]).
    pub fn restore_command(&mut self, now: TimestampMs, taken: TimestampMs, frame: &Frame) -> bool {
        self.commands.restore(now, taken, frame)
    }

    /// The floor of the commands taken from `sender` before a restart
    /// ([`Effect::KeepReplayFloor`]): what it sent at or below both its
    /// seq and its stamp is a replay.
    pub fn restore_replay_floor(
        &mut self,
        sender: &loopwarden_protocol::NodeId,
        floor: loopwarden_protocol::ReplayFloor,
    ) {
        self.commands.restore_replay_floor(sender, floor);
    }

    /// The last sequence number taken from `sender` before a restart, as
    /// an earlier version kept it (no stamp): what it sent at or below it
    /// is a replay, whatever its stamp, until a command above it is taken
    /// ([`CommandCore::restore_seq_floor`]).
    pub fn restore_seq_floor(&mut self, sender: &loopwarden_protocol::NodeId, seq: u32) {
        self.commands.restore_seq_floor(sender, seq);
    }

    /// The floor of the CDU's states taken before a restart, and the
    /// last one's seq and stamp ([`Effect::KeepStateFloor`]): a state at
    /// or below the floor is a replay, the last one a copy.
    pub fn restore_state_floor(
        &mut self,
        floor: loopwarden_protocol::ReplayFloor,
        last: (u32, TimestampMs),
    ) {
        self.commands.restore_state_floor(floor, last);
    }

    /// A GPU's health kept from before a restart.
    pub fn restore_health(&mut self, gpu: u8, status: GpuStatus) {
        self.health.restore(gpu, status);
    }

    /// What the flash kept of a GPU's limits from before a restart (the
    /// shell gives it only for the same GPU, by its UUID).
    pub fn restore_limit(&mut self, gpu: u8, kept: KeptLimit) {
        if let Some(g) = self.gpus.get_mut(gpu as usize) {
            g.kept = Some(kept);
            g.kept_unreadable = false;
            if let (false, Some(index)) = (g.ceiling_read, loopwarden_protocol::GpuIndex::new(gpu))
            {
                g.ceiling = limits::within(&g.setup, kept.ceiling);
                self.commands.set_ceiling(index, g.ceiling);
            }
        }
    }

    /// What the flash kept of a GPU's limits from before a restart could
    /// not be read: its ceiling is the first limit read from it, which
    /// may be a cap left in force, so that read is said as an error.
    pub fn restore_limit_unreadable(&mut self, gpu: u8) {
        if let Some(g) = self.gpus.get_mut(gpu as usize) {
            g.kept_unreadable = g.kept.is_none();
        }
    }

    /// Takes one input at `now`; returns what to do, in order.
    pub fn step(&mut self, now: Now, input: Input<'_>) -> Vec<Effect> {
        self.health.set_wall_offset(now.offset);
        self.commands.set_wall_offset(now.offset);
        let mut out = Vec::new();
        match input {
            Input::Start => {
                // Leases taken back otherwise than they were taken, or not.
                for line in self.commands.restore_notes() {
                    out.push(Effect::Say(Level::Warn, line));
                }
                self.resume_cooling(now, &mut out);
                out.push(Effect::ReadLimits);
            }
            Input::Round(readings) => self.round(now, readings, &mut out),
            Input::Frame(topic, frame) => self.frame(now, topic, frame, &mut out),
            Input::Xid { gpu, xid } => self.xid(now, gpu, xid, &mut out),
            Input::XidWatch(down) => self.xid_watch(now, down, &mut out),
            Input::Expiry => self.reconcile(now, false, &mut out),
            Input::Identified { gpu, kept, limit } => {
                self.identified(now, gpu, (kept, limit), &mut out)
            }
            Input::LimitsSet(results) => self.limits_set(now, results, &mut out),
            Input::LimitsRead(read) => {
                let read = self.limits_read(read, &mut out);
                self.read_done(now, &read, &mut out);
            }
            Input::Logged(result) => self.logged(result, &mut out),
            Input::Acknowledge => self.acknowledge(now, &mut out),
            Input::Stop => self.stop(&mut out),
        }
        out
    }

    /// A sampling round: the guard and the health engine take each
    /// answer; then the limits are put right, the cooling loss may move
    /// on, and now and then the health is published again.
    fn round(&mut self, now: Now, readings: &[Reading], out: &mut Vec<Effect>) {
        let t = now.steady;
        // A limit seen in force above the one read back asks a read.
        let mut raised = false;
        for (i, r) in readings.iter().enumerate().take(self.gpus.len()) {
            let gpu = i as u8;
            let outputs = match r {
                Reading::Pending => continue,
                &Reading::Sample {
                    observation,
                    temp,
                    power,
                } => {
                    let g = &mut self.gpus[i];
                    g.missed = 0;
                    if std::mem::take(&mut g.unresponsive_reported) {
                        out.push(Effect::Say(Level::Info, format!("GPU {i} answers again")));
                    }
                    let range = GpuRange {
                        min: g.min_cap(),
                        max: g.ceiling,
                    };
                    raised |= g.raised_outside(i, observation.power_limit, out);
                    let cap = g.guard.update(&self.guard, range, temp, power);
                    self.commands.guard(gpu_index(gpu), cap);
                    self.health.sample(t, gpu, &observation)
                }
                Reading::Missed(why) | Reading::Lost(why) => {
                    let g = &mut self.gpus[i];
                    g.missed += 1;
                    if g.missed >= self.unresponsive_after && !g.unresponsive_reported {
                        g.unresponsive_reported = true;
                        // Warn: a hardware fault found and handled; an
                        // error is what the agent fails to do itself.
                        out.push(Effect::Say(
                            Level::Warn,
                            format!(
                                "GPU {i} unresponsive: {} samples in a row missed ({why})",
                                g.missed
                            ),
                        ));
                    }
                    let mut outputs = match r {
                        Reading::Lost(_) => self.health.lost(t, gpu),
                        _ => Vec::new(),
                    };
                    outputs.extend(self.health.missed(t, gpu));
                    outputs
                }
            };
            self.health_outputs(outputs, out);
        }
        if raised || self.rounds % REREAD_EVERY == REREAD_EVERY - 1 {
            // The read's answer reconciles.
            out.push(Effect::ReadLimits);
        } else {
            self.reconcile(now, false, out);
        }
        self.cooling_round(now, out);
        if self.rounds % HEALTH_EVERY == 0 {
            out.push(Effect::PublishHealth);
        }
        self.rounds += 1;
    }

    /// Acks to refused commands withheld by the rate limit since start.
    pub fn acks_withheld(&self) -> u64 {
        self.ack_limit.withheld()
    }

    /// When the next lease lapses (steady time), if any.
    pub fn next_expiry(&self) -> Option<TimestampMs> {
        self.commands.next_expiry()
    }

    /// Every lease in force.
    pub fn leases(&self) -> Vec<LeaseView> {
        self.commands.leases()
    }

    /// The health engine (read only).
    pub fn health(&self) -> &HealthEngine {
        &self.health
    }

    /// The cooling-loss phase.
    pub fn cooling_phase(&self) -> Phase {
        self.cooling.phase()
    }

    /// Whether the cooling-loss phase kept before the restart could not be
    /// read back and the CDU has not said yet (the phase then reads
    /// cooled, and is not known to be).
    pub fn cooling_unknown(&self) -> bool {
        self.cooling.is_unknown()
    }

    /// Since when the XID watch has been down, if it is (wall clock).
    pub fn xid_watch_down(&self) -> Option<TimestampMs> {
        self.xid_watch_down
    }

    /// One GPU's health as the bus carries it.
    pub fn gpu_health(&self, gpu: u8) -> GpuHealth {
        let st = self.health.status(gpu).expect("one status per GPU");
        GpuHealth {
            gpu: gpu_index(gpu),
            state: st.state,
            reason: st.reason,
            since: st.since,
            evidence: Text::truncated(&st.evidence),
        }
    }

    /// The host's retained health: every GPU's, and what the host cannot
    /// see (a stall, the XID watch down).
    pub fn host_health(&self) -> HostHealth {
        let mut health = HostHealth {
            gpus: heapless::Vec::new(),
            monitoring: Monitoring {
                stalled_since: self.health.stalled_since(),
                xid_watch_down_since: self.xid_watch_down,
            },
        };
        for i in 0..self.gpus.len() {
            let _ = health.gpus.push(self.gpu_health(i as u8));
        }
        health
    }

    /// How many GPUs.
    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    /// Whether the node has no GPU.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// A GPU's ceiling: the limit it runs at uncapped.
    pub fn ceiling(&self, gpu: u8) -> Option<Watts> {
        self.gpus.get(gpu as usize).map(|g| g.ceiling)
    }

    /// A GPU's limit as last read back, and who set it.
    pub fn applied(&self, gpu: u8) -> (Option<Watts>, Option<loopwarden_protocol::CapSource>) {
        self.gpus
            .get(gpu as usize)
            .map_or((None, None), |g| (g.applied, g.source))
    }

    /// A GPU's thermal-guard cap, if it caps.
    pub fn guard_cap(&self, gpu: u8) -> Option<Watts> {
        self.gpus.get(gpu as usize).and_then(|g| g.guard.cap())
    }

    /// A GPU's samples missed in a row, and whether it was reported
    /// unresponsive.
    pub fn missed(&self, gpu: u8) -> (u32, bool) {
        self.gpus
            .get(gpu as usize)
            .map_or((0, false), |g| (g.missed, g.unresponsive_reported))
    }
}

/// GPU `i`'s index on the bus.
fn gpu_index(i: u8) -> loopwarden_protocol::GpuIndex {
    loopwarden_protocol::GpuIndex::new(i).expect("at most 16 GPUs")
}

/// Pushes `effects` onto a queue's front, in order: what an answer leads
/// to is done before what was queued after the effect it answers.
pub fn push_front(queue: &mut VecDeque<Effect>, effects: Vec<Effect>) {
    for e in effects.into_iter().rev() {
        queue.push_front(e);
    }
}
