//! A private three-node NATS cluster for the tests of the broker cluster
//! the project ships (`deploy/nats/cluster.sh`): started on free loopback
//! ports, each node stopped and restarted on command, stopped when
//! dropped.
use super::*;

/// A three-node NATS cluster (JetStream, MQTT) run by
/// `deploy/nats/cluster.sh` on free loopback ports, its stores and logs in
/// a temporary directory; stopped when dropped. Nodes are numbered 1 to 3.
pub struct NatsCluster {
    dir: tempfile::TempDir,
    server: PathBuf,
    mqtt: [u16; 3],
    http: [u16; 3],
}

impl NatsCluster {
    /// Starts the three nodes and waits until each takes MQTT
    /// connections, or `None` (skip) when `nats-server` is not installed
    /// outside CI.
    pub fn start() -> Option<NatsCluster> {
        let server = require_tool("nats-server")?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        // Below the ephemeral range and never given twice (`free_port`),
        // so no client's source port takes one before its node binds it.
        let ports: Vec<u16> = (0..12).map(|_| free_port()).collect();
        let list = |k: usize| {
            ports[3 * k..3 * k + 3]
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let three = |k: usize| [ports[3 * k], ports[3 * k + 1], ports[3 * k + 2]];
        let cluster = NatsCluster {
            dir,
            server,
            mqtt: three(2),
            http: three(3),
        };
        let out = cluster
            .script(&["start"])
            .env("NATS_CLIENT_PORTS", list(0))
            .env("NATS_CLUSTER_PORTS", list(1))
            .env("NATS_MQTT_PORTS", list(2))
            .env("NATS_HTTP_PORTS", list(3))
            .output()
            .expect("run deploy/nats/cluster.sh");
        assert!(
            out.status.success(),
            "cluster.sh start failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(cluster)
    }

    /// `deploy/nats/cluster.sh ARGS… DIR`.
    fn script(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg(repo_root().join("deploy/nats/cluster.sh"))
            .args(args)
            .arg(self.dir.path())
            .env("NATS_SERVER", &self.server)
            .env("NATS_READY_TIMEOUT", "60");
        cmd
    }

    fn run(&self, args: &[&str]) -> String {
        let out = self
            .script(args)
            .output()
            .expect("run deploy/nats/cluster.sh");
        assert!(
            out.status.success(),
            "cluster.sh {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Node `n`'s MQTT port.
    pub fn mqtt_port(&self, n: usize) -> u16 {
        self.mqtt[n - 1]
    }

    /// Node `n`'s monitoring port (`/varz`, `/connz`, `/healthz`).
    pub fn http_port(&self, n: usize) -> u16 {
        self.http[n - 1]
    }

    /// The MQTT addresses of `nodes`, in that order, as the agents'
    /// `broker` setting takes them (`127.0.0.1:P,127.0.0.1:Q,…`).
    pub fn brokers(&self, nodes: &[usize]) -> String {
        nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", self.mqtt_port(*n)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Kills node `n` (SIGKILL: a crash; no last will leaves it).
    pub fn kill_node(&self, n: usize) {
        self.run(&["kill-node", &n.to_string()]);
    }

    /// Starts node `n` again (same ports, same store); see [`Self::status`].
    pub fn start_node(&self, n: usize) {
        self.run(&["start-node", &n.to_string()]);
    }

    /// Waits until every running node takes MQTT connections; what
    /// `cluster.sh status` printed.
    pub fn status(&self) -> String {
        self.run(&["status"])
    }

    /// Node `n`'s `/varz` (server counters) as JSON.
    pub fn varz(&self, n: usize) -> serde_json::Value {
        let addr: SocketAddr = ([127, 0, 0, 1], self.http_port(n)).into();
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("node {n}'s monitoring port {addr}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        std::io::Write::write_all(&mut s, b"GET /varz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .expect("send GET /varz");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut s, &mut text).expect("read /varz");
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("node {n}'s /varz is no JSON ({e}): {text}"))
    }

    /// What node `n` logged (for failure messages).
    pub fn log(&self, n: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("n{n}.log"))).unwrap_or_default()
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        let _ = self.script(&["stop"]).output();
    }
}
