//! A GPU's description at start, and its limit sets, when NVML fails a
//! power-limit call, tested through [`NvmlGpu`] over a scripted
//! [`NvmlApi`]:
//! - a default limit or limit constraints that cannot be read (not
//!   supported, an unknown error, a timeout, no permission) keep the
//!   name and the UUID, and give [`UNREAD_LIMIT`] for that limit only; a
//!   failed UUID or name, or a lost GPU, still fail the description;
//! - on a GPU whose constraints were not read at start, a limit NVML
//!   refuses as invalid has them read again and is set within them, and
//!   later limits are set within them without a refusal first; where the
//!   constraints cannot be read, or the limit refused is within them,
//!   the refusal stands. Constraints read at a description are read
//!   again at a refusal too: the shell may not hold the range they gave
//!   (a description that came after its deadline, or a GPU identified
//!   late kept the board's range).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use loopwarden_protocol::Watts;
use node_agent::gpu::{GpuDevice, GpuError, GpuInfo};
use node_agent::nvml::{CallCosts, NvmlApi, NvmlFailure, NvmlGpu, NvmlResult, UNREAD_LIMIT};

const NAME: &str = "NVIDIA H200";
const UUID: &str = "GPU-0c1d2e3f-0000-4000-8000-000000000000";

/// What the scripted GPU answers, and what was asked of it.
#[derive(Clone)]
struct Script {
    name: NvmlResult<String>,
    uuid: NvmlResult<String>,
    default_mw: NvmlResult<u32>,
    /// The GPU's real range, mW: a set outside it is refused as invalid.
    range_mw: (u32, u32),
    /// How `nvmlDeviceGetPowerManagementLimitConstraints` fails, if it
    /// does.
    constraints_fail: Option<NvmlFailure>,
    /// Every set refused as invalid (a handle NVML takes for invalid).
    refuse_every_set: bool,
    limit_mw: u32,
    /// `nvmlDeviceGetPersistenceMode`'s answer.
    persistence: NvmlResult<bool>,
    /// Every limit asked, mW, in order.
    sets: Vec<u32>,
    constraint_reads: u32,
}

impl Script {
    fn healthy() -> Self {
        Self {
            name: Ok(NAME.into()),
            uuid: Ok(UUID.into()),
            default_mw: Ok(700_000),
            range_mw: (200_000, 700_000),
            constraints_fail: None,
            refuse_every_set: false,
            limit_mw: 700_000,
            persistence: Ok(true),
            sets: Vec::new(),
            constraint_reads: 0,
        }
    }
}

struct Fake(Mutex<Script>);

impl Fake {
    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.0.lock().unwrap()
    }
}

/// A GPU over `script`, and the script to change and read.
fn gpu(script: Script) -> (Arc<Fake>, NvmlGpu<Fake>) {
    let fake = Arc::new(Fake(Mutex::new(script)));
    (fake.clone(), NvmlGpu::new(fake, 0))
}

fn info(default: Watts, min: Watts, max: Watts) -> GpuInfo {
    GpuInfo {
        name: NAME.into(),
        uuid: UUID.into(),
        default_limit: default,
        min_limit: min,
        max_limit: max,
        persistence: Some(true),
    }
}

impl NvmlApi for Fake {
    fn device_count(&self) -> NvmlResult<u32> {
        Ok(1)
    }
    fn name(&self, _: u32) -> NvmlResult<String> {
        self.script().name.clone()
    }
    fn uuid(&self, _: u32) -> NvmlResult<String> {
        self.script().uuid.clone()
    }
    fn default_limit_mw(&self, _: u32) -> NvmlResult<u32> {
        self.script().default_mw.clone()
    }
    fn limit_constraints_mw(&self, _: u32) -> NvmlResult<(u32, u32)> {
        let mut s = self.script();
        s.constraint_reads += 1;
        match &s.constraints_fail {
            Some(e) => Err(e.clone()),
            None => Ok(s.range_mw),
        }
    }
    fn limit_mw(&self, _: u32) -> NvmlResult<u32> {
        Ok(self.script().limit_mw)
    }
    fn enforced_limit_mw(&self, _: u32) -> NvmlResult<u32> {
        Ok(self.script().limit_mw)
    }
    fn set_limit_mw(&self, _: u32, mw: u32) -> NvmlResult<()> {
        let mut s = self.script();
        s.sets.push(mw);
        let (min, max) = s.range_mw;
        if s.refuse_every_set || !(min..=max).contains(&mw) {
            return Err(NvmlFailure::InvalidArgument);
        }
        s.limit_mw = mw;
        Ok(())
    }
    fn persistence_mode(&self, _: u32) -> NvmlResult<bool> {
        self.script().persistence.clone()
    }
    fn temperature(&self, _: u32) -> NvmlResult<u32> {
        Err(NvmlFailure::NotSupported)
    }
    fn power_usage_mw(&self, _: u32) -> NvmlResult<u32> {
        Err(NvmlFailure::NotSupported)
    }
    fn energy_mj(&self, _: u32) -> NvmlResult<u64> {
        Err(NvmlFailure::NotSupported)
    }
    fn clocks_mhz(&self, _: u32) -> NvmlResult<(u32, u32)> {
        Err(NvmlFailure::NotSupported)
    }
    fn utilization(&self, _: u32) -> NvmlResult<u32> {
        Err(NvmlFailure::NotSupported)
    }
    fn throttle_bits(&self, _: u32) -> NvmlResult<u64> {
        Err(NvmlFailure::NotSupported)
    }
    fn ecc_enabled(&self, _: u32) -> NvmlResult<bool> {
        Err(NvmlFailure::NotSupported)
    }
    fn ecc_total(&self, _: u32, _: bool, _: bool) -> NvmlResult<u64> {
        Err(NvmlFailure::NotSupported)
    }
    fn fields(&self, _: u32, _: &[u32]) -> NvmlResult<Vec<NvmlResult<u64>>> {
        Err(NvmlFailure::NotSupported)
    }
    fn watch_xids(
        &self,
        _: &[u32],
        _: &mut dyn FnMut(u32, NvmlResult<()>),
        _: &mut dyn FnMut(u32, u64),
        _: &AtomicBool,
    ) -> NvmlResult<()> {
        Err(NvmlFailure::NotSupported)
    }
}

/// The failures a power-limit read may answer that keep the GPU's
/// identity.
fn failures() -> [NvmlFailure; 5] {
    [
        NvmlFailure::NotSupported,
        NvmlFailure::Other("Unknown Error".into()),
        NvmlFailure::Timeout,
        NvmlFailure::NoPermission,
        NvmlFailure::InvalidArgument,
    ]
}

/// The persistence mode is part of the description: off is kept as off
/// (the shell refuses it on real GPUs), and one that cannot be read is
/// not known, never an error, except a lost GPU.
#[test]
fn the_persistence_mode_is_described_and_an_unreadable_one_is_not_known() {
    let (_, mut off_gpu) = gpu(Script {
        persistence: Ok(false),
        ..Script::healthy()
    });
    let off = off_gpu.describe().expect("described");
    assert_eq!(off.persistence, Some(false));
    assert_eq!((off.min_limit, off.max_limit), (Watts(200), Watts(700)));
    for e in failures() {
        let (_, mut unread) = gpu(Script {
            persistence: Err(e.clone()),
            ..Script::healthy()
        });
        let d = unread.describe().expect("described");
        assert_eq!(d.persistence, None, "{e:?}");
        assert_eq!(d.uuid, UUID, "{e:?}");
    }
    let (_, mut gpu) = gpu(Script {
        persistence: Err(NvmlFailure::GpuLost),
        ..Script::healthy()
    });
    assert_eq!(gpu.describe(), Err(GpuError::Lost));
}

#[test]
fn unreadable_limit_constraints_keep_the_name_uuid_and_default() {
    for e in failures() {
        let (_, mut gpu) = gpu(Script {
            constraints_fail: Some(e.clone()),
            ..Script::healthy()
        });
        assert_eq!(
            gpu.describe(),
            Ok(info(Watts(700), UNREAD_LIMIT, UNREAD_LIMIT)),
            "{e:?}"
        );
    }
}

#[test]
fn an_unreadable_default_limit_keeps_the_name_uuid_and_range() {
    for e in failures() {
        let (_, mut gpu) = gpu(Script {
            default_mw: Err(e.clone()),
            ..Script::healthy()
        });
        assert_eq!(
            gpu.describe(),
            Ok(info(UNREAD_LIMIT, Watts(200), Watts(700))),
            "{e:?}"
        );
    }
}

#[test]
fn an_unreadable_uuid_or_a_lost_gpu_fails_the_description() {
    let (fake, mut gpu) = gpu(Script {
        uuid: Err(NvmlFailure::NotSupported),
        ..Script::healthy()
    });
    assert_eq!(
        gpu.describe(),
        Err(GpuError::Nvml {
            what: "nvmlDeviceGetUUID",
            failure: NvmlFailure::NotSupported
        })
    );
    fake.script().uuid = Ok(UUID.into());
    fake.script().constraints_fail = Some(NvmlFailure::GpuLost);
    assert_eq!(gpu.describe(), Err(GpuError::Lost));
}

/// A GPU described with its constraints unreadable, readable since.
fn unread_at_start() -> (Arc<Fake>, NvmlGpu<Fake>) {
    let (fake, mut gpu) = gpu(Script {
        constraints_fail: Some(NvmlFailure::NotSupported),
        ..Script::healthy()
    });
    gpu.describe().expect("described");
    fake.script().constraints_fail = None;
    (fake, gpu)
}

#[test]
fn a_limit_refused_with_constraints_unread_at_start_is_set_within_them() {
    let (fake, mut gpu) = unread_at_start();
    // The board allows 150 W; this GPU takes no less than 200 W.
    assert_eq!(gpu.set_power_limit(Watts(150)), Ok(()));
    assert_eq!(fake.script().sets, vec![150_000, 200_000]);
    assert_eq!(gpu.power_limit(), Ok(Watts(200)));
    // Its constraints are known now: set within them at once.
    assert_eq!(gpu.set_power_limit(Watts(150)), Ok(()));
    assert_eq!(gpu.set_power_limit(Watts(900)), Ok(()));
    assert_eq!(gpu.set_power_limit(Watts(450)), Ok(()));
    assert_eq!(
        fake.script().sets,
        vec![150_000, 200_000, 200_000, 700_000, 450_000]
    );
    assert_eq!(
        fake.script().constraint_reads,
        2,
        "once at start, once after"
    );
}

#[test]
fn a_refusal_stands_where_the_constraints_cannot_say_why() {
    // Still unreadable: nothing else is set.
    let (fake, mut gpu) = unread_at_start();
    fake.script().constraints_fail = Some(NvmlFailure::Other("Unknown Error".into()));
    assert_eq!(
        gpu.set_power_limit(Watts(150)),
        Err(GpuError::InvalidArgument)
    );
    assert_eq!(fake.script().sets, vec![150_000]);
    // Readable, and the limit is within them: not a range the agent can
    // mend.
    let (fake, mut gpu) = unread_at_start();
    fake.script().refuse_every_set = true;
    assert_eq!(
        gpu.set_power_limit(Watts(450)),
        Err(GpuError::InvalidArgument)
    );
    assert_eq!(fake.script().sets, vec![450_000]);
}

/// A GPU described (its constraints read), whose shell kept the board's
/// range all the same (its description came late): a limit NVML refuses
/// is set within the constraints read again, not left unset; a refused
/// limit within them stays refused.
#[test]
fn constraints_read_at_a_description_are_read_again_at_a_refusal() {
    let (fake, mut gpu) = gpu(Script::healthy());
    gpu.describe().expect("described");
    assert_eq!(gpu.set_power_limit(Watts(150)), Ok(()));
    assert_eq!(fake.script().sets, vec![150_000, 200_000]);
    assert_eq!(fake.script().constraint_reads, 2);
    fake.script().refuse_every_set = true;
    assert_eq!(
        gpu.set_power_limit(Watts(450)),
        Err(GpuError::InvalidArgument)
    );
}

/// The description's calls are what a busy GPU System Processor slows
/// at the start: each is counted and timed with the samples' calls, its
/// failures by kind.
#[test]
fn the_descriptions_calls_are_counted_with_the_others() {
    let costs = CallCosts::default();
    let fake = Arc::new(Fake(Mutex::new(Script {
        constraints_fail: Some(NvmlFailure::Timeout),
        persistence: Err(NvmlFailure::NotSupported),
        ..Script::healthy()
    })));
    let mut gpu = NvmlGpu::new(fake, 0).call_costs(costs.clone());
    gpu.describe().expect("described");
    let calls: Vec<(&str, u64)> = costs
        .snapshot()
        .into_iter()
        .map(|(call, c)| (call, c.calls))
        .collect();
    assert_eq!(
        calls,
        [
            ("nvmlDeviceGetName", 1),
            ("nvmlDeviceGetPersistenceMode", 1),
            ("nvmlDeviceGetPowerManagementDefaultLimit", 1),
            ("nvmlDeviceGetPowerManagementLimitConstraints", 1),
            ("nvmlDeviceGetUUID", 1),
        ]
    );
    assert_eq!(
        costs.failures(),
        [
            ("nvmlDeviceGetPersistenceMode", "not_supported", 1),
            ("nvmlDeviceGetPowerManagementLimitConstraints", "timeout", 1)
        ]
    );
}

/// The constraints read after a refusal, unreadable again at a later
/// description (a GPU identified late, a set read back at another limit
/// than asked): the description gives them, not the board's stand-in.
#[test]
fn a_description_gives_the_constraints_read_after_a_refusal_when_unreadable_again() {
    let (fake, mut gpu) = unread_at_start();
    assert_eq!(gpu.set_power_limit(Watts(150)), Ok(()));
    fake.script().constraints_fail = Some(NvmlFailure::NotSupported);
    assert_eq!(gpu.describe(), Ok(info(Watts(700), Watts(200), Watts(700))));
    // Read again, they are the GPU's, whatever was read before.
    fake.script().constraints_fail = None;
    fake.script().range_mw = (250_000, 650_000);
    assert_eq!(gpu.describe(), Ok(info(Watts(700), Watts(250), Watts(650))));
}
