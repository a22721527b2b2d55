//! The devices' liveness: each one's record, when it is declared dead
//! for silence or for frames the Loopwarden client lost, and which frames
//! are refused.

use loopwarden_protocol::{Family, Frame, Ident, Message, Role, Topic};

use super::{Bridge, Notice, Publish};
use crate::device::View;
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
    /// application knows it, and every round of births says it is dead
    /// while it is.
    pub(super) ever_born: bool,
    /// When a frame of it was last accepted (the bridge's clock).
    pub(super) last_heard: u64,
    /// When its last sample came, and the gap before it, while alive.
    pub(super) sampled_at: Option<u64>,
    pub(super) sample_gap: Option<u64>,
    /// A node of another role used its id: said once.
    pub(super) id_shared_told: bool,
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
            last_heard: now,
            sampled_at: None,
            sample_gap: None,
            id_shared_told: false,
        }
    }

    /// A frame of it was accepted at `now`; `sample`: its telemetry.
    pub(super) fn heard(&mut self, now: u64, sample: bool) {
        self.last_heard = now;
        if sample {
            self.sample_gap = self.sampled_at.map(|t| now.saturating_sub(t));
            self.sampled_at = Some(now);
        }
    }

    /// How long it may go unheard: its role's limit, or 3 × the gap
    /// between its last two samples if longer (an agent set to sample
    /// slowly is not declared dead between two samples).
    pub(super) fn silence_limit(&self, host: u64, cdu: u64) -> u64 {
        let base = if self.role == Role::Cdu { cdu } else { host };
        self.sample_gap
            .map_or(base, |gap| base.max(gap.saturating_mul(3)))
    }
}

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

pub(super) fn notice_refused(topic: &Topic, frame: &Frame, why: String) -> Notice {
    Notice::FrameRefused {
        topic: topic.to_string(),
        sender: frame.sender.to_string(),
        why,
    }
}

impl Bridge {
    /// Every device dead (DDEATH for those born), until heard again.
    pub(super) fn forget_devices(&mut self, now: u64) -> Vec<Publish> {
        let ids: Vec<Ident> = self.devices.keys().cloned().collect();
        let mut out = Vec::new();
        for id in ids {
            out.extend(self.ddeath(now, &id));
            if let Some(d) = self.devices.get_mut(&id) {
                d.alive = None;
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

    /// The devices unheard past their silence limit: each dies (DDEATH
    /// if born) and is born again when heard.
    pub(super) fn silences(&mut self, now: u64) -> Vec<Publish> {
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
            out.extend(self.ddeath(now, &id));
            if let Some(d) = self.devices.get_mut(&id) {
                d.alive = None;
            }
            let device = id.as_str().to_string();
            self.notify(Notice::Silent { device, for_ms });
        }
        out
    }
}
