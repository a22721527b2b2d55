//! Caps to hosts and what comes back: a signed lease for each host the
//! core caps (renewed, moved, lifted), and the host telemetry and acks
//! that come in between steps.
//!
//! Glossary:
//! - *lease*: a power cap that holds for its duration from the frame's
//!   timestamp unless renewed.
//! - *lift*: the short lease at TDP sent when a cap ends.
use super::*;

/// What was last sent to one host.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LeaseSent {
    /// The cap, W (`None`: not capped, or lifted).
    pub(super) watts: Option<f32>,
    /// When, shell ms.
    pub(super) at_ms: u64,
}

impl<P: CduPort> Shell<P> {
    /// Signs and sends a lease to host `h`; true when the bus took it.
    fn send_lease(&mut self, h: usize, lease: CapLease, lift: bool) -> bool {
        let Some(host) = self.cfg.hosts.get(h).cloned() else {
            return false;
        };
        let topic = Topic::new(&self.cfg.site, Role::Host, &host, Family::Cmd);
        let Some(key) = &self.cfg.key else {
            tracing::error!("cooling shell: no sign key: the lease for {host} is not sent");
            return false;
        };
        let mut frame = self.bus.next_frame(Message::CapLease(lease), now_ms());
        if let Err(e) = frame.sign(&topic, self.cfg.key_id, key) {
            tracing::error!("cooling shell: signing a lease for {host}: {e:?}");
            return false;
        }
        match self.bus.publish_frame(&topic, &frame) {
            Ok(()) => {
                self.journal(Journal::Lease {
                    host,
                    frame: Box::new(frame),
                    lift,
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
        let renew_ms = (self.cfg.lease.as_millis() / 3) as u64;
        let tdp = self.cfg.core.gpu.tdp_w;
        for h in 0..self.cfg.hosts.len().min(self.sent.len()) {
            let sent = self.sent[h];
            let id = h as u32 + 1;
            match (c.caps[h], sent.watts) {
                (Some(cap), prev) => {
                    let due = match prev {
                        None => true,
                        Some(w) => {
                            (cap.watts - w).abs() >= CAP_RESEND_W
                                || now.saturating_sub(sent.at_ms) >= renew_ms
                        }
                    };
                    if due {
                        let lease = cap_lease(id, cap.reason, cap.watts, self.cfg.lease);
                        if self.send_lease(h, lease, false) {
                            if prev.is_none() {
                                tracing::info!(
                                    "cooling shell: capping {} at {:.0} W per GPU ({})",
                                    self.cfg.hosts[h],
                                    cap.watts,
                                    cap.reason.0
                                );
                            }
                            self.sent[h] = LeaseSent {
                                watts: Some(cap.watts),
                                at_ms: now,
                            };
                            self.stats.leases_sent += 1;
                            self.stats.caps[h] = Some(cap.watts);
                        }
                    }
                }
                (None, Some(_)) => {
                    let lease = cap_lease(id, ReasonCode::OK, tdp, LIFT_DURATION);
                    if self.send_lease(h, lease, true) {
                        tracing::info!("cooling shell: lifting the cap of {}", self.cfg.hosts[h]);
                        self.sent[h] = LeaseSent {
                            watts: None,
                            at_ms: now,
                        };
                        self.stats.lifts_sent += 1;
                        self.stats.caps[h] = None;
                    }
                }
                (None, None) => {}
            }
        }
    }

    pub(super) fn on_inbound(&mut self, msg: Inbound) {
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
                let at = self.now_ms();
                let tdp = self.cfg.core.gpu.tdp_w;
                if let Some(why) = implausible(t, msg.frame.time, now_ms(), self.supply_c, tdp) {
                    self.stats.host_reports_refused += 1;
                    let host = msg.topic.node.as_str();
                    if self.refused.get(&h) != Some(&why) {
                        tracing::warn!("cooling shell: a report of {host} is not believed: {why}");
                        self.refused.insert(h, why);
                    }
                    return;
                }
                self.refused.remove(&h);
                if let Some(slot) = self.reports.get_mut(h) {
                    *slot = Some(host_report(t, at));
                    self.stats.host_reports += 1;
                }
                if let Some(slot) = self.stats.heard.get_mut(h) {
                    *slot = Some(now_ms());
                }
            }
            (Message::Ack(a), Family::Ack) if sender_ok && a.correlation.from == self.me => {
                self.on_ack(msg.topic.node.as_str(), a);
            }
            _ => {}
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
