//! The shell on slow and stuck lines: long answers, agents that do not
//! answer, idle time against writes and answers, and no drain on the
//! runtime thread.

use super::*;

/// An agent whose `status` answers `lines` lines of text `after` the
/// command, or never (`None`: its loop or its flash hangs).
struct Answering {
    lines: Option<usize>,
    after: Duration,
}

impl SerialAgent for Answering {
    fn identity(&self) -> Identity {
        TestAgent.identity()
    }
    fn commands(&self) -> &'static [Spec] {
        COMMANDS
    }
    async fn run(&self, _words: &[String], _operator: &str) -> Answer {
        let Some(lines) = self.lines else {
            return std::future::pending().await;
        };
        tokio::time::sleep(self.after).await;
        let text = (0..lines).map(|i| format!("event {i:>6} of a long log\n"));
        Answer {
            text: text.collect(),
            ok: true,
        }
    }
}

/// Runs the shell for `agent` over a line that takes 64 bytes at a time,
/// its sessions closed after `idle`; gives the engineer's end and what
/// the journal took.
fn slow_line(agent: Answering, idle: Duration) -> (tokio::io::DuplexStream, Arc<Mutex<Vec<What>>>) {
    let console = SerialConsole {
        port: "/dev/ttyS1".into(),
        baud: 9_600,
        password_hash: None,
        idle,
    };
    let (agent_end, engineer) = tokio::io::duplex(64);
    let records = Arc::new(Mutex::new(Vec::new()));
    let kept = records.clone();
    tokio::spawn(async move {
        let mut session = new_session(&console, &agent);
        let journal = move |r: Record, _| kept.lock().unwrap().push(r.what);
        run(
            agent_end,
            (&mut session, &mut password::Checker::default()),
            Instant::now(),
            &console,
            &agent,
            &journal,
        )
        .await
    });
    (engineer, records)
}

#[tokio::test(start_paused = true)]
async fn a_long_answer_on_a_slow_line_is_written_whole_however_long_it_takes() {
    // 4,000 lines, some 112 KB: 64 bytes every 100 ms takes nearly 3
    // minutes, far past the 30 s the line may take no byte at all.
    let (mut engineer, records) = slow_line(
        Answering {
            lines: Some(4_000),
            after: Duration::ZERO,
        },
        Duration::from_secs(600),
    );
    until(&mut engineer, "u1> ").await;
    engineer.write_all(b"status\r").await.unwrap();
    let started = Instant::now();
    let mut seen = Vec::new();
    let mut buf = [0u8; 64];
    while !String::from_utf8_lossy(&seen).ends_with("u1> ") {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let n = engineer.read(&mut buf).await.unwrap();
        assert!(n > 0, "the line closed after {} bytes", seen.len());
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(started.elapsed() > Duration::from_secs(150));
    let text = String::from_utf8(seen).unwrap();
    assert!(
        text.contains("event   3999 of a long log\r\n"),
        "the last line"
    );
    assert_eq!(*records.lock().unwrap(), [What::SessionOpened]);
}

#[tokio::test(start_paused = true)]
async fn an_agent_that_never_answers_gets_the_line_back_after_the_answer_limit() {
    let (mut engineer, _records) = slow_line(
        Answering {
            lines: None,
            after: Duration::ZERO,
        },
        Duration::from_secs(600),
    );
    until(&mut engineer, "u1> ").await;
    engineer.write_all(b"status\r").await.unwrap();
    let started = Instant::now();
    let text = until(&mut engineer, "u1> ").await;
    assert_eq!(started.elapsed(), ANSWER_LIMIT);
    assert!(
        text.contains("no answer within 12 s: the program may be stuck"),
        "{text:?}"
    );
    // The line is the engineer's again.
    engineer.write_all(b"help\r").await.unwrap();
    assert!(until(&mut engineer, "u1> ").await.contains("commands:"));
}

/// Reads `engineer`'s end 64 bytes every 100 ms (a slow line) until
/// `want` appears; everything read.
async fn slowly_until(engineer: &mut tokio::io::DuplexStream, want: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 64];
    while !String::from_utf8_lossy(&seen).contains(want) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let read = tokio::time::timeout(Duration::from_secs(3600), engineer.read(&mut buf)).await;
        let text = String::from_utf8_lossy(&seen).into_owned();
        let n = read.unwrap_or_else(|_| panic!("no {want:?} after {text:?}"));
        let n = n.unwrap();
        assert!(n > 0, "the line closed after {} bytes", seen.len());
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(seen).unwrap()
}

#[tokio::test(start_paused = true)]
async fn idle_counts_from_the_end_of_a_long_write_not_from_the_enter_key() {
    // Some 3 minutes of writing, three times the idle time.
    let agent = Answering {
        lines: Some(4_000),
        after: Duration::ZERO,
    };
    let (mut engineer, _records) = slow_line(agent, Duration::from_secs(60));
    until(&mut engineer, "u1> ").await;
    engineer.write_all(b"status\r").await.unwrap();
    let text = slowly_until(&mut engineer, "u1> ").await;
    assert!(!text.contains("idle"), "closed while answering");
    let answered = Instant::now();
    let text = slowly_until(&mut engineer, "idle").await;
    assert!(text.contains("session closed after 60 s idle"), "{text:?}");
    // The last 64 bytes were taken up to 100 ms before they were read.
    let idle = answered.elapsed();
    assert!(
        idle > Duration::from_millis(59_800) && idle <= Duration::from_secs(60),
        "{idle:?}"
    );
}

/// Reads `end` until `want` appears, or fails after an hour of nothing
/// (in paused time: at once when nothing else is to come); everything
/// read, and when `mark` first appeared in it.
async fn until_marked(
    end: &mut tokio::io::DuplexStream,
    mark: &str,
    want: &str,
) -> (String, Option<Instant>) {
    let mut seen = Vec::new();
    let mut marked = None;
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&seen).contains(want) {
        let read = tokio::time::timeout(Duration::from_secs(3600), end.read(&mut buf)).await;
        let text = String::from_utf8_lossy(&seen).into_owned();
        let n = read.unwrap_or_else(|_| panic!("no {want:?} after {text:?}"));
        let n = n.unwrap();
        assert!(n > 0, "closed before {want:?}: {text:?}");
        seen.extend_from_slice(&buf[..n]);
        if marked.is_none() && String::from_utf8_lossy(&seen).contains(mark) {
            marked = Some(Instant::now());
        }
    }
    (String::from_utf8(seen).unwrap(), marked)
}

#[tokio::test(start_paused = true)]
async fn idle_counts_from_a_slow_answer_not_from_the_enter_key() {
    let agent = Answering {
        lines: Some(1),
        after: Duration::from_secs(11),
    };
    let (mut engineer, _records) = slow_line(agent, Duration::from_secs(10));
    until(&mut engineer, "u1> ").await;
    engineer.write_all(b"status\r").await.unwrap();
    let answer = "event      0 of a long log\r\nu1> ";
    let (text, answered) = until_marked(&mut engineer, answer, "idle").await;
    assert!(text.contains("session closed after 10 s idle"), "{text:?}");
    let answered = answered.unwrap_or_else(|| panic!("no answer in {text:?}"));
    assert_eq!(answered.elapsed(), Duration::from_secs(10), "{text:?}");
}

/// A port whose flush blocks the thread that calls it while the line
/// drains, as a serial port's does (`tcdrain`), and notes that thread.
struct DrainingPort {
    inner: tokio::io::DuplexStream,
    flushed_on: Arc<Mutex<Vec<std::thread::ThreadId>>>,
}

impl tokio::io::AsyncRead for DrainingPort {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for DrainingPort {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.flushed_on
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        std::thread::sleep(Duration::from_millis(200));
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[tokio::test(start_paused = true)]
async fn the_port_is_never_drained_on_the_runtime_thread() {
    // One thread runs everything, as in the node agent: a drain there
    // stops every loop of the agent for as long as the line takes.
    let runtime_thread = std::thread::current().id();
    let flushed_on = Arc::new(Mutex::new(Vec::new()));
    let (agent_end, mut engineer) = tokio::io::duplex(4096);
    let port = DrainingPort {
        inner: agent_end,
        flushed_on: flushed_on.clone(),
    };
    let console = SerialConsole {
        port: "/dev/ttyS1".into(),
        baud: 9_600,
        password_hash: None,
        idle: Duration::from_secs(600),
    };
    tokio::spawn(async move {
        let agent = Answering {
            lines: Some(200),
            after: Duration::ZERO,
        };
        let mut session = new_session(&console, &agent);
        let journal = |_: Record, _| {};
        run(
            port,
            (&mut session, &mut password::Checker::default()),
            Instant::now(),
            &console,
            &agent,
            &journal,
        )
        .await
    });
    until(&mut engineer, "u1> ").await;
    engineer.write_all(b"status\r").await.unwrap();
    let text = until(&mut engineer, "u1> ").await;
    assert!(text.contains("event    199 of a long log\r\n"), "{text:?}");
    let flushed_on = flushed_on.lock().unwrap();
    assert!(
        !flushed_on.contains(&runtime_thread),
        "drained {} times on the runtime thread",
        flushed_on.len()
    );
}

#[tokio::test(start_paused = true)]
async fn ctrl_c_cuts_a_long_answer_and_gives_the_prompt_back() {
    // 100,000 lines, some 2.7 MB: more than five minutes at 115200 baud.
    let (mut engineer, records) = slow_line(
        Answering {
            lines: Some(100_000),
            after: Duration::ZERO,
        },
        Duration::from_secs(600),
    );
    until(&mut engineer, "u1> ").await;
    engineer.write_all(b"status\r").await.unwrap();
    until(&mut engineer, "event      0 of a long log\r\n").await;
    engineer.write_all(b"\x03").await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let cut = "(output cut)\r\nu1> ";
    // Looks only at the tail for the prompt: the whole answer, when it
    // comes, is too long to search after every read.
    while !String::from_utf8_lossy(&seen[seen.len().saturating_sub(200)..]).contains(cut) {
        let read = tokio::time::timeout(Duration::from_secs(3600), engineer.read(&mut buf)).await;
        let tail = String::from_utf8_lossy(&seen[seen.len().saturating_sub(200)..]).into_owned();
        let n = read.unwrap_or_else(|_| panic!("no {cut:?} after {tail:?}"));
        let n = n.unwrap();
        assert!(n > 0, "closed after {} bytes", seen.len());
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8(seen).unwrap();
    assert!(
        text.contains("^C (output cut)"),
        "{}",
        &text[text.len() - 200..]
    );
    assert!(!text.contains("event  99999"), "the last line came first");
    // The line is the engineer's again, Ctrl-C taken by the cut (no
    // second prompt for it).
    engineer.write_all(b"help\r").await.unwrap();
    let text = until(&mut engineer, "u1> ").await;
    assert!(text.starts_with("help\r\ncommands:"), "{text:?}");
    assert_eq!(*records.lock().unwrap(), [What::SessionOpened]);
}

/// An agent that counts the commands it ran, and answers each at once.
struct Counting(Arc<std::sync::atomic::AtomicUsize>);

impl SerialAgent for Counting {
    fn identity(&self) -> Identity {
        TestAgent.identity()
    }
    fn commands(&self) -> &'static [Spec] {
        COMMANDS
    }
    async fn run(&self, words: &[String], _operator: &str) -> Answer {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Answer {
            text: (0..100)
                .map(|i| format!("{} line {i}\n", words[0]))
                .collect(),
            ok: true,
        }
    }
}

/// The shell for a [`Counting`] agent, its password `right password`,
/// over a line that takes 64 bytes at a time; the engineer's end, the
/// commands run and what the journal took.
fn counting_line() -> (
    tokio::io::DuplexStream,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<Mutex<Vec<What>>>,
) {
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (engineer, records) = password_line(Counting(runs.clone()));
    (engineer, runs, records)
}

/// The shell for `agent`, its password `right password`, over a line
/// that takes 64 bytes at a time; the engineer's end and what the
/// journal took.
fn password_line<A: SerialAgent>(agent: A) -> (tokio::io::DuplexStream, Arc<Mutex<Vec<What>>>) {
    let console = SerialConsole {
        port: "/dev/ttyS1".into(),
        baud: 9_600,
        password_hash: Some(password::hash("right password").unwrap()),
        idle: Duration::from_secs(600),
    };
    let (agent_end, engineer) = tokio::io::duplex(64);
    let records = Arc::new(Mutex::new(Vec::new()));
    let kept = records.clone();
    tokio::spawn(async move {
        let mut session = new_session(&console, &agent);
        let journal = move |r: Record, _| kept.lock().unwrap().push(r.what);
        let mut checks = password::Checker::default();
        let held = (&mut session, &mut checks);
        run(agent_end, held, Instant::now(), &console, &agent, &journal).await
    });
    (engineer, records)
}

/// A Ctrl-C that comes in the same read as Enter (a paste, a console
/// server that batches keys) cuts the command before it starts: it is
/// not run, and that is said. (A Ctrl-C read while the line's echo is
/// written takes the same path; when it is read depends on how much of
/// the echo the line took, so no test here plays it.)
#[tokio::test(start_paused = true)]
async fn ctrl_c_with_the_enter_key_cuts_the_command_before_it_runs() {
    let (mut engineer, runs, records) = counting_line();
    until(&mut engineer, "u1> ").await;
    engineer.write_all(b"status\r\x03").await.unwrap();
    let text = until(&mut engineer, "u1> ").await;
    assert!(text.contains("^C"), "{text:?}");
    assert!(
        !text.contains("status line 99"),
        "the last line came first: {text:?}"
    );
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "{text:?}"
    );
    // A state-changing command cut so is not run, and is kept as not run.
    engineer.write_all(b"login\r").await.unwrap();
    until(&mut engineer, "password: ").await;
    engineer.write_all(b"right password\r").await.unwrap();
    until(&mut engineer, "u1# ").await;
    engineer.write_all(b"clear-leak 2\r\x03").await.unwrap();
    let text = until(&mut engineer, "u1# ").await;
    assert!(text.contains("not run"), "{text:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "{text:?}"
    );
    let kept = records.lock().unwrap().clone();
    assert!(
        kept.iter()
            .any(|w| matches!(w, What::Command { ok: false, line, .. } if line == "clear-leak 2")),
        "{kept:?}"
    );
}

/// An agent whose `clear-leak` takes a second (the clear waits for the
/// controller's step) and then says what it did, in more than one
/// write's worth of a slow line.
struct Clearing;

impl SerialAgent for Clearing {
    fn identity(&self) -> Identity {
        TestAgent.identity()
    }
    fn commands(&self) -> &'static [Spec] {
        COMMANDS
    }
    async fn run(&self, words: &[String], _operator: &str) -> Answer {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Answer {
            text: format!(
                "rack {}: leak cleared, the alarm is acknowledged in the flash log, \
                 and its valve reopens",
                words[1]
            ),
            ok: true,
        }
    }
}

/// A Ctrl-C typed while a state-changing command runs comes too late to
/// stop it: the command is done, and its answer is written whole, never
/// cut, so the engineer never takes a clear that went through for one
/// that was stopped.
#[tokio::test(start_paused = true)]
async fn a_ctrl_c_during_a_state_change_never_hides_its_result() {
    let (mut engineer, records) = password_line(Clearing);
    until(&mut engineer, "u1> ").await;
    engineer.write_all(b"login\r").await.unwrap();
    until(&mut engineer, "password: ").await;
    engineer.write_all(b"right password\r").await.unwrap();
    until(&mut engineer, "u1# ").await;
    engineer.write_all(b"clear-leak 2\r").await.unwrap();
    until(&mut engineer, "clear-leak 2\r\n").await;
    engineer.write_all(b"\x03").await.unwrap();
    // The whole answer, then the Ctrl-C, read after it, drops the
    // (empty) line at the prompt and nothing more.
    let (text, _) = until_marked(&mut engineer, "^C", "^C\r\nu1# ").await;
    assert!(
        text.ends_with("and its valve reopens\r\nu1# ^C\r\nu1# "),
        "{text:?}"
    );
    assert!(!text.contains("output cut"), "{text:?}");
    let kept = records.lock().unwrap().clone();
    assert!(
        kept.iter()
            .any(|w| matches!(w, What::Command { ok: true, line, .. } if line == "clear-leak 2")),
        "{kept:?}"
    );
}
