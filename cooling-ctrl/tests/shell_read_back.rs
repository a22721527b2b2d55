//! A CDU that echoes its valves word but does not hold it: the
//! controller holds its heartbeat back until a read-back reads the word
//! held (the CDU falls back to its own control meanwhile), and says so
//! on the bus (the state degraded, `heartbeat-held`), in `/metrics`
//! (`loopwarden_cdu_heartbeat_held`) and on the console (`ctl status`);
//! once the CDU holds it, the heartbeat goes out again and all of it reads
//! normal. The controller's real-time shell against a real mosquitto and
//! the simulated CDU on Modbus TCP (the rig: `shell_cdu`).
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

// The shared rigs' parts other files use.
#[allow(dead_code)]
mod shell_cdu;
#[allow(dead_code)]
mod shell_rig;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cooling_core::CoreConfig;
use cooling_ctrl::console::{self, Context, Request};
use cooling_ctrl::journal::ControllerFlash;
use cooling_ctrl::metrics::CduMetrics;
use cooling_ctrl::shell::ShellStats;
use loopwarden_field::console::Caller;
use loopwarden_protocol::message::{CduMode, CduState};
use loopwarden_protocol::{Family, Message, ReasonCode, TimestampMs};
use loopwarden_system_tests::Mosquitto;
use shell_cdu::*;

/// The mode and its reason after the shell's last step.
fn mode(s: &ShellStats) -> Option<(CduMode, ReasonCode)> {
    s.status.as_ref().map(|st| (st.mode, st.reason))
}

/// A console context of this controller whose shell last reported `st`.
fn context(st: ShellStats) -> Context {
    let (tx, stats) = cooling_ctrl::shell::stats_channel();
    tx.send_replace(st);
    Context {
        site: SITE.into(),
        cdu: CDU.into(),
        hosts: host_ids().iter().map(ToString::to_string).collect(),
        hosts_per_rack: 4,
        link: "Modbus TCP".into(),
        map_model: "sim-cdu".into(),
        broker: "mosquitto".into(),
        period: PERIOD,
        lease: Duration::from_secs(30),
        demo_key: false,
        started: TimestampMs(0),
        stats,
        recorder: ControllerFlash::open(None)
            .expect("a flash in memory")
            .recorder,
        protection_off: Vec::new(),
        operator: None,
    }
}

/// What `/metrics` says of the heartbeat, and `ctl status`'s row of it
/// (`None`: no such row), after `st`.
async fn said(st: &ShellStats) -> (f64, Option<String>) {
    let ctx = Arc::new(context(st.clone()));
    let layout = CoreConfig::default().layout;
    let text = CduMetrics::new(ctx.clone(), &layout).render();
    let series = format!(r#"loopwarden_cdu_heartbeat_held{{cdu="{CDU}"}} "#);
    let metric = text
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .parse()
        .expect("a number");
    let v = console::answer(&ctx, Request::Status, Caller { uid: None }).await;
    let status = console::render(&Request::Status, &v);
    let row = status.lines().find(|l| l.starts_with("HEARTBEAT HELD"));
    (metric, row.map(str::to_string))
}

/// The next retained or fresh state on `rx` in `mode`.
async fn state_in(
    rx: &mut tokio::sync::mpsc::Receiver<loopwarden_bus::Inbound>,
    mode: CduMode,
) -> CduState {
    first(rx, Duration::from_secs(5), "the CduState", |m| {
        match &m.frame.message {
            Message::CduState(st) if st.mode == mode => Some(st.clone()),
            _ => None,
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valves_word_the_cdu_does_not_hold_holds_the_heartbeat_back_and_says_so() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let mut core = CoreConfig::default();
    core.timing.boot_settle_ms = 1_000;
    let cdu = sim_cdu();
    // While `unheld`, the CDU echoes each valves word and keeps every
    // valve shut.
    let unheld = Arc::new(AtomicBool::new(false));
    let (flag, own) = (unheld.clone(), cdu.clone());
    let valves = cdu.map().get("valves_open").expect("mapped").address;
    cdu.observe_writes(move |w| {
        if w.address == valves && w.outcome.is_ok() && flag.load(Ordering::SeqCst) {
            own.write_setting("valves_open", 0.0).expect("in range");
        }
    });
    let mut rig = Rig::start_cdu(broker, core, None, None, None, cdu, None).await;
    let normal = Some((CduMode::Normal, ReasonCode::OK));
    let s = rig.wait_stats("normal", |s| mode(s) == normal).await;
    assert_eq!(said(&s).await, (0.0, None));

    unheld.store(true, Ordering::SeqCst);
    let degraded = Some((CduMode::Degraded, ReasonCode::HEARTBEAT_HELD));
    let s = rig
        .wait_stats("the heartbeat held back, the mode degraded", |s| {
            s.heartbeat_held.is_some() && mode(s) == degraded
        })
        .await;
    let (metric, row) = said(&s).await;
    assert_eq!(metric, 1.0);
    let row = row.expect("a HEARTBEAT HELD row");
    assert!(
        row.contains("valves_open") && row.contains("reads back value 0"),
        "{row}"
    );
    // The CDU's heartbeat register stands still.
    let beat = rig.cdu.setting("heartbeat").expect("mapped");
    let at = s.steps;
    let s = rig.wait_stats("3 steps more", |s| s.steps >= at + 3).await;
    assert!(s.heartbeat_held.is_some());
    assert_eq!(rig.cdu.setting("heartbeat").expect("mapped"), beat);
    let (probe, mut rx) = rig.probe("probe-hb", &[cdu_topic(Family::Health)]).await;
    let st = state_in(&mut rx, CduMode::Degraded).await;
    assert_eq!(st.reason, ReasonCode::HEARTBEAT_HELD, "{st:?}");

    // The CDU holds its valves word again: the heartbeat goes out, and
    // all of it reads normal.
    unheld.store(false, Ordering::SeqCst);
    let s = rig
        .wait_stats("the heartbeat written again, the mode normal", |s| {
            s.heartbeat_held.is_none() && mode(s) == normal
        })
        .await;
    assert_eq!(said(&s).await, (0.0, None));
    let at = s.steps;
    rig.wait_stats("2 steps more", |s| s.steps >= at + 2).await;
    assert_ne!(rig.cdu.setting("heartbeat").expect("mapped"), beat);
    let st = state_in(&mut rx, CduMode::Normal).await;
    assert_eq!(st.reason, ReasonCode::OK, "{st:?}");
    let _ = probe.shutdown(Duration::from_secs(1)).await;
    rig.stop().await;
}
