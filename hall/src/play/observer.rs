//! The observer: the run's own bus client (role facility, `hall-run`),
//! which hears what a facility system would and tallies it in the
//! [`PlayOutcome`](super::PlayOutcome) (hosts and CDU heard, the lowest
//! power limit of each host, quarantines, racks declared lost, hosts
//! powered down, events in words), and tells the hall what the agents did,
//! so that hosts follow their agents (`docs/plant-model.md` §2.6); and the
//! watcher of the controller's counters ([`ShellStats`]), which tallies
//! cap leases into [`CapFigures`].
//!
//! Glossary:
//! - *cap episode*: from the controller step whose commands first hold a
//!   cap (none before) to the step whose commands hold none again.
//! - *capped* (an ack, a telemetry frame): some GPU's limit in force is
//!   more than 1 W below the TDP.
//! - *in force*: the caps a host's ack says it applies.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cooling_ctrl::shell::ShellStats;
use loopwarden_bus::{BrokerAddr, Bus, BusConfig, BusTask, Inbound};
use loopwarden_protocol::message::{
    CduState, Event, HealthState, HostHealth, HostTelemetry, RackCooling,
};
use loopwarden_protocol::{CoolingStep, Ident, Message, NodeId, Role};
use loopwarden_twin::hall::Hall;
use tokio::sync::{mpsc, watch};

use super::{CapEpisode, CapFigures, Live, PlayError};

/// The observer: what a facility system sees, and hosts following their
/// agents.
pub(super) fn start_observer(
    broker: &BrokerAddr,
    site: &Ident,
    tls: Option<loopwarden_bus::tls::Tls>,
) -> Result<(Bus, mpsc::Receiver<Inbound>, BusTask), PlayError> {
    let mut bc = BusConfig::new(
        broker.clone(),
        site.clone(),
        NodeId::new(Role::Facility, "hall-run")
            .map_err(|e| PlayError::Start(format!("observer id: {e}")))?,
    );
    bc.subscriptions = vec![loopwarden_bus::site_filter(site)];
    bc.inbound_capacity = 4096;
    bc.tls = tls;
    Ok(Bus::start(bc))
}

/// What the play loop hears from the observer's bus client, tallied in
/// the run's outcome.
impl Live<'_> {
    /// One frame from the bus, heard at simulated time `t`.
    pub(super) fn hear(&mut self, msg: &Inbound, t: f64) {
        let node = msg.topic.node.to_string();
        match &msg.frame.message {
            Message::HostTelemetry(ht) => self.host_telemetry(node, ht),
            Message::CduTelemetry(_) => self.out.cdu_heard = true,
            Message::HostHealth(hh) => self.host_health(&node, hh, t),
            Message::CduState(st) => self.cdu_state(st, t),
            Message::Event(e @ Event::CoolingAction { step, ok, .. }) => {
                self.out.events.push(format!("t={t:.0}s {node}: {e}"));
                self.cooling_action(&node, *step, *ok)
            }
            Message::Event(e) if e.needs_attention() => {
                self.out.events.push(format!("t={t:.0}s {node}: {e}"));
            }
            _ => {}
        }
    }

    /// A host's telemetry: the lowest power limit in force, and whether it
    /// shows a cap.
    fn host_telemetry(&mut self, node: String, ht: &HostTelemetry) {
        let out = &mut self.out;
        out.hosts_heard.insert(node.clone());
        let lowest = ht
            .gpus
            .iter()
            .map(|g| f64::from(g.power_limit.0))
            .fold(f64::INFINITY, f64::min);
        let capped = lowest < self.sc.site.gpu.tdp_w - 1.0;
        if lowest.is_finite() {
            out.limits_at_end.insert(node.clone(), lowest);
        }
        self.caps_in_force.insert(node, capped);
        out.peak_hosts_capped_telemetry = out
            .peak_hosts_capped_telemetry
            .max(self.caps_in_force.values().filter(|c| **c).count());
    }

    /// A host's health: the hall drains the GPUs its agent quarantined,
    /// and gives work again to those it released.
    fn host_health(&mut self, node: &str, hh: &HostHealth, t: f64) {
        let per_host = self.sc.site.gpus_per_host;
        let Some(h) = self.host_ids.iter().position(|x| *x == node) else {
            return;
        };
        for g in &hh.gpus {
            let i = h * per_host + g.gpu.get() as usize;
            let gpu = g.gpu.get();
            if g.state != HealthState::Quarantined {
                if self.quarantined_now.remove(&i) {
                    self.sim.hall.lock().expect("hall lock").released(i);
                    self.out
                        .events
                        .push(format!("t={t:.0}s {node}: GPU {gpu} released"));
                }
                continue;
            }
            if self.quarantined_now.insert(i) {
                self.out.quarantined.insert(i);
                self.sim.hall.lock().expect("hall lock").quarantined(i);
                self.out
                    .events
                    .push(format!("t={t:.0}s {node}: GPU {gpu} quarantined"));
            }
        }
    }

    /// A host's agent ran a cooling-loss command: the simulated host
    /// follows what it did (a power-down that failed leaves it running).
    fn cooling_action(&mut self, node: &str, step: CoolingStep, ok: bool) {
        let Some(h) = self.host_ids.iter().position(|x| *x == node) else {
            return;
        };
        let mut hall = self.sim.hall.lock().expect("hall lock");
        match step {
            CoolingStep::PowerDown if ok => {
                hall.host_powered_down(h);
                self.out.hosts_powered_down.insert(node.to_string());
            }
            CoolingStep::PowerUp | CoolingStep::Resume => hall.host_restored(h),
            _ => {}
        }
    }

    /// The CDU's state: which racks it declared lost (their hosts' agents
    /// act on it; the hall follows the agents).
    fn cdu_state(&mut self, st: &CduState, t: f64) {
        for r in &st.racks {
            let rack = r.rack.get() as usize;
            let lost = r.cooling == RackCooling::Lost;
            if lost && self.out.racks_lost.insert(rack) {
                self.out
                    .events
                    .push(format!("t={t:.0}s cdu1: rack {rack} cooling lost"));
            }
        }
    }
}

/// Follows the controller's counters until the controller stops: caps in
/// its commands, acks with a cap in force, and the cap episodes.
pub(crate) async fn watch_caps(
    mut rx: watch::Receiver<ShellStats>,
    start: Instant,
    hall: Arc<Mutex<Hall>>,
    hosts: Vec<String>,
    tdp_w: f64,
) -> CapFigures {
    let mut f = CapFigures::default();
    let mut episode: Option<CapEpisode> = None;
    // Per host, in the episode: when first capped, and whether its ack
    // then already showed a cap (an older ack: wait for a new one).
    let mut capped_at: Vec<Option<(Instant, bool)>> = vec![None; hosts.len()];
    let mut acked: Vec<bool> = vec![false; hosts.len()];
    let mut last_ack_at: Option<Instant> = None;
    let mut last_in_force: BTreeMap<String, Vec<loopwarden_protocol::message::GpuCap>> =
        BTreeMap::new();
    let capped_ack = |caps: &[loopwarden_protocol::message::GpuCap]| {
        caps.iter().any(|c| f64::from(c.limit.0) < tdp_w - 1.0)
    };
    while rx.changed().await.is_ok() {
        let now = Instant::now();
        let st = rx.borrow_and_update().clone();
        let wall = (now - start).as_secs_f64();
        for (h, caps) in &st.in_force {
            if capped_ack(caps) {
                f.hosts_acked_capped.insert(h.clone());
            }
        }
        let in_cmds: Vec<bool> = (0..hosts.len())
            .map(|h| {
                st.last
                    .as_ref()
                    .and_then(|c| c.caps.get(h).copied().flatten())
                    .is_some()
            })
            .collect();
        let n = in_cmds.iter().filter(|c| **c).count();
        for (id, _) in hosts.iter().zip(&in_cmds).filter(|(_, c)| **c) {
            f.hosts_ever_capped.insert(id.clone());
        }
        f.peak_hosts_capped = f.peak_hosts_capped.max(n);
        if n > 0 && episode.is_none() {
            let t = hall.lock().map(|h| h.time_s()).unwrap_or(0.0);
            episode = Some(CapEpisode {
                start_wall_s: wall,
                start_t_s: t,
                ..Default::default()
            });
            capped_at.iter_mut().for_each(|c| *c = None);
            acked.iter_mut().for_each(|a| *a = false);
        }
        if let Some(e) = episode.as_mut() {
            e.hosts_capped = e.hosts_capped.max(n);
            if n == hosts.len() && e.all_capped_after_s.is_none() {
                e.all_capped_after_s = Some(wall - e.start_wall_s);
            }
            for (h, id) in hosts.iter().enumerate() {
                let ack = st.in_force.get(id);
                let ack_capped = ack.is_some_and(|c| capped_ack(c));
                if in_cmds[h] && capped_at[h].is_none() {
                    capped_at[h] = Some((now, ack_capped));
                    e.hosts.push(id.clone());
                }
                let Some((at, stale)) = capped_at[h] else {
                    continue;
                };
                // An ack that was already capped when the host was capped
                // counts once the host's in-force list changes.
                let fresh = !stale || last_in_force.get(id) != ack;
                if !acked[h] && ack_capped && fresh && (at != now || !stale) {
                    acked[h] = true;
                    e.host_ack_s.push((id.clone(), (now - at).as_secs_f64()));
                }
            }
            if e.all_acked_after_s.is_none() && acked.iter().all(|a| *a) {
                e.all_acked_after_s = Some(wall - e.start_wall_s);
            }
            if n == 0 {
                e.end_wall_s = Some(wall);
                f.episodes.extend(episode.take());
            }
        }
        let acks_before = f.last.as_ref().map_or(0, |l| l.acks);
        if n == 0 {
            last_ack_at = None;
        } else if st.acks > acks_before {
            if let Some(t) = last_ack_at {
                f.longest_ack_gap_s = f.longest_ack_gap_s.max((now - t).as_secs_f64());
            }
            last_ack_at = Some(now);
        }
        last_in_force = st.in_force.clone();
        f.last = Some(st);
    }
    f.episodes.extend(episode);
    if let Some(st) = &f.last {
        for (h, id) in hosts.iter().enumerate() {
            if st
                .last
                .as_ref()
                .and_then(|c| c.caps.get(h).copied().flatten())
                .is_some()
            {
                f.capped_at_end.insert(id.clone());
            }
            if st.in_force.get(id).is_some_and(|c| capped_ack(c)) {
                f.acked_capped_at_end.insert(id.clone());
            }
        }
    }
    f
}
