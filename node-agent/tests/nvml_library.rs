//! The agent's production NVML path end to end: `SystemNvml` over
//! `nvml-wrapper`, which loads `libnvidia-ml.so.1` at run time, against a
//! fake of that library (`tests/fake_nvml/lib.rs`) that this test builds
//! with `rustc` and puts on `LD_LIBRARY_PATH`.
//!
//! What runs is the agent's own binary, `node-agent probe` and `node-agent
//! run` with a real host's configuration (a keyring, its CDU and rack, its
//! cooling-loss commands), against a private mosquitto: the units NVML
//! gives (mW, mJ), "not supported" per call and per field, the
//! administrator's limit as the ceiling, the limit sets a lease makes and
//! lifts, a lease kept over a restart, and the calls one sample makes
//! (the XID watch's tests are `nvml_library_xids.rs`, on the same fake,
//! `system/fake_library.rs`). The fake logs every call; the tests read
//! that log.
//!
//! Skipped when `rustc` or mosquitto is missing, except under CI
//! (`CI=true`), where a missing tool fails.
//!
//! Glossary:
//! - *fake*: the fake `libnvidia-ml.so.1`; its *script* says what its GPUs
//!   answer, its *control file* changes them while the agent runs, its
//!   *log* has one line per call (`NAME GPU [VALUE]`).
//! - *ceiling*: the limit the administrator left on a GPU, which the agent
//!   never sets it above.

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

/// The fake's C types, as the fake declares them.
mod fake_types {
    include!("fake_nvml/types.rs");
}

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use loopwarden_protocol::message::HostTelemetry;
use loopwarden_protocol::{
    AckCode, Event, GpuFlags, GpuSelector, ThrottleReasons, Unsupported, Watts,
};
use loopwarden_system_tests::Subscriber;

use rig::{Rig, SITE};

#[path = "system/fake_library.rs"]
#[allow(dead_code)]
mod fake_library;
use fake_library::*;

// ------------------------------------------------------------- layouts

/// Checks that `$fake` has `$sys`'s size and alignment, and each field
/// pair (`fake = sys`) the same offset and size.
macro_rules! same_layout {
    ($fake:ty, $sys:ty $(, $f:ident = $s:ident)* $(,)?) => {{
        use std::mem::{align_of, size_of};
        let what = stringify!($fake);
        assert_eq!(size_of::<$fake>(), size_of::<$sys>(), "size of {what}");
        assert_eq!(align_of::<$fake>(), align_of::<$sys>(), "alignment of {what}");
        // SAFETY: C data, for which all zeroes is a value.
        let (_fake, _sys): ($fake, $sys) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        $(
            let field = concat!(stringify!($f), " = ", stringify!($s));
            assert_eq!(std::mem::offset_of!($fake, $f), std::mem::offset_of!($sys, $s), "offset of {what}: {field}");
            // A union's field is read unsafely; a struct's is not.
            #[allow(unused_unsafe)]
            // SAFETY: only the field's size is taken.
            let sizes = unsafe { (std::mem::size_of_val(&_fake.$f), std::mem::size_of_val(&_sys.$s)) };
            assert_eq!(sizes.0, sizes.1, "size of {what}: {field}");
        )*
    }};
}

#[test]
fn the_fakes_types_and_constants_are_nvml_wrapper_sys_own() {
    use fake_types as fake;
    use nvml_wrapper_sys::bindings as sys;
    same_layout!(fake::Return, sys::nvmlReturn_t);
    same_layout!(fake::Device, sys::nvmlDevice_t);
    same_layout!(fake::EventSet, sys::nvmlEventSet_t);
    same_layout!(
        fake::Value,
        sys::nvmlValue_t,
        d_val = dVal,
        si_val = siVal,
        ui_val = uiVal,
        ul_val = ulVal,
        ull_val = ullVal,
        sll_val = sllVal,
        us_val = usVal,
    );
    same_layout!(
        fake::FieldValue,
        sys::nvmlFieldValue_t,
        field_id = fieldId,
        scope_id = scopeId,
        timestamp = timestamp,
        latency_usec = latencyUsec,
        value_type = valueType,
        nvml_return = nvmlReturn,
        value = value,
    );
    same_layout!(
        fake::Utilization,
        sys::nvmlUtilization_t,
        gpu = gpu,
        memory = memory
    );
    same_layout!(
        fake::EventData,
        sys::nvmlEventData_t,
        device = device,
        event_type = eventType,
        event_data = eventData,
        gpu_instance_id = gpuInstanceId,
        compute_instance_id = computeInstanceId,
    );
    // Each constant, by name: `fake = sys`.
    macro_rules! same_value {
        ($($fake:path = $sys:path),* $(,)?) => {$(
            assert_eq!($fake, $sys, concat!(stringify!($fake), " = ", stringify!($sys)));
        )*};
    }
    same_value!(
        fake::SUCCESS = sys::nvmlReturn_enum_NVML_SUCCESS,
        fake::ERROR_UNINITIALIZED = sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
        fake::ERROR_INVALID_ARGUMENT = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        fake::ERROR_NOT_SUPPORTED = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        fake::ERROR_INSUFFICIENT_SIZE = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
        fake::ERROR_DRIVER_NOT_LOADED = sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
        fake::ERROR_TIMEOUT = sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT,
        fake::ERROR_UNKNOWN = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN,
        fake::VALUE_TYPE_UNSIGNED_LONG_LONG =
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
        fake::FEATURE_DISABLED = sys::nvmlEnableState_enum_NVML_FEATURE_DISABLED,
        fake::FEATURE_ENABLED = sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED,
        fake::TEMPERATURE_GPU = sys::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU,
        fake::CLOCK_GRAPHICS = sys::nvmlClockType_enum_NVML_CLOCK_GRAPHICS,
        fake::CLOCK_SM = sys::nvmlClockType_enum_NVML_CLOCK_SM,
        fake::CLOCK_MEM = sys::nvmlClockType_enum_NVML_CLOCK_MEM,
        fake::MEMORY_ERROR_TYPE_CORRECTED =
            sys::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED,
        fake::MEMORY_ERROR_TYPE_UNCORRECTED =
            sys::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        fake::VOLATILE_ECC = sys::nvmlEccCounterType_enum_NVML_VOLATILE_ECC,
        fake::AGGREGATE_ECC = sys::nvmlEccCounterType_enum_NVML_AGGREGATE_ECC,
        fake::DEVICE_NAME_V2_BUFFER_SIZE = sys::NVML_DEVICE_NAME_V2_BUFFER_SIZE,
        fake::DEVICE_UUID_V2_BUFFER_SIZE = sys::NVML_DEVICE_UUID_V2_BUFFER_SIZE,
        fake::SYSTEM_DRIVER_VERSION_BUFFER_SIZE = sys::NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE,
    );
    assert_eq!(
        fake::EVENT_TYPE_XID_CRITICAL_ERROR,
        u64::from(sys::nvmlEventTypeXidCriticalError)
    );
}

// --------------------------------------------------------------- probe

#[test]
fn probe_says_per_gpu_which_call_and_field_the_driver_does_not_support() {
    let Some(lib) = fake_library() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let unsupported = "1 unsupported nvmlDeviceGetPowerUsage\n1 unsupported_field 94\n";
    let fake = FakeNvml::new(lib, dir.path(), 2, unsupported);
    let out = fake
        .agent(&["probe", "--json", "--tries", "5"])
        .output()
        .expect("run node-agent probe");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let probes: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("JSON");

    let power = "nvmlDeviceGetPowerUsage";
    let pcie = "nvmlDeviceGetFieldValues NVML_FI_DEV_PCIE_REPLAY_COUNTER (94)";
    let per_gpu = |g: u64| probes.iter().filter(|p| p["gpu"] == g).count();
    assert!(per_gpu(0) > 40, "every call and field of GPU 0: {probes:?}");
    assert_eq!(per_gpu(0), per_gpu(1), "the same calls on both GPUs");
    assert_eq!(per_gpu(0) + per_gpu(1), probes.len());
    for p in &probes {
        let call = p["call"].as_str().expect("call");
        let scripted = p["gpu"] == 1 && (call == power || call == pcie);
        let want = if scripted {
            "not supported"
        } else {
            "supported"
        };
        assert_eq!(p["answer"], want, "{p}");
        assert_eq!(p["tries"], 5, "{p}");
    }
    // The batched query still answers when one of its fields does not.
    assert!(probes.iter().any(|p| p["gpu"] == 1
        && p["call"]
            .as_str()
            .is_some_and(|c| c.ends_with("fields at once"))));

    // Read only: no limit set, no event registered; every call made 5
    // times per GPU, each GPU's handle looked up once.
    let calls = fake.calls();
    for never in [SET, "nvmlEventSetCreate", "nvmlDeviceRegisterEvents"] {
        assert!(
            calls.iter().all(|c| c.name != never),
            "{never} in {calls:?}"
        );
    }
    for g in 0..2 {
        assert_eq!(count(&calls, "nvmlDeviceGetTemperature", g), 5);
        assert_eq!(count(&calls, power, g), 5);
        assert_eq!(count(&calls, LOOKUP, g), 1, "GPU {g}'s handle is kept");
    }
}

// ---------------------------------------------------- caps and leases

/// Waits for telemetry of two responsive GPUs.
fn two_gpus(sub: &mut Subscriber, agent: &RealAgent) -> HostTelemetry {
    telemetry_until(sub, Duration::from_secs(10), |t| {
        t.gpus.len() == 2
            && t.gpus
                .iter()
                .all(|g| g.flags.contains(GpuFlags::RESPONSIVE))
    })
    .unwrap_or_else(|| panic!("no telemetry of 2 GPUs:\n{}", agent.log_text()))
}

/// The last limit set on `gpu` in `sets`.
fn last_set(sets: &[(usize, u64)], gpu: usize) -> Option<u64> {
    sets.iter()
        .rev()
        .find(|(g, _)| *g == gpu)
        .map(|(_, mw)| *mw)
}

#[test]
fn leases_cap_and_lift_to_the_administrators_limit_and_never_above_it() {
    let Some((rig, fake)) = two_gpu_host("h61") else {
        return;
    };
    let metrics: std::net::SocketAddr =
        ([127, 0, 0, 1], loopwarden_system_tests::free_port()).into();
    let config = host_config(&rig, &format!("metrics_listen = \"{metrics}\"\n"));
    let mut tel = rig.subscribe(&["telemetry"]);
    let mut ev = rig.subscribe(&["event"]);
    let mut acks = rig.subscribe(&["ack"]);
    let mut agent = RealAgent::start(&rig, &fake, &config);

    // NVML's values in the bus's units: W from mW (rounded), MHz, %, °C,
    // the clock-event bits as the bus's, the counts as given.
    let t = two_gpus(&mut tel, &agent);
    assert_eq!((t.gpus[0].temp.0, t.gpus[1].temp.0), (41, 44));
    assert_eq!((t.gpus[0].power, t.gpus[1].power), (Watts(351), Watts(289)));
    for g in &t.gpus {
        assert_eq!(g.power_limit, Watts(500), "the administrator's limit");
        assert_eq!((g.sm_clock.0, g.mem_clock.0), (1980, 2619));
        assert_eq!(g.util.get(), 87);
        assert_eq!(g.throttle, ThrottleReasons::SW_POWER_CAP);
        assert_eq!(g.mem_temp.0, 61, "field 82");
        assert_eq!((g.ecc.sbe_volatile, g.ecc.dbe_volatile), (3, 0));
        assert_eq!((g.ecc.sbe_aggregate, g.ecc.dbe_aggregate), (12, 0));
        assert_eq!((g.pcie_replay, g.nvlink.crc), (5, 2), "fields 94 and 45");
        assert!(g.flags.contains(GpuFlags::ECC_ENABLED));
        assert_eq!(g.unsupported, Unsupported::empty());
    }
    // The energy, in NVML's mJ, is on `/metrics` under DCGM's name.
    let (code, body) =
        loopwarden_system_tests::prometheus::http_get(metrics, "/metrics").expect("GET /metrics");
    assert_eq!(code, 200, "{body}");
    let energy: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{"))
        .collect();
    assert_eq!(energy.len(), 2, "{body}");
    assert!(
        energy.iter().all(|l| l.ends_with(" 86400000")),
        "{energy:?}"
    );

    // A signed CDU lease caps GPU 0 to 400 W; its lift puts back the
    // administrator's 500 W, not the default 700 W.
    let ack = rig.ack(&mut acks, &lease(1, 1, &[(gpu(0), 400)], 2_500));
    assert_eq!(ack.code, AckCode::Ok, "{ack:?}");
    let in_force: Vec<u32> = ack.in_force.iter().map(|c| c.limit.0).collect();
    assert_eq!(in_force, [400, 500]);
    assert_eq!(
        last_set(&fake.sets(), 0),
        Some(400_000),
        "read back before the ack"
    );
    let sets = fake.sets_until(Duration::from_secs(10), |s| last_set(s, 0) == Some(500_000));
    assert_eq!(sets, [(0, 400_000), (0, 500_000)], "the cap, then its lift");

    // The administrator sets GPU 0 to 450.6 W (`nvidia-smi -pl 450.6`)
    // while the agent runs. The read of every limit before the next set
    // sees it: the new ceiling, in whole watts rounded down, never above.
    fake.control("0 limit_mw 450600");
    let ack = rig.ack(&mut acks, &lease(2, 2, &[(GpuSelector::All, 480)], 2_000));
    assert_eq!(ack.code, AckCode::Ok, "{ack:?}");
    let in_force: Vec<u32> = ack.in_force.iter().map(|c| c.limit.0).collect();
    assert_eq!(in_force, [450, 480], "{ack:?}");
    let seen = events_until(&mut ev, Duration::from_secs(5), |e| {
        matches!(e, Event::PowerCeiling { .. })
    });
    assert!(
        seen.contains(&Event::PowerCeiling {
            gpus: 0b01,
            ceiling: Watts(450),
            was: Watts(500)
        }),
        "{seen:?}"
    );
    let sets = fake.sets_until(Duration::from_secs(10), |s| last_set(s, 1) == Some(500_000));
    assert_eq!(
        last_set(&sets, 1),
        Some(500_000),
        "lease 2 lifted: {sets:?}"
    );

    // A clean stop with no lease in force leaves each GPU at its ceiling:
    // GPU 0 never set since, at the administrator's 450.6 W as it was.
    agent.terminate();
    assert_eq!(fake.limits(), [450_600, 500_000]);

    // No set ever went above a ceiling: 500 W, and 450 W on GPU 0 once the
    // administrator set it.
    let calls = fake.calls();
    let admin = calls
        .iter()
        .position(|c| c.name == "control")
        .expect("the control line applied");
    let all = limit_sets(&calls);
    assert!(all.iter().all(|&(_, mw)| mw <= 500_000), "{all:?}");
    let after = limit_sets(&calls[admin..]);
    assert!(
        after.iter().all(|&(g, mw)| g != 0 || mw <= 450_600),
        "{after:?}"
    );
    assert!(after.contains(&(1, 480_000)), "{after:?}");
    // A set takes a handle of its own; every other call uses the kept one.
    for g in 0..2 {
        assert_eq!(
            count(&calls, LOOKUP, g),
            1 + count(&calls, SET, g),
            "GPU {g}"
        );
    }
}

#[test]
fn a_lease_in_force_keeps_its_cap_over_a_sigterm_and_a_restart() {
    let Some((rig, fake)) = two_gpu_host("h62") else {
        return;
    };
    let flash = format!("flash = \"{}\"\n", rig.flash().display());
    let config = host_config(&rig, &flash);
    let mut acks = rig.subscribe(&["ack"]);
    let mut agent = RealAgent::start(&rig, &fake, &config);
    let ack = rig.ack(&mut acks, &lease(1, 1, &[(gpu(0), 300)], 60_000));
    assert_eq!(ack.code, AckCode::Ok, "{ack:?}");
    assert_eq!(fake.limits(), [300_000, 500_000]);

    agent.terminate();
    assert!(
        agent
            .log_text()
            .contains("stopping with 1 lease(s) in force"),
        "{}",
        agent.log_text()
    );
    assert_eq!(
        fake.limits(),
        [300_000, 500_000],
        "the stop left the cap on"
    );

    // The next start takes the lease from flash: GPU 0 stays at 300 W.
    let mut tel = rig.subscribe(&["telemetry"]);
    let again = RealAgent::start(&rig, &fake, &config);
    for _ in 0..5 {
        let t = two_gpus(&mut tel, &again);
        assert_eq!(t.gpus[0].power_limit, Watts(300), "{t:?}");
    }
    let caps = rig.console().ctl(&["caps"]).expect("ctl caps");
    assert_eq!(caps["gpus"][0]["limit"], 300, "{caps}");
    assert_eq!(fake.limits(), [300_000, 500_000]);

    let calls = fake.calls();
    let inits = calls.iter().filter(|c| c.name == "nvmlInit_v2").count();
    assert_eq!(inits, 2, "two agents ran");
    // The cap was set once: the restarted agent found it in place (the
    // driver kept it) and set nothing, above the cap or at it.
    let sets = limit_sets(&calls);
    assert_eq!(
        sets,
        [(0, 300_000)],
        "no set but the cap's, across the restart"
    );
}

// ------------------------------------------------------ calls per sample

/// The calls of one sample of a GPU with everything supported and ECC on,
/// the slow counters not due (docs/node-agent.md section 4): 10.
const PER_SAMPLE: [(&str, usize); 8] = [
    ("nvmlDeviceGetTemperature", 1),
    ("nvmlDeviceGetPowerUsage", 1),
    ("nvmlDeviceGetEnforcedPowerLimit", 1),
    ("nvmlDeviceGetClockInfo", 2),
    ("nvmlDeviceGetUtilizationRates", 1),
    ("nvmlDeviceGetCurrentClocksThrottleReasons", 1),
    ("nvmlDeviceGetTotalEccErrors", 2),
    ("nvmlDeviceGetFieldValues", 1),
];

fn per_sample() -> BTreeMap<String, usize> {
    PER_SAMPLE
        .iter()
        .map(|(n, c)| (n.to_string(), *c))
        .collect()
}

/// Per sample of `gpu`, the calls on it by name: from one
/// `nvmlDeviceGetTemperature` (a sample's first call) to the next, the
/// last (perhaps unfinished) left out.
fn sample_calls(calls: &[Call], gpu: usize) -> Vec<BTreeMap<String, usize>> {
    let mut samples = Vec::new();
    let mut current: Option<BTreeMap<String, usize>> = None;
    for c in calls.iter().filter(|c| c.gpu() == Some(gpu)) {
        if c.name == "nvmlDeviceGetTemperature" {
            samples.extend(current.take());
            current = Some(BTreeMap::new());
        }
        if let Some(s) = &mut current {
            *s.entry(c.name.clone()).or_default() += 1;
        }
    }
    samples
}

#[test]
fn a_sample_makes_ten_calls_per_gpu_on_a_handle_looked_up_once() {
    let Some((rig, fake)) = two_gpu_host("h64") else {
        return;
    };
    let config = host_config(&rig, "");
    let agent = RealAgent::start(&rig, &fake, &config);
    let deadline = Instant::now() + Duration::from_secs(10);
    let enough = |calls: &[Call]| (0..2).all(|g| sample_calls(calls, g).len() >= 7);
    while !enough(&fake.calls()) {
        assert!(
            Instant::now() < deadline,
            "too few samples:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let calls = fake.calls();
    for g in 0..2 {
        let samples = sample_calls(&calls, g);
        // The first also reads the slow counters: energy and the two
        // aggregate ECC counts (their fields go in the same query), after
        // the ECC mode, read once before it: 14 calls.
        let mut first = per_sample();
        first.insert("nvmlDeviceGetTotalEnergyConsumption".into(), 1);
        first.insert("nvmlDeviceGetTotalEccErrors".into(), 4);
        assert_eq!(samples[0], first, "GPU {g}'s first sample");
        assert_eq!(count(&calls, "nvmlDeviceGetEccMode", g), 1, "GPU {g}");
        for (n, s) in samples.iter().enumerate().skip(1) {
            assert_eq!(s, &per_sample(), "GPU {g}, sample {n}");
            assert_eq!(s.values().sum::<usize>(), 10);
        }
        assert_eq!(count(&calls, LOOKUP, g), 1, "GPU {g}'s handle, once");
    }
}

#[test]
fn the_sample_count_would_see_a_handle_looked_up_before_every_call() {
    // Three samples of GPU 0 by an NVML layer that looks the handle up
    // before each call, as the agent did before it kept them.
    let mut text = String::new();
    for _ in 0..3 {
        for (name, n) in PER_SAMPLE {
            for _ in 0..n {
                text.push_str(&format!("{LOOKUP} 0\n{name} 0\n"));
            }
        }
    }
    let samples = sample_calls(&parse_log(&text), 0);
    assert_eq!(samples.len(), 2, "the unfinished last one left out");
    for s in &samples {
        assert_eq!(s.values().sum::<usize>(), 20);
        assert_ne!(s, &per_sample());
    }
}

// --------------------------------------------------------- measurement

/// A host that takes no command, as `benches/nvml_cost.sh` runs one (its
/// thermal guard above the GPUs' slowdown), on a 1 s period, on the
/// rig's broker, on NVML or `twin` GPUs; written as `name` in the rig's
/// folder.
fn measured_config(rig: &Rig, name: &str, twin: Option<u8>) -> PathBuf {
    let dir = rig.dir.path();
    let mut text = format!(
        "site = \"{SITE}\"\nhost = \"{}\"\nbroker = \"127.0.0.1:{}\"\n\
         commands = \"none\"\ncooling = \"not_managed\"\nperiod_ms = 1000\n\
         flash = \"{}\"\nconsole = \"{}\"\n",
        rig.host,
        rig.port,
        dir.join(format!("{name}.flash")).display(),
        dir.join(format!("{}.sock", rig.host)).display()
    );
    if let Some(n) = twin {
        text.push_str(&format!("twin_gpus = {n}\n"));
    }
    text.push_str("[guard]\nengage_c = 91\nrelease_c = 86\n");
    text.push_str("[quarantine]\nreported_only = true\n");
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("config");
    path
}

/// CPU time of process `pid` so far (utime + stime), in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // The fields after the command's name, which may hold spaces: the
    // 14th and 15th of the line are the 12th and 13th after it.
    let after = &stat[stat.rfind(')').expect("(comm)") + 1..];
    let fields: Vec<u64> = after
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    fields[10] + fields[11]
}

/// A line of `/proc/PID/status`'s value, in kB.
fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("/proc/PID/status")
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Runs the agent at `bin` with `config` for `warm` then `window`, and
/// returns its row: CPU share of one core, CPU per 1 s round, peak RSS.
fn measure(
    rig: &Rig,
    fake: &FakeNvml,
    bin: &Path,
    config: &Path,
    warm: Duration,
    window: Duration,
) -> String {
    let hz: u64 = String::from_utf8(
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .expect("getconf")
            .stdout,
    )
    .expect("UTF-8")
    .trim()
    .parse()
    .expect("CLK_TCK");
    let mut agent = RealAgent::start_at(rig, fake, bin, config);
    std::thread::sleep(warm);
    let pid = agent.pid();
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(window);
    let (wall, ticks) = (t0.elapsed().as_secs_f64(), cpu_ticks(pid) - c0);
    let hwm = status_kib(pid, "VmHWM:");
    let threads = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:").map(|t| t.trim().to_string()))
        .unwrap_or_default();
    agent.terminate();
    let cpu_s = ticks as f64 / hz as f64;
    format!(
        "{:.3} % of one core ({cpu_s:.2} s in {wall:.0} s, {:.2} ms a round), VmHWM {:.1} MiB, {threads} threads",
        100.0 * cpu_s / wall,
        1000.0 * cpu_s / wall,
        hwm as f64 / 1024.0
    )
}

/// The agent's own CPU and peak memory on the NVML path with calls that
/// cost nothing: 8 fake GPUs at 1 s, then 8 twin GPUs the same way for
/// comparison. Not a test: it prints what it measured. Run on the release
/// build:
///
/// ```sh
/// cargo build --release -p node-agent
/// cargo test -p node-agent --test nvml_library -- --ignored --nocapture measure
/// ```
///
/// `NODE_AGENT` names another binary; `FAKE_NVML_MEASURE_S` the window
/// (120 s; each run has 10 s of warm-up before it).
#[test]
#[ignore = "a measurement of about 5 minutes on the release build: run with --ignored --nocapture"]
fn measure_the_agents_own_cost_on_8_fake_gpus() {
    let bin = std::env::var_os("NODE_AGENT").map_or_else(
        || Path::new(env!("CARGO_TARGET_TMPDIR")).join("../release/node-agent"),
        PathBuf::from,
    );
    assert!(
        bin.is_file(),
        "no {}: cargo build --release -p node-agent",
        bin.display()
    );
    let window = Duration::from_secs(
        std::env::var("FAKE_NVML_MEASURE_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(120),
    );
    let warm = Duration::from_secs(10);
    let (Some(lib), Some(rig)) = (fake_library(), Rig::start("h69")) else {
        return;
    };
    let fake = FakeNvml::new(lib, rig.dir.path(), 8, HOST_GPUS).quiet();
    let nvml = measure(
        &rig,
        &fake,
        &bin,
        &measured_config(&rig, "nvml", None),
        warm,
        window,
    );
    println!("8 fake NVML GPUs: {nvml}");
    let twin = measure(
        &rig,
        &fake,
        &bin,
        &measured_config(&rig, "twin", Some(8)),
        warm,
        window,
    );
    println!("8 twin GPUs:      {twin}");
}
