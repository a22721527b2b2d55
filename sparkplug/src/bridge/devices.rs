//! The devices' liveness: each one's record, when it is declared dead
//! for silence or for frames the Loopwarden client lost, and which frames
//! are refused.

use loopwarden_protocol::{Family, Frame, Ident, Message, ReasonCode, Role, Topic};

use super::{Bridge, Notice, Now, Publish};
use crate::device::{gpu_fields_past_any, View};
use crate::payload::Point;

/// One Loopwarden node as a Sparkplug device.
pub(super) struct Device {
    pub(super) role: Role,
    pub(super) view: View,
    /// What its `online` said last (`None`: nothing yet). While it says
    /// false, the node's measurements are not kept.
    pub(super) alive: Option<bool>,
    /// What was last published of it in this session, if born.
    pub(super) published: Option<Vec<Point>>,
    /// It was born at least once since the bridge started: a host
    /// application knows it, and a round of births says it is dead while
    /// it is, until it is forgotten (see [`Bridge::deaths_to_say`]).
    pub(super) ever_born: bool,
    /// A round of births said its death since it was last born, and that
    /// DDEATH was not among the publishes dropped.
    pub(super) death_said: bool,
    /// When a frame of it was last accepted (the bridge's monotonic clock).
    pub(super) last_heard: u64,
    /// Its pace: when its last sample (telemetry) came, the gap before
    /// it, and whether it was absent since (declared dead of silence, or
    /// said `online: false`). Kept when it dies for silence, so that the
    /// sample that births it again measures the gap from the one before
    /// the death; such a gap is its pace only while none is known.
    pub(super) sampled_at: Option<u64>,
    pub(super) sample_gap: Option<u64>,
    pub(super) absent_since_sample: bool,
    /// A gap across an absence while a pace was known, not taken yet: the
    /// next such gap like it is the new pace (an agent set to sample more
    /// slowly dies once or twice, then keeps its new pace).
    pub(super) sample_candidate: Option<u64>,
    /// The same for its states (a CDU's) or health (a host's).
    pub(super) stated_at: Option<u64>,
    pub(super) state_gap: Option<u64>,
    pub(super) absent_since_state: bool,
    pub(super) state_candidate: Option<u64>,
    /// Its latest state says its controller is silent: it sends states,
    /// and no telemetry, until the controller is back.
    pub(super) controller_silent: bool,
    /// A node of another role used its id: said once.
    pub(super) id_shared_told: bool,
    /// The GPU figures past any GPU's in its latest sample (GPU, field):
    /// said when they change.
    pub(super) fields_past_any: Vec<(u8, &'static str)>,
}

impl Device {
    pub(super) fn new(role: Role, now: u64) -> Self {
        Device {
            role,
            view: if role == Role::Cdu {
                View::cdu()
            } else {
                View::host()
            },
            alive: None,
            published: None,
            ever_born: false,
            death_said: false,
            last_heard: now,
            sampled_at: None,
            sample_gap: None,
            absent_since_sample: false,
            sample_candidate: None,
            stated_at: None,
            state_gap: None,
            absent_since_state: false,
            state_candidate: None,
            controller_silent: false,
            id_shared_told: false,
            fields_past_any: Vec::new(),
        }
    }

    /// A frame of it was accepted at `now`: each frame restarts its
    /// silence; a sample or a state also tells its pace.
    pub(super) fn heard(&mut self, now: u64, what: Heard) {
        self.last_heard = now;
        match what {
            Heard::Presence => {}
            Heard::Sample => {
                let absent = std::mem::take(&mut self.absent_since_sample);
                let stream = (&mut self.sampled_at, &mut self.sample_gap);
                pace(stream, &mut self.sample_candidate, absent, now);
                self.controller_silent = false;
            }
            Heard::State { controller_silent } => {
                let absent = std::mem::take(&mut self.absent_since_state);
                let stream = (&mut self.stated_at, &mut self.state_gap);
                pace(stream, &mut self.state_candidate, absent, now);
                self.controller_silent = controller_silent;
            }
        }
    }

    /// It was absent (declared dead of silence, or said `online:
    /// false`): the next gaps span its absence, and tell its pace only
    /// while none is known (a slow sampler's first gap).
    pub(super) fn absent(&mut self) {
        (self.absent_since_sample, self.absent_since_state) = (true, true);
    }

    /// The bridge stopped listening (its bus lost, frames dropped): the
    /// next frames' gaps span that loss and say nothing of the device's
    /// pace, which is kept until two frames measure it again.
    pub(super) fn lost_sight(&mut self) {
        (self.sampled_at, self.stated_at) = (None, None);
    }

    /// How long it may go unheard: its role's limit, or 3 × the gap
    /// between its last two samples if longer (an agent set to sample
    /// slowly is not declared dead between two samples). A CDU whose
    /// controller is silent sends only states: at least
    /// [`CONTROLLER_SILENT_AFTER_MS`], or 1.5 × the gap between its last
    /// two states if longer (as that least is 1.5 × the gateway's period).
    pub(super) fn silence_limit(&self, host: u64, cdu: u64) -> u64 {
        let base = if self.role == Role::Cdu { cdu } else { host };
        let limit = base.max(self.sample_gap.map_or(0, |g| g.saturating_mul(3)));
        if self.controller_silent {
            let states = self.state_gap.map_or(0, |g| g.saturating_mul(3) / 2);
            limit.max(CONTROLLER_SILENT_AFTER_MS).max(states)
        } else {
            limit
        }
    }
}

/// What an accepted frame was, for a device's pace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Heard {
    /// Its `online: true`.
    Presence,
    /// Its telemetry.
    Sample,
    /// Its health (a host) or state (a CDU).
    State {
        /// The state says its controller is silent.
        controller_silent: bool,
    },
}

impl Heard {
    pub(super) fn of(message: &Message) -> Heard {
        match message {
            Message::HostTelemetry(_) | Message::CduTelemetry(_) => Heard::Sample,
            Message::CduState(s) => Heard::State {
                controller_silent: s.reason == ReasonCode::CONTROLLER_SILENT,
            },
            Message::HostHealth(_) => Heard::State {
                controller_silent: false,
            },
            _ => Heard::Presence,
        }
    }
}

/// The least silence limit of a CDU whose controller is silent, ms: its
/// gateway publishes its state (`failsafe`, `controller-silent`) about
/// once a minute and nothing else, so 1.5 × that minute.
pub const CONTROLLER_SILENT_AFTER_MS: u64 = 90_000;

/// The longest gap taken as a pace, ms: a longer one is an absence (a
/// node stopped, then started again), and leaves the pace learned before.
/// A device dead and unheard this long is forgotten, its pace kept for
/// when it is heard again (`bridge/paces.rs`).
pub const PACE_MAX_MS: u64 = 600_000;

/// A new frame of a stream (when its last came, and its pace) at `now`:
/// the gap from the one before, when it is one, becomes the stream's
/// pace. A gap across the device's absence does only while no pace is
/// known: it may be the absence, not the pace, of a device whose pace is
/// already learned; it is kept as a `candidate`, and a second such gap
/// within half to twice it is the new pace (the device's pace changed:
/// an agent set to sample more slowly).
fn pace(
    (at, gap): (&mut Option<u64>, &mut Option<u64>),
    candidate: &mut Option<u64>,
    absent: bool,
    now: u64,
) {
    let Some(before) = at.replace(now) else {
        return;
    };
    let g = now.saturating_sub(before);
    if g > PACE_MAX_MS {
        return;
    }
    if !absent || gap.is_none() {
        (*gap, *candidate) = (Some(g), None);
        return;
    }
    match candidate.take() {
        Some(c) if g >= c / 2 && g <= c.saturating_mul(2) => *gap = Some(g),
        _ => *candidate = Some(g),
    }
}

pub use crate::device::GPU_POWER_MAX_W;

/// Why a frame on `topic` is refused, if it is: sent by another node
/// than the one whose topic it is, or of the wrong kind for the topic.
pub(super) fn refusal(topic: &Topic, frame: &Frame) -> Option<String> {
    if frame.sender.role != topic.role || frame.sender.id != topic.node {
        return Some("sent by another node than the topic's".into());
    }
    let fits = matches!(
        (topic.role, topic.family, &frame.message),
        (Role::Host, Family::Telemetry, Message::HostTelemetry(_))
            | (Role::Host, Family::Health, Message::HostHealth(_))
            | (Role::Cdu, Family::Telemetry, Message::CduTelemetry(_))
            | (Role::Cdu, Family::Health, Message::CduState(_))
            | (Role::Host | Role::Cdu, Family::Online, Message::Online(_))
    );
    let kind = frame.message.kind();
    let family = topic.family.as_str();
    (!fits).then(|| {
        format!(
            "a {kind:?} message is not {family} of a {}",
            topic.role.as_str()
        )
    })
}

/// The GPU figures of a host's sample past any GPU's: `None` for a
/// message that is not a host's sample.
pub(super) fn fields_past_any(message: &Message) -> Option<Vec<(u8, &'static str, u32)>> {
    match message {
        Message::HostTelemetry(t) => Some(gpu_fields_past_any(t)),
        _ => None,
    }
}

pub(super) fn notice_refused(topic: &Topic, frame: &Frame, why: String) -> Notice {
    Notice::FrameRefused {
        topic: topic.to_string(),
        sender: frame.sender.to_string(),
        why,
    }
}

impl Bridge {
    /// Of the devices born before and dead now, those a round of births
    /// is to say dead again (so that a host application that missed a
    /// DDEATH does not show the device alive). One whose death a round
    /// said already (that DDEATH not dropped), and unheard for
    /// [`PACE_MAX_MS`] (longer than any pace) is forgotten instead: a
    /// site's churn does not grow every round past the queue sized for
    /// its devices. Its pace is kept: heard again, it is a new device
    /// with the pace it had (see [`super::paces`]).
    pub(super) fn deaths_to_say(&mut self, now: u64, dead: Vec<Ident>) -> Vec<Ident> {
        let mut say = Vec::with_capacity(dead.len());
        for id in dead {
            let Some(d) = self.devices.get_mut(&id) else {
                continue;
            };
            if d.death_said && now.saturating_sub(d.last_heard) >= PACE_MAX_MS {
                let pace = d.pace();
                self.devices.remove(&id);
                self.paces.keep(id, pace);
            } else {
                d.death_said = true;
                say.push(id);
            }
        }
        say
    }

    /// A host's sample held GPU figures past any GPU's (`bad`; `None`:
    /// not a sample), published null: each counted in
    /// `bridge/fields_refused`, and said when which they are changes (a
    /// host sends one a second).
    pub(super) fn gpu_fields(&mut self, id: &Ident, bad: Option<Vec<(u8, &'static str, u32)>>) {
        let (Some(bad), Some(d)) = (bad, self.devices.get_mut(id)) else {
            return;
        };
        self.counters.fields_refused += bad.len() as u64;
        let which: Vec<(u8, &'static str)> = bad.iter().map(|&(g, f, _)| (g, f)).collect();
        if d.fields_past_any == which {
            return;
        }
        d.fields_past_any = which;
        if bad.is_empty() {
            return;
        }
        let fields: Vec<String> = (bad.iter())
            .map(|(g, f, w)| format!("gpu {g} {f} {w} W"))
            .collect();
        let why = format!(
            "{} past any GPU's ({GPU_POWER_MAX_W} W): malformed, published null and left out of \
             the host's power_w",
            fields.join(", ")
        );
        let device = id.as_str().to_string();
        self.notify(Notice::FieldsRefused { device, why });
    }

    /// Every device dead (DDEATH for those born), until heard again.
    pub(super) fn forget_devices(&mut self, now: u64) -> Vec<Publish> {
        let ids: Vec<Ident> = self.devices.keys().cloned().collect();
        let mut out = Vec::new();
        for id in ids {
            out.extend(self.ddeath(now, &id));
            if let Some(d) = self.devices.get_mut(&id) {
                d.alive = None;
                d.lost_sight();
            }
        }
        out
    }

    /// The Loopwarden client's count of frames it had to drop: any of
    /// them may have been an `online: false` or a health change, so no
    /// device's view can be trusted. Each dies, and is born again with
    /// what it says next.
    pub(super) fn inbound_dropped(&mut self, now: u64, total: u64) -> Vec<Publish> {
        let before = self.counters.frames_dropped_inbound;
        if total <= before {
            return Vec::new();
        }
        self.counters.frames_dropped_inbound = total;
        let new = total - before;
        self.notify(Notice::InboundDropped { new, total });
        self.forget_devices(now)
    }

    /// The devices unheard past their silence limit (on the monotonic
    /// clock): each dies (DDEATH if born) and is born again when heard.
    pub(super) fn silences(&mut self, at: Now) -> Vec<Publish> {
        let now = at.mono;
        let (host, cdu) = (
            self.config.host_silent_after_ms,
            self.config.cdu_silent_after_ms,
        );
        let silent: Vec<(Ident, u64)> = (self.devices.iter())
            .filter(|(_, d)| d.view.has_data() && d.alive != Some(false))
            .map(|(id, d)| (id, d, now.saturating_sub(d.last_heard)))
            .filter(|(_, d, quiet)| *quiet > d.silence_limit(host, cdu))
            .map(|(id, _, quiet)| (id.clone(), quiet))
            .collect();
        let mut out = Vec::new();
        for (id, for_ms) in silent {
            self.counters.devices_silent += 1;
            out.extend(self.ddeath(at.wall, &id));
            if let Some(d) = self.devices.get_mut(&id) {
                d.alive = None;
                d.absent();
            }
            let device = id.as_str().to_string();
            self.notify(Notice::Silent { device, for_ms });
        }
        out
    }
}
