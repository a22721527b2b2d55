//! The goodput report's page, `report.md`, from a [`Study`].
//!
//! Glossary:
//! - *points*: percentage points of ETT.
//! - *per trial*: a mean over the trials; one trial is the whole job.

use std::fmt::Write as _;

use loopwarden_twin::goodput::mix::LLAMA3_RATE_PER_GPU_DAY;
use loopwarden_twin::goodput::{Job, Lost, PolicySummary, Settings};

use super::charts::{causes, CHARTS, SWEPT_POLICIES};
use super::study::{false_flags, Point, Study, COVERAGE, LEAD_H, TARGET};
use super::verdict::{drains_pay, said};

/// The report page's name.
pub const REPORT: &str = "report.md";

/// One part of [`Lost`].
type Part = fn(&Lost) -> f64;

const POLICIES: [&str; 3] = ["reactive", "agent", "agent + drain"];

fn pct(x: f64) -> String {
    format!("{:.2} %", x * 100.0)
}

/// 16384 as 16,384.
fn thousands(n: u32) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (k, ch) in digits.chars().enumerate() {
        if k > 0 && (digits.len() - k) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn num(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The page, with the measured model's notes if it was measured.
pub fn markdown(s: &Study, measured_notes: &[String]) -> String {
    let mut md = String::new();
    let i = &s.inputs;
    let _ = writeln!(
        md,
        "# Effective training time: {} GPUs for {} days\n\n\
         {} trials from seed {} ({} for each run of the sweeps and the moonshot), every \
         policy on the same failures. Mix: {}; \
         {:.4e} interruptions per GPU-day ({} a day for the job). \
         How the model works and where each input comes from: `docs/goodput.md`.\n",
        thousands(i.job.gpus),
        num(i.job.days),
        i.trials,
        i.seed,
        i.sweep_trials.min(i.trials),
        i.mix.source,
        i.mix.rate_per_gpu_day,
        num(i.mix.rate_per_gpu_day * f64::from(i.job.gpus)),
    );
    result(&mut md, s);
    inputs(&mut md, s);
    lost(&mut md, s);
    sensitivity(&mut md, s);
    precursors(&mut md, s);
    false_alarms(&mut md, s);
    moonshot(&mut md, s);
    if !measured_notes.is_empty() {
        md.push_str("## The measured precursor model\n\n");
        for n in measured_notes {
            let _ = writeln!(md, "- {n}");
        }
        md.push('\n');
    }
    md.push_str("## Charts\n\n");
    for c in CHARTS {
        let _ = writeln!(md, "![{c}]({c})\n");
    }
    md
}

fn row(md: &mut String, name: &str, p: &PolicySummary) {
    let _ = writeln!(
        md,
        "| {name} | {} | {} – {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
        pct(p.ett),
        pct(p.ett_p05),
        pct(p.ett_p95),
        p.interruptions,
        p.quarantine_stops,
        p.drains,
        p.failures_averted,
        p.false_alarms,
        p.false_quarantines,
        p.spare_waits
    );
}

fn result(md: &mut String, s: &Study) {
    md.push_str(
        "## ETT per policy\n\n\
         Interruptions are the failing GPUs' unplanned stops: failures that struck, and \
         quarantines that ended the job before the failure struck (`--quarantine-ends-job`; \
         also in their own column). A failure averted was drained, or left out of a restart, \
         with no stop of its own.\n\n\
         | policy | ETT (mean) | 5th – 95th percentile | interruptions | of which a \
         quarantine's stop | drains | failures drained or left out of a restart before they \
         struck | false degrades drained | false quarantines acted on | waits for a spare |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (k, p) in s.headline.policies.iter().enumerate() {
        row(md, POLICIES[k], p);
    }
    row(
        md,
        "agent without false quarantines",
        &s.agent_no_false_quarantines,
    );
    row(md, "agent + drain without false alarms", &s.no_false_alarms);
    let which = if s.inputs.measured {
        format!(
            "the precursors the health engine achieves today (the measured model{})",
            unmeasured(&s.inputs.unmeasured)
        )
    } else {
        "the mix's own precursors".to_string()
    };
    let by = |key: &str| {
        let d = s.differences.iter().find(|d| d.key == key);
        d.map_or("none measured".to_string(), said)
    };
    let _ = writeln!(
        md,
        "\nThe agent against reactive handling, trial by trial: {}. {} {} \
         Drains, with {which}, against the agent: {} at {:.2e} false degrades and {:.2e} \
         false quarantines per GPU-day ({:.1} false flags a day for the job, {}), and {} \
         with neither (against the agent without false quarantines).\n",
        by("agent_minus_reactive"),
        agent_credit(&s.inputs.settings),
        false_quarantine_charge(&s.inputs.settings, &s.inputs.job),
        by("agent_drain_minus_agent"),
        s.inputs.settings.false_alarms_per_gpu_day,
        s.inputs.settings.false_quarantines_per_gpu_day,
        false_flags(&s.inputs.settings) * f64::from(s.inputs.job.gpus),
        flag_handling(&s.inputs.settings),
        by("agent_drain_minus_agent_with_neither"),
    );
    differences(md, s);
    let _ = writeln!(md, "{DRAIN_NOT_SHIPPED}\n");
}

/// The paired differences between policies, in points, with their 95 %
/// intervals.
fn differences(md: &mut String, s: &Study) {
    md.push_str(
        "Differences between policies, trial by trial over the same failures (mean of the \
         per-trial differences ± t·SD/√n, a 95 % interval, t Student's quantile at trials − 1 \
         degrees of freedom up to 30 and 1.96 beyond; a difference whose interval \
         holds 0 is not told apart from none at this number of trials):\n\n\
         | difference | points | 95 % interval | trials |\n|---|---:|---:|---:|\n",
    );
    for d in &s.differences {
        let interval = match d.half_width {
            Some(h) => format!(
                "{:+.3} to {:+.3} (± {:.3})",
                d.low() * 100.0,
                d.high() * 100.0,
                h * 100.0
            ),
            None => "none (one trial)".to_string(),
        };
        let _ = writeln!(
            md,
            "| {} | {:+.3} | {interval} | {} |",
            d.name,
            d.mean * 100.0,
            d.trials
        );
    }
    md.push('\n');
}

/// Who would carry out the drain policy: not Loopwarden.
pub const DRAIN_NOT_SHIPPED: &str = "Loopwarden does not drain: the agent only marks the GPU \
     `degraded` on the bus (keep running, mark for maintenance), and its actions run on \
     quarantine and cooling loss alone. The drain policy needs the site's scheduler to read \
     `degraded` from the bus and requeue the job at a checkpoint, which Loopwarden does not \
     ship. Without it, the ETT the product gives is the agent's.";

/// The visible classes the measured model does not cover, in words to
/// follow "the measured model" ("" when it covers every one).
fn unmeasured(classes: &[String]) -> String {
    if classes.is_empty() {
        String::new()
    } else {
        format!(
            "; the mix's own precursors for {}, which it does not cover",
            classes.join(", ")
        )
    }
}

/// What the drain policy does with a false flag, in words.
fn flag_handling(t: &Settings) -> &'static str {
    if t.quarantine_ends_job {
        "each false degrade drained and each false quarantine ending the job"
    } else {
        "each drained"
    }
}

/// What a false quarantine costs the agent policies, in words; a false
/// degrade costs the agent nothing.
pub fn false_quarantine_charge(t: &Settings, j: &Job) -> String {
    let rate = t.false_quarantines_per_gpu_day;
    let ends = if t.quarantine_ends_job {
        " and, since the quarantine ends the job, stops the job at once: the work since \
         the last checkpoint, the restart and a spare, charged to `false_alarm`"
    } else {
        ""
    };
    let how = if t.quarantine_ends_job {
        "takes a healthy host out of the job under both agent policies"
    } else {
        "keeps a healthy host out of the next restart under both agent policies (the drain \
         policy drains it at the end of the next write)"
    };
    format!(
        "A false quarantine ({:.2e} per GPU-day, {:.1} a day for the job) {how}: it takes a \
         spare and comes back after the {}-hour repair time, as a drained false alarm \
         does{ends}; the restart waits when no spare is free. Reactive handling has no false \
         quarantine, and a false degrade costs the agent nothing (a degraded GPU stays in \
         service).",
        rate,
        rate * f64::from(j.gpus),
        num(j.repair_hours),
    )
}

/// What the agent is credited with over reactive handling, in words: the
/// hangs it ends sooner (only where its quarantine ends the job) and the
/// triage it saves (none at triage 0).
pub fn agent_credit(t: &Settings) -> String {
    let timeout_s = t.hang_timeout_min * 60.0;
    let hangs = if !t.quarantine_ends_job {
        format!(
            "Its quarantine does not end the running job (a drain or a taint; \
             `--quarantine-ends-job` says it does), so every hang, seen by a host or not, \
             waits for the {}-minute collective timeout under every policy: the agent's {} s \
             detection is not credited.",
            num(t.hang_timeout_min),
            num(t.detection_s)
        )
    } else if t.detection_s < timeout_s {
        format!(
            "Its quarantine ends the job (`--quarantine-ends-job`), so a hang a host sees \
             stops the job after the agent's detection, {} s, instead of at the {}-minute \
             collective timeout; the hangs no host sees still wait for the timeout.",
            num(t.detection_s),
            num(t.hang_timeout_min)
        )
    } else {
        format!(
            "Its quarantine ends the job (`--quarantine-ends-job`), but its detection, {} s, \
             is no sooner than the {}-minute collective timeout, so every hang still stops at \
             the timeout.",
            num(t.detection_s),
            num(t.hang_timeout_min)
        )
    };
    let naming = if t.triage_min > 0.0 {
        format!(
            "It names the bad host of a failure a host sees at once, saving the {}-minute \
             triage reactive handling spends on it.",
            num(t.triage_min)
        )
    } else {
        "At triage 0 (`--triage-min`) reactive handling names the bad host at once too, so \
         naming it is not credited."
            .to_string()
    };
    format!("{hangs} {naming}")
}

fn inputs(md: &mut String, s: &Study) {
    let (j, t) = (&s.inputs.job, &s.inputs.settings);
    let rows: [(&str, String, &str); 15] = [
        ("GPUs (G)", thousands(j.gpus), "--gpus"),
        (
            "GPUs per host",
            j.gpus_per_host.to_string(),
            "--gpus-per-host",
        ),
        (
            "spare hosts (S)",
            j.spare_hosts.to_string(),
            "--spare-hosts",
        ),
        ("days (D)", num(j.days), "--days"),
        (
            "checkpoint interval (C)",
            format!("{} min", num(j.checkpoint_min)),
            "--checkpoint-min",
        ),
        (
            "checkpoint write (W)",
            format!("{} s", num(j.checkpoint_write_s)),
            "--checkpoint-write-s",
        ),
        (
            "restart (R)",
            format!("{} min", num(j.restart_min)),
            "--restart-min",
        ),
        (
            "host repair",
            format!("{} h", num(j.repair_hours)),
            "--repair-hours",
        ),
        (
            "collective timeout",
            format!("{} min", num(t.hang_timeout_min)),
            "--hang-timeout-min",
        ),
        (
            "triage without an agent",
            format!("{} min", num(t.triage_min)),
            "--triage-min",
        ),
        (
            "agent's detection",
            format!("{} s", num(t.detection_s)),
            "--detection-s",
        ),
        (
            "quarantine ends the job",
            (if t.quarantine_ends_job { "yes" } else { "no" }).to_string(),
            "--quarantine-ends-job",
        ),
        (
            "false degrades (only a drain acts on them)",
            format!("{:.3e} per GPU-day", t.false_alarms_per_gpu_day),
            "--false-alarms-per-gpu-day",
        ),
        (
            "false quarantines (both agent policies)",
            format!("{:.3e} per GPU-day", t.false_quarantines_per_gpu_day),
            "--false-quarantines-per-gpu-day",
        ),
        (
            "failures",
            format!("{:.4e} per GPU-day", s.inputs.mix.rate_per_gpu_day),
            "--rate-per-gpu-day, --mix",
        ),
    ];
    md.push_str("## Inputs\n\n| input | value | flag |\n|---|---|---|\n");
    for (name, v, flag) in rows {
        let _ = writeln!(md, "| {name} | {v} | `{flag}` |");
    }
    let _ = writeln!(
        md,
        "\nWith no failure the job would train {} of the time (1 − W/C).\n",
        pct(j.ett_without_failures())
    );
}

fn lost(md: &mut String, s: &Study) {
    let wall = s.headline.policies[0].wall_gpu_h;
    md.push_str(
        "## Where the time goes\n\nGPU-hours per trial, and share of the run's.\n\n\
         | part | reactive | agent | agent + drain | drain, no false alarms |\n\
         |---|---:|---:|---:|---:|\n",
    );
    let parts: [(&str, Part); 7] = [
        ("checkpoint writes", |l| l.checkpoints),
        ("rework since the last checkpoint", |l| l.rework),
        ("detection (timeouts, triage)", |l| l.detection),
        ("restarts", |l| l.restart),
        ("drains (planned restarts)", |l| l.drains),
        ("waiting for a spare host", |l| l.spares),
        ("**all lost**", |l| l.total()),
    ];
    for (name, f) in parts {
        let v = s
            .headline
            .policies
            .iter()
            .chain([&s.no_false_alarms])
            .map(|p| f(&p.lost));
        let cells: Vec<String> = v
            .map(|g| format!("{g:.0} ({:.2} %)", g / wall * 100.0))
            .collect();
        let _ = writeln!(md, "| {name} | {} |", cells.join(" | "));
    }
    md.push_str(
        "\n### By cause\n\nInterruptions per trial (reactive; the agent sees the same ones) and \
         GPU-hours lost to each cause, per trial.\n\n\
         | cause | interruptions | reactive | agent | agent + drain | drain, no false alarms |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    let by_class = &s.headline.policies[0].interruptions_by_class;
    for (name, v) in causes(s) {
        let n = by_class
            .iter()
            .find(|(c, _)| *c == name)
            .map_or("–".to_string(), |(_, k)| format!("{k:.1}"));
        let [a, b, c, d] = v;
        let _ = writeln!(md, "| {name} | {n} | {a:.0} | {b:.0} | {c:.0} | {d:.0} |");
    }
    md.push('\n');
}

fn table(md: &mut String, title: &str, unit: &str, points: &[Point], current: f64) {
    let _ = writeln!(
        md,
        "### {title}\n\nNo false degrade or quarantine in any column.\n\n\
         | {unit} | {} |\n\
         |---|---:|---:|---:|",
        SWEPT_POLICIES.join(" | ")
    );
    for p in points {
        let mark = if p.x == current { " (the run's)" } else { "" };
        let e = p.ett.map(pct);
        let _ = writeln!(
            md,
            "| {}{mark} | {} | {} | {} |",
            num(p.x),
            e[0],
            e[1],
            e[2]
        );
    }
    md.push('\n');
}

fn sensitivity(md: &mut String, s: &Study) {
    let (j, t) = (&s.inputs.job, &s.inputs.settings);
    md.push_str(
        "## Sensitivity\n\nETT with one input changed, every other as run except that no \
         policy raises a false alarm (no false degrade, no false quarantine: they are priced \
         in their own sections), so the agent here is the agent without false \
         quarantines.\n\n",
    );
    table(
        md,
        "Checkpoint interval",
        "C (min)",
        &s.checkpoint,
        j.checkpoint_min,
    );
    table(md, "Restart", "R (min)", &s.restart, j.restart_min);
    table(
        md,
        "Checkpoint write",
        "W (s)",
        &s.write,
        j.checkpoint_write_s,
    );
    table(
        md,
        "Spare pool",
        "spare hosts",
        &s.spares,
        f64::from(j.spare_hosts),
    );
    table(
        md,
        "Collective timeout",
        "timeout (min)",
        &s.hang,
        t.hang_timeout_min,
    );
    choosing(md, s);
}

/// The smallest n with P(Poisson(mean) ≤ n) ≥ q. The terms are kept in
/// log space, since e^−mean underflows to 0 past a mean of about 745.
fn poisson_quantile(mean: f64, q: f64) -> u32 {
    if mean.is_nan() || mean <= 0.0 {
        return 0;
    }
    // Far past any quantile asked for: 40 standard deviations.
    let last = mean + 40.0 * mean.sqrt() + 50.0;
    let mut log_p = -mean;
    let mut cdf = log_p.exp();
    let mut n = 0u32;
    while cdf < q && f64::from(n) < last {
        n += 1;
        log_p += (mean / f64::from(n)).ln();
        cdf += log_p.exp();
    }
    n
}

/// What the sweeps say about the checkpoint interval and the spare pool.
fn choosing(md: &mut String, s: &Study) {
    let (j, mix) = (&s.inputs.job, &s.inputs.mix);
    let per_day = mix.rate_per_gpu_day * f64::from(j.gpus);
    let mtbf_s = 86_400.0 / per_day.max(f64::MIN_POSITIVE);
    let young_min = (2.0 * j.checkpoint_write_s * mtbf_s).sqrt() / 60.0;
    // As the advice ranks them: on a tie, the same interval.
    if let Some(best) = super::interval::ranked(&s.checkpoint).first() {
        let _ = writeln!(
            md,
            "**Choosing the checkpoint interval.** The best swept for reactive handling is {} min \
             ({}); Young's √(2 W M), with M = {:.2} h between interruptions, gives {:.1} min.{}\n",
            num(best.x),
            pct(best.ett[0]),
            mtbf_s / 3600.0,
            young_min,
            s.checkpoint_advice
                .as_ref()
                .map_or(String::new(), |a| format!(" {}", a.sentence()))
        );
    }
    let out_share: f64 = mix
        .classes
        .iter()
        .filter(|c| c.excludes_host)
        .map(|c| c.share)
        .sum();
    let hosts_per_day = per_day * out_share;
    let away = hosts_per_day * j.repair_hours / 24.0;
    let _ = writeln!(
        md,
        "**Choosing the spare pool.** {:.1} hosts a day leave for repair ({} of interruptions take \
         a host out) and stay away {} h, so {:.1} are away on average; the 99th and 99.9th \
         percentiles of that Poisson count are {} and {} hosts. A pool below them makes the whole \
         job wait for repairs (the spare pool table); drains and false alarms take spares too.\n",
        hosts_per_day,
        pct(out_share),
        num(j.repair_hours),
        away,
        poisson_quantile(away, 0.99),
        poisson_quantile(away, 0.999)
    );
}

fn grid_table(md: &mut String, cells: &[super::study::Cell]) {
    md.push_str("| flagged \\ lead (h) |");
    for l in LEAD_H {
        let _ = write!(md, " {} |", num(l));
    }
    md.push_str("\n|---|");
    md.push_str(&"---:|".repeat(LEAD_H.len()));
    md.push('\n');
    for c in COVERAGE {
        let _ = write!(md, "| {} % |", num(c * 100.0));
        for l in LEAD_H {
            let e = cells.iter().find(|x| x.coverage == c && x.lead_h == l);
            let _ = write!(md, " {} |", e.map_or("–".into(), |e| pct(e.ett)));
        }
        md.push('\n');
    }
    md.push('\n');
}

fn precursors(md: &mut String, s: &Study) {
    md.push_str(
        "## Precursors\n\nETT with drains when this share of every failure a host sees \
         (GPU, HBM3, SRAM, GSP, thermal) is flagged this many hours before it strikes. \
         No public source gives these figures; they are swept.\n\n",
    );
    grid_table(md, &s.precursors);
}

fn moonshot(md: &mut String, s: &Study) {
    let m = &s.moonshot;
    let _ = writeln!(
        md,
        "## The moonshot: {} GPUs at Llama 3's rate, ETT ≥ {}\n\n\
         The run's settings with {} GPUs and Llama 3's rate (one interruption every {:.1} h). \
         With no precursor: reactive {}, agent {}, agent + drain {}.\n",
        thousands(m.job.gpus),
        pct(TARGET),
        thousands(m.job.gpus),
        24.0 / (LLAMA3_RATE_PER_GPU_DAY * f64::from(m.job.gpus)),
        pct(m.baseline[0]),
        pct(m.baseline[1]),
        pct(m.baseline[2]),
    );
    grid_table(md, &m.grid);
    let best = m.best();
    match m.reaching().first() {
        Some(c) => {
            let _ = writeln!(
                md,
                "**Answer:** {} % of the visible failures flagged {} h ahead reach {} with these \
                 settings.\n",
                num(c.coverage * 100.0),
                num(c.lead_h),
                pct(c.ett)
            );
        }
        None => {
            let _ = writeln!(
                md,
                "**Answer:** no precursor reaches {} with these settings. The best, {} % flagged \
                 {} h ahead, gives {}: the failures no host sees (switches, NICs, software, \
                 host maintenance) and the checkpoint writes still cost {:.2} points.\n",
                pct(TARGET),
                num(best.coverage * 100.0),
                num(best.lead_h),
                pct(best.ett),
                m.ceiling * 100.0
            );
        }
    }
    settings_answer(md, m);
    if let Some((e, quiet)) = m.measured {
        let _ = writeln!(
            md,
            "**Today:** with the precursors the health engine achieves (the measured model{}) \
             and its measured detection latency ({} s; {}), agent + drain reaches {} at the \
             false-alarm bounds of {:.2e} false degrades and {:.2e} false quarantines per \
             GPU-day, and {} if it raised neither.\n",
            unmeasured(&s.inputs.unmeasured),
            num(s.inputs.settings.detection_s),
            if s.inputs.settings.quarantine_ends_job {
                "the quarantine ends the job, so a hang a host sees stops after it, at most at \
                 the collective timeout"
            } else {
                "the quarantine does not end the job, so no hang stops sooner for it"
            },
            pct(e),
            s.inputs.settings.false_alarms_per_gpu_day,
            s.inputs.settings.false_quarantines_per_gpu_day,
            pct(quiet)
        );
    } else {
        md.push_str("The measured precursor model was not run (`--no-measured`).\n\n");
    }
}

fn settings_answer(md: &mut String, m: &super::study::Moonshot) {
    let reach: Vec<_> = m
        .settings_tried
        .iter()
        .filter(|t| t.ett >= TARGET)
        .collect();
    md.push_str(
        "With every visible failure flagged a day ahead, the settings tried \
         (checkpoint interval and write, restart, collective timeout), best first:\n\n\
         | C (min) | W (s) | R (min) | collective timeout (min) | ETT |\n\
         |---:|---:|---:|---:|---:|\n",
    );
    for t in m.settings_tried.iter().take(8) {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            num(t.checkpoint_min),
            num(t.write_s),
            num(t.restart_min),
            num(t.hang_min),
            pct(t.ett)
        );
    }
    let relaxed = reach.iter().max_by(|a, b| {
        let slack = |t: &&&super::study::Tried| t.checkpoint_min + t.restart_min + t.hang_min;
        slack(a).total_cmp(&slack(b))
    });
    let _ = writeln!(
        md,
        "\n{} of {} settings tried reach {}{}. If every failure, seen by a host or not, were \
         flagged a day ahead (a network and software watch as good as the perfect host \
         agent), the job would reach {} with the run's settings and {} with the best above.\n",
        reach.len(),
        m.settings_tried.len(),
        pct(TARGET),
        match relaxed {
            Some(t) => format!(
                "; the most relaxed of them: checkpoints every {} min written in {} s, a \
                 {}-minute restart, a {}-minute collective timeout",
                num(t.checkpoint_min),
                num(t.write_s),
                num(t.restart_min),
                num(t.hang_min)
            ),
            None => String::new(),
        },
        pct(m.all_flagged.0),
        pct(m.all_flagged.1),
    );
}

fn false_alarms(md: &mut String, s: &Study) {
    let own = s
        .inputs
        .mix
        .classes
        .iter()
        .any(|c| c.precursor.coverage > 0.0);
    let which = match (s.inputs.measured, own) {
        (true, _) => format!(
            "the measured precursors{}",
            unmeasured(&s.inputs.unmeasured)
        ),
        (false, true) => "the mix's precursors".to_string(),
        (false, false) => "50 % of visible failures flagged an hour ahead".to_string(),
    };
    let agent = s.agent_swept.ett;
    let trials = s.inputs.sweep_trials.min(s.inputs.trials);
    let _ = writeln!(
        md,
        "## Drains against false alarms\n\n\
         Each false flag, a false degrade or a false quarantine, costs the drain policy \
         a planned restart and a spare host, like a true drain (a false quarantine that \
         ends the job costs more: `--quarantine-ends-job`). ETT with drains ({which}) \
         against the rate of false flags, every one counted as a degrade, over {trials} \
         trials each; the agent without drains and without false quarantines has {} over \
         the same {trials} trials.\n\n\
         | false flags per GPU-day | per day for the job | ETT with drains | − the agent, points \
         (95 %) |\n|---:|---:|---:|---:|",
        pct(agent),
    );
    let g = f64::from(s.inputs.job.gpus);
    for w in &s.false_alarms {
        let r = w.rate;
        let own = if r == false_flags(&s.inputs.settings) {
            " (the run's total, all as degrades)"
        } else {
            ""
        };
        let d = &w.vs_agent;
        let h = d
            .half_width
            .map_or("none".into(), |h| format!("{:.3}", h * 100.0));
        let (e, m) = (pct(w.ett), d.mean * 100.0);
        let _ = writeln!(md, "| {r:.1e}{own} | {:.2} | {e} | {m:+.3} ± {h} |", r * g);
    }
    md.push_str(&drains_pay(&s.false_alarms));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_and_poisson_quantiles() {
        assert_eq!(thousands(16_384), "16,384");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
        // Poisson(1): P(X ≤ 2) = 0.920, P(X ≤ 3) = 0.981, P(X ≤ 4) = 0.996.
        assert_eq!(poisson_quantile(1.0, 0.95), 3);
        assert_eq!(poisson_quantile(1.0, 0.99), 4);
        assert_eq!(poisson_quantile(0.0, 0.999), 0);
    }

    #[test]
    fn poisson_quantiles_of_large_means_are_near_the_mean() {
        // e^−1000 is 0 in f64: summed directly the count never rises.
        let q = poisson_quantile(1000.0, 0.99);
        assert!((1060..1090).contains(&q), "{q}");
        // Normal approximation: 10⁴ + 2.326 × 100.
        let q = poisson_quantile(1e4, 0.99);
        assert!((10_220..10_245).contains(&q), "{q}");
    }

    /// Llama 3's mix with every visible class flagged so rarely that
    /// drains never act, on a small job: 50 trials, 10 for the sweeps.
    fn drains_do_nothing() -> Study {
        use loopwarden_twin::goodput::{Job, Mix};

        use super::super::study::{fixed, Inputs};
        let job = Job {
            gpus: 1024,
            days: 3.0,
            ..Job::default()
        };
        Study::compute(Inputs {
            job,
            settings: Settings::default(),
            mix: Mix::default().with_precursor(&fixed(1e-12, 1.0)),
            measured: false,
            unmeasured: Vec::new(),
            trials: 50,
            sweep_trials: 10,
            seed: 3,
        })
        .unwrap()
    }

    #[test]
    fn drains_against_false_alarms_are_set_against_the_agent_on_the_same_trials() {
        let s = drains_do_nothing();
        let w = &s.false_alarms[0];
        assert_eq!(w.rate, 0.0);
        assert!((w.ett - s.agent_swept.ett).abs() < 1e-12, "{w:?}");
        // Paired with the agent trial by trial: with drains doing nothing
        // the two lose the same time in every trial.
        assert_eq!((w.vs_agent.mean, w.vs_agent.trials), (0.0, 10));
        // The headline's 50 trials differ from the sweeps' 10.
        assert_ne!(s.agent_no_false_quarantines.ett, s.agent_swept.ett);
        let md = markdown(&s, &[]);
        assert!(
            md.contains("At no positive rate swept can drains be told apart"),
            "{md}"
        );
        // Drains doing nothing: the headline's verdicts come from the paired
        // intervals, not from two means.
        assert!(
            md.contains("The agent against reactive handling, trial by trial: +0.00 ± 0.00 points (95 %), not told apart from none"),
            "{md}"
        );
        assert!(!md.contains("The agent gains"), "{md}");
        assert!(md.contains(&format!(
            "the agent without drains and without false quarantines has {} over the same 10 trials",
            pct(s.agent_swept.ett)
        )));
        // The charts: the precursor chart's agent line is the same figure,
        // and the checkpoint chart names its lines as the tables do.
        let dir = tempfile::tempdir().unwrap();
        super::super::charts::write(dir.path(), &s).unwrap();
        let svg = std::fs::read_to_string(dir.path().join(CHARTS[0])).unwrap();
        let texts: Vec<&str> = svg.lines().map(str::trim).collect();
        for label in SWEPT_POLICIES {
            assert!(texts.contains(&label), "{label}: {svg}");
        }
        assert!(!texts.contains(&"agent"), "{svg}");
    }

    #[test]
    fn the_agent_is_credited_only_with_what_it_does() {
        let plain = Settings::default();
        let words = agent_credit(&plain);
        assert!(words.contains("every hang, seen by a host or not, waits for the 10-minute"));
        assert!(words.contains("reactive handling names the bad host at once too"));
        let ends = Settings {
            quarantine_ends_job: true,
            triage_min: 3.0,
            ..plain.clone()
        };
        let words = agent_credit(&ends);
        assert!(words.contains("after the agent's detection, 4 s, instead of at the 10-minute"));
        assert!(words.contains("saving the 3-minute triage"));
        let slow = Settings {
            detection_s: 900.0,
            ..ends
        };
        let words = agent_credit(&slow);
        assert!(words.contains("900 s, is no sooner than the 10-minute collective timeout"));
        assert!(!words.contains("instead of"));
    }
}
