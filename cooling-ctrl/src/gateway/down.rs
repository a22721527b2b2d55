//! What the gateway hands to the MCU's line ([`super::queue`]): control
//! messages framed once the line's queue has a place, host reports as it
//! takes them, the BMS's messages and the hall's water, with what is said
//! when the line does not take them. Nothing is framed while the line is
//! closed: the frames would only be thrown away, counted as forwarded,
//! and the MCU would count their numbers as lost.
//!
//! Glossary:
//! - *handed*: framed and in the line's queue (counted as forwarded).

use std::string::String;

use loopwarden_bus::now_ms;
use loopwarden_link::Down;

use super::bms::LineTook;
use super::queue::Control;
use super::Gateway;

impl Gateway {
    /// The MCU hears the gateway is alive, with the wall clock and the
    /// layout the gateway maps hosts by ([`Bridge::alive`]).
    pub(super) fn send_alive(&mut self) {
        let alive = self.bridge.alive(now_ms().0, self.bus.is_connected());
        self.send_down(&alive);
    }

    /// Host reports waiting go to the line as it takes them.
    pub(super) fn feed_hosts(&mut self) {
        if !self.stats.link_open {
            // They wait, the latest of each host, for the line to open.
            return;
        }
        let bridge = &mut self.bridge;
        self.stats.host_reports_forwarded += self.down.feed(|d| match bridge.frame(d) {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::error!("cooling gateway: a host report to the microcontroller: {e}");
                None
            }
        });
    }

    /// The BMS's limits kept in flash before the restart (`read`, as
    /// the flash was opened): in force again and due, to go down when the
    /// line opens (the line is not open yet at the start, and a closed
    /// line is no line refusing them), or, when they cannot be read,
    /// said, with none in force until the BMS writes them.
    pub(super) fn restore_bms_limits(&mut self, read: &Result<Option<(f32, f32)>, String>) {
        match read {
            Ok(None) => {}
            Ok(Some(limits)) => {
                let (c, o) = *limits;
                tracing::info!(
                    "cooling gateway: the BMS's limits restored from flash: setpoint ceiling {c:.2} °C, plan ceiling offset {o:.2} K"
                );
                self.bms.restored(*limits);
            }
            Err(e) => tracing::error!(
                "cooling gateway: the BMS's limits: {e}: none in force until the BMS writes them again"
            ),
        }
    }

    /// Hands the BMS's limits to the recorder, if they changed since they
    /// were last handed, without waiting; a full queue leaves them for the
    /// next tick.
    pub(super) fn keep_bms_limits(&mut self) {
        self.bms_keeping.offer(&self.recorder);
    }

    /// The hall's facility water, °C, to the MCU.
    pub(super) fn facility_down(&mut self, water_c: f32) {
        if self.send_down(&Down::FacilityTarget(water_c)) {
            self.stats.facility_forwarded += 1;
            tracing::debug!(
                "cooling gateway: the hall's facility water, {water_c} °C, to the microcontroller"
            );
        } else {
            self.bridge.facility_not_sent();
            tracing::warn!(
                "cooling gateway: the hall's facility water, {water_c} °C, was not handed to the microcontroller's line; it goes again at the next word"
            );
        }
    }

    /// `down` of the BMS to the MCU's line; whether the line took it. A
    /// line that does not take them is said at the first refusal of a run
    /// and when it takes one again, not at every retry.
    pub(super) fn send_bms(&mut self, down: &Down) -> bool {
        let handed = self.send_down(down);
        if handed {
            self.stats.bms_forwarded += 1;
            if matches!(down, Down::Limits { .. }) {
                self.bms.limits_handed(self.now().mono_ms);
            }
        }
        // Limits offered again are said at the first refusal of a run;
        // an outdoor value is lost, so each one is said.
        let took = self.bms.line_took(handed);
        let lost = !handed && matches!(down, Down::Outdoor(_));
        if lost || took == Some(LineTook::Refused) {
            tracing::warn!("cooling gateway: {}", bms_refused_words(down));
        } else if took == Some(LineTook::Again) {
            tracing::info!(
                "cooling gateway: the microcontroller's line takes the BMS's messages again"
            );
        }
        handed
    }

    /// The BMS's outdoor temperature, `celsius`, written at `now_ms`, to
    /// the MCU's line: in force from then if the line took it, else lost
    /// (said by [`Gateway::send_bms`]).
    pub(super) fn outdoor_down(&mut self, celsius: f32, now_ms: u64) {
        if self.send_bms(&Down::Outdoor(celsius)) {
            self.bms.outdoor_handed(celsius, now_ms);
        }
    }

    /// Frames `down` and hands it to the line, once its queue has a
    /// place (no frame number spent on one that never goes); false when
    /// it was not.
    pub(super) fn send_down(&mut self, down: &Down) -> bool {
        if !self.stats.link_open {
            // Not framed (no frame number spent on it): what is due goes
            // again when the line opens, or at the next word.
            self.bridge.wrote(false);
            return false;
        }
        let bridge = &mut self.bridge;
        let mut refused = None;
        let framed = || bridge.frame(down).map_err(|e| refused = Some(e)).ok();
        match self.down.control(framed) {
            Control::Queued => true,
            Control::NotFramed => {
                if let Some(e) = refused {
                    tracing::error!("cooling gateway: a frame to the microcontroller: {e}");
                }
                false
            }
            Control::NoRoom => {
                // The line's queue is full (the line is stuck) or gone.
                self.bridge.wrote(false);
                false
            }
        }
    }
}

/// What is said of the BMS's `down` that the MCU's line did not take:
/// what becomes of it.
fn bms_refused_words(down: &Down) -> String {
    const NOT: &str = "not handed to the microcontroller's line";
    match down {
        Down::Outdoor(t) => format!(
            "the BMS's outdoor temperature, {t} °C, was {NOT}: it is lost, not in force \
             (the microcontroller would date a repeat from when it hears it); the BMS must \
             write it again"
        ),
        Down::Limits {
            ceiling_c,
            offset_k,
        } => format!(
            "the BMS's limits (setpoint ceiling {ceiling_c:.2} °C, plan ceiling offset \
             {offset_k:.2} K) were {NOT}; they are offered again until the line takes them"
        ),
        other => format!("the BMS's {other:?} was {NOT}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_bms_message_is_said_as_what_becomes_of_it() {
        let outdoor = bms_refused_words(&Down::Outdoor(12.5));
        for says in [
            "outdoor temperature, 12.5 °C",
            "lost",
            "the BMS must write it again",
        ] {
            assert!(outdoor.contains(says), "{outdoor}");
        }
        assert!(!outdoor.contains("offered again"), "{outdoor}");
        assert!(!outdoor.contains("Outdoor("), "not its Debug: {outdoor}");
        let limits = bms_refused_words(&Down::Limits {
            ceiling_c: 40.0,
            offset_k: 1.5,
        });
        for says in [
            "setpoint ceiling 40.00 °C",
            "offset 1.50 K",
            "offered again",
        ] {
            assert!(limits.contains(says), "{limits}");
        }
    }
}
