//! Who the node is on the bus, and the MQTT packets that follow from it:
//! the configuration (fixed once the bus starts), the client options for
//! each broker of the list, the node's own topics, numbered frames,
//! presence (its announcement and last will) and retained publishes.
//! Nothing here does I/O or keeps delivery state; the handles, the event
//! loop and the presence connection all build their packets here.
//!
//! Glossary:
//! - *retained state*: the latest frame (and JSON mirror) the node put on
//!   a retained family other than `online` (`health`); the bus announces it
//!   again, after presence, on every re-connection.
//! - *durable*: a QoS 1 frame that goes through the flash outbox (see
//!   [`Node::durable`]).

use std::sync::Arc;
use std::time::Duration;

use loopwarden_protocol::{Family, Frame, Message, Online, Qos, Role, Text, TimestampMs, Topic};
use rumqttc::{LastWill, MqttOptions, QoS};

use super::status::Status;
use super::{now_ms, PublishError, MAX_INFLIGHT};
use crate::config::{BusConfig, CLIENT_MAX_PACKET};

/// The node, as every part of the client sees it.
pub(super) struct Node {
    pub(super) config: BusConfig,
    pub(super) started: TimestampMs,
    /// The frame counter and the counters.
    pub(super) status: Arc<Status>,
}

impl Node {
    /// The node of `config`, started now. A broker given without a port
    /// is on 8883 with TLS, 1883 without ([`crate::Brokers::with_tls`]).
    pub(super) fn new(mut config: BusConfig) -> Self {
        config.broker = config.broker.with_tls(config.tls.is_some());
        Self {
            status: Arc::new(Status::new(config.first_seq)),
            started: now_ms(),
            config,
        }
    }

    /// The client's options for connecting to broker `index` of the list
    /// (without the last will, which goes with each attempt).
    pub(super) fn mqtt_options(&self, index: usize) -> MqttOptions {
        let mut options = self.options_as(&self.config.client_id, index);
        options.set_inflight(MAX_INFLIGHT);
        options
    }

    /// The options every connection of this node shares (broker, login,
    /// TLS, keep-alive, clean session), under `client_id`.
    pub(super) fn options_as(&self, client_id: &str, index: usize) -> MqttOptions {
        let cfg = &self.config;
        let broker = cfg.broker.get(index);
        let mut options = MqttOptions::new(client_id, &broker.host, broker.port);
        options.set_keep_alive(cfg.keep_alive.max(Duration::from_secs(1)));
        options.set_clean_session(true);
        options.set_max_packet_size(CLIENT_MAX_PACKET, CLIENT_MAX_PACKET);
        if let Some((user, password)) = &cfg.credentials {
            options.set_credentials(user, password);
        }
        if let Some(tls) = &cfg.tls {
            options.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(tls.config.clone()),
            ));
        }
        options
    }

    /// Whether a frame on `topic` goes through the outbox (when there is
    /// one). Not the retained state families
    /// (`online`, `health`): only their latest value matters, the bus
    /// announces it again on every re-connection (see `retained_state`),
    /// and a decision must not wait behind a flash write to reach the
    /// broker. Not a resend request or what answers it either: the reader
    /// asks again for what did not arrive.
    pub(super) fn durable(&self, topic: &Topic) -> bool {
        !topic.json
            && topic.family.qos() == Qos::AtLeastOnce
            && !matches!(
                topic.family,
                Family::Online | Family::Health | Family::Resend | Family::Resent
            )
    }

    pub(super) fn own_topic(&self, family: Family) -> Result<Topic, PublishError> {
        match self.config.node.role {
            role @ (Role::Host | Role::Cdu) => Ok(Topic::new(
                &self.config.site,
                role,
                &self.config.node.id,
                family,
            )),
            role => Err(PublishError::NoOwnTopics(role)),
        }
    }

    pub(super) fn next_frame(&self, message: Message, time: TimestampMs) -> Frame {
        Frame {
            sender: self.config.node.clone(),
            seq: self.status.take_seq(),
            time,
            message,
        }
    }

    pub(super) fn online_frame(&self, online: bool) -> Frame {
        self.next_frame(
            Message::Online(Online {
                online,
                software: Text::truncated(&self.config.software),
                started: self.started,
                clock: self.config.clock,
            }),
            now_ms(),
        )
    }

    /// The presence of the next connection attempt: its announcement,
    /// then its will, numbered in that order so the will is newer.
    pub(super) fn presence_pair(&self) -> PresencePair {
        let announce = self.online_frame(true);
        let will = self.online_frame(false);
        PresencePair { announce, will }
    }

    /// `frame` (presence) as a last will: retained, QoS 1, on our
    /// `online` topic, or on its JSON mirror when `json`.
    pub(super) fn will_of(&self, frame: &Frame, json: bool) -> Option<LastWill> {
        let publish = self.presence_publish(frame, json)?;
        Some(LastWill::new(
            publish.topic,
            publish.payload,
            QoS::AtLeastOnce,
            true,
        ))
    }

    /// Presence as the main connection publishes it: the frame, and its
    /// JSON mirror unless the presence connection keeps that
    /// (`json_presence`).
    pub(super) fn presence(&self, frame: &Frame) -> Vec<rumqttc::Publish> {
        let json = !self.config.json_presence;
        [Some(false), json.then_some(true)]
            .into_iter()
            .flatten()
            .filter_map(|json| self.presence_publish(frame, json))
            .collect()
    }

    /// A presence frame, or its JSON mirror when `json`, as a retained
    /// QoS 1 publish on our `online` topic (none for a node without one).
    pub(super) fn presence_publish(&self, frame: &Frame, json: bool) -> Option<rumqttc::Publish> {
        let topic = self.own_topic(Family::Online).ok()?;
        let (topic, payload) = if json {
            (topic.mirror(), frame.to_json().into_bytes())
        } else {
            (topic, frame.to_vec().ok()?)
        };
        let topic = topic.build().ok()?;
        Some(retained_publish(topic.as_str(), &payload))
    }
}

/// The presence of one connection attempt (see [`Node::presence_pair`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PresencePair {
    /// `online: true`, sent once connected.
    pub(super) announce: Frame,
    /// `online: false`, the connection's last will.
    pub(super) will: Frame,
}

/// A retained QoS 1 publish of `payload` on `topic`.
pub(super) fn retained_publish(topic: &str, payload: &[u8]) -> rumqttc::Publish {
    let mut p = rumqttc::Publish::new(topic, QoS::AtLeastOnce, payload.to_vec());
    p.retain = true;
    p
}

/// Whether `topic` is retained state the loop announces again (`health`,
/// frame or mirror; not presence, which is rebuilt).
pub(super) fn retained_state(topic: &Topic) -> bool {
    topic.family.retained() && topic.family != Family::Online
}

/// The MQTT client's QoS for the protocol's.
pub(super) fn qos_of(q: Qos) -> QoS {
    match q {
        Qos::AtMostOnce => QoS::AtMostOnce,
        Qos::AtLeastOnce => QoS::AtLeastOnce,
    }
}
