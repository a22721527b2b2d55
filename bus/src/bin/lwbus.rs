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
use loopwarden_bus::embedded::{
    configured_or_embedded, EmbeddedBroker, EmbeddedBrokerError, DEFAULT_LISTEN,
};
use loopwarden_bus::{now_ms, Brokers, Bus, BusConfig};
use loopwarden_protocol::{
    samples, Family, GpuSelector, Ident, Message, MessageKind, NodeId, Role, Topic,
};

// Beside this file, not in `src/bin/` itself, where cargo would take
// each for a program of its own.
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
        /// (`host:port,host:port,…`).
        #[arg(long, default_value = "127.0.0.1:1883")]
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

/// A client id for this run of `what`: the process id and random bits,
/// so two runs with one process id (PID 1 in two containers) do not
/// push each other off the broker, which drops the older of two clients
/// with one id.
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

/// Prints what an agent's flash holds, oldest first.
async fn dump_flash(path: &std::path::Path, json: bool) -> Result<()> {
    use loopwarden_flash::{ConfigStore, EventLog, FileFlash, Outbox, SharedFlash};

    let mut text = String::new();
    macro_rules! out {
        ($($arg:tt)*) => {{
            use std::fmt::Write as _;
            let _ = writeln!(text, $($arg)*);
        }};
    }
    let board = loopwarden_boards::FlashBoard::host_file();
    let bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
    if bytes.is_empty() {
        bail!("{}: empty file, nothing was ever written", path.display());
    }
    // Read a copy: opening a store may repair a half-written item, and the
    // original is evidence.
    let copy = std::env::temp_dir().join(format!("lwbus-flash-{}.bin", std::process::id()));
    std::fs::write(&copy, &bytes).with_context(|| format!("{}", copy.display()))?;
    let opened = FileFlash::<4, 4096>::open(&copy, &board.geometry());
    let _ = std::fs::remove_file(&copy);
    let flash =
        opened.map_err(|e| anyhow::anyhow!("{e}").context(format!("{}", path.display())))?;
    let flash = SharedFlash::new(flash);
    let layout = board.layout();
    let mut log = EventLog::open(flash.clone(), layout.log)
        .await
        .map_err(|e| anyhow::anyhow!("event log: {e}"))?;
    out!("event log: next record {}", log.next_seq());
    let mut lines = Vec::new();
    let skipped = log
        .for_each(|r| {
            let what = describe_record(r.kind, r.body, json);
            lines.push(format!("{:>8} {} {what}", r.seq, utc(r.time.0)));
        })
        .await
        .map_err(|e| anyhow::anyhow!("event log: {e}"))?;
    for l in lines {
        out!("{l}");
    }
    if skipped > 0 {
        out!("({skipped} stored items were not log records and were skipped)");
    }
    let mut outbox = Outbox::open(flash.clone(), layout.outbox)
        .await
        .map_err(|e| anyhow::anyhow!("outbox: {e}"))?;
    let mut waiting = Vec::new();
    outbox
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
        .await
        .map_err(|e| anyhow::anyhow!("outbox: {e}"))?;
    out!(
        "outbox: {} frames not yet acknowledged by the broker",
        waiting.len()
    );
    for w in waiting {
        out!("{w}");
    }
    let mut config =
        ConfigStore::open(flash, layout.config).map_err(|e| anyhow::anyhow!("config: {e}"))?;
    let mut b = [0u8; 4];
    match config
        .get(loopwarden_flash::config::SEQ_FLOOR_KEY, &mut b)
        .await
        .map_err(|e| anyhow::anyhow!("config: {e}"))?
    {
        Some(4) => out!(
            "frame sequence numbers reserved up to {}",
            u32::from_le_bytes(b)
        ),
        _ => out!("no frame sequence reservation yet"),
    }
    // A reader that stops early (`| head`) is not an error.
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to standard output"),
    }
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
            release(broker, tls, &site, &host, gpu, &note, &sign_key).await
        }
        Command::Pki { command } => loopwarden_bus::pki::run(command),
        Command::Samples { broker, site } => {
            let site = Ident::new(&site).map_err(|e| anyhow::anyhow!("--site: {e}"))?;
            publish_samples(broker, site).await
        }
    }
}

/// Sends a signed `quarantine_release` and waits for the host's ack.
async fn release(
    broker: Brokers,
    tls: Option<loopwarden_bus::tls::Tls>,
    site: &str,
    host: &str,
    gpu: u8,
    note: &str,
    sign_key: &std::path::Path,
) -> Result<()> {
    use loopwarden_protocol::{AckCode, CommandAuth, Frame, GpuIndex, QuarantineRelease, Text};
    let site = Ident::new(site).map_err(|e| anyhow::anyhow!("--site: {e}"))?;
    let host = Ident::new(host).map_err(|e| anyhow::anyhow!("--host: {e}"))?;
    let key = loopwarden_bus::keys::read_sign_key(sign_key).map_err(|e| anyhow::anyhow!(e))?;
    let me = key.node.clone();
    if me.role != Role::Operator {
        bail!(
            "--sign-key: {} is the key of {}/{}, not an operator's",
            sign_key.display(),
            me.role.as_str(),
            me.id.as_str()
        );
    }
    let gpu = GpuIndex::new(gpu).context("--gpu: 0 to 15")?;
    let note = note.trim();
    if note.is_empty() {
        bail!("--note: say why the GPU is fit again; it is logged and published");
    }
    let note = Text::new(note).context("--note: at most 96 bytes")?;
    let ack_topic = Topic::new(&site, Role::Host, &host, Family::Ack);
    let mut config = BusConfig::new(broker.clone(), site.clone(), me.clone());
    config.client_id = client_id(&format!("release-{}", me.id));
    config.tls = tls;
    config.subscriptions.push(ack_topic.to_string());
    let telemetry = Topic::new(&site, Role::Host, &host, Family::Telemetry);
    config.subscriptions.push(telemetry.to_string());
    let (bus, mut inbound, task) = Bus::start(config);
    if !bus.wait_connected(Duration::from_secs(10)).await {
        bail!("cannot reach the broker at {broker}");
    }
    // Signed with a clock far from the host's, the release is refused as
    // expired, and one stamped ahead moves the host's floor for this
    // operator past what a right clock gives: checked against the host's
    // telemetry first (a host heard from in 3 s; else the ack says).
    let heard = tokio::time::timeout(Duration::from_secs(3), async {
        while let Some(m) = inbound.recv().await {
            if matches!(m.frame.message, Message::HostTelemetry(_)) && m.frame.sender.id == host {
                return Some(m.frame.time);
            }
        }
        None
    })
    .await;
    if let Ok(Some(host_time)) = heard {
        if let Some(why) = clocks_apart(now_ms(), host_time, host.as_str()) {
            let _ = bus.shutdown(Duration::from_secs(2)).await;
            task.join(Duration::from_secs(2)).await;
            bail!("{why}");
        }
    }
    // The host refuses a seq not above the last it took from this
    // operator: seconds since 2020 rise across runs of this tool (one
    // release per second and operator).
    let seq = (now_ms().0 / 1000).saturating_sub(1_577_836_800) as u32;
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
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(m) = inbound.recv().await {
            if let Message::Ack(a) = m.frame.message {
                if a.correlation.seq == frame.seq && a.correlation.from == frame.sender {
                    return Some(a);
                }
            }
        }
        None
    })
    .await;
    let _ = bus.shutdown(Duration::from_secs(2)).await;
    task.join(Duration::from_secs(2)).await;
    match answer {
        Ok(Some(a)) if a.code == AckCode::Ok => {
            println!("GPU {} of {} released", gpu.get(), host.as_str());
            Ok(())
        }
        Ok(Some(a)) => bail!(
            "{} ({}): {}",
            a.code,
            serde_json::to_value(a.code)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            a.detail.as_str()
        ),
        _ => bail!(
            "no answer from {} in 10 s (is its agent running, on this site?)",
            host.as_str()
        ),
    }
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
    use super::{client_id, clocks_apart, describe_record, utc, Cli, Command};

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
    use clap::Parser;

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
    fn utc_formats_epoch_milliseconds() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc(1_795_953_600_123), "2026-11-29T12:00:00.123Z");
    }
}
