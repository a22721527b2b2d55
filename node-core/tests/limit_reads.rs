//! A GPU's limit that cannot be read (its worker busy past the deadline,
//! an NVML error) never lets the node raise it above an administrator's
//! limit (docs/node-agent.md section 5.1): a read that fails before a set
//! lets only a cap that goes down through, a raise waits for a good read
//! (said once), at a reconcile, at the start and at the stop; after a
//! read-back that failed, a limit found that is neither the one asked nor
//! any asked since the last good read or the one read before them is an
//! administrator's, the new ceiling.
//!
//! [`Host`] (in `host/`) plays the shell, its reads failing where told.

mod host;

use host::{lease, Boot, Host, DEFAULT, GPUS};
use loopwarden_protocol::samples::{self, T0};
use loopwarden_protocol::{AckCode, CapSource, Event, Watts};
use node_core::node::{Effect, Input, KeptLimit, Level, REREAD_EVERY, RETRY_MS};

fn lease_now(h: &mut Host, seq: u32, t: u64, watts: u32, ms: u32) {
    h.step(
        t,
        Input::Frame(&samples::command_topic(), &lease(seq, t, watts, ms)),
    );
}

/// Every limit the node asked GPU `gpu` to be set to, in order.
fn sets_of(h: &Host, gpu: u8) -> Vec<Watts> {
    host::sets_on(&h.trail, gpu)
}

/// The lines said that contain `part`.
fn said(h: &Host, part: &str) -> Vec<(Level, String)> {
    h.trail
        .iter()
        .filter_map(|e| match e {
            Effect::Say(level, line) if line.contains(part) => Some((*level, line.clone())),
            _ => None,
        })
        .collect()
}

fn power_ceilings(h: &Host) -> Vec<(u16, Watts, Watts)> {
    h.events
        .iter()
        .filter_map(|e| match e {
            Event::PowerCeiling { gpus, ceiling, was } => Some((*gpus, *ceiling, *was)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_lift_after_a_failed_read_waits_for_a_good_read_and_keeps_the_administrators_limit() {
    // An administrator's 500 W on every GPU: the ceiling.
    let mut h = Host::boot(Boot {
        limits: Watts(500),
        ..Boot::default()
    });
    // GPU 2's worker is busy past its deadline: its reads fail at once,
    // its sets take. A cap goes down all the same.
    h.unreadable[2] = true;
    let mut t = T0.0 + 1_000;
    lease_now(&mut h, 1, t, 300, 20_000);
    assert_eq!(h.limits, [Watts(300); GPUS], "a cap goes down unread");

    // The administrator lowers GPU 2's 500 W to 400 W (it is at 300 W,
    // capped); the lease lapses with GPU 2 still unread.
    h.limits[2] = Watts(400);
    t += 20_000;
    h.step(t, Input::Expiry);
    assert_eq!(
        h.limits,
        [Watts(500), Watts(500), Watts(400), Watts(500)],
        "GPU 2 not lifted above the administrator's 400 W"
    );
    assert_eq!(sets_of(&h, 2), [Watts(300)]);

    // Still unread: tried again, said once.
    for _ in 0..(2 * RETRY_MS / 1_000 + 5) {
        t += 1_000;
        h.healthy_round(t);
    }
    assert_eq!(h.limits[2], Watts(400));
    assert_eq!(sets_of(&h, 2), [Watts(300)]);
    let held = said(&h, "GPU 2: 500 W not set");
    assert_eq!(held.len(), 1, "said once: {held:?}");
    assert_eq!(held[0].0, Level::Warn);

    // Read again: the administrator's 400 W is the new ceiling, kept.
    h.unreadable[2] = false;
    for _ in 0..(RETRY_MS / 1_000 + 1) {
        t += 1_000;
        h.healthy_round(t);
    }
    assert_eq!(h.node.ceiling(2), Some(Watts(400)));
    assert_eq!(power_ceilings(&h), [(0b100, Watts(400), Watts(500))]);
    assert_eq!(h.limits, [Watts(500), Watts(500), Watts(400), Watts(500)]);
    assert!(sets_of(&h, 2).iter().all(|&w| w <= Watts(400)));
}

#[test]
fn a_stop_with_a_failed_read_never_lifts_a_gpu_above_the_administrators_limit() {
    let mut h = Host::new();
    let t = T0.0 + 1_000;
    lease_now(&mut h, 1, t, 300, 20_000);
    assert_eq!(h.limits, [Watts(300); GPUS]);
    // While capped, the administrator sets GPU 1 to 400 W; the stop's
    // read of GPU 1 fails, the lease has lapsed.
    h.limits[1] = Watts(400);
    h.unreadable[1] = true;
    h.step(t + 25_000, Input::Stop);
    assert_eq!(h.limits, [DEFAULT, Watts(400), DEFAULT, DEFAULT]);
    assert_eq!(sets_of(&h, 1), [Watts(300)], "GPU 1 not set at the stop");
    let lines = said(&h, "GPU 1: uncapped limit 700 W not restored");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].0, Level::Error);
}

#[test]
fn a_gpu_unread_at_the_start_is_not_set_to_a_limit_never_read_from_it() {
    // An administrator's 500 W before the first start; NVML's default
    // is 700 W. GPU 3's first read fails.
    let mut unreadable = [false; GPUS];
    unreadable[3] = true;
    let mut h = Host::boot_unreadable(
        Boot {
            limits: Watts(500),
            ..Boot::default()
        },
        unreadable,
    );
    assert_eq!(h.limits, [Watts(500); GPUS], "nothing set at start");
    assert!(sets_of(&h, 3).is_empty());
    assert_eq!(said(&h, "GPU 3: 700 W not set").len(), 1);

    // Read after the retry: 500 W is its ceiling, and no set is needed.
    h.unreadable[3] = false;
    let mut t = T0.0;
    for _ in 0..(RETRY_MS / 1_000 + 1) {
        t += 1_000;
        h.healthy_round(t);
    }
    assert_eq!(h.node.ceiling(3), Some(Watts(500)));
    assert!(sets_of(&h, 3).is_empty());
    assert!(power_ceilings(&h).is_empty());
}

#[test]
fn after_a_failed_read_back_an_administrators_limit_is_still_seen() {
    let mut h = Host::boot(Boot {
        limits: Watts(500),
        ..Boot::default()
    });
    // The caps take on GPUs 1 and 2, their read-backs fail.
    h.back_fails[1] = true;
    h.back_fails[2] = true;
    let mut t = T0.0 + 1_000;
    lease_now(&mut h, 1, t, 300, 600_000);
    assert_eq!(h.limits, [Watts(300); GPUS]);
    assert_eq!(h.node.applied(2).0, None, "not confirmed");

    // Before the next read, the administrator sets GPU 2 to 400 W; GPU 1
    // keeps the agent's 300 W.
    h.back_fails = [false; GPUS];
    h.limits[2] = Watts(400);
    for _ in 0..(RETRY_MS / 1_000 + 1) {
        t += 1_000;
        h.healthy_round(t);
    }
    assert_eq!(h.node.ceiling(2), Some(Watts(400)), "the administrator's");
    assert_eq!(h.node.ceiling(1), Some(Watts(500)), "the agent's own 300 W");
    assert_eq!(power_ceilings(&h), [(0b100, Watts(400), Watts(500))]);
    assert_eq!(
        said(&h, "changed outside the agent").len(),
        1,
        "GPU 2 only: {:?}",
        said(&h, "changed outside the agent")
    );
    assert_eq!(h.limits, [Watts(300); GPUS], "the cap below it set again");
    let kept = h.kept_limits.last().expect("the new ceiling kept");
    assert_eq!(kept[2].map(|k| k.ceiling), Some(Watts(400)));
}

#[test]
fn a_limit_found_below_the_lowest_cap_is_the_ceiling_never_raised() {
    // The GPUs' lowest cap is 200 W (host::RANGE: NVML's minimum or the
    // board's min_cap_w); an administrator's 150 W is on every GPU.
    let mut h = Host::boot(Boot {
        limits: Watts(150),
        ..Boot::default()
    });
    assert_eq!(h.node.ceiling(0), Some(Watts(150)), "the ceiling found");
    assert_eq!(h.limits, [Watts(150); GPUS], "not raised at the start");
    let below = said(&h, "is below its lowest cap 200 W");
    assert_eq!(below.len(), GPUS, "said for each GPU: {below:?}");
    assert!(below.iter().all(|(level, _)| *level == Level::Warn));

    // A cap below it is clamped to 150 W, not 200 W; the stop leaves it.
    let mut t = T0.0 + 1_000;
    lease_now(&mut h, 1, t, 100, 20_000);
    assert_eq!(h.acks.last().map(|a| a.code), Some(AckCode::Clamped));
    for _ in 0..5 {
        t += 1_000;
        h.healthy_round(t);
    }
    h.step(t + 20_000, Input::Stop);
    assert_eq!(h.limits, [Watts(150); GPUS]);
    for gpu in 0..GPUS as u8 {
        assert!(
            sets_of(&h, gpu).iter().all(|&w| w <= Watts(150)),
            "GPU {gpu} set above 150 W: {:?}",
            sets_of(&h, gpu)
        );
    }
}

#[test]
fn a_limit_lowered_below_the_lowest_cap_while_running_is_the_ceiling() {
    let mut h = Host::new();
    let mut t = T0.0 + 1_000;
    lease_now(&mut h, 1, t, 300, 600_000);
    assert_eq!(h.limits, [Watts(300); GPUS]);
    // `nvidia-smi -pl 150` on GPU 1 while capped: found at the next read.
    h.limits[1] = Watts(150);
    for _ in 0..REREAD_EVERY {
        t += 1_000;
        h.healthy_round(t);
    }
    assert_eq!(h.node.ceiling(1), Some(Watts(150)));
    assert_eq!(h.limits, [Watts(300), Watts(150), Watts(300), Watts(300)]);
    assert!(
        sets_of(&h, 1).iter().all(|&w| w != Watts(200)),
        "{:?}",
        sets_of(&h, 1)
    );
    assert_eq!(power_ceilings(&h), [(0b10, Watts(150), DEFAULT)]);
}

#[test]
fn a_set_that_lands_late_is_never_taken_for_an_administrators_limit() {
    let mut h = Host::new();
    let mut t = T0.0 + 1_000;
    // 675 W asked of GPU 0: the set runs past its deadline and takes, its
    // read-back fails (the worker busy).
    h.back_fails[0] = true;
    lease_now(&mut h, 1, t, 675, 600_000);
    assert_eq!(h.limits[0], Watts(675));
    assert_eq!(h.node.applied(0).0, None, "not confirmed");
    // 650 W asked, the worker still busy: the read before it fails, and
    // the set, asked while busy, is never made.
    h.unreadable[0] = true;
    h.sets_lost[0] = true;
    t += 1_000;
    lease_now(&mut h, 2, t, 650, 600_000);
    assert_eq!(sets_of(&h, 0), [Watts(675), Watts(650)]);
    assert_eq!(h.limits[0], Watts(675), "the 650 W set never made");

    // The worker answers again: the 675 W found is the agent's own.
    h.unreadable[0] = false;
    h.back_fails[0] = false;
    h.sets_lost[0] = false;
    for _ in 0..(RETRY_MS / 1_000 + 1) {
        t += 1_000;
        h.healthy_round(t);
    }
    let outside = said(&h, "changed outside the agent");
    assert!(outside.is_empty(), "{outside:?}");
    assert!(power_ceilings(&h).is_empty(), "{:?}", power_ceilings(&h));
    assert_eq!(h.node.ceiling(0), Some(DEFAULT));
    assert_eq!(h.limits, [Watts(650); GPUS], "the cap set again");
    // Both leases lapse: every GPU back at 700 W.
    h.step(T0.0 + 602_000, Input::Expiry);
    assert_eq!(h.limits, [DEFAULT; GPUS]);
    assert!(h
        .kept_limits
        .iter()
        .flatten()
        .flatten()
        .all(|k| k.ceiling == DEFAULT));
}

#[test]
fn an_administrators_limit_is_seen_after_several_failed_read_backs() {
    let mut h = Host::new();
    let mut t = T0.0 + 1_000;
    // GPU 1's read-backs fail, and the read before the second set.
    h.back_fails[1] = true;
    lease_now(&mut h, 1, t, 675, 600_000);
    h.unreadable[1] = true;
    t += 1_000;
    lease_now(&mut h, 2, t, 650, 600_000);
    assert_eq!(h.limits[1], Watts(650));
    // Neither 675 W nor 650 W nor 700 W: the administrator's 600 W.
    h.back_fails[1] = false;
    h.unreadable[1] = false;
    h.limits[1] = Watts(600);
    for _ in 0..(RETRY_MS / 1_000 + 1) {
        t += 1_000;
        h.healthy_round(t);
    }
    assert_eq!(h.node.ceiling(1), Some(Watts(600)));
    assert_eq!(power_ceilings(&h), [(0b10, Watts(600), DEFAULT)]);
    let outside = said(&h, "GPU 1: its power limit was changed outside the agent");
    assert_eq!(outside.len(), 1, "{outside:?}");
    assert!(
        outside[0].1.contains("700 W, or 675 W, 650 W asked"),
        "{outside:?}"
    );
}

#[test]
fn a_gpu_unread_at_the_start_keeps_its_kept_limits_over_another_restart() {
    // Before the restart a 400 W cap was kept on every GPU; the lease has
    // lapsed since. GPU 3's read times out at the start.
    let kept = KeptLimit {
        ceiling: DEFAULT,
        asked: Watts(400),
        before: Some(DEFAULT),
    };
    let mut unreadable = [false; GPUS];
    unreadable[3] = true;
    let mut h = Host::boot_unreadable(
        Boot {
            limits: Watts(400),
            kept: Some(kept),
            ..Boot::default()
        },
        unreadable,
    );
    assert_eq!(h.limits, [DEFAULT, DEFAULT, DEFAULT, Watts(400)]);
    assert!(!h.kept_limits.is_empty(), "the other GPUs' sets kept");
    assert_eq!(h.flash_limits[3], Some(kept), "GPU 3's record carried on");

    // Restarted before GPU 3 was read: 400 W is still the agent's own.
    let after = h.crashed(0, T0.0 + 10_000);
    assert_eq!(after.node.ceiling(3), Some(DEFAULT));
    assert!(power_ceilings(&after).is_empty());
    assert!(said(&after, "set outside the agent").is_empty());
    assert_eq!(after.limits, [DEFAULT; GPUS], "raised once read");
}

/// A host restarted with a 500 W cap of its own on every GPU (kept
/// `{700, 500}`), GPU 3 unread at the start.
fn restarted_capped_gpu_3_unread() -> Host {
    gpu_3_unread_at(Watts(500), Watts(500))
}

/// A host restarted with `found` on every GPU, the flash keeping
/// `{700, asked}`, GPU 3 unread at the start.
fn gpu_3_unread_at(found: Watts, asked: Watts) -> Host {
    let kept = KeptLimit {
        ceiling: DEFAULT,
        asked,
        before: None,
    };
    let mut unreadable = [false; GPUS];
    unreadable[3] = true;
    Host::boot_unreadable(
        Boot {
            limits: found,
            kept: Some(kept),
            ..Boot::default()
        },
        unreadable,
    )
}

#[test]
fn a_failed_read_back_on_a_gpu_unread_at_the_start_keeps_what_the_flash_kept() {
    let mut h = restarted_capped_gpu_3_unread();
    assert_eq!(h.limits, [DEFAULT, DEFAULT, DEFAULT, Watts(500)]);
    // A 450 W cap goes down on GPU 3 unread; its set is lost and its
    // read-back fails: the GPU may hold 500 W still.
    h.sets_lost[3] = true;
    h.back_fails[3] = true;
    let mut t = T0.0 + 1_000;
    lease_now(&mut h, 1, t, 450, 600_000);
    assert_eq!(sets_of(&h, 3), [Watts(450)]);
    // An administrator's 600 W on GPU 0 (the limits kept again), and
    // GPU 3's cap tried again: still a cap that goes down, not held.
    h.limits[0] = Watts(600);
    for _ in 0..(RETRY_MS / 1_000 + 1) {
        t += 1_000;
        h.healthy_round(t);
    }
    assert_eq!(h.node.ceiling(0), Some(Watts(600)));
    assert_eq!(sets_of(&h, 3), [Watts(450), Watts(450)], "not held");
    assert!(said(&h, "GPU 3: 450 W not set").is_empty());
    let kept = h.flash_limits[3].expect("kept");
    assert_eq!(
        (kept.asked, kept.before),
        (Watts(450), Some(Watts(500))),
        "{:?}",
        h.kept_limits
    );

    // Restarted, GPU 3 read at last: 500 W is the agent's own cap.
    h.unreadable[3] = false;
    let after = h.crashed(0, t + 1_000);
    assert!(
        said(&after, "set outside the agent").is_empty(),
        "{:?}",
        said(&after, "GPU 3")
    );
    assert_eq!(after.node.ceiling(3), Some(DEFAULT));
    assert!(power_ceilings(&after).is_empty());
    assert_eq!(after.limits[3], Watts(450), "the lease in force");
}

#[test]
fn a_cap_read_back_on_a_gpu_unread_at_the_start_is_its_own_at_the_first_read() {
    let mut h = restarted_capped_gpu_3_unread();
    // A 450 W cap goes down on GPU 3 unread, and reads back.
    let mut t = T0.0 + 1_000;
    lease_now(&mut h, 1, t, 450, 20_000);
    assert_eq!(h.limits, [Watts(450); GPUS]);
    assert_eq!(h.node.applied(3).0, Some(Watts(450)));
    // Its limit readable again; the lease lapses: read first, 450 W is
    // the agent's, the ceiling stays 700 W and GPU 3 is raised to it.
    h.unreadable[3] = false;
    t += 20_000;
    h.step(t, Input::Expiry);
    assert!(
        said(&h, "set outside the agent").is_empty(),
        "{:?}",
        said(&h, "GPU 3")
    );
    assert_eq!(h.node.ceiling(3), Some(DEFAULT));
    assert!(power_ceilings(&h).is_empty());
    assert_eq!(h.limits, [DEFAULT; GPUS]);
}

/// An administrator's 400 W set on GPU 3 while the agent was stopped
/// (it had left a 450 W cap); GPU 3 unread at the start; the agent's
/// 450 W set does not take and reads back 400 W: that is the GPU's own
/// limit, not one the agent asked. At its first read it is the new
/// ceiling, never raised.
#[test]
fn a_limit_only_read_back_after_a_set_that_did_not_take_is_not_the_agents() {
    let mut h = gpu_3_unread_at(Watts(400), Watts(450));
    assert_eq!(h.limits[3], Watts(400), "no raise before a read");
    h.sets_lost[3] = true;
    let mut t = T0.0 + 1_000;
    lease_now(&mut h, 1, t, 450, 20_000);
    assert_eq!(sets_of(&h, 3), [Watts(450)]);
    assert_eq!(h.limits[3], Watts(400));
    // A cap that comes out at the limit found asks no set: it does not
    // make that limit the agent's.
    lease_now(&mut h, 2, t + 1_000, 400, 20_000);
    // Its limit readable again; the leases lapse.
    h.unreadable[3] = false;
    h.sets_lost[3] = false;
    t += 21_000;
    h.step(t, Input::Expiry);
    assert_eq!(h.node.ceiling(3), Some(Watts(400)));
    assert_eq!(
        h.limits[3],
        Watts(400),
        "never raised above the administrator's"
    );
    assert!(
        !said(&h, "GPU 3: found at 400 W").is_empty(),
        "{:?}",
        said(&h, "GPU 3")
    );
}

/// A boot unit's 500 W on every GPU; GPU 3's limit cannot be read at the
/// start, nor at the start after a crash. Nothing is kept for it while
/// it was never read (a record of the default ceiling would pass for one
/// read from it), so a lease is held until a read, and the lease's end
/// never lifts it above the 500 W found on it.
#[test]
fn a_gpu_never_read_has_no_limits_kept_and_is_never_lifted_above_the_limit_found() {
    let mut unreadable = [false; GPUS];
    unreadable[3] = true;
    let h = Host::boot_unreadable(
        Boot {
            limits: Watts(500),
            kept: None,
            ..Boot::default()
        },
        unreadable,
    );
    assert!(!h.kept_limits.is_empty(), "the GPUs read are kept");
    assert_eq!(
        h.flash_limits[3], None,
        "nothing kept for GPU 3, never read"
    );

    let mut t = T0.0 + 10_000;
    let mut h = h.crashed_unreadable(t, unreadable);
    assert_eq!(h.flash_limits[3], None);
    t += 1_000;
    lease_now(&mut h, 1, t, 450, 20_000);
    assert_eq!(h.limits[..3], [Watts(450); 3]);
    h.unreadable[3] = false;
    t += 20_000;
    h.step(t, Input::Expiry);
    assert!(h.limits[3] <= Watts(500), "{:?}", h.limits);
    assert_eq!(h.node.ceiling(3), Some(Watts(500)));
    assert!(sets_of(&h, 3).iter().all(|&w| w <= Watts(500)));
}

/// GPU 0's lowest limit is 250 W, not the board's 200 W that stood in
/// for it: a 200 W cap is set at 250 W and reads back so. The flash
/// keeps 250 W as a limit the agent left at once, so a crash before the
/// cap's retry does not take it for an administrator's at the restart.
#[test]
fn a_cap_set_at_another_limit_than_asked_is_kept_as_the_agents_at_once() {
    let mut h = Host::new();
    h.floor[0] = Some(Watts(250));
    let t = T0.0 + 1_000;
    lease_now(&mut h, 1, t, 200, 600_000);
    assert_eq!(h.limits[0], Watts(250));
    let kept = h.flash_limits[0].expect("kept");
    assert!(
        kept.asked == Watts(250) || kept.before == Some(Watts(250)),
        "{kept:?}"
    );

    let after = h.crashed(0, t + 5_000);
    assert!(
        said(&after, "set outside the agent").is_empty(),
        "{:?}",
        said(&after, "GPU 0")
    );
    assert_eq!(after.node.ceiling(0), Some(DEFAULT));
    assert!(power_ceilings(&after).is_empty());
}

/// GPU 3 kept `{700, 500}` (the agent's 500 W cap before the restart);
/// an administrator set `limit` while the agent was stopped. GPU 3's read
/// at the start fails, the read just before a 450 W cap's set answers:
/// the administrator's limit is the ceiling at once, said, and the cap's
/// end never lifts GPU 3 above it.
fn read_just_before_a_set(limit: Watts) -> Host {
    let mut h = gpu_3_unread_at(limit, Watts(500));
    h.reads_before_set[3] = true;
    let mut t = T0.0 + 1_000;
    lease_now(&mut h, 1, t, 450, 20_000);
    assert_eq!(h.node.ceiling(3), Some(limit));
    assert!(
        !said(&h, &format!("GPU 3: found at {} W", limit.0)).is_empty(),
        "{:?}",
        said(&h, "GPU 3")
    );
    h.unreadable[3] = false;
    t += 20_000;
    h.step(t, Input::Expiry);
    assert_eq!(h.limits[3], limit, "{:?}", sets_of(&h, 3));
    h
}

#[test]
fn a_gpu_unread_at_the_start_is_read_just_before_a_set() {
    let h = read_just_before_a_set(Watts(480));
    assert_eq!(sets_of(&h, 3), [Watts(450), Watts(480)]);
}

#[test]
fn a_cap_above_the_limit_read_just_before_its_set_is_not_set() {
    let h = read_just_before_a_set(Watts(400));
    assert_eq!(sets_of(&h, 3), [Watts(450)], "asked, not made");
    assert_eq!(h.node.applied(3).0, Some(Watts(400)));
}

/// A cooling lease holds every GPU at 500 W; a lower cap's set fails and
/// 500 W reads back: the cooling cap still holds it there, said as such,
/// never as a GPU uncapped below its ceiling.
#[test]
fn a_set_read_back_at_another_limit_below_the_ceiling_is_never_said_uncapped() {
    let mut h = Host::new();
    let t = T0.0 + 1_000;
    lease_now(&mut h, 1, t, 500, 600_000);
    assert_eq!(
        h.node.applied(0),
        (Some(Watts(500)), Some(CapSource::Cooling))
    );
    let events = h.events.len();
    h.refuse_set = true;
    lease_now(&mut h, 2, t + 1_000, 400, 600_000);
    assert_eq!(h.acks.last().unwrap().code, AckCode::Failed);
    assert_eq!(h.limits, [Watts(500); GPUS]);
    assert_eq!(
        h.node.applied(0),
        (Some(Watts(500)), Some(CapSource::Cooling))
    );
    let uncapped =
        |e: &Event| matches!(e, Event::CapsApplied { limit, source: None, .. } if *limit < DEFAULT);
    assert!(!h.events.iter().any(uncapped), "{:?}", h.events);
    assert_eq!(
        h.events.len(),
        events,
        "nothing changed: {:?}",
        &h.events[events..]
    );

    // Set at a limit that is neither (GPU 1's lowest is 450 W, not the
    // 200 W stood in for it): the cap's source holds it there.
    h.refuse_set = false;
    h.floor[1] = Some(Watts(450));
    lease_now(&mut h, 3, t + 2_000, 300, 600_000);
    assert_eq!(h.limits[1], Watts(450));
    assert_eq!(
        h.node.applied(1),
        (Some(Watts(450)), Some(CapSource::Cooling))
    );
    assert!(!h.events.iter().any(uncapped), "{:?}", h.events);
}
