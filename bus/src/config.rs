//! How an agent reaches the bus.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use loopwarden_protocol::{ClockSource, Ident, NodeId};

use crate::backoff::Backoff;

/// The MQTT port when none is given.
pub const DEFAULT_PORT: u16 = 1883;

/// A broker's host and port (`host`, `host:port`, `[v6]:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddr {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl fmt::Display for BrokerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Why a broker address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("broker address {input:?}: {reason}")]
pub struct BrokerAddrError {
    input: String,
    reason: &'static str,
}

impl FromStr for BrokerAddr {
    type Err = BrokerAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| BrokerAddrError {
            input: s.to_string(),
            reason,
        };
        let s = s.trim();
        let s = s.strip_prefix("mqtt://").unwrap_or(s);
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (host, after) = rest.split_once(']').ok_or(err("unclosed '['"))?;
            match after.strip_prefix(':') {
                Some(p) => (host, Some(p)),
                None if after.is_empty() => (host, None),
                None => return Err(err("expected ':<port>' after ']'")),
            }
        } else if s.matches(':').count() > 1 {
            (s, None) // a bare IPv6 address
        } else {
            match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            }
        };
        if host.is_empty() {
            return Err(err("empty host"));
        }
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or(err("port is not a number from 1 to 65535"))?,
            None => DEFAULT_PORT,
        };
        Ok(BrokerAddr {
            host: host.to_string(),
            port,
        })
    }
}

/// Everything the bus shell needs to know.
#[derive(Debug, Clone)]
pub struct BusConfig {
    /// The broker.
    pub broker: BrokerAddr,
    /// The site (first level below `dc/v2`).
    pub site: Ident,
    /// Who we are. A host or a CDU owns `…/<role>/<id>/…` and listens on its
    /// `cmd` topic; an operator or facility node only sends commands.
    pub node: NodeId,
    /// MQTT client id; must be unique on the broker.
    pub client_id: String,
    /// User name and password, for brokers that require them.
    pub credentials: Option<(String, String)>,
    /// TLS to the broker (CA, our certificate, the broker's name).
    pub tls: Option<crate::tls::Tls>,
    /// MQTT keep-alive: the broker declares us gone (and publishes the last
    /// will) after 1.5 × this without a packet.
    pub keep_alive: Duration,
    /// Requests waiting for the MQTT client (publishes, subscribes).
    pub queue_capacity: usize,
    /// Unacknowledged QoS 1 publishes kept across an outage.
    pub offline_capacity: usize,
    /// Received frames waiting for the agent.
    pub inbound_capacity: usize,
    /// Extra subscriptions (filters), renewed on every connection.
    pub subscriptions: Vec<String>,
    /// First sequence number (restored from flash by the agents).
    pub first_seq: u32,
    /// Reconnect backoff.
    pub backoff: Backoff,
    /// Our software version, announced on `online`.
    pub software: String,
    /// Where our timestamps come from.
    pub clock: ClockSource,
}

impl BusConfig {
    /// Defaults for `node` at `site` on `broker`.
    pub fn new(broker: BrokerAddr, site: Ident, node: NodeId) -> Self {
        let client_id = format!("lw-{}-{}-{}", site, node.role.as_str(), node.id);
        Self {
            broker,
            site,
            node,
            client_id,
            credentials: None,
            tls: None,
            keep_alive: Duration::from_secs(5),
            queue_capacity: 256,
            offline_capacity: 512,
            inbound_capacity: 64,
            subscriptions: Vec::new(),
            first_seq: 0,
            backoff: Backoff::default(),
            software: env!("CARGO_PKG_VERSION").to_string(),
            clock: ClockSource::UnixEpoch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_broker_addresses() {
        let a: BrokerAddr = "10.0.0.5".parse().unwrap();
        assert_eq!((a.host.as_str(), a.port), ("10.0.0.5", 1883));
        let a: BrokerAddr = "broker.hall:1884".parse().unwrap();
        assert_eq!((a.host.as_str(), a.port), ("broker.hall", 1884));
        let a: BrokerAddr = "mqtt://127.0.0.1:2000".parse().unwrap();
        assert_eq!(a.port, 2000);
        let a: BrokerAddr = "[::1]:1885".parse().unwrap();
        assert_eq!((a.host.as_str(), a.port), ("::1", 1885));
        assert_eq!(a.to_string(), "[::1]:1885");
        let e = "h:0".parse::<BrokerAddr>().unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"broker address "h:0": port is not a number from 1 to 65535"#
        );
        assert!(":1883".parse::<BrokerAddr>().is_err());
        assert!("h:x".parse::<BrokerAddr>().is_err());
    }
}
