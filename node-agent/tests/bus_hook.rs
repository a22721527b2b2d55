//! `shell::run_hooked`'s bus hook: an agent hands its bus over only once
//! its console is bound and its flash recorder runs, so a process that
//! runs many agents (the hall's fleet) sees one that fails at its start
//! as failed, never as started.

use std::path::Path;
use std::time::Duration;

use loopwarden_system_tests::free_port;
use node_agent::shell::{run_hooked, AgentError, RunHooks};

/// An agent on two twin GPUs whose console socket is `console`, its
/// flash in `dir`, its broker a port nobody listens on.
fn config(dir: &Path, console: &Path) -> node_agent::config::Config {
    let flags = node_agent::config::Overrides {
        common: loopwarden_field::common::CommonFlags {
            site: Some("hook".into()),
            broker: Some(format!("127.0.0.1:{}", free_port())),
            flash: Some(dir.join("agent.flash")),
            console: Some(console.to_path_buf()),
            ..Default::default()
        },
        host: Some("h1".into()),
        twin_gpus: Some(2),
        ..Default::default()
    };
    node_agent::config::load(None, &flags).expect("config")
}

/// Runs the agent of `config` until it ends, or for `run_for`; what it
/// returned (`None`: stopped by the wait) and what its bus hook got.
fn run(
    config: node_agent::config::Config,
    run_for: Duration,
) -> (Option<Result<(), AgentError>>, bool) {
    let board = loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("board");
    let twin = node_agent::sim_gpus::TwinSource::new(&board, 2, 1);
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let hooks = RunHooks {
        bus: Some(tx),
        ..RunHooks::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent = rt.spawn(run_hooked(config, Box::new(twin), hooks, async {
        let _ = stop_rx.await;
    }));
    let ended = rt.block_on(async {
        match tokio::time::timeout(run_for, agent).await {
            Ok(ended) => Some(ended.expect("the agent's task")),
            Err(_) => None,
        }
    });
    let handed = rx.try_recv().is_ok();
    let _ = stop_tx.send(());
    rt.shutdown_timeout(Duration::from_secs(10));
    (ended, handed)
}

/// A console socket path too long to bind (above the 108 bytes of a
/// Unix socket address): the agent fails at its start, and its bus hook
/// gets nothing, its sender dropped; with a path that binds, the same
/// agent hands its bus over and runs.
#[test]
fn an_agent_whose_console_cannot_bind_hands_no_bus() {
    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join("c".repeat(120));
    let (ended, handed) = run(config(dir.path(), &long), Duration::from_secs(30));
    match ended {
        Some(Err(AgentError::Console { path, .. })) => assert!(path.ends_with("ccc"), "{path}"),
        other => panic!("the agent did not fail on its console: {other:?}"),
    }
    assert!(
        !handed,
        "a bus handed over by an agent that failed at its start"
    );

    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("agent.sock");
    let (ended, handed) = run(config(dir.path(), &short), Duration::from_secs(3));
    assert!(ended.is_none(), "the agent ended: {ended:?}");
    assert!(handed, "no bus handed over by an agent that runs");
}
