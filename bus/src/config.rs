//! How an agent reaches the bus.

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;
use std::time::Duration;

use loopwarden_protocol::topic::TOPIC_MAX;
use loopwarden_protocol::{ClockSource, Ident, NodeId, MAX_FRAME_LEN};

use crate::backoff::Backoff;

/// The MQTT port when none is given, without TLS.
pub const DEFAULT_PORT: u16 = 1883;

/// The MQTT port when none is given, with TLS (IANA's `secure-mqtt`):
/// see [`Brokers::with_tls`].
pub const DEFAULT_TLS_PORT: u16 = 8883;

/// Bytes of JSON mirror a frame byte becomes at most: field names, digits
/// and escapes; the samples of every message kind measure under 15.
const JSON_PER_FRAME_BYTE: usize = 16;

/// What an MQTT 3.1.1 PUBLISH adds to its topic and payload: the fixed
/// header (1 byte and at most 4 of remaining length), the topic's length
/// (2) and the packet id (2).
const PUBLISH_OVERHEAD: usize = 1 + 4 + 2 + 2;

/// The largest MQTT packet the protocol needs, whole (headers included):
/// a topic of at most [`TOPIC_MAX`] bytes and a payload of at most a
/// frame ([`MAX_FRAME_LEN`]) or its JSON mirror. Brokers refuse anything
/// larger (`max_packet_size` in the generated `mosquitto.conf`, the
/// embedded broker likewise), so no packet a client can publish reaches a
/// subscriber above the client's own cap (`CLIENT_MAX_PACKET`, twice this), which
/// would cost it its connection.
pub const MAX_PACKET_SIZE: usize =
    PUBLISH_OVERHEAD + TOPIC_MAX + JSON_PER_FRAME_BYTE * MAX_FRAME_LEN;

/// The largest packet the client sends or takes (rumqttc drops the
/// connection over it): twice what brokers let through, as margin.
pub(crate) const CLIENT_MAX_PACKET: usize = 2 * MAX_PACKET_SIZE;

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

    /// A broker given without a port is on [`DEFAULT_PORT`] (a list
    /// connected with TLS moves it to [`DEFAULT_TLS_PORT`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s).map(|(addr, _)| addr)
    }
}

/// A broker's address, and whether its port was given.
fn parse(s: &str) -> Result<(BrokerAddr, bool), BrokerAddrError> {
    let err = |reason| BrokerAddrError {
        input: s.to_string(),
        reason,
    };
    let s = s.trim();
    let s = s.strip_prefix("mqtt://").unwrap_or(s);
    if s.contains("://") {
        return Err(err(
            "a URL scheme other than mqtt:// is not taken: use host:port, and tls_ca for TLS",
        ));
    }
    // An IPv6 address, with a zone after `%` (a link-local one's
    // interface) taken as the system resolves it.
    let ipv6 = |host: &str| {
        let (addr, zone) = host.split_once('%').unwrap_or((host, "x"));
        let interface = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        !zone.is_empty()
            && zone.chars().all(interface)
            && addr.parse::<std::net::Ipv6Addr>().is_ok()
    };
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or(err("unclosed '['"))?;
        if !ipv6(host) {
            return Err(err("what '[' and ']' enclose is not an IPv6 address"));
        }
        match after.strip_prefix(':') {
            Some(p) => (host, Some(p)),
            None if after.is_empty() => (host, None),
            None => return Err(err("expected ':<port>' after ']'")),
        }
    } else if s.matches(':').count() > 1 {
        // A bare IPv6 address, and nothing else.
        if !ipv6(s) {
            return Err(err(
                "more than one ':' and not an IPv6 address: write host:port, or \
                     [IPv6 address]:port",
            ));
        }
        (s, None)
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err(err("empty host"));
    }
    let given = port.is_some();
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or(err("port is not a number from 1 to 65535"))?,
        None => DEFAULT_PORT,
    };
    let addr = BrokerAddr {
        host: host.to_string(),
        port,
    };
    Ok((addr, given))
}

/// The brokers an agent may use, in the order it tries them: one broker,
/// or the nodes of a clustered one (`host:port,host:port,…`). Never
/// empty. It dereferences to the first, so what speaks of one broker
/// (a log line, the embedded broker's address) keeps working.
///
/// Failover: the bus connects to the first that answers and, when a
/// connection fails or is lost, tries the next ([`Brokers::after`]),
/// round the list, each attempt after the reconnect backoff's wait.
/// The second list says, of each broker, whether it was given without a
/// port (and is on [`DEFAULT_PORT`] until [`Brokers::with_tls`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Brokers(Vec<BrokerAddr>, Vec<bool>);

/// Why a list of broker addresses was refused: the entry, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct BrokersError {
    /// 1-based position of the refused entry.
    position: usize,
    /// Entries in the list.
    count: usize,
    source: BrokerAddrError,
}

impl fmt::Display for BrokersError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 1 {
            self.source.fmt(f)
        } else {
            write!(
                f,
                "entry {} of {}: {}",
                self.position, self.count, self.source
            )
        }
    }
}

impl Brokers {
    /// The list, or `None` when it is empty.
    pub fn new(list: Vec<BrokerAddr>) -> Option<Self> {
        let given = vec![false; list.len()];
        (!list.is_empty()).then_some(Brokers(list, given))
    }

    /// The list as it is reached with TLS (`tls`) or without: a broker
    /// given without a port is on [`DEFAULT_TLS_PORT`] with TLS, on
    /// [`DEFAULT_PORT`] without; a port given is kept either way. Without
    /// this, TLS would be tried on the port brokers keep for plain MQTT,
    /// and the agent would retry for ever, "broker unreachable".
    pub fn with_tls(mut self, tls: bool) -> Self {
        let port = if tls { DEFAULT_TLS_PORT } else { DEFAULT_PORT };
        for (addr, _) in self.0.iter_mut().zip(&self.1).filter(|(_, d)| **d) {
            addr.port = port;
        }
        self
    }

    /// How many there are (at least one).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never: a list holds at least one broker.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The broker at `index`, round the list.
    pub fn get(&self, index: usize) -> &BrokerAddr {
        &self.0[index % self.0.len()]
    }

    /// Every broker, in order.
    pub fn iter(&self) -> impl Iterator<Item = &BrokerAddr> {
        self.0.iter()
    }

    /// The first broker TLS cannot reach: one whose address carries a
    /// zone (`fe80::1%eth0`), which is no name a certificate can carry,
    /// so no TLS handshake to it can be made. A configuration with TLS and
    /// such a broker is refused at load rather than left retrying.
    pub fn unreachable_with_tls(&self) -> Option<&BrokerAddr> {
        self.0.iter().find(|b| b.host.contains('%'))
    }

    /// The index of the broker to try after a connection to the one at
    /// `index` failed or was lost: the next one, round the list (the same
    /// one when there is only one).
    pub fn after(&self, index: usize) -> usize {
        (index + 1) % self.0.len()
    }
}

impl Deref for Brokers {
    type Target = BrokerAddr;

    /// The first broker, the one tried first.
    fn deref(&self) -> &BrokerAddr {
        &self.0[0]
    }
}

impl From<BrokerAddr> for Brokers {
    fn from(addr: BrokerAddr) -> Self {
        Brokers(vec![addr], vec![false])
    }
}

impl fmt::Display for Brokers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            b.fmt(f)?;
        }
        Ok(())
    }
}

impl FromStr for Brokers {
    type Err = BrokersError;

    /// One address, or several separated by commas; an empty entry (`a,,b`,
    /// a trailing comma) is refused like any other bad one.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let count = s.split(',').count();
        s.split(',')
            .enumerate()
            .map(|(i, entry)| {
                parse(entry)
                    .map(|(addr, given)| (addr, !given))
                    .map_err(|source| BrokersError {
                        position: i + 1,
                        count,
                        source,
                    })
            })
            .collect::<Result<(Vec<BrokerAddr>, Vec<bool>), _>>()
            .map(|(list, defaulted)| Brokers(list, defaulted))
    }
}

/// Everything the bus shell needs to know.
#[derive(Debug, Clone)]
pub struct BusConfig {
    /// The brokers, tried in order (see [`Brokers`]).
    pub broker: Brokers,
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
    /// Keep the JSON mirror of `online` on a second, light connection of
    /// its own (client id `<client_id>-presence`), whose last will is the
    /// JSON `online: false`: facility readers of the JSON tree then see a
    /// node that dies or hangs go offline, as frame readers do. Costs one
    /// more connection per node, idle but for its keep-alive pings; off,
    /// the JSON mirror of `online` goes over the one connection and keeps
    /// saying `true` after a crash.
    pub json_presence: bool,
}

impl BusConfig {
    /// Defaults for `node` at `site` on `broker` (one address, or a list).
    pub fn new(broker: impl Into<Brokers>, site: Ident, node: NodeId) -> Self {
        let broker = broker.into();
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
            json_presence: true,
        }
    }

    /// The client id of the presence connection (see
    /// [`json_presence`](Self::json_presence)): the same on every
    /// connection, so a broker that still holds the last one closes it,
    /// and publishes its will, before it accepts the next.
    pub fn presence_client_id(&self) -> String {
        format!("{}-presence", self.client_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packet_limit_holds_any_frame_and_every_json_mirror_with_room_to_spare() {
        // The longest topic with the largest frame.
        const { assert!(MAX_PACKET_SIZE >= PUBLISH_OVERHEAD + TOPIC_MAX + MAX_FRAME_LEN) };
        let mut frames: Vec<_> = loopwarden_protocol::MessageKind::ALL
            .iter()
            .map(|k| loopwarden_protocol::samples::frame(*k))
            .collect();
        let mut full = frames[0].clone();
        full.message = loopwarden_protocol::Message::HostTelemetry(
            loopwarden_protocol::samples::host_telemetry(loopwarden_protocol::MAX_GPUS as u8),
        );
        frames.push(full);
        for f in &frames {
            let (bin, json) = (f.to_vec().unwrap().len(), f.to_json().len());
            assert!(
                json <= JSON_PER_FRAME_BYTE * bin,
                "{:?}: {json} > 16 x {bin}",
                f.message.kind()
            );
            assert!(PUBLISH_OVERHEAD + TOPIC_MAX + 2 * json <= MAX_PACKET_SIZE);
        }
        // What a broker lets through never reaches the client's cap.
        const { assert!(MAX_PACKET_SIZE < CLIENT_MAX_PACKET) };
    }

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
        let a: BrokerAddr = "fd00::5".parse().unwrap();
        assert_eq!((a.host.as_str(), a.port), ("fd00::5", 1883));
    }

    /// Neither a URL of another scheme nor a host with two ports reads as
    /// an IPv6 host on the default port.
    #[test]
    fn other_schemes_and_stray_colons_are_refused() {
        for url in ["mqtts://broker.hall:8883", "tcp://10.0.0.5:1883", "ssl://b"] {
            let e = url.parse::<BrokerAddr>().unwrap_err().to_string();
            assert!(
                e.contains("other than mqtt://") && e.contains("use host:port, and tls_ca for TLS"),
                "{e}"
            );
        }
        let e = "h:8883:x".parse::<BrokerAddr>().unwrap_err().to_string();
        assert_eq!(
            e,
            r#"broker address "h:8883:x": more than one ':' and not an IPv6 address: write host:port, or [IPv6 address]:port"#
        );
        let e = "[broker.hall]:8883".parse::<BrokerAddr>().unwrap_err();
        assert!(e.to_string().contains("not an IPv6 address"), "{e}");
        // A link-local address with its zone is an address, which TLS
        // cannot reach (no certificate names a zone).
        let zoned: BrokerAddr = "[fe80::1%eth0]:1883".parse().unwrap();
        assert_eq!((zoned.host.as_str(), zoned.port), ("fe80::1%eth0", 1883));
        let list: Brokers = "h1:8883,[fe80::1%eth0]:8883".parse().unwrap();
        assert_eq!(
            list.unreachable_with_tls(),
            Some(&zoned)
                .map(|z| BrokerAddr {
                    port: 8883,
                    ..z.clone()
                })
                .as_ref()
        );
        let plain: Brokers = "h1:8883,[fe80::1]:8883".parse().unwrap();
        assert_eq!(plain.unreachable_with_tls(), None);
        assert!("fe80::1%eth0".parse::<BrokerAddr>().is_ok());
        assert!(
            "[fe80::1%]:1883".parse::<BrokerAddr>().is_err(),
            "an empty zone"
        );
        assert!(
            "fe80::1%eth0:1883".parse::<BrokerAddr>().is_err(),
            "a port in the zone"
        );
        let e = "n1:4001,mqtts://n2:8883".parse::<Brokers>().unwrap_err();
        assert!(e.to_string().starts_with("entry 2 of 2: "), "{e}");
    }

    #[test]
    fn parses_broker_lists_and_names_a_bad_entry() {
        let one: Brokers = "10.0.0.5".parse().unwrap();
        assert_eq!((one.len(), one.to_string()), (1, "10.0.0.5:1883".into()));
        assert_eq!(one.port, 1883, "a list reads as its first broker");
        let three: Brokers = "n1:4001, n2 ,[::1]:4003".parse().unwrap();
        assert_eq!(three.to_string(), "n1:4001,n2:1883,[::1]:4003");
        assert_eq!(three.get(4).host, "n2", "round the list");
        let e = "n1:4001,n2:0,n3".parse::<Brokers>().unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"entry 2 of 3: broker address "n2:0": port is not a number from 1 to 65535"#
        );
        let e = "n1:4001,".parse::<Brokers>().unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"entry 2 of 2: broker address "": empty host"#
        );
        let e = "h:0".parse::<Brokers>().unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"broker address "h:0": port is not a number from 1 to 65535"#,
            "one address reads as before"
        );
        assert_eq!(Brokers::new(Vec::new()), None);
    }

    #[test]
    fn a_broker_without_a_port_is_on_8883_with_tls_and_1883_without() {
        let list: Brokers = "b.hall,n2:1883,[::1],n4:4001".parse().unwrap();
        let tls = list.clone().with_tls(true);
        assert_eq!(tls.to_string(), "b.hall:8883,n2:1883,[::1]:8883,n4:4001");
        assert_eq!(tls.with_tls(false), list, "back to 1883");
        assert_eq!(list.to_string(), "b.hall:1883,n2:1883,[::1]:1883,n4:4001");
        let one = Brokers::from("b.hall:1883".parse::<BrokerAddr>().unwrap());
        assert_eq!(one.with_tls(true).port, 1883, "a port given is kept");
    }

    #[test]
    fn a_failure_moves_on_to_the_next_broker_round_the_list() {
        let three: Brokers = "a,b,c".parse().unwrap();
        let order: Vec<usize> = std::iter::successors(Some(0), |i| Some(three.after(*i)))
            .take(5)
            .collect();
        assert_eq!(order, [0, 1, 2, 0, 1]);
        let one: Brokers = "a".parse().unwrap();
        assert_eq!(one.after(0), 0, "one broker: the same again");
    }
}
