//! # loopwarden-system-tests: the whole system against a real broker
//!
//! The harness of the tests in `tests/tests/`: a private `mosquitto` on a
//! free loopback port per test, `mosquitto_sub`/`mosquitto_pub` as the
//! third-party peers, a TCP proxy that cuts and restores a connection on
//! command (fault injection without restarting the broker), and the
//! skip-or-fail rule for missing tools. [`slurm`] starts a private
//! single-host Slurm (munged, slurmctld, one slurmd) for the site actions.
//!
//! Glossary:
//! - *peer tool*: a program nobody here wrote that checks our bytes
//!   (`mosquitto_sub`, `mosquitto_pub`, Python's `jsonschema`).
//! - *skip*: outside CI a test whose tool is missing says so and passes
//!   without checking anything; with `CI=true` it fails instead.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopwarden_bus::BrokerAddr;

pub mod example_config;
pub mod json_presence;
mod nats;
pub mod prometheus;
pub mod serial_console;
pub mod slurm;
pub mod twin_agent;

pub use nats::NatsCluster;

/// True when running under CI (`CI=true`), where missing tools are failures.
pub fn in_ci() -> bool {
    std::env::var("CI")
        .map(|v| v == "true" || v == "1")
        .unwrap_or(false)
}

/// The `lwbus` built beside the running test (in the target directory),
/// or `None` (skip) outside CI; under CI a missing one panics.
pub fn lwbus() -> Option<PathBuf> {
    let exe = std::env::current_exe().expect("the test's path");
    let bin = exe.parent()?.parent()?.join("lwbus");
    if bin.is_file() {
        return Some(bin);
    }
    let why = format!(
        "{} not built (cargo build -p loopwarden-bus --bin lwbus)",
        bin.display()
    );
    assert!(!in_ci(), "{why}; CI=true, so this is a failure");
    eprintln!("SKIP: {why}");
    None
}

/// Finds `tool` on the PATH. Outside CI a missing tool prints why the test
/// is skipped and returns `None`; under CI it panics.
pub fn require_tool(tool: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
            .map(|p| p.join(tool))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let why = format!(
            "{tool} not found on PATH (.ci/run installs it: mosquitto, mosquitto-clients, nats-server, mbpoll, socat, Slurm, munge, Prometheus)"
        );
        if in_ci() {
            panic!("{why}; CI=true, so this is a failure");
        }
        eprintln!("SKIP: {why}");
    }
    found
}

/// Python 3 with `module` importable, or `None` (skip) outside CI.
pub fn require_python_module(module: &str) -> Option<PathBuf> {
    let python = require_tool("python3")?;
    let ok = Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        let why = format!("python3 cannot import {module} (pip install {module})");
        if in_ci() {
            panic!("{why}; CI=true, so this is a failure");
        }
        eprintln!("SKIP: {why}");
        return None;
    }
    Some(python)
}

/// Python 3 with the `jsonschema` package, or `None` (skip) outside CI.
pub fn require_python_jsonschema() -> Option<PathBuf> {
    let python = require_tool("python3")?;
    let ok = Command::new(&python)
        .args(["-c", "import jsonschema"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        let why = "python3 has no jsonschema module (pip install jsonschema)";
        if in_ci() {
            panic!("{why}; CI=true, so this is a failure");
        }
        eprintln!("SKIP: {why}");
        return None;
    }
    Some(python)
}

/// A free TCP port on loopback (free when asked; a test binds it at once).
///
/// Chosen below the kernel's ephemeral range, so that no outgoing
/// connection (a client's own source port) can take it before the service
/// binds it, and no probe of it can connect to itself; and never the same
/// port twice in one test process, so that two services started at once
/// cannot race for one port. Falls back to a kernel-chosen port when the
/// low range is full.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (low, span) = below_ephemeral();
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    // A per-process start in the range, so that two test binaries run one
    // after the other do not walk the same ports.
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (low + (start + step) % span) as u16;
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("an ephemeral port on loopback");
        if given.insert(port) {
            return port;
        }
    }
}

/// The ports `free_port` chooses from: `(first, how many)`, from 20000 up
/// to the start of the kernel's ephemeral range (32768 when unreadable).
fn below_ephemeral() -> (u32, u32) {
    const LOW: u32 = 20_000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    (LOW, ephemeral.saturating_sub(LOW).max(1))
}

/// Waits until something accepts TCP connections on `addr`. A connection
/// to itself (a source port equal to `addr`'s, which the kernel allows on
/// loopback) is not a listener.
pub fn wait_listening(addr: SocketAddr, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(100)) {
            if stream.local_addr().ok() != Some(addr) {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A private mosquitto broker on a loopback port, stopped when dropped.
pub struct Mosquitto {
    child: Option<Child>,
    port: u16,
    conf: PathBuf,
    _dir: tempfile::TempDir,
}

impl Mosquitto {
    /// Starts one, or `None` (skip) when mosquitto is not installed outside CI.
    pub fn start() -> Option<Mosquitto> {
        Self::start_with(false)
    }

    /// Starts one that keeps sessions and retained messages across its own
    /// restarts ([`Mosquitto::stop`], [`Mosquitto::restart`]) when `persistent`.
    pub fn start_with(persistent: bool) -> Option<Mosquitto> {
        require_tool("mosquitto")?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = free_port();
        let conf = dir.path().join("mosquitto.conf");
        let persistence = if persistent {
            format!(
                "persistence true\npersistence_location {}/\n",
                dir.path().display()
            )
        } else {
            "persistence false\n".to_string()
        };
        std::fs::write(
            &conf,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\n{persistence}log_dest stderr\nlog_type error\nlog_type warning\n"
            ),
        )
        .expect("write mosquitto.conf");
        let mut m = Mosquitto {
            child: None,
            port,
            conf,
            _dir: dir,
        };
        m.restart();
        Some(m)
    }

    /// Stops it the way a service stop does (SIGTERM), saving its state when
    /// persistent, and waits until it is gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port with the same configuration.
    pub fn restart(&mut self) {
        self.stop();
        let bin = require_tool("mosquitto").expect("mosquitto was found before");
        let child = Command::new(bin)
            .arg("-c")
            .arg(&self.conf)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mosquitto");
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        let mut child = child;
        let listening = wait_listening(addr, Duration::from_secs(10));
        // Listening, and it is ours: a broker that could not bind the port
        // (taken since `free_port` chose it) has exited.
        let alive = matches!(child.try_wait(), Ok(None));
        assert!(
            listening && alive,
            "mosquitto did not come up on {addr} (port taken?)"
        );
        self.child = Some(child);
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its address for the bus shell.
    pub fn addr(&self) -> BrokerAddr {
        BrokerAddr {
            host: "127.0.0.1".into(),
            port: self.port,
        }
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One message as `mosquitto_sub -F '%r %t %x'` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The retain flag as delivered.
    pub retained: bool,
    /// The topic.
    pub topic: String,
    /// The payload.
    pub payload: Vec<u8>,
}

/// Decodes lowercase or uppercase hex.
pub fn from_hex(hex: &str) -> Vec<u8> {
    (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex from mosquitto_sub"))
        .collect()
}

/// The output format every `mosquitto_sub` of the harness uses.
const SUB_FORMAT: &str = "%r %t %x";

/// Parses one line of `mosquitto_sub -F '%r %t %x'`.
fn parse_seen(line: &str) -> Option<Seen> {
    let mut parts = line.splitn(3, ' ');
    Some(Seen {
        retained: parts.next()? == "1",
        topic: parts.next()?.to_string(),
        payload: from_hex(parts.next().unwrap_or("")),
    })
}

/// A mosquitto client tool pointed at the broker on `port`.
fn client(tool: &str, port: u16) -> Option<Command> {
    let mut cmd = Command::new(require_tool(tool)?);
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    Some(cmd)
}

/// A running `mosquitto_sub` whose output is read line by line.
pub struct Subscriber {
    child: Child,
    lines: mpsc::Receiver<Seen>,
    early: Vec<Seen>,
}

/// The probe topic a subscriber waits for to know its subscription is live.
pub const PROBE_TOPIC: &str = "dc/v2/probe";

impl Subscriber {
    /// Subscribes to `filters` on `port` and returns once the subscription
    /// is live (a probe published with `mosquitto_pub` came back).
    pub fn start(port: u16, filters: &[&str]) -> Option<Subscriber> {
        Self::start_session(port, filters, None)
    }

    /// As [`Subscriber::start`], with a persistent session under
    /// `client_id` (when given): the broker keeps its subscription and
    /// queues QoS 1 messages for it while it reconnects, also across a
    /// restart of a persistent broker.
    pub fn start_session(
        port: u16,
        filters: &[&str],
        client_id: Option<&str>,
    ) -> Option<Subscriber> {
        let mut sub = Self::spawn(port, filters, client_id)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // mosquitto_sub gives up when its one connection is refused (a
            // loaded machine, now and then): start it again.
            if let Ok(Some(status)) = sub.child.try_wait() {
                eprintln!("mosquitto_sub on port {port} ended ({status}) before its probe: again");
                let early = std::mem::take(&mut sub.early);
                sub = Self::spawn(port, filters, client_id)?;
                sub.early = early;
            }
            publish_raw(port, PROBE_TOPIC, b"probe", false)?;
            match sub.lines.recv_timeout(Duration::from_millis(300)) {
                Ok(seen) if seen.topic == PROBE_TOPIC => break,
                // Retained messages may arrive before the probe: keep them.
                Ok(seen) => sub.early.push(seen),
                Err(_) => {}
            }
            assert!(
                Instant::now() < deadline,
                "mosquitto_sub never received its probe"
            );
        }
        // Drain late duplicates of the probe for a moment; keep anything else.
        let settle = Instant::now() + Duration::from_millis(100);
        while let Some(left) = settle.checked_duration_since(Instant::now()) {
            match sub.lines.recv_timeout(left) {
                Ok(seen) if seen.topic == PROBE_TOPIC => {}
                Ok(seen) => sub.early.push(seen),
                Err(_) => break,
            }
        }
        Some(sub)
    }

    /// Starts `mosquitto_sub` on `filters` and the probe topic, its output
    /// read line by line on a thread.
    fn spawn(port: u16, filters: &[&str], client_id: Option<&str>) -> Option<Subscriber> {
        let mut cmd = client("mosquitto_sub", port)?;
        cmd.args(["-q", "1", "-F", SUB_FORMAT]);
        if let Some(id) = client_id {
            cmd.args(["-c", "-i", id]);
        }
        for f in filters.iter().chain([&PROBE_TOPIC]) {
            cmd.args(["-t", f]);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mosquitto_sub");
        let stdout: ChildStdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let Some(seen) = parse_seen(&line) else {
                    continue;
                };
                if tx.send(seen).is_err() {
                    break;
                }
            }
        });
        Some(Subscriber {
            child,
            lines: rx,
            early: Vec::new(),
        })
    }

    /// The next message, or `None` after `timeout`. Probes are skipped.
    pub fn next(&mut self, timeout: Duration) -> Option<Seen> {
        if !self.early.is_empty() {
            return Some(self.early.remove(0));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(s) if s.topic == PROBE_TOPIC => continue,
                Ok(s) => return Some(s),
                Err(_) => return None,
            }
        }
    }

    /// Collects messages until `done` says enough or `timeout` passes.
    pub fn collect_until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&[Seen]) -> bool,
    ) -> Vec<Seen> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        while !done(&seen) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            match self.next(left) {
                Some(s) => seen.push(s),
                None => break,
            }
        }
        seen
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the retained messages under `filters` (what a new subscriber gets
/// at once), waiting `settle` for them to arrive.
pub fn retained(port: u16, filters: &[&str], settle: Duration) -> Option<Vec<Seen>> {
    let mut cmd = client("mosquitto_sub", port)?;
    cmd.args(["-F", SUB_FORMAT, "--retained-only"]);
    cmd.args(["-W", &settle.as_secs().max(1).to_string()]);
    for f in filters {
        cmd.args(["-t", f]);
    }
    let out = cmd
        .stderr(Stdio::null())
        .output()
        .expect("run mosquitto_sub");
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(parse_seen)
            .collect(),
    )
}

/// Publishes `payload` with `mosquitto_pub` (QoS 1).
pub fn publish_raw(port: u16, topic: &str, payload: &[u8], retain: bool) -> Option<()> {
    let file = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(file.path(), payload).expect("write payload");
    let mut cmd = client("mosquitto_pub", port)?;
    cmd.args(["-q", "1", "-t", topic, "-f"]);
    cmd.arg(file.path());
    if retain {
        cmd.arg("-r");
    }
    // A loaded machine can refuse a connection now and then: try again.
    let mut status = cmd.status().expect("run mosquitto_pub");
    for _ in 0..4 {
        if status.success() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        status = cmd.status().expect("run mosquitto_pub");
    }
    assert!(status.success(), "mosquitto_pub failed: {status}");
    Some(())
}

/// The repository's root (for `docs/schemas/`).
pub fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A TCP proxy from a loopback port to `target` that can cut every
/// connection and refuse new ones, then let them through again: a network
/// outage between one client and the broker, with the broker itself up.
pub struct CutProxy {
    port: u16,
    open: Arc<AtomicBool>,
    generation: Arc<std::sync::atomic::AtomicU64>,
}

impl CutProxy {
    /// Starts forwarding.
    pub fn start(target: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let open = Arc::new(AtomicBool::new(true));
        let generation = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (o, g) = (open.clone(), generation.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !o.load(Ordering::SeqCst) {
                    drop(client); // refused: closed at once
                    continue;
                }
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let gen_at_start = g.load(Ordering::SeqCst);
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server.try_clone().unwrap(), client.try_clone().unwrap()),
                ] {
                    let g = g.clone();
                    std::thread::spawn(move || {
                        from.set_read_timeout(Some(Duration::from_millis(50))).ok();
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            if g.load(Ordering::SeqCst) != gen_at_start {
                                break;
                            }
                            match std::io::Read::read(&mut from, &mut buf) {
                                Ok(0) => break,
                                Ok(n) => {
                                    if std::io::Write::write_all(&mut to, &buf[..n]).is_err() {
                                        break;
                                    }
                                }
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        std::io::ErrorKind::WouldBlock
                                            | std::io::ErrorKind::TimedOut
                                    ) => {}
                                Err(_) => break,
                            }
                        }
                        let _ = from.shutdown(std::net::Shutdown::Both);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        CutProxy {
            port,
            open,
            generation,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> BrokerAddr {
        BrokerAddr {
            host: "127.0.0.1".into(),
            port: self.port,
        }
    }

    /// Cuts every connection and refuses new ones.
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

/// Serves `cdu` on Modbus TCP on a free loopback port, on a runtime of
/// its own (kept by the caller for as long as the CDU must answer).
pub fn serve_sim_cdu(
    cdu: &loopwarden_twin::sim_cdu::SimCdu,
) -> (tokio::runtime::Runtime, SocketAddr) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let addr = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let addr = l.local_addr().expect("its address");
        tokio::spawn(cdu.clone().serve(l));
        addr
    });
    (rt, addr)
}

/// A simulated CDU as a controller first finds it: settings no controller
/// chose (30 °C, 80 %, lead pump B, every valve shut) and the measurements
/// of a steady loaded loop (supply 40 °C, return 49.3 °C, 192 L/min, IT
/// 120 kW, cooling 10 kW, facility 135 kW: PUE 1.125) on a 20 °C day.
pub fn steady_sim_cdu() -> loopwarden_twin::sim_cdu::SimCdu {
    steady_sim_cdu_on(loopwarden_boards::modbus_map::RegisterMap::sim_cdu())
}

/// As [`steady_sim_cdu`], serving the register map `map` (a CDU whose
/// own ranges or registers differ from the map its controller is given;
/// a setting or measurement the map cannot take is left as it starts).
pub fn steady_sim_cdu_on(
    map: loopwarden_boards::modbus_map::RegisterMap,
) -> loopwarden_twin::sim_cdu::SimCdu {
    use loopwarden_twin::sim_cdu::SimCdu;
    let cdu = SimCdu::new(map, &[]).expect("no settings to refuse");
    for (name, value) in [
        ("supply_setpoint", 30.0),
        ("pump_speed", 80.0),
        ("lead_pump", 1.0),
        ("pumps_run", 2.0),
        ("valves_open", 0.0),
    ] {
        let _ = cdu.write_setting(name, value);
    }
    for (name, value) in [
        ("supply_temp", 40.0),
        ("return_temp", 49.3),
        ("flow", 192.0),
        ("facility_supply_temp", 30.0),
        ("pump_a_running", 1.0),
        ("pump_b_running", 0.0),
        ("leak_inputs", 0.0),
        ("it_power", 120_000.0),
        ("cooling_power", 10_000.0),
        ("facility_power", 135_000.0),
        ("outdoor_temp", 20.0),
    ] {
        // A map without the register simply does not show it.
        let _ = cdu.set_measurement(name, value);
    }
    cdu
}

/// Runs `mbpoll` against unit 1 on a loopback Modbus TCP `port` (0-based
/// addresses, one poll) with `args`; whether it succeeded, and what it
/// printed (stdout then stderr).
pub fn mbpoll(port: u16, args: &[&str]) -> (bool, String) {
    run_mbpoll(port, &["-a", "1"], args)
}

/// As [`mbpoll`], asking unit `unit` and waiting `timeout` seconds (`-o`)
/// for an answer.
pub fn mbpoll_unit(port: u16, unit: u8, timeout: &str, args: &[&str]) -> (bool, String) {
    run_mbpoll(port, &["-a", &unit.to_string(), "-o", timeout], args)
}

fn run_mbpoll(port: u16, options: &[&str], args: &[&str]) -> (bool, String) {
    let out = Command::new("mbpoll")
        .args(["-m", "tcp", "-0", "-1", "-p", &port.to_string()])
        .args(options)
        .args(args)
        .output()
        .expect("run mbpoll");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The values of the `[n]: value` lines of `mbpoll`'s output.
pub fn mbpoll_values(text: &str) -> Vec<i64> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix('[')?.split_once("]:"))
        .filter_map(|(_, v)| v.split_whitespace().next()?.parse().ok())
        .collect()
}

/// A site's PKI written by `lwbus pki init` (as a library) into a fresh
/// temporary directory, its broker on `broker_port`: hosts, CDUs,
/// operators and readers as the command line takes them.
pub fn pki_dir(
    site: &str,
    [hosts, cdus, operators, readers]: [&str; 4],
    broker_port: u16,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let split = |s: &str| s.split(',').map(String::from).collect::<Vec<_>>();
    let args = loopwarden_bus::pki::InitArgs {
        site: site.into(),
        hosts: split(hosts),
        cdus: split(cdus),
        operators: split(operators),
        readers: split(readers),
        out: dir.path().to_path_buf(),
        broker_port,
    };
    loopwarden_bus::pki::init(&args).expect("lwbus pki init");
    dir
}

/// A private mosquitto started as `mosquitto -c DIR/mosquitto.conf` with
/// the configuration, certificates and ACL of [`pki_dir`]: TLS with client
/// certificates on a free loopback port. Stopped when dropped; its log is
/// `DIR/mosquitto.log`.
pub struct PkiBroker {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl PkiBroker {
    /// Writes the PKI and starts the broker, or `None` (skip) when
    /// mosquitto is not installed outside CI.
    pub fn start(site: &str, identities: [&str; 4]) -> Option<PkiBroker> {
        let bin = require_tool("mosquitto")?;
        let port = free_port();
        let dir = pki_dir(site, identities, port);
        let log = std::fs::File::create(dir.path().join("mosquitto.log")).expect("a log file");
        let mut child = Command::new(bin)
            .arg("-c")
            .arg(dir.path().join("mosquitto.conf"))
            .stdout(log.try_clone().expect("the log file"))
            .stderr(log)
            .spawn()
            .expect("start mosquitto");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let listening = wait_listening(addr, Duration::from_secs(10));
        let alive = matches!(child.try_wait(), Ok(None));
        let broker = PkiBroker { child, port, dir };
        assert!(
            listening && alive,
            "mosquitto did not come up on {addr}:\n{}",
            broker.log()
        );
        Some(broker)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory with its PKI (`ID.crt`, `ID.key`, `ca.crt`, …).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What mosquitto has logged so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    /// `mosquitto_pub` or `mosquitto_sub` pointed at this broker, trusting
    /// its CA, with the certificate and key of identity `who` (none: no
    /// client certificate).
    pub fn client(&self, tool: &str, who: Option<&str>) -> Option<Command> {
        let mut cmd = client(tool, self.port)?;
        cmd.arg("--cafile").arg(self.dir().join("ca.crt"));
        if let Some(who) = who {
            cmd.arg("--cert").arg(self.dir().join(format!("{who}.crt")));
            cmd.arg("--key").arg(self.dir().join(format!("{who}.key")));
        }
        Some(cmd)
    }
}

impl Drop for PkiBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
