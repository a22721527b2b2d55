//! One policy's replay of one trial: where each second of the run goes.
//!
//! The job is either running or down. Running, it goes round its
//! checkpoint interval: `L − W` seconds of training, then `W` of writing,
//! and the interval's training becomes progress when the write ends.
//! A failure while running loses the interval so far (rework) and takes the
//! job down; a drain waits for the end of a write, so it loses nothing. A
//! stretch down is a row of segments: detection (the collective timeout, or
//! the agent's latency where its quarantine ends the job), triage (in
//! detection), waiting for a spare, and the restart. A failure that strikes
//! while the job is down cuts the row where it strikes and starts its own;
//! the new row's restart still waits for every host an earlier row was
//! waiting for. Every second from 0 to the end of the run lands in exactly
//! one place, so progress and the parts of [`Lost`] add up to the
//! wall-clock time.
//!
//! A false quarantine (a healthy GPU the agent quarantines) keeps its host
//! out of the next restart under both agent policies: the agent's host is
//! left out when the next failure's row restarts, the drain policy's at
//! its drain. Where the quarantine ends the job, it also stops the job at
//! once, as a failure would. So does a failing GPU's quarantine before it
//! strikes (a flag the precursor says is a quarantine) under both agent
//! policies: the work since the checkpoint and the restart, charged to its
//! class, instead of a drain at the next write; the failure itself is not
//! played, and the stop counts as an interruption (a *quarantine stop*).
//! Reactive handling has no agent to quarantine.
//!
//! Glossary:
//! - *cause*: what a lost second is charged to: a class of the mix, a
//!   false alarm (a false degrade or a false quarantine), or the
//!   checkpoints themselves.
//! - *entry*: a failure, a false alarm or a false quarantine, numbered in
//!   that order.
//! - *pending*: flagged GPUs not yet drained; drained together at the end
//!   of the next write. A GPU flagged while the job is down, before its
//!   restart begins, is left out of that restart instead: its host takes
//!   a spare, and it costs nothing more unless the restart must wait
//!   longer for that spare.
//! - *quarantine stop*: a failing GPU's quarantine that ends the job
//!   before it strikes: unplanned, so an interruption, never a failure
//!   averted.
//! - *held*: hosts the agent quarantined while the job ran on them; the
//!   job keeps them until its next restart, which leaves them out.
//! - *spare pool*: spare hosts free now, and failed hosts in repair that
//!   come back to it.
//! - *hosts ready*: when the job last had, or will next have, every host
//!   it needs: the latest spare taken so far.

use super::draws::{Draws, Failure};
use super::{Job, Lost, Mix, Onset, Settings};

/// A way of handling failures (`docs/goodput.md` section 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// A crash is found at once, a hang at the collective timeout; a
    /// person or a script excludes the host.
    Reactive,
    /// What a host sees is found in the agent's detection latency, and
    /// the host is excluded automatically.
    Agent,
    /// The agent, and a flagged GPU drained at the end of the next write.
    AgentDrain,
}

impl Policy {
    /// The three, in the report's order.
    pub const ALL: [Policy; 3] = [Policy::Reactive, Policy::Agent, Policy::AgentDrain];

    /// Its name in the report and the JSON summary.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Reactive => "reactive",
            Policy::Agent => "agent",
            Policy::AgentDrain => "agent_drain",
        }
    }
}

/// What one trial came to under one policy, GPU-hours and counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// The run's wall-clock time × GPUs.
    pub wall_gpu_h: f64,
    /// Training kept.
    pub progress_gpu_h: f64,
    /// Everything else, by part.
    pub lost: Lost,
    /// The same, by cause: the mix's classes in order, then false alarms
    /// (false quarantines among them), then checkpoints.
    pub lost_by_cause: Vec<f64>,
    /// Unplanned stops for a failing GPU: failures that struck, and
    /// failing GPUs' quarantines that ended the job before they struck
    /// (those also in `quarantine_stops`). A false quarantine's stop is in
    /// `false_quarantines`.
    pub interruptions: u32,
    /// The same, by class of the mix.
    pub interruptions_by_class: Vec<u32>,
    /// Failing GPUs whose quarantine ended the job before they struck
    /// (`--quarantine-ends-job`): unplanned stops, counted in
    /// `interruptions` too, not among the failures averted.
    pub quarantine_stops: u32,
    /// Planned restarts (drains).
    pub drains: u32,
    /// Failures drained, or left out of a restart, before they struck:
    /// no stop of their own.
    pub failures_averted: u32,
    /// False alarms drained or excluded.
    pub false_alarms: u32,
    /// False quarantines acted on: hosts left out of a restart or
    /// drained, and jobs a quarantine ended.
    pub false_quarantines: u32,
    /// Restarts that waited for a spare host (a row cut by a failure
    /// during the wait counts again).
    pub spare_waits: u32,
}

impl Outcome {
    /// Effective training time: progress / wall.
    pub fn ett(&self) -> f64 {
        self.progress_gpu_h / self.wall_gpu_h
    }
}

/// A segment of a stretch down.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Detection,
    Spares,
    Restart,
    Drain,
}

/// What has become of a failure or a false alarm.
#[derive(Clone, Copy, PartialEq)]
enum Fate {
    Live,
    Pending,
    Averted,
    Struck,
}

/// Spare hosts free and hosts in repair.
struct Pool {
    free: u32,
    back_at: Vec<f64>,
    repair_s: f64,
}

impl Pool {
    /// A failed host goes to repair at `t`.
    fn send(&mut self, t: f64) {
        self.back_at.push(t + self.repair_s);
    }

    /// The time from `t` a spare host is in hand (`t` if one is free).
    fn take(&mut self, t: f64) -> f64 {
        let before = self.back_at.len();
        self.back_at.retain(|&b| b > t);
        self.free += (before - self.back_at.len()) as u32;
        if self.free > 0 {
            self.free -= 1;
            return t;
        }
        let (i, &first) = self
            .back_at
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .expect("the failed host is in repair");
        self.back_at.swap_remove(i);
        first
    }
}

/// The replay's state; seconds throughout, GPU-hours only at the end.
struct Replay<'a> {
    job: &'a Job,
    settings: &'a Settings,
    mix: &'a Mix,
    policy: Policy,
    t: f64,
    /// Running: seconds into the current interval.
    pos: f64,
    /// Down: its segments (end, part), from `t` on.
    down: Vec<(f64, Part)>,
    /// Down: who the segments are charged to.
    causes: Vec<usize>,
    pool: Pool,
    /// When every host the job needs is in hand (the latest spare that
    /// had to be waited for); a restart does not begin before it.
    hosts_ready_at: f64,
    /// Who the wait to `hosts_ready_at` is charged to: the causes of the
    /// row that last made it later.
    ready_causes: Vec<usize>,
    /// Down: who the row's wait for a spare is charged to where it only
    /// carries on an earlier row's wait; empty: the row's causes.
    spare_causes: Vec<usize>,
    /// Down: when the open row's failure is found (its detection ends).
    found_at: f64,
    fate: Vec<Fate>,
    /// Each failure's class, by index.
    class_of: Vec<usize>,
    /// Whether each failure's flag is a quarantine, by index.
    quarantined: Vec<bool>,
    /// The first false quarantine's entry.
    first_quarantine: usize,
    pending: Vec<usize>,
    /// Hosts quarantined and still in the job, left out of its next
    /// restart.
    held: Vec<usize>,
    drain_at: Option<f64>,
    out: Outcome,
    progress_s: f64,
    lost_s: Lost,
    by_cause_s: Vec<f64>,
}

/// Replays one trial's draws under `policy`.
pub fn replay(job: &Job, settings: &Settings, mix: &Mix, policy: Policy, d: &Draws) -> Outcome {
    let mut r = Replay::new(job, settings, mix, policy, d);
    let flags = flags(d, policy, settings.quarantine_ends_job);
    r.play(d, &flags);
    r.finish()
}

/// Every flag `policy` acts on, in time order: (time, entry). Reactive
/// handling acts on none; the agent on its false quarantines, and on a
/// failing GPU's quarantine where the quarantine ends the job (a degraded
/// GPU stays in service, and a failing GPU's other flags are the drain
/// policy's business); the drain policy on every flag.
fn flags(d: &Draws, policy: Policy, quarantine_ends_job: bool) -> Vec<(f64, usize)> {
    let n = d.failures.len();
    let q0 = n + d.false_alarms.len();
    let quarantines = d
        .false_quarantines
        .iter()
        .enumerate()
        .map(move |(i, &t)| (t, q0 + i));
    let mut f: Vec<(f64, usize)> = match policy {
        Policy::Reactive => return Vec::new(),
        Policy::Agent => d
            .failures
            .iter()
            .enumerate()
            .filter(|(_, x)| x.quarantined && quarantine_ends_job)
            .filter_map(|(i, x)| x.flagged_at_s.map(|t| (t, i)))
            .chain(quarantines)
            .collect(),
        Policy::AgentDrain => d
            .failures
            .iter()
            .enumerate()
            .filter_map(|(i, x)| x.flagged_at_s.map(|t| (t, i)))
            .chain(d.false_alarms.iter().enumerate().map(|(i, &t)| (t, n + i)))
            .chain(quarantines)
            .collect(),
    };
    f.sort_by(|a, b| a.0.total_cmp(&b.0));
    f
}

/// Why a row's restart came to wait longer for hosts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Wait {
    /// It does not.
    No,
    /// For a spare its own hosts had to wait for.
    Own,
    /// For hosts an earlier row was still waiting for.
    Carried,
}

/// What happens next in a replay.
enum Next {
    End,
    DownEnds(f64),
    Drain(f64),
    Flag(f64, usize),
    Fails(usize),
}

impl<'a> Replay<'a> {
    /// The job running from 0, the pool full, nothing flagged.
    fn new(job: &'a Job, settings: &'a Settings, mix: &'a Mix, policy: Policy, d: &Draws) -> Self {
        Replay {
            job,
            settings,
            mix,
            policy,
            t: 0.0,
            pos: 0.0,
            down: Vec::with_capacity(4),
            causes: Vec::new(),
            pool: Pool {
                free: job.spare_hosts,
                back_at: Vec::new(),
                repair_s: job.repair_hours * 3600.0,
            },
            hosts_ready_at: 0.0,
            ready_causes: Vec::new(),
            spare_causes: Vec::new(),
            found_at: 0.0,
            fate: vec![
                Fate::Live;
                d.failures.len() + d.false_alarms.len() + d.false_quarantines.len()
            ],
            class_of: d.failures.iter().map(|f| f.class).collect(),
            quarantined: d.failures.iter().map(|f| f.quarantined).collect(),
            first_quarantine: d.failures.len() + d.false_alarms.len(),
            pending: Vec::new(),
            held: Vec::new(),
            drain_at: None,
            out: Outcome {
                interruptions_by_class: vec![0; mix.classes.len()],
                ..Outcome::default()
            },
            progress_s: 0.0,
            lost_s: Lost::default(),
            by_cause_s: vec![0.0; mix.classes.len() + 2],
        }
    }

    /// The cause false alarms are charged to.
    fn false_alarm_cause(&self) -> usize {
        self.mix.classes.len()
    }

    /// Whether entry `e` is a false quarantine.
    fn is_false_quarantine(&self, e: usize) -> bool {
        e >= self.first_quarantine
    }

    /// Whether entry `e`'s flag is a quarantine: a false one, or a failing
    /// GPU's quarantined before it strikes.
    fn is_quarantine(&self, e: usize) -> bool {
        self.is_false_quarantine(e) || self.quarantined.get(e) == Some(&true)
    }

    /// The cause checkpoint writes are charged to.
    fn checkpoint_cause(&self) -> usize {
        self.mix.classes.len() + 1
    }

    /// Plays the trial's failures and `flags` to the end of the run.
    fn play(&mut self, d: &Draws, flags: &[(f64, usize)]) {
        let (mut fi, mut qi) = (0, 0);
        loop {
            while fi < d.failures.len() && self.fate[fi] == Fate::Averted {
                fi += 1;
            }
            match self.next(d, fi, flags.get(qi)) {
                Next::End => return,
                Next::DownEnds(at) => self.resume(at),
                Next::Drain(at) => self.drain(at),
                Next::Flag(at, e) => {
                    qi += 1;
                    self.flag(at, e);
                }
                Next::Fails(i) => {
                    fi += 1;
                    self.fail(i, &d.failures[i]);
                }
            }
        }
    }

    /// The earliest thing to happen before the end of the run.
    fn next(&self, d: &Draws, fi: usize, flag: Option<&(f64, usize)>) -> Next {
        let mut best = (self.job.horizon_s(), Next::End);
        let mut consider = |at: f64, n: Next| {
            if at < best.0 {
                best = (at, n);
            }
        };
        if let Some(f) = d.failures.get(fi) {
            consider(f.at_s, Next::Fails(fi));
        }
        if let Some(&(at, e)) = flag {
            consider(at.max(self.t), Next::Flag(at.max(self.t), e));
        }
        if let Some(&(end, _)) = self.down.last() {
            consider(end, Next::DownEnds(end));
        } else if let Some(at) = self.drain_at {
            consider(at, Next::Drain(at));
        }
        best.1
    }

    /// Runs from `self.t` to `to`: whole intervals become progress and
    /// checkpoint writes; the open one stays open at `self.pos`.
    fn run_to(&mut self, to: f64) {
        let l = self.job.interval_s();
        let total = self.pos + (to - self.t);
        // An interval that ends at `to` ends there, rounding aside.
        let n = (total / l + 1e-9).floor();
        self.progress_s += n * self.job.work_s();
        let writes = n * self.job.checkpoint_write_s;
        self.lost_s.checkpoints += writes;
        let c = self.checkpoint_cause();
        self.by_cause_s[c] += writes;
        self.pos = (total - n * l).max(0.0);
        self.t = to;
    }

    /// Charges the down segments up to `to` and drops what is charged.
    fn down_to(&mut self, to: f64) {
        let mut from = self.t;
        let mut kept = 0;
        for k in 0..self.down.len() {
            let (end, part) = self.down[k];
            let s = end.min(to) - from;
            if s > 0.0 {
                self.charge(part, s);
            }
            from = from.max(end);
            if end > to {
                self.down[kept] = (end, part);
                kept += 1;
            }
        }
        self.down.truncate(kept);
        self.t = to;
    }

    /// Charges `s` seconds of `part`, shared by the row's causes (a wait
    /// carried on from an earlier row by that wait's causes).
    fn charge(&mut self, part: Part, s: f64) {
        match part {
            Part::Detection => self.lost_s.detection += s,
            Part::Spares => self.lost_s.spares += s,
            Part::Restart => self.lost_s.restart += s,
            Part::Drain => self.lost_s.drains += s,
        }
        let who = if part == Part::Spares && !self.spare_causes.is_empty() {
            &self.spare_causes
        } else {
            &self.causes
        };
        let share = s / who.len() as f64;
        for &c in who {
            self.by_cause_s[c] += share;
        }
    }

    /// Moves the clock to `at`, running or down.
    fn advance(&mut self, at: f64) {
        if self.down.is_empty() {
            self.run_to(at);
        } else {
            self.down_to(at);
        }
    }

    /// The restart ends at `at`: the job runs a fresh interval, and GPUs
    /// flagged during the restart are drained at the end of its write.
    fn resume(&mut self, at: f64) {
        self.down_to(at);
        self.pos = 0.0;
        if !self.pending.is_empty() {
            self.drain_at = Some(at + self.job.interval_s());
        }
    }

    /// A GPU is flagged at `at`: left out of the restart ahead if the job
    /// is down and its restart has not begun. Else a quarantine (false, or
    /// of a failing GPU) ends the job where the quarantine does so, and
    /// otherwise the agent keeps
    /// the host out of the next restart; the drain policy drains a flag at
    /// the end of the next write.
    fn flag(&mut self, at: f64, e: usize) {
        if self.fate[e] != Fate::Live {
            return;
        }
        self.advance(at);
        if self.restart_ahead() {
            self.exclude_from_restart(at, e);
            return;
        }
        if self.is_quarantine(e) && self.settings.quarantine_ends_job {
            self.quarantine_ends_job(at, e);
            return;
        }
        if self.policy == Policy::Agent {
            self.fate[e] = Fate::Pending;
            self.held.push(e);
            return;
        }
        self.fate[e] = Fate::Pending;
        self.pending.push(e);
        if self.down.is_empty() && self.drain_at.is_none() {
            self.drain_at = Some(at + (self.job.interval_s() - self.pos));
        }
    }

    /// Whether the job is down and its restart has not begun (the row
    /// still has its detection or its wait for a spare ahead).
    fn restart_ahead(&self) -> bool {
        self.down.iter().any(|&(_, p)| p == Part::Spares)
    }

    /// The end of a write with flagged GPUs: a planned restart without
    /// them.
    fn drain(&mut self, at: f64) {
        self.run_to(at);
        self.pos = 0.0;
        self.drain_at = None;
        self.causes.clear();
        let hosts = self.avert_pending();
        self.out.drains += 1;
        self.go_down(at, 0.0, hosts, Part::Drain);
    }

    /// Takes every pending GPU out, each one's cause charged with the
    /// planned restart; returns how many hosts leave for repair.
    fn avert_pending(&mut self) -> u32 {
        let mut hosts = 0;
        for e in std::mem::take(&mut self.pending) {
            let (h, cause) = self.avert(e);
            hosts += h;
            self.causes.push(cause);
        }
        hosts
    }

    /// Takes flagged entry `e` out before it strikes; returns how many
    /// hosts leave for repair (a false alarm's does; a failing GPU's as its
    /// class says) and its cause.
    fn avert(&mut self, e: usize) -> (u32, usize) {
        self.fate[e] = Fate::Averted;
        match self.class_of.get(e) {
            None if self.is_false_quarantine(e) => {
                self.out.false_quarantines += 1;
                (1, self.false_alarm_cause())
            }
            None => {
                self.out.false_alarms += 1;
                (1, self.false_alarm_cause())
            }
            Some(&c) => {
                self.out.failures_averted += 1;
                (u32::from(self.mix.classes[c].excludes_host), c)
            }
        }
    }

    /// A failure strikes: the job stops (see [`Replay::stop`]), without the
    /// failed host if its class takes one out.
    fn fail(&mut self, i: usize, f: &Failure) {
        if self.fate[i] == Fate::Pending {
            self.pending.retain(|&e| e != i);
        }
        self.advance(f.at_s);
        self.fate[i] = Fate::Struck;
        self.out.interruptions += 1;
        self.out.interruptions_by_class[f.class] += 1;
        let class = &self.mix.classes[f.class];
        let (excludes, detect) = (class.excludes_host, self.detection_s(f.class));
        self.stop(f.at_s, f.class, detect, u32::from(excludes));
    }

    /// A quarantine ends the job at `at` (the clock there), as a failure
    /// found at once would, its host out: a healthy GPU's is charged to
    /// false alarms; a failing GPU's to its class, an unplanned stop
    /// counted as an interruption and a quarantine stop (it costs the
    /// rework to `at` and the restart, not the failure's own detection
    /// and rework, which is not played).
    fn quarantine_ends_job(&mut self, at: f64, e: usize) {
        let cause = match self.class_of.get(e) {
            Some(&c) => {
                self.fate[e] = Fate::Averted;
                self.out.interruptions += 1;
                self.out.interruptions_by_class[c] += 1;
                self.out.quarantine_stops += 1;
                c
            }
            None => {
                self.fate[e] = Fate::Struck;
                self.out.false_quarantines += 1;
                self.false_alarm_cause()
            }
        };
        self.stop(at, cause, 0.0, 1);
    }

    /// The job stops at `at` for `cause`, unplanned: the interval so far is
    /// lost if the job was running, and a new row begins, found `detect`
    /// later, without `hosts` hosts and without every GPU flagged and not
    /// yet drained or quarantined and still held.
    fn stop(&mut self, at: f64, cause: usize, detect: f64, hosts: u32) {
        self.causes.clear();
        self.causes.push(cause);
        if self.down.is_empty() {
            self.lost_s.rework += self.pos;
            self.by_cause_s[cause] += self.pos;
            self.pos = 0.0;
        }
        self.drain_at = None;
        self.go_down(at, detect, hosts, Part::Restart);
        // Flagged and quarantined GPUs go out in the same restart.
        let out: Vec<usize> = std::mem::take(&mut self.pending)
            .into_iter()
            .chain(std::mem::take(&mut self.held))
            .collect();
        for e in out {
            self.exclude_from_restart(self.found_at, e);
        }
    }

    /// Leaves flagged entry `e` out of the open row's restart: its host
    /// leaves for repair at `at` (not before the row's failure is found)
    /// and takes a spare. It costs nothing unless the restart must wait
    /// longer for that spare; then its cause shares the rest of the row.
    fn exclude_from_restart(&mut self, at: f64, e: usize) {
        let (hosts, cause) = self.avert(e);
        let wait = self.replace_hosts(at.max(self.found_at), hosts);
        if wait != Wait::No {
            self.causes.push(cause);
        }
        self.settle(wait);
    }

    /// From `at`: detection (`detect`), the wait for a spare for each of
    /// `hosts` and for any host an earlier row was still waiting for, then
    /// the restart (`part`).
    fn go_down(&mut self, at: f64, detect: f64, hosts: u32, part: Part) {
        let found = at + detect;
        self.found_at = found;
        self.down.clear();
        self.down.push((found, Part::Detection));
        self.down.push((found, Part::Spares));
        self.down.push((found + self.job.restart_min * 60.0, part));
        self.t = at;
        self.spare_causes.clear();
        let wait = self.replace_hosts(found, hosts);
        self.settle(wait);
    }

    /// `hosts` leave for repair at `at` and each takes a spare; the open
    /// row's restart waits until every host is in hand, its own and any an
    /// earlier row was still waiting for. Only a spare not free at `at`
    /// makes `hosts_ready_at` later. Returns why the row now waits longer.
    fn replace_hosts(&mut self, at: f64, hosts: u32) -> Wait {
        for _ in 0..hosts {
            self.pool.send(at);
        }
        let mut own = f64::NEG_INFINITY;
        for _ in 0..hosts {
            let got = self.pool.take(at);
            if got > at {
                own = own.max(got);
            }
        }
        if own > self.hosts_ready_at {
            self.hosts_ready_at = own;
            if self.delay_restart_to(own) {
                return Wait::Own;
            }
        }
        if self.delay_restart_to(self.hosts_ready_at) {
            return Wait::Carried;
        }
        Wait::No
    }

    /// Settles who the open row's wait is charged to, once its causes are
    /// in: a wait of its own makes its causes those of `hosts_ready_at`; a
    /// wait carried on from an earlier row stays that row's causes', and
    /// they share the rest of this row.
    fn settle(&mut self, wait: Wait) {
        match wait {
            Wait::No => {}
            Wait::Own => {
                self.spare_causes.clear();
                self.ready_causes = self.causes.clone();
            }
            Wait::Carried => {
                for &c in &self.ready_causes {
                    if !self.causes.contains(&c) {
                        self.causes.push(c);
                    }
                }
                self.spare_causes = self.ready_causes.clone();
            }
        }
    }

    /// Moves the open row's restart to begin at `ready` if that is later
    /// than planned (counting the row's wait for a spare once); returns
    /// whether it moved.
    fn delay_restart_to(&mut self, ready: f64) -> bool {
        let Some(k) = self.down.iter().position(|&(_, p)| p == Part::Spares) else {
            return false;
        };
        let planned = self.down[k].0;
        if ready <= planned {
            return false;
        }
        if planned <= self.found_at {
            self.out.spare_waits += 1;
        }
        self.down[k].0 = ready;
        let last = self.down.len() - 1;
        self.down[last].0 = ready + self.job.restart_min * 60.0;
        true
    }

    /// Seconds from a failure of `class` to the job stopped and knowing
    /// which host to leave out. A hang stops the job at the collective
    /// timeout, or sooner where the agent sees it and the site's
    /// quarantine action ends the job; without an agent that names the
    /// host, triage follows.
    fn detection_s(&self, class: usize) -> f64 {
        let c = &self.mix.classes[class];
        let s = self.settings;
        let named = self.policy != Policy::Reactive && c.host_visible;
        let timeout = s.hang_timeout_min * 60.0;
        let stopped = match c.onset {
            Onset::Crash => 0.0,
            Onset::Hang if named && s.quarantine_ends_job => s.detection_s.min(timeout),
            Onset::Hang => timeout,
        };
        let triage = if named { 0.0 } else { s.triage_min * 60.0 };
        stopped + triage
    }

    /// Runs to the end of the run and turns seconds into GPU-hours.
    fn finish(mut self) -> Outcome {
        let h = self.job.horizon_s();
        if self.down.is_empty() {
            self.run_to(h);
            let work = self.pos.min(self.job.work_s());
            self.progress_s += work;
            let write = self.pos - work;
            self.lost_s.checkpoints += write;
            let c = self.checkpoint_cause();
            self.by_cause_s[c] += write;
        } else {
            self.down_to(h);
        }
        let k = f64::from(self.job.gpus) / 3600.0;
        self.out.wall_gpu_h = h * k;
        self.out.progress_gpu_h = self.progress_s * k;
        self.out.lost = self.lost_s.scaled(k);
        self.out.lost_by_cause = self.by_cause_s.iter().map(|s| s * k).collect();
        self.out
    }
}
