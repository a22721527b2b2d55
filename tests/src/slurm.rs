//! # A private single-host Slurm for the tests
//!
//! [`Slurm::start`] brings up a real Slurm (Debian's `slurmctld`, `slurmd`
//! and `munge`, Slurm 22.05) in a temporary directory, on free ports
//! reached through 127.0.0.1, as children of the test, so that a node
//! agent's site actions (`scontrol update NodeName=… State=DRAIN
//! Reason=…`) can be checked against what `sinfo -R` then shows. Dropping
//! the [`Slurm`] kills every daemon it started, reaps them and removes
//! the directory.
//!
//! Glossary:
//! - *munged*: the credential daemon every Slurm message is signed by;
//!   here a private one with its own key and socket (`DIR/munge.sock`).
//! - *slurmctld*: the controller, which holds every node's state and
//!   answers `sinfo` and `scontrol`.
//! - *slurmd*: the per-node daemon; it registers its node with the
//!   controller and answers its pings.
//! - *answering node*: the first node given to [`Slurm::start`], the only
//!   one with a `slurmd` (Debian's build has no multiple-slurmd support,
//!   so one host runs one). Every other node is configured on a port
//!   nothing listens on: it never answers and stays `unknown` (then
//!   `unknown*`, and `down*` after `SlurmdTimeout`, 300 s). It can still
//!   be drained (`drained`, listed by `sinfo -R`); Slurm 22.05 answers
//!   `State=RESUME` on it with "Invalid node state specified", though it
//!   lifts the drain.
//! - *reason*: the text `scontrol update … Reason=…` attaches to a node
//!   taken out of service, listed by `sinfo -R`.
//!
//! Every file lives in the temporary directory `DIR` ([`Slurm::dir`]):
//! `slurm.conf`, `munge.key`, `munge.sock`, `state/` (the controller's
//! state), `spool/` (slurmd's), the logs `munged.log` (its standard
//! error: in the foreground munged ignores `--log-file`), `slurmctld.log`
//! and `slurmd.log` (Slurm's log files, with times), and
//! `slurmctld.stderr` and `slurmd.stderr` (the same lines without times,
//! and what comes before the log file is open, such as errors in
//! `slurm.conf`). A failed start prints their tails.
//! The daemons run as the current user (`SlurmUser` and `SlurmdUser` are
//! its uid) with `munged --force`, so they need no system user, no
//! `/etc/munge` and no `/etc/slurm`; no cgroups are used (process
//! tracking by `/proc`, no task plugin), so no `cgroup.conf` either.
//! slurmctld and slurmd listen on every address of the host, not on
//! 127.0.0.1 alone: Slurm 22.05 binds to one address only
//! (`CommunicationParameters=NoInAddrAny`) by resolving the host name,
//! which a CI container may not do. Nothing reaches them without the
//! private munge key.

use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, require_tool, wait_listening};

/// The programs a [`Slurm`] needs, all from Debian's `slurmctld`,
/// `slurmd`, `slurm-client` and `munge` packages.
const TOOLS: [&str; 5] = ["munged", "slurmctld", "slurmd", "sinfo", "scontrol"];

/// How long the daemons get, together, to come up before [`Slurm::start`]
/// fails.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How many lines of each log a failure message shows.
const LOG_TAIL_LINES: usize = 40;

/// A private Slurm cluster on loopback: one `munged`, one `slurmctld` and
/// one `slurmd` for the first node, all children of the test, killed and
/// reaped when dropped.
pub struct Slurm {
    /// slurmd, slurmctld and munged, in the order they are stopped.
    children: Vec<(&'static str, Child)>,
    nodes: Vec<String>,
    sinfo: PathBuf,
    scontrol: PathBuf,
    conf: PathBuf,
    dir: tempfile::TempDir,
}

impl Slurm {
    /// Starts munged, slurmctld and a slurmd for `nodes[0]`, and waits
    /// until `sinfo` reports that node `idle`. The other nodes are
    /// configured but never answer (see the module note). Returns `None`
    /// (skip) when a program is missing outside CI; panics under
    /// `CI=true`, and whenever a daemon does not come up, with the tails
    /// of the logs.
    pub fn start(nodes: &[&str]) -> Option<Slurm> {
        assert!(!nodes.is_empty(), "Slurm::start needs at least one node");
        let mut found = Vec::new();
        for tool in TOOLS {
            match require_tool(tool) {
                Some(path) => found.push(path),
                None => {
                    eprintln!(
                        "SKIP: a private Slurm needs {tool} \
                         (apt-get install slurmctld slurmd slurm-client munge)"
                    );
                    return None;
                }
            }
        }
        let [munged, slurmctld, slurmd, sinfo, scontrol]: [PathBuf; 5] =
            found.try_into().expect("one path per tool");

        let dir = tempfile::tempdir().expect("a temporary directory for Slurm");
        let uid = std::fs::metadata(dir.path())
            .expect("the metadata of Slurm's temporary directory")
            .uid();
        for sub in ["state", "spool"] {
            std::fs::create_dir(dir.path().join(sub))
                .unwrap_or_else(|e| panic!("create {}/{sub}: {e}", dir.path().display()));
        }
        let deadline = Instant::now() + START_TIMEOUT;
        write_munge_key(&dir.path().join("munge.key"));
        let conf = dir.path().join("slurm.conf");
        let ctld_port = free_port();
        let text = slurm_conf(dir.path(), nodes, uid, &short_hostname(), ctld_port);
        std::fs::write(&conf, text).unwrap_or_else(|e| panic!("write {}: {e}", conf.display()));

        let mut slurm = Slurm {
            children: Vec::new(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            sinfo,
            scontrol,
            conf,
            dir,
        };
        let d = slurm.dir.path().to_path_buf();

        // munged first: slurmctld and slurmd sign and check every message
        // through its socket.
        let sock = d.join("munge.sock");
        let mut cmd = Command::new(munged);
        cmd.arg("--foreground")
            .arg("--force")
            .arg("--origin=127.0.0.1")
            .arg(format!("--socket={}", sock.display()))
            .arg(format!("--key-file={}", d.join("munge.key").display()))
            .arg(format!("--pid-file={}", d.join("munged.pid").display()))
            .arg(format!("--seed-file={}", d.join("munged.seed").display()));
        slurm.spawn("munged", "log", cmd);
        slurm.wait_until(deadline, "munged to create munge.sock", |_| {
            sock.exists()
                .then_some(())
                .ok_or_else(|| "no socket yet".into())
        });

        // The controller, then the node's daemon (it retries registering
        // until the controller answers).
        let mut cmd = Command::new(slurmctld);
        cmd.arg("-D");
        slurm.spawn("slurmctld", "stderr", cmd);
        let addr = SocketAddr::from(([127, 0, 0, 1], ctld_port));
        slurm.wait_until(deadline, &format!("slurmctld to listen on {addr}"), |_| {
            wait_listening(addr, Duration::from_millis(200))
                .then_some(())
                .ok_or_else(|| "connection refused".into())
        });
        let node = nodes[0];
        let mut cmd = Command::new(slurmd);
        cmd.args(["-D", "-N", node]);
        slurm.spawn("slurmd", "stderr", cmd);
        slurm.wait_until(
            deadline,
            &format!("sinfo to report {node} idle"),
            |s| match s.state(node) {
                idle if idle == "idle" => Ok(()),
                other => Err(format!("sinfo says {other:?}")),
            },
        );
        Some(slurm)
    }

    /// The environment a Slurm client (`scontrol`, `sinfo`, a node
    /// agent's actions) needs to talk to this cluster: `SLURM_CONF`.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![("SLURM_CONF".into(), self.conf.display().to_string())]
    }

    /// Its `slurm.conf`.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The temporary directory with its configuration, state and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The node names it was started with; the first is the answering one.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// Runs `scontrol ARGS` against this cluster: whether it succeeded,
    /// and what it printed (stdout then stderr).
    pub fn scontrol(&self, args: &[&str]) -> (bool, String) {
        let out = client(&self.scontrol, &self.conf)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {} {args:?}: {e}", self.scontrol.display()));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// `sinfo -R` as a person reads it: the reason, user, time and nodes
    /// of every node taken out of service (for failure messages).
    pub fn reasons(&self) -> String {
        self.sinfo_out(&["-R"])
    }

    /// One `(node, state, reason)` row per node `sinfo -R` lists: every
    /// node with a reason (drained, draining, down or failed), the state
    /// as `sinfo` spells it (`drained`, `draining`, `down*`, …) and the
    /// reason in full.
    pub fn drained(&self) -> Vec<(String, String, String)> {
        self.sinfo_out(&["-R", "-N", "-h", "-o", "%N|%T|%E"])
            .lines()
            .filter_map(|line| {
                let mut cols = line.splitn(3, '|');
                let node = cols.next()?.trim();
                let state = cols.next()?.trim();
                let reason = cols.next()?.trim();
                Some((node.into(), state.into(), reason.into()))
            })
            .collect()
    }

    /// The state of `node` as `sinfo -N -o %T` prints it (`idle`,
    /// `drained`, `draining`, `idle*`, `unknown`, …; `*` means it does
    /// not answer), or `""` when `sinfo` fails or lists no such node.
    pub fn state(&self, node: &str) -> String {
        client(&self.sinfo, &self.conf)
            .args(["-h", "-N", "-n", node, "-o", "%T"])
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| {
                let text = String::from_utf8_lossy(&out.stdout);
                text.lines().next().map(|l| l.trim().to_string())
            })
            .unwrap_or_default()
    }

    /// Waits up to `timeout` for [`Slurm::state`] of `node` to be `want`
    /// (a resumed node is `idle*` until the controller's next ping, about
    /// a second later); the last state seen, as `Err`, when it never is.
    pub fn wait_state(&self, node: &str, want: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let state = self.state(node);
            if state == want {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(state);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last lines of every daemon's log, headed by their file names
    /// (for failure messages): `munged.log`, then slurmctld's and slurmd's
    /// log files, or their standard error where a log file is empty (a
    /// daemon that stopped before opening it).
    pub fn log_tails(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.dir.path().join(name));
        ["munged.log", "slurmctld.log", "slurmd.log"]
            .iter()
            .map(|name| {
                let name = match read(name) {
                    Ok(text) if !text.trim().is_empty() => name.to_string(),
                    _ => name.replace(".log", ".stderr"),
                };
                let path = self.dir.path().join(name);
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if text.trim().is_empty() {
                    return format!("--- {} (empty)\n", path.display());
                }
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
                format!(
                    "--- {} (last {LOG_TAIL_LINES} lines)\n{tail}\n",
                    path.display()
                )
            })
            .collect()
    }

    /// `sinfo ARGS`' standard output; panics with its error when it fails.
    fn sinfo_out(&self, args: &[&str]) -> String {
        let out = client(&self.sinfo, &self.conf)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {} {args:?}: {e}", self.sinfo.display()));
        assert!(
            out.status.success(),
            "sinfo {args:?} against {} failed ({}): {}",
            self.conf.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts daemon `name` from `cmd` as a child: the cluster's
    /// configuration, no other Slurm variable, no stdin, its stdout and
    /// stderr into `DIR/NAME.{output}`.
    fn spawn(&mut self, name: &'static str, output: &str, mut cmd: Command) {
        let path = self.dir.path().join(format!("{name}.{output}"));
        let log = std::fs::File::create(&path)
            .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        scrub_env(&mut cmd, &self.conf);
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("a second handle on the log"))
            .stderr(log);
        match cmd.spawn() {
            Ok(child) => self.children.push((name, child)),
            Err(e) => self.fail(&format!("cannot start {name} ({cmd:?}): {e}")),
        }
    }

    /// Polls `ready` until it is `Ok`; fails with the logs and what
    /// `ready` last said when `deadline` passes or a daemon exits first.
    fn wait_until(
        &mut self,
        deadline: Instant,
        what: &str,
        mut ready: impl FnMut(&Slurm) -> Result<(), String>,
    ) {
        loop {
            let last = match ready(self) {
                Ok(()) => return,
                Err(last) => last,
            };
            if let Some(exited) = self.exited() {
                self.fail(&format!("{exited} while waiting for {what} (last: {last})"));
            }
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "{}s after the start, still waiting for {what} (last: {last})",
                    START_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Which daemon has exited, and how, if any has.
    fn exited(&mut self) -> Option<String> {
        self.children
            .iter_mut()
            .find_map(|(name, child)| match child.try_wait() {
                Ok(Some(status)) => Some(format!("{name} exited ({status})")),
                _ => None,
            })
    }

    /// Panics with `why`, the configuration's path and the log tails
    /// (the daemons are stopped by the unwinding drop).
    fn fail(&mut self, why: &str) -> ! {
        panic!(
            "private Slurm in {} failed to start: {why}\n{}",
            self.dir.path().display(),
            self.log_tails()
        );
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // SIGKILL: the cluster's state goes with its directory, so no
        // daemon needs to save it. slurmd first, munged last; slurmctld's
        // helper, slurmscriptd, exits when slurmctld does.
        for (_, child) in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The host name up to its first dot, as `hostname -s` prints it:
/// slurmctld refuses to run unless `SlurmctldHost` names it.
fn short_hostname() -> String {
    let full = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("read /proc/sys/kernel/hostname");
    let short = full.trim().split('.').next().unwrap_or_default();
    assert!(!short.is_empty(), "this machine has an empty host name");
    short.to_string()
}

/// Writes 1024 random bytes to `path`, readable by its owner alone
/// (mode 0400), as munged wants its key.
fn write_munge_key(path: &Path) {
    let mut key = [0u8; 1024];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .expect("1024 random bytes from /dev/urandom");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &key))
        .unwrap_or_else(|e| panic!("write the munge key {}: {e}", path.display()));
}

/// The `slurm.conf` of a cluster in `dir` whose daemons run as `uid` on
/// host `host`, the controller on port `ctld_port`: munge through
/// `dir/munge.sock`, no cgroups, no accounting, one partition `all` with
/// every node, the first node on a free `SlurmdPort`, each other node on
/// a free port nothing listens on.
fn slurm_conf(dir: &Path, nodes: &[&str], uid: u32, host: &str, ctld_port: u16) -> String {
    let d = dir.display();
    let mut conf = format!(
        "# A private test cluster; every path is in {d}.\n\
         ClusterName=loopwarden\n\
         SlurmctldHost={host}(127.0.0.1)\n\
         SlurmctldPort={ctld}\n\
         SlurmdPort={slurmd}\n\
         SlurmUser={uid}\n\
         SlurmdUser={uid}\n\
         AuthType=auth/munge\n\
         AuthInfo=socket={d}/munge.sock\n\
         CredType=cred/munge\n\
         StateSaveLocation={d}/state\n\
         SlurmdSpoolDir={d}/spool\n\
         SlurmctldPidFile={d}/slurmctld.pid\n\
         SlurmdPidFile={d}/slurmd.pid\n\
         SlurmctldLogFile={d}/slurmctld.log\n\
         SlurmdLogFile={d}/slurmd.log\n\
         MailProg=/bin/true\n\
         MpiDefault=none\n\
         ProctrackType=proctrack/linuxproc\n\
         TaskPlugin=task/none\n\
         JobAcctGatherType=jobacct_gather/none\n\
         AccountingStorageType=accounting_storage/none\n\
         SelectType=select/cons_tres\n\
         SelectTypeParameters=CR_CPU\n\
         ReturnToService=2\n",
        ctld = ctld_port,
        slurmd = free_port(),
    );
    for (i, node) in nodes.iter().enumerate() {
        let port = if i == 0 {
            String::new()
        } else {
            format!(" Port={}", free_port())
        };
        conf.push_str(&format!(
            "NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN{port}\n"
        ));
    }
    conf.push_str("PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n");
    conf
}

/// Removes every `SLURM_*` variable the test inherited (a test run inside
/// a Slurm job has many) and points `cmd` at `conf`.
fn scrub_env(cmd: &mut Command, conf: &Path) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("SLURM_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("SLURM_CONF", conf);
}

/// A client program (`sinfo`, `scontrol`) pointed at `conf`.
fn client(program: &Path, conf: &Path) -> Command {
    let mut cmd = Command::new(program);
    scrub_env(&mut cmd, conf);
    cmd.stdin(Stdio::null());
    cmd
}
