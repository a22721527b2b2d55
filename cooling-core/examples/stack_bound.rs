//! An upper bound on the control core's stack use on the host: runs the
//! core (boot, then two optimiser cycles with 16 fresh host reports) on a
//! thread with a given stack, in a child process per size, and prints the
//! smallest stack it ran in (16 KiB is the smallest glibc gives a thread). A thread that overflows its stack aborts its
//! process, so each size is tried in a child of its own.
//!
//! `cargo run --release -p cooling-core --example stack_bound`

use std::process::Command;

use cooling_core::{CduReadings, Core, CoreConfig, HostReport, Inputs, LeakInputs, MAX_HOSTS};

/// Runs the core for a while; returns the number of steps.
fn exercise() -> usize {
    let cfg = CoreConfig::default();
    let mut core = Core::new(cfg).expect("default config");
    let mut hosts = [None; MAX_HOSTS];
    let mut n = 0;
    for s in 0..300u64 {
        let now = s * 1000;
        for h in hosts.iter_mut().take(cfg.layout.hosts()) {
            *h = Some(HostReport {
                gpus: 8,
                hottest_c: 70.0,
                gpu_power_w: 8.0 * 600.0,
                limit_w: 700.0,
                slowdown: false,
                at_ms: now,
            });
        }
        let c = core.step(&Inputs {
            now_ms: now,
            cdu: Some(CduReadings {
                supply_c: Some(35.0),
                return_c: Some(43.0),
                flow_lpm: Some(192.0 * 0.7),
                facility_supply_c: Some(32.0),
                pumps_running: [true, false],
                it_w: Some(100_000.0),
                facility_w: Some(110_000.0),
                ..Default::default()
            }),
            ambient_c: Some(25.0),
            leaks: LeakInputs::DRY,
            cdu_taken: cooling_core::Taken::ALL,
            valves_held: 0,
            hosts: &hosts,
        });
        n += usize::from(c.pump_on[0] || c.pump_on[1]);
    }
    n
}

fn main() {
    if let Ok(size) = std::env::var("LW_STACK_PROBE") {
        let size: usize = size.parse().expect("a size in bytes");
        let t = std::thread::Builder::new()
            .stack_size(size)
            .spawn(exercise)
            .expect("a thread");
        let steps = t.join().expect("the probe thread");
        assert_eq!(steps, 300);
        return;
    }
    let me = std::env::current_exe().expect("own path");
    // 16 KiB is the smallest thread stack glibc gives (PTHREAD_STACK_MIN):
    // below it a request is rounded up, so smaller sizes would prove nothing.
    let sizes = [256, 128, 64, 48, 32, 24, 20, 16].map(|k| k * 1024);
    let mut smallest = None;
    for size in sizes {
        let ok = Command::new(&me)
            .env("LW_STACK_PROBE", size.to_string())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        println!(
            "{:>4} KiB thread stack: {}",
            size / 1024,
            if ok { "ran" } else { "overflowed" }
        );
        if ok {
            smallest = Some(size);
        } else {
            break;
        }
    }
    match smallest {
        Some(s) => println!(
            "the core ran in a {} KiB thread stack (Core {} B, Commands {} B; the thread's own start-up is included)",
            s / 1024,
            std::mem::size_of::<Core>(),
            std::mem::size_of::<cooling_core::Commands>()
        ),
        None => println!("the core did not run in any of the stacks tried"),
    }
}
