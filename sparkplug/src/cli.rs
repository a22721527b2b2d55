//! The command line of `lw-sparkplug`: flags, their checks, and the run.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use loopwarden_bus::tls::{Tls, TlsArgs, TlsFiles};
use loopwarden_bus::Brokers;
use loopwarden_protocol::Ident;

use crate::bridge::BridgeConfig;
use crate::shell::{Link, Options};

/// Publish a Loopwarden site as Sparkplug B: one edge node, one device
/// per CDU and per host.
#[derive(Debug, Parser)]
#[command(name = "lw-sparkplug", version)]
pub struct Cli {
    /// The Loopwarden broker (`host[:port]`), or the nodes of a cluster
    /// (`host:port,host:port,…`).
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub broker: Brokers,
    /// The site to bridge.
    #[arg(long)]
    pub site: String,
    /// TLS to the Loopwarden broker (a reader's certificate); also used
    /// for Sparkplug when it shares the broker.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// The Sparkplug group id; default: the site.
    #[arg(long)]
    pub group: Option<String>,
    /// The Sparkplug edge node id: unique within the group.
    #[arg(long, default_value = "loopwarden")]
    pub edge_node: String,
    /// Publish Sparkplug on this broker (or cluster) instead of the
    /// Loopwarden one.
    #[arg(long)]
    pub sparkplug_broker: Option<Brokers>,
    /// CA certificate (PEM) of the Sparkplug broker: connect to it with TLS.
    #[arg(long, requires = "sparkplug_broker")]
    pub sparkplug_tls_ca: Option<PathBuf>,
    /// The bridge's certificate (PEM) for the Sparkplug broker.
    #[arg(long, requires = "sparkplug_tls_ca", requires = "sparkplug_tls_key")]
    pub sparkplug_tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, requires = "sparkplug_tls_cert")]
    pub sparkplug_tls_key: Option<PathBuf>,
    /// The name the Sparkplug broker's certificate must carry, if not its host.
    #[arg(long, requires = "sparkplug_tls_ca")]
    pub sparkplug_tls_server_name: Option<String>,
    /// User name on the Sparkplug broker.
    #[arg(long, requires = "sparkplug_password_file")]
    pub sparkplug_user: Option<String>,
    /// File holding that user's password (one line; mode 600).
    #[arg(long, requires = "sparkplug_user")]
    pub sparkplug_password_file: Option<PathBuf>,
    /// MQTT keep-alive on the Sparkplug side, seconds: the broker
    /// publishes the NDEATH 1.5 × this after the bridge falls silent.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub keep_alive: u64,
    /// Least time between two NDATA of the bridge's own counters, seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub ndata_every: u64,
    /// A host unheard this long is declared dead (DDEATH), seconds; a
    /// host whose samples come further apart gets 3 × their gap.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub host_silent_after: u64,
    /// The same for a CDU, seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub cdu_silent_after: u64,
    /// The most CDUs and hosts the site has: the Sparkplug client's
    /// queue holds a round of births for that many (a larger site is
    /// warned of), and as many devices forgotten keep their pace.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_devices: u64,
}

/// A Sparkplug id (group, edge node): UTF-8 without `+`, `/` or `#`.
pub fn sparkplug_id(flag: &str, id: &str) -> Result<String> {
    if id.is_empty() {
        bail!("{flag}: empty; Sparkplug ids need at least one character");
    }
    if let Some(c) = id.chars().find(|c| matches!(c, '+' | '/' | '#')) {
        bail!("{flag} {id:?}: {c:?} is reserved in Sparkplug topics (no '+', '/' or '#')");
    }
    Ok(id.to_string())
}

fn password(path: &std::path::Path) -> Result<String> {
    loopwarden_bus::keys::check_private(path, "password file").map_err(anyhow::Error::msg)?;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--sparkplug-password-file {}", path.display()))?;
    let line = text.lines().next().unwrap_or("").to_string();
    if line.is_empty() {
        bail!("--sparkplug-password-file {}: empty", path.display());
    }
    Ok(line)
}

impl Cli {
    /// Checks the flags and loads the files they name.
    pub fn options(&self) -> Result<Options> {
        let site = Ident::new(&self.site).map_err(|e| anyhow::anyhow!("--site: {e}"))?;
        let group = sparkplug_id("--group", self.group.as_deref().unwrap_or(&self.site))?;
        let edge_node = sparkplug_id("--edge-node", &self.edge_node)?;
        let loopwarden_tls = self.tls.load().map_err(anyhow::Error::msg)?;
        // A broker given without a port is on 8883 with TLS, 1883
        // without, on each side as its own TLS says.
        let loopwarden = self.broker.clone().with_tls(loopwarden_tls.is_some());
        let (brokers, tls) = match &self.sparkplug_broker {
            None => (loopwarden.clone(), loopwarden_tls.clone()),
            Some(b) => {
                let tls = self.sparkplug_tls()?;
                (b.clone().with_tls(tls.is_some()), tls)
            }
        };
        let credentials = match (&self.sparkplug_user, &self.sparkplug_password_file) {
            (Some(user), Some(file)) => Some((user.clone(), password(file)?)),
            _ => None,
        };
        let client_id = format!("lw-sparkplug-{group}-{edge_node}");
        Ok(Options {
            loopwarden,
            loopwarden_tls,
            site,
            sparkplug: Link {
                brokers,
                tls,
                credentials,
                keep_alive: Duration::from_secs(self.keep_alive),
                client_id,
            },
            bridge: BridgeConfig {
                group,
                edge_node,
                site: self.site.clone(),
                software: env!("CARGO_PKG_VERSION").to_string(),
                ndata_every_ms: self.ndata_every * 1000,
                host_silent_after_ms: self.host_silent_after * 1000,
                cdu_silent_after_ms: self.cdu_silent_after * 1000,
                max_devices: self.max_devices as usize,
            },
            max_devices: self.max_devices as usize,
        })
    }

    /// What to warn of at start when Sparkplug shares the Loopwarden
    /// broker as a certificate's identity: the ACL of `lwbus pki init`
    /// gives no identity an `spBv1.0` topic, and mosquitto drops a denied
    /// publish and grants a denied subscription without a word, so the
    /// bridge could publish nothing and never know.
    pub fn shared_broker_caution(&self) -> Option<String> {
        if self.sparkplug_broker.is_some() {
            return None;
        }
        let cert = self.tls.tls_cert.as_ref()?;
        Some(format!(
            "Sparkplug shares the Loopwarden broker as the identity of {}: the broker's ACL must \
             give it the rules of docs/sparkplug.md section 6 (an lwbus pki init reader has no \
             spBv1.0 topic); if not, every birth and the NDEATH are dropped unseen (mosquitto \
             says nothing): check that a host application receives the NBIRTH, or publish on \
             another broker (--sparkplug-broker)",
            cert.display()
        ))
    }

    fn sparkplug_tls(&self) -> Result<Option<Tls>> {
        let Some(ca) = self.sparkplug_tls_ca.clone() else {
            return Ok(None);
        };
        let files = TlsFiles {
            ca,
            cert: self.sparkplug_tls_cert.clone(),
            key: self.sparkplug_tls_key.clone(),
            server_name: self.sparkplug_tls_server_name.clone(),
        };
        Tls::load(files)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("Sparkplug TLS: {e}"))
    }
}

/// Parses the command line, runs the bridge, and says why it stopped.
pub fn main() -> ExitCode {
    loopwarden_bus::init_logging("info,rumqttc=warn,rumqttd=off");
    let cli = Cli::parse();
    let options = match cli.options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("lw-sparkplug: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Some(caution) = cli.shared_broker_caution() {
        tracing::warn!("{caution}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lw-sparkplug: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::shell::run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lw-sparkplug: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparkplug_ids_refuse_the_reserved_characters() {
        assert_eq!(sparkplug_id("--group", "hall-1").unwrap(), "hall-1");
        assert_eq!(
            sparkplug_id("--edge-node", "Loop warden").unwrap(),
            "Loop warden"
        );
        let e = sparkplug_id("--edge-node", "a/b").unwrap_err().to_string();
        assert_eq!(
            e,
            r#"--edge-node "a/b": '/' is reserved in Sparkplug topics (no '+', '/' or '#')"#
        );
        assert!(sparkplug_id("--group", "").is_err());
        assert!(sparkplug_id("--group", "x#").is_err());
    }

    #[test]
    fn the_group_defaults_to_the_site_and_sparkplug_shares_the_broker() {
        let cli = Cli::parse_from(["lw-sparkplug", "--site", "hall-1", "--broker", "b:1884"]);
        let o = cli.options().unwrap();
        assert_eq!(o.bridge.group, "hall-1");
        assert_eq!(o.bridge.edge_node, "loopwarden");
        assert_eq!(o.sparkplug.brokers.to_string(), "b:1884");
        assert_eq!(o.sparkplug.client_id, "lw-sparkplug-hall-1-loopwarden");
        let cli = Cli::parse_from(["lw-sparkplug", "--site", "hall-1", "--broker", "b"]);
        let o = cli.options().unwrap();
        assert_eq!(o.loopwarden.to_string(), "b:1883");
        assert_eq!(o.sparkplug.brokers.to_string(), "b:1883");
        let cli = Cli::parse_from(["lw-sparkplug", "--site", "bad/site"]);
        assert!(cli
            .options()
            .unwrap_err()
            .to_string()
            .starts_with("--site:"));
    }

    #[test]
    fn sharing_the_broker_with_a_certificate_is_cautioned_of_the_acl() {
        let cli = |more: &[&str]| {
            let mut all = vec!["lw-sparkplug", "--site", "hall-1", "--broker", "b"];
            all.extend_from_slice(more);
            Cli::parse_from(all)
        };
        let cert = [
            "--tls-ca",
            "ca.crt",
            "--tls-cert",
            "spb1.crt",
            "--tls-key",
            "spb1.key",
        ];
        let caution = cli(&cert).shared_broker_caution().expect("cautioned");
        assert!(caution.contains("spb1.crt"), "{caution}");
        assert!(caution.contains("section 6"), "{caution}");
        let apart = [&cert[..], &["--sparkplug-broker", "s"]].concat();
        assert_eq!(cli(&apart).shared_broker_caution(), None);
        assert_eq!(cli(&["--tls-ca", "ca.crt"]).shared_broker_caution(), None);
        assert_eq!(cli(&[]).shared_broker_caution(), None);
    }

    /// A broker given without a port is on MQTT's TLS port (8883) with
    /// TLS, on both sides of the bridge; a port given is kept.
    #[test]
    fn a_broker_without_a_port_is_on_8883_with_tls_on_both_sides() {
        let dir = std::env::temp_dir().join(format!("lw-sparkplug-cli-{}", std::process::id()));
        let out = dir.join("pki");
        loopwarden_bus::pki::init(&loopwarden_bus::pki::InitArgs {
            site: "a".into(),
            hosts: vec!["h01".into()],
            cdus: vec!["cdu1".into()],
            operators: vec![],
            readers: vec![],
            out: out.clone(),
            broker_port: 8883,
        })
        .unwrap();
        let ca = out.join("ca.crt");
        let ca = ca.to_str().unwrap();
        let options = |args: &[&str]| {
            let mut all = vec!["lw-sparkplug", "--site", "a"];
            all.extend_from_slice(args);
            let o = Cli::parse_from(all).options().unwrap();
            (o.loopwarden.to_string(), o.sparkplug.brokers.to_string())
        };
        let shared = options(&["--broker", "b", "--tls-ca", ca]);
        assert_eq!(shared, ("b:8883".into(), "b:8883".into()));
        let shared = options(&["--broker", "b1,b2:1884", "--tls-ca", ca]);
        assert_eq!(shared, ("b1:8883,b2:1884".into(), "b1:8883,b2:1884".into()));
        let apart = ["--broker", "b", "--sparkplug-broker", "s"];
        let plain = options(&apart);
        assert_eq!(plain, ("b:1883".into(), "s:1883".into()));
        let tls = options(&[&apart[..], &["--sparkplug-tls-ca", ca]].concat());
        assert_eq!(tls, ("b:1883".into(), "s:8883".into()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
