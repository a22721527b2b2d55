//! The fuzz harness every crate's `tests/fuzz.rs` includes (with
//! `#[path]`, so the crates low in the graph need no new dependency): a
//! time-bounded mutation loop, its random numbers and the byte mutations.
//!
//! A target is a set of valid seeds, a mutator that turns seeds into an
//! input and a check that feeds the input to the parser and says what is
//! wrong, if anything. [`fuzz`] checks every seed as it is, then mutated
//! inputs until the time budget is spent; a panic in the check is caught
//! and reported as a crash. The first failure stops the target: its input
//! is printed (bytes as hex) with the seed that repeats the run, and the
//! test fails.
//!
//! Settings, from the environment:
//! - `LOOPWARDEN_FUZZ_SECONDS`: the budget of each target in seconds
//!   (default 5, so a plain `cargo test` stays quick; CI gives more);
//! - `LOOPWARDEN_FUZZ_SEED`: the run's seed, decimal or `0x` hex (default:
//!   from the clock). The same seed gives the same inputs in the same
//!   order, whatever the machine, since the generator is written here
//!   (SplitMix64) rather than taken from a crate whose streams may change.
//!
//! Each target ends with one line on the test's standard error, written
//! past the test harness's capture so CI logs show it:
//! `fuzz frame_decode: 1234567 executions in 20.0 s, 0 crashes (seed 0x…)`.

#![allow(dead_code)] // each fuzz file uses its own part of the harness

use std::fmt;
use std::io::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The variable that sets each target's time budget, in seconds.
pub const SECONDS_VAR: &str = "LOOPWARDEN_FUZZ_SECONDS";
/// The variable that sets the run's seed.
pub const SEED_VAR: &str = "LOOPWARDEN_FUZZ_SEED";
/// Each target's budget when the variable is not set.
pub const DEFAULT_SECONDS: f64 = 5.0;

/// A SplitMix64 generator: small, fast and the same on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator started at `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` above 0).
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "below(0)");
        (self.next_u64() % n as u64) as usize
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True once in `n` times on average.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// A random byte.
    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    /// One of `items` (not empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Bytes that show as hex in a failure report.
#[derive(Clone, PartialEq, Eq)]
pub struct Hex(pub Vec<u8>);

impl fmt::Debug for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes: {}", self.0.len(), hex(&self.0))
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of a hex string (whitespace ignored), for regression tests.
pub fn unhex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).expect("ascii"), 16).expect("hex"))
        .collect()
}

/// Byte values that sit on boundaries: lengths, signs, varint ends.
const INTERESTING: [u8; 10] = [0x00, 0x01, 0x02, 0x7F, 0x80, 0x81, 0xFE, 0xFF, 0x10, 0x40];

/// Applies one to four byte mutations to `data`: bit flips, byte
/// replacement, runs inserted, repeated or deleted, truncation, a splice
/// with one of `others`. Keeps it at most `max_len` bytes.
pub fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>, others: &[Vec<u8>], max_len: usize) {
    for _ in 0..rng.between(1, 4) {
        mutate_once(rng, data, others);
    }
    data.truncate(max_len);
}

fn mutate_once(rng: &mut Rng, data: &mut Vec<u8>, others: &[Vec<u8>]) {
    let len = data.len();
    let at = |rng: &mut Rng| rng.below(len.max(1)).min(len.saturating_sub(1));
    match rng.below(10) {
        0 | 1 if len > 0 => {
            let i = at(rng);
            data[i] ^= 1 << rng.below(8);
        }
        2 if len > 0 => {
            let i = at(rng);
            data[i] = rng.byte();
        }
        3 if len > 0 => {
            let i = at(rng);
            data[i] = *rng.pick(&INTERESTING);
        }
        4 => {
            let i = rng.below(len + 1);
            let run: Vec<u8> = (0..rng.between(1, 16)).map(|_| rng.byte()).collect();
            data.splice(i..i, run);
        }
        5 => {
            let i = rng.below(len + 1);
            let b = if rng.one_in(2) {
                rng.byte()
            } else {
                *rng.pick(&INTERESTING)
            };
            data.splice(i..i, std::iter::repeat_n(b, rng.between(1, 64)));
        }
        6 if len > 0 => {
            let i = at(rng);
            let n = rng.between(1, 16).min(len - i);
            data.drain(i..i + n);
        }
        7 if len > 0 => {
            let i = at(rng);
            let n = rng.between(1, 32).min(len - i);
            let run = data[i..i + n].to_vec();
            let to = rng.below(len + 1);
            data.splice(to..to, run);
        }
        8 => data.truncate(rng.below(len + 1)),
        _ if !others.is_empty() => {
            let other = rng.pick(others);
            let from = rng.below(other.len() + 1);
            data.truncate(rng.below(len + 1));
            data.extend_from_slice(&other[from..]);
        }
        _ => {}
    }
}

/// The settings of a run: the budget of each target and the seed.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Each target's time budget.
    pub budget: Duration,
    /// The run's seed.
    pub seed: u64,
}

/// The settings from the environment (see the module's note).
pub fn settings() -> Settings {
    let seconds = match std::env::var(SECONDS_VAR) {
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .unwrap_or_else(|| panic!("{SECONDS_VAR}={v:?}: expected seconds, e.g. 20")),
        Err(_) => DEFAULT_SECONDS,
    };
    let seed = match std::env::var(SEED_VAR) {
        Ok(v) => parse_seed(&v).unwrap_or_else(|| panic!("{SEED_VAR}={v:?}: expected a number")),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    };
    Settings {
        budget: Duration::from_secs_f64(seconds),
        seed,
    }
}

fn parse_seed(text: &str) -> Option<u64> {
    let t = text.trim();
    match t.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => t.parse().ok(),
    }
}

/// What a target did.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// Inputs checked, seeds included.
    pub executions: u64,
    /// Time spent.
    pub elapsed: Duration,
}

/// The seed of target `name` in a run of seed `seed`: each target its own
/// stream, the same for the same run seed.
fn target_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(seed ^ 0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

/// Runs target `name`: every seed as it is, then `mutate`d inputs until
/// the budget is spent, each through `check`. Fails the test at the first
/// input `check` refuses or panics on, printing it and the seed.
pub fn fuzz<I: fmt::Debug>(
    name: &str,
    seeds: &[I],
    mut mutate: impl FnMut(&mut Rng, &[I]) -> I,
    mut check: impl FnMut(&I) -> Result<(), String>,
) -> Report {
    let Settings { budget, seed } = settings();
    let mut rng = Rng::new(target_seed(seed, name));
    let started = Instant::now();
    let mut executions = 0u64;
    let mut next = 0usize;
    loop {
        let input_seed = rng.next_u64();
        let input = match seeds.get(next) {
            Some(_) => None,
            None if started.elapsed() >= budget => break,
            None => Some(mutate(&mut Rng::new(input_seed), seeds)),
        };
        let input = input.as_ref().unwrap_or_else(|| &seeds[next]);
        next += 1;
        executions += 1;
        if let Err(why) = run_one(&mut check, input) {
            say(&format!(
                "fuzz {name}: CRASH after {executions} executions in {:.1} s (seed {seed:#x}; \
                 {SEED_VAR}={seed:#x} repeats the run): {why}\ninput: {input:?}",
                started.elapsed().as_secs_f64()
            ));
            panic!("fuzz {name}: {why}\ninput: {input:?}\n(seed {seed:#x})");
        }
    }
    let report = Report {
        executions,
        elapsed: started.elapsed(),
    };
    say(&format!(
        "fuzz {name}: {executions} executions in {:.1} s, 0 crashes (seed {seed:#x})",
        report.elapsed.as_secs_f64()
    ));
    report
}

/// `check(input)`, a panic turned into its message.
fn run_one<I>(check: &mut impl FnMut(&I) -> Result<(), String>, input: &I) -> Result<(), String> {
    match panic::catch_unwind(AssertUnwindSafe(|| check(input))) {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Err(format!("panicked: {message}"))
        }
    }
}

/// One line on standard error, past the test harness's capture.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// An error's text must say something: `Err` with what is wrong otherwise.
pub fn says_something(what: &str, text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err(format!("{what}: an error with an empty message"));
    }
    Ok(())
}
