//! The line: frames as the MCU writes them, as the line harms them, and
//! as the gateway's deframer reads them.

use super::*;

/// CRC-32 (ISO-HDLC), as the link computes it.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// COBS of `data` (no end byte).
pub(crate) fn cobs(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    let (mut code_at, mut code) = (0, 1u8);
    for &b in data {
        if b != 0 {
            out.push(b);
            code += 1;
        }
        if b == 0 || code == 0xFF {
            out[code_at] = code;
            code_at = out.len();
            out.push(0);
            code = 1;
        }
    }
    out[code_at] = code;
    out
}

/// A frame of link version `version`, number `seq`, with `payload`, built
/// here (the link builds only its own version).
pub(crate) fn raw_frame(version: u8, seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut body = vec![version];
    body.extend_from_slice(&seq.to_le_bytes());
    body.extend_from_slice(payload);
    let crc = crc32(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    let mut out = cobs(&body);
    out.push(0);
    out
}

/// `up`'s postcard bytes.
pub(crate) fn message(up: &Up) -> Vec<u8> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let n = postcard::to_slice(up, &mut buf)
        .expect("an Up encodes")
        .len();
    buf.truncate(n);
    buf
}

/// `up` as frame `seq`, by the link's own encoder.
/// `up` framed as number `seq`, without the end byte a sender puts
/// before each frame: the line here is one whose noise the model says
/// (a frame that lost its end glues onto the next one, as it does from
/// a sender that does not lead with an end byte, which the gateway
/// reads all the same); the lead byte's own worth is the link crate's
/// test.
pub(crate) fn frame(up: &Up, seq: u32) -> Vec<u8> {
    let mut scratch = vec![0u8; MAX_MESSAGE + OVERHEAD];
    let mut out = vec![0u8; loopwarden_link::frame::max_frame(MAX_MESSAGE)];
    let n = encode(up, seq, &mut scratch, &mut out).expect("an Up encodes");
    out.truncate(n);
    assert_eq!(out.first(), Some(&0), "a frame leads with an end byte");
    out.remove(0);
    out
}

/// What the line does to one frame.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Harm {
    /// Nothing.
    Clean,
    /// Delivered twice.
    Twice,
    /// One byte changed (`at`, modulo the frame before its end byte).
    Byte { at: u16, mask: u8 },
    /// Cut after `keep` bytes (modulo), its end byte kept.
    Cut { keep: u16 },
    /// Cut after `keep` bytes (modulo), its end byte lost: the next frame
    /// is read with it.
    TailLost { keep: u16 },
    /// Sent by a side of another link version.
    Version(u8),
    /// Its CRC checks but its message does not decode.
    Garbled,
}

/// One run of bytes on the line: a frame as delivered.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    pub(crate) bytes: Vec<u8>,
    pub(crate) kind: Kind,
    /// What the MCU meant by it.
    pub(crate) said: Said,
}

/// What a run of bytes is to the gateway, read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A frame it takes: checked, its message read.
    Whole,
    /// Checked, numbered, but its message does not read.
    Unread,
    /// No frame of this link.
    Harmed,
}

/// What the MCU meant by a frame.
#[derive(Debug, Clone)]
pub(crate) struct Said {
    pub(crate) seq: u32,
    pub(crate) up: Up,
    /// For an answer: the token of the clear it answers.
    pub(crate) answers: Option<usize>,
}

/// The pieces the line carries for the MCU's frame `said`, harmed by `harm`.
pub(crate) fn harmed(said: Said, harm: Harm) -> Vec<Piece> {
    let bytes = frame(&said.up, said.seq);
    let body = bytes.len() - 1;
    let piece = |bytes, kind| Piece {
        bytes,
        kind,
        said: said.clone(),
    };
    match harm {
        Harm::Clean => vec![piece(bytes, Kind::Whole)],
        Harm::Twice => vec![piece(bytes.clone(), Kind::Whole), piece(bytes, Kind::Whole)],
        Harm::Byte { at, mask } => {
            // Any other byte but the end byte: the frame stays one frame.
            let mut b = bytes;
            let at = usize::from(at) % body;
            let was = b[at];
            b[at] = match was.wrapping_add(mask.max(1)) {
                0 if was == 1 => 2,
                0 => 1,
                v => v,
            };
            vec![piece(b, Kind::Harmed)]
        }
        Harm::Cut { keep } => {
            let mut b = bytes[..1 + usize::from(keep) % (body - 1)].to_vec();
            b.push(0);
            vec![piece(b, Kind::Harmed)]
        }
        Harm::TailLost { keep } => {
            vec![piece(
                bytes[..1 + usize::from(keep) % (body - 1)].to_vec(),
                Kind::Harmed,
            )]
        }
        Harm::Version(v) => {
            let v = if v == VERSION { VERSION + 1 } else { v };
            vec![piece(
                raw_frame(v, said.seq, &message(&said.up)),
                Kind::Harmed,
            )]
        }
        Harm::Garbled => {
            // Variant 250 of an enum of seven, then the message's bytes (so
            // that two such frames differ as their messages do).
            let payload = [&[250, 1], &message(&said.up)[..]].concat();
            vec![piece(raw_frame(VERSION, said.seq, &payload), Kind::Unread)]
        }
    }
}

/// What the gateway's deframer holds, as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Run {
    /// Nothing: the next byte starts a frame.
    Empty,
    /// The first `got` bytes of piece `piece`.
    Clean { piece: usize, got: usize },
    /// Bytes that are no whole frame.
    Dirty,
}

/// What the end of a run gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    Nothing,
    /// Piece `n`, whole as the MCU's side wrote it (its [`Kind`] says
    /// whether the gateway can take it).
    Piece(usize),
    /// Bytes that are no piece whole.
    Junk,
}

impl Run {
    /// Bytes `from..to` of piece `i` (of `pieces`) arrive.
    pub(crate) fn feed(&mut self, pieces: &[Piece], i: usize, from: usize, to: usize) -> Ended {
        let p = &pieces[i];
        let ends = to == p.bytes.len() && p.bytes.last() == Some(&0);
        let data_to = if ends { to - 1 } else { to };
        if data_to > from {
            *self = match *self {
                Run::Empty if from == 0 => Run::Clean {
                    piece: i,
                    got: data_to,
                },
                Run::Clean { piece, got } if piece == i && got == from => Run::Clean {
                    piece: i,
                    got: data_to,
                },
                _ => Run::Dirty,
            };
        }
        if !ends {
            return Ended::Nothing;
        }
        let ended = match *self {
            Run::Empty => Ended::Nothing,
            Run::Clean { piece, got } if got == data_to && piece == i => Ended::Piece(piece),
            _ => Ended::Junk,
        };
        *self = Run::Empty;
        ended
    }
}
