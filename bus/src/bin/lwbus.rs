//! `lwbus`: a field engineer's and integrator's window on the Loopwarden bus.
//!
//! - `lwbus broker`: run the embedded MQTT broker in the foreground.
//! - `lwbus watch`: decode and print every frame of a site, one line each
//!   (or as JSON with `--json`); with no `--broker`, start the embedded
//!   broker and watch it; with a reader's `--sign-key`, ask the senders to
//!   resend what it missed ([`watch`], [`repair`]).
//! - `lwbus samples`: publish one frame of every message kind and its JSON
//!   mirror, to check a facility subscriber or a dashboard end to end.
//! - `lwbus flash FILE`: read an agent's flash file (stopped agent, or a
//!   copy): its event log, the frames its outbox still holds, and the
//!   sequence floor.
//! - `lwbus release`: put a quarantined GPU back in service, as an
//!   operator: a `quarantine_release` signed with the operator's sign key,
//!   and the host's ack.
//! - `lwbus pki init`: a lab's or small site's certificates, keys, keyring
//!   and broker configuration (`docs/security.md`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_bus::embedded::{
    configured_or_embedded, EmbeddedBroker, EmbeddedBrokerError, DEFAULT_LISTEN,
};
use loopwarden_bus::{now_ms, Brokers, Bus, BusConfig};
use loopwarden_flash::StoreError;
use loopwarden_protocol::{
    samples, Family, GpuSelector, Ident, Message, MessageKind, NodeId, Role, Topic,
};

// Beside this file, not in `src/bin/` itself, where cargo would take
// each for a program of its own.
#[path = "lwbus/release.rs"]
mod release;
#[path = "lwbus/repair.rs"]
mod repair;
#[path = "lwbus/watch.rs"]
mod watch;

#[derive(Parser)]
#[command(
    name = "lwbus",
    version,
    about = "Watch and exercise the Loopwarden bus"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the embedded MQTT broker in the foreground.
    Broker {
        /// Address to listen on: loopback only (the embedded broker has
        /// no authentication and no TLS).
        #[arg(long, default_value = DEFAULT_LISTEN, value_parser = loopback_listen)]
        listen: SocketAddr,
    },
    /// Print every frame of a site as it passes.
    Watch {
        /// Broker address (`host[:port]`), or the nodes of a cluster
        /// (`host:port,host:port,…`); without it, the embedded broker is
        /// started on 127.0.0.1:1883 and watched.
        #[arg(long)]
        broker: Option<Brokers>,
        /// The site to watch.
        #[arg(long, default_value = "lab")]
        site: String,
        /// Print each frame as one line of JSON instead of a summary.
        #[arg(long)]
        json: bool,
        /// TLS to the broker (a reader's or an operator's certificate).
        #[command(flatten)]
        tls: loopwarden_bus::tls::TlsArgs,
        /// A reader's or an operator's sign key file (`ID.sign.key`): ask
        /// the hosts and CDUs to resend the frames this watch missed,
        /// under the name it holds (their keyrings must let it resend).
        #[arg(long)]
        sign_key: Option<std::path::PathBuf>,
    },
    /// Read an agent's flash file: event log, outbox, sequence floor.
    Flash {
        /// The flash file (of a stopped agent, or a copy).
        file: std::path::PathBuf,
        /// Print each log record's message as JSON after its number and time.
        #[arg(long)]
        json: bool,
    },
    /// Release a quarantined GPU (a signed operator command) and print
    /// the host's answer.
    Release {
        /// Broker address (`host[:port]`), or the nodes of a cluster
        /// (`host:port,host:port,…`); without a port, 8883 with TLS
        /// (`--tls-ca`) and 1883 without.
        #[arg(long, default_value = "127.0.0.1")]
        broker: Brokers,
        /// The site.
        #[arg(long)]
        site: String,
        /// The host the GPU is in.
        #[arg(long)]
        host: String,
        /// The GPU's index.
        #[arg(long)]
        gpu: u8,
        /// Why it is fit again (logged and published; required).
        #[arg(long)]
        note: String,
        /// The operator's sign key file (`ID.sign.key`); the release is
        /// sent under the name it holds.
        #[arg(long)]
        sign_key: std::path::PathBuf,
        /// TLS to the broker.
        #[command(flatten)]
        tls: loopwarden_bus::tls::TlsArgs,
    },
    /// Certificates and keys for a lab or a small site.
    Pki {
        #[command(subcommand)]
        command: loopwarden_bus::pki::PkiCommand,
    },
    /// Publish one frame of every message kind, and its JSON mirror.
    Samples {
        /// Broker address (`host[:port]`), or the nodes of a cluster
        /// (`host:port,host:port,…`).
        #[arg(long, default_value = "127.0.0.1:1883")]
        broker: Brokers,
        /// The site to publish in.
        #[arg(long, default_value = "lab")]
        site: String,
    },
}

/// `ms` since the Unix epoch as an ISO 8601 UTC time with milliseconds.
fn utc(ms: u64) -> String {
    let u = loopwarden_protocol::TimestampMs(ms).utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        u.year, u.month, u.day, u.hour, u.minute, u.second, u.milli
    )
}

fn summary(message: &Message) -> String {
    match message {
        Message::HostTelemetry(t) => {
            let hottest = t.gpus.iter().map(|g| g.temp.0).max().unwrap_or(0);
            let power: u64 = t.gpus.iter().map(|g| u64::from(g.power.0)).sum();
            format!("{} GPUs, {power} W, hottest {hottest} °C", t.gpus.len())
        }
        Message::HostHealth(h) => h
            .gpus
            .iter()
            .filter(|g| g.reason.0 != 0)
            .map(|g| format!("{} {} ({})", g.gpu, g.state, g.reason))
            .collect::<Vec<_>>()
            .join(", "),
        Message::CduTelemetry(c) => format!(
            "supply {} setpoint {} flow {}",
            c.supply.map(|t| t.to_string()).unwrap_or("lost".into()),
            c.setpoint,
            c.flow.map(|f| f.to_string()).unwrap_or("lost".into())
        ),
        Message::CduState(s) => format!("mode {} ({})", s.mode, s.reason),
        Message::Online(o) => format!("online={} software {}", o.online, o.software),
        Message::Event(e) => e.to_string(),
        Message::CapLease(l) => {
            let caps: Vec<String> = l
                .caps
                .iter()
                .map(|c| match c.gpus {
                    GpuSelector::All => format!("all {}", c.limit),
                    GpuSelector::Gpu(g) => format!("{g} {}", c.limit),
                })
                .collect();
            format!(
                "lease {} from {} for {} ({}): {}",
                l.lease,
                l.source,
                l.duration,
                l.reason,
                caps.join(", ")
            )
        }
        Message::QuarantineRelease(r) => {
            format!("release GPU {} by {}: {}", r.gpu.get(), r.operator, r.note)
        }
        Message::ResendRequest(r) => format!("resend {}..={}", r.from, r.to),
        Message::ResendReport(r) => format!(
            "{} for {} seq {}: {} of {}..={}{}{}",
            r.code,
            r.correlation.from,
            r.correlation.seq,
            r.resent,
            r.from,
            r.to,
            r.held_from
                .map(|h| format!(", log from {h}"))
                .unwrap_or_default(),
            r.next.map(|n| format!(", next {n}")).unwrap_or_default()
        ),
        Message::Ack(a) => format!(
            "{} for {} seq {}{}",
            a.code,
            a.correlation.from,
            a.correlation.seq,
            if a.detail.is_empty() {
                String::new()
            } else {
                format!(": {}", a.detail)
            }
        ),
    }
}

/// Refuses TLS to a broker whose address carries a zone
/// (`[fe80::1%eth0]`): no certificate can name it, so the connection
/// would be retried for ever.
fn refuse_zoned_with_tls(broker: Option<&Brokers>, tls: bool) -> Result<()> {
    match broker.and_then(|b| b.unreachable_with_tls()) {
        Some(zoned) if tls => bail!(
            "--broker {zoned} has a zone (an interface), which no certificate can name, \
             so TLS cannot reach it: give the broker's name or a global address"
        ),
        _ => Ok(()),
    }
}

/// A client id for this run of `what`: the process id and random bits,
/// so two runs with one process id (PID 1 in two containers) do not
/// push each other off the broker, which drops the older of two clients
/// with one id.
fn client_id(what: &str) -> String {
    format!(
        "lwbus-{what}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

async fn publish_samples(broker: Brokers, site: Ident) -> Result<()> {
    let host = NodeId::new(Role::Host, "h07")?;
    let cdu = NodeId::new(Role::Cdu, "cdu-a")?;
    let mut sent = 0;
    for node in [host, cdu] {
        let mut config = BusConfig::new(broker.clone(), site.clone(), node.clone());
        config.client_id = client_id(&format!("samples-{}", node.id));
        let (bus, _inbound, task) = Bus::start(config);
        if !bus.wait_connected(Duration::from_secs(10)).await {
            bail!("cannot reach the broker at {broker}");
        }
        for kind in MessageKind::ALL {
            let frame = samples::frame(kind);
            if frame.sender.role != node.role && kind.family() != Family::Cmd {
                continue;
            }
            let mut frame = loopwarden_protocol::Frame {
                time: now_ms(),
                ..frame
            };
            if kind.family() == Family::Cmd {
                if node.role != Role::Host {
                    continue;
                }
                // Commands go to the host's cmd topic, from the sample
                // sender, signed again for it (the time and the target are
                // signed too).
                let topic = Topic::new(&site, Role::Host, &node.id, Family::Cmd);
                frame.sign(&topic, 1, &samples::demo_signing_key())?;
                bus.publish_frame(&topic, &frame)?;
            } else {
                let topic = Topic::new(&site, node.role, &node.id, kind.family());
                bus.publish_frame(&topic, &frame)?;
                bus.publish_json(&frame)?;
            }
            sent += 1;
        }
        bus.shutdown(Duration::from_secs(5))
            .await
            .context("disconnecting")?;
        task.join(Duration::from_secs(5)).await;
    }
    eprintln!("lwbus: published {sent} sample frames to site {site} on {broker}");
    Ok(())
}

/// One event-log record in words (or its JSON with `json`): a wrap
/// marker, an accepted command kept whole, a controller's sent lease, or
/// a message body.
fn describe_record(kind: u8, body: &[u8], json: bool) -> String {
    use loopwarden_flash::log::WRAPPED;
    use loopwarden_flash::Wrapped;

    if kind == WRAPPED {
        match Wrapped::decode(body) {
            Some(w) => format!(
                "wrapped: {} records lost (seq {}..={})",
                w.lost, w.first_seq, w.last_seq
            ),
            None => "wrapped marker (unreadable)".to_string(),
        }
    } else if kind == loopwarden_store::resend::PUBLISHED {
        match loopwarden_store::resend::Published::decode(body) {
            Some(p) => format!("{:<18} record {} as frame {}", "published", p.record, p.seq),
            None => "published marker (unreadable)".to_string(),
        }
    } else if kind == loopwarden_bus::console_record::CONSOLE_RECORD {
        let event = loopwarden_bus::console_record::to_event(body);
        if json {
            event.to_string()
        } else {
            let text = loopwarden_bus::console_record::sentence(&event["console"]);
            format!("{:<18} {text}", "serial_console")
        }
    } else if MessageKind::from_code(kind).is_some_and(|k| k.family() == Family::Cmd) {
        // An accepted command is kept whole: sender, seq and time
        // are what a restart needs.
        match loopwarden_protocol::Frame::decode(body) {
            Ok(f) if json => f.to_json(),
            Ok(f) => format!(
                "{:<18} from {}/{} seq {}: {}",
                f.message.kind().name(),
                f.sender.role.as_str(),
                f.sender.id.as_str(),
                f.seq,
                summary(&f.message)
            ),
            // A controller logs the leases it sent with the host's id
            // before the frame.
            Err(e) => match loopwarden_store::lease_record::LeaseRecord::decode(body) {
                Ok(r) if json => format!(
                    r#"{{"lease_record":{{"host":{},"lift":{},"frame":{}}}}}"#,
                    serde_json::json!(r.host),
                    r.lift,
                    r.frame.to_json()
                ),
                Ok(r) => format!(
                    "{:<18} {r}",
                    if r.lift { "lift_sent" } else { "lease_sent" }
                ),
                Err(_) => format!("kind {} command frame unreadable: {e}", kind),
            },
        }
    } else {
        match MessageKind::from_code(kind).map(|k| Message::decode_body(k, body)) {
            Some(Ok(m)) if json => serde_json::to_string(&m).unwrap_or_default(),
            Some(Ok(m)) => format!("{:<18} {}", m.kind().name(), summary(&m)),
            Some(Err(e)) => format!("kind {} body unreadable: {e}", kind),
            None => format!("unknown kind {} ({} bytes)", kind, body.len()),
        }
    }
}

/// A copy of a flash file in a directory of this run's own (mode 0700,
/// made new, so nothing another user put in the temporary directory is
/// read or written through); removed when dropped.
struct PrivateCopy {
    dir: std::path::PathBuf,
    file: std::path::PathBuf,
}

impl PrivateCopy {
    /// `bytes` copied into a new directory under `base`.
    fn new(base: &std::path::Path, bytes: &[u8]) -> Result<PrivateCopy> {
        use std::os::unix::fs::DirBuilderExt;
        let mut tries = 0;
        let dir = loop {
            let dir = base.join(format!(
                "lwbus-flash-{}-{:08x}",
                std::process::id(),
                rand::random::<u32>()
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 16 => tries += 1,
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("a directory for the copy: {}", dir.display()))
                }
            }
        };
        let copy = PrivateCopy {
            file: dir.join("copy.bin"),
            dir,
        };
        write_new(&copy.file, bytes).with_context(|| format!("{}", copy.file.display()))?;
        Ok(copy)
    }
}

impl Drop for PrivateCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Writes `bytes` to a file made new at `path` (mode 0600): a file or a
/// link already there is refused, not written through.
fn write_new(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_data()
}

/// The flash `lwbus flash` reads: a private copy of the file.
type DumpFlash = loopwarden_flash::SharedFlash<loopwarden_flash::FileFlash<4, 4096>>;
/// Why a store of it did not read.
type DumpError = StoreError<loopwarden_flash::FlashError>;

/// Adds a line to `text`.
fn say(text: &mut String, line: impl std::fmt::Display) {
    use std::fmt::Write as _;
    let _ = writeln!(text, "{line}");
}

/// Prints what an agent's flash holds, oldest first: each store on its
/// own, so one that does not read is said and the others still read; the
/// command then fails, naming those that did not.
async fn dump_flash(path: &std::path::Path, json: bool) -> Result<()> {
    use loopwarden_flash::{FileFlash, SharedFlash};

    let board = loopwarden_boards::FlashBoard::host_file();
    let bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
    if bytes.is_empty() {
        bail!("{}: empty file, nothing was ever written", path.display());
    }
    // Read a copy: opening a store may repair a half-written item, or
    // erase a damaged sector, and the original is evidence.
    let copy = PrivateCopy::new(&std::env::temp_dir(), &bytes)?;
    let opened = FileFlash::<4, 4096>::open(&copy.file, &board.geometry());
    drop(copy);
    let flash =
        opened.map_err(|e| anyhow::anyhow!("{e}").context(format!("{}", path.display())))?;
    let flash = SharedFlash::new(flash);
    let layout = board.layout();
    let mut text = String::new();
    let mut failed = Vec::new();
    if let Err(e) = dump_log(flash.clone(), layout.log, json, &mut text).await {
        say(&mut text, format_args!("event log unreadable: {e}"));
        failed.push("the event log".to_string());
    }
    if let Err(e) = dump_outbox(flash.clone(), layout.outbox, &mut text, &mut failed).await {
        say(&mut text, format_args!("outbox unreadable: {e}"));
        failed.push("the outbox".to_string());
    }
    if let Err(e) = dump_floor(flash, layout.config, &mut text).await {
        say(&mut text, format_args!("config store unreadable: {e}"));
        failed.push("the config store".to_string());
    }
    // A reader that stops early (`| head`) is not an error.
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.context("writing to standard output")?,
    }
    if !failed.is_empty() {
        bail!(
            "{}: {} did not read (said above; what else reads was printed)",
            path.display(),
            failed.join(", ")
        );
    }
    Ok(())
}

/// The event log's records, oldest first, and what it lost to damage.
async fn dump_log<S: MultiwriteNorFlash>(
    flash: S,
    range: std::ops::Range<u32>,
    json: bool,
    text: &mut String,
) -> Result<(), StoreError<S::Error>> {
    let mut log = loopwarden_flash::EventLog::open(flash, range).await?;
    say(
        text,
        format_args!("event log: next record {}", log.next_seq()),
    );
    if let Some(at) = log.salvaged() {
        say(text, format_args!("event log: the sector at {at:#x} is damaged (zeroed or garbage) and kept the log from opening: read without it (its records, the newest, are not shown; the file is left as it was)"));
    }
    let mut lines = Vec::new();
    let read = log
        .for_each(|r| {
            let what = describe_record(r.kind, r.body, json);
            lines.push(format!("{:>8} {} {what}", r.seq, utc(r.time.0)));
        })
        .await;
    // What was read before a failure is printed, then the failure.
    let n = lines.len();
    for l in lines {
        say(text, l);
    }
    let skipped = read.inspect_err(|_| {
        say(
            text,
            format_args!("event log: the read stopped after {n} records (above)"),
        )
    })?;
    if skipped > 0 {
        say(
            text,
            format_args!("({skipped} stored items were not log records and were skipped)"),
        );
    }
    if let Some(d) = log.damaged() {
        say(text, format_args!("event log: {d}"));
    }
    Ok(())
}

/// The frames the outbox holds, in order; a part that does not read is
/// said (and added to `failed`), the others read.
async fn dump_outbox(
    flash: DumpFlash,
    layout: loopwarden_flash::outbox::OutboxLayout,
    text: &mut String,
    failed: &mut Vec<String>,
) -> Result<(), DumpError> {
    let mut outbox = loopwarden_flash::Outbox::open(flash, layout).await?;
    for (class, at) in outbox.salvaged() {
        say(text, format_args!("outbox: {class:?} part: the sector at {at:#x} is damaged (zeroed or garbage) and kept the part from opening: read without it (the file is left as it was)"));
    }
    for (class, e) in outbox.unreadable() {
        say(text, format_args!("outbox: {class:?} part unreadable: {e}"));
        failed.push(format!("the outbox's {class:?} part"));
    }
    let mut waiting = Vec::new();
    let read = outbox
        .for_each(|e| {
            let kind = loopwarden_protocol::Frame::decode(e.payload)
                .map(|f| f.message.kind().name().to_string())
                .unwrap_or_else(|err| format!("unreadable frame: {err}"));
            waiting.push(format!(
                "{:>8} {:<9} {} {kind}",
                e.seq,
                format!("{:?}", e.class),
                e.topic
            ));
        })
        .await;
    // What was read before a failure is printed, then the failure.
    let held = match read {
        Ok(_) => "not yet acknowledged by the broker",
        Err(_) => "read before the read stopped",
    };
    say(
        text,
        format_args!("outbox: {} frames {held}", waiting.len()),
    );
    for w in waiting {
        say(text, w);
    }
    read.map(|_| ())
}

/// The sequence floor the config store keeps.
async fn dump_floor(
    flash: DumpFlash,
    range: std::ops::Range<u32>,
    text: &mut String,
) -> Result<(), DumpError> {
    let mut config = loopwarden_flash::ConfigStore::open(flash, range)?;
    let mut b = [0u8; 4];
    match config
        .get(loopwarden_flash::config::SEQ_FLOOR_KEY, &mut b)
        .await?
    {
        Some(4) => say(
            text,
            format_args!(
                "frame sequence numbers reserved up to {}",
                u32::from_le_bytes(b)
            ),
        ),
        _ => say(text, "no frame sequence reservation yet"),
    }
    Ok(())
}

/// `--listen` of `lwbus broker`: an address and port on loopback.
fn loopback_listen(s: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = s
        .parse()
        .map_err(|e| format!("{s:?} is not an address and port ({e})"))?;
    if !addr.ip().is_loopback() {
        return Err(EmbeddedBrokerError::NotLoopback(addr).to_string());
    }
    Ok(addr)
}

#[tokio::main]
async fn main() -> Result<()> {
    loopwarden_bus::init_logging("warn,loopwarden_bus=info");
    match Cli::parse().command {
        Command::Broker { listen } => {
            let broker = EmbeddedBroker::start(listen)?;
            eprintln!(
                "lwbus: embedded broker listening on {} (Ctrl-C to stop)",
                broker.addr()
            );
            tokio::signal::ctrl_c().await?;
            Ok(())
        }
        Command::Watch {
            broker,
            site,
            json,
            tls,
            sign_key,
        } => {
            let site = Ident::new(&site).map_err(|e| anyhow::anyhow!("--site: {e}"))?;
            let tls = tls.load().map_err(|e| anyhow::anyhow!(e))?;
            let key = sign_key.as_deref().map(watch::reader_key).transpose()?;
            if tls.is_some() && broker.is_none() {
                bail!("--tls-ca needs --broker: the embedded broker is plain loopback");
            }
            refuse_zoned_with_tls(broker.as_ref(), tls.is_some())?;
            let (broker, embedded) = configured_or_embedded(broker)?;
            if let Some(e) = &embedded {
                eprintln!("lwbus: no --broker given: embedded broker on {}", e.addr());
            }
            let options = watch::Options {
                broker,
                site,
                json,
                tls,
                key,
            };
            watch::run(options).await
        }
        Command::Flash { file, json } => dump_flash(&file, json).await,
        Command::Release {
            broker,
            site,
            host,
            gpu,
            note,
            sign_key,
            tls,
        } => {
            let tls = tls.load().map_err(|e| anyhow::anyhow!(e))?;
            refuse_zoned_with_tls(Some(&broker), tls.is_some())?;
            release::run(release::Options {
                broker,
                tls,
                site: &site,
                host: &host,
                gpu,
                note: &note,
                sign_key: &sign_key,
            })
            .await
        }
        Command::Pki { command } => loopwarden_bus::pki::run(command),
        Command::Samples { broker, site } => {
            let site = Ident::new(&site).map_err(|e| anyhow::anyhow!("--site: {e}"))?;
            publish_samples(broker, site).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{client_id, describe_record, utc, Cli, Command};

    use clap::Parser;

    /// Without --broker, a release with TLS goes to the TLS port, not to
    /// the plain one: the flags parsed and the TLS files loaded as `main`
    /// does, the broker as the release reaches it (`release::reached`).
    #[test]
    fn a_release_with_tls_and_no_broker_is_on_8883() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.crt");
        let mut p = rcgen::CertificateParams::new(Vec::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = p.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap();
        std::fs::write(&ca, cert.pem()).unwrap();
        let broker = |tls: &[&str]| {
            let args = [
                "lwbus", "release", "--site", "lab", "--host", "h01", "--gpu", "0",
            ];
            let more = ["--note", "fan replaced", "--sign-key", "ops1.sign.key"];
            let cli = Cli::try_parse_from(args.iter().chain(&more).chain(tls)).unwrap();
            let Command::Release {
                broker,
                tls,
                site,
                host,
                gpu,
                note,
                sign_key,
            } = cli.command
            else {
                unreachable!("a release command")
            };
            let o = super::release::Options {
                broker,
                tls: tls.load().expect("the CA loads"),
                site: &site,
                host: &host,
                gpu,
                note: &note,
                sign_key: &sign_key,
            };
            super::release::reached(&o).to_string()
        };
        let ca = ca.to_str().unwrap();
        assert_eq!(broker(&["--tls-ca", ca]), "127.0.0.1:8883");
        assert_eq!(broker(&[]), "127.0.0.1:1883");
        assert_eq!(
            broker(&["--broker", "b.hall", "--tls-ca", ca]),
            "b.hall:8883"
        );
        assert_eq!(
            broker(&["--broker", "b.hall:1884", "--tls-ca", ca]),
            "b.hall:1884"
        );
    }

    #[test]
    fn two_runs_with_one_process_id_get_two_client_ids() {
        let (a, b) = (client_id("watch"), client_id("watch"));
        let pid = std::process::id();
        assert!(a.starts_with(&format!("lwbus-watch-{pid}-")), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn the_embedded_broker_listens_on_loopback_only() {
        let listen = |addr: &str| {
            Cli::try_parse_from(["lwbus", "broker", "--listen", addr]).map(|c| match c.command {
                Command::Broker { listen } => listen,
                _ => unreachable!("a broker command"),
            })
        };
        assert_eq!(listen("127.0.0.1:1884").unwrap().port(), 1884);
        assert!(listen("[::1]:1884").is_ok());
        for addr in ["0.0.0.0:1883", "10.0.0.5:1883", "[::]:1883"] {
            let e = listen(addr).unwrap_err().to_string();
            assert!(e.contains("loopback only") && e.contains(addr), "{e}");
        }
        let e = listen("broker.hall").unwrap_err().to_string();
        assert!(e.contains("not an address and port"), "{e}");
    }

    #[test]
    fn a_serial_console_record_reads_as_a_sentence_or_its_json() {
        let body = br#"{"port":"/dev/ttyS1","what":"login_refused","in_a_row":2}"#;
        let kind = loopwarden_bus::console_record::CONSOLE_RECORD;
        assert_eq!(
            describe_record(kind, body, false),
            "serial_console     serial console /dev/ttyS1: login refused (2 in a row)"
        );
        let v: serde_json::Value =
            serde_json::from_str(&describe_record(kind, body, true)).unwrap();
        assert_eq!(v["console"]["in_a_row"], 2);
    }

    #[test]
    fn a_file_or_link_already_at_the_copys_path_is_never_written_through() {
        use super::{write_new, PrivateCopy};
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("none"), &dangling).unwrap();
        for at in [&target, &link, &dangling] {
            let e = write_new(at, b"forged").unwrap_err();
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::AlreadyExists,
                "{}",
                at.display()
            );
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert!(!dir.path().join("none").exists());

        let copy = PrivateCopy::new(dir.path(), b"flash").unwrap();
        assert!(copy.dir.starts_with(dir.path()));
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&copy.dir), 0o700);
        assert_eq!(mode(&copy.file), 0o600);
        assert_eq!(std::fs::read(&copy.file).unwrap(), b"flash");
        let (d, other) = (
            copy.dir.clone(),
            PrivateCopy::new(dir.path(), b"x").unwrap(),
        );
        assert_ne!(d, other.dir);
        drop(copy);
        assert!(!d.exists(), "removed when done");
    }

    use super::{dump_log, MessageKind, MultiwriteNorFlash};
    use embedded_storage_async::nor_flash::{ErrorType, NorFlash, ReadNorFlash};

    /// A flash whose reads fail from the `fail_at`-th on (all counted in
    /// `reads`): a store that fails partway through a read.
    struct FailingReads {
        flash: loopwarden_flash::SimFlash<4, 4096>,
        reads: std::rc::Rc<std::cell::Cell<u64>>,
        fail_at: u64,
    }

    impl ErrorType for FailingReads {
        type Error = loopwarden_flash::FlashError;
    }

    impl ReadNorFlash for FailingReads {
        const READ_SIZE: usize = 1;

        async fn read(&mut self, at: u32, bytes: &mut [u8]) -> Result<(), Self::Error> {
            let n = self.reads.get();
            self.reads.set(n + 1);
            if n >= self.fail_at {
                return Err(loopwarden_flash::FlashError::PowerCut);
            }
            self.flash.read(at, bytes).await
        }

        fn capacity(&self) -> usize {
            self.flash.capacity()
        }
    }

    impl NorFlash for FailingReads {
        const WRITE_SIZE: usize = 4;
        const ERASE_SIZE: usize = 4096;

        async fn erase(&mut self, from: u32, to: u32) -> Result<(), Self::Error> {
            self.flash.erase(from, to).await
        }

        async fn write(&mut self, at: u32, bytes: &[u8]) -> Result<(), Self::Error> {
            self.flash.write(at, bytes).await
        }
    }

    impl MultiwriteNorFlash for FailingReads {}

    /// An event log whose read fails partway: the records read before the
    /// failure are printed, then how many, and the failure is returned
    /// (they were dropped with it).
    #[test]
    fn the_records_read_before_the_log_fails_are_printed_then_the_failure() {
        use futures::executor::block_on;
        use loopwarden_flash::{EventLog, SimFlash};
        let range = 0..4 * 4096;
        let mut log = block_on(EventLog::open(SimFlash::<4, 4096>::new(4), range.clone())).unwrap();
        for i in 0..5 {
            let at = loopwarden_protocol::TimestampMs(1_780_000_000_000 + i);
            block_on(log.append(at, MessageKind::Event as u8, b"body")).unwrap();
        }
        let bytes = log.into_flash().bytes_mut().to_vec();
        let reads = std::rc::Rc::new(std::cell::Cell::new(0));
        let flash = |fail_at| FailingReads {
            flash: SimFlash::from_bytes(bytes.clone()),
            reads: reads.clone(),
            fail_at,
        };
        // The reads an opening makes, and those of a whole read after it.
        let mut log = block_on(EventLog::open(flash(u64::MAX), range.clone())).unwrap();
        let opened = reads.get();
        block_on(log.for_each(|_| {})).unwrap();
        let all = reads.get();
        // Failing at each read of the records in turn: those read before
        // are printed, in order, then how many.
        let mut partway = 0;
        for fail_at in opened..all {
            reads.set(0);
            let mut text = String::new();
            let e = block_on(dump_log(flash(fail_at), range.clone(), false, &mut text));
            let e = e.expect_err("the read fails");
            assert!(e.to_string().contains("power"), "{e}");
            let lines: Vec<&str> = text.lines().collect();
            assert!(lines.len() >= 2, "the failure not said: {text}");
            assert_eq!(lines[0], "event log: next record 5", "{text}");
            let records = &lines[1..lines.len() - 1];
            for (seq, line) in records.iter().enumerate() {
                assert!(line.starts_with(&format!("{seq:>8} 2026-")), "{text}");
            }
            let n = records.len();
            let said = format!("event log: the read stopped after {n} records (above)");
            assert_eq!(lines[lines.len() - 1], said, "{text}");
            partway += usize::from(n > 0 && n < 5);
        }
        assert!(partway > 0, "no read failed after some records");
    }

    #[test]
    fn utc_formats_epoch_milliseconds() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc(1_795_953_600_123), "2026-11-29T12:00:00.123Z");
    }
}
