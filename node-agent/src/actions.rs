//! Site actions: the commands a site runs when a GPU is taken out of
//! service (a Slurm drain, a Kubernetes taint, a ticket), and when a rack
//! loses cooling (a drain, a power-down, and their undoing).
//!
//! Each action is an argument vector from the config, run without a shell:
//! placeholders (`{host}`, `{site}`, `{gpu}`, `{uuid}`, `{reason}`) are
//! replaced inside single arguments, so no text of a reason or an evidence
//! can add an argument or a command. Each runs when decided, with a
//! timeout after which it is killed; its outcome is logged and published
//! (a `quarantine_action` or `cooling_action` event). A cooling-loss step
//! or a quarantine's actions that did not end well before a restart (cut
//! by a crash, or failed) run again after it (`shell::cooling`,
//! `shell::quarantine`): drains and taints are idempotent, a lost one
//! leaves the scheduler unaware. A quarantine's actions known done run
//! again at a start only with `[quarantine] again_at_start` (the scheduler
//! may have lifted their drain meanwhile; a `scancel` or a ticket must not
//! run at every restart).
//!
//! A quarantine's actions that failed, and a cooling-loss drain that
//! failed, also run again while the agent runs, after a wait that doubles
//! with each failure in a row ([`retry_at`]), until one ends well.
//!
//! Glossary:
//! - *action*: one program and its arguments.
//! - *outcome*: exit status 0 within the timeout (`ok`), or the exit code,
//!   or none when it was killed or could not start.

use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What to put in place of the placeholders.
#[derive(Debug, Clone)]
pub struct Vars {
    /// Host id.
    pub host: String,
    /// Site.
    pub site: String,
    /// GPU index.
    pub gpu: u8,
    /// GPU UUID.
    pub uuid: String,
    /// Reason code name and evidence (`xid-79: XID 79 (...) at ...`).
    pub reason: String,
}

/// `action` with its placeholders replaced, argument by argument.
pub fn expand(action: &[String], v: &Vars) -> Vec<String> {
    let gpu = v.gpu.to_string();
    expand_with(
        action,
        &[
            ("{host}", &v.host),
            ("{site}", &v.site),
            ("{gpu}", &gpu),
            ("{uuid}", &v.uuid),
            ("{reason}", &v.reason),
        ],
    )
}

/// `action` with each `(placeholder, value)` replaced inside each
/// argument (a value never adds an argument).
pub fn expand_with(action: &[String], vars: &[(&str, &str)]) -> Vec<String> {
    action
        .iter()
        .map(|arg| {
            vars.iter()
                .fold(arg.clone(), |a, (name, value)| a.replace(name, value))
        })
        .collect()
}

/// How one action ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The program.
    pub program: String,
    /// Exit status 0 within the timeout.
    pub ok: bool,
    /// The exit code, when it exited.
    pub exit_code: Option<i32>,
    /// What went wrong, in words (empty when `ok`), with its standard
    /// error's start and end (its control characters written out as text).
    pub detail: String,
}

/// How long a site command that failed waits before it runs again, ms,
/// after its first failure: the commonest failure is a scheduler's
/// controller failing over, which answers again within a minute.
pub const RETRY_FIRST_MS: u64 = 10_000;
/// The longest wait between two runs of a command that keeps failing, ms.
pub const RETRY_MOST_MS: u64 = 300_000;

/// When a command whose last `failures` runs in a row failed (1: the
/// last only), the last ending at `ended_ms`, runs again (ms, on the same
/// clock): [`RETRY_FIRST_MS`] after the first failure, doubling after
/// each, [`RETRY_MOST_MS`] at most.
pub fn retry_at(ended_ms: u64, failures: u32) -> u64 {
    let doublings = failures.saturating_sub(1).min(31);
    let wait = RETRY_FIRST_MS.saturating_mul(1 << doublings);
    ended_ms.saturating_add(wait.min(RETRY_MOST_MS))
}

/// How long the end of a command's standard error is waited for once it
/// exited: a process it left running may hold it open (what was read by
/// then is still its reason).
const STDERR_GRACE: Duration = Duration::from_millis(200);
/// The end of standard error kept, bytes.
const STDERR_KEPT: usize = 4096;
/// The start of standard error kept, bytes (the detail's first
/// [`DETAIL_HEAD`] characters, 4 bytes each at most).
const STDERR_HEAD: usize = 4 * DETAIL_HEAD;
/// The first characters of a failed command's standard error kept in its
/// detail: a wrapper says the cause first (`loopwarden-slurm: scontrol
/// show node h07 failed: …`), then what it did about it.
const DETAIL_HEAD: usize = 240;
/// The last characters of a failed command's standard error kept in its
/// detail; the middle of a longer one is cut, shown ` … `.
const DETAIL_TAIL: usize = 200;

/// What is kept of a command's standard error as it comes: its first
/// [`STDERR_HEAD`] bytes and its last [`STDERR_KEPT`] after them.
#[derive(Debug, Default)]
struct Kept {
    head: Vec<u8>,
    tail: Vec<u8>,
    /// Bytes between the two were dropped.
    cut: bool,
}

impl Kept {
    fn push(&mut self, bytes: &[u8]) {
        let n = STDERR_HEAD.saturating_sub(self.head.len()).min(bytes.len());
        self.head.extend_from_slice(&bytes[..n]);
        self.tail.extend_from_slice(&bytes[n..]);
        if self.tail.len() > STDERR_KEPT {
            let extra = self.tail.len() - STDERR_KEPT;
            self.tail.drain(..extra);
            self.cut = true;
        }
    }

    /// The text kept, trimmed: its first [`DETAIL_HEAD`] and last
    /// [`DETAIL_TAIL`] characters, joined by ` … ` where the middle was
    /// cut.
    fn detail(&self) -> String {
        let text = if self.cut {
            let head = String::from_utf8_lossy(&self.head);
            let tail = String::from_utf8_lossy(&self.tail);
            format!("{head} … {tail}")
        } else {
            String::from_utf8_lossy(&[&self.head[..], &self.tail[..]].concat()).into_owned()
        };
        let text = text.trim();
        let n = text.chars().count();
        if !self.cut && n <= DETAIL_HEAD + DETAIL_TAIL + 3 {
            return text.to_string();
        }
        let head: String = text.chars().take(DETAIL_HEAD).collect();
        let tail: String = text.chars().skip(n.saturating_sub(DETAIL_TAIL)).collect();
        format!("{} … {}", head.trim_end(), tail.trim_start())
    }
}

/// The process group of a command started in one of its own (its id is
/// the command's pid): killed when dropped before the command exited (its
/// timeout, or the agent's stop aborting the task that runs it).
struct Group {
    pid: Option<i32>,
}

impl Group {
    /// The command exited and was reaped: its group is left alone (what
    /// it left running changes nothing; its pid may be reused).
    fn exited(&mut self) {
        self.pid = None;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let Some(pid) = self.pid else {
            return;
        };
        // SAFETY: killpg only sends a signal; no memory is shared.
        if unsafe { libc::killpg(pid, libc::SIGKILL) } != 0 {
            tracing::warn!(
                "site action: its process group {pid} could not be killed ({}); what it started may run on",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Runs `argv` (no shell) in a process group of its own, waits at most
/// `timeout`, then kills the whole group: what it started (a retrying
/// `ipmitool` under a site's script) ends with it, and cannot land after
/// the step that undoes it. Its outcome is its exit status: a process it
/// started and left running once it exited changes nothing.
pub async fn run(argv: &[String], timeout: Duration) -> Outcome {
    let program = argv.first().cloned().unwrap_or_default();
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let failed = |detail: String| Outcome {
        program: program.clone(),
        ok: false,
        exit_code: None,
        detail,
    };
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        // Said as the start said it, naming the PATH searched.
        Err(e) => {
            let why = find_program(&program, &search_path()).err();
            return failed(format!(
                "cannot start: {}",
                why.unwrap_or_else(|| e.to_string())
            ));
        }
    };
    let mut group = Group {
        pid: child.id().and_then(|p| i32::try_from(p).ok()),
    };
    // Read as it comes, so a command that writes much never waits on a
    // full pipe; kept where the tail is still there if the reader never
    // reaches the end (a process the command left running holds it).
    let tail = Arc::new(Mutex::new(Kept::default()));
    let mut stderr = tokio::spawn(read_tail(child.stderr.take(), tail.clone()));
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => {
            group.exited();
            status
        }
        Ok(Err(e)) => {
            stderr.abort();
            return failed(format!("waiting for it: {e}"));
        }
        // Its group as `group` is dropped, and the child itself
        // (kill_on_drop).
        Err(_) => {
            stderr.abort();
            return failed(format!("killed after {} s", timeout.as_secs()));
        }
    };
    if tokio::time::timeout(STDERR_GRACE, &mut stderr)
        .await
        .is_err()
    {
        stderr.abort();
    }
    let tail = shown(&tail.lock().expect("stderr tail").detail());
    let code = status.code();
    let ok = status.success();
    Outcome {
        program,
        ok,
        exit_code: code,
        detail: if ok {
            String::new()
        } else {
            format!(
                "exit {}: {tail}",
                code.map_or("by signal".into(), |c| c.to_string())
            )
        },
    }
}

/// The directories a program named without a `/` is looked for in: the
/// agent's own `PATH`, which its actions inherit ([`run`] sets no
/// environment), or the C library's default without one.
pub fn search_path() -> String {
    std::env::var("PATH").unwrap_or_else(|_| "/bin:/usr/bin".into())
}

/// Whether `program` would start: a path (with a `/`) names the file
/// itself, a bare name the first file of that name in a directory of
/// `path` (`:`-separated, as the kernel's exec is given it); either must
/// be a regular file with an execute bit. The error says what was looked
/// for and where. Looked for at start (`config`) and again by [`run`]
/// when a command cannot start.
pub fn find_program(program: &str, path: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let runs = |file: &std::path::Path| match std::fs::metadata(file) {
        Err(e) => Err(format!("cannot be read: {e}")),
        Ok(m) if !m.is_file() => Err("is not a regular file".to_string()),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Err(format!(
            "is not executable (mode {:o})",
            m.permissions().mode() & 0o7777
        )),
        Ok(_) => Ok(()),
    };
    if program.contains('/') {
        return runs(program.as_ref()).map_err(|why| format!("program {program:?} {why}"));
    }
    let mut seen = Vec::new();
    for dir in path.split(':') {
        let file = std::path::Path::new(if dir.is_empty() { "." } else { dir }).join(program);
        match runs(&file) {
            Ok(()) => return Ok(()),
            Err(why) if file.exists() => seen.push(format!("{} {why}", file.display())),
            Err(_) => {}
        }
    }
    let also = if seen.is_empty() {
        String::new()
    } else {
        format!("; {}", seen.join(", "))
    };
    Err(format!(
        "program {program:?} not found on PATH ({path}){also}"
    ))
}

/// `text` (the end of a command's standard error) with its control
/// characters written out (`\x1b`, `\x0d`, `\u{9b}`): a site script's
/// escape sequences, carriage returns and line feeds reach a field
/// engineer's terminal (`ctl`, the serial console) as text, never acted
/// on, and the detail stays on one line.
fn shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c as u32 {
            n @ (0..=0x1f | 0x7f) => out.push_str(&format!("\\x{n:02x}")),
            n if c.is_control() => out.push_str(&format!("\\u{{{n:x}}}")),
            _ => out.push(c),
        }
    }
    out
}

/// Reads `stderr` to its end, keeping its start and end in `kept` as
/// they come (what was read stays there if the read is cut).
async fn read_tail(stderr: Option<tokio::process::ChildStderr>, kept: Arc<Mutex<Kept>>) {
    use tokio::io::AsyncReadExt;
    let Some(mut stderr) = stderr else {
        return;
    };
    let mut buf = [0u8; 1024];
    while let Ok(n @ 1..) = stderr.read(&mut buf).await {
        kept.lock().expect("stderr tail").push(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(reason: &str) -> Vars {
        Vars {
            host: "h07".into(),
            site: "hall-1".into(),
            gpu: 3,
            uuid: "GPU-1".into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn a_failed_command_runs_again_after_a_wait_doubling_to_five_minutes() {
        let waits: Vec<u64> = (1..=8).map(|n| retry_at(1_000, n) - 1_000).collect();
        assert_eq!(
            waits,
            [10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000, 300_000]
        );
        assert_eq!(
            retry_at(0, 0),
            RETRY_FIRST_MS,
            "no failure counted: the first wait"
        );
        assert_eq!(retry_at(0, u32::MAX), RETRY_MOST_MS);
        assert_eq!(retry_at(u64::MAX - 1, 3), u64::MAX, "no overflow");
    }

    #[test]
    fn placeholders_stay_inside_their_argument() {
        let action: Vec<String> = [
            "scontrol",
            "update",
            "NodeName={host}",
            "State=DRAIN",
            "Reason={reason}",
        ]
        .map(String::from)
        .to_vec();
        let argv = expand(&action, &vars("xid-79; rm -rf / $(reboot) \"x\""));
        assert_eq!(argv.len(), 5, "no argument added");
        assert_eq!(argv[2], "NodeName=h07");
        assert_eq!(argv[4], "Reason=xid-79; rm -rf / $(reboot) \"x\"");
    }

    #[tokio::test]
    async fn outcomes_ok_failed_killed_and_missing() {
        let t = Duration::from_secs(5);
        let ok = run(&["true".to_string()], t).await;
        assert!(ok.ok && ok.exit_code == Some(0), "{ok:?}");
        let failed = run(
            &["sh".into(), "-c".into(), "echo nope >&2; exit 3".into()],
            t,
        )
        .await;
        assert_eq!((failed.ok, failed.exit_code), (false, Some(3)));
        assert!(failed.detail.contains("nope"), "{failed:?}");
        let slow = run(&["sleep".into(), "30".into()], Duration::from_millis(200)).await;
        assert_eq!((slow.ok, slow.exit_code), (false, None));
        assert!(slow.detail.contains("killed"), "{slow:?}");
        let missing = run(&["/nonexistent/drain".to_string()], t).await;
        assert!(
            !missing.ok && missing.detail.contains("cannot start"),
            "{missing:?}"
        );
    }

    /// A program not there at start (a file system not mounted yet) is
    /// looked for again at each run: while missing, the run fails naming
    /// the program and the PATH searched, as the start said it; once
    /// there, it runs.
    #[tokio::test]
    async fn a_program_missing_is_looked_for_again_at_each_run() {
        let t = Duration::from_secs(5);
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("power-off");
        let argv = [program.display().to_string()];
        let missing = run(&argv, t).await;
        let path = program.display();
        assert!(
            !missing.ok
                && missing.detail.starts_with(&format!(
                    "cannot start: program \"{path}\" cannot be read: No such file"
                )),
            "{missing:?}"
        );
        let bare = run(&["no-such-prog-xyz".to_string()], t).await;
        let on = format!(
            "cannot start: program \"no-such-prog-xyz\" not found on PATH ({})",
            search_path()
        );
        assert_eq!(bare.detail, on, "{bare:?}");
        // A link to a program that exists, not a file written here: a
        // file just written may still be open in a child another test
        // forked meanwhile, and exec then fails "text file busy".
        std::os::unix::fs::symlink(true_program(), &program).unwrap();
        let found = run(&argv, t).await;
        assert!(found.ok, "found since: it runs: {found:?}");
    }

    /// `true` as this host has it.
    fn true_program() -> &'static str {
        ["/usr/bin/true", "/bin/true"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("true")
    }

    /// A site script's standard error reaches a field engineer's terminal
    /// (`ctl`, the serial console) as the outcome's detail: its control
    /// characters (an escape sequence, a carriage return, a line feed)
    /// come out as text, never acted on, and the words stay readable.
    #[tokio::test]
    async fn control_characters_in_a_failed_commands_stderr_come_out_as_text() {
        let script = r"printf '\033[2J\rbad\n\302\233x\177' >&2; exit 1";
        let o = run(
            &["sh".into(), "-c".into(), script.into()],
            Duration::from_secs(5),
        )
        .await;
        assert_eq!((o.ok, o.exit_code), (false, Some(1)));
        assert!(
            o.detail.chars().all(|c| !c.is_control()),
            "a control character left in {:?}",
            o.detail
        );
        assert!(
            o.detail.ends_with(r"\x1b[2J\x0dbad\x0a\u{9b}x\x7f"),
            "{:?}",
            o.detail
        );
    }

    /// The drain wrapper says the cause first (Slurm's controller not
    /// answering), then what it did anyway in a long line: the detail keeps
    /// both (418 characters, whole), and both ends of a longer standard
    /// error, showing where it was cut.
    #[tokio::test]
    async fn a_long_stderr_keeps_its_cause_first_and_its_end_with_the_cut_shown() {
        let cause = "loopwarden-slurm: scontrol show node h07 failed: slurm_load_node error: Unable to contact slurm controller (connect failure)";
        let did = "loopwarden-slurm: h07: its state could not be read: drained for gpu3 anyway, its reason before unread (marked 'reason before this drain unread (loopwarden-slurm)': a person must look, then take the mark alone off with 'loopwarden-slurm clear-unread h07', which keeps the agent's parts): exit 1";
        let script = format!("echo \"{cause}\" >&2; echo \"{did}\" >&2; exit 1");
        let o = run(&["sh".into(), "-c".into(), script], Duration::from_secs(5)).await;
        assert_eq!((o.ok, o.exit_code), (false, Some(1)));
        for said in [
            "Unable to contact slurm controller",
            "drained for gpu3 anyway",
            "which keeps the agent's parts): exit 1",
        ] {
            assert!(o.detail.contains(said), "{said:?} not in {:?}", o.detail);
        }
        // Far longer than the buffer kept (4 KiB): the first line is kept
        // all the same, the detail stays short.
        let script = "echo cause-XYZ >&2; printf '%09999d\\n' 0 >&2; echo the-end >&2; exit 1";
        let o = run(
            &["sh".into(), "-c".into(), script.into()],
            Duration::from_secs(5),
        )
        .await;
        assert!(
            o.detail.starts_with("exit 1: cause-XYZ\\x0a000"),
            "{:?}",
            o.detail
        );
        assert!(
            o.detail.contains("0 … 0"),
            "the cut not shown: {:?}",
            o.detail
        );
        assert!(o.detail.ends_with("000\\x0athe-end"), "{:?}", o.detail);
        assert!(o.detail.chars().count() < 500, "{:?}", o.detail);
        // Short enough, whole, with no mark.
        let script = "echo cause-XYZ >&2; printf '%0293d\\n' 0 >&2; exit 1";
        let o = run(
            &["sh".into(), "-c".into(), script.into()],
            Duration::from_secs(5),
        )
        .await;
        let whole = format!("exit 1: cause-XYZ\\x0a{}", "0".repeat(293));
        assert_eq!(o.detail, whole);
    }

    #[tokio::test]
    async fn a_command_that_exits_is_read_by_its_exit_not_by_what_it_left_running() {
        // It exits 0 at once, leaving a process that holds its standard
        // error open for 5 s.
        let started = std::time::Instant::now();
        let o = run(
            &[
                "sh".into(),
                "-c".into(),
                "sleep 5 & echo gone >&2; exit 0".into(),
            ],
            Duration::from_secs(2),
        )
        .await;
        assert!(o.ok && o.exit_code == Some(0), "{o:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        let failed = run(
            &[
                "sh".into(),
                "-c".into(),
                "echo nope >&2; sleep 5 & exit 4".into(),
            ],
            Duration::from_secs(2),
        )
        .await;
        assert_eq!((failed.ok, failed.exit_code), (false, Some(4)));
        // What it wrote before it left the child holding its standard
        // error is its reason.
        assert!(failed.detail.contains("nope"), "{failed:?}");
    }

    /// A command killed at its timeout takes what it started with it: a
    /// child it waits for (a retrying tool under a site's script) never
    /// acts later.
    #[tokio::test]
    async fn a_timeout_kills_what_the_command_started_too() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("late");
        let script = format!("(sleep 1; touch {}) & wait", marker.display());
        let argv: Vec<String> = ["sh", "-c", &script].map(String::from).to_vec();
        let o = run(&argv, Duration::from_millis(200)).await;
        assert!(!o.ok && o.detail.starts_with("killed after"), "{o:?}");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!marker.exists(), "the child it started ran on");
    }

    #[tokio::test]
    async fn a_reason_with_shell_text_runs_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("pwned");
        let reason = format!("x; touch {} #", marker.display());
        let argv = expand(
            &["echo".to_string(), "{reason}".to_string()],
            &vars(&reason),
        );
        assert!(run(&argv, Duration::from_secs(5)).await.ok);
        assert!(!marker.exists(), "the reason was run as a command");
    }
}
