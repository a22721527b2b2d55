//! The gateway's Prometheus metrics (`metrics_listen`): the link to the
//! microcontroller (`loopwarden_gateway_*`: frames each way, frames
//! dropped by reason, gaps in its numbers and the frames lost in them,
//! its restarts and silences), what went to the bus, what went down for
//! the BMS and for operators' clears, and what every agent shares
//! (`loopwarden_bus_*`, the recorder's and the resender's counts). Rendered from the gateway's last [`GatewayStats`]: a scrape
//! never reaches into its loop. Every series has the label `cdu`.
//!
//! Glossary:
//! - *silent*: the microcontroller sent no status for 3 s.

use std::string::String;

use loopwarden_bus::prometheus::{with_labels, write_bus, write_recorder, write_resend};
use loopwarden_bus::prometheus::{Exposition, Metric};
use loopwarden_field::listen::{write_metrics, ListenStats};
use loopwarden_store::recorder::Recorder;

use super::GatewayStats;

const LINK_OPEN: Metric = Metric::gauge(
    "loopwarden_gateway_link_open",
    "1 while the line to the microcontroller is open, else 0.",
);
const FRAMES: Metric = Metric::counter(
    "loopwarden_gateway_link_frames_total",
    "Frames on the line to the microcontroller, by direction: in (from it, checked and decoded), out (to it, written).",
);
const UNSENT: Metric = Metric::counter(
    "loopwarden_gateway_link_frames_unsent_total",
    "Frames to the microcontroller not written: the line was down, or the write failed.",
);
const DROPPED: Metric = Metric::counter(
    "loopwarden_gateway_link_frames_dropped_total",
    "Frames from the microcontroller dropped, by reason: overrun (longer than the buffer), cobs, short, crc, version (another link version), payload (checked, but the message does not decode).",
);
const GAPS: Metric = Metric::counter(
    "loopwarden_gateway_link_gaps_total",
    "Gaps in the microcontroller's frame numbers.",
);
const LOST: Metric = Metric::counter(
    "loopwarden_gateway_link_frames_lost_total",
    "Frames from the microcontroller lost in those gaps.",
);
const REPEATS: Metric = Metric::counter(
    "loopwarden_gateway_link_frames_repeated_total",
    "Frames from the microcontroller that repeated the last one (its number and message): counted, not taken again.",
);
const RESTARTS: Metric = Metric::counter(
    "loopwarden_gateway_mcu_restarts_total",
    "Restarts of the microcontroller (its frame numbers started again).",
);
const SILENT: Metric = Metric::gauge(
    "loopwarden_gateway_mcu_silent",
    "1 while the microcontroller has sent no status for 3 s (the bus is told failsafe, controller-silent), else 0.",
);
const SILENCES: Metric = Metric::counter(
    "loopwarden_gateway_mcu_silences_total",
    "Times the microcontroller fell silent.",
);
const PUBLISHED: Metric = Metric::counter(
    "loopwarden_gateway_published_total",
    "What the gateway handed to the bus for the microcontroller, by kind: telemetry, state, event, lease.",
);
const PUBLISH_ERRORS: Metric = Metric::counter(
    "loopwarden_gateway_publish_errors_total",
    "Publishes the bus did not take.",
);
const HOST_REPORTS: Metric = Metric::counter(
    "loopwarden_gateway_host_reports_forwarded_total",
    "Host telemetry frames of this CDU's hosts handed to the microcontroller's line.",
);
const HOST_SUPERSEDED: Metric = Metric::counter(
    "loopwarden_gateway_host_reports_superseded_total",
    "Host reports replaced by a newer one of the same host before the microcontroller's line took them (the line does not carry every host's reports at their rate; the latest of each goes).",
);

const BMS_FORWARDED: Metric = Metric::counter(
    "loopwarden_gateway_bms_writes_forwarded_total",
    "The BMS's writes handed to the microcontroller's line: its limits (again every 30 s and when it starts again) and the outdoor temperature.",
);
const FACILITY_FORWARDED: Metric = Metric::counter(
    "loopwarden_gateway_facility_targets_forwarded_total",
    "A hall of several CDUs: the coordinator's facility water handed to the microcontroller's line (when it changes, again every minute it is heard, when the microcontroller starts again, and when its line opens again; nothing is handed to a closed line).",
);
const CLEARS: Metric = Metric::counter(
    "loopwarden_gateway_clears_total",
    "Operators' signed clears, by outcome: forwarded (handed to the microcontroller's line), unsent (the line not open or full), done and refused (as the microcontroller answered), unanswered (no answer within 10 s), late (an answer with nobody waiting: after it was counted unanswered, or to a clear of an earlier gateway).",
);

/// The `/metrics` text of CDU `cdu`'s gateway, as of `st`, with the
/// recorder's counts and those of its `listeners` (by name: the console,
/// the northbound server), as `run` shows them.
pub fn render(
    cdu: &str,
    st: &GatewayStats,
    recorder: &Recorder,
    listeners: &[(&str, &ListenStats)],
) -> String {
    let mut out = Exposition::new();
    let l = [("cdu", cdu)];
    let c = &st.link;
    out.flag(&LINK_OPEN, &l, st.link_open);
    for (direction, n) in [("in", c.frames_in), ("out", c.frames_out)] {
        out.sample(
            &FRAMES,
            &with_labels(&l, &[("direction", direction)]),
            n as f64,
        );
    }
    out.sample(&UNSENT, &l, c.frames_unsent as f64);
    for (reason, n) in c.dropped.by_reason() {
        out.sample(&DROPPED, &with_labels(&l, &[("reason", reason)]), n as f64);
    }
    out.sample(&GAPS, &l, c.gaps as f64);
    out.sample(&LOST, &l, c.lost as f64);
    out.sample(&REPEATS, &l, c.repeats as f64);
    out.sample(&RESTARTS, &l, c.restarts as f64);
    out.flag(&SILENT, &l, st.silent);
    out.sample(&SILENCES, &l, c.silences as f64);
    let published = [
        ("telemetry", st.telemetry_published),
        ("state", st.states_published),
        ("event", st.events_published),
        ("lease", st.leases_sent),
    ];
    for (kind, n) in published {
        out.sample(&PUBLISHED, &with_labels(&l, &[("kind", kind)]), n as f64);
    }
    out.sample(&PUBLISH_ERRORS, &l, st.publish_errors as f64);
    out.sample(&HOST_REPORTS, &l, st.host_reports_forwarded as f64);
    let superseded = st.host_reports_superseded as f64;
    out.sample(&HOST_SUPERSEDED, &l, superseded);
    out.sample(&BMS_FORWARDED, &l, st.bms_forwarded as f64);
    out.sample(&FACILITY_FORWARDED, &l, st.facility_forwarded as f64);
    let c = &st.clears;
    let clears = [
        ("forwarded", c.forwarded),
        ("unsent", c.unsent),
        ("done", c.done),
        ("refused", c.refused),
        ("unanswered", c.unanswered),
        ("late", c.late),
    ];
    for (outcome, n) in clears {
        out.sample(&CLEARS, &with_labels(&l, &[("outcome", outcome)]), n as f64);
    }
    write_bus(&mut out, &st.bus, st.bus_connected, &l);
    write_resend(&mut out, st.resend, &l);
    write_recorder(&mut out, recorder, &l);
    for (name, stats) in listeners {
        write_metrics(&mut out, name, stats, &l);
    }
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `loopwarden_gateway_*` metric, in the order docs/cooling.md
    /// lists them.
    const ALL: [&Metric; 17] = [
        &LINK_OPEN,
        &FRAMES,
        &UNSENT,
        &DROPPED,
        &GAPS,
        &LOST,
        &REPEATS,
        &RESTARTS,
        &SILENT,
        &SILENCES,
        &PUBLISHED,
        &PUBLISH_ERRORS,
        &HOST_REPORTS,
        &HOST_SUPERSEDED,
        &BMS_FORWARDED,
        &FACILITY_FORWARDED,
        &CLEARS,
    ];

    #[test]
    fn every_gateway_metric_is_in_the_docs_in_order() {
        let doc = include_str!("../../../docs/cooling.md");
        let section = &doc[doc.find("## The gateway").expect("the gateway's section")..];
        let mut from = 0;
        for m in ALL {
            let at = section[from..]
                .find(&format!("`{}", m.name))
                .unwrap_or_else(|| panic!("{} not in docs/cooling.md, The gateway", m.name));
            from += at;
        }
    }

    #[test]
    fn every_count_is_a_labelled_series() {
        let mut st = GatewayStats::default();
        st.link.frames_in = 12;
        st.link.dropped.crc = 2;
        st.link.restarts = 1;
        st.link.repeats = 5;
        st.silent = true;
        st.states_published = 3;
        st.bms_forwarded = 4;
        st.host_reports_superseded = 6;
        st.facility_forwarded = 2;
        st.clears.refused = 1;
        let flash = crate::journal::ControllerFlash::open(None).unwrap();
        let northbound = ListenStats::default();
        let text = render(
            "cdu-1",
            &st,
            &flash.recorder,
            &[("northbound", &northbound)],
        );
        for line in [
            "loopwarden_gateway_link_frames_total{cdu=\"cdu-1\",direction=\"in\"} 12",
            "loopwarden_gateway_link_frames_dropped_total{cdu=\"cdu-1\",reason=\"crc\"} 2",
            "loopwarden_gateway_mcu_restarts_total{cdu=\"cdu-1\"} 1",
            "loopwarden_gateway_link_frames_repeated_total{cdu=\"cdu-1\"} 5",
            "loopwarden_gateway_mcu_silent{cdu=\"cdu-1\"} 1",
            "loopwarden_gateway_published_total{cdu=\"cdu-1\",kind=\"state\"} 3",
            "loopwarden_gateway_link_open{cdu=\"cdu-1\"} 0",
            "loopwarden_gateway_bms_writes_forwarded_total{cdu=\"cdu-1\"} 4",
            "loopwarden_gateway_host_reports_superseded_total{cdu=\"cdu-1\"} 6",
            "loopwarden_gateway_facility_targets_forwarded_total{cdu=\"cdu-1\"} 2",
            "loopwarden_gateway_clears_total{cdu=\"cdu-1\",outcome=\"refused\"} 1",
            "loopwarden_bus_connected{cdu=\"cdu-1\"} 0",
            "loopwarden_listener_refused_total{cdu=\"cdu-1\",listener=\"northbound\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }
}
