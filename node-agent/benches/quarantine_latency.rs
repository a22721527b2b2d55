//! Decision latency of the live agent: from an XID reaching the agent to
//! the quarantine in the retained health on the broker.
//!
//! `cargo bench -p node-agent --bench quarantine_latency [-- ROUNDS]`
//! starts a mosquitto on a loopback port, an agent in this process with 8
//! twin GPUs sampled every second (so XIDs also land while a sample round
//! runs), and a `mosquitto_sub` on the host's health topic. Each round
//! injects XID 79 on one GPU (the twin hands it to the agent as the
//! driver's event thread would), waits until the subscriber receives the
//! health frame that shows that GPU quarantined, then releases it with a
//! signed command sent by `mosquitto_pub` and waits for it to be healthy.
//! It prints p50, p99 and the maximum over the rounds (default 200).
//!
//! The time covers: the agent's event bridge, the health engine, keeping
//! the state in flash (a file, with its sync), the outbox, mosquitto, and
//! `mosquitto_sub` writing the line to its pipe.

use std::time::{Duration, Instant, SystemTime};

use loopwarden_protocol::{
    samples, CommandAuth, Frame, GpuIndex, HealthState, Ident, Message, NodeId, QuarantineRelease,
    Role, Text, TimestampMs,
};
use loopwarden_system_tests::{publish_raw, Subscriber};

mod common;
use common::{BenchAgent, HOST, SITE};

fn now() -> TimestampMs {
    TimestampMs(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as u64,
    )
}

/// Waits until the health topic shows `gpu` in `state`.
fn wait_for(sub: &mut Subscriber, gpu: usize, state: HealthState) -> Option<Instant> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let seen = sub.next(left)?;
        let at = Instant::now();
        if let Ok(Frame {
            message: Message::HostHealth(h),
            ..
        }) = Frame::decode(&seen.payload)
        {
            if h.gpus.get(gpu).is_some_and(|g| g.state == state) {
                return Some(at);
            }
        }
    }
    None
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200);
    let Some(mut agent) = BenchAgent::start(8) else {
        return;
    };
    let (port, site, host) = (agent.port, SITE, HOST);
    let sub = &mut agent.sub;
    // The first retained health: the agent is on the bus.
    wait_for(sub, 0, HealthState::Healthy).expect("the agent's health");

    let mut lat = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let gpu = round % 8;
        let t0 = Instant::now();
        agent
            .control
            .inject(node_agent::sim_gpus::TwinFault::Xid {
                gpu: gpu as u8,
                xid: 79,
            })
            .expect("inject");
        let t1 = wait_for(sub, gpu, HealthState::Quarantined).expect("quarantined");
        lat.push(t1.duration_since(t0));
        let mut release = Frame {
            sender: NodeId::new(Role::Operator, "bench").expect("ident"),
            seq: round as u32 + 1,
            time: now(),
            message: Message::QuarantineRelease(QuarantineRelease {
                gpu: GpuIndex::new(gpu as u8).expect("index"),
                operator: Ident::new("bench").expect("ident"),
                note: Text::new("latency bench").expect("note"),
                auth: CommandAuth::default(),
            }),
        };
        let to = loopwarden_protocol::Topic::new(
            &Ident::new(site).expect("ident"),
            Role::Host,
            &Ident::new(host).expect("ident"),
            loopwarden_protocol::Family::Cmd,
        );
        release
            .sign(&to, 1, &samples::demo_signing_key())
            .expect("signs");
        let mut buf = [0u8; 2048];
        let n = release.encode(&mut buf).expect("encodes");
        publish_raw(
            port,
            &format!("dc/v2/{site}/host/{host}/cmd"),
            &buf[..n],
            false,
        )
        .expect("mosquitto_pub");
        wait_for(sub, gpu, HealthState::Healthy).expect("released");
        // Land the next XID at a different point of the sampling period.
        std::thread::sleep(Duration::from_millis(37));
    }
    agent.stop();

    lat.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pct = |p: f64| lat[((p / 100.0) * (lat.len() - 1) as f64).round() as usize];
    println!(
        "XID to retained quarantine on the broker, {} rounds: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms, min {:.2} ms",
        lat.len(),
        ms(pct(50.0)),
        ms(pct(90.0)),
        ms(pct(99.0)),
        ms(*lat.last().expect("rounds")),
        ms(lat[0])
    );
}
