//! The smallest HTTP/1.1 server Prometheus can scrape: `GET /metrics`
//! answered with the text a render function returns, every other path
//! `404`.
//!
//! Each connection is its own task, so a slow or silent client does not
//! hold up a scrape; at most [`Limits::max_connections`] are served at
//! once (more are closed at once). A request head longer than
//! [`Limits::max_request`] gets `431`; one that does not arrive within
//! [`Limits::read_timeout`] gets `408`. Every answer closes its
//! connection (`Connection: close`): at one scrape a second, a new TCP
//! connection per scrape costs nothing worth keeping one open for.
//!
//! Glossary:
//! - *request head*: the request line and the header lines, up to the
//!   empty line that ends them. A GET has no body; anything after the
//!   head is not read.
//! - *render*: the function that writes the answer's text, called once
//!   per scrape.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The content type of the text format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What one scrape writes: the text of the answer.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Bounds on what a client may cost the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest request head taken, bytes (8 KiB by default).
    pub max_request: usize,
    /// How long a client has to send its request head (5 s by default).
    pub read_timeout: Duration,
    /// How long a client has to take the answer (10 s by default).
    pub write_timeout: Duration,
    /// Connections served at once (16 by default).
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_request: 8 * 1024,
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
            max_connections: 16,
        }
    }
}

/// The metrics address could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("metrics listener on {addr}: {source}")]
pub struct BindError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// Why (in use, not an address of this machine, no permission).
    #[source]
    pub source: std::io::Error,
}

/// Binds the metrics address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// Answers scrapes on `listener` with [`Limits::default`] until the task
/// is dropped (its connections with it).
pub async fn serve(listener: TcpListener, render: impl Fn() -> String + Send + Sync + 'static) {
    serve_with(listener, Limits::default(), Arc::new(render)).await
}

/// As [`serve`], with `limits`.
pub async fn serve_with(listener: TcpListener, limits: Limits, render: Render) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    // Over the limit: closed at once, unread.
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        continue;
                    };
                    let render = render.clone();
                    connections.spawn(async move {
                        connection(stream, limits, render).await;
                        drop(slot);
                    });
                }
                Err(e) => {
                    // Out of file descriptors, most likely: wait, not spin.
                    tracing::warn!("metrics: accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Why a request head was not read.
enum HeadError {
    /// Longer than the limit.
    TooLarge,
    /// The client closed, or the socket failed.
    Gone,
}

/// One connection: read the head, answer, close.
async fn connection(mut stream: TcpStream, limits: Limits, render: Render) {
    let read = tokio::time::timeout(
        limits.read_timeout,
        read_head(&mut stream, limits.max_request),
    )
    .await;
    let answer = match read {
        Ok(Ok(head)) => answer(&head, render.as_ref()),
        Ok(Err(HeadError::TooLarge)) => plain(
            431,
            "Request Header Fields Too Large",
            "request too large\n",
        ),
        Ok(Err(HeadError::Gone)) => return,
        Err(_elapsed) => plain(408, "Request Timeout", "no request in time\n"),
    };
    let write = async {
        stream.write_all(&answer).await?;
        stream.shutdown().await
    };
    if let Ok(Ok(())) = tokio::time::timeout(limits.write_timeout, write).await {
        linger(&mut stream).await;
    }
}

/// Reads what the client still sends, until it closes (at most 64 KiB and
/// 1 s): closing a socket with unread bytes resets the connection, and a
/// reset can destroy the answer before the client has read it.
async fn linger(stream: &mut TcpStream) {
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut left = 64 * 1024usize;
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Reads up to the end of the request head (an empty line).
async fn read_head(stream: &mut TcpStream, max: usize) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await.map_err(|_| HeadError::Gone)?;
        if n == 0 {
            return Err(HeadError::Gone);
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head_end(&head) {
            head.truncate(end);
            return Ok(head);
        }
        if head.len() >= max {
            return Err(HeadError::TooLarge);
        }
    }
}

/// Where the head ends (the first empty line), if it has.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = bytes.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The answer to a complete request head.
fn answer(head: &[u8], render: &(dyn Fn() -> String + Send + Sync)) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return plain(400, "Bad Request", "not an HTTP request line\n");
    };
    if !version.starts_with("HTTP/1.") {
        return plain(505, "HTTP Version Not Supported", "HTTP/1.x only\n");
    }
    let path = target.split('?').next().unwrap_or(target);
    if path != "/metrics" {
        return plain(404, "Not Found", "not found: the metrics are at /metrics\n");
    }
    match method {
        "GET" => response(200, "OK", CONTENT_TYPE, &[], render().as_bytes(), true),
        "HEAD" => response(200, "OK", CONTENT_TYPE, &[], render().as_bytes(), false),
        _ => response(
            405,
            "Method Not Allowed",
            "text/plain; charset=utf-8",
            &[("Allow", "GET, HEAD")],
            b"GET or HEAD only\n",
            true,
        ),
    }
}

/// A short plain-text answer.
fn plain(code: u16, reason: &str, body: &str) -> Vec<u8> {
    response(
        code,
        reason,
        "text/plain; charset=utf-8",
        &[],
        body.as_bytes(),
        true,
    )
}

/// A whole answer; the body is left out for HEAD (`with_body` false).
fn response(
    code: u16,
    reason: &str,
    content_type: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    with_body: bool,
) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    if with_body {
        bytes.extend_from_slice(body);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on a free loopback port with `limits`, answering "x 1".
    async fn server(limits: Limits) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let render: Render = Arc::new(|| "x 1\n".to_string());
        (addr, tokio::spawn(serve_with(listener, limits, render)))
    }

    /// Sends `request` and reads the whole answer.
    async fn ask(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn get_metrics_is_the_text_and_other_paths_are_404() {
        let (addr, _task) = server(Limits::default()).await;
        let ok = ask(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")),
            "{ok}"
        );
        assert!(
            ok.contains("Content-Length: 4\r\n") && ok.ends_with("\r\n\r\nx 1\n"),
            "{ok}"
        );
        let query = ask(addr, b"GET /metrics?x=1 HTTP/1.0\n\n").await;
        assert!(query.starts_with("HTTP/1.1 200 OK\r\n"), "{query}");
        for path in ["/", "/metricsx", "/metrics/", "/favicon.ico"] {
            let req = format!("GET {path} HTTP/1.1\r\n\r\n");
            let nf = ask(addr, req.as_bytes()).await;
            assert!(nf.starts_with("HTTP/1.1 404 Not Found\r\n"), "{path}: {nf}");
        }
        let head = ask(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
        assert!(
            head.contains("Content-Length: 4\r\n") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        let post = ask(addr, b"POST /metrics HTTP/1.1\r\n\r\n").await;
        assert!(
            post.starts_with("HTTP/1.1 405 ") && post.contains("Allow: GET, HEAD"),
            "{post}"
        );
        let junk = ask(addr, b"hello\r\n\r\n").await;
        assert!(junk.starts_with("HTTP/1.1 400 "), "{junk}");
    }

    #[tokio::test]
    async fn an_oversized_request_is_refused() {
        let limits = Limits {
            max_request: 1024,
            ..Limits::default()
        };
        let (addr, _task) = server(limits).await;
        let mut req = b"GET /metrics HTTP/1.1\r\nX-Filler: ".to_vec();
        req.extend(std::iter::repeat_n(b'a', 4096));
        let answer = ask(addr, &req).await;
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    }

    #[tokio::test]
    async fn a_silent_client_blocks_no_one() {
        // A read timeout no stall reaches: the scrape is answered while
        // the silent client, connected first, is still waited for.
        let limits = Limits {
            read_timeout: Duration::from_secs(30),
            max_connections: 2,
            ..Limits::default()
        };
        let (addr, _task) = server(limits).await;
        let silent = std::net::TcpStream::connect(addr).unwrap();
        silent.set_nonblocking(true).unwrap();
        let ok = ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 "), "{ok}");
        // (Served one after the other, the scrape would have waited for
        // the silent client's timeout, which answers and closes it.)
        let mut buf = [0u8; 64];
        match std::io::Read::read(&mut &silent, &mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!(
                "the silent client was answered or closed before the scrape: {other:?} {:?}",
                String::from_utf8_lossy(&buf)
            ),
        }
    }

    #[tokio::test]
    async fn a_silent_client_is_timed_out() {
        let limits = Limits {
            read_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let (addr, _task) = server(limits).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut out = Vec::new();
        // Far past the read timeout: the bound only ends a test whose
        // server never times the client out.
        tokio::time::timeout(Duration::from_secs(30), silent.read_to_end(&mut out))
            .await
            .expect("the silent client timed out within 30 s")
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
    }

    #[tokio::test]
    async fn a_bind_error_names_the_address() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let e = bind(addr).await.unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("metrics listener on {addr}: ")),
            "{e}"
        );
    }
}
