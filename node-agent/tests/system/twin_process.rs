//! Agents in a process of their own over twin GPUs, for the tests that
//! crash an agent in the middle of an action (`actions_faults.rs`), and
//! the CDU's state and scripts they need; the other tests do without.

use super::*;

/// The variable that makes the test binary, run again by
/// [`Rig::spawn_twin_process`], an agent: its flags, as a JSON array.
pub const TWIN_PROCESS_ENV: &str = "LOOPWARDEN_RIG_TWIN_PROCESS";

impl Rig {
    /// The CDU's state with rack 2 lost or every rack normal, as `cdu-a`
    /// publishes it (retained, signed with the demonstration key) on its
    /// health topic, numbered `seq`.
    pub fn publish_cdu_state(&self, rack2_lost: bool, seq: u32) {
        let topic = cdu_health_topic();
        let mut f = Frame {
            sender: NodeId::new(Role::Cdu, "cdu-a").expect("ident"),
            seq,
            time: now(),
            message: Message::CduState(cdu_state(rack2_lost)),
        };
        f.sign(&topic, 1, &samples::demo_signing_key())
            .expect("signs");
        let bytes = f.to_vec().expect("encodes");
        self.publish(&topic.build().expect("topic"), &bytes, true);
    }

    /// The broker forgets `cdu-a`'s retained state: an agent started now
    /// hears nothing from the CDU until its next state.
    pub fn forget_cdu_state(&self) {
        self.publish(&cdu_health_topic().build().expect("topic"), &[], true);
    }

    /// A script `name` in the rig's directory that runs `body` under
    /// `/bin/sh`; returns its path.
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("script");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        path
    }

    /// An agent over `gpus` twin GPUs in a process of its own, on the
    /// rig's flash, with `flags` as `node-agent run` takes them after the
    /// rig's own (site, host, broker, console, CDU `cdu-a`, a 200 ms
    /// period): the test binary run again at the test `entry`, which calls
    /// [`twin_process_main`]. So a test can inject XIDs into its GPUs
    /// ([`TwinProcess::xids`]) and still kill it as a crash. Its log is
    /// appended to `agent.log` in the rig's directory
    /// ([`TwinProcess::log`]). Returns once its console answers.
    pub fn spawn_twin_process(&self, entry: &str, gpus: u8, flags: &[String]) -> TwinProcess {
        self.spawn_twin_process_with(entry, gpus, flags, &[])
    }

    /// [`Rig::spawn_twin_process`] with these variables set in the
    /// agent's environment (a fault injected, as a slow flash).
    pub fn spawn_twin_process_with(
        &self,
        entry: &str,
        gpus: u8,
        flags: &[String],
        env: &[(&str, &str)],
    ) -> TwinProcess {
        let console = self.console();
        let mut args: Vec<String> = [
            "--twin-gpus",
            &gpus.to_string(),
            "--site",
            SITE,
            "--host",
            self.host,
            "--broker",
            &format!("127.0.0.1:{}", self.port),
            "--cdu",
            "cdu-a",
            "--period-ms",
            "200",
            "--json-period-ms",
            "1000",
        ]
        .map(String::from)
        .to_vec();
        args.push("--console".into());
        args.push(console.0.display().to_string());
        args.push("--flash".into());
        args.push(self.flash().display().to_string());
        args.extend(flags.iter().cloned());
        let (log, log_path) = self.agent_log();
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                entry,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                TWIN_PROCESS_ENV,
                serde_json::to_string(&args).expect("JSON"),
            )
            .env("RUST_LOG", "info,rumqttc=warn")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the test binary as an agent");
        let stdin = child.stdin.take();
        let agent = TwinProcess {
            child: Some(child),
            stdin,
            console,
            log: log_path,
        };
        agent.ctl_within(
            &["status"],
            Duration::from_secs(20),
            "the agent's console never answered",
        );
        agent
    }
}

/// The agent's side of [`Rig::spawn_twin_process`]: runs the agent the
/// flags in [`TWIN_PROCESS_ENV`] describe until SIGTERM, injecting each
/// `xid GPU CODE` line of its standard input into its twin GPUs, then
/// exits (0 after a clean stop). Without the variable (the test run by
/// `cargo test -- --ignored`) it returns at once.
pub fn twin_process_main() {
    use std::io::BufRead;
    let Ok(json) = std::env::var(TWIN_PROCESS_ENV) else {
        return;
    };
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        run: loopwarden_field::common::RunArgs<Overrides>,
    }
    let args: Vec<String> = serde_json::from_str(&json).expect("the flags, as JSON");
    let cli = <Cli as clap::Parser>::parse_from(std::iter::once("agent".to_string()).chain(args));
    loopwarden_bus::init_agent_logging();
    let config = node_agent::config::load(None, &cli.run.flags).expect("config");
    let node_agent::config::GpuSourceKind::Twin(n) = config.gpus else {
        panic!("an agent of the rig runs on twin GPUs");
    };
    let twin = TwinSource::new(&config.board, n as usize, 3);
    let control = twin.control();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["xid", gpu, code] = words[..] {
                let fault = node_agent::sim_gpus::TwinFault::Xid {
                    gpu: gpu.parse().expect("a GPU index"),
                    xid: code.parse().expect("an XID"),
                };
                if let Err(e) = control.inject(fault) {
                    eprintln!("rig: {line}: {e}");
                }
            }
        }
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM caught");
        node_agent::shell::run(config, Box::new(twin), async move {
            term.recv().await;
        })
        .await
    });
    if let Err(e) = &result {
        eprintln!("agent: {e}");
    }
    std::process::exit(i32::from(result.is_err()));
}

/// `cdu-a`'s health topic, where its state goes.
fn cdu_health_topic() -> loopwarden_protocol::Topic {
    loopwarden_protocol::Topic::new(
        &loopwarden_protocol::Ident::new(SITE).expect("ident"),
        Role::Cdu,
        &loopwarden_protocol::Ident::new("cdu-a").expect("ident"),
        loopwarden_protocol::Family::Health,
    )
}

/// An agent run by [`Rig::spawn_twin_process`]; killed when dropped.
pub struct TwinProcess {
    child: Option<Child>,
    stdin: Option<std::process::ChildStdin>,
    console: Console,
    /// Its log (and those of the agents before it in this rig).
    pub log: PathBuf,
}

impl TwinProcess {
    /// The driver reports these XIDs (GPU, code), in order, as fast as the
    /// pipe takes them.
    pub fn xids(&mut self, xids: &[(u8, u16)]) {
        use std::io::Write;
        let text: String = xids
            .iter()
            .map(|(gpu, code)| format!("xid {gpu} {code}\n"))
            .collect();
        let stdin = self.stdin.as_mut().expect("running");
        stdin.write_all(text.as_bytes()).expect("to the agent");
        stdin.flush().expect("to the agent");
    }

    /// The log so far (every agent of this rig's).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills it without warning (SIGKILL): a crash. What it started (an
    /// action's process) runs on, as after a crash outside systemd.
    pub fn crash(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().expect("kill");
        child.wait().expect("reap");
    }

    /// Stops it with SIGTERM, as systemd does; returns its exit status
    /// and how long the stop took. Fails after `within`.
    pub fn terminate(&mut self, within: Duration) -> (std::process::ExitStatus, Duration) {
        let mut child = self.child.take().expect("running");
        let asked = Instant::now();
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill -TERM");
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return (status, asked.elapsed());
            }
            if asked.elapsed() > within {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the agent did not stop within {within:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Deref for TwinProcess {
    type Target = Console;
    fn deref(&self) -> &Console {
        &self.console
    }
}

impl Drop for TwinProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
