//! Caps to hosts and what comes back: each lease the decision path says
//! is due ([`crate::decide::leases`]) signed and sent, and the host
//! telemetry (judged by [`crate::decide::hosts`]) and acks that come in
//! between steps. Readers' requests to resend, which come the same way,
//! go to the resender before anything here reads them.
use super::*;
use crate::decide::leases::Order;
use crate::decide::Verdict;

impl<P: CduPort> Shell<P> {
    /// Signs and sends the lease of `o`; true when the bus took it.
    fn send_lease(&mut self, o: &Order) -> bool {
        let Some(host) = self.cfg.hosts.get(o.host).cloned() else {
            return false;
        };
        let topic = Topic::new(&self.cfg.site, Role::Host, &host, Family::Cmd);
        let Some(key) = &self.cfg.key else {
            tracing::error!("cooling shell: no sign key: the lease for {host} is not sent");
            return false;
        };
        let mut frame = self
            .bus
            .next_frame(Message::CapLease(o.lease.clone()), now_ms());
        if let Err(e) = frame.sign(&topic, self.cfg.key_id, key) {
            tracing::error!("cooling shell: signing a lease for {host}: {e:?}");
            return false;
        }
        match self.bus.publish_frame(&topic, &frame) {
            Ok(()) => {
                self.journal(Journal::Lease {
                    host,
                    frame: Box::new(frame),
                    lift: o.lift,
                });
                true
            }
            Err(e) => {
                self.stats.publish_errors += 1;
                tracing::warn!("cooling shell: cap lease for {host} not sent: {e}");
                false
            }
        }
    }

    pub(super) fn leases(&mut self, now: u64, c: &Commands) {
        let hosts = self.cfg.hosts.len().min(c.caps.len());
        let due: Vec<_> = self.lease_book.due(now, &c.caps[..hosts]).collect();
        for o in due {
            if self.send_lease(&o) {
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
        let sender_ok =
            msg.frame.sender.role == Role::Host && msg.frame.sender.id == msg.topic.node;
        match (&msg.frame.message, msg.topic.family) {
            (Message::HostTelemetry(t), Family::Telemetry) if sender_ok => {
                let Some(&h) = self.index.get(&msg.topic.node) else {
                    return;
                };
                let at = (self.now_ms(), now_ms());
                match self.decider.hear_telemetry(h, t, msg.frame.time, at) {
                    Verdict::Believed => self.stats.host_reports += 1,
                    Verdict::BelievedWithout { why, new } => {
                        self.stats.host_reports += 1;
                        self.stats.host_gpus_left_out += 1;
                        if new {
                            let host = msg.topic.node.as_str();
                            tracing::warn!(
                                "cooling shell: a report of {host} counts without: {why}"
                            );
                        }
                    }
                    Verdict::Refused { why, new } => {
                        self.stats.host_reports_refused += 1;
                        if new {
                            let host = msg.topic.node.as_str();
                            tracing::warn!(
                                "cooling shell: a report of {host} is not believed: {why}"
                            );
                        }
                        return;
                    }
                    Verdict::Unknown => return,
                }
                if let Some(slot) = self.stats.heard.get_mut(h) {
                    *slot = Some(now_ms());
                }
            }
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
        self.stats.acks += 1;
        match a.code {
            AckCode::Ok | AckCode::Clamped => self.stats.acks_ok += 1,
            code => {
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
