//! Serving again after the listener failed to accept: tokio-modbus's
//! server ends at the first error of `accept()` (out of file descriptors,
//! `EMFILE`/`ENFILE`, out of memory, a connection aborted before it was
//! taken), and a BMS would find no server until the controller restarts.
//! [`serve_again`] keeps the bound socket and hands a new handle of it to
//! the server after a short backoff, so the address stays bound (the
//! connections that arrive meanwhile wait in its backlog) and nothing
//! has to be bound again. Each failure is logged once, with what failed
//! and the failures since the start.
//!
//! Glossary:
//! - *round*: one run of the server on a handle of the socket, until its
//!   accept fails.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::net::TcpListener;

use super::server::TARGET;

/// How long [`serve_again`] waits after a failed round: `first` after
/// the first failure, twice as long after each failure that follows
/// within `most`, at most `most`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Backoff {
    pub(super) first: Duration,
    pub(super) most: Duration,
}

/// The server's: 100 ms, up to 10 s while the failures go on.
pub(super) const BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(100),
    most: Duration::from_secs(10),
};

/// Runs `round` on a new handle of `socket` again and again, waiting per
/// `backoff` after each failure (`what`: the server, for the log); ends
/// when a round ends without an error. A handle that cannot be had (its
/// file descriptor, when they ran out) counts as a failed round.
pub(super) async fn serve_again<F, Fut>(
    socket: std::net::TcpListener,
    what: &str,
    backoff: Backoff,
    mut round: F,
) -> io::Result<()>
where
    F: FnMut(TcpListener) -> Fut,
    Fut: Future<Output = io::Result<()>>,
{
    let mut failures = 0u64;
    let mut wait = backoff.first;
    loop {
        let began = tokio::time::Instant::now();
        let e = match handle(&socket) {
            Ok(listener) => match round(listener).await {
                Ok(()) => return Ok(()),
                Err(e) => format!("accepting a connection failed: {e}"),
            },
            Err(e) => format!("taking the listening socket again failed: {e}"),
        };
        failures += 1;
        if began.elapsed() >= backoff.most {
            wait = backoff.first;
        }
        tracing::error!(
            target: TARGET,
            "northbound: {what}: {e} (failure {failures} since the start); its open \
             connections are closed, and it serves again in {} ms on the same socket",
            wait.as_millis()
        );
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(backoff.most);
    }
}

/// A new handle of `socket` for one round.
fn handle(socket: &std::net::TcpListener) -> io::Result<TcpListener> {
    let l = socket.try_clone()?;
    l.set_nonblocking(true)?;
    TcpListener::from_std(l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn a_failed_accept_is_served_again_on_the_same_socket() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        // A BMS connects before the rounds begin: it waits in the backlog.
        let bms = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut got = [0u8; 2];
            s.read_exact(&mut got).map(|()| got)
        });
        let rounds = AtomicU32::new(0);
        let quick = Backoff {
            first: Duration::from_millis(1),
            most: Duration::from_millis(4),
        };
        let served = serve_again(socket, "test server", quick, |listener| {
            let n = rounds.fetch_add(1, Ordering::Relaxed);
            async move {
                match n {
                    // The first two rounds fail as accept() does without
                    // file descriptors, or with a connection aborted.
                    0 => Err(io::Error::from_raw_os_error(24)),
                    1 => Err(io::ErrorKind::ConnectionAborted.into()),
                    _ => {
                        let (s, _) = listener.accept().await?;
                        let mut s = s.into_std()?;
                        s.set_nonblocking(false)?;
                        s.write_all(b"ok")
                    }
                }
            }
        });
        served.await.expect("served");
        assert_eq!(rounds.load(Ordering::Relaxed), 3);
        assert_eq!(&bms.join().unwrap().unwrap(), b"ok");
    }
}
