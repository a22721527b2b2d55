//! The whole agent against a real mosquitto, one GPU identified late (its
//! first description failed, the board's range stood in) whose late
//! description gives NVML's lowest limit, above the board's: the range is
//! the GPU's from then on, the node's too, and a cap below it is acked
//! clamped to it, not set below what NVML takes; and one whose set NVML
//! took at its new lowest limit, which the DCGM limit series then show.
//! The fixture is `system/rig.rs`, as for `system.rs`.
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

/// NVML's default limit of the GPU identified late (the board's `tdp_w`
/// is 700 W).
const LATE_DEFAULT: Watts = Watts(650);

/// Twin GPUs of which GPU 1 fails its first description (a driver still
/// loading at the start) and then describes itself with [`LOWEST`] as its
/// lowest limit and [`LATE_DEFAULT`] as its default. Its sets are the twin's: the agent alone keeps a cap
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
/// is [`LOWEST`] (its default [`LATE_DEFAULT`]) when `.2`.
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
                default_limit: LATE_DEFAULT,
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
    // Its default limit shown is the one its late description gave (none
    // was read at the start: the board's stood in, not shown as its own).
    // Decisions never take it: its ceiling is the limit found on it (the
    // twin's 700 W), not NVML's default, late or not.
    assert_eq!(caps["gpus"][1]["default"], LATE_DEFAULT.0, "{caps}");
    assert_eq!(caps["gpus"][1]["ceiling"], 700, "{caps}");
    // Nor is it the highest cap taken: 680 W, above it, is set as asked.
    let ack = rig.ack(&mut sub, &lease(1, 1, &[(GpuSelector::All, 680)], 60_000));
    assert_eq!(ack.code, AckCode::Ok, "{}", ack.detail.as_str());
    assert_eq!(limits(&ack), vec![680, 680]);

    let ack = rig.ack(&mut sub, &lease(2, 2, &[(GpuSelector::All, 250)], 60_000));
    assert_eq!(ack.code, AckCode::Clamped, "{}", ack.detail.as_str());
    assert_eq!(
        ack.detail.as_str(),
        "GPU 1: 250 W is below its minimum 300 W; clamped to 300 W"
    );
    assert_eq!(limits(&ack), vec![250, LOWEST.0]);
    agent.stop();
}

/// Twin GPUs of which GPU 1 narrows its limit constraints after the start
/// (NVML's lowest limit [`LOWEST`] from then on; 200 W, the twin's, at
/// the start).
struct NarrowingSource(node_agent::sim_gpus::TwinSource);

impl GpuSource for NarrowingSource {
    fn devices(&mut self) -> Result<Vec<Box<dyn GpuDevice>>, GpuError> {
        let devices = self.0.devices()?.into_iter().enumerate();
        Ok(devices
            .map(|(i, d)| {
                Box::new(NarrowingGpu {
                    gpu: d,
                    narrows: i == 1,
                    narrowed: false,
                }) as Box<dyn GpuDevice>
            })
            .collect())
    }
    fn watch_xids(
        &mut self,
        sink: node_agent::xid_queue::XidSink,
    ) -> Result<Vec<(u8, GpuError)>, GpuError> {
        self.0.watch_xids(sink)
    }
}

/// A GPU that, where `narrows`, takes a set below [`LOWEST`] at
/// [`LOWEST`] (NVML sets within the constraints it reads then) and
/// describes itself with it as its lowest limit from then on.
struct NarrowingGpu {
    gpu: Box<dyn GpuDevice>,
    narrows: bool,
    narrowed: bool,
}

impl GpuDevice for NarrowingGpu {
    fn describe(&mut self) -> Result<GpuInfo, GpuError> {
        let info = self.gpu.describe()?;
        Ok(match self.narrowed {
            true => GpuInfo {
                min_limit: LOWEST,
                ..info
            },
            false => info,
        })
    }
    fn sample(&mut self) -> Result<GpuSample, GpuError> {
        self.gpu.sample()
    }
    fn set_power_limit(&mut self, w: Watts) -> Result<(), GpuError> {
        if self.narrows && w < LOWEST {
            self.narrowed = true;
            return self.gpu.set_power_limit(LOWEST);
        }
        self.gpu.set_power_limit(w)
    }
    fn power_limit(&mut self) -> Result<Watts, GpuError> {
        self.gpu.power_limit()
    }
}

/// The value of `name` for GPU `gpu` in the exposition `text`, if there.
fn series(text: &str, name: &str, gpu: u8) -> Option<f64> {
    let labelled = format!("{name}{{gpu=\"{gpu}\"");
    text.lines()
        .find(|l| l.starts_with(&labelled))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A set NVML took at another limit than asked has the GPU described
/// again: the lowest limit it gives then (300 W, 200 W at the start) is
/// its range's and what `DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN` says, NVML's
/// as it gave it now, not the one read at the start.
#[test]
fn a_set_nvml_took_at_its_new_lowest_limit_updates_the_dcgm_limits() {
    let Some(rig) = Rig::start("l2") else {
        return;
    };
    let mut sub = rig.subscribe(&["ack"]);
    let board = loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("board");
    let metrics: std::net::SocketAddr =
        ([127, 0, 0, 1], loopwarden_system_tests::free_port()).into();
    let agent = rig
        .agent(2)
        .source(NarrowingSource(node_agent::sim_gpus::TwinSource::new(
            &board, 2, 3,
        )))
        .flags(Overrides {
            period_ms: Some(100),
            metrics_listen: Some(metrics.to_string()),
            ..Default::default()
        })
        .start();
    agent.ctl_within(&["status"], Duration::from_secs(20), "no console");
    let scrape = || {
        let (code, body) =
            loopwarden_system_tests::prometheus::http_get(metrics, "/metrics").expect("/metrics");
        assert_eq!(code, 200, "{body}");
        body
    };
    let min = "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN";
    assert_eq!(
        series(&scrape(), min, 1),
        Some(200.0),
        "as read at the start"
    );

    rig.ack(&mut sub, &lease(1, 1, &[(GpuSelector::All, 250)], 60_000));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut text = scrape();
    while Instant::now() < deadline && series(&text, min, 1) != Some(f64::from(LOWEST.0)) {
        std::thread::sleep(Duration::from_millis(100));
        text = scrape();
    }
    assert_eq!(series(&text, min, 1), Some(f64::from(LOWEST.0)), "{text}");
    assert_eq!(series(&text, min, 0), Some(200.0), "{text}");
    let caps = agent.ctl(&["caps"]).unwrap_or_default();
    assert_eq!(caps["gpus"][1]["min"], LOWEST.0, "{caps}");
    agent.stop();
}
