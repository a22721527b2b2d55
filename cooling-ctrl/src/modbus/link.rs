//! The link to the CDU: a serial line for Modbus RTU ([`SerialLine`]) or
//! TCP ([`Link`]), connecting over TCP with a failure that says what
//! failed and where ([`connect_failure`]), telling when the CDU closed a
//! TCP connection or a serial device hung up ([`Watched`]), opening a
//! serial port another program may hold ([`open_serial`]), and draining a
//! serial line of stale bytes before a request.
use super::*;
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::task::Poll;

/// A serial line for Modbus RTU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SerialLine {
    /// The device, e.g. `/dev/ttyUSB0`.
    pub path: String,
    /// Baud rate.
    pub baud: u32,
    /// Parity.
    pub parity: Parity,
    /// Data bits.
    pub data_bits: DataBits,
    /// Stop bits.
    pub stop_bits: StopBits,
}

impl SerialLine {
    /// `path` at 19200 baud, 8 data bits, no parity, 1 stop bit.
    pub fn new(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            baud: 19_200,
            parity: Parity::None,
            data_bits: DataBits::Eight,
            stop_bits: StopBits::One,
        }
    }

    /// The bits one character takes on the line: start, data, parity
    /// (if any) and stop bits.
    pub fn bits_per_char(&self) -> u32 {
        let data = match self.data_bits {
            DataBits::Five => 5,
            DataBits::Six => 6,
            DataBits::Seven => 7,
            DataBits::Eight => 8,
        };
        let parity = u32::from(self.parity != Parity::None);
        let stop = match self.stop_bits {
            StopBits::One => 1,
            StopBits::Two => 2,
        };
        1 + data + parity + stop
    }

    /// The time one character takes on the line.
    pub(super) fn char_time(&self) -> Duration {
        let bits = u64::from(self.bits_per_char());
        Duration::from_micros(bits * 1_000_000 / u64::from(self.baud.max(1)))
    }
}

impl fmt::Display for SerialLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let data = match self.data_bits {
            DataBits::Five => '5',
            DataBits::Six => '6',
            DataBits::Seven => '7',
            DataBits::Eight => '8',
        };
        let parity = match self.parity {
            Parity::None => 'N',
            Parity::Even => 'E',
            Parity::Odd => 'O',
        };
        let stop = match self.stop_bits {
            StopBits::One => '1',
            StopBits::Two => '2',
        };
        write!(f, "{} {} {data}{parity}{stop}", self.path, self.baud)
    }
}

/// A CDU's Modbus TCP address as configured, `host:port`: an IP address
/// (an IPv6 one in brackets) or a name, which is looked up when
/// connecting ([`connect_tcp`]), so a name that does not resolve yet (DNS
/// not up after a power restore) is retried like a connection that
/// failed, not a bad configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpTarget(String);

impl TcpTarget {
    /// As written, `host:port`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<SocketAddr> for TcpTarget {
    fn from(addr: SocketAddr) -> Self {
        Self(addr.to_string())
    }
}

impl std::str::FromStr for TcpTarget {
    type Err = String;

    /// `host:port`, checked for its form only (nothing is looked up).
    fn from_str(s: &str) -> Result<Self, String> {
        // An address as it is, an IPv6 one with its scope too.
        if s.parse::<SocketAddr>().is_ok_and(|a| a.port() != 0) {
            return Ok(Self(s.to_string()));
        }
        let (host, port) = s.rsplit_once(':').ok_or("no port")?;
        port.parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("port {port:?} is not 1 to 65535"))?;
        match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) if v6.contains('%') => {
                return Err(format!(
                    "[{v6}]: give the scope as the interface's number (`ip -6 addr` shows it), [fe80::1%2]:port"
                ));
            }
            Some(v6) => {
                v6.parse::<std::net::Ipv6Addr>()
                    .map_err(|_| format!("[{v6}] is not an IPv6 address"))?;
            }
            None if host.contains(':') => {
                return Err("an IPv6 address goes in brackets, [address]:port".into())
            }
            None => {
                let name = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
                if host.is_empty() || !host.chars().all(name) {
                    return Err(format!(
                        "{host:?} is not a host name or an IPv4 address (letters, digits, '-' and '.')"
                    ));
                }
            }
        }
        Ok(Self(s.to_string()))
    }
}

impl fmt::Display for TcpTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How the CDU is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// Modbus TCP.
    Tcp(TcpTarget),
    /// Modbus RTU on a serial line.
    Rtu(SerialLine),
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "Modbus TCP {addr}"),
            Self::Rtu(line) => write!(f, "Modbus RTU {line}"),
        }
    }
}

/// Opens a TCP connection to `target` by `deadline`: `Err(None)` when it
/// was not made in time, else the failure in words ([`connect_failure`],
/// or a name that does not resolve). An address is connected to as it is.
/// A name's addresses as last looked up (`known`) are tried first, each
/// with its share of half the time left; the name is looked up again
/// (within the rest) only when none is known or none connected, so a slow
/// or failed DNS costs nothing while the CDU answers at its address, and
/// a CDU that moved is found at its new one (the addresses known are kept
/// while the name does not resolve). A stream that has no peer (its
/// connection not made after all) is a failure with its socket's own
/// error.
pub(super) async fn connect_tcp(
    target: &TcpTarget,
    known: &mut Vec<SocketAddr>,
    deadline: Instant,
) -> Result<tokio::net::TcpStream, Option<io::Error>> {
    if let Ok(addr) = target.as_str().parse::<SocketAddr>() {
        return connect_one(addr, deadline).await;
    }
    let mut failed = None;
    if !known.is_empty() {
        // Half the time at most: the rest looks the name up again, in
        // case the CDU moved (a board swapped, a new DHCP lease).
        let half = Instant::now() + deadline.saturating_duration_since(Instant::now()) / 2;
        match connect_each(known, half.min(deadline)).await {
            Ok(stream) => return Ok(stream),
            Err(e) => failed = e,
        }
    }
    let looked_up =
        tokio::time::timeout_at(deadline, tokio::net::lookup_host(target.as_str())).await;
    let addrs: Vec<SocketAddr> = match looked_up {
        Err(_) => return Err(failed),
        Ok(Err(e)) => {
            // The CDU's own refusal, where one came, says more.
            return Err(Some(failed.unwrap_or_else(|| {
                let words = format!(
                    "{target}: the name does not resolve ({e}): check the DNS server and the name, \
                     or give the CDU's IP address"
                );
                io::Error::new(e.kind(), words)
            })));
        }
        Ok(Ok(addrs)) => addrs.collect(),
    };
    if addrs.is_empty() {
        return Err(Some(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{target}: the name resolves to no address"),
        )));
    }
    *known = addrs;
    connect_each(known, deadline).await
}

/// Connects to the first of `addrs` that answers, each given its share of
/// the time left to `deadline` (an address whose packets are dropped does
/// not take the others' time); the last failure in words, `None` when
/// every one ran out of time.
async fn connect_each(
    addrs: &[SocketAddr],
    deadline: Instant,
) -> Result<tokio::net::TcpStream, Option<io::Error>> {
    let mut failed = None;
    for (i, &addr) in addrs.iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        let share = Instant::now() + left / (addrs.len() - i) as u32;
        match connect_one(addr, share.min(deadline)).await {
            Ok(stream) => return Ok(stream),
            Err(e) => failed = e.or(failed),
        }
    }
    Err(failed)
}

/// [`connect_tcp`] to one address.
async fn connect_one(
    addr: SocketAddr,
    deadline: Instant,
) -> Result<tokio::net::TcpStream, Option<io::Error>> {
    let stream = match tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(addr)).await
    {
        Err(_) => return Err(None),
        Ok(Err(e)) => return Err(Some(connect_failure(addr, &e))),
        Ok(Ok(stream)) => stream,
    };
    if let Err(e) = stream.peer_addr() {
        let cause = stream.take_error().ok().flatten().unwrap_or(e);
        return Err(Some(connect_failure(addr, &cause)));
    }
    Ok(stream)
}

/// A failed TCP connection to `addr` in words, of the same kind: refused
/// (nothing listens there), unreachable, not answered, or the system's
/// own text. A connection still being made when it failed (the system's
/// "operation now in progress" or "already in progress") got no answer,
/// and says so.
pub fn connect_failure(addr: SocketAddr, e: &io::Error) -> io::Error {
    let still_connecting = matches!(
        e.raw_os_error(),
        Some(libc::EINPROGRESS) | Some(libc::EALREADY)
    );
    let (kind, words) = match e.kind() {
        _ if still_connecting => (
            io::ErrorKind::TimedOut,
            format!(
                "{addr} did not accept the connection: no answer to it (a host that is down, \
                 a firewall dropping it, or a server not taking connections)"
            ),
        ),
        io::ErrorKind::ConnectionRefused => (
            e.kind(),
            format!(
                "connection refused by {addr}: nothing listens on port {} there (the CDU's \
                 Modbus TCP server is off, or the address or the port is wrong)",
                addr.port()
            ),
        ),
        io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => (
            e.kind(),
            format!("{addr} is unreachable ({e}): check the address, the cable and the route"),
        ),
        _ => (e.kind(), format!("connecting to {addr}: {e}")),
    };
    io::Error::new(kind, words)
}

/// Opens a serial port, waiting until `deadline` while another holder
/// has it. The port is opened exclusively (a lock on it, as minicom,
/// mbpoll and a second controller take theirs): a program that has it
/// open keeps this one out, and so, for an instant, does a process being
/// started that inherited the descriptor before it runs. Still held at
/// the deadline (tried at least once), the failure names the port as in
/// use.
pub(super) async fn open_serial(
    builder: &tokio_serial::SerialPortBuilder,
    path: &str,
    deadline: Instant,
) -> io::Result<SerialStream> {
    loop {
        match SerialStream::open(builder) {
            Ok(port) => return Ok(port),
            // `NoDevice` is what the serial crate says for a port another
            // holder has locked (EBUSY, or its exclusive lock refused).
            Err(e) if e.kind == tokio_serial::ErrorKind::NoDevice => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::ResourceBusy,
                        format!(
                            "{path} is in use by another program ({}): stop it (a second \
                             controller, mbpoll, a terminal such as minicom or screen)",
                            e.description
                        ),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads and discards until the line has been quiet for `quiet`, for at
/// most `limit`.
pub(super) async fn drain(port: &mut SerialStream, quiet: Duration, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 256];
    while Instant::now() < deadline {
        match tokio::time::timeout(quiet, port.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => continue,
            _ => break,
        }
    }
}

/// What the reads of a link showed: whether the CDU closed it (a read
/// that ends the stream), and the bytes read since the count was last
/// set to 0.
#[derive(Debug, Clone, Default)]
pub(super) struct Seen {
    /// Set once the CDU closed the stream. tokio-modbus 0.17 reports the
    /// end of a TCP stream as `io::Error::last_os_error()`, with whatever
    /// errno the thread last held ("Success (os error 0)", "Resource
    /// temporarily unavailable (os error 11)", "Operation now in progress
    /// (os error 115)"), so its error alone cannot tell a closed
    /// connection.
    pub(super) closed: Arc<AtomicBool>,
    /// Bytes read: on a serial line, a request whose answer never came
    /// whole is told from one that got nothing by them (the RTU decoder
    /// drops a frame with a bad CRC a byte at a time and waits for more,
    /// and the request then ends at its timeout like a silent one).
    pub(super) read: Arc<AtomicUsize>,
}

/// A link to the CDU (a TCP stream, a serial port) whose reads are watched
/// ([`Seen`]).
#[derive(Debug)]
pub(super) struct Watched<S> {
    stream: S,
    seen: Seen,
}

impl<S> Watched<S> {
    /// `stream`, and what its reads show.
    pub(super) fn new(stream: S) -> (Self, Seen) {
        let seen = Seen::default();
        let watched = Self {
            stream,
            seen: seen.clone(),
        };
        (watched, seen)
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let (room, before) = (buf.remaining(), buf.filled().len());
        let poll = Pin::new(&mut this.stream).poll_read(cx, buf);
        let got = buf.filled().len().saturating_sub(before);
        this.seen.read.fetch_add(got, Ordering::Relaxed);
        // No bytes into room for some: the end of the stream.
        if matches!(poll, Poll::Ready(Ok(()))) && room > 0 && got == 0 {
            this.seen.closed.store(true, Ordering::Relaxed);
        }
        poll
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
