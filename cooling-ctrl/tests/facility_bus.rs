//! Two controllers of one hall on a real mosquitto, each with its own
//! simulated CDU on Modbus TCP: each publishes its offer in its retained
//! state (and its JSON mirror, for the BMS), the coordinator plans the
//! hall's facility water from both offers and publishes the plan, and the
//! other controller follows it.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

mod shell_rig;

use std::time::Duration;

use cooling_core::CoreConfig;
use cooling_ctrl::facility::FacilityRole;
use cooling_ctrl::shell::{ShellConfig, ShellOptions, ShellStats};
use loopwarden_system_tests::Mosquitto;
use shell_rig::{id, retained_now, sim_cdu, Running};

const SITE: &str = "hall-f";

/// A controller of CDU `cdu` in a hall of two, `cdu-1` coordinating.
async fn controller(broker: &Mosquitto, cdu: &str) -> Running {
    let port = sim_cdu().await;
    let mut core = CoreConfig::default();
    core.facility.cdus = 2;
    let mut cfg = ShellConfig::new(id(SITE), id(cdu), broker.addr(), core);
    cfg.period = Duration::from_millis(100);
    let opts = ShellOptions {
        facility: Some(FacilityRole {
            coordinator: id("cdu-1"),
            cdus: vec![id("cdu-1"), id("cdu-2")],
        }),
        ..Default::default()
    };
    Running::start(cfg, opts, port)
}

/// The first stats of `shell` that `f` holds for, within 45 s.
async fn wait(shell: &mut Running, what: &str, f: impl FnMut(&ShellStats) -> bool) -> ShellStats {
    shell.wait(Duration::from_secs(45), what, f).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_plans_from_both_offers_and_the_other_cdu_follows_its_plan() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let mut one = controller(&broker, "cdu-1").await;
    let mut two = controller(&broker, "cdu-2").await;

    let coordinating = wait(&mut one, "a plan from both offers", |s| {
        let f = s.status.as_ref().and_then(|st| st.facility.clone());
        f.is_some_and(|f| f.coordinates && f.plan.is_some_and(|(_, offers)| offers == 2))
    })
    .await;
    let f = coordinating
        .status
        .and_then(|s| s.facility)
        .expect("facility status");
    let (plan, _) = f.plan.expect("a plan");
    let offer = f.offer.expect("its own offer");
    // No water warmer than the CDU accepts uncapped, unless it caps.
    assert!(
        plan.capping != 0 || plan.water_c <= offer.accept_c + 1e-3,
        "{plan:?} {offer:?}"
    );

    let following = wait(&mut two, "the plan followed", |s| {
        let f = s.status.as_ref().and_then(|st| st.facility.clone());
        f.is_some_and(|f| !f.coordinates && f.following.is_some() && f.offer.is_some())
    })
    .await;
    let f = following.status.and_then(|s| s.facility).expect("facility");
    let (water, ago_ms) = f.following.expect("following");
    assert!(ago_ms < 15_000, "heard {ago_ms} ms ago");
    assert!(water > 0.0 && water < 45.0, "{water}");
    assert_eq!(f.coordinator, "cdu-1");

    // The facility's systems read both in the JSON mirror, retained.
    let states = retained_now(
        broker.port(),
        format!("dc/v2/{SITE}/json/cdu/+/health"),
        Duration::from_secs(2),
    )
    .await;
    let body = |cdu: &str| -> serde_json::Value {
        let seen = states
            .iter()
            .find(|s| s.topic.ends_with(&format!("/cdu/{cdu}/health")))
            .unwrap_or_else(|| panic!("{cdu}'s retained state in the JSON tree"));
        let v: serde_json::Value = serde_json::from_slice(&seen.payload).expect("JSON");
        v["body"]["facility"].clone()
    };
    let (f1, f2) = (body("cdu-1"), body("cdu-2"));
    assert!(f1["plan"]["water"].is_number(), "{f1}");
    assert!(f2["plan"].is_null(), "only the coordinator plans: {f2}");
    assert!(f2["offer"]["accept"].is_number(), "{f2}");
    assert!(f2["offer"]["heat"].as_u64().is_some_and(|w| w > 0), "{f2}");

    one.stop().await;
    two.stop().await;
}
