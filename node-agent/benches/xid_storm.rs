//! Memory of the live agent in a storm of benign XIDs, and the latency of
//! a fatal XID inside the storm.
//!
//! `cargo bench -p node-agent --bench xid_storm [-- RATE SECONDS]` starts
//! a mosquitto on a loopback port, an agent in this process with 8 twin
//! GPUs sampled every second and a flash file (in `LOOPWARDEN_BENCH_DIR`,
//! else the system's temporary folder), and a `mosquitto_sub` on the
//! host's health topic. An injector thread then hands the agent RATE
//! (default 10,000) benign XIDs a second for SECONDS (default 10): XIDs 13,
//! 31, 43 and 45 in turn, round-robin over the GPUs, in a batch every
//! 10 ms, through the twin's fault injection, which puts them into the
//! agent's bounded XID queue as the driver's event thread does. Halfway
//! through it injects XID 79 on GPU 3 and the bench times how long until
//! the subscriber receives the health frame that shows GPU 3 quarantined.
//!
//! The process's resident memory (`VmRSS` of `/proc/self/status`) is
//! sampled every 100 ms from 2 s before the storm to 5 s after it. The
//! bench prints the rate reached, the memory before, at its peak during
//! and after the storm, the fatal XID's latency, the XID queue's counters
//! as the agent's console shows them (`ctl status`: `xids.queued`,
//! `xids.dropped`), and whether any other GPU changed health. With
//! `RUST_LOG` set, the agent's log goes to standard error.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use loopwarden_protocol::{Frame, HealthState, HostHealth, Message};
mod common;
use common::BenchAgent;
use node_agent::sim_gpus::{TwinControl, TwinFault};

/// GPUs of the host.
const GPUS: u8 = 8;
/// The GPU the fatal XID lands on.
const FATAL_GPU: u8 = 3;
/// Benign XIDs of the storm (application errors: no health change).
const BENIGN: [u16; 4] = [13, 31, 43, 45];
/// One batch of the storm every this long.
const BATCH_EVERY: Duration = Duration::from_millis(10);
/// Memory sampled every this long.
const RSS_EVERY: Duration = Duration::from_millis(100);
/// Memory sampled for this long before the storm and after it.
const BEFORE: Duration = Duration::from_secs(2);
const AFTER: Duration = Duration::from_secs(5);

/// The process's resident memory, kB.
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time of the whole process so far (user and system), from
/// `/proc/self/stat` in clock ticks of 10 ms.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// The agent's console answer to `status` (one line of JSON on its socket).
fn console_status(socket: &Path) -> Option<serde_json::Value> {
    let mut s = UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"{\"cmd\":\"status\"}\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    serde_json::from_str(text.lines().next()?).ok()
}

/// The host's health from one line of the subscriber.
fn health(seen: &loopwarden_system_tests::Seen) -> Option<HostHealth> {
    match Frame::decode(&seen.payload).ok()?.message {
        Message::HostHealth(h) => Some(h),
        _ => None,
    }
}

/// What the injector did.
struct Storm {
    started: Instant,
    ended: Instant,
    /// Benign XIDs handed over.
    benign: u64,
    /// Time spent inside `inject` itself.
    in_inject: Duration,
    /// Batches that started later than one period behind their schedule.
    late_batches: u64,
}

/// Injects `rate` benign XIDs a second for `seconds`, and XID 79 on
/// [`FATAL_GPU`] halfway; sends the instant of the fatal XID on `fatal`.
fn storm(control: TwinControl, rate: u64, seconds: u64, fatal: mpsc::Sender<Instant>) -> Storm {
    let batches = seconds * 1000 / BATCH_EVERY.as_millis() as u64;
    let per_batch = rate * BATCH_EVERY.as_millis() as u64 / 1000;
    let started = Instant::now();
    let mut benign = 0u64;
    let mut in_inject = Duration::ZERO;
    let mut late_batches = 0;
    for k in 0..batches {
        let due = started + BATCH_EVERY * k as u32;
        match due.checked_duration_since(Instant::now()) {
            Some(wait) => std::thread::sleep(wait),
            None if Instant::now() - due > BATCH_EVERY => late_batches += 1,
            None => {}
        }
        let t = Instant::now();
        for _ in 0..per_batch {
            let fault = TwinFault::Xid {
                gpu: (benign % GPUS as u64) as u8,
                xid: BENIGN[(benign / GPUS as u64 % BENIGN.len() as u64) as usize],
            };
            control.inject(fault).expect("inject");
            benign += 1;
        }
        in_inject += t.elapsed();
        if k == batches / 2 {
            let at = Instant::now();
            control
                .inject(TwinFault::Xid {
                    gpu: FATAL_GPU,
                    xid: 79,
                })
                .expect("inject");
            let _ = fatal.send(at);
        }
    }
    Storm {
        started,
        ended: Instant::now(),
        benign,
        in_inject,
        late_batches,
    }
}

fn main() {
    // The agent's log, when asked for (`RUST_LOG=warn,node_agent::shell=error`:
    // the storm's XIDs are each a warning).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let numbers: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rate = numbers.first().copied().unwrap_or(10_000);
    let seconds = numbers.get(1).copied().unwrap_or(10).max(1);
    let Some(mut agent) = BenchAgent::start(GPUS) else {
        return;
    };
    let socket = agent.socket.clone();
    let control = agent.control.clone();
    let sub = &mut agent.sub;
    // The first retained health: the agent is on the bus.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last_health = loop {
        let left = deadline
            .checked_duration_since(Instant::now())
            .expect("the agent's first health within 20 s");
        if let Some(h) = sub.next(left).as_ref().and_then(health) {
            break h;
        }
    };
    // Let start-up settle before measuring.
    std::thread::sleep(Duration::from_secs(2));

    // Memory, every 100 ms until told to stop.
    let base = Instant::now();
    let stop_rss = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop_rss.clone();
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut k = 0u32;
            while !stop.load(Ordering::Relaxed) {
                samples.push((Instant::now(), rss_kb(), cpu_time()));
                k += 1;
                if let Some(wait) = (base + RSS_EVERY * k).checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            samples
        })
    };
    // The XID queue as the console shows it, every 100 ms.
    let watcher = {
        let stop = stop_rss.clone();
        let socket = socket.clone();
        std::thread::spawn(move || {
            let mut most = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Some(v) = console_status(&socket) {
                    most = most.max(v["xids"]["queued"].as_u64().unwrap_or(0));
                }
                std::thread::sleep(RSS_EVERY);
            }
            most
        })
    };
    std::thread::sleep(BEFORE);

    let (fatal_tx, fatal_rx) = mpsc::channel();
    let injector = std::thread::spawn(move || storm(control, rate, seconds, fatal_tx));
    let fatal_at = fatal_rx
        .recv_timeout(Duration::from_secs(seconds * 10 + 60))
        .expect("the fatal XID was injected");
    let mut quarantined_at = None;
    let deadline = fatal_at + Duration::from_secs(30);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Some(seen) = sub.next(left) else { break };
        let at = Instant::now();
        if let Some(h) = health(&seen) {
            let done = h
                .gpus
                .get(FATAL_GPU as usize)
                .is_some_and(|g| g.state == HealthState::Quarantined);
            last_health = h;
            if done {
                quarantined_at = Some(at);
                break;
            }
        }
    }
    let storm = injector.join().expect("injector");
    let at_end = console_status(&socket);
    std::thread::sleep(AFTER.saturating_sub(storm.ended.elapsed()));
    stop_rss.store(true, Ordering::Relaxed);
    let samples = sampler.join().expect("sampler");
    let most_queued = watcher.join().expect("watcher");
    let after = console_status(&socket);
    // Any health frame since: the last one says where every GPU stands.
    while let Some(seen) = sub.next(Duration::from_millis(500)) {
        if let Some(h) = health(&seen) {
            last_health = h;
        }
    }
    agent.stop();

    let storm_s = (storm.ended - storm.started).as_secs_f64();
    let mb = |kb: u64| kb as f64 / 1024.0;
    let before = samples.iter().rfind(|(t, ..)| *t < storm.started);
    let during: Vec<_> = samples
        .iter()
        .filter(|(t, ..)| *t >= storm.started && *t <= storm.ended)
        .collect();
    let before_kb = before.map(|s| s.1).unwrap_or(0);
    let peak_kb = during.iter().map(|s| s.1).max().unwrap_or(0);
    let after_kb = samples.last().map(|s| s.1).unwrap_or(0);
    let cpu = match (during.first(), during.last()) {
        (Some(a), Some(b)) if b.0 > a.0 => {
            (b.2 - a.2).as_secs_f64() / (b.0 - a.0).as_secs_f64() * 100.0
        }
        _ => 0.0,
    };
    println!(
        "storm: {} benign XIDs in {:.2} s ({:.0}/s asked {rate}/s; inject itself {:.2} µs each, {} batches late)",
        storm.benign,
        storm_s,
        storm.benign as f64 / storm_s,
        storm.in_inject.as_secs_f64() * 1e6 / storm.benign.max(1) as f64,
        storm.late_batches
    );
    println!(
        "VmRSS ({} samples every {} ms): before {:.1} MB, peak during {:.1} MB, after {:.1} MB",
        samples.len(),
        RSS_EVERY.as_millis(),
        mb(before_kb),
        mb(peak_kb),
        mb(after_kb)
    );
    println!("CPU of the process (agent and injector) during the storm: {cpu:.0} % of one core");
    match quarantined_at {
        Some(t) => println!(
            "XID 79 on GPU {FATAL_GPU} to retained quarantine on the broker: {:.2} ms",
            (t - fatal_at).as_secs_f64() * 1000.0
        ),
        None => println!("XID 79 on GPU {FATAL_GPU}: no quarantine within 30 s"),
    }
    let xids = |v: &Option<serde_json::Value>| {
        v.as_ref()
            .map(|v| {
                format!(
                    "XIDs queued {}, dropped {}, capacity {}; flash queue dropped {}; \
                     bus published {}, dropped {}; longest sampling round {} ms; \
                     quarantined {}",
                    v["xids"]["queued"],
                    v["xids"]["dropped"],
                    v["xids"]["capacity"],
                    v["bus"]["dropped_flash_queue"],
                    v["bus"]["published"],
                    v["bus"]["dropped"],
                    v["sample_ms"]["max"],
                    v["health"]["quarantined"]
                )
            })
            .unwrap_or_else(|| "console did not answer".into())
    };
    println!("ctl status at the storm's end: {}", xids(&at_end));
    println!("ctl status 5 s after: {}", xids(&after));
    println!("most XIDs queued at once, as the console showed every 100 ms: {most_queued}");
    let others: Vec<String> = last_health
        .gpus
        .iter()
        .filter(|g| g.gpu.get() != FATAL_GPU && g.state != HealthState::Healthy)
        .map(|g| format!("GPU {} {:?}", g.gpu.get(), g.state))
        .collect();
    if others.is_empty() {
        println!("every other GPU stayed healthy");
    } else {
        println!("other GPUs not healthy: {}", others.join(", "));
    }
}
