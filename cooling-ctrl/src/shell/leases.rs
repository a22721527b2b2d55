//! Caps to hosts and what comes back: each lease the decision path says
//! is due ([`crate::decide::leases`]) signed and sent, and the host
//! telemetry (judged by [`crate::decide::hosts`]) and acks that come in
//! between steps. Readers' requests to resend, which come the same way,
//! go to the resender before anything here reads them.
use super::*;
use crate::decide::leases::Order;
use crate::decide::Verdict;
use loopwarden_protocol::message::{CapLease, HostTelemetry};

/// Why a lease was not sent.
#[derive(Debug)]
pub enum LeaseNotSent {
    /// It could not be signed.
    Sign(String),
    /// The bus did not take it.
    Publish(PublishError),
    /// Not signed nor stored: the bus is not connected, and a lease kept
    /// to go out at the reconnection would reach the host stale (its
    /// life runs from its stamp) and fill the outbox's part that never
    /// drops anything, ahead of a leak's event. The caller sends a fresh
    /// one once connected.
    Offline,
}

impl fmt::Display for LeaseNotSent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sign(e) => write!(f, "not signed: {e}"),
            Self::Publish(e) => write!(f, "not sent: {e}"),
            Self::Offline => write!(f, "held: the bus is not connected"),
        }
    }
}

/// Signs `lease` with `key` (its id, the key) for the `cmd` topic of
/// `host` of `site`, hands it to `bus` with the node's next sequence
/// number and logs it to the controller's flash through `recorder` (a
/// `lift` is the short lease that ends a cap). The frame as sent; nothing
/// while the bus is not connected ([`LeaseNotSent::Offline`]).
pub fn send_lease(
    bus: &Bus,
    recorder: &Recorder,
    (site, host): (&Ident, &Ident),
    lease: CapLease,
    lift: bool,
    (key_id, key): (u8, &SigningKey),
) -> Result<Frame, LeaseNotSent> {
    if !bus.is_connected() {
        return Err(LeaseNotSent::Offline);
    }
    let topic = Topic::new(site, Role::Host, host, Family::Cmd);
    let mut frame = bus.next_frame(Message::CapLease(lease), now_ms());
    frame
        .sign(&topic, key_id, key)
        .map_err(|e| LeaseNotSent::Sign(format!("{e:?}")))?;
    bus.publish_frame(&topic, &frame)
        .map_err(LeaseNotSent::Publish)?;
    let entry = Journal::Lease {
        host: host.clone(),
        frame: Box::new(frame.clone()),
        lift,
    };
    journal::record(recorder, &entry);
    Ok(frame)
}

/// The host telemetry `msg` carries, if it is a report of one of this
/// CDU's hosts (`index`: host id to its index, rack-major) sent by that
/// host on its own telemetry topic: the host's index and the report.
pub fn host_report<'a>(
    msg: &'a Inbound,
    index: &HashMap<Ident, usize>,
) -> Option<(usize, &'a HostTelemetry)> {
    match &msg.frame.message {
        Message::HostTelemetry(t)
            if msg.topic.family == Family::Telemetry && !msg.topic.json && from_topic_host(msg) =>
        {
            index.get(&msg.topic.node).map(|h| (*h, t))
        }
        _ => None,
    }
}

/// The frame's sender is the host whose topic carried it.
fn from_topic_host(msg: &Inbound) -> bool {
    msg.frame.sender.role == Role::Host && msg.frame.sender.id == msg.topic.node
}

impl<P: CduPort> Shell<P> {
    /// Signs and sends the lease of `o`; the frame when the bus took it.
    fn send_lease(&mut self, o: &Order) -> Option<Frame> {
        let host = self.cfg.hosts.get(o.host).cloned()?;
        let Some(key) = &self.cfg.key else {
            tracing::error!("cooling shell: no sign key: the lease for {host} is not sent");
            return None;
        };
        let to = (&self.cfg.site, &host);
        let signing = (self.cfg.key_id, key);
        let recorder = &self.keeping.recorder;
        match send_lease(&self.bus, recorder, to, o.lease.clone(), o.lift, signing) {
            Ok(frame) => Some(frame),
            Err(e @ LeaseNotSent::Sign(_)) => {
                tracing::error!("cooling shell: a lease for {host}: {e}");
                None
            }
            // Still due: sent fresh at the first step once connected.
            Err(LeaseNotSent::Offline) => {
                if !self.stats.leases_held_offline {
                    tracing::info!("cooling shell: the bus is down: leases are held, and sent fresh once it is back");
                }
                self.stats.leases_held_offline = true;
                None
            }
            Err(e) => {
                self.stats.publish_errors += 1;
                tracing::warn!("cooling shell: cap lease for {host} {e}");
                None
            }
        }
    }

    pub(super) fn leases(&mut self, now: u64, c: &Commands) {
        if self.bus.is_connected() {
            self.stats.leases_held_offline = false;
        }
        let hosts = self.cfg.hosts.len().min(c.caps.len());
        let due: Vec<_> = self.lease_book.due(now, &c.caps[..hosts]).collect();
        for o in due {
            if let Some(frame) = self.send_lease(&o) {
                let host = &self.cfg.hosts[o.host];
                match o.watts {
                    Some(w) if o.first => {
                        let reason = o.lease.reason.0;
                        tracing::info!(
                            "cooling shell: capping {host} at {w:.0} W per GPU ({reason})"
                        );
                    }
                    None => tracing::info!("cooling shell: lifting the cap of {host}"),
                    Some(_) => {}
                }
                self.lease_book.sent(&o, now);
                if o.lift {
                    self.stats.lifts_sent += 1;
                } else {
                    self.stats.leases_sent += 1;
                }
                self.stats.caps[o.host] = o.watts;
                self.stats.caps_sent[o.host] = o.watts.map(|_| CapSent {
                    seq: frame.seq,
                    until: frame.time.after(o.lease.duration),
                    refused: false,
                });
            }
        }
    }

    pub(super) fn on_inbound(&mut self, msg: Inbound) {
        // Readers' requests to resend go to the resender, unread here.
        if msg.topic.family == Family::Resend {
            self.resender.offer(msg);
            return;
        }
        if msg.topic.json {
            return;
        }
        if msg.topic.role == Role::Cdu {
            self.on_cdu_state(&msg);
            return;
        }
        if let Some((h, t)) = host_report(&msg, &self.index) {
            self.on_host_report(h, t, &msg);
            return;
        }
        let sender_ok = from_topic_host(&msg);
        match (&msg.frame.message, msg.topic.family) {
            (Message::Ack(a), Family::Ack) if sender_ok && a.correlation.from == self.me => {
                if self.index.contains_key(&msg.topic.node) {
                    self.on_ack(msg.topic.node.as_str(), a);
                } else {
                    self.foreign_ack(msg.topic.node.as_str());
                }
            }
            _ => {}
        }
    }

    /// A report of host `h` as `msg` carried it, judged by the decision
    /// path.
    fn on_host_report(&mut self, h: usize, t: &HostTelemetry, msg: &Inbound) {
        let at = (self.now_ms(), now_ms());
        let host = msg.topic.node.as_str();
        match self.decider.hear_telemetry(h, t, msg.frame.time, at) {
            Verdict::Believed => self.stats.host_reports += 1,
            Verdict::BelievedWithout { why, new } => {
                self.stats.host_reports += 1;
                self.stats.host_gpus_left_out += 1;
                if new {
                    tracing::warn!("cooling shell: a report of {host} counts without: {why}");
                }
            }
            Verdict::Refused { why, new } => {
                self.stats.host_reports_refused += 1;
                if new {
                    tracing::warn!("cooling shell: a report of {host} is not believed: {why}");
                }
                return;
            }
            Verdict::Unknown => return,
        }
        if let Some(slot) = self.stats.heard.get_mut(h) {
            *slot = Some(now_ms());
        }
    }

    /// An ack naming this CDU's command from a host that is not one of
    /// its hosts: counted and dropped, never kept (the per-host maps hold
    /// this CDU's hosts only, whatever the rest of the site sends). The
    /// first is a warning, the rest debug lines.
    fn foreign_ack(&mut self, host: &str) {
        self.stats.acks_foreign += 1;
        if self.stats.acks_foreign == 1 {
            tracing::warn!(
                "cooling shell: {host} acks a command of this CDU but is not among its hosts: \
                 dropped (every such ack is counted in acks_foreign; the next ones are logged at debug)"
            );
        } else {
            tracing::debug!(
                "cooling shell: an ack from {host}, not among this CDU's hosts, dropped"
            );
        }
    }

    fn on_ack(&mut self, host: &str, a: &Ack) {
        // An ack delivered again (the bus delivers at least once), or one
        // that answers a lease older than the last answered: the host has
        // said since what is in force, so it counts once, and never over
        // a newer answer.
        let seq = a.correlation.seq;
        if self.stats.last_ack.get(host).is_some_and(|l| l.seq >= seq) {
            tracing::debug!(
                "cooling shell: {host}'s ack to lease seq {seq} again, or after a newer one: counted already"
            );
            return;
        }
        self.stats.acks += 1;
        match ack_kind(a) {
            AckKind::Taken => {
                self.stats.acks_ok += 1;
                self.shortened.remove(host);
            }
            AckKind::Shortened => {
                self.stats.acks_shortened += 1;
                // Said once a host, until it takes a lease whole again.
                if self.shortened.insert(host.to_string()) {
                    tracing::warn!(
                        "cooling shell: {host} took lease seq {} for less time than asked ({}): \
                         this controller renews a lease every {} ms, so that host's caps lapse \
                         between renewals where its max_lease_ms is shorter; raise its \
                         max_lease_ms to this controller's lease_ms ({} ms)",
                        a.correlation.seq,
                        a.detail.as_str(),
                        self.cfg.lease.as_millis() / 3,
                        self.cfg.lease.as_millis()
                    );
                }
            }
            AckKind::Refused(code) => {
                self.stats.acks_refused += 1;
                tracing::warn!(
                    "cooling shell: {host} refused lease seq {}: {code:?} {}",
                    a.correlation.seq,
                    a.detail.as_str()
                );
                self.stats.last_refusal =
                    Some((host.to_string(), code, a.detail.as_str().to_string()));
            }
        }
        if let Some(h) = self.cfg.hosts.iter().position(|h| h.as_str() == host) {
            if let Some(sent) = self.stats.caps_sent.get_mut(h) {
                answered(sent, a);
            }
        }
        self.stats
            .in_force
            .insert(host.to_string(), a.in_force.iter().copied().collect());
        self.stats.last_ack.insert(
            host.to_string(),
            LastAck {
                at: now_ms(),
                seq: a.correlation.seq,
                code: a.code,
                detail: a.detail.as_str().to_string(),
            },
        );
        self.report();
    }
}

/// The cap lease last sent to a host (`sent`) as its ack `a` leaves it:
/// refused when `a` refuses that very lease (an ack of an older one says
/// nothing of it).
fn answered(sent: &mut Option<CapSent>, a: &Ack) {
    if let Some(s) = sent.as_mut() {
        if s.seq == a.correlation.seq && matches!(ack_kind(a), AckKind::Refused(_)) {
            s.refused = true;
        }
    }
}

/// How an ack of a lease counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AckKind {
    /// Taken as sent (`ok`, or `clamped` with a cap raised to a GPU's
    /// minimum).
    Taken,
    /// Taken for less time than it asked (`clamped`, the host's
    /// `max_lease_ms` below the lease): its caps lapse before the renewal.
    Shortened,
    /// Refused, with its code.
    Refused(AckCode),
}

fn ack_kind(a: &Ack) -> AckKind {
    match a.code {
        AckCode::Ok => AckKind::Taken,
        AckCode::Clamped
            if a.detail
                .as_str()
                .starts_with(loopwarden_protocol::LEASE_SHORTENED) =>
        {
            AckKind::Shortened
        }
        AckCode::Clamped => AckKind::Taken,
        code => AckKind::Refused(code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::message::Correlation;

    fn ack(code: AckCode, detail: &str) -> Ack {
        Ack {
            correlation: Correlation {
                from: NodeId::new(Role::Cdu, "c").unwrap(),
                seq: 1,
            },
            code,
            in_force: heapless::Vec::new(),
            detail: loopwarden_protocol::Text::truncated(detail),
        }
    }

    #[test]
    fn a_host_that_refused_its_cap_or_whose_lease_lapsed_is_not_counted_capped() {
        let now = TimestampMs(1_000_000);
        let mut st = ShellStats {
            caps: vec![Some(300.0), None],
            caps_sent: vec![
                Some(CapSent {
                    seq: 1,
                    until: now.after(loopwarden_protocol::units::DurationMs(30_000)),
                    refused: false,
                }),
                None,
            ],
            ..Default::default()
        };
        assert_eq!(st.hosts_capped(now), 1);
        // An ack of another lease says nothing of this one.
        let mut other = ack(AckCode::TooMany, "");
        other.correlation.seq = 0;
        answered(&mut st.caps_sent[0], &other);
        assert_eq!(st.hosts_capped(now), 1);
        // Taken: still capped; its life runs out unrenewed: not.
        answered(&mut st.caps_sent[0], &ack(AckCode::Ok, ""));
        assert_eq!(st.hosts_capped(now), 1);
        assert_eq!(st.hosts_capped(TimestampMs(now.0 + 30_000)), 0);
        // The host refuses it: not capped.
        answered(
            &mut st.caps_sent[0],
            &ack(AckCode::Forbidden, "not allowed"),
        );
        assert_eq!(st.hosts_capped(now), 0);
    }

    /// A lease a host took for less time than asked is told from one
    /// taken whole and from a refusal.
    #[test]
    fn a_lease_taken_shortened_counts_apart_from_taken_and_refused() {
        assert_eq!(ack_kind(&ack(AckCode::Ok, "")), AckKind::Taken);
        let min = "GPU 6: 150 W is below its minimum 200 W; clamped to 200 W";
        assert_eq!(ack_kind(&ack(AckCode::Clamped, min)), AckKind::Taken);
        let short = "shortened from 30000 to 5000 ms, this host's longest lease";
        assert_eq!(ack_kind(&ack(AckCode::Clamped, short)), AckKind::Shortened);
        assert_eq!(
            ack_kind(&ack(AckCode::TooMany, "")),
            AckKind::Refused(AckCode::TooMany)
        );
    }
}
