//! The field engineer's console: `cooling-ctrl ctl …` against the running
//! controller over a local Unix socket.
//!
//! One request per connection: a line of JSON (`{"cmd":"status"}`),
//! answered by a line of JSON. `cooling-ctrl ctl` prints it as aligned
//! tables, or as-is with `--json` for scripts. The socket is created with
//! mode 0660: whoever may read it may see the CDU's state; only
//! `clear-leak` and `clear-pump` change anything, through the control
//! loop. Answers come from what the shell published after its last step
//! ([`ShellStats`]) and from the event log; the control loop is never
//! asked or waited for, except for those two.
//!
//! The same requests are answered on the board's serial port when
//! `console_serial` is set ([`SerialCdu`], [`start_serial`]): the two
//! that change state need a login there.
//!
//! Glossary:
//! - *request*: `status`, `sensors`, `loops`, `events` (with `since`, ms
//!   since the epoch) or `caps`.

use std::path::Path;
use std::string::String;
use std::sync::Arc;
use std::time::Duration;
use std::vec::Vec;

use loopwarden_field as field;
use loopwarden_field::console::Peer;
pub use loopwarden_field::time::parse_since;
use loopwarden_protocol::TimestampMs;
use serde::{Deserialize, Serialize};
use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::journal::Recorder;
use crate::shell::{OperatorRequest, ShellStats};

mod answer;
mod render;
mod serial;

pub use answer::answer;
pub(crate) use answer::protection_key;
pub use render::{operator as render_operator, render};
pub use serial::SerialCdu;

/// The controller, as `cooling-ctrl ctl` names it in its messages.
pub const PEER: Peer<'static> = Peer {
    who: "controller",
    program: "cooling-ctrl",
    default_socket: crate::config::default_console,
};

/// A console request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The CDU at a glance.
    Status,
    /// Every supervised sensor.
    Sensors,
    /// The optimiser and the trims.
    Loops,
    /// The event log.
    Events {
        /// Only events at or after this time (ms since the epoch).
        #[serde(default)]
        since: Option<u64>,
    },
    /// The caps per host.
    Caps,
    /// Reopen a rack whose leak is latched (its rope must read dry).
    ClearLeak {
        /// The rack.
        rack: usize,
    },
    /// Put a tripped pump (`A` or `B`) back in service.
    ClearPump {
        /// The pump.
        pump: String,
    },
}

/// What the console answers from.
#[derive(Debug, Clone)]
pub struct Context {
    /// Site.
    pub site: String,
    /// This CDU.
    pub cdu: String,
    /// Host ids, rack-major.
    pub hosts: Vec<String>,
    /// Hosts per rack.
    pub hosts_per_rack: usize,
    /// The CDU link, in words.
    pub link: String,
    /// The register map's model.
    pub map_model: String,
    /// The broker, in words.
    pub broker: String,
    /// Control period.
    pub period: Duration,
    /// Lease duration.
    pub lease: Duration,
    /// Leases are signed with the public demonstration key.
    pub demo_key: bool,
    /// When the controller started.
    pub started: TimestampMs,
    /// The shell's stats.
    pub stats: watch::Receiver<ShellStats>,
    /// The event log.
    pub recorder: Recorder,
    /// The protections switched off on purpose, each as its setting and
    /// what it costs (`rope_fault_active_high = true: ...`; see
    /// `Config::protections_off`): `ctl status` rows and `/metrics`
    /// series for as long as the controller runs.
    pub protection_off: Vec<String>,
    /// Where operators' requests go; `None`: the console is read-only.
    pub operator: Option<tokio::sync::mpsc::Sender<OperatorRequest>>,
}

/// Binds the console socket, replacing a stale one.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    field::console::bind(path, "controller")
}

/// Answers connections until the task is dropped, within `limits`
/// (counted in `stats`).
pub async fn serve(
    listener: UnixListener,
    ctx: Arc<Context>,
    limits: field::listen::Limits,
    stats: field::listen::ListenStats,
) {
    field::console::serve_callers(listener, limits, stats, move |req: Request, caller| {
        let ctx = ctx.clone();
        async move { answer(&ctx, req, caller).await }
    })
    .await
}

/// Serves the serial console, when one is configured, until the task is
/// aborted; its records go to the flash log.
pub fn start_serial(
    serial: Option<field::serial::SerialConsole>,
    ctx: Arc<Context>,
) -> Option<tokio::task::JoinHandle<()>> {
    let offers = match serial.as_ref().map(|s| s.password_hash.is_some()) {
        Some(true) => "state-changing commands after login",
        _ => "no password hash: state-changing commands refused",
    };
    let recorder = ctx.recorder.clone();
    field::serial::start(serial, SerialCdu(ctx), recorder, offers)
}

/// `x` rounded to `digits` decimals.
fn round(x: f64, digits: i32) -> f64 {
    let k = 10f64.powi(digits);
    (x * k).round() / k
}

/// The console's context of controller `cdu-1` of site `hall-t` (16
/// hosts, 4 a rack, a 1 s period) whose shell last published `st`.
#[cfg(test)]
pub(crate) fn test_context(st: ShellStats) -> Arc<Context> {
    let (tx, rx) = crate::shell::stats_channel();
    tx.send_replace(st);
    Arc::new(Context {
        site: "hall-t".into(),
        cdu: "cdu-1".into(),
        hosts: (0..16)
            .map(|i| std::format!("r{}h{}", i / 4, i % 4))
            .collect(),
        hosts_per_rack: 4,
        link: "none".into(),
        map_model: "sim-cdu".into(),
        broker: "none".into(),
        period: Duration::from_secs(1),
        lease: Duration::from_secs(30),
        demo_key: false,
        started: TimestampMs(0),
        protection_off: Vec::new(),
        stats: rx,
        recorder: crate::journal::ControllerFlash::open(None)
            .unwrap()
            .recorder,
        operator: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::outdoor::OutdoorSource;
    use crate::shell::Snapshot;
    use cooling_core::estimate::Scalar;
    use cooling_core::optimise::Proposal;
    use cooling_core::{Core, CoreConfig, Learned};
    use serde_json::Value;

    /// `ctl loops` as a field engineer reads it, for a core that learned
    /// `l`, planned `plan`, with the outdoor temperature from `outdoor`
    /// (`None`: the fallback).
    fn loops_text(l: &Learned, plan: Proposal, outdoor: Option<f32>) -> (Value, String) {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        core.restore_learned(l).unwrap();
        let mut snap = Snapshot::of_core(&core);
        snap.loops.proposal = plan;
        match outdoor {
            Some(c) => {
                snap.estimates.outdoor_c = c;
                snap.estimates.outdoor_fallback = false;
                snap.outdoor_source = Some(OutdoorSource::Cdu);
            }
            None => {
                snap.estimates.outdoor_c = cfg.margins.design_ambient_c;
                snap.estimates.outdoor_fallback = true;
            }
        }
        let st = ShellStats {
            status: Some(snap),
            ..Default::default()
        };
        let hosts: Vec<String> = (0..16).map(|i| format!("r{}h{}", i / 4, i % 4)).collect();
        let v = answer::loops(&hosts, &st);
        let text = render(&Request::Loops, &v);
        (v, text)
    }

    fn plan(capped_hosts: u8, other_cost: Option<f32>) -> Proposal {
        let mut p = Core::new(CoreConfig::default()).unwrap().loops().proposal;
        p.setpoint_c = 32.0;
        p.speed = 0.6;
        p.facility_w = 117_000.0;
        p.work = 100.0;
        p.feasible = capped_hosts == 0;
        p.supply_c = 32.1;
        p.capped_hosts = capped_hosts;
        p.other_cost = other_cost;
        p
    }

    fn line<'a>(text: &'a str, starts: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(starts))
            .unwrap_or_else(|| panic!("no line starting {starts:?} in:\n{text}"))
    }

    #[test]
    fn loops_shows_the_learned_figures_each_hosts_factor_the_ceiling_the_outdoor_and_the_plan() {
        let cfg = CoreConfig::default();
        let mut l = Learned::new(&cfg);
        l.hosts[5] = Scalar {
            value: 1.42,
            var: 0.0,
            fed_s: 3600.0,
            trust: 0.6,
        };
        l.facility.theta = [0.65f32.ln(), 0.0, 0.0, 0.0];
        l.facility_trust = [0.5, 0.0, 0.0, 0.0];
        let (v, text) = loops_text(&l, plan(2, Some(1_200.0)), Some(22.4));
        assert!(!text.contains('{') && !text.contains('}'), "{text}");

        // The plant's figures: configured, estimated, used now,
        // confidence, trust.
        let header = line(&text, "FIGURE");
        for col in ["CONFIGURED", "ESTIMATED", "USED NOW", "CONFIDENCE", "TRUST"] {
            assert!(header.contains(col), "{header}");
        }
        let ua = cfg.facility.dry_cooler_ua_w_per_k;
        let row = line(&text, "dry cooler UA");
        let cells: Vec<&str> = row
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        let used = v["learned"]["figures"][0]["used"].as_f64().unwrap();
        assert_eq!(
            cells,
            [
                "dry cooler UA".to_string(),
                format!("{ua:.0} W/K"),
                format!("{:.0} W/K (×0.65)", f64::from(ua) * 0.65),
                format!("{used:.0} W/K"),
                "0 %".to_string(),
                "50 %".to_string(),
            ],
            "{text}"
        );
        // Followed half way (in ratio) by its trust: 0.65^0.5.
        assert!((used / f64::from(ua) - 0.65f64.sqrt()).abs() < 1e-3);
        for figure in [
            "chiller COP (Carnot fraction)",
            "CDU pump power at full speed",
            "flow per GPU at full pump speed",
            "CDU approach",
        ] {
            line(&text, figure);
        }

        // Each configured host in a row, with its factor and trust.
        let header = line(&text, "HOST");
        assert!(header.contains("THERMAL FACTOR") && header.contains("TRUST"));
        let hosts: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with('r') && l.as_bytes().get(2) == Some(&b'h'))
            .collect();
        assert_eq!(hosts.len(), 16, "{text}");
        let r1h1: Vec<&str> = line(&text, "r1h1").split_whitespace().collect();
        assert_eq!(
            r1h1,
            ["r1h1", "1.42", "1.42", "100", "%", "60", "%", "60", "min"]
        );
        let r0h0: Vec<&str> = line(&text, "r0h0").split_whitespace().collect();
        assert_eq!(r0h0, ["r0h0", "1.00", "1.00", "0", "%", "0", "%", "never"]);

        assert_eq!(
            line(&text, "outdoor"),
            "outdoor         22.4 °C, measured (the CDU's sensor)"
        );
        assert_eq!(
            line(&text, "plan:"),
            "plan: cap 2 hosts rather than cool the whole CDU for them (1.170 kWh per work-GPU-h against 1.200 with colder water)"
        );
    }

    /// The plan ceiling the step uses: held by the least trusted host
    /// heard since the start or learned before it, raised as they are
    /// trusted (a slot no host fills counts for nothing).
    #[test]
    fn loops_shows_the_plan_ceiling_the_step_uses() {
        let cfg = CoreConfig::default();
        let base = cfg.margins.plan_ceiling_c;
        let shown = |l: &Learned| {
            let (_, text) = loops_text(l, plan(2, Some(1_200.0)), Some(22.4));
            let mut core = Core::new(cfg).unwrap();
            core.restore_learned(l).unwrap();
            (
                line(&text, "plan ceiling").to_string(),
                core.believed().margins.plan_ceiling_c,
            )
        };
        let (row, ceiling) = shown(&Learned::new(&cfg));
        assert_eq!(ceiling, base, "nothing learned");
        assert_eq!(row, "plan ceiling    83 °C (as configured)");
        let mut l = Learned::new(&cfg);
        for h in l.hosts.iter_mut().take(16) {
            *h = Scalar {
                value: 1.42,
                var: 0.0,
                fed_s: 3600.0,
                trust: 0.6,
            };
        }
        l.hosts[3].trust = 0.1;
        let (row, ceiling) = shown(&l);
        assert!(ceiling > base, "{ceiling}");
        let mut all = l;
        all.hosts[3].trust = 0.6;
        assert!(shown(&all).1 > ceiling, "held by the least trusted");
        assert_eq!(
            row,
            format!(
                "plan ceiling    {} °C (configured 83 °C, raised as the hosts are trusted)",
                round(f64::from(ceiling), 2)
            )
        );
    }

    #[test]
    fn loops_says_why_colder_water_or_a_short_plant_and_a_fallback_outdoor_temperature() {
        let l = Learned::new(&CoreConfig::default());
        let (_, text) = loops_text(&l, plan(0, Some(1_250.0)), None);
        assert_eq!(
            line(&text, "plan:"),
            "plan: colder water rather than caps (1.170 kWh per work-GPU-h against 1.250 with caps)"
        );
        assert_eq!(
            line(&text, "outdoor"),
            "outdoor         fallback 35 °C — no outdoor sensor reads: alarm"
        );
        assert_eq!(
            line(&text, "plan ceiling"),
            "plan ceiling    83 °C (as configured)"
        );
        // The plant cannot hold the setpoint: the caps follow from it.
        let mut short = plan(16, None);
        short.supply_c = 35.4;
        let (_, text) = loops_text(&l, short, Some(44.0));
        assert_eq!(
            line(&text, "plan:"),
            "plan: the plant is short: the supply settles at 35.4 °C, 3.4 K above the setpoint 32.0 °C; the caps on 16 hosts follow from it (1.170 kWh per work-GPU-h)"
        );
        let (_, text) = loops_text(&l, plan(0, None), Some(10.0));
        assert_eq!(
            line(&text, "plan:"),
            "plan: the water alone holds every GPU under the ceiling (1.170 kWh per work-GPU-h)"
        );
    }

    #[test]
    fn loops_says_what_this_cdu_offers_the_hall_and_whose_plan_it_follows() {
        use cooling_core::facility::{FacilityPlan, Offer};
        let core = Core::new(CoreConfig::default()).unwrap();
        let mut snap = Snapshot::of_core(&core);
        let offer = Offer {
            accept_c: 33.5,
            heat_w: 118_400.0,
            ..Offer::default()
        };
        snap.facility = Some(crate::shell::FacilityStatus {
            coordinator: "cdu-01".into(),
            coordinates: false,
            offer: Some(offer),
            following: Some((32.0, 3_400)),
            plan: None,
        });
        let text = |snap: Snapshot| {
            let st = ShellStats {
                status: Some(snap),
                ..Default::default()
            };
            render(&Request::Loops, &answer::loops(&[], &st))
        };
        assert_eq!(
            line(&text(snap.clone()), "facility:"),
            "facility: this CDU accepts facility water up to 33.5 °C (118 kW of heat); the hall's water 32.0 °C by cdu-01's plan (3 s ago)"
        );
        // The coordinator says its plan too.
        let plan = FacilityPlan {
            water_c: 32.0,
            chiller_stages: 2,
            capping: 0b10,
            cost: 990.0,
            other_cost: None,
        };
        if let Some(f) = snap.facility.as_mut() {
            f.coordinates = true;
            f.plan = Some((plan, 4));
        }
        assert_eq!(
            line(&text(snap.clone()), "facility plan"),
            "facility plan (coordinating): water 32.0 °C, 2 chiller stages, from 4 offers, 1 CDU capping"
        );
        // Outside a hall of several CDUs: no such line.
        snap.facility = None;
        let t = text(snap);
        assert!(
            !t.contains("facility:") && !t.contains("facility plan"),
            "{t}"
        );
    }

    #[test]
    fn requests_and_operator_actions_are_one_line_of_json() {
        let r = Request::Events { since: Some(5) };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"cmd":"events","since":5}"#
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"sensors"}"#).unwrap(),
            Request::Sensors
        );
    }
}
