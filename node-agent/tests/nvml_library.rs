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
//! lifts, a lease kept over a restart, an XID through the event set, a
//! restart of the XID watch that cannot register every GPU (reported
//! down, naming the GPU, never taken for running), and the calls one
//! sample makes. The fake logs every call; the tests read
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
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use loopwarden_protocol::auth::{May, Signer};
use loopwarden_protocol::message::HostTelemetry;
use loopwarden_protocol::{
    samples, AckCode, Event, GpuFlags, GpuIndex, GpuSelector, HealthState, Ident, Message, NodeId,
    Role, ThrottleReasons, Unsupported, Watts,
};
use loopwarden_system_tests::Subscriber;

use rig::{frame, Rig, SITE};

const AGENT: &str = env!("CARGO_BIN_EXE_node-agent");
const FAKE_SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_nvml/lib.rs");
const SET: &str = "nvmlDeviceSetPowerManagementLimit";
const LOOKUP: &str = "nvmlDeviceGetHandleByIndex_v2";

// ------------------------------------------------------------ the fake

/// The folder holding the fake `libnvidia-ml.so.1`, built once per test
/// binary; `None` (the test is skipped) when there is no `rustc` outside
/// CI.
fn fake_library() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT.get_or_init(build_fake).as_deref()
}

/// Builds the fake as cargo would find `rustc` (`$RUSTC`, else `rustc`),
/// into a folder of its own under cargo's temporary folder for tests.
fn build_fake() -> Option<PathBuf> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake-nvml");
    std::fs::create_dir_all(&dir).expect("the fake's folder");
    // Built under a name of its own, then renamed: an agent of another run
    // keeps the file it loaded.
    let built = dir.join(format!("build-{}.so", std::process::id()));
    let out = Command::new(&rustc)
        .args(["--edition", "2021", "--crate-type", "cdylib", "-O"])
        .arg(FAKE_SOURCE)
        .arg("-o")
        .arg(&built)
        .output();
    match out {
        Err(e) => {
            let why = format!(
                "{} cannot run ({e}): the fake NVML is not built",
                rustc.to_string_lossy()
            );
            assert!(
                !loopwarden_system_tests::in_ci(),
                "{why}; CI=true, so this is a failure"
            );
            eprintln!("SKIP: {why}");
            return None;
        }
        Ok(o) => assert!(
            o.status.success(),
            "rustc failed on {FAKE_SOURCE}:\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
    }
    std::fs::rename(&built, dir.join("libnvidia-ml.so.1")).expect("the fake in place");
    Some(dir)
}

/// One line of the fake's log.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    /// The entry point, or `control` for a control line applied.
    name: String,
    /// What follows it.
    args: Vec<String>,
}

impl Call {
    /// The GPU it named (none for a control line).
    fn gpu(&self) -> Option<usize> {
        if self.name == "control" {
            return None;
        }
        self.args.first()?.parse().ok()
    }

    /// The value it carried (a limit set's mW).
    fn value(&self) -> Option<u64> {
        self.args.get(1)?.parse().ok()
    }
}

/// The calls of a log's text.
fn parse_log(text: &str) -> Vec<Call> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace().map(String::from);
            Some(Call {
                name: words.next()?,
                args: words.collect(),
            })
        })
        .collect()
}

/// A fake driver's files in a test's folder: its script, and the log,
/// control and state files the script names.
struct FakeNvml {
    lib: &'static Path,
    script: PathBuf,
    log: PathBuf,
    control: PathBuf,
    state: PathBuf,
}

impl FakeNvml {
    /// A fake of `gpus` GPUs in `dir`, with the script lines `settings`.
    fn new(lib: &'static Path, dir: &Path, gpus: usize, settings: &str) -> Self {
        let fake = Self {
            lib,
            script: dir.join("nvml.script"),
            log: dir.join("nvml.log"),
            control: dir.join("nvml.control"),
            state: dir.join("nvml.state"),
        };
        let text = format!(
            "gpus {gpus}\nlog {}\ncontrol {}\nstate {}\n{settings}",
            fake.log.display(),
            fake.control.display(),
            fake.state.display()
        );
        std::fs::write(&fake.script, text).expect("the fake's script");
        std::fs::write(&fake.control, "").expect("the fake's control file");
        fake
    }

    /// `node-agent ARGS` on the fake.
    fn agent(&self, args: &[&str]) -> Command {
        self.agent_at(Path::new(AGENT), args)
    }

    /// The `node-agent` at `bin` with `args`, on the fake.
    fn agent_at(&self, bin: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .env("LD_LIBRARY_PATH", self.lib)
            .env("FAKE_NVML_SCRIPT", &self.script)
            .env("RUST_LOG", "info,rumqttc=warn");
        cmd
    }

    /// The same fake without its log and control file: no call writes,
    /// and the event set's wait blocks its whole timeout instead of
    /// polling (for a measurement of the agent's own cost).
    fn quiet(self) -> Self {
        let text = std::fs::read_to_string(&self.script).expect("the fake's script");
        let kept: String = text
            .lines()
            .filter(|l| !l.starts_with("log ") && !l.starts_with("control "))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&self.script, kept).expect("the fake's script");
        self
    }

    /// Appends `line` to the control file (read by the fake within 20 ms
    /// of a call).
    fn control(&self, line: &str) {
        use std::io::Write;
        let words: Vec<&str> = line.split_whitespace().collect();
        let applied = |calls: Vec<Call>| {
            calls
                .iter()
                .filter(|c| c.name == "control" && c.args == words)
                .count()
        };
        let before = applied(self.calls());
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.control)
            .expect("the control file");
        writeln!(f, "{line}").expect("a control line");
        // The fake reads its control file at its next call at most every
        // 20 ms: what the test does next must find the line applied, as
        // a real driver's state is there at once.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while applied(self.calls()) == before {
            assert!(
                std::time::Instant::now() < until,
                "the fake NVML did not apply {line:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Every call so far.
    fn calls(&self) -> Vec<Call> {
        parse_log(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Every limit set so far: GPU and mW.
    fn sets(&self) -> Vec<(usize, u64)> {
        limit_sets(&self.calls())
    }

    /// Each GPU's limit now, mW, as the fake keeps it (its state file's
    /// `GPU limit_mw MW` lines, in GPU order).
    fn limits(&self) -> Vec<u64> {
        std::fs::read_to_string(&self.state)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
                [_, "limit_mw", mw] => mw.parse().ok(),
                _ => None,
            })
            .collect()
    }

    /// Waits up to `within` until the log's sets satisfy `done`.
    fn sets_until(
        &self,
        within: Duration,
        done: impl Fn(&[(usize, u64)]) -> bool,
    ) -> Vec<(usize, u64)> {
        let deadline = Instant::now() + within;
        loop {
            let sets = self.sets();
            if done(&sets) || Instant::now() > deadline {
                return sets;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The limit sets among `calls`: GPU and mW.
fn limit_sets(calls: &[Call]) -> Vec<(usize, u64)> {
    calls
        .iter()
        .filter(|c| c.name == SET)
        .filter_map(|c| Some((c.gpu()?, c.value()?)))
        .collect()
}

/// How often `name` was called on `gpu`.
fn count(calls: &[Call], name: &str, gpu: usize) -> usize {
    calls
        .iter()
        .filter(|c| c.name == name && c.gpu() == Some(gpu))
        .count()
}

// ----------------------------------------------------------- the agent

/// The GPUs of the `run` tests: an administrator left them at 500 W
/// (`nvidia-smi -pl 500`), default 700 W, settable from 200 to 700 W.
const HOST_GPUS: &str = "\
* limit_mw 500000
* default_mw 700000
* min_mw 200000
* max_mw 700000
* temp_c 41
1 temp_c 44
* power_mw 351400
1 power_mw 288600
* energy_mj 86400000
* sm_mhz 1980
* mem_mhz 2619
* util_pct 87
* throttle_bits 4
* ecc on
* ecc_sbe_volatile 3
* ecc_sbe_aggregate 12
* field 82 61
* field 94 5
* field 45 2
";

/// A rig on `host`, and the fake driver of its two GPUs ([`HOST_GPUS`])
/// in its folder; `None` where a test cannot run here (no mosquitto, no
/// compiler for the fake library), said by those helpers.
fn two_gpu_host(host: &'static str) -> Option<(Rig, FakeNvml)> {
    let lib = fake_library()?;
    let rig = Rig::start(host)?;
    let fake = FakeNvml::new(lib, rig.dir.path(), 2, HOST_GPUS);
    Some((rig, fake))
}

/// A real host's configuration for the rig's host, written in its folder:
/// its keyring (the demonstration key as `cdu/cdu-a`'s, so [`Rig::send`]
/// signs for it), its CDU and rack, cooling-loss commands, a 200 ms
/// period, the rig's flash file, and the top-level lines `more`.
fn host_config(rig: &Rig, more: &str) -> PathBuf {
    let dir = rig.dir.path();
    let ring = dir.join("keyring.toml");
    let cdu_a = Signer {
        role: Role::Cdu,
        name: Some(Ident::new("cdu-a").expect("ident")),
        key_id: 1,
        key: samples::demo_signing_key().verifying_key(),
        may: May {
            lease: true,
            release: false,
            resend: false,
        },
    };
    let site = Ident::new(SITE).expect("ident");
    std::fs::write(&ring, loopwarden_bus::keys::keyring_toml(&site, &[cdu_a])).expect("keyring");
    let mut text = format!(
        "site = \"{SITE}\"\nhost = \"{}\"\nbroker = \"127.0.0.1:{}\"\nkeyring = \"{}\"\n\
         cdu = \"cdu-a\"\nrack = 2\nperiod_ms = 200\njson_period_ms = 1000\n\
         console = \"{}\"\n",
        rig.host,
        rig.port,
        ring.display(),
        dir.join(format!("{}.sock", rig.host)).display()
    );
    text.push_str(more);
    // Real GPUs need a flash file: the rig's, unless `more` names one.
    if !more.contains("flash =") {
        text.push_str(&format!("flash = \"{}\"\n", rig.flash().display()));
    }
    text.push_str("[cooling_loss]\ndrain = [[\"/bin/true\"]]\npower_down = [[\"/bin/true\"]]\n");
    let path = dir.join("agent.toml");
    std::fs::write(&path, text).expect("config");
    path
}

/// `node-agent run` on the fake as a process; killed when dropped.
struct RealAgent {
    child: Option<Child>,
    log: PathBuf,
}

impl RealAgent {
    /// Starts it with `config`, its log appended to `agent.log` in the
    /// rig's folder; returns once its console answers.
    fn start(rig: &Rig, fake: &FakeNvml, config: &Path) -> RealAgent {
        Self::start_at(rig, fake, Path::new(AGENT), config)
    }

    /// [`RealAgent::start`] with the `node-agent` at `bin`.
    fn start_at(rig: &Rig, fake: &FakeNvml, bin: &Path, config: &Path) -> RealAgent {
        let (stderr, log) = rig.agent_log();
        let child = fake
            .agent_at(bin, &["run", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start node-agent");
        let mut agent = RealAgent {
            child: Some(child),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while rig.console().ctl(&["status"]).is_none() {
            let child = agent.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().expect("wait") {
                panic!(
                    "the agent ended at its start ({status}):\n{}",
                    agent.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no console:\n{}",
                agent.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        agent
    }

    /// Its process id.
    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it with SIGTERM, as systemd does; fails unless it exits 0
    /// within 15 s.
    fn terminate(&mut self) {
        let mut child = self.child.take().expect("running");
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill -TERM");
        let deadline = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "no stop on SIGTERM:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            status.success(),
            "stopped with {status}:\n{}",
            self.log_text()
        );
    }
}

impl Drop for RealAgent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The telemetry `sub` receives until one satisfies `want` (that one), or
/// `None` after `within`.
fn telemetry_until(
    sub: &mut Subscriber,
    within: Duration,
    want: impl Fn(&HostTelemetry) -> bool,
) -> Option<HostTelemetry> {
    let is = |f: Option<loopwarden_protocol::Frame>| match f.map(|f| f.message) {
        Some(Message::HostTelemetry(t)) if want(&t) => Some(t),
        _ => None,
    };
    let seen = sub.collect_until(within, |s| {
        s.last()
            .and_then(frame)
            .is_some_and(|f| is(Some(f)).is_some())
    });
    is(seen.last().and_then(frame))
}

/// The events among what `sub` received within `within`, until `done`.
fn events_until(
    sub: &mut Subscriber,
    within: Duration,
    done: impl Fn(&Event) -> bool,
) -> Vec<Event> {
    let event = |s: &loopwarden_system_tests::Seen| match frame(s).map(|f| f.message) {
        Some(Message::Event(e)) => Some(e),
        _ => None,
    };
    sub.collect_until(within, |s| {
        s.last().and_then(event).is_some_and(|e| done(&e))
    })
    .iter()
    .filter_map(event)
    .collect()
}

fn gpu(i: u8) -> GpuSelector {
    GpuSelector::Gpu(GpuIndex::new(i).expect("index"))
}

/// A lease from `cdu-a`, signed by [`Rig::send`].
fn lease(seq: u32, id: u32, caps: &[(GpuSelector, u32)], ms: u32) -> loopwarden_protocol::Frame {
    let cdu_a = NodeId::new(Role::Cdu, "cdu-a").expect("ident");
    rig::lease_from(cdu_a, seq, id, caps, ms)
}

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

// ----------------------------------------------------------------- XID

#[test]
fn an_xid_79_from_the_event_set_quarantines_its_gpu() {
    let Some((rig, fake)) = two_gpu_host("h63") else {
        return;
    };
    let config = host_config(&rig, "");
    let mut health = rig.subscribe(&["health"]);
    let agent = RealAgent::start(&rig, &fake, &config);
    // Both GPUs are on the event set before the driver reports the XID.
    registered_for_xids(&fake, &agent, 2);
    fake.control("xid 1 79");

    let quarantined = |f: &loopwarden_protocol::Frame| match &f.message {
        Message::HostHealth(h) => h
            .gpus
            .get(1)
            .is_some_and(|g| g.state == HealthState::Quarantined),
        _ => false,
    };
    let seen = health.collect_until(Duration::from_secs(10), |s| {
        s.last().and_then(frame).is_some_and(|f| quarantined(&f))
    });
    assert!(
        seen.last().and_then(frame).is_some_and(|f| quarantined(&f)),
        "GPU 1 not quarantined:\n{}",
        agent.log_text()
    );
    let Some(Message::HostHealth(h)) = rig.retained_health().map(|f| f.message) else {
        panic!("no retained health");
    };
    assert_eq!(h.gpus[1].state, HealthState::Quarantined);
    assert!(h.gpus[1].evidence.as_str().contains("XID 79"), "{h:?}");
    assert_eq!(h.gpus[0].state, HealthState::Healthy);
    // The event named its GPU by handle; the agent asked NVML its index.
    assert!(count(&fake.calls(), "nvmlDeviceGetIndex", 1) >= 1);
}

/// Waits until every one of `gpus` GPUs was registered for XID events.
fn registered_for_xids(fake: &FakeNvml, agent: &RealAgent, gpus: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while (0..gpus).any(|g| count(&fake.calls(), "nvmlDeviceRegisterEvents", g) == 0) {
        assert!(
            Instant::now() < deadline,
            "no registration:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits up to `within` until the agent's log has a line holding every one
/// of `parts`; that line.
fn log_line(agent: &RealAgent, within: Duration, parts: &[&str]) -> String {
    let deadline = Instant::now() + within;
    loop {
        let text = agent.log_text();
        if let Some(l) = text.lines().find(|l| parts.iter().all(|p| l.contains(p))) {
            return l.to_string();
        }
        assert!(Instant::now() < deadline, "no line with {parts:?}:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `ctl status`'s `xids.watch_down_since`, once it is `down` (a number)
/// or not (null), within 10 s.
fn watch_down_since(rig: &Rig, agent: &RealAgent, down: bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = rig.console().ctl(&["status"]).expect("ctl status");
        let since = status["xids"]["watch_down_since"].clone();
        if since.is_u64() == down {
            return since;
        }
        assert!(
            Instant::now() < deadline,
            "watch_down_since {since}, not {}:\n{}",
            if down { "a time" } else { "null" },
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_restart_that_registers_no_gpu_keeps_the_xid_watch_down_and_retries() {
    let Some((rig, fake)) = two_gpu_host("h65") else {
        return;
    };
    let config = host_config(&rig, "");
    let agent = RealAgent::start(&rig, &fake, &config);
    registered_for_xids(&fake, &agent, 2);

    // A driver hiccup: the event wait fails, and no GPU's event types can
    // be read when the watch restarts.
    fake.control("* fail nvmlDeviceGetSupportedEventTypes 999");
    fake.control("wait_fails 999");
    // The watch is not taken for running over an empty set: it is retried
    // (a third event set), and stays down meanwhile.
    let sets = |calls: &[Call]| {
        calls
            .iter()
            .filter(|c| c.name == "nvmlEventSetCreate")
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while sets(&fake.calls()) < 3 {
        assert!(
            Instant::now() < deadline,
            "the watch was not retried:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let line = log_line(
        &agent,
        Duration::from_secs(10),
        &[
            "the XID watch is down (no GPU could be registered",
            "GPU 0 (",
            "GPU 1 (",
        ],
    );
    assert!(
        line.contains("an internal driver error"),
        "NVML's answer: {line}"
    );
    watch_down_since(&rig, &agent, true);
    assert!(
        !agent.log_text().contains("the XID watch runs again"),
        "{}",
        agent.log_text()
    );
    let Some(Message::HostHealth(h)) = rig.retained_health().map(|f| f.message) else {
        panic!("no retained health");
    };
    assert!(h.monitoring.xid_watch_down_since.is_some(), "{h:?}");

    // The driver answers again: a later retry registers both GPUs.
    fake.control("* fail nvmlDeviceGetSupportedEventTypes 0");
    log_line(
        &agent,
        Duration::from_secs(40),
        &["the XID watch runs again"],
    );
    watch_down_since(&rig, &agent, false);
}

#[test]
fn a_start_that_registers_no_gpu_reports_the_xid_watch_down_and_retries() {
    let Some(lib) = fake_library() else {
        return;
    };
    let Some(rig) = Rig::start("h67") else {
        return;
    };
    let refusing = format!("{HOST_GPUS}* fail nvmlDeviceGetSupportedEventTypes 999\n");
    let fake = FakeNvml::new(lib, rig.dir.path(), 2, &refusing);
    let config = host_config(&rig, "");
    let agent = RealAgent::start(&rig, &fake, &config);
    // Each GPU's refusal is said at the start, and the watch is down,
    // naming both, instead of waiting on an empty event set.
    for g in 0..2 {
        log_line(
            &agent,
            Duration::from_secs(10),
            &[&format!("GPU {g}: XID events cannot be registered")],
        );
    }
    log_line(
        &agent,
        Duration::from_secs(10),
        &["the XID watch is down (", "GPU 0 (", "GPU 1 ("],
    );
    watch_down_since(&rig, &agent, true);
    // It is retried: a second event set.
    let deadline = Instant::now() + Duration::from_secs(20);
    while fake
        .calls()
        .iter()
        .filter(|c| c.name == "nvmlEventSetCreate")
        .count()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "the watch was not retried:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_restart_that_leaves_a_gpu_out_keeps_the_xid_watch_down_naming_it() {
    let Some((rig, fake)) = two_gpu_host("h66") else {
        return;
    };
    let config = host_config(&rig, "");
    let mut health = rig.subscribe(&["health"]);
    let agent = RealAgent::start(&rig, &fake, &config);
    registered_for_xids(&fake, &agent, 2);

    // The event wait fails; at the restart, GPU 1's event types cannot be
    // read, GPU 0 registers.
    fake.control("1 fail nvmlDeviceGetSupportedEventTypes 999");
    fake.control("wait_fails 999");
    let line = log_line(
        &agent,
        Duration::from_secs(20),
        &["the XID watch is down (", "GPU 1 ("],
    );
    assert!(line.contains("not registered for XID events"), "{line}");
    assert!(
        line.contains("an internal driver error"),
        "NVML's answer: {line}"
    );
    assert!(!line.contains("GPU 0"), "{line}");
    watch_down_since(&rig, &agent, true);
    assert!(
        !agent.log_text().contains("the XID watch runs again"),
        "{}",
        agent.log_text()
    );

    // The watch still runs for GPU 0: its XID 79 quarantines it.
    fake.control("xid 0 79");
    let quarantined = |f: &loopwarden_protocol::Frame| match &f.message {
        Message::HostHealth(h) => h
            .gpus
            .first()
            .is_some_and(|g| g.state == HealthState::Quarantined),
        _ => false,
    };
    let seen = health.collect_until(Duration::from_secs(10), |s| {
        s.last().and_then(frame).is_some_and(|f| quarantined(&f))
    });
    assert!(
        seen.last().and_then(frame).is_some_and(|f| quarantined(&f)),
        "GPU 0 not quarantined:\n{}",
        agent.log_text()
    );
    let Some(Message::HostHealth(h)) = rig.retained_health().map(|f| f.message) else {
        panic!("no retained health");
    };
    assert!(h.monitoring.xid_watch_down_since.is_some(), "{h:?}");
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
