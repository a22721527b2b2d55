//! The signals that stop an agent cleanly: SIGHUP (a foreground run's
//! terminal closed) and SIGINT end it through its clean stop as SIGTERM
//! does, instead of killing it at once. A test binary of its own: the
//! signals go to the whole process.

use std::time::Duration;

use loopwarden_field::watchdog::StopSignals;

/// Sends `signal` to this process.
fn send(signal: &str) {
    let pid = std::process::id().to_string();
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal}");
}

#[tokio::test]
async fn sighup_and_sigint_stop_as_sigterm_does() {
    let mut signals = StopSignals::catch().expect("caught");
    for (signal, name) in [("HUP", "SIGHUP"), ("INT", "SIGINT"), ("TERM", "SIGTERM")] {
        send(signal);
        let got = tokio::time::timeout(Duration::from_secs(5), signals.recv()).await;
        assert_eq!(got, Ok(name), "{signal}");
    }
}
