//! `lwbus release`: an operator's signed `quarantine_release`, and the
//! host's ack in words and in the exit status.
//!
//! A host takes from each operator only a seq above the last it took
//! from them, and its ack names the command by sender and seq alone. So
//! every run of this operator gets a seq no earlier run got: the last one
//! is kept in the operator's own state directory, named by the key's
//! signer and key id, under an exclusive lock held from taking a number
//! until the host has answered, so two releases at once go one after the
//! other and each reads its own ack. Nothing is written beside the sign
//! key: its directory may be root's, or read-only, or the key a group's.
//! A key used by two users (or on two machines) keeps two counts, which
//! may give two runs one number: an `ok` is taken only once the host's
//! health also shows the GPU out of quarantine.
//!
//! Glossary:
//! - *state directory*: `$XDG_STATE_HOME/loopwarden`, else
//!   `$HOME/.local/state/loopwarden`, made mode 0700 when missing.
//! - *seq file*: `release-<role>-<name>-k<key id>.seq` in the state
//!   directory, the last seq this user's runs of `lwbus release` with
//!   that key sent, as ten digits.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use loopwarden_bus::keys::SignKey;
use loopwarden_bus::{now_ms, Brokers, Bus, BusConfig};
use loopwarden_protocol::{Ack, AckCode, Family, HealthState, Ident, Message, Role, Topic};

/// How long the host has to answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// How long a run waits for another run of this operator to finish
/// (it holds the seq file until its host answered, at most
/// [`ANSWER_WAIT`]).
const LOCK_WAIT: Duration = Duration::from_secs(25);

/// 2020-01-01T00:00:00Z, s since the Unix epoch: seqs count from it.
const SEQ_EPOCH_S: u64 = 1_577_836_800;

/// The state directory from the values of `XDG_STATE_HOME` and `HOME`
/// (each taken only when set to an absolute path, as the XDG base
/// directory rules say): `$XDG_STATE_HOME/loopwarden`, else
/// `$HOME/.local/state/loopwarden`.
pub fn state_dir(xdg_state_home: Option<OsString>, home: Option<OsString>) -> Result<PathBuf> {
    let absolute = |v: Option<OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(state) = absolute(xdg_state_home) {
        return Ok(state.join("loopwarden"));
    }
    if let Some(home) = absolute(home) {
        return Ok(home.join(".local/state/loopwarden"));
    }
    bail!(
        "neither XDG_STATE_HOME nor HOME is set to an absolute path: lwbus release keeps this \
         operator's release numbers under $XDG_STATE_HOME/loopwarden (else \
         $HOME/.local/state/loopwarden); set one; nothing was sent"
    )
}

/// The seq file of `key` in the state directory `dir`: named by its
/// signer and key id, not by the key file's path, so every path to one
/// key (a link, another mount) finds the same count.
pub fn seq_path(dir: &Path, key: &SignKey) -> PathBuf {
    dir.join(format!(
        "release-{}-{}-k{}.seq",
        key.node.role.as_str(),
        key.node.id.as_str(),
        key.key_id
    ))
}

/// Makes the state directory `dir` (mode 0700, its missing parents too)
/// unless it is there.
pub fn make_state_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| {
            format!(
                "{}: cannot make this operator's state directory, where lwbus release keeps \
                 its release numbers; nothing was sent",
                dir.display()
            )
        })
}

/// The seq file, locked for this run while it is held.
pub struct SeqFile {
    file: File,
    path: PathBuf,
}

impl SeqFile {
    /// Opens (creates, mode 0600) and locks `path`, waiting up to `wait`
    /// for a run that holds it. A symbolic link there is refused.
    pub async fn lock(path: &Path, wait: Duration) -> Result<SeqFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .with_context(|| {
                format!(
                    "{}: this operator's release numbers are kept here, in the state \
                     directory of who runs lwbus release (a link there is refused); \
                     nothing was sent",
                    path.display()
                )
            })?;
        let deadline = Instant::now() + wait;
        loop {
            // SAFETY: flock on a descriptor this `File` owns; no memory
            // is passed.
            let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if r == 0 {
                return Ok(SeqFile {
                    file,
                    path: path.to_path_buf(),
                });
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(e).with_context(|| format!("{}: cannot lock it", path.display()));
            }
            if Instant::now() >= deadline {
                bail!(
                    "{}: another lwbus release by this operator has held it for {} s \
                     (stopped, not ended?); nothing was sent",
                    path.display(),
                    wait.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Takes the seq for this run at `now_s` (s since the Unix epoch):
    /// the seconds since 2020, or one above the last run's when that is
    /// not below; kept in the file (and on disk) before it is returned.
    pub fn take(&mut self, now_s: u64) -> Result<u32> {
        let mut text = String::new();
        self.file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.read_to_string(&mut text))
            .with_context(|| format!("{}: cannot read it", self.path.display()))?;
        let last = match text.trim() {
            // New (or a run stopped before its first number was written).
            "" => None,
            t => Some(t.parse::<u32>().map_err(|_| {
                anyhow::anyhow!(
                    "{}: holds {t:?}, not the last release number; nothing was sent \
                     (remove the file: numbers then start from the clock)",
                    self.path.display()
                )
            })?),
        };
        let clock = u32::try_from(now_s.saturating_sub(SEQ_EPOCH_S)).unwrap_or(u32::MAX);
        let seq = match last {
            Some(u32::MAX) => bail!(
                "{}: the release numbers of this operator are spent; nothing was sent",
                self.path.display()
            ),
            Some(last) => clock.max(last + 1),
            None => clock,
        };
        // Ten digits always: each write covers the last one whole.
        self.file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.write_all(format!("{seq:010}\n").as_bytes()))
            .and_then(|_| self.file.set_len(11))
            .and_then(|_| self.file.sync_data())
            .with_context(|| {
                format!(
                    "{}: cannot keep the release number; nothing was sent",
                    self.path.display()
                )
            })?;
        Ok(seq)
    }
}

/// What a run prints when the host took the release.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    /// The line for standard output.
    pub line: String,
    /// What the host added (a release it could not log), for standard
    /// error.
    pub warning: Option<String>,
}

/// The outcome of a release of GPU `gpu` of `host` that `answer` answered
/// (`None`: no answer in time): `Ok` only for the host's `ok`.
pub fn outcome(gpu: u8, host: &str, answer: Option<&Ack>, seen_out: bool) -> Result<Released> {
    match answer {
        // The ack names the command by sender and seq alone: another
        // run's release that took the same number (a key shared by users
        // who keep counts of their own) is answered in the same words, so
        // the host's health must show this GPU out of quarantine too.
        Some(a) if a.code == AckCode::Ok && !seen_out => bail!(
            "{host} answered seq {} ok, but its health has not shown GPU {gpu} out of \
             quarantine within {} s: another run's release under the same number may be \
             what was answered; check `node-agent ctl why {gpu}` on {host} and run it again",
            a.correlation.seq,
            ANSWER_WAIT.as_secs()
        ),
        Some(a) if a.code == AckCode::Ok => Ok(Released {
            line: format!("GPU {gpu} of {host} released"),
            warning: (!a.detail.is_empty())
                .then(|| format!("lwbus: warning: {host} says: {}", a.detail.as_str())),
        }),
        Some(a) => bail!(
            "{} ({}): {}",
            a.code,
            serde_json::to_value(a.code)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            a.detail.as_str()
        ),
        None => bail!(
            "no answer from {host} in {} s (is its agent running, on this site?)",
            ANSWER_WAIT.as_secs()
        ),
    }
}

/// What `lwbus release` was asked to do.
pub struct Options<'a> {
    pub broker: Brokers,
    pub tls: Option<loopwarden_bus::tls::Tls>,
    pub site: &'a str,
    pub host: &'a str,
    pub gpu: u8,
    pub note: &'a str,
    pub sign_key: &'a Path,
}

/// The brokers as they are reached: one given without a port is on 8883
/// with TLS, 1883 without ([`Brokers::with_tls`]), and said so.
pub fn reached(o: &Options<'_>) -> Brokers {
    o.broker.clone().with_tls(o.tls.is_some())
}

/// Sends a signed `quarantine_release` and waits for the host's ack.
pub async fn run(o: Options<'_>) -> Result<()> {
    use loopwarden_protocol::{CommandAuth, Frame, GpuIndex, QuarantineRelease, Text};
    let site = Ident::new(o.site).map_err(|e| anyhow::anyhow!("--site: {e}"))?;
    let host = Ident::new(o.host).map_err(|e| anyhow::anyhow!("--host: {e}"))?;
    let key = loopwarden_bus::keys::read_sign_key(o.sign_key).map_err(|e| anyhow::anyhow!(e))?;
    let me = key.node.clone();
    if me.role != Role::Operator {
        bail!(
            "--sign-key: {} is the key of {}/{}, not an operator's",
            o.sign_key.display(),
            me.role.as_str(),
            me.id.as_str()
        );
    }
    // A certificate of another identity: the broker would take this run
    // for that user. With a host's or a reader's the ACL drops the release
    // unsaid; with another operator's, the broker's log names the wrong
    // person.
    if let Some(tls) = &o.tls {
        (tls.check_identity("operator", me.id.as_str()))
            .map_err(|e| anyhow::anyhow!("--tls-cert: {e}"))?;
    }
    let gpu = GpuIndex::new(o.gpu).context("--gpu: 0 to 15")?;
    let note = o.note.trim();
    if note.is_empty() {
        bail!("--note: say why the GPU is fit again; it is logged and published");
    }
    let note = Text::new(note).context("--note: at most 96 bytes")?;
    let states = state_dir(std::env::var_os("XDG_STATE_HOME"), std::env::var_os("HOME"))?;
    make_state_dir(&states)?;
    let seq_file = seq_path(&states, &key);
    let ack_topic = Topic::new(&site, Role::Host, &host, Family::Ack);
    let broker = reached(&o);
    let mut config = BusConfig::new(broker.clone(), site.clone(), me.clone());
    config.client_id = crate::client_id(&format!("release-{}", me.id));
    config.tls = o.tls;
    config.subscriptions.push(ack_topic.to_string());
    let telemetry = Topic::new(&site, Role::Host, &host, Family::Telemetry);
    config.subscriptions.push(telemetry.to_string());
    let health = Topic::new(&site, Role::Host, &host, Family::Health);
    config.subscriptions.push(health.to_string());
    let (bus, mut inbound, task) = Bus::start(config);
    let stop = |bus: Bus, task: loopwarden_bus::BusTask| async move {
        let _ = bus.shutdown(Duration::from_secs(2)).await;
        task.join(Duration::from_secs(2)).await;
    };
    if !bus.wait_connected(Duration::from_secs(10)).await {
        bail!("cannot reach the broker at {broker}");
    }
    // Signed with a clock far from the host's, the release is refused as
    // expired, and one stamped ahead moves the host's floor for this
    // operator past what a right clock gives: checked against the host's
    // telemetry first (a host heard from in 3 s; else the ack says).
    let heard = host_time(&mut inbound, &host).await;
    if let Some(host_time) = heard {
        if let Some(why) = clocks_apart(now_ms(), host_time, host.as_str()) {
            stop(bus, task).await;
            bail!("{why}");
        }
    }
    // Held until the host answered: the next run's number goes after
    // this one's.
    let mut seqs = match SeqFile::lock(&seq_file, LOCK_WAIT).await {
        Ok(s) => s,
        Err(e) => {
            stop(bus, task).await;
            return Err(e);
        }
    };
    let seq = match seqs.take(now_ms().0 / 1000) {
        Ok(s) => s,
        Err(e) => {
            stop(bus, task).await;
            return Err(e);
        }
    };
    let mut frame = Frame {
        sender: me.clone(),
        seq,
        time: now_ms(),
        message: Message::QuarantineRelease(QuarantineRelease {
            gpu,
            operator: me.id.clone(),
            note,
            auth: CommandAuth::default(),
        }),
    };
    let cmd = Topic::new(&site, Role::Host, &host, Family::Cmd);
    frame.sign(&cmd, key.key_id, &key.key)?;
    bus.publish_frame(&cmd, &frame)?;
    let (answer, seen_out) = answer(&mut inbound, &frame, &host, gpu).await;
    drop(seqs);
    stop(bus, task).await;
    let released = outcome(gpu.get(), host.as_str(), answer.as_ref(), seen_out)?;
    if let Some(w) = released.warning {
        eprintln!("{w}");
    }
    println!("{}", released.line);
    Ok(())
}

/// The stamp of the first telemetry frame `host` sends within 3 s, if
/// any: its clock, as this run hears it.
async fn host_time(
    inbound: &mut tokio::sync::mpsc::Receiver<loopwarden_bus::Inbound>,
    host: &Ident,
) -> Option<loopwarden_protocol::TimestampMs> {
    let heard = tokio::time::timeout(Duration::from_secs(3), async {
        while let Some(m) = inbound.recv().await {
            if matches!(m.frame.message, Message::HostTelemetry(_)) && m.frame.sender.id == *host {
                return Some(m.frame.time);
            }
        }
        None
    })
    .await;
    heard.ok().flatten()
}

/// The host's ack to `frame` within [`ANSWER_WAIT`], and whether its
/// latest health shows `gpu` out of quarantine (its retained health comes
/// first, then each change).
async fn answer(
    inbound: &mut tokio::sync::mpsc::Receiver<loopwarden_bus::Inbound>,
    frame: &loopwarden_protocol::Frame,
    host: &Ident,
    gpu: loopwarden_protocol::GpuIndex,
) -> (Option<Ack>, bool) {
    let mut answer: Option<Ack> = None;
    let mut seen_out = false;
    let _ = tokio::time::timeout(ANSWER_WAIT, async {
        while let Some(m) = inbound.recv().await {
            match m.frame.message {
                Message::Ack(a)
                    if a.correlation.seq == frame.seq && a.correlation.from == frame.sender =>
                {
                    let refused = a.code != AckCode::Ok;
                    answer = Some(a);
                    if refused {
                        return;
                    }
                }
                Message::HostHealth(h) if m.frame.sender.id == *host => {
                    seen_out = h
                        .gpus
                        .iter()
                        .any(|g| g.gpu == gpu && g.state != HealthState::Quarantined);
                }
                _ => {}
            }
            if answer.is_some() && seen_out {
                return;
            }
        }
    })
    .await;
    (answer, seen_out)
}

/// How far this machine's clock may be from a host's before a command is
/// not signed with it, ms.
const CLOCK_APART_MS: u64 = 60_000;

/// Why this machine's clock (`now`) is too far from `host`'s (`host_time`,
/// the stamp of a frame it just sent) to sign a command with, if it is.
fn clocks_apart(
    now: loopwarden_protocol::TimestampMs,
    host_time: loopwarden_protocol::TimestampMs,
    host: &str,
) -> Option<String> {
    let (apart, ahead) = match now.0.checked_sub(host_time.0) {
        Some(d) => (d, true),
        None => (host_time.0 - now.0, false),
    };
    (apart > CLOCK_APART_MS).then(|| {
        let (side, then) = if ahead {
            (
                "ahead of",
                "and the host would refuse this operator's next commands as replays until its clock passes this one",
            )
        } else {
            ("behind", "so the host would refuse it as expired")
        };
        format!(
            "this machine's clock is {} s {side} {host}'s: a release signed with it is refused, {then}; \
             set the clock (timedatectl; NTP) and try again",
            apart / 1000
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::{Correlation, NodeId, Text};

    /// Operator ops1's sign key with ops2's certificate: refused before
    /// connecting, naming both.
    #[test]
    fn a_certificate_of_another_operator_is_refused() {
        use loopwarden_bus::tls::{Tls, TlsFiles};
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        loopwarden_bus::pki::init(&loopwarden_bus::pki::InitArgs {
            site: "lab".into(),
            hosts: vec!["h01".into()],
            cdus: vec!["cdu1".into()],
            operators: vec!["ops1".into(), "ops2".into()],
            readers: Vec::new(),
            out: pki.clone(),
            broker_port: 8883,
        })
        .unwrap();
        let tls = |who: &str| Tls::load(TlsFiles::of_identity(&pki, who)).unwrap();
        let sign_key = pki.join("ops1.sign.key");
        let options = |who: &str| Options {
            broker: "b.hall".parse().unwrap(),
            tls: Some(tls(who)),
            site: "lab",
            host: "h01",
            gpu: 0,
            note: "fan replaced",
            sign_key: &sign_key,
        };
        let e = rt().block_on(run(options("ops2"))).unwrap_err().to_string();
        assert!(
            e.starts_with("--tls-cert: TLS certificate ")
                && e.contains("ops2.crt is made out to CN \"ops2\"")
                && e.contains("this node is operator \"ops1\""),
            "{e}"
        );
        assert!(tls("ops1").check_identity("operator", "ops1").is_ok());
    }

    /// A broker given without a port is reached, and named, on 8883 with
    /// TLS; a port given is kept.
    #[test]
    fn the_broker_is_named_on_the_port_it_is_reached_on() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        loopwarden_bus::pki::init(&loopwarden_bus::pki::InitArgs {
            site: "lab".into(),
            hosts: vec!["h01".into()],
            cdus: vec!["cdu1".into()],
            operators: vec!["ops1".into()],
            readers: Vec::new(),
            out: pki.clone(),
            broker_port: 8883,
        })
        .unwrap();
        let files = loopwarden_bus::tls::TlsFiles::of_identity(&pki, "ops1");
        let tls = loopwarden_bus::tls::Tls::load(files).unwrap();
        let at = |broker: &str, tls: Option<&loopwarden_bus::tls::Tls>| {
            reached(&Options {
                broker: broker.parse().unwrap(),
                tls: tls.cloned(),
                site: "lab",
                host: "h01",
                gpu: 0,
                note: "fan replaced",
                sign_key: Path::new("ops1.sign.key"),
            })
            .to_string()
        };
        assert_eq!(at("b.hall", Some(&tls)), "b.hall:8883");
        assert_eq!(at("b.hall", None), "b.hall:1883");
        assert_eq!(at("b.hall:1884", Some(&tls)), "b.hall:1884");
    }

    #[test]
    fn a_clock_far_from_the_hosts_is_said_before_anything_is_signed() {
        use loopwarden_protocol::TimestampMs as T;
        assert_eq!(clocks_apart(T(1_000_000), T(950_000), "h01"), None);
        let ahead = clocks_apart(T(8_200_000), T(1_000_000), "h01").unwrap();
        assert!(
            ahead.starts_with("this machine's clock is 7200 s ahead of h01's"),
            "{ahead}"
        );
        assert!(ahead.contains("as replays"), "{ahead}");
        let behind = clocks_apart(T(1_000_000), T(1_200_000), "h01").unwrap();
        assert!(
            behind.contains("200 s behind h01's") && behind.contains("expired"),
            "{behind}"
        );
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// 2026-12-01T00:00:00Z.
    const NOW_S: u64 = 1_796_083_200;

    /// The sign key of operator ops1, key id 1.
    fn ops1() -> SignKey {
        SignKey {
            node: NodeId::new(Role::Operator, "ops1").unwrap(),
            key_id: 1,
            key: loopwarden_protocol::auth::SigningKey::from_bytes(&[5; 32]),
        }
    }

    #[test]
    fn the_state_directory_is_xdg_state_home_else_home_and_else_nothing_is_sent() {
        let os = |s: &str| Some(OsString::from(s));
        assert_eq!(
            state_dir(os("/var/op/state"), os("/home/op")).unwrap(),
            Path::new("/var/op/state/loopwarden")
        );
        // Empty or relative is not a place (the XDG rules): HOME then.
        for xdg in [None, os(""), os("state")] {
            assert_eq!(
                state_dir(xdg, os("/home/op")).unwrap(),
                Path::new("/home/op/.local/state/loopwarden")
            );
        }
        for home in [None, os(""), os("op")] {
            let e = format!("{:#}", state_dir(None, home).unwrap_err());
            assert!(
                e.contains("XDG_STATE_HOME")
                    && e.contains("HOME")
                    && e.contains("nothing was sent"),
                "{e}"
            );
        }
    }

    #[test]
    fn the_state_directory_is_made_0700_and_one_there_is_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let states = state_dir(None, Some(dir.path().into())).unwrap();
        make_state_dir(&states).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&states), 0o700);
        assert_eq!(mode(&dir.path().join(".local/state")), 0o700);
        std::fs::set_permissions(&states, std::fs::Permissions::from_mode(0o750)).unwrap();
        make_state_dir(&states).unwrap();
        assert_eq!(mode(&states), 0o750, "left as its owner has it");
    }

    #[test]
    fn a_key_in_a_directory_the_operator_cannot_write_still_releases() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // A key of a service's group (0640) in a directory of root's
        // (0550), read through a link from elsewhere.
        let keys = dir.path().join("keys");
        std::fs::create_dir(&keys).unwrap();
        let key_file = keys.join("ops1.sign.key");
        std::fs::write(&key_file, ops1().to_toml()).unwrap();
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o550)).unwrap();
        let link = dir.path().join("my.sign.key");
        std::os::unix::fs::symlink(&key_file, &link).unwrap();
        let states = state_dir(Some(dir.path().join("state").into()), None).unwrap();
        make_state_dir(&states).unwrap();
        let clock = (NOW_S - SEQ_EPOCH_S) as u32;
        let mut seqs = Vec::new();
        for path in [&key_file, &link] {
            let key = loopwarden_bus::keys::read_sign_key(path).unwrap();
            let seq_file = seq_path(&states, &key);
            let mut f = rt().block_on(SeqFile::lock(&seq_file, LOCK_WAIT)).unwrap();
            seqs.push(f.take(NOW_S).unwrap());
        }
        // One count for the key, by whichever path it was read.
        assert_eq!(seqs, [clock, clock + 1]);
        let kept = states.join("release-operator-ops1-k1.seq");
        assert_eq!(
            std::fs::read_to_string(&kept).unwrap(),
            format!("{:010}\n", clock + 1)
        );
        let mode = std::fs::metadata(&kept).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Nothing written beside the key, nor beside its link.
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o700)).unwrap();
        let names = |d: &Path| {
            let mut n: Vec<String> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        assert_eq!(names(&keys), ["ops1.sign.key"]);
        assert_eq!(names(dir.path()), ["keys", "my.sign.key", "state"]);
    }

    #[test]
    fn runs_in_one_second_get_rising_numbers_kept_across_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = seq_path(dir.path(), &ops1());
        assert_eq!(path, dir.path().join("release-operator-ops1-k1.seq"));
        let clock = (NOW_S - SEQ_EPOCH_S) as u32;
        let mut seqs = Vec::new();
        for _ in 0..3 {
            // A run of its own each: the file opened, locked, dropped.
            let mut f = rt().block_on(SeqFile::lock(&path, LOCK_WAIT)).unwrap();
            seqs.push(f.take(NOW_S).unwrap());
        }
        assert_eq!(seqs, [clock, clock + 1, clock + 2]);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{:010}\n", clock + 2)
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Later, the clock again.
        let mut f = rt().block_on(SeqFile::lock(&path, LOCK_WAIT)).unwrap();
        assert_eq!(f.take(NOW_S + 60).unwrap(), clock + 60);
    }

    #[test]
    fn a_second_run_waits_for_the_first_and_says_so_when_it_does_not_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = seq_path(dir.path(), &ops1());
        let first = rt().block_on(SeqFile::lock(&path, LOCK_WAIT)).unwrap();
        let e = match rt().block_on(SeqFile::lock(&path, Duration::from_millis(200))) {
            Ok(_) => panic!("locked twice"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            e.contains("another lwbus release by this operator has held it")
                && e.contains("nothing was sent"),
            "{e}"
        );
        drop(first);
        assert!(rt()
            .block_on(SeqFile::lock(&path, Duration::from_millis(200)))
            .is_ok());
    }

    #[test]
    fn a_seq_file_that_is_a_link_or_holds_no_number_sends_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "keep").unwrap();
        let path = seq_path(dir.path(), &ops1());
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(rt().block_on(SeqFile::lock(&path, LOCK_WAIT)).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "seven\n").unwrap();
        let mut f = rt().block_on(SeqFile::lock(&path, LOCK_WAIT)).unwrap();
        let e = format!("{:#}", f.take(NOW_S).unwrap_err());
        assert!(
            e.contains("\"seven\"") && e.contains("nothing was sent"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "seven\n");
        std::fs::write(&path, format!("{}\n", u32::MAX)).unwrap();
        assert!(f.take(NOW_S).is_err());
        // A number above the clock (runs faster than one a second) goes on.
        std::fs::write(&path, "0999999999\n").unwrap();
        assert_eq!(f.take(NOW_S).unwrap(), 1_000_000_000);
    }

    fn ack(code: AckCode, detail: &str) -> Ack {
        Ack {
            correlation: Correlation {
                from: NodeId::new(Role::Operator, "ops1").unwrap(),
                seq: 7,
            },
            code,
            in_force: Default::default(),
            detail: Text::new(detail).unwrap(),
        }
    }

    #[test]
    fn only_ok_is_success_and_the_hosts_warning_is_said() {
        let ok = outcome(3, "h01", Some(&ack(AckCode::Ok, "")), true).unwrap();
        assert_eq!(
            ok,
            Released {
                line: "GPU 3 of h01 released".into(),
                warning: None
            }
        );
        let unlogged = "released, but not logged to flash (full): the quarantine may come back";
        let ok = outcome(3, "h01", Some(&ack(AckCode::Ok, unlogged)), true).unwrap();
        assert_eq!(ok.line, "GPU 3 of h01 released");
        assert_eq!(
            ok.warning.as_deref(),
            Some(format!("lwbus: warning: h01 says: {unlogged}").as_str())
        );
        let e = outcome(
            3,
            "h01",
            Some(&ack(AckCode::Replayed, "seq 7 is not above 8")),
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("(replayed)") && e.ends_with(": seq 7 is not above 8"),
            "{e}"
        );
        let e = outcome(3, "h01", None, false).unwrap_err().to_string();
        assert!(e.starts_with("no answer from h01 in 10 s"), "{e}");
        // An ok the host's health does not bear out: not a success.
        let e = outcome(3, "h01", Some(&ack(AckCode::Ok, "")), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("has not shown GPU 3 out of quarantine"), "{e}");
    }
}
