//! A config store lost since an earlier run, on a host whose event log
//! cannot tell the cooling-loss phase (it is not whole: its oldest
//! sector erased, as a wrap cut before its marker leaves it): the store's
//! lost mark is cleared in the run that learns the phase from the CDU,
//! not left for every later start to read the store as lost again.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`),
//! where a missing tool fails the test.

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use loopwarden_protocol::{Event, GpuIndex, HealthState, Message, MessageKind, ReasonCode};
use node_agent::config::Overrides;
use rig::Rig;

/// Rack 2 of `cdu-a`, the rack the rig's CDU states speak of.
fn rack_2() -> Overrides {
    Overrides {
        rack: Some(2),
        ..Overrides::default()
    }
}

/// Health changes appended to the log of the flash file at `path` until
/// its first sector is full and more, then that sector and the config
/// store erased: a log whose oldest record is not 0, a store lost.
fn lose_store_and_oldest_records(path: &std::path::Path) {
    {
        let mut stores = loopwarden_store::agent_flash::open(Some(path)).expect("flash");
        let change = Message::Event(Event::HealthChanged {
            gpu: GpuIndex::new(0).expect("index"),
            from: HealthState::Healthy,
            to: HealthState::Degraded,
            reason: ReasonCode::STRAGGLER,
        });
        let body = loopwarden_store::resend::event_body(&change).expect("body");
        let kind = MessageKind::Event as u8;
        for _ in 0..400 {
            let at = loopwarden_bus::now_ms();
            futures::executor::block_on(stores.log.append(at, kind, &body)).expect("append");
        }
    }
    let board = loopwarden_boards::FlashBoard::host_file();
    let layout = board.layout();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("flash file");
    let sector = 4096u32;
    let erased = vec![0xFF; sector as usize];
    file.write_all_at(&erased, layout.log.start.into())
        .expect("first log sector erased");
    let config = vec![0xFF; (layout.config.end - layout.config.start) as usize];
    file.write_all_at(&config, layout.config.start.into())
        .expect("config store erased");
}

/// The cooling-loss phase `ctl status` shows, waited for until it is not
/// `unknown` (within 10 s).
fn phase_known(agent: &rig::InProcess) -> String {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let status = agent.ctl_within(&["status"], Duration::from_secs(10), "no status");
        let phase = status["cooling_loss"]["phase"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if phase != "unknown" || Instant::now() > end {
            return phase;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_lost_store_whose_phase_the_cdu_decides_clears_its_mark_in_that_run() {
    let Some(rig) = Rig::start("lost1") else {
        return;
    };
    rig.forget_cdu_state();
    let agent = rig.agent(2).flash().flags(rack_2()).start();
    agent.ctl_within(
        &["status"],
        Duration::from_secs(10),
        "the first start never answered",
    );
    agent.stop();
    lose_store_and_oldest_records(&rig.flash());

    let agent = rig.agent(2).flash().flags(rack_2()).start();
    let status = agent.ctl_within(
        &["status"],
        Duration::from_secs(10),
        "the start never answered",
    );
    assert_eq!(
        status["cooling_loss"]["phase"], "unknown",
        "the log is not whole: the phase is the CDU's to decide"
    );
    assert_eq!(
        (
            &status["config_lost"]["phase_unknown"],
            &status["config_lost"]["waiting_for"]
        ),
        (&serde_json::json!(true), &serde_json::json!([])),
        "ctl status says the lost mark waits for the CDU's word: {status}"
    );
    rig.publish_cdu_state(false, 1);
    assert_eq!(phase_known(&agent), "cooled", "the CDU's word taken");
    // The mark is cleared off the loop, in order after the phase; a clean
    // stop waits for it, with no time given to it first.
    agent.stop();

    let stores = loopwarden_store::agent_flash::open(Some(&rig.flash())).expect("flash");
    assert!(
        !stores.config_lost,
        "the phase known and kept in the run: the next start reads the store as intact"
    );
}
