//! The serial console's password: an Argon2id hash in PHC string form
//! (`$argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>`), checked in constant
//! time by the RustCrypto `argon2` crate.
//!
//! Why Argon2id: it is the password hash RFC 9106 and OWASP recommend
//! first, memory-hard (a copied configuration file is costly to attack
//! with GPUs, of which a hall has many), and its PHC string carries its
//! own parameters and salt, so a hash made elsewhere (the `argon2` tool,
//! Python's `argon2-cffi`) is taken as it is, within bounds: every try
//! at the port costs the agent the hash's memory and time, so one over
//! [`MAX_M_KIB`] (RFC 9106's first recommendation, 2 GiB, would take the
//! agent's memory), [`MAX_T`] passes or [`MAX_P`] lanes is refused at
//! start, and so is one whose parameters or salt the crate refuses (it
//! would refuse every password). One whose check takes this host over
//! half of [`VERIFY_LIMIT`] is said as an error when the console starts
//! ([`check_speed`], timed once then), not refused: a timing depends on
//! how busy the host is at its boot, and an agent that would not start
//! for it would leave the host unprotected. A
//! check is given [`VERIFY_LIMIT`]; one check runs at a time
//! ([`Checker`]): a check past its limit keeps its thread (and the
//! hash's memory) until it ends, and a try meanwhile is not checked.
//! SHA-512 crypt (`$6$`) is not memory-hard; it is not taken.
//!
//! Glossary:
//! - *PHC string*: the self-describing hash format of the Password
//!   Hashing Competition: algorithm, version, parameters, salt, hash.
//! - *in flight*: a check whose thread has not ended, its caller's wait
//!   over or not.

use std::time::Duration;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Argon2, Params};

/// The shortest password taken, in characters.
pub const MIN_PASSWORD: usize = 8;

/// Most memory a hash may ask of each login, KiB (256 MiB).
pub const MAX_M_KIB: u32 = 256 * 1024;
/// Most passes a hash may ask (`t`).
pub const MAX_T: u32 = 16;
/// Most lanes a hash may ask (`p`).
pub const MAX_P: u32 = 16;
/// Longest a password's check may take; longer, it is refused.
pub const VERIFY_LIMIT: Duration = Duration::from_secs(10);

/// Checks that `hash` is an Argon2id PHC string that a login can afford
/// and the crate takes; why not, in words.
pub fn check_hash(hash: &str) -> Result<(), String> {
    let parsed = PasswordHash::new(hash)
        .map_err(|e| format!("not a PHC string ({e}); make one with `<agent> console-password`"))?;
    if parsed.algorithm.as_str() != "argon2id" {
        return Err(format!(
            "the hash is {}; only argon2id is taken (make one with `<agent> console-password`)",
            parsed.algorithm
        ));
    }
    if parsed.hash.is_none() || parsed.salt.is_none() {
        return Err("the PHC string has no salt or no hash".into());
    }
    check_params(&parsed)?;
    check_salt(&parsed)
}

const REMAKE: &str = "make one with `<agent> console-password` (m=19456, 19 MiB)";

/// The parameters as the crate reads them, within what a login can
/// afford.
fn check_params(parsed: &PasswordHash) -> Result<(), String> {
    let params = Params::try_from(parsed).map_err(|e| {
        format!(
            "its parameters ({}) are refused by argon2: {e}; {REMAKE}",
            parsed.params
        )
    })?;
    let (m, t, p) = (params.m_cost(), params.t_cost(), params.p_cost());
    if m > MAX_M_KIB {
        return Err(format!(
            "m={m} asks {} MiB of each login, over the {} MiB taken (every try at the port \
             would take it); {REMAKE}",
            m / 1024,
            MAX_M_KIB / 1024
        ));
    }
    if t > MAX_T {
        return Err(format!("t={t} passes, over the {MAX_T} taken; {REMAKE}"));
    }
    if p > MAX_P {
        return Err(format!("p={p} lanes, over the {MAX_P} taken; {REMAKE}"));
    }
    Ok(())
}

/// The salt, within the lengths the crate takes.
fn check_salt(parsed: &PasswordHash) -> Result<(), String> {
    let Some(salt) = parsed.salt else {
        return Err("the PHC string has no salt".into());
    };
    let mut buf = [0u8; 64];
    let len = salt
        .decode_b64(&mut buf)
        .map_err(|e| format!("its salt is not base64 ({e}); {REMAKE}"))?
        .len();
    if len < argon2::MIN_SALT_LEN {
        return Err(format!(
            "its salt is {len} bytes; argon2 takes {} or more; {REMAKE}",
            argon2::MIN_SALT_LEN
        ));
    }
    Ok(())
}

/// Whether `password` matches `hash` (false for a hash that does not
/// parse). Takes tens of milliseconds by design: run it off the runtime.
pub fn verify(hash: &str, password: &str) -> bool {
    let Ok(parsed) = PasswordHash::new(hash) else {
        return false;
    };
    Argon2::default()
        .verify_password(password.as_bytes(), &parsed)
        .is_ok()
}

/// How a password's check ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// The password matches the hash.
    Match,
    /// It does not: a wrong password.
    Mismatch,
    /// It was not known (the check took too long, failed, or an earlier
    /// one still runs): why. Not a wrong password, and not a login.
    NotChecked(String),
}

/// The password checks of one console, one in flight at a time: a check
/// past its limit keeps its thread, and the hash's memory, until it ends.
#[derive(Debug, Default)]
pub struct Checker {
    /// The check past its limit, its thread still running.
    in_flight: Option<tokio::task::JoinHandle<bool>>,
}

impl Checker {
    /// Checks `password` against `hash` off the runtime within `limit`
    /// (fail closed); not checked while an earlier check still runs.
    pub async fn check(&mut self, limit: Duration, hash: &str, password: &str) -> Checked {
        if self.in_flight.as_ref().is_some_and(|h| !h.is_finished()) {
            return Checked::NotChecked(format!(
                "an earlier password check, past its {} s, still runs: this one was not checked",
                limit.as_secs()
            ));
        }
        self.in_flight = None;
        let (hash, password) = (hash.to_string(), password.to_string());
        let mut check = tokio::task::spawn_blocking(move || verify(&hash, &password));
        match tokio::time::timeout(limit, &mut check).await {
            Ok(Ok(true)) => Checked::Match,
            Ok(Ok(false)) => Checked::Mismatch,
            Ok(Err(e)) => Checked::NotChecked(format!("the password check failed: {e}")),
            Err(_) => {
                self.in_flight = Some(check);
                Checked::NotChecked(format!(
                    "the password check took over {} s",
                    limit.as_secs()
                ))
            }
        }
    }
}

/// Times one check of `hash` on this host: over half of `limit`, a login
/// would come near its limit (and on a busy host past it): the error
/// names the time and the limit, for the console to say at its start.
pub fn check_speed(hash: &str, limit: Duration) -> Result<Duration, String> {
    let began = std::time::Instant::now();
    verify(hash, "");
    let took = began.elapsed();
    if took > limit / 2 {
        return Err(format!(
            "one check of it took {:.1} s on this host, over the {:.1} s taken (half the {:.1} s a \
             login may take); {REMAKE}",
            took.as_secs_f64(),
            (limit / 2).as_secs_f64(),
            limit.as_secs_f64()
        ));
    }
    Ok(took)
}

/// The Argon2id hash of `password` (RFC 9106's second recommended
/// parameters as the crate sets them: 19 MiB, 2 passes, 1 lane) with a
/// random 16-byte salt.
pub fn hash(password: &str) -> Result<String, String> {
    // The serial line's editor takes printable ASCII only: a password
    // with anything else could never be typed at `login`.
    if let Some(c) = password.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(format!(
            "the password holds {c:?}, which a serial console cannot type: use printable ASCII (letters, digits, space and punctuation)"
        ));
    }
    if password.chars().count() < MIN_PASSWORD {
        return Err(format!(
            "the password is shorter than {MIN_PASSWORD} characters"
        ));
    }
    let mut salt = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut salt);
    let salt = SaltString::encode_b64(&salt).map_err(|e| e.to_string())?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

/// `<agent> console-password`: reads the password from standard input
/// (twice, not shown, on a terminal; one line from a pipe) and prints its
/// hash for `console_password_hash`. The exit status: 0, or 2 with why.
pub fn command(program: &str) -> std::process::ExitCode {
    match read_password().and_then(|p| hash(&p)) {
        Ok(h) => {
            println!("{h}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{program} console-password: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

fn read_password() -> Result<String, String> {
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() {
        return read_line();
    }
    let first = read_hidden("password: ")?;
    let again = read_hidden("again: ")?;
    if first != again {
        return Err("the two passwords differ".into());
    }
    Ok(first)
}

fn read_line() -> Result<String, String> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| format!("reading the password: {e}"))?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// One line from the terminal with its echo off (`stty -echo`).
fn read_hidden(prompt: &str) -> Result<String, String> {
    use std::io::Write;
    eprint!("{prompt}");
    let _ = std::io::stderr().flush();
    let stty = |arg: &str| std::process::Command::new("stty").arg(arg).status();
    let hidden = stty("-echo").is_ok_and(|s| s.success());
    let line = read_line();
    if hidden {
        let _ = stty("echo");
    }
    eprintln!();
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_a_serial_console_cannot_type_is_refused() {
        for p in ["correct horsé", "correct\thorse", "correct horse\u{7f}"] {
            let e = hash(p).unwrap_err();
            assert!(e.contains("a serial console cannot type"), "{p:?}: {e}");
        }
        assert!(hash("correct horse ~!").is_ok());
    }

    #[test]
    fn a_hash_verifies_its_password_only() {
        let h = hash("correct horse").unwrap();
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        check_hash(&h).unwrap();
        assert!(verify(&h, "correct horse"));
        assert!(!verify(&h, "correct horsE"));
        assert!(!verify("not a hash", "correct horse"));
        assert_ne!(hash("correct horse").unwrap(), h, "a new salt each time");
        assert_eq!(
            hash("short").unwrap_err(),
            "the password is shorter than 8 characters"
        );
    }

    /// An Argon2id PHC string with `params` and `salt` (base64, no
    /// padding) and a 32-byte hash.
    fn phc(params: &str, salt: &str) -> String {
        format!("$argon2id$v=19${params}${salt}$3GJrCfqH3v1dlk7xCWVvpdZsZJ1RnlrNj1NkTx7PqWE")
    }

    #[test]
    fn a_hash_a_login_could_not_afford_or_the_crate_refuses_is_refused_at_start() {
        // RFC 9106's first recommendation (argon2-cffi's high-memory
        // profile): 2 GiB for every try at the port.
        let e = check_hash(&phc("m=2097152,t=1,p=4", "c29tZXNhbHRzb21lc2FsdA")).unwrap_err();
        assert!(e.contains("m=2097152") && e.contains("256 MiB"), "{e}");
        let e = check_hash(&phc("m=19456,t=1000,p=1", "c29tZXNhbHRzb21lc2FsdA")).unwrap_err();
        assert!(e.contains("t=1000"), "{e}");
        let e = check_hash(&phc("m=65536,t=1,p=64", "c29tZXNhbHRzb21lc2FsdA")).unwrap_err();
        assert!(e.contains("p=64"), "{e}");
        // What the crate refuses would refuse every password.
        let e = check_hash(&phc("m=7,t=1,p=1", "c29tZXNhbHRzb21lc2FsdA")).unwrap_err();
        assert!(e.contains("m=7"), "{e}");
        let e = check_hash(&phc("m=19456,t=2,p=1", "MTIzNA")).unwrap_err();
        assert!(e.contains("salt") && e.contains("4 bytes"), "{e}");
        // RFC 9106's second recommendation, 64 MiB, is taken.
        check_hash(&phc("m=65536,t=3,p=4", "c29tZXNhbHRzb21lc2FsdA")).unwrap();
        check_hash(&hash("correct horse").unwrap()).unwrap();
    }

    #[tokio::test]
    async fn a_check_that_takes_too_long_is_not_known_and_one_runs_at_a_time() {
        let h = hash("correct horse").unwrap();
        let mut c = Checker::default();
        let long = Duration::from_secs(60);
        assert_eq!(c.check(long, &h, "correct horse").await, Checked::Match);
        assert_eq!(c.check(long, &h, "wrong horse").await, Checked::Mismatch);
        // A limit shorter than the check: its thread runs on, and no
        // second starts beside it.
        let why = |c: Checked| match c {
            Checked::NotChecked(why) => why,
            other => panic!("{other:?}"),
        };
        let first = why(c.check(Duration::ZERO, &h, "correct horse").await);
        assert_eq!(first, "the password check took over 0 s");
        let second = why(c.check(long, &h, "correct horse").await);
        assert!(
            second.contains("still runs: this one was not checked"),
            "{second}"
        );
        while c.in_flight.as_ref().is_some_and(|h| !h.is_finished()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(c.check(long, &h, "correct horse").await, Checked::Match);
    }

    #[test]
    fn a_hash_this_host_checks_too_slowly_for_a_login_is_said() {
        let h = hash("correct horse").unwrap();
        let e = check_speed(&h, Duration::from_micros(2)).unwrap_err();
        assert!(e.contains("over the 0.0 s taken (half the 0.0 s"), "{e}");
        assert!(e.starts_with("one check of it took "), "{e}");
        check_speed(&h, VERIFY_LIMIT).unwrap();
    }

    #[test]
    fn only_argon2id_phc_strings_are_taken() {
        // RFC 9106's and the reference implementation's form, made with
        // `echo -n password | argon2 somesalt -i -e` (argon2i).
        let argon2i =
            "$argon2i$v=19$m=4096,t=3,p=1$c29tZXNhbHQ$iWh06vD8Fy27wf9npn6FXWiCX4K6pW6Ue1Bnzz07Z8A";
        assert!(check_hash(argon2i)
            .unwrap_err()
            .starts_with("the hash is argon2i; only argon2id"));
        assert!(check_hash("$6$rounds=5000$saltsalt$0123456789abcdefghij").is_err());
        assert!(check_hash("hunter2")
            .unwrap_err()
            .starts_with("not a PHC string"));
    }
}
