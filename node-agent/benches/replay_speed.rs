//! How fast the health engine replays a day of one 8-GPU host.
//!
//! `cargo bench -p node-agent --bench replay_speed [-- HOURS]` generates a
//! `gpu-trace/1` trace of an 8-GPU host (1 s samples of a training job
//! with noise, a checkpoint dip every 10 min, the loop's state every 10 s,
//! fields left out when unchanged as recorded traces do), replays it
//! through `node_core::replay::replay` (JSON parsing included) three
//! times and prints the median in simulated seconds per wall second.

use std::fmt::Write as _;
use std::time::Instant;

fn trace(hours: u64) -> String {
    let mut s = String::new();
    s.push_str(r#"{"format":"gpu-trace/1","host":"bench","gpus":8,"model":"H200-SXM","period_ms":1000,"limits":{"tdp_w":700,"min_cap_w":200,"max_operating_c":87,"slowdown_c":89,"shutdown_c":92,"mem_max_c":95},"description":"generated: a day of training"}"#);
    s.push('\n');
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut noise = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let mut sbe = [3u64, 0, 1, 2, 0, 4, 1, 0];
    for sec in 0..hours * 3600 {
        let t = sec * 1000;
        if sec % 10 == 0 {
            let _ = writeln!(
                s,
                r#"{{"t_ms":{t},"coolant":{{"supply_c":{:.1},"flow_lpm_per_gpu":1.45,"state":"normal"}}}}"#,
                32.0 + noise()
            );
        }
        let dip = sec % 600 < 30;
        for gpu in 0..8u64 {
            let t = t + gpu * 3 + 17;
            let util = if dip { 5.0 } else { 97.0 + 3.0 * noise() };
            let power = if dip { 120.0 } else { 660.0 + 60.0 * noise() }.min(700.0);
            let temp = (32.0 + 0.043 * power + noise()).round();
            let throttle = if power >= 699.0 {
                r#"["sw_power_cap"]"#
            } else if dip {
                r#"["idle"]"#
            } else {
                "[]"
            };
            if sec % 300 == 0 {
                let _ = writeln!(
                    s,
                    r#"{{"t_ms":{t},"gpu":{gpu},"sample":{{"temp_c":{temp},"mem_temp_c":{},"power_w":{power:.1},"power_limit_w":700,"sm_clock_mhz":1980,"mem_clock_mhz":2619,"util_pct":{util:.0},"ecc_sbe_volatile":{},"ecc_dbe_volatile":0,"retired_sbe":0,"retired_dbe":0,"retired_pending":false,"remap_correctable":0,"remap_uncorrectable":0,"remap_pending":false,"remap_failure":false,"pcie_replay":12,"nvlink_crc":40,"nvlink_replay":0,"nvlink_recovery":0,"throttle":{throttle},"responsive":true}}}}"#,
                    temp - 3.0,
                    sbe[gpu as usize]
                );
            } else {
                if noise() > 0.4999 {
                    sbe[gpu as usize] += 1;
                }
                let _ = writeln!(
                    s,
                    r#"{{"t_ms":{t},"gpu":{gpu},"sample":{{"temp_c":{temp},"power_w":{power:.1},"util_pct":{util:.0},"ecc_sbe_volatile":{},"throttle":{throttle},"responsive":true}}}}"#,
                    sbe[gpu as usize]
                );
            }
        }
    }
    s
}

fn main() {
    let hours: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(24);
    let text = trace(hours);
    let records = text.lines().count() - 1;
    println!(
        "trace: {hours} h of an 8-GPU host, {records} records, {:.1} MB",
        text.len() as f64 / 1e6
    );
    let mut times = Vec::new();
    let mut first_out = None;
    for _ in 0..3 {
        let mut out = Vec::new();
        let mut notes = Vec::new();
        let start = Instant::now();
        node_core::replay::replay(
            text.as_bytes(),
            node_core::health::Policy::default(),
            &mut out,
            &mut notes,
        )
        .expect("the generated trace replays");
        times.push(start.elapsed().as_secs_f64());
        match &first_out {
            None => first_out = Some(out),
            Some(f) => assert_eq!(f, &out, "replay is deterministic"),
        }
    }
    times.sort_by(f64::total_cmp);
    let median = times[1];
    let simulated = (hours * 3600) as f64;
    println!(
        "replay: median {median:.3} s (min {:.3}, max {:.3}) = {:.0} simulated s per wall s, {:.0} records/s; verdicts: {} lines",
        times[0],
        times[2],
        simulated / median,
        records as f64 / median,
        first_out.map_or(0, |o| o.iter().filter(|&&b| b == b'\n').count())
    );
}
