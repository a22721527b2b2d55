//! The whole agent over a config store lost since an earlier run, GPU 1
//! quarantined as the event log says, and GPU 1 not describing itself at
//! the start (its driver still loading): the store's lost mark waits for
//! it; once it says its UUID in the run, the agent's own late
//! identification keeps its state under it and starts the mark's clear
//! (without either, `ctl status` never shows the clear under way), and a
//! clean stop that comes while the clear is still under way (the flash
//! slowed by the fault injection of `FileFlash`) leaves it done: the next
//! start reads the store intact, GPU 1 quarantined as kept. (The stop
//! both waits for the clear and flushes the flash after it; the flush
//! alone lets the clear's last write in here, so the wait itself is shown
//! by `startup::tests::a_clean_stop_waits_for_the_lost_marks_clear_under_way`,
//! on a runtime that has not run the clear.) The fixture is
//! `system/rig.rs`, as for `system.rs`.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`),
//! where a missing tool fails the test. Alone in its binary: it sets the
//! flash's sync delay for the whole process.

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use loopwarden_protocol::{Event, GpuIndex, HealthState, Message, MessageKind, ReasonCode, Watts};
use node_agent::gpu::{GpuDevice, GpuError, GpuInfo, GpuSample, GpuSource};
use rig::Rig;

/// Twin GPUs of which GPU 1 fails its first description.
struct LateSource(node_agent::sim_gpus::TwinSource);

impl LateSource {
    fn new() -> Self {
        let board = loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("board");
        Self(node_agent::sim_gpus::TwinSource::new(&board, 2, 3))
    }
}

impl GpuSource for LateSource {
    fn devices(&mut self) -> Result<Vec<Box<dyn GpuDevice>>, GpuError> {
        let devices = self.0.devices()?.into_iter().enumerate();
        Ok(devices
            .map(|(i, d)| Box::new(LateGpu(d, i == 1)) as Box<dyn GpuDevice>)
            .collect())
    }
    fn watch_xids(
        &mut self,
        sink: node_agent::xid_queue::XidSink,
    ) -> Result<Vec<(u8, GpuError)>, GpuError> {
        self.0.watch_xids(sink)
    }
}

/// A GPU whose first description fails when `.1`.
struct LateGpu(Box<dyn GpuDevice>, bool);

impl GpuDevice for LateGpu {
    fn describe(&mut self) -> Result<GpuInfo, GpuError> {
        if std::mem::replace(&mut self.1, false) {
            return Err(GpuError::Timeout);
        }
        self.0.describe()
    }
    fn sample(&mut self) -> Result<GpuSample, GpuError> {
        self.0.sample()
    }
    fn set_power_limit(&mut self, w: Watts) -> Result<(), GpuError> {
        self.0.set_power_limit(w)
    }
    fn power_limit(&mut self) -> Result<Watts, GpuError> {
        self.0.power_limit()
    }
}

/// GPU 1's quarantine logged in the event log of the flash file at
/// `path`, then its config store erased.
fn quarantine_logged_then_store_lost(path: &std::path::Path) {
    {
        let mut stores = loopwarden_store::agent_flash::open(Some(path)).expect("flash");
        let change = Message::Event(Event::HealthChanged {
            gpu: GpuIndex::new(1).expect("index"),
            from: HealthState::Healthy,
            to: HealthState::Quarantined,
            reason: ReasonCode::DBE_VOLATILE,
        });
        let body = loopwarden_store::resend::event_body(&change).expect("body");
        let at = loopwarden_bus::now_ms();
        let kind = MessageKind::Event as u8;
        futures::executor::block_on(stores.log.append(at, kind, &body)).expect("append");
    }
    let layout = loopwarden_boards::FlashBoard::host_file().layout();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("flash file");
    let config = vec![0xFF; (layout.config.end - layout.config.start) as usize];
    file.write_all_at(&config, layout.config.start.into())
        .expect("config store erased");
}

/// `ctl status` polled until `done` says so of it (within 60 s), every
/// answer before it checked by `meanwhile`.
fn status_until(
    agent: &rig::InProcess,
    done: impl Fn(&serde_json::Value) -> bool,
    meanwhile: impl Fn(&serde_json::Value),
) -> serde_json::Value {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let status = agent.ctl_within(&["status"], Duration::from_secs(40), "no status");
        if done(&status) {
            return status;
        }
        meanwhile(&status);
        assert!(Instant::now() < end, "not within 60 s: {status}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_gpu_identified_late_after_a_loss_clears_the_mark_even_with_a_stop_during_the_clear() {
    let Some(rig) = Rig::start("lost2") else {
        return;
    };
    let agent = rig.agent(2).flash().source(LateSource::new()).start();
    agent.ctl_within(&["status"], Duration::from_secs(10), "no first start");
    agent.stop();
    quarantine_logged_then_store_lost(&rig.flash());

    // Each sync of the flash slowed: the clear, two writes waited for,
    // is still under way for about 2 s, many polls of ctl even on a
    // loaded machine.
    std::env::set_var(loopwarden_flash::file::SYNC_DELAY_ENV, "1000");
    let agent = rig.agent(2).flash().source(LateSource::new()).start();
    let clearing = |s: &serde_json::Value| s["config_lost"]["clearing"] == true;
    status_until(&agent, clearing, |s| {
        assert!(
            s["config_lost"].is_object(),
            "the mark cleared before it was seen under way: {s}"
        );
    });
    agent.stop();
    std::env::remove_var(loopwarden_flash::file::SYNC_DELAY_ENV);
    let stores = loopwarden_store::agent_flash::open(Some(&rig.flash())).expect("flash");
    assert!(
        !stores.config_lost,
        "the stop waited for the clear: the next start reads the store intact"
    );
    drop(stores);

    let agent = rig.agent(2).flash().source(LateSource::new()).start();
    let status = status_until(&agent, |s| s["health"]["quarantined"] == 1, |_| {});
    assert!(status["config_lost"].is_null(), "{status}");
    agent.stop();
}
