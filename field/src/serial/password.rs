//! The serial console's password: an Argon2id hash in PHC string form
//! (`$argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>`), checked in constant
//! time by the RustCrypto `argon2` crate.
//!
//! Why Argon2id: it is the password hash RFC 9106 and OWASP recommend
//! first, memory-hard (a copied configuration file is costly to attack
//! with GPUs, of which a hall has many), and its PHC string carries its
//! own parameters and salt, so a hash made elsewhere (the `argon2` tool,
//! Python's `argon2-cffi`) is taken as it is. SHA-512 crypt (`$6$`) is not
//! memory-hard; it is not taken.
//!
//! Glossary:
//! - *PHC string*: the self-describing hash format of the Password
//!   Hashing Competition: algorithm, version, parameters, salt, hash.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// The shortest password taken, in characters.
pub const MIN_PASSWORD: usize = 8;

/// Checks that `hash` is an Argon2id PHC string; why not, in words.
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
