//! What the handle and the event loop share: the configuration, the
//! sequence counter, the delivery bookkeeping (what is pending, in flight,
//! deferred to the outbox), the connection flags and the counters, the
//! node's latest retained state; and the frames built from them (presence,
//! the last will).
//!
//! Glossary:
//! - *retained state*: the latest frame (and JSON mirror) the node put on
//!   a retained family other than `online` (`health`); the bus announces it
//!   again, after presence, on every re-connection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use loopwarden_protocol::{Family, Frame, Message, Online, Qos, Role, Text, TimestampMs, Topic};
use rumqttc::{LastWill, MqttOptions, QoS};

use super::presence::Control;
use super::{now_ms, PublishError, MAX_INFLIGHT};
use crate::config::{BrokerAddr, BusConfig};
use crate::durable::Delivery;
use crate::metrics::Metrics;

/// The state behind every clone of the handle and the task.
pub(super) struct Shared {
    pub(super) config: BusConfig,
    pub(super) started: TimestampMs,
    pub(super) seq: AtomicU32,
    pub(super) metrics: Metrics,
    pub(super) connected: AtomicBool,
    /// The index in `config.broker` of the broker in use (connected, or
    /// tried next).
    pub(super) broker: AtomicUsize,
    pub(super) delivery: Mutex<Delivery>,
    /// Nothing handed over is waiting for the broker (kept by the task).
    pub(super) settled: AtomicBool,
    /// `shutdown` was called: do not reconnect.
    pub(super) shutting_down: AtomicBool,
    /// The latest retained state by topic name (see the glossary).
    pub(super) retained: Mutex<BTreeMap<String, Vec<u8>>>,
    /// Retained-state topics whose latest value the client's queue had no
    /// room for: the task hands them over itself at its next event (a
    /// quarantine must reach the broker, not wait for the next change).
    pub(super) retained_unsent: Mutex<BTreeSet<String>>,
    /// Taken around storing a durable frame and handing it over, so they
    /// go out in sequence order while the delivery lock is free during
    /// the flash write.
    pub(super) durable_order: Mutex<()>,
    /// What the presence connection should do (with `json_presence`, for
    /// a node that owns an `online` topic).
    pub(super) presence: Option<Control>,
}

impl Shared {
    pub(super) fn delivery(&self) -> MutexGuard<'_, Delivery> {
        // A panic while holding the lock leaves the bookkeeping as it was;
        // go on with it rather than stop delivering.
        self.delivery.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The broker in use.
    pub(super) fn broker(&self) -> &BrokerAddr {
        self.config.broker.get(self.broker.load(Ordering::Relaxed))
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
        options.set_max_packet_size(64 * 1024, 64 * 1024);
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

    /// Whether a frame on `topic` goes through the outbox.
    /// Frames that go through the outbox. Not the retained state families
    /// (`online`, `health`): only their latest value matters, the bus
    /// announces it again on every re-connection (see `retained_state`),
    /// and a decision must not wait behind a flash write to reach the
    /// broker.
    pub(super) fn durable(&self, topic: &Topic) -> bool {
        !topic.json
            && topic.family.qos() == Qos::AtLeastOnce
            && !matches!(topic.family, Family::Online | Family::Health)
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
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
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

    /// Keeps `payload` as the latest retained state on `topic` when its
    /// family is retained state (not presence, which is rebuilt).
    pub(super) fn remember_retained(&self, topic: &Topic, name: &str, payload: &[u8]) {
        if topic.family.retained() && topic.family != Family::Online {
            let mut kept = self.retained.lock().unwrap_or_else(|e| e.into_inner());
            kept.insert(name.to_string(), payload.to_vec());
        }
    }

    /// The latest retained state, to announce again after a re-connection.
    pub(super) fn retained_state(&self) -> Vec<rumqttc::Publish> {
        self.unsent_retained().clear();
        let kept = self.retained.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter().map(|(t, p)| retained_publish(t, p)).collect()
    }

    fn unsent_retained(&self) -> MutexGuard<'_, BTreeSet<String>> {
        self.retained_unsent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that the latest retained state on `name` was (`true`) or was
    /// not (`false`) handed to the client.
    pub(super) fn retained_handed(&self, name: &str, handed: bool) {
        let mut unsent = self.unsent_retained();
        if handed {
            unsent.remove(name);
        } else {
            unsent.insert(name.to_string());
        }
    }

    /// The latest retained state of the topics the client's queue had no
    /// room for, taken from the list.
    pub(super) fn take_unsent_retained(&self) -> Vec<rumqttc::Publish> {
        let names = std::mem::take(&mut *self.unsent_retained());
        if names.is_empty() {
            return Vec::new();
        }
        let kept = self.retained.lock().unwrap_or_else(|e| e.into_inner());
        names
            .iter()
            .filter_map(|n| kept.get(n).map(|p| retained_publish(n, p)))
            .collect()
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

/// The presence of one connection attempt (see [`Shared::presence_pair`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PresencePair {
    /// `online: true`, sent once connected.
    pub(super) announce: Frame,
    /// `online: false`, the connection's last will.
    pub(super) will: Frame,
}

/// A retained QoS 1 publish of `payload` on `topic`.
fn retained_publish(topic: &str, payload: &[u8]) -> rumqttc::Publish {
    let mut p = rumqttc::Publish::new(topic, QoS::AtLeastOnce, payload.to_vec());
    p.retain = true;
    p
}
