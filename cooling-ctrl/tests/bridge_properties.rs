//! Properties of the gateway's core (`gateway::bridge::Bridge`, with the
//! parts the gateway's loop composes it with: `clears::Pending`,
//! `bms::BmsBridge`, `facility::HallPart`), over random sequences of:
//! the microcontroller's frames (statuses, events, cap leases and lifts,
//! answers to clears, offers, said lines, its hello when it starts again)
//! harmed on the line or not (a bad CRC, truncated, its tail and end
//! lost, another link version, a message that does not decode,
//! duplicated, its numbers skipping), delivered in one read or two; time
//! passing with the loop's 250 ms ticks (silences shorter and longer than
//! 3 s, the MCU stepping every second); the MCU's clock jumping; the
//! gateway's wall clock stepping; what comes down from the bus (the BMS's
//! limits and outdoor temperature, operators' clears, the hall's plan);
//! the broker and the line coming and going; the gateway starting again
//! (a new bridge, a new loop). After every read and tick:
//!
//! 1. a published state lists a rack's cooling as the last status this
//!    gateway took says it (normal only if that status said so), and lists
//!    no rack before it took one; a silent MCU's state keeps them;
//! 2. at every tick 3 s or more after the last status (or the gateway's
//!    start) the bridge is silent and, with the broker connected, the
//!    retained state says `failsafe`, `controller-silent`; before that it
//!    is not silent; only a status ends the silence, and the state after
//!    it (with the broker connected) says the status's mode at once;
//! 3. each lease, event and answer the MCU sent is handed on once, as
//!    sent, in order, and nothing else is (a repeated frame adds none); a
//!    frame the line harmed gives one log line and one count, nothing else;
//! 4. each clear asked gets exactly one outcome: not sent (the line is
//!    closed), done or refused by the MCU's answer to that very clear, no
//!    answer at the first tick 10 s after it was sent, or lost with a
//!    gateway that stopped;
//! 5. a published state's `since` is never after the wall clock it is
//!    published at (within the 1 s the MCU's clock is read to); with the
//!    broker connected a state goes out at least every 60 s (with the
//!    next status, or at the tick while silent).
//!
//! Besides: in a hall, a state carries the MCU's last offer since it last
//! started (none while it is silent), and the water the gateway sends
//! down is a plan it heard; the BMS's limits go down at once, every 30 s
//! and when the MCU's numbers say it started again, its outdoor
//! temperature once per write, and the BMS reads the status's mode and
//! racks (`failsafe`, `controller-silent` while silent).
//!
//! The model ([`Expect`]) derives all this from the sequence: which frames
//! the line delivered whole ([`Run`]), which the gateway takes as new (a
//! frame identical to the last one checked is the line repeating it), when
//! the MCU started again (a hello, or a number at or below the last one
//! checked, as the link's numbering says; a frame whose message does not
//! read counts by its number, and the next frame taken is the start), and
//! what each said. It never asks the bridge what it took.
//!
//! Left out, and why:
//! - An older frame sent again later (not the one just taken): the link
//!   is not authenticated, and its numbering reads a number at or below
//!   the last as the MCU starting again, so such a frame is taken as
//!   new. A serial line does not replay frames; a party on the line can
//!   write any frame it likes.
//! - The MCU's numbers going back with no restart: the same rule.
//! - The MCU's clock going back with no restart: it is a free-running
//!   timer, ms since the MCU started (`loopwarden_link`'s glossary); a
//!   clock that went back would date a mode (its `since`) after the step
//!   that says it, and the gateway reads the MCU's times as it gives
//!   them. Its clock jumps ahead here (a mode then reads as older).
//! - Two clears of one id waiting at once (two operators signing in the
//!   same second, or one clear asked twice): the MCU's answer names the
//!   clear by its id alone (`Up::Answer`), ids are unique per operator
//!   only. The gateway's loop refuses, as not sent, a clear whose id
//!   already waits (`Pending::waits`; its own unit test), a rule of the
//!   loop this test does not play, so each clear here has an id of its
//!   own.
//!
//! Glossary:
//! - *taken*: a frame the line delivered whole, checked and decoded.
//! - *token*: one clear asked, followed to its outcome.

use cooling_core::config::Layout;
use cooling_core::facility::Offer;
use cooling_core::CoreConfig;
use cooling_ctrl::decide::CduMeasurements;
use cooling_ctrl::facility::{offer_msg, FacilityRole};
use cooling_ctrl::gateway::bms::{BmsBridge, Heard, LIMITS_EVERY_MS};
use cooling_ctrl::gateway::bridge::{Act, Bridge, Now, SILENT_AFTER_MS};
use cooling_ctrl::gateway::clears::{Pending, ANSWER_WITHIN_MS};
use cooling_ctrl::gateway::facility::HallPart;
use cooling_ctrl::gateway::TICK;
use cooling_ctrl::northbound::{Alarms, NorthboundWrite};
use cooling_ctrl::shell::STATE_EVERY;
use loopwarden_link::frame::{encode, OVERHEAD, VERSION};
use loopwarden_link::{Cost, Down, Hello, RackBits, ResetCause, Status, Up, MAX_MESSAGE};
use loopwarden_protocol::message::{
    CapLease, CduMode, CduState, Event, FacilityOffer, FacilityPlan, FacilityState, GpuSelector,
    Pump, RackCooling,
};
use loopwarden_protocol::{samples, GpuIndex, Ident, ReasonCode};
use proptest::prelude::*;

/// The gateway's wall clock at the test's start, Unix ms.
const T0: u64 = 1_700_000_000_000;
/// The loop's tick, ms.
const TICK_MS: u64 = TICK.as_millis() as u64;
/// The retained state goes out again at least this often, ms.
const STATE_EVERY_MS: u64 = STATE_EVERY.as_millis() as u64;
/// How far a status's time may read from the anchor before it moves, ms
/// (the bridge's `REANCHOR_AFTER_MS`).
const ANCHOR_SLACK_MS: u64 = 1_000;

#[path = "bridge_properties/checks.rs"]
mod checks;
#[path = "bridge_properties/gateway.rs"]
mod gateway;
#[path = "bridge_properties/line.rs"]
mod line;
#[path = "bridge_properties/mcu.rs"]
mod mcu;
#[path = "bridge_properties/strategies.rs"]
mod strategies;

use gateway::*;
use line::*;
use mcu::*;
use strategies::*;

#[test]
fn the_tests_own_frames_are_the_links() {
    let up = Up::Said {
        error: true,
        words: heapless::String::try_from("figures: refused").unwrap(),
    };
    assert_eq!(raw_frame(VERSION, 7, &message(&up)), frame(&up, 7));
}

proptest! {
    // About 1 ms a case in a debug build.
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn the_gateway_says_what_its_mcu_said_once_and_its_silence_in_time(
        hall in hall(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut w = World::new(hall);
        for op in &ops {
            w.play(op)?;
        }
        w.finish()?;
    }
}
