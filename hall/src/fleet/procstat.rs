//! What the process's threads cost (their names from
//! `/proc/self/task/*/stat`, their user plus system CPU time from each
//! thread's CPU clock, the stat's `utime + stime` where that cannot be
//! read), its
//! resident memory from `/proc/self/status`, and its file-descriptor
//! limit.
//!
//! The fleet tells its parts' threads apart by name (Linux keeps the first
//! 15 bytes): the agents' runtime `agent-rt` (or, with isolated agents,
//! each agent's own thread `agent-<host>`), each agent's flash
//! `recorder` and outbox `bus-acker`, the GPU workers `gpu-N` (NVML only)
//! and the halls' XID watches `hall-xid`; a `recorder` or `bus-acker`
//! is an agent's only if it started after the agents' start (the
//! controllers' start before, see `fleet`). Everything else is the
//! controllers' runtime `fleet-rt`, the broker, the observer or the main
//! thread.
//!
//! Glossary:
//! - *ticks*: user plus system CPU time in clock ticks (`utime + stime`).

use std::collections::HashMap;

/// One thread: its id, its name and its CPU time so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadTicks {
    /// Thread id.
    pub tid: u32,
    /// Its name (at most 15 bytes).
    pub name: String,
    /// `utime + stime`, clock ticks.
    pub ticks: u64,
    /// The same, ns, from the thread's CPU clock (when it could be read).
    pub ns: Option<u64>,
}

/// Every thread of the process now.
pub fn threads() -> Vec<ThreadTicks> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let tid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let mut t = parse_stat(tid, &stat)?;
        if let Some(ns) = thread_cpu_ns(tid) {
            t.ticks = (ns as f64 * ticks_per_s() / 1e9).round() as u64;
            t.ns = Some(ns);
        }
        Some(t)
    })
    .collect()
}

/// Thread `tid`'s CPU time (user plus system), ns, from its CPU clock:
/// the time `utime + stime` is made of, without their rounding to whole
/// ticks (10 ms), which a thread that runs a few milliseconds a minute
/// would lose entirely.
fn thread_cpu_ns(tid: u32) -> Option<u64> {
    // The kernel's clock id of a thread's scheduler clock:
    // `(~tid << 3) | CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED`.
    let id = ((!(tid as libc::clockid_t)) << 3) | 4 | 2;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec given.
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// A thread's `stat` line: `tid (name) state ppid … utime stime …`; the
/// name may hold spaces and parentheses, so fields count from its last
/// `)`.
fn parse_stat(tid: u32, stat: &str) -> Option<ThreadTicks> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After the name: state (field 3) … utime (14) stime (15).
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some(ThreadTicks {
        tid,
        name,
        ticks: utime + stime,
        ns: None,
    })
}

/// Clock ticks per second.
pub fn ticks_per_s() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The process's resident set, KiB.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Whether a thread of this name belongs to a host agent, given whether
/// it started after the agents' start.
pub fn is_agent_thread(name: &str, started_with_agents: bool) -> bool {
    name.starts_with("agent-")
        || name.starts_with("hall-xid")
        || name.starts_with("gpu-")
        || (started_with_agents && (name == "recorder" || name == "bus-acker"))
}

/// The agents' threads' CPU between two samples, seconds, and how many
/// there are: the threads that are an agent's by name, given whether each
/// started after the agents' start (`pre` holds the ids of the threads
/// there were before; the agents' runtime is built before that).
pub fn agent_cpu_s(
    pre: &HashMap<u32, ThreadTicks>,
    start: &[ThreadTicks],
    end: &[ThreadTicks],
) -> (f64, usize) {
    let at_start: HashMap<u32, &ThreadTicks> = start.iter().map(|t| (t.tid, t)).collect();
    let mut s = 0.0;
    let mut n = 0;
    for t in end {
        if is_agent_thread(&t.name, !pre.contains_key(&t.tid)) {
            n += 1;
            s += cpu_s_since(t, at_start.get(&t.tid).copied());
        }
    }
    (s, n)
}

/// `t`'s CPU since `start` (its sample then; none: it began after), s:
/// in ns where both samples have them, else in ticks.
fn cpu_s_since(t: &ThreadTicks, start: Option<&ThreadTicks>) -> f64 {
    match (t.ns, start.map(|s| s.ns)) {
        (Some(end), Some(Some(begin))) => end.saturating_sub(begin) as f64 / 1e9,
        (Some(end), None) => end as f64 / 1e9,
        _ => t.ticks.saturating_sub(start.map_or(0, |s| s.ticks)) as f64 / ticks_per_s(),
    }
}

/// CPU of the threads by group between two samples, seconds: the
/// agents' (as [`agent_cpu_s`]) by kind of thread, and the rest by name.
pub fn cpu_by_group(
    pre: &HashMap<u32, ThreadTicks>,
    start: &[ThreadTicks],
    end: &[ThreadTicks],
) -> Vec<(String, f64)> {
    let at_start: HashMap<u32, &ThreadTicks> = start.iter().map(|t| (t.tid, t)).collect();
    let mut groups: HashMap<String, f64> = HashMap::new();
    for t in end {
        let new = !pre.contains_key(&t.tid);
        let group = if is_agent_thread(&t.name, new) {
            match t.name.as_str() {
                "recorder" => "agents: flash recorders",
                "bus-acker" => "agents: outbox ackers",
                "hall-xid" => "agents: hall XID watches",
                n if n.starts_with("gpu-") => "agents: GPU workers",
                _ => "agents: runtime",
            }
        } else if t.name.starts_with("fleet-rt") || t.name == "recorder" || t.name == "bus-acker" {
            "controllers and halls"
        } else if t.name == "observer" {
            "observer"
        } else if t.name.starts_with("loopwarden-hal") {
            "main thread"
        } else {
            "broker and other"
        };
        *groups.entry(group.to_string()).or_default() +=
            cpu_s_since(t, at_start.get(&t.tid).copied());
    }
    let mut v: Vec<(String, f64)> = groups.into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Raises the soft limit on open files to `want` (at most the hard
/// limit); the limit in force after.
pub fn raise_nofile(want: libc::rlim_t) -> libc::rlim_t {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        let target = want.min(lim.rlim_max);
        if target > lim.rlim_cur {
            let raised = libc::rlimit {
                rlim_cur: target,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return target;
            }
        }
    }
    lim.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_a_strange_name_reads() {
        let line = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 110 25 0 0 20 0 1 0 5 0 0";
        let t = parse_stat(4242, line).unwrap();
        assert_eq!((t.name.as_str(), t.ticks), ("a (b) c", 135));
    }

    #[test]
    fn agent_threads_are_told_apart_by_name_and_start() {
        let t = |tid, name: &str, ticks| ThreadTicks {
            tid,
            name: name.into(),
            ticks,
            ns: None,
        };
        // Before the agents: the agents' runtime, a controller's recorder.
        let pre: HashMap<u32, ThreadTicks> = [t(1, "agent-rt", 5), t(2, "recorder", 7)]
            .into_iter()
            .map(|x| (x.tid, x))
            .collect();
        let start = [
            t(1, "agent-rt", 10),
            t(2, "recorder", 10),
            t(3, "recorder", 1),
            t(4, "fleet-rt", 3),
        ];
        let end = [
            t(1, "agent-rt", 10 + 2 * ticks_per_s() as u64),
            t(2, "recorder", 500),
            t(3, "recorder", 1 + ticks_per_s() as u64),
            t(4, "fleet-rt", 900),
            t(5, "bus-acker", ticks_per_s() as u64),
        ];
        let (s, n) = agent_cpu_s(&pre, &start, &end);
        assert_eq!(n, 3, "the runtime, the agent's recorder and acker");
        assert!((s - 4.0).abs() < 1e-9, "{s}");
        let parts = cpu_by_group(&pre, &start, &end);
        let part = |g: &str| parts.iter().find(|(n, _)| n == g).map(|(_, s)| *s);
        assert_eq!(part("agents: runtime"), Some(2.0));
        assert_eq!(part("agents: flash recorders"), Some(1.0));
        assert!(part("controllers and halls").unwrap() > 4.0);
    }

    #[test]
    fn this_process_has_threads_and_memory() {
        let me = threads();
        assert!(!me.is_empty());
        // This thread's CPU clock read by its id agrees with the one the
        // thread reads of itself.
        let own = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime writes the timespec given.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        };
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let (a0, b0) = (thread_cpu_ns(tid).expect("a CPU clock"), own());
        while own() - b0 < 20_000_000 {
            std::hint::black_box(0);
        }
        let (a1, b1) = (thread_cpu_ns(tid).expect("a CPU clock"), own());
        assert!(a1 - a0 >= 19_000_000, "{} ns", a1 - a0);
        assert!(a1.abs_diff(b1) < 5_000_000, "{a1} vs {b1}");
        assert!(rss_kib() > 0);
        assert!(ticks_per_s() > 0.0);
        assert!(is_agent_thread("agent-rt", false));
        assert!(!is_agent_thread("recorder", false));
        assert!(is_agent_thread("recorder", true));
        assert!(!is_agent_thread("fleet-rt", true));
    }
}
