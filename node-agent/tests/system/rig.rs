//! The fixture of `system.rs`: a broker, a temporary directory and a host
//! name for each test, and the agents it runs there, as a process or in
//! this process.

use std::ops::Deref;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use loopwarden_protocol::message::{CduState, LeakSensing, RackCooling, RackState};
use loopwarden_protocol::{
    samples, Ack, CduMode, Celsius, CommandAuth, Frame, GpuSelector, Message, NodeId, RackIndex,
    ReasonCode, Role, TimestampMs,
};
use loopwarden_system_tests::{publish_raw, retained, Mosquitto, Seen, Subscriber};
use node_agent::clock::{Clock, SystemClock};
use node_agent::config::Overrides;
use node_agent::gpu::GpuSource;
use node_agent::shell::AgentError;
use node_agent::sim_gpus::{TwinControl, TwinSource};

/// The site every test's host is in.
pub const SITE: &str = "sys";
const AGENT: &str = env!("CARGO_BIN_EXE_node-agent");

/// The wall clock, ms since the epoch: what the tests stamp frames with.
pub fn now() -> TimestampMs {
    TimestampMs(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis() as u64,
    )
}

/// A lease `id` from `sender`, stamped now, capping `caps` (GPUs and
/// watts) for `ms`; unsigned: [`Rig::send`] signs it for the host it goes
/// to unless the test signs it itself.
pub fn lease_from(
    sender: NodeId,
    seq: u32,
    id: u32,
    caps: &[(GpuSelector, u32)],
    ms: u32,
) -> Frame {
    Frame {
        sender,
        seq,
        time: now(),
        message: Message::CapLease(samples::cooling_lease(id, caps, ms)),
    }
}

/// A lease `id` from `cdu-a`, stamped now, capping `caps` for `ms`.
pub fn lease(seq: u32, id: u32, caps: &[(GpuSelector, u32)], ms: u32) -> Frame {
    let cdu_a = NodeId::new(Role::Cdu, "cdu-a").expect("ident");
    lease_from(cdu_a, seq, id, caps, ms)
}

/// The limits an ack says are in force.
pub fn limits(ack: &Ack) -> Vec<u32> {
    ack.in_force.iter().map(|c| c.limit.0).collect()
}

/// A CDU's state as `cdu-a` publishes it, unsigned: racks 0 to 3, rack 2's
/// cooling lost when `rack2_lost`, every other rack normal.
pub fn cdu_state(rack2_lost: bool) -> CduState {
    CduState {
        mode: CduMode::Normal,
        reason: ReasonCode::OK,
        since: now(),
        setpoint: Celsius::new(32.0).expect("fits"),
        supply: Some(Celsius::new(32.1).expect("fits")),
        flow_per_gpu: None,
        racks: (0..4)
            .map(|r| RackState {
                rack: RackIndex::new(r).expect("rack"),
                cooling: if r == 2 && rack2_lost {
                    RackCooling::Lost
                } else {
                    RackCooling::Normal
                },
                sensing: LeakSensing::Supervised,
            })
            .collect(),
        facility: None,
        auth: CommandAuth::default(),
    }
}

/// One test's world: a private mosquitto, a temporary directory and the
/// host under test, with what starts agents for that host and talks to
/// them over the bus. The broker stops when the rig is dropped; each agent
/// it starts ([`Agent`], [`InProcess`]) stops when that one is, so a test
/// declares its rig first.
pub struct Rig {
    /// The broker's port.
    pub port: u16,
    /// The host under test.
    pub host: &'static str,
    /// Where the agents keep their console socket, flash and whatever the
    /// test writes.
    pub dir: tempfile::TempDir,
    _broker: Mosquitto,
}

impl Rig {
    /// Starts a broker for `host`, or `None` (the test is skipped) when
    /// mosquitto is not installed outside CI.
    pub fn start(host: &'static str) -> Option<Rig> {
        let broker = Mosquitto::start()?;
        Some(Rig {
            port: broker.port(),
            host,
            dir: tempfile::tempdir().expect("temp dir"),
            _broker: broker,
        })
    }

    /// The host's topic of `family` (`event`, `ack`, `+`, ...).
    pub fn topic(&self, family: &str) -> String {
        format!("dc/v2/{SITE}/host/{}/{family}", self.host)
    }

    /// A live subscription to the host's topics of `families`.
    pub fn subscribe(&self, families: &[&str]) -> Subscriber {
        let topics: Vec<String> = families.iter().map(|f| self.topic(f)).collect();
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        Subscriber::start(self.port, &topics).expect("mosquitto_sub")
    }

    /// The agents' flash file, kept across their restarts.
    pub fn flash(&self) -> PathBuf {
        self.dir.path().join("agent.flash")
    }

    /// `agent.log` in the rig's folder, opened for an agent process's
    /// output to be appended (across its restarts); and its path.
    pub fn agent_log(&self) -> (std::fs::File, PathBuf) {
        let path = self.dir.path().join("agent.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("agent log");
        (file, path)
    }

    /// The flags of a host of rack `rack` whose cooling-loss steps only
    /// note themselves, after a grace of `grace_s`: each step appends
    /// `<step> <host> <rack>` to the log, whose path comes with them.
    pub fn noted_cooling_steps(&self, rack: u8, grace_s: u64) -> (Overrides, PathBuf) {
        let log = self.dir.path().join("actions.log");
        let script = self.dir.path().join("note.sh");
        std::fs::write(
            &script,
            format!("#!/bin/sh\necho \"$*\" >> {}\n", log.display()),
        )
        .expect("script");
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let note = |step: &str| vec![format!("{} {step} {{host}} {{rack}}", script.display())];
        let flags = Overrides {
            rack: Some(rack),
            cooling_drain: note("drain"),
            cooling_power_down: note("power_down"),
            cooling_power_up: note("power_up"),
            cooling_resume: note("resume"),
            cooling_grace_s: Some(grace_s),
            ..Default::default()
        };
        (flags, log)
    }

    /// The console of the host's agent, whichever kind runs.
    pub fn console(&self) -> Console {
        Console(self.dir.path().join(format!("{}.sock", self.host)))
    }

    /// Publishes `payload` (QoS 1) on `topic`.
    pub fn publish(&self, topic: &str, payload: &[u8], retain: bool) {
        publish_raw(self.port, topic, payload, retain).expect("mosquitto_pub");
    }

    /// The host's retained health frame, if any.
    pub fn retained_health(&self) -> Option<Frame> {
        retained(
            self.port,
            &[&self.topic("health")],
            Duration::from_millis(500),
        )
        .expect("mosquitto_sub")
        .first()
        .and_then(frame)
    }

    /// Sends a command to the host, signed for it with the demonstration
    /// key unless the test signed it already.
    pub fn send(&self, frame: &Frame) {
        let mut frame = frame.clone();
        let unsigned = match &frame.message {
            Message::CapLease(l) => l.auth.signature == [[0; 32]; 2],
            Message::QuarantineRelease(r) => r.auth.signature == [[0; 32]; 2],
            _ => false,
        };
        if unsigned {
            frame
                .sign(&self.cmd_topic(), 1, &samples::demo_signing_key())
                .expect("a command signs");
        }
        let mut buf = [0u8; 2048];
        let n = frame.encode(&mut buf).expect("encodes");
        self.publish(&self.topic("cmd"), &buf[..n], false);
    }

    /// Sends `command` and waits, on `sub`, for its ack. An ack stamped
    /// before the command was sent is an older one (the outbox sends
    /// unconfirmed acks again after a restart) and is skipped.
    pub fn ack(&self, sub: &mut Subscriber, command: &Frame) -> Ack {
        self.send(command);
        let answers = |f: &Frame| {
            f.time >= command.time
                && matches!(f.message, Message::Ack(ref a) if a.correlation.seq == command.seq)
        };
        let seen = sub.collect_until(Duration::from_secs(10), |s| {
            s.last().and_then(frame).is_some_and(|f| answers(&f))
        });
        match seen.last().and_then(frame) {
            Some(f) if answers(&f) => match f.message {
                Message::Ack(a) => a,
                _ => unreachable!("checked"),
            },
            _ => panic!("no ack for command {}", command.seq),
        }
    }

    /// The host's `cmd` topic (what its commands are signed for).
    pub fn cmd_topic(&self) -> loopwarden_protocol::Topic {
        loopwarden_protocol::Topic::new(
            &loopwarden_protocol::Ident::new(SITE).expect("ident"),
            Role::Host,
            &loopwarden_protocol::Ident::new(self.host).expect("ident"),
            loopwarden_protocol::Family::Cmd,
        )
    }

    /// `node-agent run --twin-gpus 8` as a process, its state in memory
    /// only; returns once its console answers.
    pub fn spawn(&self) -> Agent {
        self.spawn_with(false)
    }

    /// As [`Rig::spawn`], keeping its state in the rig's flash.
    pub fn spawn_on_flash(&self) -> Agent {
        self.spawn_with(true)
    }

    fn spawn_with(&self, flash: bool) -> Agent {
        let console = self.console();
        let mut cmd = Command::new(AGENT);
        cmd.args([
            "run",
            "--twin-gpus",
            "8",
            "--site",
            SITE,
            "--host",
            self.host,
        ])
        .args(["--broker", &format!("127.0.0.1:{}", self.port)])
        .args(["--cdu", "cdu-a"])
        .args(["--period-ms", "200", "--json-period-ms", "1000"])
        .arg("--console")
        .arg(&console.0)
        .env("RUST_LOG", "info,rumqttc=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        if flash {
            cmd.arg("--flash").arg(self.flash());
        }
        let agent = Agent {
            child: Some(cmd.spawn().expect("start node-agent")),
            console,
        };
        agent.ctl_within(
            &["status"],
            Duration::from_secs(20),
            "the agent's console never answered",
        );
        agent
    }

    /// An agent in this process over `gpus` twin GPUs, to be started with
    /// [`Builder::start`] once the test has said what differs.
    pub fn agent(&self, gpus: usize) -> Builder<'_> {
        Builder {
            rig: self,
            gpus,
            flags: Overrides::default(),
            flash: false,
            source: None,
            twin: None,
            clock: Arc::new(SystemClock::new()),
        }
    }
}

/// A frame as received, if it decodes.
pub fn frame(s: &Seen) -> Option<Frame> {
    Frame::decode(&s.payload).ok()
}

/// An agent's console, asked with `node-agent ctl`.
pub struct Console(PathBuf);

impl Console {
    /// `node-agent ctl --json ARGS`, parsed; `None` when it fails.
    pub fn ctl(&self, args: &[&str]) -> Option<serde_json::Value> {
        let out = Command::new(AGENT)
            .arg("ctl")
            .arg("--console")
            .arg(&self.0)
            .arg("--json")
            .args(args)
            .output()
            .expect("run node-agent ctl");
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// [`Console::ctl`], asked again every 100 ms until it answers; fails
    /// saying `never` when it has not within `within`.
    pub fn ctl_within(&self, args: &[&str], within: Duration, never: &str) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            if let Some(v) = self.ctl(args) {
                return v;
            }
            assert!(Instant::now() < deadline, "{never}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `node-agent ctl ARGS` as a person reads it; checks it holds no
    /// Rust debug text or raw JSON.
    pub fn ctl_text(&self, args: &[&str]) -> String {
        let out = Command::new(AGENT)
            .arg("ctl")
            .arg("--console")
            .arg(&self.0)
            .args(args)
            .output()
            .expect("run node-agent ctl");
        assert!(out.status.success(), "ctl {args:?}");
        let text = String::from_utf8(out.stdout).expect("UTF-8");
        for bad in ["{", "}", "Some(", "None", "\"auth\""] {
            assert!(!text.contains(bad), "{bad:?} in ctl {args:?}:\n{text}");
        }
        text
    }
}

/// The agent as a process ([`Rig::spawn`]); killed when dropped.
pub struct Agent {
    child: Option<Child>,
    console: Console,
}

impl Agent {
    /// Stops it with SIGTERM, as systemd does, and returns its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        sigterm(self.child.take().expect("running"))
            .unwrap_or_else(|| panic!("the agent did not stop on SIGTERM"))
    }

    /// Kills it without warning (SIGKILL): a crash.
    pub fn crash(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().expect("kill");
        child.wait().expect("reap");
    }
}

impl Deref for Agent {
    type Target = Console;
    fn deref(&self) -> &Console {
        &self.console
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What an in-process agent starts with ([`Rig::agent`]): sampling every
/// 200 ms for CDU `cdu-a` on twin GPUs and the system clock, unless the
/// test says otherwise.
pub struct Builder<'r> {
    rig: &'r Rig,
    gpus: usize,
    flags: Overrides,
    flash: bool,
    source: Option<Box<dyn GpuSource + Send>>,
    twin: Option<TwinSource>,
    clock: Arc<dyn Clock>,
}

impl Builder<'_> {
    /// More flags (site, broker, console, host and GPU count are the rig's).
    pub fn flags(mut self, flags: Overrides) -> Self {
        self.flags = flags;
        self
    }

    /// Keeps its state in the rig's flash.
    pub fn flash(mut self) -> Self {
        self.flash = true;
        self
    }

    /// Runs on these twin GPUs (the ones another agent ran on, for a
    /// restart) instead of new ones.
    pub fn twin(mut self, twin: TwinSource) -> Self {
        self.twin = Some(twin);
        self
    }

    /// Reads these GPUs instead of twins (the agent then has no
    /// [`InProcess::control`]).
    pub fn source(mut self, source: impl GpuSource + Send + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// Runs on a clock the test steps.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Starts it on a runtime of its own; returns at once.
    pub fn start(self) -> InProcess {
        let Builder {
            rig,
            gpus,
            flags: more,
            flash,
            source,
            twin,
            clock,
        } = self;
        let console = rig.console();
        let mut common = more.common.clone();
        common.site = Some(SITE.into());
        common.broker = Some(format!("127.0.0.1:{}", rig.port));
        common.console = Some(console.0.clone());
        if flash {
            common.flash = Some(rig.flash());
        }
        let flags = Overrides {
            common,
            host: Some(rig.host.into()),
            twin_gpus: Some(gpus as u8),
            period_ms: Some(more.period_ms.unwrap_or(200)),
            cdu: Some(more.cdu.clone().unwrap_or_else(|| "cdu-a".into())),
            ..more
        };
        let config = node_agent::config::load(None, &flags).expect("config");
        let (source, control) = match source {
            Some(source) => (source, None),
            None => {
                let twin = twin.unwrap_or_else(|| {
                    let board = loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("board");
                    let twin = TwinSource::new(&board, gpus, 3);
                    // As `main` does with `twin_admin_limit_w`.
                    match config.twin_admin_limit {
                        Some(w) => twin.at_limit(w).expect("a settable limit"),
                        None => twin,
                    }
                });
                let control = twin.control();
                (Box::new(twin) as Box<dyn GpuSource + Send>, Some(control))
            }
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        // The agent's loop is not `Send` (its flash stores hold borrows
        // across awaits); it runs on a runtime of its own, as in `main`.
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            rt.block_on(node_agent::shell::run_with_clock(
                config,
                source,
                clock,
                async {
                    let _ = stop_rx.await;
                },
            ))
        });
        InProcess {
            control,
            stop: Some(stop_tx),
            thread: Some(thread),
            console,
        }
    }
}

/// An agent running in this process ([`Builder::start`]), so a test can
/// inject faults into its twin GPUs; stopped when dropped.
pub struct InProcess {
    control: Option<TwinControl>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), AgentError>>>,
    console: Console,
}

impl InProcess {
    /// Its twin GPUs' fault injection.
    pub fn control(&self) -> &TwinControl {
        self.control.as_ref().expect("an agent on twin GPUs")
    }

    /// Stops it and checks that it ran without error.
    pub fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let thread = self.thread.take().expect("running");
        thread.join().expect("joined").expect("agent ran");
    }
}

impl Deref for InProcess {
    type Target = Console;
    fn deref(&self) -> &Console {
        &self.console
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Waits a while, never for ever: a test that failed with the agent
        // stuck must still report.
        if let Some(thread) = self.thread.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

// Agents in a process of their own (`twin_process.rs`).
#[allow(dead_code)]
#[path = "twin_process.rs"]
pub mod twin_process;

/// Stops `child` with SIGTERM, as systemd does: its exit status, `None`
/// when it has not exited within 15 s.
pub fn sigterm(mut child: Child) -> Option<std::process::ExitStatus> {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
