//! Topic names, built and parsed in one place.
//!
//! ```text
//! dc/v2/<site>/host/<id>/<family>        frames (postcard), agents' own tree
//! dc/v2/<site>/cdu/<id>/<family>
//! dc/v2/<site>/json/host/<id>/<family>   the JSON mirror for facility subscribers
//! dc/v2/<site>/json/cdu/<id>/<family>
//! ```
//!
//! Families: `telemetry`, `health`, `event`, `cmd`, `ack`, `online`. The
//! node named in the topic owns it: it publishes everything but `cmd`, which
//! others publish to it. `v2` is the protocol's major version.
//!
//! Glossary:
//! - *family*: the last topic level; it fixes the QoS and retention.
//! - *mirror*: the same message as JSON under `json/`, published by the
//!   agent itself so facility systems need no gateway.
//! - *filter*: a subscription pattern with MQTT wildcards (`+`, `#`).

use core::fmt::{self, Write};

use crate::ids::{Ident, IdentError, Role};

/// The first two levels of every topic.
pub const ROOT: &str = "dc/v2";
/// The longest topic or filter this module builds, in bytes.
pub const TOPIC_MAX: usize = 128;

/// A topic string.
pub type TopicString = heapless::String<TOPIC_MAX>;

/// MQTT quality of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Qos {
    /// At most once.
    AtMostOnce,
    /// At least once.
    AtLeastOnce,
}

/// The last level of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Periodic measurements. QoS 0, not retained: the next sample replaces a lost one.
    Telemetry,
    /// Current state. QoS 1, retained: a new subscriber learns it at once.
    Health,
    /// Things that happened. QoS 1, not retained.
    Event,
    /// Commands to the node. QoS 1, not retained.
    Cmd,
    /// Outcomes of commands. QoS 1, not retained.
    Ack,
    /// Alive or gone; the broker publishes the last will here. QoS 1, retained.
    Online,
    /// Requests to the node to publish its logged events again (readers
    /// that saw a gap). QoS 1, not retained.
    Resend,
    /// The node's logged event frames published again, unchanged, and its
    /// report on each request. QoS 1, not retained.
    Resent,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 8] = [
        Family::Telemetry,
        Family::Health,
        Family::Event,
        Family::Cmd,
        Family::Ack,
        Family::Online,
        Family::Resend,
        Family::Resent,
    ];

    /// The topic level.
    pub const fn as_str(self) -> &'static str {
        match self {
            Family::Telemetry => "telemetry",
            Family::Health => "health",
            Family::Event => "event",
            Family::Cmd => "cmd",
            Family::Ack => "ack",
            Family::Online => "online",
            Family::Resend => "resend",
            Family::Resent => "resent",
        }
    }

    /// The QoS every publisher uses for this family.
    pub const fn qos(self) -> Qos {
        match self {
            Family::Telemetry => Qos::AtMostOnce,
            _ => Qos::AtLeastOnce,
        }
    }

    /// The QoS the agents subscribe with. Their sessions are clean (a
    /// broker keeps nothing for them while they are away), so QoS 1 on a
    /// subscription only asks the broker to queue rather than drop for a
    /// slow reader, and some brokers keep replicated state for each QoS 1
    /// subscription (NATS: a JetStream consumer). Frames that are renewed
    /// (telemetry every period; health and presence retained and
    /// republished; commands renewed by the sender until acknowledged)
    /// are read at QoS 0; one-shot frames (events, acks, frames resent)
    /// at QoS 1. A resend request is renewed by its reader until answered.
    pub const fn subscribe_qos(self) -> Qos {
        match self {
            Family::Event | Family::Ack | Family::Resent => Qos::AtLeastOnce,
            _ => Qos::AtMostOnce,
        }
    }

    /// Whether publishers set the retain flag.
    pub const fn retained(self) -> bool {
        matches!(self, Family::Health | Family::Online)
    }

    fn parse(s: &str) -> Option<Family> {
        Family::ALL.iter().copied().find(|f| f.as_str() == s)
    }
}

/// Why a string is not a topic of this protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TopicError {
    /// It does not start with `dc/v2/`.
    NotOurs,
    /// Too few or too many levels.
    Shape,
    /// The role level is neither `host` nor `cdu`.
    UnknownRole,
    /// The last level is not a family.
    UnknownFamily,
    /// The site or node name is not an ident.
    BadName(IdentError),
    /// The topic would be longer than [`TOPIC_MAX`].
    TooLong,
}

impl fmt::Display for TopicError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopicError::NotOurs => write!(f, "topic does not start with {ROOT}/"),
            TopicError::Shape => write!(
                f,
                "topic is not {ROOT}/<site>/[json/]<host|cdu>/<id>/<family>"
            ),
            TopicError::UnknownRole => write!(f, "topic role is neither host nor cdu"),
            TopicError::UnknownFamily => write!(
                f,
                "topic family is not one of telemetry, health, event, cmd, ack, online, resend, resent"
            ),
            TopicError::BadName(e) => write!(f, "topic name: {e}"),
            TopicError::TooLong => write!(f, "topic longer than {TOPIC_MAX} bytes"),
        }
    }
}

impl core::error::Error for TopicError {}

/// A parsed topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Topic {
    /// The site.
    pub site: Ident,
    /// `Host` or `Cdu`: whose subtree.
    pub role: Role,
    /// The node that owns the subtree.
    pub node: Ident,
    /// The family.
    pub family: Family,
    /// The JSON mirror rather than frames.
    pub json: bool,
}

impl Topic {
    /// The frame topic of `node` (a host or a CDU) for `family`.
    pub fn new(site: &Ident, role: Role, node: &Ident, family: Family) -> Self {
        Self {
            site: site.clone(),
            role,
            node: node.clone(),
            family,
            json: false,
        }
    }

    /// The same topic in the JSON mirror tree.
    pub fn mirror(&self) -> Self {
        Self {
            json: true,
            ..self.clone()
        }
    }

    /// The topic string.
    pub fn build(&self) -> Result<TopicString, TopicError> {
        let mut s = TopicString::new();
        let json = if self.json { "json/" } else { "" };
        write!(
            s,
            "{ROOT}/{}/{json}{}/{}/{}",
            self.site,
            self.role.as_str(),
            self.node,
            self.family.as_str()
        )
        .map_err(|_| TopicError::TooLong)?;
        Ok(s)
    }

    /// Parses a topic string.
    pub fn parse(topic: &str) -> Result<Topic, TopicError> {
        let rest = topic
            .strip_prefix(ROOT)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or(TopicError::NotOurs)?;
        let mut levels = rest.split('/');
        let mut next = || levels.next().ok_or(TopicError::Shape);
        let site = Ident::new(next()?).map_err(TopicError::BadName)?;
        let mut role_level = next()?;
        let json = role_level == "json";
        if json {
            role_level = next()?;
        }
        let role = match role_level {
            "host" => Role::Host,
            "cdu" => Role::Cdu,
            _ => return Err(TopicError::UnknownRole),
        };
        let node = Ident::new(next()?).map_err(TopicError::BadName)?;
        let family = Family::parse(next()?).ok_or(TopicError::UnknownFamily)?;
        if levels.next().is_some() {
            return Err(TopicError::Shape);
        }
        Ok(Topic {
            site,
            role,
            node,
            family,
            json,
        })
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.build() {
            Ok(s) => f.write_str(&s),
            Err(_) => write!(f, "<topic too long>"),
        }
    }
}

/// Subscription filters.
pub mod filter {
    use super::*;

    /// Every frame topic of a site (not the JSON mirror).
    pub fn site_frames(site: &Ident) -> Result<TopicString, TopicError> {
        let mut s = TopicString::new();
        // `dc/v2/<site>/+/+/+` matches host/… and cdu/… but not json/…/…/… (four levels).
        write!(s, "{ROOT}/{site}/+/+/+").map_err(|_| TopicError::TooLong)?;
        Ok(s)
    }

    /// The JSON mirror of a whole site.
    pub fn site_json(site: &Ident) -> Result<TopicString, TopicError> {
        let mut s = TopicString::new();
        write!(s, "{ROOT}/{site}/json/#").map_err(|_| TopicError::TooLong)?;
        Ok(s)
    }

    /// One family of every node of a role (for example every host's telemetry).
    pub fn family(site: &Ident, role: Role, family: Family) -> Result<TopicString, TopicError> {
        let mut s = TopicString::new();
        write!(s, "{ROOT}/{site}/{}/+/{}", role.as_str(), family.as_str())
            .map_err(|_| TopicError::TooLong)?;
        Ok(s)
    }

    /// The QoS to subscribe to `filter` with: [`Family::subscribe_qos`]
    /// when its last level names one family, QoS 1 otherwise (`#`, `+`:
    /// several families, events among them).
    pub fn qos(filter: &str) -> Qos {
        filter
            .rsplit('/')
            .next()
            .and_then(Family::parse)
            .map_or(Qos::AtLeastOnce, Family::subscribe_qos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Ident {
        Ident::new(s).unwrap()
    }

    #[test]
    fn builds_and_parses_every_family() {
        for family in Family::ALL {
            for role in [Role::Host, Role::Cdu] {
                let t = Topic::new(&id("hall-1"), role, &id("h07"), family);
                for t in [t.clone(), t.mirror()] {
                    let s = t.build().unwrap();
                    assert_eq!(Topic::parse(&s), Ok(t.clone()), "{s}");
                }
            }
        }
        assert_eq!(
            Topic::new(&id("s"), Role::Host, &id("h07"), Family::Health)
                .mirror()
                .build()
                .unwrap()
                .as_str(),
            "dc/v2/s/json/host/h07/health"
        );
    }

    #[test]
    fn refuses_what_is_not_ours() {
        assert_eq!(Topic::parse("foo/bar"), Err(TopicError::NotOurs));
        assert_eq!(Topic::parse("dc/v2/s/host/h1"), Err(TopicError::Shape));
        assert_eq!(
            Topic::parse("dc/v2/s/host/h1/event/x"),
            Err(TopicError::Shape)
        );
        assert_eq!(
            Topic::parse("dc/v2/s/rack/h1/event"),
            Err(TopicError::UnknownRole)
        );
        assert_eq!(
            Topic::parse("dc/v2/s/host/h1/nope"),
            Err(TopicError::UnknownFamily)
        );
        assert!(matches!(
            Topic::parse("dc/v2/s/host/+/event"),
            Err(TopicError::BadName(_))
        ));
        assert!(matches!(
            Topic::parse("dc/v2//host/h/event"),
            Err(TopicError::BadName(_))
        ));
    }

    #[test]
    fn families_carry_the_brief_qos_and_retention() {
        assert_eq!(Family::Telemetry.qos(), Qos::AtMostOnce);
        assert!(Family::Health.retained() && Family::Online.retained());
        assert!(!Family::Event.retained() && !Family::Cmd.retained());
        assert_eq!(Family::Cmd.qos(), Qos::AtLeastOnce);
    }

    #[test]
    fn renewed_families_are_read_at_qos_0_one_shot_ones_at_qos_1() {
        let site = id("hall-a");
        let t = filter::family(&site, Role::Host, Family::Telemetry).unwrap();
        assert_eq!(filter::qos(&t), Qos::AtMostOnce);
        let one = Topic::new(&site, Role::Host, &id("h01"), Family::Telemetry)
            .build()
            .unwrap();
        assert_eq!(filter::qos(&one), Qos::AtMostOnce);
        let acks = filter::family(&site, Role::Host, Family::Ack).unwrap();
        assert_eq!(filter::qos(&acks), Qos::AtLeastOnce);
        let events = filter::family(&site, Role::Cdu, Family::Event).unwrap();
        assert_eq!(filter::qos(&events), Qos::AtLeastOnce);
        for renewed in [Family::Health, Family::Online, Family::Cmd] {
            let t = Topic::new(&site, Role::Cdu, &id("cdu1"), renewed)
                .build()
                .unwrap();
            assert_eq!(filter::qos(&t), Qos::AtMostOnce, "{renewed:?}");
        }
        assert_eq!(
            filter::qos(&filter::site_json(&site).unwrap()),
            Qos::AtLeastOnce
        );
        assert_eq!(
            filter::qos(&filter::site_frames(&site).unwrap()),
            Qos::AtLeastOnce
        );
    }

    #[test]
    fn filters() {
        assert_eq!(
            filter::site_frames(&id("s")).unwrap().as_str(),
            "dc/v2/s/+/+/+"
        );
        assert_eq!(
            filter::family(&id("s"), Role::Host, Family::Telemetry)
                .unwrap()
                .as_str(),
            "dc/v2/s/host/+/telemetry"
        );
    }
}
