//! `cooling-ctrl gateway --link tcp:HOST:PORT|DEVICE [--baud B]
//! [--link-any-address] [--config FILE] [flags]`: the Linux side of a CDU controller that runs on a
//! microcontroller (`cooling_ctrl::gateway`). The same file and flags as
//! `run`, checked the same way but for the CDU link, which it does not
//! need (`config::Purpose::Gateway`); it uses the bus's part of them (this
//! CDU, the broker and its login, TLS, the sign key, the keyring, the
//! site figures' layout, the hosts, the flash file, `metrics_listen`,
//! the hall's `facility_coordinator`), `run`'s northbound server and its
//! console socket (for operators' signed clears), and says at start
//! which configured parts it does not serve. SIGTERM or ctrl-c stops it cleanly (exit 0); under systemd it
//! sends READY=1 after its first second and WATCHDOG=1 while its loop
//! runs.
//!
//! Also here, for a controller on a microcontroller: `ctl clear-leak` and
//! `ctl clear-pump` with `--sign-key` ([`SignArgs`]: the operator's signed
//! clear, sent to the gateway's console), and `cooling-ctrl
//! firmware-keyring` (the operator keyring the firmware is built with).

use std::process::ExitCode;

use std::path::PathBuf;

use cooling_ctrl::config::{self, Overrides, Purpose};
use cooling_ctrl::gateway::clears::{self, GatewayRequest};
use cooling_ctrl::gateway::{self, link::LinkAddr, GatewayOptions};
use cooling_ctrl::journal::ControllerFlash;
use cooling_ctrl::watchdog::Notifier;
use loopwarden_field::common::RunArgs;
use loopwarden_field::lifecycle::{self, Readers, StartError, Supervision};
use loopwarden_field::listen::ListenStats;
use loopwarden_link::ClearAction;
use loopwarden_protocol::Ident;

/// The gateway's arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Where the microcontroller is: tcp:HOST:PORT (QEMU's `-serial
    /// tcp::PORT,server`), or a serial device such as /dev/ttyUSB0.
    #[arg(long)]
    link: String,
    /// The serial device's speed, 8N1 (115200 unless given); not for
    /// tcp:.
    #[arg(long)]
    baud: Option<u32>,
    /// Take a --link tcp: host off this host's loopback on purpose: the
    /// link's frames carry no authentication, so whoever can write into
    /// that stream speaks as the microcontroller (said at every start).
    #[arg(long)]
    link_any_address: bool,
    /// The configuration, as `run` takes it.
    #[command(flatten)]
    run: RunArgs<Overrides>,
}

/// Runs the gateway until SIGTERM or ctrl-c.
pub fn command(a: Args) -> ExitCode {
    lifecycle::run("cooling-ctrl gateway", || start(a), serve)
}

/// The configuration and the link, and what the gateway leaves aside
/// said at start.
fn start(a: Args) -> Result<(config::Config, LinkAddr), StartError> {
    let link = LinkAddr::parse(&a.link, a.baud, a.link_any_address).map_err(StartError::config)?;
    if let Some(w) = link.any_address_warning() {
        eprintln!("cooling-ctrl gateway: WARNING: {w}");
        tracing::warn!("cooling-ctrl gateway: {w}");
    }
    let (path, flags) = (a.run.config.as_deref(), &a.run.flags);
    let config = config::load_for(path, flags, Purpose::Gateway).map_err(StartError::config)?;
    if config.demo_key {
        super::demo_key_warning();
    }
    if config.flash.is_none() {
        eprintln!(
            "cooling-ctrl gateway: WARNING: no flash file: the event log, the outbox and the \
             sequence floor are lost at every restart (the microcontroller keeps its latched \
             state in its own flash)"
        );
    }
    // board_pins and gpio_chip are refused for the gateway with the
    // configuration (its microcontroller reads no rope pins).
    if config.serial.is_some() {
        tracing::warn!(
            "cooling-ctrl gateway: console_serial is configured but not served by the gateway"
        );
    }
    Ok((config, link))
}

async fn serve(
    (config, link): (config::Config, LinkAddr),
    notifier: Notifier,
) -> Result<(), String> {
    let (stats_tx, stats_rx) = gateway::stats_channel();
    let (supervision, stop) = Supervision::start(
        notifier,
        gateway::GATEWAY_LOOP,
        gateway::ALIVE_EVERY,
        stats_rx.clone(),
        |s| s.ticks,
    )?;
    let (broker, _embedded) =
        loopwarden_bus::embedded::configured_or_embedded(config.broker.clone())
            .map_err(|e| format!("broker: {e}"))?;
    let flash =
        ControllerFlash::open(config.flash.as_deref()).map_err(|e| format!("flash: {e}"))?;
    let recorder = flash.recorder.clone();
    let (clears_tx, clears_rx) = tokio::sync::mpsc::channel(8);
    let console = loopwarden_field::console::bind(&config.console, "gateway")
        .map_err(|e| format!("console socket {}: {e}", config.console.display()))?;
    let (console_stats, northbound_stats) = (ListenStats::default(), ListenStats::default());
    let console_task = tokio::spawn(clears::serve(
        console,
        config.console_limits,
        console_stats.clone(),
        clears_tx,
    ));
    let readers = Readers::new(config.console.clone(), console_task, []);
    let (northbound, northbound_task) =
        super::start_northbound(&config, northbound_stats.clone()).await?;
    let (cdu, rec) = (config.cdu.to_string(), recorder.clone());
    let has_northbound = config.northbound.is_some();
    let render = move || {
        let mut listeners = vec![("console", &console_stats)];
        if has_northbound {
            listeners.push(("northbound", &northbound_stats));
        }
        gateway::metrics::render(&cdu, &stats_rx.borrow().clone(), &rec, &listeners)
    };
    // An address it cannot bind is tried again while the gateway runs.
    let metrics_task = config.metrics_listen.map(|addr| {
        loopwarden_field::listen::bind_retrying(
            "metrics listener",
            addr,
            ListenStats::default(),
            move |l| {
                let at = l.local_addr().unwrap_or(addr);
                tracing::info!("metrics: serving http://{at}/metrics");
                loopwarden_bus::prometheus::serve(l, render)
            },
        )
    });
    let opts = GatewayOptions {
        stats: Some(stats_tx),
        bus: cooling_ctrl::shell::BusOptions::of(&config, flash),
        northbound,
        clears: Some(clears_rx),
        facility: config.facility.clone(),
        ..GatewayOptions::new(link)
    };
    let result = gateway::run(config.shell_config(broker), opts, stop).await;
    supervision.finish(result.is_err());
    recorder.flush().await;
    readers.stop();
    for t in [metrics_task, northbound_task].into_iter().flatten() {
        t.abort();
    }
    tracing::info!("cooling-ctrl gateway: stopped");
    result.map_err(|e| e.to_string())
}

/// How `ctl clear-leak` and `ctl clear-pump` sign a clear for a
/// controller on a microcontroller (its gateway's console socket as
/// `--console`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SignArgs {
    /// The operator's own sign key (`lwbus pki sign-key --node
    /// operator/NAME`): the clear is signed with it, in the operator's
    /// name, and sent to the gateway, which carries it to the
    /// microcontroller.
    #[arg(long, requires = "cdu")]
    sign_key: Option<PathBuf>,
    /// The CDU the clear is for (the microcontroller refuses one signed
    /// for another).
    #[arg(long, requires = "sign_key")]
    cdu: Option<String>,
}

impl SignArgs {
    /// The signed clear of `action` when a sign key was given; `None`
    /// for an unsigned request to `run`.
    pub fn request(
        &self,
        action: impl FnOnce() -> Result<ClearAction, String>,
    ) -> Result<Option<GatewayRequest>, String> {
        let (Some(path), Some(cdu)) = (&self.sign_key, &self.cdu) else {
            return Ok(None);
        };
        let key = loopwarden_bus::keys::read_sign_key(path)?;
        let cdu = Ident::new(cdu).map_err(|e| format!("--cdu {cdu}: {e}"))?;
        let action = action()?;
        let at = clears::signing_ms(|| loopwarden_bus::now_ms().0, std::thread::sleep);
        let clear = clears::operator_clear(&key, cdu, action, at)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Some(GatewayRequest::SignedClear { clear }))
    }
}

/// `cooling-ctrl firmware-keyring`'s arguments.
#[derive(clap::Args)]
pub struct KeyringArgs {
    /// The CDU whose firmware it is for.
    #[arg(long)]
    cdu: String,
    /// The site's keyring (`lwbus pki init` writes one; `lwbus pki
    /// sign-key --node operator/NAME` prints an operator's entry for it):
    /// its operators' public keys are taken.
    #[arg(long)]
    keyring: PathBuf,
}

/// Prints the operator keyring for the firmware of `a.cdu`.
pub fn firmware_keyring(a: &KeyringArgs) -> ExitCode {
    let text = Ident::new(&a.cdu)
        .map_err(|e| format!("--cdu {}: {e}", a.cdu))
        .and_then(|cdu| {
            let ring = loopwarden_bus::keys::read_keyring(&a.keyring)?;
            clears::firmware_keyring(&cdu, &ring.signers)
                .map_err(|e| format!("{}: {e}", a.keyring.display()))
        });
    match text {
        Ok(t) => {
            print!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cooling-ctrl firmware-keyring: {e}");
            ExitCode::from(2)
        }
    }
}
