//! The whole agent against a real mosquitto, one GPU identified late (its
//! first description failed, the board's range stood in) whose late
//! description gives NVML's lowest limit, above the board's: the range is
//! the GPU's from then on, the node's too, and a cap below it is acked
//! clamped to it, not set below what NVML takes. The fixture is
//! `system/rig.rs`, as for `system.rs`.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`),
//! where a missing tool fails the test.

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

use std::time::{Duration, Instant};

use loopwarden_protocol::{AckCode, GpuSelector, Watts};
use node_agent::config::Overrides;
use node_agent::gpu::{GpuDevice, GpuError, GpuInfo, GpuSample, GpuSource};

use rig::{lease, limits, Rig};

/// NVML's lowest limit of the GPU identified late (the board's is 200 W).
const LOWEST: Watts = Watts(300);

/// Twin GPUs of which GPU 1 fails its first description (a driver still
/// loading at the start) and then describes itself with [`LOWEST`] as its
/// lowest limit. Its sets are the twin's: the agent alone keeps a cap
/// within that range.
struct LateSource(node_agent::sim_gpus::TwinSource);

impl GpuSource for LateSource {
    fn devices(&mut self) -> Result<Vec<Box<dyn GpuDevice>>, GpuError> {
        let devices = self.0.devices()?.into_iter().enumerate();
        Ok(devices
            .map(|(i, d)| Box::new(LateGpu(d, i == 1, i == 1)) as Box<dyn GpuDevice>)
            .collect())
    }
    fn watch_xids(
        &mut self,
        sink: node_agent::xid_queue::XidSink,
    ) -> Result<Vec<(u8, GpuError)>, GpuError> {
        self.0.watch_xids(sink)
    }
}

/// A GPU whose first description fails when `.1`, and whose lowest limit
/// is [`LOWEST`] when `.2`.
struct LateGpu(Box<dyn GpuDevice>, bool, bool);

impl GpuDevice for LateGpu {
    fn describe(&mut self) -> Result<GpuInfo, GpuError> {
        if std::mem::replace(&mut self.1, false) {
            return Err(GpuError::Timeout);
        }
        let info = self.0.describe()?;
        Ok(match self.2 {
            true => GpuInfo {
                min_limit: LOWEST,
                ..info
            },
            false => info,
        })
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

#[test]
fn a_gpu_identified_late_takes_the_range_its_description_gives() {
    let Some(rig) = Rig::start("l1") else {
        return;
    };
    let mut sub = rig.subscribe(&["ack"]);
    let board = loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("board");
    let agent = rig
        .agent(2)
        .source(LateSource(node_agent::sim_gpus::TwinSource::new(
            &board, 2, 3,
        )))
        .flags(Overrides {
            period_ms: Some(100),
            ..Default::default()
        })
        .start();
    // Identified at the first rounds: its UUID, and its range.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut caps = serde_json::Value::Null;
    while Instant::now() < deadline {
        caps = agent.ctl(&["caps"]).unwrap_or_default();
        if caps["gpus"][1]["min"] == LOWEST.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(caps["gpus"][1]["min"], LOWEST.0, "{caps}");
    assert_eq!(caps["gpus"][0]["min"], 200, "{caps}");
    // Its default limit is the one its late description gave (none was
    // read at the start: the board's stood in, not shown as its own).
    let tdp = board.power.tdp_w.0;
    assert_eq!(caps["gpus"][1]["default"], tdp, "{caps}");

    let ack = rig.ack(&mut sub, &lease(1, 1, &[(GpuSelector::All, 250)], 60_000));
    assert_eq!(ack.code, AckCode::Clamped, "{}", ack.detail.as_str());
    assert_eq!(
        ack.detail.as_str(),
        "GPU 1: 250 W is below its minimum 300 W; clamped to 300 W"
    );
    assert_eq!(limits(&ack), vec![250, LOWEST.0]);
    agent.stop();
}
