//! A stop with volatile state (`volatile_state = true`, no flash file)
//! while the host's cooling is lost: the caps stay on (a cooling-loss
//! cap lifted at a `systemctl poweroff` or `stop` would run the GPUs at
//! full power on a shut valve), said as an error naming each GPU and the
//! command that sets its ceiling back; with only capacity caps and the
//! cooling back, the ceilings are put back (`node_step_limits.rs`).
//! [`Host`] (in `host/`) plays the shell.

mod host;

use host::{cdu_topic, cmd_topic, lease, Boot, Host, DEFAULT, GPUS, GRACE_MS};
use loopwarden_protocol::samples::{self, demo_signing_key, T0};
use loopwarden_protocol::{
    CoolingStep, Frame, Message, MessageKind, RackCooling, ReasonCode, TimestampMs, Watts,
};
use node_core::cooling_loss::Phase;
use node_core::node::{Effect, Input, Level};

/// The CDU's state at `t`, rack 2 (this host's) without cooling when
/// `lost`, signed as `cdu-a` signs it.
fn cdu_state(seq: u32, t: u64, lost: bool) -> Frame {
    let mut f = samples::frame(MessageKind::CduState);
    f.seq = seq;
    f.time = TimestampMs(t);
    if let Message::CduState(st) = &mut f.message {
        for r in st.racks.iter_mut() {
            r.cooling = match lost && r.rack.get() == 2 {
                true => RackCooling::Lost,
                false => RackCooling::Normal,
            };
        }
    }
    f.sign(&cdu_topic(), 1, &demo_signing_key()).unwrap();
    f
}

/// The CDU's lease capping every GPU at `watts`, for `reason`.
fn lease_for(seq: u32, t: u64, watts: u32, reason: ReasonCode) -> Frame {
    let mut f = lease(seq, t, watts, 600_000);
    if let Message::CapLease(l) = &mut f.message {
        l.reason = reason;
    }
    f.sign(&samples::command_topic(), 1, &demo_signing_key())
        .unwrap();
    f
}

/// The lines said at `level` about the stop.
fn said(h: &Host, level: Level) -> Vec<String> {
    (h.trail.iter())
        .filter_map(|e| match e {
            Effect::Say(l, line) if *l == level && line.starts_with("stopping") => {
                Some(line.clone())
            }
            _ => None,
        })
        .collect()
}

/// Whether the stop set any limit.
fn set_any(h: &Host) -> bool {
    h.trail.iter().any(|e| matches!(e, Effect::SetLimits(_)))
}

/// A volatile host capped at the CDU's minimum (200 W) for its rack's
/// cooling loss, drained, or powered down after the grace: the stop
/// leaves every cap on and says, as an error, why, and for each GPU the
/// command that sets its ceiling back once cooling is back, or a reboot.
#[test]
fn a_volatile_node_stopping_while_its_rack_lost_cooling_keeps_the_caps_and_names_the_commands() {
    for powered_down in [false, true] {
        let mut h = Host::boot_volatile(Boot::default());
        let mut t = T0.0 + 1_000;
        let cap = lease_for(1, t, 200, ReasonCode::COOLING_LOST);
        h.step(t, Input::Frame(&cmd_topic(), &cap));
        h.step(t, Input::Frame(&cdu_topic(), &cdu_state(2, t, true)));
        assert_eq!(h.cooling, vec![CoolingStep::Drain]);
        if powered_down {
            t += GRACE_MS;
            h.healthy_round(t);
            assert_eq!(h.node.cooling_phase(), Phase::PoweredDown { since: t });
        }
        assert_eq!(h.limits, [Watts(200); GPUS]);
        h.trail.clear();
        h.step(t + 1_000, Input::Stop);
        let case = format!("powered down {powered_down}: {:?}", h.trail);
        assert_eq!(h.limits, [Watts(200); GPUS], "{case}");
        assert!(!set_any(&h), "{case}");
        let errors = said(&h, Level::Error);
        assert_eq!(errors.len(), 1, "{case}");
        let e = &errors[0];
        for i in 0..GPUS {
            let command = format!("GPU {i} at 200 W: nvidia-smi -i {i} -pl {}", DEFAULT.0);
            assert!(e.contains(&command), "{command} in {e}");
        }
        let phase = match powered_down {
            true => "powered down at",
            false => "drained at",
        };
        for words in [
            "volatile_state = true while cooling is lost",
            "rack 2 of cdu-a lost cooling",
            phase,
            "lease 1 of cdu/cdu-a (cooling-lost)",
            "the power limits are kept",
            "the next start will take them for the GPUs' ceilings",
            "once cooling is back",
            "or reboot",
        ] {
            assert!(e.contains(words), "{words:?} in {e}");
        }
        assert!(said(&h, Level::Warn).is_empty(), "{case}");
    }
}

/// One stop of a volatile host (or one with a flash) capped at 300 W by
/// a lease for `reason`, after the CDU's `words` on the rack (lost or
/// not, in order), its phase then made not known where `unknown`:
/// whether the caps `stay`.
struct Case {
    name: &'static str,
    reason: ReasonCode,
    words: &'static [bool],
    unknown: bool,
    volatile: bool,
    stay: bool,
}

/// Either sign of a cooling loss alone keeps the caps of a volatile host:
/// a cooling-loss lease before the CDU's state says the rack lost cooling
/// (or on a host the state does not tell), a capacity cap while the rack
/// is drained, and a phase not known. Once the CDU says cooling is back,
/// a capacity cap is lifted at the stop, said as a warning; with a flash
/// the caps stay in every case, as before.
#[test]
fn a_volatile_node_keeps_its_caps_on_either_sign_of_a_cooling_loss_and_lifts_them_once_cooled() {
    let case = |name, reason, words, unknown, volatile, stay| Case {
        name,
        reason,
        words,
        unknown,
        volatile,
        stay,
    };
    let (capacity, lost) = (ReasonCode::CAPACITY_SHORT, ReasonCode::COOLING_LOST);
    let cases = [
        case("lost lease", lost, &[], false, true, true),
        case("leak lease", ReasonCode::LEAK, &[false], false, true, true),
        case("capacity, drained", capacity, &[true], false, true, true),
        case("capacity, unknown", capacity, &[], true, true, true),
        case("capacity, cooled", capacity, &[false], false, true, false),
        case(
            "capacity, back",
            capacity,
            &[true, false],
            false,
            true,
            false,
        ),
        case("flash, lost", lost, &[true], false, false, true),
    ];
    for Case {
        name: case,
        reason,
        words,
        unknown,
        volatile,
        stay,
    } in cases
    {
        let mut h = match volatile {
            true => Host::boot_volatile(Boot::default()),
            false => Host::new(),
        };
        let t = T0.0 + 1_000;
        h.step(t, Input::Frame(&cmd_topic(), &lease_for(1, t, 300, reason)));
        for (n, &lost) in words.iter().enumerate() {
            let at = t + 1_000 * n as u64;
            h.step(
                at,
                Input::Frame(&cdu_topic(), &cdu_state(2 + n as u32, at, lost)),
            );
        }
        if unknown {
            h.node.restore_cooling_unknown();
        }
        assert_eq!(h.limits, [Watts(300); GPUS], "{case}");
        h.trail.clear();
        h.step(t + 10_000, Input::Stop);
        let (errors, warnings) = (said(&h, Level::Error), said(&h, Level::Warn));
        let trail = format!("{case}: {:?}", h.trail);
        match (stay, volatile) {
            (true, true) => {
                assert_eq!(h.limits, [Watts(300); GPUS], "{trail}");
                assert_eq!(errors.len(), 1, "{trail}");
                assert!(errors[0].contains("nvidia-smi -i 3 -pl 700"), "{trail}");
            }
            (true, false) => {
                assert_eq!(h.limits, [Watts(300); GPUS], "{trail}");
                assert!(errors.is_empty() && warnings.is_empty(), "{trail}");
            }
            (false, _) => {
                assert_eq!(h.limits, [DEFAULT; GPUS], "{trail}");
                assert!(errors.is_empty(), "{trail}");
                assert_eq!(warnings.len(), 1, "{trail}");
                assert!(warnings[0].contains("no cooling loss"), "{trail}");
            }
        }
        assert_eq!(set_any(&h), !stay, "{trail}");
    }
}
