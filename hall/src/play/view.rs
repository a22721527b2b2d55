//! The live view: what the terminal shows while a play runs (unless it
//! is headless). The banner says what is running (the hall, the broker,
//! the pace, where the results go); each trace row redraws one screen
//! with the hall's PUE, the CDU's setpoint, pump speed and water
//! temperatures, the hottest GPU, capped hosts, quarantined GPUs and the
//! last events, above a legend of what the figures mean.
//!
//! Glossary:
//! - *PUE*: facility power ÷ IT power (1 would be no cooling at all).

use std::io::Write;

use loopwarden_bus::BrokerAddr;

use super::{PlayConfig, PlayOutcome};
use crate::trace::TraceRow;

/// What the run is: the hall, the broker, the pace and where the results
/// go (the live view's first line; printed once when headless).
pub(super) fn banner(
    cfg: &PlayConfig,
    broker: &BrokerAddr,
    embedded: bool,
    duration: u64,
) -> String {
    let s = &cfg.scenario.site;
    let hosts = s.racks * s.hosts_per_rack;
    let cdus = match s.cdus {
        1 => "one CDU".to_string(),
        n => format!("{n} CDUs"),
    };
    let which = if embedded { "the embedded" } else { "the" };
    format!(
        "Loopwarden: {}: one simulated hall, {hosts} hosts ({} GPUs), {cdus}, {which} MQTT broker at {broker}, speed ×{} ({duration} s of scenario in {}), results in {}/",
        cfg.name,
        hosts * s.gpus_per_host,
        cfg.speed,
        wall_time(duration as f64 / cfg.speed),
        cfg.out.display()
    )
}

/// A wall-clock length as people say it: `about 3 min`, `about 45 s`.
fn wall_time(s: f64) -> String {
    if s >= 90.0 {
        format!("about {:.0} min", s / 60.0)
    } else {
        format!("about {:.0} s", s.max(1.0))
    }
}

/// What the live view's figures mean, in one line.
const LEGEND: &str = "PUE: facility power ÷ IT power (1 would be no cooling at all) · setpoint: the supply water the controller asks the CDU for · capped: hosts whose GPUs are power-capped · quarantined: GPUs their host's agent took out of service";

/// The live view: one screen, redrawn.
pub(super) fn live(r: &TraceRow, o: &PlayOutcome, banner: &str, what: &str, duration: u64) {
    let pue = if r.it_kw > 0.0 {
        r.facility_kw / r.it_kw
    } else {
        0.0
    };
    let mut s = String::new();
    s.push_str("\x1b[2J\x1b[H");
    s.push_str(&format!(
        "{banner}\n{what}\n  simulated time {:>5.0} / {duration} s\n\n",
        r.t_s
    ));
    s.push_str(&format!(
        "  hall PUE        {pue:>7.3}      IT {:>7.1} kW   facility {:>7.1} kW\n",
        r.it_kw, r.facility_kw
    ));
    s.push_str(&format!(
        "  setpoint        {:>7.1} °C   supply {:>5.1} °C   return {:>5.1} °C\n",
        r.setpoint_c, r.supply_c, r.return_c
    ));
    s.push_str(&format!(
        "  pump speed      {:>7.0} %    flow {:>7.0} L/min   outdoor {:>5.1} °C\n",
        r.pump_speed * 100.0,
        r.flow_lpm,
        r.ambient_c
    ));
    match r.max_gpu_c {
        Some(c) => s.push_str(&format!("  hottest GPU     {c:>7.1} °C\n")),
        None => s.push_str("  hottest GPU           none\n"),
    }
    s.push_str(&format!(
        "  hosts capped    {:>7}      GPUs quarantined {:>3}   hosts heard {:>3}\n\n",
        r.caps,
        o.quarantined.len(),
        o.hosts_heard.len()
    ));
    s.push_str(&format!("  {LEGEND}\n\n"));
    s.push_str("  events:\n");
    for e in o
        .events
        .iter()
        .rev()
        .take(8)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        s.push_str(&format!("    {e}\n"));
    }
    print!("{s}");
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_times_read_as_people_say_them() {
        assert_eq!(wall_time(600.0 / 3.3), "about 3 min");
        assert_eq!(wall_time(9.0), "about 9 s");
        assert_eq!(wall_time(0.2), "about 1 s");
    }
}
