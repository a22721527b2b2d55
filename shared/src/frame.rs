//! Frames: how a message travels as bytes.
//!
//! ```text
//! offset  size  field
//! 0       1     protocol major version
//! 1       1     protocol minor version
//! 2       1     message kind (MessageKind)
//! 3       n     header rest, postcard: sender (role, id), seq (varint), time ms (varint)
//! 3+n     m     body, postcard, the message of that kind
//! end-4   4     CRC-32/ISO-HDLC (the zlib CRC) of every byte before it, little-endian
//! ```
//!
//! The first two bytes and the trailing CRC keep their place in every
//! version, so any reader can check integrity and version before it reads
//! anything else. Decoding never panics: it returns a [`DecodeError`].
//!
//! Glossary:
//! - *major*: a reader refuses frames of another major version.
//! - *minor*: a newer minor may add message kinds, enum variants and fields
//!   at the end of a body; a reader ignores a body's unread tail only when
//!   the frame's minor is newer than its own.
//! - *seq*: the sender's sequence number, rising by one per frame and kept
//!   across restarts, so receivers can spot duplicates and gaps.

use core::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::NodeId;
use crate::message::{
    Ack, CapLease, CduState, CduTelemetry, Event, HostHealth, HostTelemetry, Online,
    QuarantineRelease, ReceivedAs, ResendReport, ResendRequest,
};
use crate::topic::Family;
use crate::units::TimestampMs;

/// A protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Incompatible changes.
    pub major: u8,
    /// Compatible additions.
    pub minor: u8,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The version this crate speaks.
pub const PROTOCOL: Version = Version {
    major: 2,
    minor: 10,
};

/// The longest frame any node sends or accepts, in bytes.
pub const MAX_FRAME_LEN: usize = 2048;

/// The shortest possible frame: version and kind (3), a one-letter sender
/// (3), seq and time of one byte each, a one-byte body and the CRC (4).
pub const MIN_FRAME_LEN: usize = 3 + 3 + 1 + 1 + 1 + 4;

/// The frame CRC. Hosts (`std`) use the 16-table slicing implementation
/// (16 KiB of tables, about 5 times faster); a microcontroller build keeps the
/// 1 KiB single table. Both compute the same CRC.
#[cfg(feature = "std")]
const CRC32: crc::Crc<u32, crc::Table<16>> =
    crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);
#[cfg(not(feature = "std"))]
const CRC32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);

/// The kind byte of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum MessageKind {
    /// [`HostTelemetry`].
    HostTelemetry = 1,
    /// [`HostHealth`].
    HostHealth = 2,
    /// [`Event`].
    Event = 3,
    /// [`CapLease`].
    CapLease = 4,
    /// [`QuarantineRelease`].
    QuarantineRelease = 5,
    /// [`Ack`].
    Ack = 6,
    /// [`CduTelemetry`].
    CduTelemetry = 7,
    /// [`CduState`].
    CduState = 8,
    /// [`Online`].
    Online = 9,
    /// [`ResendRequest`].
    ResendRequest = 10,
    /// [`ResendReport`].
    ResendReport = 11,
}

impl MessageKind {
    /// Every kind, in code order.
    pub const ALL: [MessageKind; 11] = [
        MessageKind::HostTelemetry,
        MessageKind::HostHealth,
        MessageKind::Event,
        MessageKind::CapLease,
        MessageKind::QuarantineRelease,
        MessageKind::Ack,
        MessageKind::CduTelemetry,
        MessageKind::CduState,
        MessageKind::Online,
        MessageKind::ResendRequest,
        MessageKind::ResendReport,
    ];

    /// The kind of a code, if known.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| *k as u8 == code)
    }

    /// The name used in JSON, in schema file names and on the console.
    pub const fn name(self) -> &'static str {
        match self {
            MessageKind::HostTelemetry => "host_telemetry",
            MessageKind::HostHealth => "host_health",
            MessageKind::Event => "event",
            MessageKind::CapLease => "cap_lease",
            MessageKind::QuarantineRelease => "quarantine_release",
            MessageKind::Ack => "ack",
            MessageKind::CduTelemetry => "cdu_telemetry",
            MessageKind::CduState => "cdu_state",
            MessageKind::Online => "online",
            MessageKind::ResendRequest => "resend_request",
            MessageKind::ResendReport => "resend_report",
        }
    }

    /// The topic family this kind is published on.
    pub const fn family(self) -> Family {
        match self {
            MessageKind::HostTelemetry | MessageKind::CduTelemetry => Family::Telemetry,
            MessageKind::HostHealth | MessageKind::CduState => Family::Health,
            MessageKind::Event => Family::Event,
            MessageKind::CapLease | MessageKind::QuarantineRelease => Family::Cmd,
            MessageKind::Ack => Family::Ack,
            MessageKind::Online => Family::Online,
            MessageKind::ResendRequest => Family::Resend,
            MessageKind::ResendReport => Family::Resent,
        }
    }
}

/// Any message of the bus. In JSON: `{"kind": "<name>", "body": {...}}`
/// (on the wire the kind is the frame's kind byte, see [`Frame`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "std",
    derive(Serialize, Deserialize, schemars::JsonSchema),
    serde(tag = "kind", content = "body", rename_all = "snake_case")
)]
#[allow(clippy::large_enum_variant)] // no allocator: the size is the point
pub enum Message {
    /// See [`HostTelemetry`].
    HostTelemetry(HostTelemetry),
    /// See [`HostHealth`].
    HostHealth(HostHealth),
    /// See [`Event`].
    Event(Event),
    /// See [`CapLease`].
    CapLease(CapLease),
    /// See [`QuarantineRelease`].
    QuarantineRelease(QuarantineRelease),
    /// See [`Ack`].
    Ack(Ack),
    /// See [`CduTelemetry`].
    CduTelemetry(CduTelemetry),
    /// See [`CduState`].
    CduState(CduState),
    /// See [`Online`].
    Online(Online),
    /// See [`ResendRequest`].
    ResendRequest(ResendRequest),
    /// See [`ResendReport`].
    ResendReport(ResendReport),
}

impl Message {
    /// Encodes the body alone (postcard, no header, no CRC), as the event
    /// log stores it; returns its length.
    pub fn encode_body(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        match self {
            Message::HostTelemetry(m) => put(m, buf, 0),
            Message::HostHealth(m) => put(m, buf, 0),
            Message::Event(m) => put(m, buf, 0),
            Message::CapLease(m) => put(m, buf, 0),
            Message::QuarantineRelease(m) => put(m, buf, 0),
            Message::Ack(m) => put(m, buf, 0),
            Message::CduTelemetry(m) => put(m, buf, 0),
            Message::CduState(m) => put(m, buf, 0),
            Message::Online(m) => put(m, buf, 0),
            Message::ResendRequest(m) => put(m, buf, 0),
            Message::ResendReport(m) => put(m, buf, 0),
        }
    }

    /// Decodes a body of `kind` that fills `body` exactly.
    pub fn decode_body(kind: MessageKind, body: &[u8]) -> Result<Message, DecodeError> {
        let (message, rest) = Self::take_body(kind, body)?;
        if !rest.is_empty() {
            return Err(DecodeError::TrailingBytes { count: rest.len() });
        }
        Ok(message)
    }

    /// Decodes a body of `kind` from the front of `body`; returns the rest.
    fn take_body(kind: MessageKind, body: &[u8]) -> Result<(Message, &[u8]), DecodeError> {
        Self::take_body_of(kind, body, PROTOCOL.minor)
    }

    /// As [`Message::take_body`], for a body written by minor version
    /// `minor` of this major: a body from before a field was appended is
    /// read in its older shape, the field taking its default.
    fn take_body_of(
        kind: MessageKind,
        body: &[u8],
        minor: u8,
    ) -> Result<(Message, &[u8]), DecodeError> {
        Ok(match kind {
            MessageKind::HostTelemetry if minor == 0 => take(body, "body")
                .map(|(m, r)| (Message::HostTelemetry(older::telemetry_2_0(m)), r))?,
            MessageKind::HostTelemetry if minor < 7 => take(body, "body")
                .map(|(m, r)| (Message::HostTelemetry(older::telemetry_2_6(m)), r))?,
            MessageKind::HostTelemetry => {
                take(body, "body").map(|(m, r)| (Message::HostTelemetry(m), r))?
            }
            MessageKind::HostHealth => {
                take(body, "body").map(|(m, r)| (Message::HostHealth(m), r))?
            }
            MessageKind::Event => take(body, "body").map(|(m, r)| (Message::Event(m), r))?,
            MessageKind::CapLease => take(body, "body").map(|(m, r)| (Message::CapLease(m), r))?,
            MessageKind::QuarantineRelease => {
                take(body, "body").map(|(m, r)| (Message::QuarantineRelease(m), r))?
            }
            MessageKind::Ack => take(body, "body").map(|(m, r)| (Message::Ack(m), r))?,
            MessageKind::CduTelemetry if minor < 2 => take(body, "body")
                .map(|(m, r)| (Message::CduTelemetry(older::cdu_telemetry_2_1(m)), r))?,
            MessageKind::CduTelemetry => {
                take(body, "body").map(|(m, r)| (Message::CduTelemetry(m), r))?
            }
            MessageKind::CduState if minor < 3 => {
                take(body, "body").map(|(m, r)| (Message::CduState(older::cdu_state_2_2(m)), r))?
            }
            MessageKind::CduState if minor < 7 => {
                take(body, "body").map(|(m, r)| (Message::CduState(older::cdu_state_2_6(m)), r))?
            }
            MessageKind::CduState => take(body, "body").map(|(m, r)| (Message::CduState(m), r))?,
            MessageKind::Online => take(body, "body").map(|(m, r)| (Message::Online(m), r))?,
            MessageKind::ResendRequest => {
                take(body, "body").map(|(m, r)| (Message::ResendRequest(m), r))?
            }
            MessageKind::ResendReport => {
                take(body, "body").map(|(m, r)| (Message::ResendReport(m), r))?
            }
        })
    }

    /// Its kind.
    pub const fn kind(&self) -> MessageKind {
        match self {
            Message::HostTelemetry(_) => MessageKind::HostTelemetry,
            Message::HostHealth(_) => MessageKind::HostHealth,
            Message::Event(_) => MessageKind::Event,
            Message::CapLease(_) => MessageKind::CapLease,
            Message::QuarantineRelease(_) => MessageKind::QuarantineRelease,
            Message::Ack(_) => MessageKind::Ack,
            Message::CduTelemetry(_) => MessageKind::CduTelemetry,
            Message::CduState(_) => MessageKind::CduState,
            Message::Online(_) => MessageKind::Online,
            Message::ResendRequest(_) => MessageKind::ResendRequest,
            Message::ResendReport(_) => MessageKind::ResendReport,
        }
    }
}

/// A message with its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Who sent it.
    pub sender: NodeId,
    /// The sender's sequence number.
    pub seq: u32,
    /// When it was sent (or, for a logged event, when it happened).
    pub time: TimestampMs,
    /// The message.
    pub message: Message,
}

#[derive(Serialize, Deserialize)]
struct HeaderRest {
    sender: NodeId,
    seq: u32,
    time: TimestampMs,
}

/// Why a frame could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// The buffer (or [`MAX_FRAME_LEN`]) is too small for this message.
    TooLong,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLong => {
                write!(f, "frame does not fit the buffer or {MAX_FRAME_LEN} bytes")
            }
        }
    }
}

/// Why bytes were refused as a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the smallest frame.
    TooShort {
        /// Bytes received.
        len: usize,
    },
    /// More bytes than [`MAX_FRAME_LEN`].
    TooLong {
        /// Bytes received.
        len: usize,
    },
    /// The CRC does not match: the frame was damaged or cut short.
    BadCrc {
        /// The CRC the frame carries.
        carried: u32,
        /// The CRC of the bytes received.
        computed: u32,
    },
    /// A major version this reader does not speak.
    UnsupportedVersion {
        /// The frame's version.
        found: Version,
    },
    /// A kind byte this reader does not know (a newer minor, or garbage).
    UnknownKind {
        /// The kind byte.
        code: u8,
    },
    /// The header or body ended before its last field.
    Truncated {
        /// Which part: `"header"` or `"body"`.
        part: &'static str,
    },
    /// The header or body holds an invalid value (a bad varint, an unknown
    /// variant, a name that is not an ident, a percentage above 100, ...).
    Malformed {
        /// Which part: `"header"` or `"body"`.
        part: &'static str,
    },
    /// Bytes left over after the body of a frame of this reader's version.
    TrailingBytes {
        /// How many.
        count: usize,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::TooShort { len } => {
                write!(f, "frame of {len} bytes is shorter than the minimum of {MIN_FRAME_LEN}")
            }
            DecodeError::TooLong { len } => {
                write!(f, "frame of {len} bytes is longer than the maximum of {MAX_FRAME_LEN}")
            }
            DecodeError::BadCrc { carried, computed } => write!(
                f,
                "CRC mismatch: frame carries {carried:#010x}, bytes give {computed:#010x} (damaged or cut short)"
            ),
            DecodeError::UnsupportedVersion { found } => write!(
                f,
                "protocol version {found} is not supported (this reader speaks {PROTOCOL})"
            ),
            DecodeError::UnknownKind { code } => write!(f, "unknown message kind {code}"),
            DecodeError::Truncated { part } => write!(f, "frame {part} ends early"),
            DecodeError::Malformed { part } => write!(f, "frame {part} holds an invalid value"),
            DecodeError::TrailingBytes { count } => {
                write!(f, "{count} unexpected bytes after the frame body")
            }
        }
    }
}

impl core::error::Error for DecodeError {}
impl core::error::Error for EncodeError {}

fn put<T: Serialize + ?Sized>(value: &T, buf: &mut [u8], at: usize) -> Result<usize, EncodeError> {
    let rest = buf.get_mut(at..).ok_or(EncodeError::TooLong)?;
    let used = postcard::to_slice(value, rest).map_err(|_| EncodeError::TooLong)?;
    Ok(at + used.len())
}

/// Bodies in the shapes of older minor versions, read into today's.
mod older {
    use heapless::Vec;
    use serde::Deserialize;

    use crate::message::{
        CduMode, CduState, CduTelemetry, CommandAuth, FacilityState, GpuTelemetry, HostTelemetry,
        PumpStatus, QueueDrops, RackState, RackStatus,
    };
    use crate::reason::ReasonCode;
    use crate::units::{Celsius, KiloPascals, LitresPerMinute, Percent, Pue, TimestampMs, Watts};
    use crate::{MAX_GPUS, MAX_RACKS};

    /// `host_telemetry` as 2.0 wrote it: no `drops`.
    #[derive(Deserialize)]
    pub struct HostTelemetry20 {
        gpus: Vec<GpuTelemetry, MAX_GPUS>,
    }

    /// Today's shape, `drops` all 0.
    pub fn telemetry_2_0(t: HostTelemetry20) -> HostTelemetry {
        HostTelemetry {
            gpus: t.gpus,
            drops: Default::default(),
        }
    }

    /// `host_telemetry` as 2.1 to 2.6 wrote it: no `acks_withheld`.
    #[derive(Deserialize)]
    pub struct HostTelemetry26 {
        gpus: Vec<GpuTelemetry, MAX_GPUS>,
        xids: u32,
        flash: u32,
        bus: u32,
    }

    /// Today's shape, `acks_withheld` 0.
    pub fn telemetry_2_6(t: HostTelemetry26) -> HostTelemetry {
        HostTelemetry {
            gpus: t.gpus,
            drops: QueueDrops {
                xids: t.xids,
                flash: t.flash,
                bus: t.bus,
                acks_withheld: 0,
            },
        }
    }

    /// `cdu_telemetry` as 2.0 and 2.1 wrote it: no `learned`.
    #[derive(Deserialize)]
    pub struct CduTelemetry21 {
        supply: Option<Celsius>,
        return_temp: Option<Celsius>,
        setpoint: Celsius,
        flow: Option<LitresPerMinute>,
        diff_pressure: Option<KiloPascals>,
        facility_supply: Option<Celsius>,
        ambient: Option<Celsius>,
        reservoir: Option<Percent>,
        pump_a: PumpStatus,
        pump_b: PumpStatus,
        racks: Vec<RackStatus, MAX_RACKS>,
        it_power: Option<Watts>,
        cooling_power: Option<Watts>,
        facility_power: Option<Watts>,
        pue: Option<Pue>,
    }

    /// Today's shape, `learned` `None`.
    pub fn cdu_telemetry_2_1(t: CduTelemetry21) -> CduTelemetry {
        CduTelemetry {
            supply: t.supply,
            return_temp: t.return_temp,
            setpoint: t.setpoint,
            flow: t.flow,
            diff_pressure: t.diff_pressure,
            facility_supply: t.facility_supply,
            ambient: t.ambient,
            reservoir: t.reservoir,
            pump_a: t.pump_a,
            pump_b: t.pump_b,
            racks: t.racks,
            it_power: t.it_power,
            cooling_power: t.cooling_power,
            facility_power: t.facility_power,
            pue: t.pue,
            learned: None,
        }
    }

    /// `cdu_state` as 2.0 to 2.2 wrote it: no `facility`, unsigned.
    #[derive(Deserialize)]
    pub struct CduState22 {
        mode: CduMode,
        reason: ReasonCode,
        since: TimestampMs,
        setpoint: Celsius,
        supply: Option<Celsius>,
        flow_per_gpu: Option<LitresPerMinute>,
        racks: Vec<RackState, MAX_RACKS>,
    }

    /// Today's shape, `facility` `None`, unsigned.
    pub fn cdu_state_2_2(s: CduState22) -> CduState {
        cdu_state_2_6(CduState26 {
            mode: s.mode,
            reason: s.reason,
            since: s.since,
            setpoint: s.setpoint,
            supply: s.supply,
            flow_per_gpu: s.flow_per_gpu,
            racks: s.racks,
            facility: None,
        })
    }

    /// `cdu_state` as 2.3 to 2.6 wrote it: unsigned.
    #[derive(Deserialize)]
    pub struct CduState26 {
        mode: CduMode,
        reason: ReasonCode,
        since: TimestampMs,
        setpoint: Celsius,
        supply: Option<Celsius>,
        flow_per_gpu: Option<LitresPerMinute>,
        racks: Vec<RackState, MAX_RACKS>,
        facility: Option<FacilityState>,
    }

    /// Today's shape, unsigned (`auth` zeros: no host acts on it).
    pub fn cdu_state_2_6(s: CduState26) -> CduState {
        CduState {
            mode: s.mode,
            reason: s.reason,
            since: s.since,
            setpoint: s.setpoint,
            supply: s.supply,
            flow_per_gpu: s.flow_per_gpu,
            racks: s.racks,
            facility: s.facility,
            auth: CommandAuth::default(),
        }
    }
}

fn take<'a, T: Deserialize<'a>>(
    bytes: &'a [u8],
    part: &'static str,
) -> Result<(T, &'a [u8]), DecodeError> {
    postcard::take_from_bytes(bytes).map_err(|e| match e {
        postcard::Error::DeserializeUnexpectedEnd => DecodeError::Truncated { part },
        _ => DecodeError::Malformed { part },
    })
}

impl Frame {
    /// Encodes into `buf`; returns the frame's length.
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        self.encode_minor(buf, PROTOCOL.minor)
    }

    /// Encodes a received command as its sender wrote it: with the minor
    /// version its sender wrote in byte 1, which its signature covers
    /// ([`crate::message::ReceivedAs`]), so that a log of it verifies
    /// again after a restart. Any other frame, and one made here, as
    /// [`Frame::encode`]. (A signed kind's body does not change within a
    /// major from 2.7 up, so only byte 1 can differ.)
    pub fn encode_as_received(&self, buf: &mut [u8]) -> Result<usize, EncodeError> {
        let minor = self
            .signed_auth()
            .map_or(PROTOCOL.minor, |a| a.received.minor);
        self.encode_minor(buf, minor)
    }

    fn encode_minor(&self, buf: &mut [u8], minor: u8) -> Result<usize, EncodeError> {
        let limit = buf.len().min(MAX_FRAME_LEN);
        let buf = &mut buf[..limit];
        if buf.len() < 3 {
            return Err(EncodeError::TooLong);
        }
        buf[0] = PROTOCOL.major;
        buf[1] = minor;
        buf[2] = self.message.kind() as u8;
        let header = HeaderRest {
            sender: self.sender.clone(),
            seq: self.seq,
            time: self.time,
        };
        let mut at = put(&header, buf, 3)?;
        at += self.message.encode_body(&mut buf[at..])?;
        let crc = CRC32.checksum(&buf[..at]).to_le_bytes();
        buf.get_mut(at..at + 4)
            .ok_or(EncodeError::TooLong)?
            .copy_from_slice(&crc);
        Ok(at + 4)
    }

    /// Encodes into a new vector.
    #[cfg(feature = "std")]
    pub fn to_vec(&self) -> Result<std::vec::Vec<u8>, EncodeError> {
        let mut buf = std::vec![0u8; MAX_FRAME_LEN];
        let len = self.encode(&mut buf)?;
        buf.truncate(len);
        Ok(buf)
    }

    /// The frame's version, if `bytes` are long enough to hold one. Says
    /// nothing of the frame's integrity.
    pub fn peek_version(bytes: &[u8]) -> Option<Version> {
        Some(Version {
            major: *bytes.first()?,
            minor: *bytes.get(1)?,
        })
    }

    /// Decodes and checks a frame.
    pub fn decode(bytes: &[u8]) -> Result<Frame, DecodeError> {
        let len = bytes.len();
        if len < MIN_FRAME_LEN {
            return Err(DecodeError::TooShort { len });
        }
        if len > MAX_FRAME_LEN {
            return Err(DecodeError::TooLong { len });
        }
        let (content, crc_bytes) = bytes.split_at(len - 4);
        let carried = u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
        let computed = CRC32.checksum(content);
        if carried != computed {
            return Err(DecodeError::BadCrc { carried, computed });
        }
        let found = Version {
            major: content[0],
            minor: content[1],
        };
        if found.major != PROTOCOL.major {
            return Err(DecodeError::UnsupportedVersion { found });
        }
        let kind = MessageKind::from_code(content[2])
            .ok_or(DecodeError::UnknownKind { code: content[2] })?;
        let (header, body): (HeaderRest, _) = take(&content[3..], "header")?;
        let (mut message, rest) = Message::take_body_of(kind, body, found.minor)?;
        // A newer minor may append fields to a body: ignore what we cannot read.
        let newer_minor = found.minor > PROTOCOL.minor;
        if !rest.is_empty() && !newer_minor {
            return Err(DecodeError::TrailingBytes { count: rest.len() });
        }
        // A signature covers the bytes as sent: keep what re-encoding loses.
        if let Some(auth) = crate::auth::auth_mut(&mut message) {
            auth.received = ReceivedAs {
                minor: found.minor,
                unread_tail: !rest.is_empty(),
            };
        }
        let frame = Frame {
            sender: header.sender,
            seq: header.seq,
            time: header.time,
            message,
        };
        let older_shape = kind == MessageKind::CduState && found.minor < CDU_STATE_SIGNED_FROM;
        if !older_shape && rest.is_empty() && frame.signed_auth().is_some() {
            frame.check_canonical(bytes, len - 4 - body.len())?;
        }
        Ok(frame)
    }

    /// A signed frame is taken only in its one encoding: postcard reads
    /// an overlong varint (`0x80 0x00` for 0) as the number, so another
    /// byte string would decode to the same frame, verify (the signature
    /// covers the frame as re-encoded) and pass for the one signed. The
    /// frame's bytes (its header's first `header_end`) must be those its
    /// values encode to.
    fn check_canonical(&self, bytes: &[u8], header_end: usize) -> Result<(), DecodeError> {
        let mut again = [0u8; MAX_FRAME_LEN];
        match self.encode_as_received(&mut again) {
            Ok(n) if again[..n] == *bytes => Ok(()),
            Ok(n) if n >= header_end && again[..header_end] != bytes[..header_end] => {
                Err(DecodeError::Malformed { part: "header" })
            }
            _ => Err(DecodeError::Malformed { part: "body" }),
        }
    }
}

/// The first minor version whose CDU states are signed and as this
/// version writes them: one from before reads in its older shape (and
/// unsigned), so its bytes are not those it re-encodes to. The other
/// signed kinds' bodies have not changed within this major.
const CDU_STATE_SIGNED_FROM: u8 = 7;
