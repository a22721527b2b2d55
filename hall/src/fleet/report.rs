//! The fleet run's figures: one JSON object (`--json`) or a short summary
//! for people. How each figure is measured is in `docs/scale.md`.

use serde::Serialize;

/// Nearest-rank percentile `p` (0–100) of `measured` and `missing` more that
/// were never measured (each at least as slow as any measured: they did
/// not happen within the run), ms; `None` when the rank falls among the
/// missing, or there is none.
pub fn percentile_censored_ms(measured: &[f64], missing: usize, p: f64) -> Option<f64> {
    let n = measured.len() + missing;
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    if n == 0 || rank > measured.len() {
        return None;
    }
    let mut s = measured.to_vec();
    s.sort_by(f64::total_cmp);
    Some((1000.0 * s[rank.max(1) - 1] * 10.0).round() / 10.0)
}

/// What a fleet run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FleetReport {
    /// Host agents.
    pub hosts: usize,
    /// Cooling controllers (one simulated CDU and hall each).
    pub cdus: usize,
    /// Each CDU's layout, `racks x hosts per rack`.
    pub layout: Vec<String>,
    /// Wall seconds the halls ran, after every agent was connected.
    pub duration_s: u64,
    /// The brokers given (`embedded` when none).
    pub broker: String,
    /// The site name the run used (fresh for each run): its tree is
    /// `dc/v2/<site>/…`.
    pub site: String,
    /// The observer's broker.
    pub observer_broker: String,
    /// Threads the agents' shared runtime ran on.
    pub agent_runtime_threads: usize,
    /// Where the agents' flash was: `file` (one each) or `memory`.
    pub agent_flash: String,
    /// The halls' outdoor temperature, °C.
    pub ambient_c: f64,
    /// From the first agent started to every agent connected, s.
    pub agents_start_s: f64,
    /// Messages every agent's and controller's bus client handed to the
    /// broker (frames, JSON mirrors, presence, commands).
    pub frames_published: u64,
    /// Messages the observer received on the site tree (that decoded).
    pub frames_received: u64,
    /// Messages it received there whose topic or frame did not decode:
    /// not in `frames_received`.
    pub frames_undecodable: u64,
    /// Of those, by family (`json/` for the mirrors).
    pub received_by_family: std::collections::BTreeMap<String, u64>,
    /// Event frames received, by kind of event.
    pub events_by_kind: std::collections::BTreeMap<String, u64>,
    /// `frames_published - frames_received` (0 when nothing was lost).
    pub frames_lost: i64,
    /// QoS 1 messages handed to the broker.
    pub qos1_published: u64,
    /// Distinct QoS 1 messages the observer received.
    pub qos1_received: u64,
    /// `qos1_published - qos1_received`, at least 0: QoS 1 messages
    /// handed to the broker that the observer did not receive (a message
    /// sent again after a lost connection counts twice in the first).
    pub qos1_not_received: u64,
    /// The agents' events (their outbox frames) the broker acknowledged.
    pub events_acked: u64,
    /// Of those, the ones the broker never delivered to the observer: each
    /// agent's event sequence numbers that the broker took and did not
    /// deliver.
    pub qos1_events_lost: u64,
    /// Of those, the ones the observer had from their sender as resent
    /// (docs/bus.md §4.8).
    pub events_repaired: u64,
    /// `qos1_events_lost - events_repaired`: acknowledged events the
    /// observer never had, end to end.
    pub events_lost_after_repair: u64,
    /// The agents' acks (the other frames of their outbox) the broker
    /// acknowledged.
    pub acks_acked: u64,
    /// Of those, the ones the broker never delivered to the observer. No
    /// one resends an ack: the command's sender renews the command until
    /// one comes (a controller its lease every period).
    pub acks_not_delivered: u64,
    /// Resend requests the observer sent.
    pub resend_requests: u64,
    /// Resend requests its client's channel had no room for, asked again
    /// at their retry.
    pub resend_requests_unsent: u64,
    /// Frames it received on `resent` topics (repairs, and repeats of
    /// frames it had).
    pub resent_received: u64,
    /// Sequence numbers missing in some sender's frames at the observer,
    /// beyond what the sender itself dropped or spent on its last will.
    pub seq_gaps: u64,
    /// Frames received twice.
    pub duplicates: u64,
    /// Messages the clients dropped themselves (queue full, offline,
    /// received with no room): the agents', the controllers'.
    pub client_dropped: [u64; 2],
    /// The same by kind: `agents: queue full`, `controllers: inbound full`, …
    /// (only kinds that happened).
    pub client_drops_by_kind: std::collections::BTreeMap<String, u64>,
    /// Connections lost or refused: the agents', the controllers' and the
    /// observer's.
    pub connection_errors: [u64; 3],
    /// GPUs failed (XID 79).
    pub xids_injected: usize,
    /// Of those, heard quarantined by the observer.
    pub quarantines: usize,
    /// XID to quarantined health at the observer, p50, ms, over every GPU
    /// injected: a GPU never heard quarantined counts as slower than any
    /// heard, and a percentile that falls among those is `null`.
    pub quarantine_p50_ms: Option<f64>,
    /// The same, p99, ms.
    pub quarantine_p99_ms: Option<f64>,
    /// The same, the slowest, ms.
    pub quarantine_max_ms: Option<f64>,
    /// Injected GPUs heard quarantined before their failure (a quarantine
    /// an agent restored from an earlier run's flash): in no latency.
    pub quarantined_before_injection: usize,
    /// Other GPUs heard quarantined (not injected).
    pub other_quarantines: usize,
    /// CDUs whose pumps failed.
    pub shortfall_cdus: usize,
    /// Hosts of the CDUs in shortfall.
    pub shortfall_hosts: usize,
    /// Of those, hosts no controller's command ever capped, by id.
    pub shortfall_hosts_never_capped: Vec<String>,
    /// Hosts the controllers' commands capped at some time.
    pub hosts_capped: usize,
    /// Of those, hosts that acknowledged a cap in force.
    pub hosts_caps_acked: usize,
    /// Of those, hosts that never acknowledged a cap in force, by id.
    pub hosts_caps_never_acked: Vec<String>,
    /// CDUs whose cap watcher did not end: their hosts are in none of the
    /// caps figures.
    pub cap_watchers_lost: Vec<String>,
    /// The longest time any controller went without an ack from its hosts
    /// while its commands capped some (leases go out every few seconds
    /// then): how long it lost touch with them, a broker's failover
    /// included.
    pub controller_ack_gap_max_s: f64,
    /// Each controller's control steps over the whole run (one a period,
    /// whatever the bus does).
    pub controller_steps: Vec<u64>,
    /// Cap step to the host's ack of the cap in force, p50, ms; a capped
    /// host that never acknowledged counts as slower than any ack, and a
    /// percentile that falls among those is `null`.
    pub caps_acked_p50_ms: Option<f64>,
    /// The same, p99, ms.
    pub caps_acked_p99_ms: Option<f64>,
    /// The same, the slowest, ms.
    pub caps_acked_max_ms: Option<f64>,
    /// Agents that ended before the run told them to stop, or whose task
    /// failed, by host id: what they would have published and
    /// acknowledged is missing from every figure. The run fails.
    pub agents_ended_early: Vec<String>,
    /// The same of the cooling controllers, by CDU.
    pub controllers_ended_early: Vec<String>,
    /// CPU of every host agent's threads over the run / wall time.
    pub agent_cpu_cores: f64,
    /// The agents' threads at the end.
    pub agent_threads: usize,
    /// CPU over the run / wall time by part: the agents' by kind of
    /// thread (`agents: …`, adding up to `agent_cpu_cores`) and the others.
    pub cpu_cores_by_part: Vec<(String, f64)>,
    /// Process RSS growth from before the agents started to the end, per
    /// host, MiB.
    pub agent_rss_mib_per_host: f64,
    /// Process RSS before the agents started, MiB.
    pub rss_before_mib: f64,
    /// Process RSS at the end of the run, MiB.
    pub rss_end_mib: f64,
    /// The 1-minute load average when the run began.
    pub load_avg_start: f64,
    /// The 1-minute load average at the end.
    pub load_avg_end: f64,
}

impl FleetReport {
    /// The JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serialises")
    }

    /// What the caps figures leave out, for the summary: the capped hosts
    /// that never acknowledged and the CDUs whose cap watcher was lost.
    fn caps_unaccounted(&self) -> String {
        let mut s = String::new();
        if !self.shortfall_hosts_never_capped.is_empty() {
            s += &format!(
                ", of {} hosts in shortfall never capped: {}",
                self.shortfall_hosts,
                self.shortfall_hosts_never_capped.join(" ")
            );
        }
        if !self.hosts_caps_never_acked.is_empty() {
            s += &format!(", never acked: {}", self.hosts_caps_never_acked.join(" "));
        }
        if !self.cap_watchers_lost.is_empty() {
            s += &format!(
                ", cap watchers lost: {} (their hosts not counted)",
                self.cap_watchers_lost.join(" ")
            );
        }
        s
    }

    /// Whether every agent and controller ran until the run stopped it.
    pub fn whole(&self) -> bool {
        self.agents_ended_early.is_empty() && self.controllers_ended_early.is_empty()
    }

    /// The parts that ended early, for the summary and the error.
    pub fn ended_early(&self) -> String {
        format!(
            "agents ended early: {}; controllers ended early: {}",
            names(&self.agents_ended_early),
            names(&self.controllers_ended_early)
        )
    }

    /// What the quarantine figures leave out, for the summary.
    fn quarantines_unaccounted(&self) -> String {
        let mut s = String::new();
        if self.quarantined_before_injection > 0 {
            s += &format!(
                ", {} heard quarantined before their failure (not counted)",
                self.quarantined_before_injection
            );
        }
        if self.quarantines < self.xids_injected {
            s += &format!(
                ", {} not measured (slower than the run: a percentile among them is -)",
                self.xids_injected - self.quarantines
            );
        }
        s
    }

    /// The short summary.
    pub fn summary(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} ms"));
        format!(
            "fleet: {} hosts on {} CDUs ({}), {} s, broker {}\n\
             frames: {} published, {} received, {} lost, {} undecodable; QoS 1 not received {}, \
             events acked by the broker {}, of them lost {}, repaired {}, lost after repair {}, \
             sequence gaps {}; \
             connections lost (agents, controllers, observer) {:?}\n\
             XID -> quarantine: {}/{} quarantined{}, p50 {}, p99 {}, max {}\n\
             shortfall -> caps acked: {} CDUs, {}/{} hosts acked{}, p50 {}, p99 {}, max {}\n\
             agents: {:.2} cores, {} threads, {:.2} MiB RSS per host, flash in {}; started in {:.1} s\n\
             load average {:.2} at the start, {:.2} at the end\n\
             {}",
            self.hosts,
            self.cdus,
            self.layout.join(" "),
            self.duration_s,
            self.broker,
            self.frames_published,
            self.frames_received,
            self.frames_lost,
            self.frames_undecodable,
            self.qos1_not_received,
            self.events_acked,
            self.qos1_events_lost,
            self.events_repaired,
            self.events_lost_after_repair,
            self.seq_gaps,
            self.connection_errors,
            self.quarantines,
            self.xids_injected,
            self.quarantines_unaccounted(),
            ms(self.quarantine_p50_ms),
            ms(self.quarantine_p99_ms),
            ms(self.quarantine_max_ms),
            self.shortfall_cdus,
            self.hosts_caps_acked,
            self.hosts_capped,
            self.caps_unaccounted(),
            ms(self.caps_acked_p50_ms),
            ms(self.caps_acked_p99_ms),
            ms(self.caps_acked_max_ms),
            self.agent_cpu_cores,
            self.agent_threads,
            self.agent_rss_mib_per_host,
            self.agent_flash,
            self.agents_start_s,
            self.load_avg_start,
            self.load_avg_end,
            self.ended_early(),
        )
    }
}

/// `ids` joined, or `none`.
fn names(ids: &[String]) -> String {
    match ids {
        [] => "none".into(),
        _ => ids.join(" "),
    }
}

/// The 1-minute load average.
pub fn load_avg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_in_ms() {
        let v = [0.010, 0.020, 0.030, 0.040];
        assert_eq!(percentile_censored_ms(&v, 0, 50.0), Some(20.0));
        assert_eq!(percentile_censored_ms(&v, 0, 99.0), Some(40.0));
        assert_eq!(percentile_censored_ms(&[], 0, 50.0), None);
    }

    #[test]
    fn a_percentile_among_the_unmeasured_is_unknown_not_the_slowest_measured() {
        // 95 of 100 measured: p50 is known, p99 and the slowest are not.
        let v: Vec<f64> = (1..=95).map(|i| i as f64 / 1000.0).collect();
        assert_eq!(percentile_censored_ms(&v, 5, 50.0), Some(50.0));
        assert_eq!(percentile_censored_ms(&v, 5, 95.0), Some(95.0));
        assert_eq!(percentile_censored_ms(&v, 5, 99.0), None);
        assert_eq!(percentile_censored_ms(&v, 5, 100.0), None);
        assert_eq!(percentile_censored_ms(&v, 0, 99.0), Some(95.0));
        assert_eq!(percentile_censored_ms(&[], 3, 50.0), None);
    }

    #[test]
    fn a_part_that_ended_early_makes_the_run_not_whole_and_is_named() {
        let mut r = FleetReport::default();
        assert!(r.whole());
        assert!(r.summary().contains("agents ended early: none"));
        r.agents_ended_early = vec!["c1r0h1".into()];
        r.controllers_ended_early = vec!["cdu2".into()];
        assert!(!r.whole());
        assert!(
            r.summary()
                .contains("agents ended early: c1r0h1; controllers ended early: cdu2"),
            "{}",
            r.summary()
        );
    }
}
