//! The zero-install default: an MQTT broker (rumqttd) inside the agent's own
//! process, on loopback, used when no broker address is configured. One
//! machine then runs the whole system with nothing installed. It has no
//! authentication and no TLS, so it refuses to listen anywhere but on
//! loopback.
//!
//! rumqttd has no shutdown: the broker lives until the process ends. Tests
//! give each embedded broker its own port (or its own process).

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rumqttd::{Broker, Config, ConnectionSettings, RouterConfig, ServerSettings};
use tracing::{error, info};

use crate::config::{BrokerAddr, MAX_PACKET_SIZE};

/// Where the embedded broker listens by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:1883";

/// Why the embedded broker did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmbeddedBrokerError {
    /// The address is taken (another broker, or another agent's embedded one).
    #[error("cannot listen on {addr}: {source} (is another broker running there? configure its address instead)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Not a loopback address.
    #[error("the embedded broker listens on loopback only (127.0.0.0/8 or ::1), not on {0}: it has no authentication and no TLS; to serve a network, run mosquitto with the configuration of `lwbus pki init`")]
    NotLoopback(SocketAddr),
    /// The broker did not accept connections in time.
    #[error("embedded broker on {0} did not come up within 5 s")]
    NotListening(SocketAddr),
}

/// The broker or brokers to use: `configured` if given, else an embedded broker
/// started on [`DEFAULT_LISTEN`]. Keep the returned handle for as long as
/// the broker is needed.
/// `B` is one address ([`BrokerAddr`]) or a list ([`Brokers`](crate::Brokers)).
pub fn configured_or_embedded<B: From<BrokerAddr>>(
    configured: Option<B>,
) -> Result<(B, Option<EmbeddedBroker>), EmbeddedBrokerError> {
    match configured {
        Some(brokers) => Ok((brokers, None)),
        None => {
            let listen: SocketAddr = DEFAULT_LISTEN.parse().expect("a valid default address");
            let broker = EmbeddedBroker::start(listen)?;
            Ok((broker.broker_addr().into(), Some(broker)))
        }
    }
}

/// A running embedded broker.
#[derive(Debug)]
pub struct EmbeddedBroker {
    addr: SocketAddr,
}

impl EmbeddedBroker {
    /// Starts a broker listening on `listen`, a loopback address, and
    /// waits until it accepts connections. Port 0 picks a free port.
    pub fn start(listen: SocketAddr) -> Result<Self, EmbeddedBrokerError> {
        if !listen.ip().is_loopback() {
            return Err(EmbeddedBrokerError::NotLoopback(listen));
        }
        // rumqttd reports a taken port only in its own thread; find out here,
        // and resolve port 0 to a concrete free port.
        let addr = {
            let probe = TcpListener::bind(listen).map_err(|source| EmbeddedBrokerError::Bind {
                addr: listen,
                source,
            })?;
            probe
                .local_addr()
                .map_err(|source| EmbeddedBrokerError::Bind {
                    addr: listen,
                    source,
                })?
        };
        let server = ServerSettings {
            name: "loopwarden-embedded".into(),
            listen: addr,
            tls: None,
            next_connection_delay_ms: 1,
            connections: ConnectionSettings {
                connection_timeout_ms: 10_000,
                // Larger packets cost their publisher its connection.
                max_payload_size: MAX_PACKET_SIZE,
                max_inflight_count: 256,
                auth: None,
                external_auth: None,
                dynamic_filters: true,
            },
        };
        let config = Config {
            id: 0,
            router: RouterConfig {
                max_connections: 10_010,
                max_outgoing_packet_count: 1024,
                max_segment_size: 16 * 1024 * 1024,
                max_segment_count: 10,
                ..Default::default()
            },
            v4: Some(HashMap::from([("1".to_string(), server)])),
            ..Default::default()
        };
        std::thread::Builder::new()
            .name("mqtt-broker".into())
            .spawn(move || {
                let mut broker = Broker::new(config);
                if let Err(e) = broker.start() {
                    error!(%addr, error = %e, "embedded broker stopped");
                }
            })
            .map_err(|source| EmbeddedBrokerError::Bind { addr, source })?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if Instant::now() > deadline {
                return Err(EmbeddedBrokerError::NotListening(addr));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        info!(%addr, "embedded MQTT broker listening");
        Ok(Self { addr })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its address as a broker address for clients.
    pub fn broker_addr(&self) -> BrokerAddr {
        BrokerAddr {
            host: self.addr.ip().to_string(),
            port: self.addr.port(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_refuses_to_listen_beyond_loopback() {
        for addr in [
            "0.0.0.0:0",
            "[::]:0",
            "10.0.0.5:1883",
            "[::ffff:127.0.0.1]:0",
        ] {
            let addr: SocketAddr = addr.parse().unwrap();
            let e = EmbeddedBroker::start(addr).unwrap_err();
            assert!(
                matches!(e, EmbeddedBrokerError::NotLoopback(a) if a == addr),
                "{e}"
            );
            let text = e.to_string();
            assert!(
                text.contains("loopback only") && text.contains(&addr.to_string()),
                "{text}"
            );
        }
        let broker = EmbeddedBroker::start("127.0.0.1:0".parse().unwrap()).unwrap();
        assert!(broker.addr().ip().is_loopback());
    }
}
