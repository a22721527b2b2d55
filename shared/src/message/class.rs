//! What an event is about, and whether a person must see it: the one
//! grouping of [`Event`]s, for their sentences (`text`) and for whoever
//! sorts them (the hall's live view, a pager).
//!
//! Glossary:
//! - *class*: the thing an event is about (a GPU, caps, the CDU's loop, a
//!   node's own running).

use super::Event;

/// What an event is about: the one grouping of events, for their
/// sentences (`text`) and for whoever sorts them (a live view, a pager).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventClass {
    /// A GPU: an XID, a health change, a quarantine's action or release,
    /// heat the cooling explains.
    Gpu,
    /// Power limits in force.
    Caps,
    /// The CDU's loop: leaks, its mode, pumps, sensors, isolation, a
    /// setting limited, an operator's clear.
    Cooling,
    /// A node's own running: a controller restored, a host's stall, its
    /// XID watch, its cooling-loss steps.
    Host,
}

impl Event {
    /// What the event is about.
    pub fn class(&self) -> EventClass {
        match self {
            Event::Xid { .. }
            | Event::HealthChanged { .. }
            | Event::QuarantineAction { .. }
            | Event::QuarantineReleased { .. }
            | Event::CoolingAttributed { .. } => EventClass::Gpu,
            Event::CapApplied { .. } | Event::CapsApplied { .. } | Event::PowerCeiling { .. } => {
                EventClass::Caps
            }
            Event::Leak { .. }
            | Event::CduModeChanged { .. }
            | Event::PumpTrip { .. }
            | Event::PumpSeized { .. }
            | Event::SensorFault { .. }
            | Event::LeakSensing { .. }
            | Event::IsolationFailed { .. }
            | Event::SettingLimited { .. }
            | Event::OperatorCleared { .. } => EventClass::Cooling,
            Event::ControllerRestored { .. }
            | Event::HostStalled { .. }
            | Event::HostResumed { .. }
            | Event::XidWatch { .. }
            | Event::CoolingAction { .. } => EventClass::Host,
        }
    }

    /// Whether a person watching the hall must see it: a fault the
    /// driver or the loop reported, the loop's mode changed, a controller
    /// restored after a restart, a person's act on the loop or on a GPU's
    /// limit, a rack's cooling-loss step. Routine changes (health moves, caps, a setting
    /// limited, a host's own monitoring) are for the log.
    pub fn needs_attention(&self) -> bool {
        match self.class() {
            EventClass::Cooling => !matches!(self, Event::SettingLimited { .. }),
            EventClass::Gpu => matches!(self, Event::Xid { .. }),
            EventClass::Host => {
                matches!(
                    self,
                    Event::ControllerRestored { .. } | Event::CoolingAction { .. }
                )
            }
            // A limit someone else set on a GPU: the site's power budget
            // moved, and whoever runs the hall should know.
            EventClass::Caps => matches!(self, Event::PowerCeiling { .. }),
        }
    }
}
