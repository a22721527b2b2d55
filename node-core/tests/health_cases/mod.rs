//! The generated scenarios of `health_traces.rs`, and how a case is
//! checked: run through the engine and through the replay of its trace
//! text, both agreeing, the verdicts meeting the expectation, no state
//! oscillating.

use crate::health_sim::*;
use loopwarden_protocol::{HealthState, ReasonCode, ThrottleReasons};
use node_core::health::{LoopState, Output, Policy};

use HealthState::{Degraded, Healthy, Quarantined};

pub const S: u64 = 1_000;
pub const MIN: u64 = 60_000;

/// One generated scenario.
pub struct Case {
    pub trace: Trace,
    pub expect: Expect,
    pub policy: Policy,
}

pub fn case(
    description: &str,
    seed: u64,
    secs: u64,
    hook: impl FnMut(&mut World),
    expect: Expect,
) -> Case {
    Case {
        trace: Trace {
            description: description.into(),
            gpus: GPUS,
            period_ms: PERIOD_MS,
            recs: simulate(seed, secs, hook),
        },
        expect,
        policy: Policy::default(),
    }
}

/// Runs a case both ways, checks that they agree, that the verdicts meet
/// the expectation and that no state oscillates; returns the direct run.
pub fn check(c: &Case) -> Run {
    let direct = run_engine(&c.trace, c.policy);
    let replayed = run_replay(&c.trace, c.policy);
    assert_eq!(
        direct.lines, replayed.lines,
        "the replay of the trace text and the engine fed directly disagree"
    );
    assert_eq!(
        direct.attributions, replayed.attributions,
        "cooling attributions differ between the replay and the engine"
    );
    if let Err(problems) = c.expect.check(GPUS, &direct.verdicts) {
        panic!(
            "{}:\n  {}\nverdicts:\n  {}",
            c.trace.description,
            problems.join("\n  "),
            direct.lines.join("\n  ")
        );
    }
    no_oscillation(&direct.verdicts);
    direct
}

/// Every change of a GPU rises, except a quiet-period fall from degraded;
/// evidence is there and fits the bus.
pub fn no_oscillation(verdicts: &[Verdict]) {
    for g in 0..GPUS as u8 {
        let mut state = Healthy;
        let mut falls = 0;
        for v in verdicts.iter().filter(|v| v.gpu == g) {
            assert!(!v.evidence.is_empty() && v.evidence.len() <= 96, "{v:?}");
            if v.state > state {
                state = v.state;
            } else {
                assert!(
                    state == Degraded && v.state == Healthy && v.reason == "quiet-period",
                    "gpu {g} went from {} to {} by {}: {v:?}",
                    state_name(state),
                    state_name(v.state),
                    v.reason
                );
                state = Healthy;
                falls += 1;
            }
        }
        assert!(falls <= 1, "gpu {g} fell back {falls} times: {verdicts:?}");
    }
}

pub fn changes(run: &Run, gpu: u8) -> Vec<&Verdict> {
    run.verdicts.iter().filter(|v| v.gpu == gpu).collect()
}

/// The verdict `gpu` got in the very call of record `i`.
pub fn change_at(run: &Run, i: usize, gpu: u8) -> Option<(HealthState, ReasonCode, u64)> {
    run.per_record[i].iter().find_map(|o| match o {
        Output::Change(c) if c.gpu == gpu => Some((c.to, c.reason, c.time.0)),
        _ => None,
    })
}

/// GPU, XID, time (ms) of the fatal XIDs of `fatal_xids`.
pub const FATAL: [(u8, u16, u64); 7] = [
    (0, 48, 95_412),
    (1, 62, 121_209),
    (2, 64, 140_188),
    (3, 74, 161_530),
    (4, 79, 187_412),
    (5, 95, 205_077),
    (6, 119, 230_950),
];

pub fn fatal_xids() -> Case {
    let mut expect = Expect::new(
        "Fatal hardware XIDs (48, 62, 64, 74, 79, 95, 119) take their GPU out of service at \
         once; GPU 7 sees only a bad job's XIDs (13, 43, 45): the application's fault.",
    );
    for (g, _, t) in FATAL {
        expect = expect.must(g, Quarantined, t, t + S);
    }
    case(
        "GPUs 0-6 each get one fatal XID (with its usual follow-on: DBE count, lost GPU, \
         remap failure); GPU 7's job hits XID 13, 43 and 45",
        11,
        250,
        |w| {
            for (g, code, t) in FATAL {
                let g = g as usize;
                if w.t == t / S * S {
                    w.xid(g, code, t);
                }
                // Follow-ons show in the next round of samples.
                if w.t == t / S * S + S {
                    match code {
                        48 => {
                            w.gpus[g].s.ecc_dbe_volatile += 1;
                            w.xid(g, 63, w.t + 1);
                        }
                        62 | 79 => w.gpus[g].down = true,
                        64 => w.gpus[g].s.remap_failure = true,
                        74 => w.gpus[g].s.nvlink_replay += 3,
                        119 => w.gpus[g].miss = true,
                        _ => {}
                    }
                }
            }
            if w.at(150) {
                w.xid(7, 13, w.t + 120);
                w.xid(7, 43, w.t + 380);
                w.xid(7, 45, w.t + 990);
                w.gpus[7].work = Work::Idle;
            }
            if w.at(170) {
                w.gpus[7].work = Work::Train;
            }
        },
        expect,
    )
}

/// Application, contained and informational XIDs, and XIDs the catalog
/// does not know: (time ms, GPUs, code).
pub const BENIGN_XIDS: &[(u64, &[u8], u16)] = &[
    (40_120, &[0, 1, 2, 3, 4, 5, 6, 7], 13),
    (40_530, &[0, 1, 2, 3, 4, 5, 6, 7], 43),
    (41_210, &[0, 1, 2, 3, 4, 5, 6, 7], 45),
    (90_777, &[2], 31),
    (91_505, &[0, 1, 3], 45),
    (110_310, &[1], 68),
    (120_402, &[3], 69),
    (130_911, &[6], 94),
    (140_250, &[4], 63),
    (150_640, &[5], 121),
    (160_004, &[7], 999),
    (161_100, &[0], 150),
    (162_700, &[2], 1),
];

pub fn memory_errors() -> Case {
    case(
        "GPU 1: volatile DBE +1 at 70 s without an XID; GPUs 2 and 5 have 62 retired pages \
         since boot, GPU 5 retires one more at 100 s; GPU 3: row remap failure at 130 s; \
         GPU 4: row remap pending at 60 s; GPU 6: page retirement pending at 90 s; each repair \
         after a corrected error (SBE +1), the retirements and the pending remap with the \
         driver's XID 63",
        21,
        200,
        |w| {
            if w.at(0) {
                (w.gpus[2].s.retired_sbe, w.gpus[2].s.retired_dbe) = (40, 22);
                (w.gpus[5].s.retired_sbe, w.gpus[5].s.retired_dbe) = (41, 21);
                w.gpus[6].s.retired_sbe = 3;
            }
            if w.at(70) {
                w.gpus[1].s.ecc_dbe_volatile += 1;
            }
            // A page is retired, a row remapped, only after an ECC error.
            let t = w.t;
            if w.at(100) {
                w.gpus[5].s.ecc_sbe_volatile += 1;
                w.gpus[5].s.retired_dbe += 1;
                w.xid(5, 63, t + 40);
            }
            if w.at(130) {
                w.gpus[3].s.ecc_sbe_volatile += 1;
                w.gpus[3].s.remap_failure = true;
                w.gpus[3].s.remap_uncorrectable += 1;
            }
            if w.at(60) {
                w.gpus[4].s.ecc_sbe_volatile += 1;
                w.gpus[4].s.remap_pending = true;
                w.gpus[4].s.remap_correctable += 1;
                w.xid(4, 63, t + 40);
            }
            if w.at(90) {
                w.gpus[6].s.ecc_sbe_volatile += 1;
                w.gpus[6].s.retired_pending = true;
                w.gpus[6].s.retired_sbe += 1;
                w.xid(6, 63, t + 40);
            }
        },
        Expect::new(
            "An uncorrectable error, 63 retired pages or a failed remap take the GPU out of \
             service; a pending remap or retirement wants a reset at the next drain; 62 \
             retired pages are not yet the limit.",
        )
        .must(1, Quarantined, 70 * S, 73 * S)
        .must(5, Quarantined, 100 * S, 103 * S)
        .must(3, Quarantined, 130 * S, 133 * S)
        .must(4, Degraded, 60 * S, 65 * S)
        .must(6, Degraded, 90 * S, 95 * S),
    )
}

pub fn nvlink_and_unresponsive() -> Case {
    case(
        "GPU 0: NVLink replays +2 at 100 s; GPU 4: an NVLink recovery at 140 s; GPU 2: CRC \
         ~150/s from 60 s; GPU 6: CRC trickle ~1/s; GPU 3: replays and recoveries since boot, \
         none new; GPU 5: a 20 s CRC burst; GPU 1 misses 3 samples in a row at 120 s; GPU 7 \
         misses 2, later 1, later every other",
        31,
        255,
        |w| {
            if w.at(0) {
                w.gpus[6].crc_per_s = 1.0;
                w.gpus[3].s.nvlink_replay = 5;
                w.gpus[3].s.nvlink_recovery = 1;
            }
            if w.at(100) {
                w.gpus[0].s.nvlink_replay += 2;
            }
            if w.at(140) {
                w.gpus[4].s.nvlink_recovery += 1;
            }
            if w.at(60) {
                w.gpus[2].crc_per_s = 150.0;
            }
            if w.at(170) {
                w.gpus[5].crc_per_s = 400.0;
            }
            if w.at(190) {
                w.gpus[5].crc_per_s = 0.0;
            }
            if w.during(120, 145) {
                w.gpus[1].down = true;
            }
            if w.at(145) {
                w.gpus[1].down = false;
            }
            if w.during(80, 82) || w.at(180) || (w.during(200, 220) && w.secs() % 2 == 0) {
                w.gpus[7].miss = true;
            }
        },
        Expect::new(
            "A rising NVLink replay or recovery counter quarantines at once; a CRC rate above \
             100/s for a minute is a maintenance flag, a trickle or a short burst is not; three \
             missed samples in a row while the other GPUs answer mean the GPU is stuck, fewer do \
             not.",
        )
        .must(0, Quarantined, 100 * S, 103 * S)
        .must(4, Quarantined, 140 * S, 143 * S)
        .must(2, Degraded, 60 * S, 60 * S + MIN + MIN + 3 * MIN)
        .must(1, Quarantined, 120 * S, 122 * S + 3 * S),
    )
}

pub fn driver_stall() -> Case {
    case(
        "every GPU misses 6 samples in the same rounds at 100 s (a driver stall), then again 4 at \
         200 s; after the first stall GPU 6 never answers again",
        37,
        260,
        |w| {
            if w.during(100, 106) || w.during(200, 204) {
                for g in w.gpus.iter_mut() {
                    g.miss = true;
                }
            }
            if w.at(100) {
                w.gpus[6].down = true;
            }
        },
        Expect::new(
            "Misses that hit every GPU in the same rounds are the driver's or the host's, not N \
             GPU faults: no GPU is quarantined for them. A GPU that stays silent once its peers \
             answer again is quarantined after three misses of its own.",
        )
        .must(6, Quarantined, 106 * S, 109 * S + 500),
    )
}

pub fn pcie_and_sbe() -> Case {
    case(
        "GPU 4: PCIe replays ~24/min from 60 s; GPU 1: one blip of 10; GPUs 6 and 2: a steady \
         6/min and 7/min; GPU 3: corrected ECC ~240/min from 80 s; GPU 0: 4 scattered SBEs; GPU 5: a 10 s \
         burst of ~150 SBEs, then quiet",
        41,
        250,
        |w| {
            if w.at(0) {
                w.gpus[6].pcie_per_s = 6.0 / 60.0;
                w.gpus[2].pcie_per_s = 7.0 / 60.0;
            }
            if w.at(60) {
                w.gpus[4].pcie_per_s = 0.4;
            }
            if w.at(90) {
                w.gpus[1].s.pcie_replay += 10;
            }
            if w.at(80) {
                w.gpus[3].sbe_per_s = 4.0;
            }
            if [30, 95, 150, 200].contains(&w.secs()) && w.t % S == 0 {
                w.gpus[0].s.ecc_sbe_volatile += 1;
            }
            if w.at(120) {
                w.gpus[5].sbe_per_s = 15.0;
            }
            if w.at(130) {
                w.gpus[5].sbe_per_s = 0.0;
            }
        },
        Expect::new(
            "PCIe replays above 8/min and corrected ECC errors above 100/min, sustained, are \
             maintenance flags; a blip, a low steady rate, scattered SBEs and a short burst are \
             noise.",
        )
        .must(4, Degraded, 60 * S, 60 * S + MIN + 2 * MIN + 3 * MIN)
        .must(3, Degraded, 80 * S, 80 * S + MIN + MIN + 3 * MIN),
    )
}

/// Found in review: a trailing minute of few replays, between bursts,
/// ended the 2-minute sustain, so a link averaging 20 replays a minute in
/// bursts of 60 s and lulls of 90 s was never flagged.
pub fn pcie_bursts() -> Case {
    case(
        "GPU 4: PCIe replays from 60 s in bursts of 60 s at ~43/min and lulls of 90 s at \
         ~5/min (20/min on average); GPU 5: bursts of 40 s at ~12/min, lulls of 80 s at \
         ~1/min (5/min on average); GPU 1: two blips of 12, 150 s apart; GPU 2: one blip \
         of 20",
        42,
        600,
        |w| {
            let s = w.secs();
            let whole = w.t % S == 0;
            if whole && s >= 60 && (s - 60) % 150 == 0 {
                w.gpus[4].pcie_per_s = 43.0 / 60.0;
            }
            if whole && s >= 120 && (s - 120) % 150 == 0 {
                w.gpus[4].pcie_per_s = 5.0 / 60.0;
            }
            if whole && s >= 60 && (s - 60) % 120 == 0 {
                w.gpus[5].pcie_per_s = 12.0 / 60.0;
            }
            if whole && s >= 100 && (s - 100) % 120 == 0 {
                w.gpus[5].pcie_per_s = 1.0 / 60.0;
            }
            if w.at(100) || w.at(250) {
                w.gpus[1].s.pcie_replay += 12;
            }
            if w.at(300) {
                w.gpus[2].s.pcie_replay += 20;
            }
        },
        Expect::new(
            "A link whose replays average above 8/min over the sustain, in bursts and lulls, is \
             marginal; below it on average, or in blips, it is not.",
        )
        .must(4, Degraded, 60 * S, 60 * S + 5 * MIN),
    )
}

pub fn hot_plate(publish: bool) -> Case {
    let (hot, warm) = if publish { (7, 3) } else { (3, 6) };
    case(
        &format!(
            "GPU {hot}: bad cold-plate contact, ~16 K above its peers at the same load; GPU \
             {warm}: ~6 K warm; {}",
            if publish {
                "the loop reports normal"
            } else {
                "no coolant records"
            }
        ),
        if publish { 51 } else { 52 },
        220,
        |w| {
            if w.at(0) {
                w.cooling.publish = publish;
                w.gpus[hot].r_extra = 0.025;
                w.gpus[warm].r_extra = 0.008;
            }
        },
        Expect::new(
            "Only one GPU is hot, at the same load as its peers and with normal coolant: its \
             thermal interface is bad. A few kelvin are normal spread.",
        )
        .must(
            hot as u8,
            Degraded,
            JOB_START_S * S,
            JOB_START_S * S + MIN + MIN + 3 * MIN,
        ),
    )
}

pub fn hot_plate_loop_in_trouble(state: LoopState) -> Case {
    case(
        &format!(
            "GPU 7 as in the hot-plate case, but the loop reports {state:?} all along (supply \
             38 C, reduced flow{})",
            if state == LoopState::Degraded {
                ", caps of 550 W requested"
            } else {
                ""
            }
        ),
        53,
        300,
        |w| {
            if w.at(0) {
                w.cooling.state = state;
                w.cooling.supply_target = 38.0;
                w.cooling.flow = 1.1;
                w.gpus[7].r_extra = 0.025;
            }
            if w.at(20) && state == LoopState::Degraded {
                w.all(|g| g.power_limit = 550.0);
            }
        },
        Expect::new("while the loop reports trouble a hot GPU says nothing of the GPU itself"),
    )
}

pub fn straggler_and_slowed() -> Case {
    case(
        "GPU 1: clocks ~37 % down with hw_slowdown only from 90 s, utilisation ~100 %; GPU 2: \
         an operator's 380 W limit (sw_power_cap; every 40 s a sample at the limit reads the \
         flag clear); GPU 5: HBM over temperature 110-190 s (hw_thermal_slowdown)",
        61,
        230,
        |w| {
            if w.at(90) {
                w.gpus[1].slow = Some((0.63, ThrottleReasons::HW_SLOWDOWN));
            }
            if w.at(40) {
                w.gpus[2].power_limit = 380.0;
            }
            if w.secs() > 40 && w.secs() % 40 == 20 {
                w.gpus[2].glitch = Some((ThrottleReasons::empty(), 374.0));
            }
            if w.at(110) {
                w.gpus[5].hbm_hot = true;
            }
            if w.at(190) {
                w.gpus[5].hbm_hot = false;
            }
        },
        Expect::new(
            "One GPU far slower than its peers at the same utilisation with no thermal or power \
             reason is a straggler; a GPU slowed by its power limit or by thermal slowdown is \
             not.",
        )
        .must(1, Degraded, 90 * S, 90 * S + MIN + MIN + 3 * MIN),
    )
}

pub fn quiet_case() -> Case {
    let mut c = case(
        "quiet period 2 min: GPU 6 gets XID 92 at 40.5 s and nothing more; GPU 4's row remap \
         stays pending; GPU 3 falls off the bus at 50.2 s and comes back 5 s later; GPU 1 has \
         PCIe replays ~24/min from 20 s to 200 s",
        71,
        420,
        |w| {
            if w.at(40) {
                w.xid(6, 92, 40_500);
            }
            if w.at(30) {
                // The remap follows a corrected error; the driver says so.
                w.gpus[4].s.ecc_sbe_volatile += 1;
                w.gpus[4].s.remap_pending = true;
                w.xid(4, 63, 30_040);
            }
            if w.at(50) {
                w.xid(3, 79, 50_200);
            }
            w.gpus[3].down = w.during(51, 56);
            if w.at(20) {
                w.gpus[1].pcie_per_s = 0.4;
            }
            if w.at(200) {
                w.gpus[1].pcie_per_s = 0.0;
            }
        },
        Expect::new("degraded falls back after the quiet period; quarantined does not")
            .must(6, Degraded, 40_500, 41_500)
            .must(4, Degraded, 30 * S, 35 * S)
            .must(3, Quarantined, 50_200, 51_200)
            .must(1, Degraded, 20 * S, 20 * S + MIN + 2 * MIN + 3 * MIN),
    );
    c.policy.quiet_ms = 2 * MIN;
    c
}

pub fn driver_reload() -> Case {
    case(
        "every GPU misses 8 samples at 100 s while the driver reloads; after it every volatile \
         counter (ECC, PCIe replays, NVLink) starts again from 0; from 150 s GPU 5's PCIe link \
         replays 24 times a minute",
        41,
        420,
        |w| {
            if w.during(100, 108) {
                w.all(|g| g.miss = true);
            }
            if w.at(108) {
                w.all(|g| {
                    g.s.ecc_sbe_volatile = 0;
                    g.s.ecc_dbe_volatile = 0;
                    g.s.pcie_replay = 0;
                    g.s.nvlink_crc = 0;
                    g.s.nvlink_replay = 0;
                    g.s.nvlink_recovery = 0;
                });
            }
            if w.at(150) {
                w.gpus[5].pcie_per_s = 24.0 / 60.0;
            }
        },
        Expect::new(
            "A driver reload is a host event: the stall blames no GPU, and counters that fall to \
             0 are a reset, not errors, so nothing is raised for them; a link that replays too \
             often after the reload is still caught.",
        )
        .must(5, Degraded, 150 * S + 2 * MIN, 150 * S + 4 * MIN),
    )
}

/// Benign XIDs from every GPU at `per_s` a second for 10 s from 100 s, a
/// fatal XID 79 on GPU 2 in the middle of it.
pub fn xid_storm(per_s: u64) -> Case {
    case(
        &format!(
            "from 100 s to 110 s every GPU's jobs raise XIDs 13, 43 and 45 ({per_s} a second \
             in all); at 105.5 s GPU 2 falls off the bus (XID 79)"
        ),
        43,
        200,
        move |w| {
            if w.during(100, 110) {
                let t0 = w.t;
                for k in 0..per_s {
                    let gpu = (k % GPUS as u64) as usize;
                    let code = [13, 43, 45][(k % 3) as usize];
                    w.xid(gpu, code, t0 + k * 1000 / per_s);
                }
            }
            if w.at(105) {
                w.xid(2, 79, w.t + 500);
            }
            if w.at(106) {
                w.gpus[2].down = true;
            }
        },
        Expect::new(
            "A storm of benign XIDs is the jobs' trouble: no GPU is degraded or quarantined for \
             it, and a fatal XID inside it still quarantines its GPU at once.",
        )
        .must(2, Quarantined, 105_500, 105_500 + S),
    )
}

/// The scenarios of the peer rules: a hot plate with and without the
/// loop's reports, with the loop in trouble, a straggler.
pub fn peer_rule_cases() -> [Case; 5] {
    [
        hot_plate(true),
        hot_plate(false),
        hot_plate_loop_in_trouble(LoopState::Failsafe),
        hot_plate_loop_in_trouble(LoopState::Degraded),
        straggler_and_slowed(),
    ]
}

/// The committed traces: name, scenario.
pub fn committed() -> Vec<(&'static str, Case)> {
    vec![
        ("gen-fatal-xids", fatal_xids()),
        ("gen-memory-errors", memory_errors()),
        ("gen-nvlink-and-unresponsive", nvlink_and_unresponsive()),
        ("gen-driver-stall", driver_stall()),
        ("gen-driver-reload", driver_reload()),
        ("gen-xid-storm", xid_storm(100)),
        ("gen-pcie-and-sbe-rates", pcie_and_sbe()),
        ("gen-hot-plate", hot_plate(true)),
        ("gen-straggler-and-slowed", straggler_and_slowed()),
    ]
}
