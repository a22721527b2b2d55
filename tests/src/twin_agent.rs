//! A node agent on twin GPUs in the test's process, and the signed lease
//! that makes it log an event: what the whole-system tests of commands
//! and resends start from.

use loopwarden_bus::keys::SignKey;
use loopwarden_bus::{now_ms, Bus};
use loopwarden_protocol::{
    CapLease, CapSource, CommandAuth, DurationMs, Family, GpuCap, GpuSelector, Ident, Message,
    ReasonCode, Role, Topic, Watts,
};

/// Runs the node agent `flags` describe on `gpus` twin GPUs of the H200
/// board (the twin's noise from `seed`), on a thread and runtime of its
/// own; it stops when the returned sender is dropped.
pub fn run_twin_agent(
    flags: &node_agent::config::Overrides,
    gpus: usize,
    seed: u64,
) -> tokio::sync::oneshot::Sender<()> {
    let config = node_agent::config::load(None, flags).expect("the agent's config");
    let board = loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("board");
    let source = Box::new(node_agent::sim_gpus::TwinSource::new(&board, gpus, seed));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("a runtime");
        rt.block_on(node_agent::shell::run(config, source, async {
            let _ = rx.await;
        }))
    });
    tx
}

/// Sends host `host` of `site` a lease (id 1, replacing the last one)
/// capping every GPU at `watts` for a minute, as a facility budget,
/// signed with `key` (the key of `bus`'s node): each that changes the
/// limit makes the host log and publish an event.
pub fn signed_lease(bus: &Bus, key: &SignKey, site: &Ident, host: &Ident, watts: u32) {
    let topic = Topic::new(site, Role::Host, host, Family::Cmd);
    let caps = [GpuCap {
        gpus: GpuSelector::All,
        limit: Watts(watts),
    }]
    .into_iter()
    .collect();
    let message = Message::CapLease(CapLease {
        lease: 1,
        source: CapSource::FacilityBudget,
        reason: ReasonCode::CAPACITY_SHORT,
        caps,
        duration: DurationMs(60_000),
        auth: CommandAuth::default(),
    });
    let mut frame = bus.next_frame(message, now_ms());
    frame
        .sign(&topic, key.key_id, &key.key)
        .expect("a lease signs");
    bus.publish_frame(&topic, &frame)
        .expect("the lease is sent");
}
