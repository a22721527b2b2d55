//! What the estimator learned, as flash records small enough for the
//! config store (128 bytes a value): one record for the loop and the
//! facility figures, one per eight hosts. Each starts with a version
//! byte; a record that does not decode, or decodes to figures out of
//! their bounds, is refused and the estimator starts from the
//! configuration for what it held.
//!
//! Glossary:
//! - *part*: one record; part 0 is the loop's, part `1 + n` holds hosts
//!   `8n..8n+8`.

use super::facility::{FacilityFit, N};
use super::{Learned, Scalar};
use crate::MAX_HOSTS;

/// Version of the records' layout.
pub const VERSION: u8 = 1;
/// Hosts per part.
pub const HOSTS_PER_PART: usize = 8;
/// Parts: the loop's and the hosts'.
pub const PARTS: usize = 1 + MAX_HOSTS / HOSTS_PER_PART;
/// Longest record, bytes.
pub const MAX_LEN: usize = 128;

/// Why a record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordError {
    /// Its length is not the layout's.
    Length(usize),
    /// Its version is not [`VERSION`].
    Version(u8),
    /// A part that does not exist.
    Part(usize),
}

impl core::fmt::Display for RecordError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Length(n) => write!(f, "a learned record of {n} bytes"),
            Self::Version(v) => write!(f, "a learned record of version {v}, not {VERSION}"),
            Self::Part(p) => write!(f, "no learned part {p}"),
        }
    }
}

struct Writer {
    buf: [u8; MAX_LEN],
    len: usize,
}

impl Writer {
    fn new() -> Self {
        let mut w = Self {
            buf: [0; MAX_LEN],
            len: 0,
        };
        w.bytes(&[VERSION]);
        w
    }
    fn bytes(&mut self, b: &[u8]) {
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }
    fn f32(&mut self, v: f32) {
        self.bytes(&v.to_le_bytes());
    }
    fn scalar(&mut self, s: &Scalar) {
        self.f32(s.value);
        self.f32(s.var);
        self.f32(s.fed_s);
        self.f32(s.trust);
    }
    /// A host's figure in 11 bytes: value, spread, minutes fed, trust.
    fn host(&mut self, s: &Scalar) {
        self.f32(s.value);
        self.f32(s.var);
        let minutes = (s.fed_s / 60.0).clamp(0.0, u16::MAX as f32) as u16;
        self.bytes(&minutes.to_le_bytes());
        self.bytes(&[(s.trust.clamp(0.0, 1.0) * 255.0) as u8]);
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const K: usize>(&mut self) -> [u8; K] {
        let mut out = [0; K];
        out.copy_from_slice(&self.b[self.at..self.at + K]);
        self.at += K;
        out
    }
    fn f32(&mut self) -> f32 {
        f32::from_le_bytes(self.take::<4>())
    }
    fn scalar(&mut self) -> Scalar {
        Scalar {
            value: self.f32(),
            var: self.f32(),
            fed_s: self.f32(),
            trust: self.f32(),
        }
    }
    fn host(&mut self) -> Scalar {
        let value = self.f32();
        let var = self.f32();
        let minutes = u16::from_le_bytes(self.take::<2>());
        let [trust] = self.take::<1>();
        Scalar {
            value,
            var,
            fed_s: minutes as f32 * 60.0,
            trust: trust as f32 / 255.0,
        }
    }
}

/// Length of part 0: version, two scalars, θ, the upper triangle of P,
/// the trusts and two counters.
const LOOP_LEN: usize = 1 + 2 * 16 + N * 4 + (N * (N + 1) / 2) * 4 + N * 4 + 8;
/// Length of a hosts' part.
const HOSTS_LEN: usize = 1 + HOSTS_PER_PART * 11;

impl Learned {
    /// Part `part` of the record (see the module's glossary), into
    /// `out`; returns its length.
    pub fn encode_part(&self, part: usize, out: &mut [u8; MAX_LEN]) -> Result<usize, RecordError> {
        let mut w = Writer::new();
        if part == 0 {
            w.scalar(&self.flow);
            w.scalar(&self.approach);
            let f = &self.facility;
            f.theta.iter().for_each(|v| w.f32(*v));
            for i in 0..N {
                for j in i..N {
                    w.f32(f.p[i][j]);
                }
            }
            self.facility_trust.iter().for_each(|v| w.f32(*v));
            w.bytes(&f.taken.to_le_bytes());
            w.bytes(&f.rejected.to_le_bytes());
        } else if part < PARTS {
            let from = (part - 1) * HOSTS_PER_PART;
            self.hosts[from..from + HOSTS_PER_PART]
                .iter()
                .for_each(|h| w.host(h));
        } else {
            return Err(RecordError::Part(part));
        }
        *out = w.buf;
        Ok(w.len)
    }

    /// Reads part `part` from `b` into `self`.
    pub fn decode_part(&mut self, part: usize, b: &[u8]) -> Result<(), RecordError> {
        let want = match part {
            0 => LOOP_LEN,
            p if p < PARTS => HOSTS_LEN,
            p => return Err(RecordError::Part(p)),
        };
        if b.len() != want {
            return Err(RecordError::Length(b.len()));
        }
        if b[0] != VERSION {
            return Err(RecordError::Version(b[0]));
        }
        let mut r = Reader { b, at: 1 };
        if part == 0 {
            self.flow = r.scalar();
            self.approach = r.scalar();
            let mut f = FacilityFit::default();
            for v in f.theta.iter_mut() {
                *v = r.f32();
            }
            for i in 0..N {
                for j in i..N {
                    let v = r.f32();
                    f.p[i][j] = v;
                    f.p[j][i] = v;
                }
            }
            for v in self.facility_trust.iter_mut() {
                *v = r.f32();
            }
            f.taken = u32::from_le_bytes(r.take::<4>());
            f.rejected = u32::from_le_bytes(r.take::<4>());
            self.facility = f;
        } else {
            let from = (part - 1) * HOSTS_PER_PART;
            for h in self.hosts[from..from + HOSTS_PER_PART].iter_mut() {
                *h = r.host();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CoreConfig;

    #[test]
    fn every_part_fits_the_store_and_reads_back() {
        let cfg = CoreConfig::default();
        let mut l = Learned::new(&cfg);
        l.hosts[9] = Scalar {
            value: 1.37,
            var: 0.0004,
            fed_s: 3600.0,
            trust: 0.8,
        };
        l.flow.value = 1.41;
        l.facility.theta = [-0.3, -0.2, 0.05, 700.0];
        l.facility.p[0][1] = 0.001;
        l.facility.p[1][0] = 0.001;
        l.facility_trust = [0.9, 0.5, 0.1, 0.7];
        let mut back = Learned::new(&cfg);
        let mut buf = [0u8; MAX_LEN];
        for part in 0..PARTS {
            let n = l.encode_part(part, &mut buf).unwrap();
            assert!(n <= MAX_LEN);
            back.decode_part(part, &buf[..n]).unwrap();
        }
        assert_eq!(back.facility, l.facility);
        assert_eq!(back.flow, l.flow);
        assert_eq!(back.facility_trust, l.facility_trust);
        let h = back.hosts[9];
        assert_eq!((h.value, h.var, h.fed_s), (1.37, 0.0004, 3600.0));
        assert!((h.trust - 0.8).abs() < 0.005);
        assert!(back.sane());
    }

    #[test]
    fn a_short_or_foreign_record_is_refused() {
        let cfg = CoreConfig::default();
        let l = Learned::new(&cfg);
        let mut back = Learned::new(&cfg);
        let mut buf = [0u8; MAX_LEN];
        let n = l.encode_part(1, &mut buf).unwrap();
        assert_eq!(
            back.decode_part(1, &buf[..n - 1]),
            Err(RecordError::Length(n - 1))
        );
        buf[0] = 9;
        assert_eq!(back.decode_part(1, &buf[..n]), Err(RecordError::Version(9)));
        assert_eq!(
            back.decode_part(PARTS, &buf[..n]),
            Err(RecordError::Part(PARTS))
        );
    }
}
