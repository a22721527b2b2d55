//! The run's figures from what its parts counted: every client's bus
//! counters, the observer's messages, the injections and the
//! controllers' cap episodes.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use super::observer::Heard;
use super::report::{percentile_censored_ms, FleetReport};
use super::{ctrl_bus, layout, Brokers, CduLayout, FleetConfig, Ran};
use crate::play::CapFigures;
use loopwarden_bus::MetricsSnapshot;

impl Ran {
    /// The report of the run.
    pub(super) fn report(
        &self,
        cfg: &FleetConfig,
        layouts: &[CduLayout],
        plan: &layout::FaultPlan,
        broker: &Brokers,
        heard: &Heard,
    ) -> FleetReport {
        let mut r = FleetReport {
            hosts: cfg.hosts,
            cdus: cfg.cdus,
            layout: layouts
                .iter()
                .map(|l| format!("{}x{}", l.racks, l.hosts_per_rack))
                .collect(),
            duration_s: cfg.duration_s,
            broker: broker.label.clone(),
            site: broker.site.to_string(),
            observer_broker: broker.observer.to_string(),
            agent_runtime_threads: cfg.agent_threads,
            agent_flash: if cfg.flash_in_memory {
                "memory"
            } else {
                "file"
            }
            .into(),
            ambient_c: cfg.ambient_c,
            agents_start_s: round2(self.agents_start_s),
            agent_cpu_cores: round3(self.agent_cpu_s / self.wall_s),
            agent_threads: self.agent_threads,
            cpu_cores_by_part: self
                .cpu_by_part_s
                .iter()
                .map(|(g, s)| (g.clone(), round3(s / self.wall_s)))
                .collect(),
            agent_rss_mib_per_host: round3(
                (self.rss_end_kib as f64 - self.rss_before_kib as f64) / 1024.0 / cfg.hosts as f64,
            ),
            rss_before_mib: round2(self.rss_before_kib as f64 / 1024.0),
            rss_end_mib: round2(self.rss_end_kib as f64 / 1024.0),
            load_avg_start: self.load_start,
            load_avg_end: self.load_end,
            shortfall_cdus: plan.shortfall.len(),
            agents_ended_early: self.agents_ended_early.clone(),
            controllers_ended_early: self.controllers_ended_early.clone(),
            ..Default::default()
        };
        self.frames(&mut r, heard);
        self.quarantines(&mut r, heard);
        self.caps(&mut r, layouts, plan);
        r
    }

    /// Every client's counters, by sender as the observer names them.
    fn senders(&self) -> HashMap<String, MetricsSnapshot> {
        self.agents
            .iter()
            .map(|(id, m)| (format!("host/{id}"), *m))
            .chain(
                self.controllers
                    .iter()
                    .map(|(id, c)| (format!("cdu/{id}"), ctrl_bus(c))),
            )
            .collect()
    }

    /// Messages published, received and lost.
    fn frames(&self, r: &mut FleetReport, heard: &Heard) {
        let senders = self.senders();
        let sum = |f: fn(&MetricsSnapshot) -> u64| senders.values().map(f).sum::<u64>();
        r.frames_published = sum(|m| m.published);
        r.qos1_published = sum(|m| m.published_qos1);
        r.client_dropped = [
            self.agents.iter().map(|(_, m)| m.dropped()).sum(),
            self.controllers
                .iter()
                .map(|(_, c)| ctrl_bus(c).dropped())
                .sum(),
        ];
        for (who, m) in senders.iter().map(|(s, m)| {
            let who = if s.starts_with("host/") {
                "agents"
            } else {
                "controllers"
            };
            (who, m)
        }) {
            for (kind, n) in [
                ("offline", m.dropped_offline),
                ("queue full", m.dropped_queue_full),
                ("offline overflow", m.dropped_offline_overflow),
                ("inbound full", m.dropped_inbound_full),
                ("outbox full", m.dropped_outbox),
                ("unacknowledged at stop", m.dropped_at_stop),
            ] {
                if n > 0 {
                    *r.client_drops_by_kind
                        .entry(format!("{who}: {kind}"))
                        .or_default() += n;
                }
            }
        }
        let errors = |m: &MetricsSnapshot| m.connection_errors;
        r.connection_errors = [
            self.agents.iter().map(|(_, m)| errors(m)).sum(),
            self.controllers
                .iter()
                .map(|(_, c)| errors(&ctrl_bus(c)))
                .sum(),
            heard.connection_errors,
        ];
        r.frames_received = heard.received;
        r.frames_undecodable = heard.undecodable;
        r.received_by_family = heard.by_family.clone();
        r.events_by_kind = heard.events.clone();
        r.frames_lost = r.frames_published as i64 - r.frames_received as i64;
        r.qos1_received = heard.received_qos1;
        r.qos1_not_received = r.qos1_published.saturating_sub(r.qos1_received);
        (r.events_acked, r.qos1_events_lost) = acked_events(&self.acked, heard);
        r.events_repaired = missing_events(&self.acked, heard)
            .filter(|(id, seq)| repaired(heard, id, *seq))
            .count() as u64;
        r.events_lost_after_repair = r.qos1_events_lost - r.events_repaired;
        (r.acks_acked, r.acks_not_delivered) = acked_events(&self.acks_acked, heard);
        r.resend_requests = heard.resend_requests;
        r.resend_requests_unsent = heard.resend_requests_unsent;
        r.resent_received = heard.resent_received;
        // A sender spends a sequence number on every frame it builds
        // (docs/bus.md §4.7): the wills of the announcements heard the
        // observer's track explains; what the sender dropped itself, and
        // the announcement and will of a presence connection that came
        // back on its own (sent as JSON only), its counters say.
        r.seq_gaps = heard
            .senders
            .iter()
            .map(|(s, t)| {
                let own = senders.get(s).map_or(0, |m| {
                    m.dropped_offline + m.dropped_queue_full + 2 * m.presence_renumbered
                });
                t.unexplained().saturating_sub(own)
            })
            .sum();
        r.duplicates = heard.senders.values().map(|t| t.duplicates()).sum();
    }

    /// XID → quarantined health at the observer.
    fn quarantines(&self, r: &mut FleetReport, heard: &Heard) {
        quarantine_figures(&self.injected, &heard.quarantined, r);
    }

    /// Cap step → each host's ack of the cap in force.
    fn caps(&self, r: &mut FleetReport, layouts: &[CduLayout], plan: &layout::FaultPlan) {
        let shortfall_hosts: Vec<String> = plan
            .shortfall
            .iter()
            .flat_map(|&c| layouts[c].host_ids.iter().cloned())
            .collect();
        cap_figures(&self.controllers, &self.caps_lost, &shortfall_hosts, r);
    }
}

/// XID → quarantined health: per GPU failed (`injected`, when), the
/// first health that showed it quarantined (`quarantined`, when). A GPU
/// heard quarantined before its failure (a quarantine restored from an
/// earlier run's flash) is no measure of this run: it is counted apart,
/// not as quarantined in 0 ms.
fn quarantine_figures(
    injected: &HashMap<(String, u8), Instant>,
    quarantined: &HashMap<(String, u8), Instant>,
    r: &mut FleetReport,
) {
    r.xids_injected = injected.len();
    let mut lat = Vec::new();
    for (key, at) in injected {
        match quarantined.get(key) {
            Some(q) if q < at => r.quarantined_before_injection += 1,
            Some(q) => lat.push(q.duration_since(*at).as_secs_f64()),
            None => {}
        }
    }
    r.quarantines = lat.len();
    r.other_quarantines = quarantined
        .keys()
        .filter(|k| !injected.contains_key(*k))
        .count();
    // Every GPU injected is in the percentiles: those not measured (never
    // heard quarantined, or before their failure) as the slowest.
    let missing = r.xids_injected - lat.len();
    r.quarantine_p50_ms = percentile_censored_ms(&lat, missing, 50.0);
    r.quarantine_p99_ms = percentile_censored_ms(&lat, missing, 99.0);
    r.quarantine_max_ms = percentile_censored_ms(&lat, missing, 100.0);
}

/// The caps figures of the controllers' cap watchers, by CDU: the hosts
/// any command capped, those of them that acknowledged a cap in force
/// (and by name those that never did), the ack latencies (one per host
/// capped in an episode, those never acked in it as the slowest); `lost`, the
/// CDUs whose watcher did not end, whose hosts are in none of them.
/// `shortfall_hosts`: the hosts of the CDUs in shortfall, those of them
/// never capped named.
fn cap_figures(
    controllers: &[(String, CapFigures)],
    lost: &[String],
    shortfall_hosts: &[String],
    r: &mut FleetReport,
) {
    let mut lat = Vec::new();
    let mut capped = BTreeSet::new();
    let mut acked = BTreeSet::new();
    // Caps never acknowledged in their episode, one per (episode, host).
    let mut missing = 0;
    for (_, c) in controllers {
        capped.extend(c.hosts_ever_capped.iter().cloned());
        for e in &c.episodes {
            for (h, s) in &e.host_ack_s {
                lat.push(*s);
                acked.insert(h.clone());
            }
            missing += e
                .hosts
                .iter()
                .filter(|h| !e.host_ack_s.iter().any(|(a, _)| a == *h))
                .count();
        }
    }
    r.shortfall_hosts = shortfall_hosts.len();
    r.shortfall_hosts_never_capped = shortfall_hosts
        .iter()
        .filter(|h| !capped.contains(*h))
        .cloned()
        .collect();
    r.hosts_capped = capped.len();
    r.hosts_caps_acked = capped.intersection(&acked).count();
    r.hosts_caps_never_acked = capped.difference(&acked).cloned().collect();
    r.cap_watchers_lost = lost.to_vec();
    r.controller_ack_gap_max_s = round2(
        controllers
            .iter()
            .map(|(_, c)| c.longest_ack_gap_s)
            .fold(0.0, f64::max),
    );
    r.controller_steps = controllers
        .iter()
        .map(|(_, c)| c.last.as_ref().map_or(0, |l| l.steps))
        .collect();
    // One sample per host capped in an episode: a cap its host never
    // acknowledged in that episode is in the percentiles, as the slowest
    // (a host that acked an earlier cap is no answer for a later one).
    r.caps_acked_p50_ms = percentile_censored_ms(&lat, missing, 50.0);
    r.caps_acked_p99_ms = percentile_censored_ms(&lat, missing, 99.0);
    r.caps_acked_max_ms = percentile_censored_ms(&lat, missing, 100.0);
}

/// The agents' events the broker acknowledged (`acked`: by host id, their
/// sequence numbers), and of them those the observer never received.
pub(super) fn acked_events(acked: &[(String, Vec<u32>)], heard: &Heard) -> (u64, u64) {
    let all = acked.iter().map(|(_, s)| s.len() as u64).sum();
    (all, missing_events(acked, heard).count() as u64)
}

/// Whether host `id`'s frame `seq` reached the observer only as resent.
pub(super) fn repaired(heard: &Heard, id: &str, seq: u32) -> bool {
    heard
        .senders
        .get(&format!("host/{id}"))
        .is_some_and(|t| t.repaired(seq))
}

/// The acknowledged events the observer received neither from the broker
/// nor as resent: host id and sequence number.
pub(super) fn unrepaired_events<'a>(
    acked: &'a [(String, Vec<u32>)],
    heard: &'a Heard,
) -> impl Iterator<Item = (&'a str, u32)> + 'a {
    missing_events(acked, heard).filter(|(id, seq)| !repaired(heard, id, *seq))
}

/// The acknowledged events the broker never delivered to the observer:
/// host id and sequence number.
pub(super) fn missing_events<'a>(
    acked: &'a [(String, Vec<u32>)],
    heard: &'a Heard,
) -> impl Iterator<Item = (&'a str, u32)> + 'a {
    acked.iter().flat_map(move |(id, seqs)| {
        let track = heard.senders.get(&format!("host/{id}"));
        seqs.iter()
            .filter(move |s| !track.is_some_and(|t| t.heard_qos1(**s)))
            .map(move |s| (id.as_str(), *s))
    })
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::play::CapEpisode;

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    /// Hosts a and b capped; c capped in a second episode; a and c
    /// acknowledge, b never does.
    fn two_episodes() -> CapFigures {
        CapFigures {
            peak_hosts_capped: 2,
            hosts_ever_capped: set(&["a", "b", "c"]),
            episodes: vec![
                CapEpisode {
                    hosts_capped: 2,
                    hosts: vec!["a".into(), "b".into()],
                    host_ack_s: vec![("a".into(), 0.4)],
                    ..Default::default()
                },
                CapEpisode {
                    hosts_capped: 1,
                    hosts: vec!["c".into()],
                    host_ack_s: vec![("c".into(), 0.6)],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn every_host_ever_capped_counts_and_a_silent_one_is_named() {
        let mut r = FleetReport::default();
        cap_figures(&[("cdu0".into(), two_episodes())], &[], &[], &mut r);
        assert_eq!((r.hosts_caps_acked, r.hosts_capped), (2, 3));
        assert_eq!(r.hosts_caps_never_acked, vec!["b".to_string()]);
        assert!(
            r.summary().contains("2/3 hosts acked, never acked: b"),
            "{}",
            r.summary()
        );
        // b acknowledges too: every capped host, not more.
        let mut all = two_episodes();
        all.episodes[0].host_ack_s.push(("b".into(), 0.5));
        let mut r = FleetReport::default();
        cap_figures(&[("cdu0".into(), all.clone())], &[], &[], &mut r);
        assert_eq!(r.caps_acked_max_ms, Some(600.0));
        let mut r = FleetReport::default();
        cap_figures(&[("cdu0".into(), all)], &[], &[], &mut r);
        assert_eq!((r.hosts_caps_acked, r.hosts_capped), (3, 3));
        assert!(r.hosts_caps_never_acked.is_empty());
    }

    #[test]
    fn a_silent_capped_host_and_an_uncapped_shortfall_host_leave_no_met_p99() {
        // Hosts a, b, c of a CDU in shortfall and d; a and c acked, b never,
        // d never capped.
        let mut r = FleetReport::default();
        let shortfall = ["a", "b", "c", "d"].map(String::from);
        cap_figures(&[("cdu0".into(), two_episodes())], &[], &shortfall, &mut r);
        assert_eq!(r.shortfall_hosts, 4);
        assert_eq!(r.shortfall_hosts_never_capped, vec!["d".to_string()]);
        assert_eq!(r.caps_acked_p50_ms, Some(600.0), "b counts as the slowest");
        assert_eq!((r.caps_acked_p99_ms, r.caps_acked_max_ms), (None, None));
        assert!(
            r.summary()
                .contains("of 4 hosts in shortfall never capped: d"),
            "{}",
            r.summary()
        );
        // An injected GPU never heard quarantined: the same.
        let t0 = Instant::now();
        let injected = HashMap::from([(("a".to_string(), 0u8), t0), (("b".to_string(), 1u8), t0)]);
        let heard = HashMap::from([(
            ("a".to_string(), 0u8),
            t0 + std::time::Duration::from_millis(40),
        )]);
        quarantine_figures(&injected, &heard, &mut r);
        assert_eq!(r.quarantine_p50_ms, Some(40.0));
        assert_eq!((r.quarantine_p99_ms, r.quarantine_max_ms), (None, None));
        assert!(r.summary().contains("1 not measured"), "{}", r.summary());
    }

    #[test]
    fn a_host_capped_again_and_silent_in_a_later_episode_leaves_no_met_p99() {
        // a and b capped and acked in the first episode; both capped again
        // in the second, where only a acks: b's second cap is unmeasured.
        let episode = |acks: &[(&str, f64)]| CapEpisode {
            hosts_capped: 2,
            hosts: vec!["a".into(), "b".into()],
            host_ack_s: acks.iter().map(|(h, s)| (h.to_string(), *s)).collect(),
            ..Default::default()
        };
        let caps = CapFigures {
            peak_hosts_capped: 2,
            hosts_ever_capped: set(&["a", "b"]),
            episodes: vec![episode(&[("a", 0.4), ("b", 0.5)]), episode(&[("a", 0.3)])],
            ..Default::default()
        };
        let mut r = FleetReport::default();
        cap_figures(&[("cdu0".into(), caps)], &[], &[], &mut r);
        assert_eq!((r.hosts_caps_acked, r.hosts_capped), (2, 2));
        assert_eq!(r.caps_acked_p50_ms, Some(400.0));
        assert_eq!(r.caps_acked_p99_ms, None, "b's second cap never acked");
        assert_eq!(r.caps_acked_max_ms, None);
    }

    #[test]
    fn a_lost_cap_watcher_is_counted_not_dropped() {
        let mut r = FleetReport::default();
        cap_figures(
            &[
                ("cdu0".into(), two_episodes()),
                ("cdu1".into(), CapFigures::default()),
            ],
            &["cdu1".to_string()],
            &[],
            &mut r,
        );
        assert_eq!(r.cap_watchers_lost, vec!["cdu1".to_string()]);
        assert!(
            r.summary().contains("cap watchers lost: cdu1"),
            "{}",
            r.summary()
        );
    }

    #[test]
    fn a_quarantine_heard_before_its_injection_is_no_0_ms_quarantine() {
        let t0 = Instant::now();
        let at = |ms| t0 + std::time::Duration::from_millis(ms);
        let key = |h: &str| (h.to_string(), 3u8);
        // a failed at 1 s, heard at 1.05 s; b failed at 2 s but heard
        // quarantined at 0.5 s (restored from an earlier run's flash).
        let injected = HashMap::from([(key("a"), at(1000)), (key("b"), at(2000))]);
        let quarantined = HashMap::from([(key("a"), at(1050)), (key("b"), at(500))]);
        let mut r = FleetReport::default();
        quarantine_figures(&injected, &quarantined, &mut r);
        assert_eq!(
            (
                r.xids_injected,
                r.quarantines,
                r.quarantined_before_injection
            ),
            (2, 1, 1)
        );
        // b is not measured: never 0 ms, and the slowest is unknown.
        assert_eq!(r.quarantine_p50_ms, Some(50.0));
        assert_eq!(r.quarantine_max_ms, None);
        assert!(
            r.summary()
                .contains("1 heard quarantined before their failure"),
            "{}",
            r.summary()
        );
    }
}
