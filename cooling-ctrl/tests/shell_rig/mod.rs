//! What the tests of the controller's shell on a real mosquitto share
//! (`facility_bus`, `failover`, `northbound_shutdown`): a simulated CDU
//! on Modbus TCP, the shell started on it, waited on through its stats
//! and stopped, and the retained frames a broker holds.

use std::time::Duration;

use cooling_ctrl::modbus::{Link, ModbusCdu};
use cooling_ctrl::shell::{self, ShellConfig, ShellError, ShellOptions, ShellStats};
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_protocol::Ident;
use loopwarden_system_tests::{retained, steady_sim_cdu, Seen};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

pub fn id(s: &str) -> Ident {
    Ident::new(s).expect("an ident")
}

/// How long the controller's port waits for each answer of the
/// simulated CDU. The tests on it never silence the CDU, so this is no
/// timeout they exercise, only how late an answer may come before the
/// shell reads the CDU as silent (a step without its measurements): the
/// CDU answers on this runtime, whose two workers the shell shares, and a
/// loaded machine can hold an answer some hundred milliseconds. A
/// passing test never waits it out.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// A steady simulated CDU served on a free loopback port (on this
/// runtime), and the controller's port to it.
pub async fn sim_cdu() -> ModbusCdu {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(steady_sim_cdu().serve(listener));
    ModbusCdu::new(RegisterMap::sim_cdu(), Link::Tcp(addr.into())).with_timeout(ANSWER_WITHIN)
}

/// A shell running on a task of its own, as `shell::run_with` runs it.
pub struct Running {
    /// What it reports.
    pub stats: watch::Receiver<ShellStats>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), ShellError>>,
}

impl Running {
    /// Starts the shell of `cfg` on `port`, as `opts` says, reporting
    /// its stats here.
    pub fn start(cfg: ShellConfig, mut opts: ShellOptions, port: ModbusCdu) -> Running {
        let (tx, stats) = shell::stats_channel();
        opts.stats = Some(tx);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(shell::run_with(cfg, opts, port, async {
            let _ = stopped.await;
        }));
        Running { stats, stop, task }
    }

    /// The first stats `f` holds for, `within`; panics with `what`
    /// otherwise.
    pub async fn wait(
        &mut self,
        within: Duration,
        what: &str,
        f: impl FnMut(&ShellStats) -> bool,
    ) -> ShellStats {
        let got = tokio::time::timeout(within, self.stats.wait_for(f))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|s| s.clone());
        match got {
            Some(s) => s,
            None => {
                let s = self.stats.borrow();
                panic!(
                    "{what}: not within {within:?}; steps {}, status {:?}",
                    s.steps, s.status
                )
            }
        }
    }

    /// Stops it; it must end cleanly within 8 s.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(8), self.task)
            .await
            .expect("stops")
            .expect("no panic")
            .expect("clean stop");
    }
}

/// The retained frames under `filter` on the broker at `port`, as a new
/// subscriber gets them within `settle`.
pub async fn retained_now(port: u16, filter: String, settle: Duration) -> Vec<Seen> {
    tokio::task::spawn_blocking(move || retained(port, &[&filter], settle))
        .await
        .expect("mosquitto_sub runs")
        .expect("mosquitto_sub is installed")
}
