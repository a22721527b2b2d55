//! The fake `libnvidia-ml.so.1` (`tests/fake_nvml/lib.rs`), built once
//! per test binary, and the agent's own binary run on it with a real
//! host's configuration: shared by the tests of the production NVML path
//! (`nvml_library*.rs`), each of which declares `rig` beside it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use loopwarden_protocol::auth::{May, Signer};
use loopwarden_protocol::message::HostTelemetry;
use loopwarden_protocol::{samples, Event, GpuIndex, GpuSelector, Ident, Message, NodeId, Role};
use loopwarden_system_tests::Subscriber;

use crate::rig::{self, frame, Rig, SITE};

pub const AGENT: &str = env!("CARGO_BIN_EXE_node-agent");
pub const FAKE_SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_nvml/lib.rs");
pub const SET: &str = "nvmlDeviceSetPowerManagementLimit";
pub const LOOKUP: &str = "nvmlDeviceGetHandleByIndex_v2";

// ------------------------------------------------------------ the fake

/// The folder holding the fake `libnvidia-ml.so.1`, built once per test
/// binary; `None` (the test is skipped) when there is no `rustc` outside
/// CI.
pub fn fake_library() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT.get_or_init(build_fake).as_deref()
}

/// Builds the fake as cargo would find `rustc` (`$RUSTC`, else `rustc`),
/// into a folder of its own under cargo's temporary folder for tests.
pub fn build_fake() -> Option<PathBuf> {
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
pub struct Call {
    /// The entry point, or `control` for a control line applied.
    pub name: String,
    /// What follows it.
    pub args: Vec<String>,
}

impl Call {
    /// The GPU it named (none for a control line).
    pub fn gpu(&self) -> Option<usize> {
        if self.name == "control" {
            return None;
        }
        self.args.first()?.parse().ok()
    }

    /// The value it carried (a limit set's mW).
    pub fn value(&self) -> Option<u64> {
        self.args.get(1)?.parse().ok()
    }
}

/// The calls of a log's text.
pub fn parse_log(text: &str) -> Vec<Call> {
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
pub struct FakeNvml {
    lib: &'static Path,
    script: PathBuf,
    log: PathBuf,
    control: PathBuf,
    state: PathBuf,
}

impl FakeNvml {
    /// A fake of `gpus` GPUs in `dir`, with the script lines `settings`.
    pub fn new(lib: &'static Path, dir: &Path, gpus: usize, settings: &str) -> Self {
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
    pub fn agent(&self, args: &[&str]) -> Command {
        self.agent_at(Path::new(AGENT), args)
    }

    /// The `node-agent` at `bin` with `args`, on the fake.
    pub fn agent_at(&self, bin: &Path, args: &[&str]) -> Command {
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
    pub fn quiet(self) -> Self {
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
    pub fn control(&self, line: &str) {
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

    /// Appends `lines` to the control file in one write, so the fake
    /// applies them at one call, in order; returns once the last is
    /// applied.
    pub fn control_at_once(&self, lines: &[&str]) {
        use std::io::Write;
        let last: Vec<&str> = lines.last().expect("a line").split_whitespace().collect();
        let applied = || {
            self.calls()
                .iter()
                .filter(|c| c.name == "control" && c.args == last)
                .count()
        };
        let before = applied();
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.control)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .expect("control lines");
        let until = Instant::now() + Duration::from_secs(10);
        while applied() == before {
            assert!(
                Instant::now() < until,
                "the fake NVML did not apply {lines:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        parse_log(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Every limit set so far: GPU and mW.
    pub fn sets(&self) -> Vec<(usize, u64)> {
        limit_sets(&self.calls())
    }

    /// Each GPU's limit now, mW, as the fake keeps it (its state file's
    /// `GPU limit_mw MW` lines, in GPU order).
    pub fn limits(&self) -> Vec<u64> {
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
    pub fn sets_until(
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
pub fn limit_sets(calls: &[Call]) -> Vec<(usize, u64)> {
    calls
        .iter()
        .filter(|c| c.name == SET)
        .filter_map(|c| Some((c.gpu()?, c.value()?)))
        .collect()
}

/// How often `name` was called on `gpu`.
pub fn count(calls: &[Call], name: &str, gpu: usize) -> usize {
    calls
        .iter()
        .filter(|c| c.name == name && c.gpu() == Some(gpu))
        .count()
}

// ----------------------------------------------------------- the agent

/// The GPUs of the `run` tests: an administrator left them at 500 W
/// (`nvidia-smi -pl 500`), default 700 W, settable from 200 to 700 W.
pub const HOST_GPUS: &str = "\
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
pub fn two_gpu_host(host: &'static str) -> Option<(Rig, FakeNvml)> {
    let lib = fake_library()?;
    let rig = Rig::start(host)?;
    let fake = FakeNvml::new(lib, rig.dir.path(), 2, HOST_GPUS);
    Some((rig, fake))
}

/// A real host's configuration for the rig's host, written in its folder:
/// its keyring (the demonstration key as `cdu/cdu-a`'s, so [`Rig::send`]
/// signs for it), its CDU and rack, a quarantine action and cooling-loss
/// commands, a 200 ms
/// period, the rig's flash file, and the top-level lines `more`.
pub fn host_config(rig: &Rig, more: &str) -> PathBuf {
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
    text.push_str("[quarantine]\nactions = [[\"/bin/true\", \"{gpu}\"]]\n");
    text.push_str("[cooling_loss]\ndrain = [[\"/bin/true\"]]\npower_down = [[\"/bin/true\"]]\n");
    let path = dir.join("agent.toml");
    std::fs::write(&path, text).expect("config");
    path
}

/// `node-agent run` on the fake as a process; killed when dropped.
pub struct RealAgent {
    child: Option<Child>,
    log: PathBuf,
}

impl RealAgent {
    /// Starts it with `config`, its log appended to `agent.log` in the
    /// rig's folder; returns once its console answers.
    pub fn start(rig: &Rig, fake: &FakeNvml, config: &Path) -> RealAgent {
        Self::start_at(rig, fake, Path::new(AGENT), config)
    }

    /// [`RealAgent::start`] with the `node-agent` at `bin`.
    pub fn start_at(rig: &Rig, fake: &FakeNvml, bin: &Path, config: &Path) -> RealAgent {
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
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it with SIGTERM, as systemd does; fails unless it exits 0
    /// within 15 s.
    pub fn terminate(&mut self) {
        let status = rig::sigterm(self.child.take().expect("running"));
        let Some(status) = status else {
            panic!("no stop on SIGTERM:\n{}", self.log_text());
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
pub fn telemetry_until(
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
pub fn events_until(
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

pub fn gpu(i: u8) -> GpuSelector {
    GpuSelector::Gpu(GpuIndex::new(i).expect("index"))
}

/// A lease from `cdu-a`, signed by [`Rig::send`].
pub fn lease(
    seq: u32,
    id: u32,
    caps: &[(GpuSelector, u32)],
    ms: u32,
) -> loopwarden_protocol::Frame {
    let cdu_a = NodeId::new(Role::Cdu, "cdu-a").expect("ident");
    rig::lease_from(cdu_a, seq, id, caps, ms)
}
