//! The line to the microcontroller: a TCP port (QEMU's `-serial
//! tcp::PORT,server`, or a serial server on the network) or a serial
//! device (8N1, no flow control). It only moves bytes: what comes is
//! handed over as it came ([`LinkEvent::Bytes`]), frames to write are
//! written whole, in order. A line that fails, or cannot be opened, is
//! opened again after a pause (200 ms, doubling to 5 s); frames handed
//! over meanwhile are not written, and said so ([`LinkEvent::Wrote`]).
//! Opening is bounded ([`OPEN_WITHIN`]: a TCP connect to a server that does
//! not answer gives up then), and frames handed while it opens are not
//! written either: none waits to go stale. A frame the line does not take
//! within [`WRITE_WITHIN`] loses the line. No TCP keep-alive is set: a
//! line whose far end vanished is lost when its writes stop being taken
//! (the gateway writes every second), and the MCU's silence is said after
//! 3 s.
//!
//! The link's frames carry a CRC, no authentication: whoever can write
//! into a TCP line speaks as the MCU, and the gateway signs what it says
//! (leases, the CDU's state) with the CDU's key. So a `tcp:` host must be
//! this host's loopback (`127.0.0.0/8`, `::1`, `localhost`: QEMU, or a
//! serial server on this host) unless `--link-any-address` opts in on
//! purpose, which is then said at every start. A host name other than
//! `localhost` counts as off this host: it is resolved only when the line
//! opens, so it is not known to be the loopback.
//!
//! Glossary:
//! - *link address*: `tcp:HOST:PORT`, or the path of a serial device.
//! - *off this host*: a `tcp:` host that is not a loopback address.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::string::{String, ToString};
use std::time::Duration;
use std::vec::Vec;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The first pause before the line is opened again.
const REOPEN_FIRST: Duration = Duration::from_millis(200);
/// The longest.
const REOPEN_MAX: Duration = Duration::from_secs(5);
/// How long opening the line may take (a TCP connect to a server that
/// does not answer would wait for the kernel's retries, minutes).
pub const OPEN_WITHIN: Duration = Duration::from_secs(5);
/// How long the line may take to take one frame before it counts as
/// lost (115,200 baud writes the largest frame in a tenth of a second).
pub const WRITE_WITHIN: Duration = Duration::from_secs(5);

/// How long the line's opening and writes may take.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    open_within: Duration,
    write_within: Duration,
}

const BOUNDS: Bounds = Bounds {
    open_within: OPEN_WITHIN,
    write_within: WRITE_WITHIN,
};

/// Where the microcontroller is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkAddr {
    /// A TCP port, `host:port`.
    Tcp(String),
    /// A serial device at this speed (8N1).
    Serial {
        /// The device.
        path: PathBuf,
        /// Its speed.
        baud: u32,
    },
}

/// The serial speed when none is given (the firmware's UART1).
pub const DEFAULT_BAUD: u32 = 115_200;

impl LinkAddr {
    /// Reads `tcp:HOST:PORT` or a device path, with the serial speed
    /// `baud` (a device's only; 115,200 when not given). A `tcp:` host off
    /// this host is refused unless `any_address` (`--link-any-address`),
    /// which is refused with any other link (see the module note).
    pub fn parse(s: &str, baud: Option<u32>, any_address: bool) -> Result<Self, String> {
        let addr = Self::parse_any(s, baud)?;
        match (addr.off_host(), any_address) {
            (Some(host), false) => Err(format!(
                "--link {s}: {host} is not this host's loopback (127.0.0.0/8, ::1, localhost){}, \
                 and the link's frames carry no authentication: whoever can write into that \
                 TCP stream would speak as the microcontroller, and the gateway signs its \
                 leases and state with the CDU's key; reach the serial server on this host's \
                 loopback, or give --link-any-address to take that on purpose",
                if host.parse::<IpAddr>().is_ok() {
                    ""
                } else {
                    " (a name resolved when the line opens is not known to be)"
                }
            )),
            (None, true) => Err(format!(
                "--link-any-address goes only with a --link tcp:HOST:PORT off this host's \
                 loopback, and --link {s} is not one: remove it"
            )),
            _ => Ok(addr),
        }
    }

    /// What is said at every start of a link off this host taken on
    /// purpose (`--link-any-address`); `None` for any other link.
    pub fn any_address_warning(&self) -> Option<String> {
        let host = self.off_host()?;
        Some(format!(
            "--link-any-address: the link to the microcontroller ({self}) leaves this host for \
             {host}, and its frames carry no authentication: whoever can write into that TCP \
             stream speaks as the microcontroller, and gets the CDU's signature on caps, lifts \
             and cooling lost; only the network between them keeps others out"
        ))
    }

    /// The `tcp:` host when it is not this host's loopback.
    fn off_host(&self) -> Option<&str> {
        let Self::Tcp(a) = self else { return None };
        let (host, _) = a.rsplit_once(':')?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let on = match bare.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback(),
            Err(_) => bare.eq_ignore_ascii_case("localhost"),
        };
        (!on).then_some(host)
    }

    fn parse_any(s: &str, baud: Option<u32>) -> Result<Self, String> {
        if let Some(addr) = s.strip_prefix("tcp:") {
            if let Some(b) = baud {
                return Err(format!(
                    "--baud {b} is for a serial device, not the TCP port {addr}"
                ));
            }
            let port_ok = addr
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !port_ok {
                return Err(format!(
                    "--link tcp:{addr}: expected tcp:HOST:PORT (tcp:127.0.0.1:4321)"
                ));
            }
            return Ok(Self::Tcp(addr.to_string()));
        }
        if s.is_empty() {
            return Err("--link: give tcp:HOST:PORT or a serial device (/dev/ttyUSB0)".into());
        }
        let baud = baud.unwrap_or(DEFAULT_BAUD);
        if !(300..=4_000_000).contains(&baud) {
            return Err(format!("--baud {baud}: 300 to 4,000,000"));
        }
        Ok(Self::Serial {
            path: PathBuf::from(s),
            baud,
        })
    }
}

impl fmt::Display for LinkAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(a) => write!(f, "tcp:{a}"),
            Self::Serial { path, baud } => write!(f, "{} at {baud} baud", path.display()),
        }
    }
}

/// What the line did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// Open (`true`), or lost (`false`).
    Open(bool),
    /// Bytes from the microcontroller.
    Bytes(Vec<u8>),
    /// A frame handed over was written (`true`), or not.
    Wrote(bool),
}

/// The line's ends for the gateway: frames to write, and what came.
#[derive(Debug)]
pub struct Link {
    /// Frames to the microcontroller, each written whole.
    pub to_mcu: mpsc::Sender<Vec<u8>>,
    /// What the line did.
    pub events: mpsc::Receiver<LinkEvent>,
    /// The task that carries them.
    pub task: JoinHandle<()>,
}

/// Opens the line to `addr` in a task of its own, and keeps it open.
pub fn start(addr: LinkAddr) -> Link {
    let (to_mcu, from_gateway) = mpsc::channel(64);
    let (tx, events) = mpsc::channel(256);
    let task = tokio::spawn(carry_with(addr, from_gateway, tx, open, BOUNDS));
    Link {
        to_mcu,
        events,
        task,
    }
}

/// A byte stream to the microcontroller.
trait Line: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Line for T {}

async fn open(addr: LinkAddr) -> std::io::Result<Box<dyn Line>> {
    match &addr {
        LinkAddr::Tcp(a) => {
            let s = tokio::net::TcpStream::connect(a.as_str()).await?;
            s.set_nodelay(true)?;
            Ok(Box::new(s))
        }
        LinkAddr::Serial { path, baud } => {
            let builder = tokio_serial::new(path.to_string_lossy(), *baud)
                .data_bits(tokio_serial::DataBits::Eight)
                .parity(tokio_serial::Parity::None)
                .stop_bits(tokio_serial::StopBits::One)
                .flow_control(tokio_serial::FlowControl::None);
            let s = tokio_serial::SerialStream::open(&builder).map_err(std::io::Error::from)?;
            Ok(Box::new(s))
        }
    }
}

/// Keeps the line open, opened by `opener` within the bounds, until the
/// gateway drops its ends.
async fn carry_with<O, F>(
    addr: LinkAddr,
    mut frames: mpsc::Receiver<Vec<u8>>,
    events: mpsc::Sender<LinkEvent>,
    mut opener: O,
    bounds: Bounds,
) where
    O: FnMut(LinkAddr) -> F,
    F: Future<Output = std::io::Result<Box<dyn Line>>>,
{
    let mut pause = REOPEN_FIRST;
    let mut said_failing = false;
    loop {
        let opening = opening(opener(addr.clone()), bounds.open_within);
        let Some(opened) = unsent_until(opening, &mut frames, &events).await else {
            return;
        };
        match opened {
            Ok(line) => {
                tracing::info!("cooling gateway: the link to the microcontroller ({addr}) is open");
                said_failing = false;
                pause = REOPEN_FIRST;
                if events.send(LinkEvent::Open(true)).await.is_err() {
                    return;
                }
                let why = serve(line, &mut frames, &events, bounds).await;
                let Some(why) = why else { return };
                tracing::warn!(
                    "cooling gateway: the link to the microcontroller ({addr}) is lost: {why}; opening it again"
                );
                if events.send(LinkEvent::Open(false)).await.is_err() {
                    return;
                }
            }
            Err(e) if !said_failing => {
                said_failing = true;
                tracing::warn!(
                    "cooling gateway: the link to the microcontroller ({addr}) does not open: {e}; trying again every {} s at most",
                    REOPEN_MAX.as_secs()
                );
            }
            Err(e) => tracing::debug!("cooling gateway: {addr} still does not open: {e}"),
        }
        if !wait_unsent(pause, &mut frames, &events).await {
            return;
        }
        pause = (pause * 2).min(REOPEN_MAX);
    }
}

/// Waits `pause` with the line closed: frames handed over meanwhile are
/// not written. False when the gateway is gone.
async fn wait_unsent(
    pause: Duration,
    frames: &mut mpsc::Receiver<Vec<u8>>,
    events: &mpsc::Sender<LinkEvent>,
) -> bool {
    let slept = unsent_until(tokio::time::sleep(pause), frames, events).await;
    slept.is_some()
}

/// The line opened by `open`, or why not: a timeout after `within`.
async fn opening<F>(open: F, within: Duration) -> std::io::Result<Box<dyn Line>>
where
    F: Future<Output = std::io::Result<Box<dyn Line>>>,
{
    tokio::time::timeout(within, open)
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("not open within {within:?}"),
            ))
        })
}

/// Waits for `done` with the line closed: frames handed over meanwhile
/// are not written, and said so. `None` when the gateway is gone.
async fn unsent_until<T>(
    done: impl Future<Output = T>,
    frames: &mut mpsc::Receiver<Vec<u8>>,
    events: &mpsc::Sender<LinkEvent>,
) -> Option<T> {
    tokio::pin!(done);
    loop {
        tokio::select! {
            r = &mut done => return Some(r),
            f = frames.recv() => {
                f?;
                events.send(LinkEvent::Wrote(false)).await.ok()?;
            }
        }
    }
}

/// Carries bytes both ways until the line fails (why), or the gateway
/// is gone (`None`). An end byte goes first on each line opened: a frame
/// the MCU was taking when the line went ends there, as one that does
/// not read, and the first frame of this line reads whole.
async fn serve(
    mut line: Box<dyn Line>,
    frames: &mut mpsc::Receiver<Vec<u8>>,
    events: &mpsc::Sender<LinkEvent>,
    bounds: Bounds,
) -> Option<String> {
    let end = [loopwarden_link::frame::END];
    if let Err(why) = write(&mut line, &end, bounds.write_within).await {
        return Some(why);
    }
    let mut buf = [0u8; 1024];
    loop {
        tokio::select! {
            n = line.read(&mut buf) => match n {
                Ok(0) => return Some("closed by the other end".into()),
                Ok(n) => {
                    events.send(LinkEvent::Bytes(buf[..n].to_vec())).await.ok()?;
                }
                Err(e) => return Some(e.to_string()),
            },
            f = frames.recv() => {
                let f = f?;
                let written = write(&mut line, &f, bounds.write_within).await;
                events.send(LinkEvent::Wrote(written.is_ok())).await.ok()?;
                if let Err(why) = written {
                    return Some(why);
                }
            }
        }
    }
}

/// Writes `bytes` whole within `within`; why not.
async fn write(line: &mut Box<dyn Line>, bytes: &[u8], within: Duration) -> Result<(), String> {
    match tokio::time::timeout(within, line.write_all(bytes)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("writing: {e}")),
        Err(_) => Err(format!("writing: a frame not taken within {within:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_addresses_read_as_tcp_or_a_device_with_its_speed() {
        assert_eq!(
            LinkAddr::parse("tcp:127.0.0.1:4321", None, false),
            Ok(LinkAddr::Tcp("127.0.0.1:4321".into()))
        );
        assert_eq!(
            LinkAddr::parse("/dev/ttyUSB0", None, false),
            Ok(LinkAddr::Serial {
                path: "/dev/ttyUSB0".into(),
                baud: DEFAULT_BAUD
            })
        );
        assert_eq!(
            LinkAddr::parse("/dev/ttyS1", Some(9600), false).map(|a| a.to_string()),
            Ok("/dev/ttyS1 at 9600 baud".into())
        );
        for (bad, says) in [
            ("tcp:4321", "expected tcp:HOST:PORT"),
            ("tcp:host:99999", "expected tcp:HOST:PORT"),
            ("", "give tcp:HOST:PORT"),
        ] {
            let e = LinkAddr::parse(bad, None, false).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = LinkAddr::parse("tcp:h:1", Some(9600), false).unwrap_err();
        assert!(e.contains("is for a serial device"), "{e}");
        let e = LinkAddr::parse("/dev/ttyS1", Some(50), false).unwrap_err();
        assert!(e.contains("300 to 4,000,000"), "{e}");
    }

    #[test]
    fn a_tcp_link_off_this_host_is_refused_unless_opted_in() {
        // The link's frames carry no authentication: off the loopback,
        // whoever can write into the stream speaks as the MCU.
        for off in [
            "tcp:10.0.0.5:4001",
            "tcp:[fe80::1]:4001",
            "tcp:serial-srv:4001",
        ] {
            let e = LinkAddr::parse(off, None, false).unwrap_err();
            for says in ["loopback", "--link-any-address", "no authentication"] {
                assert!(e.contains(says), "{off}: {e}");
            }
            let a = LinkAddr::parse(off, None, true).expect(off);
            let w = a.any_address_warning().expect("said at every start");
            assert!(
                w.contains("--link-any-address") && w.contains(&off[4..]),
                "{w}"
            );
        }
        let e = LinkAddr::parse("tcp:serial-srv:4001", None, false).unwrap_err();
        assert!(e.contains("a name resolved when the line opens"), "{e}");
        for on in ["tcp:127.0.0.1:4001", "tcp:127.1.2.3:4001", "tcp:[::1]:4001"] {
            let a = LinkAddr::parse(on, None, false).expect(on);
            assert_eq!(a.any_address_warning(), None, "{on}");
        }
        for on in ["tcp:localhost:4001", "tcp:LocalHost:4001", "/dev/ttyUSB0"] {
            assert!(LinkAddr::parse(on, None, false).is_ok(), "{on}");
            // The opt-in with nothing to opt into contradicts the link.
            let e = LinkAddr::parse(on, None, true).unwrap_err();
            assert!(e.contains("--link-any-address goes only with"), "{on}: {e}");
        }
    }

    #[tokio::test]
    async fn bytes_come_as_they_came_and_frames_go_whole_across_a_reopening() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = LinkAddr::Tcp(listener.local_addr().unwrap().to_string());
        let mut link = start(addr);
        let (mut mcu, _) = listener.accept().await.unwrap();
        assert_eq!(link.events.recv().await, Some(LinkEvent::Open(true)));
        mcu.write_all(b"up\0").await.unwrap();
        let mut got = Vec::new();
        while got.len() < 3 {
            match link.events.recv().await {
                Some(LinkEvent::Bytes(b)) => got.extend(b),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got, b"up\0");
        link.to_mcu.send(b"down\0".to_vec()).await.unwrap();
        assert_eq!(link.events.recv().await, Some(LinkEvent::Wrote(true)));
        // An end byte first on the line, then the frame.
        let mut buf = [0u8; 6];
        mcu.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"\0down\0");
        // The MCU's side closes; the link is lost, then open again, with a
        // frame handed over while it was closed.
        drop(mcu);
        assert_eq!(link.events.recv().await, Some(LinkEvent::Open(false)));
        link.to_mcu.send(b"next\0".to_vec()).await.unwrap();
        let (mut mcu, _) = listener.accept().await.unwrap();
        let mut first = [0u8; 1];
        mcu.read_exact(&mut first).await.unwrap();
        assert_eq!(first, [0], "an end byte first on the new line");
        link.task.abort();
    }

    #[tokio::test]
    async fn frames_handed_while_the_line_is_being_opened_are_not_written_and_the_opening_is_bounded(
    ) {
        // An opener that never finishes (a serial server that does not
        // answer: the kernel's SYN retries last minutes), counted.
        let tries = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = tries.clone();
        let hangs = move |_: LinkAddr| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::pending::<std::io::Result<Box<dyn Line>>>()
        };
        let bounds = Bounds {
            open_within: Duration::from_millis(100),
            write_within: WRITE_WITHIN,
        };
        let (to_mcu, frames) = mpsc::channel(64);
        let (tx, mut events) = mpsc::channel(256);
        let addr = LinkAddr::Tcp("10.0.0.5:4001".into());
        let task = tokio::spawn(carry_with(addr, frames, tx, hangs, bounds));
        tokio::time::sleep(Duration::from_millis(20)).await;
        to_mcu.send(b"stale\0".to_vec()).await.unwrap();
        let said = tokio::time::timeout(Duration::from_secs(1), events.recv()).await;
        assert_eq!(
            said,
            Ok(Some(LinkEvent::Wrote(false))),
            "not held for later"
        );
        // The opening is given up after its bound, and tried again.
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let n = tries.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            n >= 2,
            "opened {n} time(s) in a second, each bounded at 100 ms"
        );
        task.abort();
    }

    #[tokio::test]
    async fn a_write_the_line_does_not_take_is_bounded_and_the_line_is_lost() {
        // The MCU's end never reads: the line's buffer fills.
        let (ours, _theirs) = tokio::io::duplex(16);
        let (to_mcu, mut frames) = mpsc::channel(64);
        let (tx, mut events) = mpsc::channel(256);
        let bounds = Bounds {
            open_within: OPEN_WITHIN,
            write_within: Duration::from_millis(100),
        };
        to_mcu.send(vec![1u8; 64]).await.unwrap();
        let why = tokio::time::timeout(
            Duration::from_secs(2),
            serve(Box::new(ours), &mut frames, &tx, bounds),
        )
        .await
        .expect("the write is bounded");
        assert!(
            why.as_deref()
                .is_some_and(|w| w.contains("not taken within")),
            "{why:?}"
        );
        assert_eq!(events.recv().await, Some(LinkEvent::Wrote(false)));
    }
}
