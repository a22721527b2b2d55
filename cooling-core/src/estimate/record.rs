//! What the estimator learned, as flash records small enough for the
//! config store (128 bytes a value): one record for the loop and the
//! facility figures, one per eight hosts. Each starts with a version
//! byte, then says whose figures it holds ([`HostIds`]): part 0 the host
//! count, a hosts' part the hash of its eight hosts' ids in order. A
//! record that does not decode, that was kept for other hosts (the host
//! list reordered, a host replaced or added), that is of version 1 (which
//! named no hosts), or that decodes to figures out of their bounds is
//! refused and the estimator starts from the configuration for what it
//! held.
//!
//! Glossary:
//! - *part*: one record; part 0 is the loop's, part `1 + n` holds hosts
//!   `8n..8n+8`.
//! - *host id*: the bytes a host is known by: its configured name, or,
//!   where hosts are known by index only (the firmware), its index in
//!   decimal.

use super::facility::{FacilityFit, N};
use super::{Learned, Scalar};
use crate::MAX_HOSTS;

/// Version of the records' layout.
pub const VERSION: u8 = 2;
/// The version before: the same figures, without the hosts' identity.
/// Refused: nothing in it shows which hosts its figures were learned on.
pub const UNNAMED_VERSION: u8 = 1;
/// Hosts per part.
pub const HOSTS_PER_PART: usize = 8;
/// Parts: the loop's and the hosts'.
pub const PARTS: usize = 1 + MAX_HOSTS / HOSTS_PER_PART;
/// Longest record, bytes.
pub const MAX_LEN: usize = 128;

/// Whose figures a [`Learned`] holds: the host count and, for each hosts'
/// part, the 32-bit FNV-1a hash of its hosts' ids in order (each id its
/// length as a byte, then its bytes; hosts past the count add nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIds {
    count: u16,
    parts: [u32; PARTS - 1],
}

const FNV_OFFSET: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;

const fn fnv1a(mut h: u32, bytes: &[u8]) -> u32 {
    let mut i = 0;
    while i < bytes.len() {
        h = (h ^ bytes[i] as u32).wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

/// `h` with host id `id` added: its length, then its bytes.
const fn add_id(h: u32, id: &[u8]) -> u32 {
    let len = if id.len() > u8::MAX as usize {
        u8::MAX
    } else {
        id.len() as u8
    };
    fnv1a(fnv1a(h, &[len]), id)
}

impl HostIds {
    /// Hosts `0..n` known by index only (the firmware's built-in layout):
    /// each host's id is its index in decimal.
    pub const fn indices(n: usize) -> Self {
        let n = if n > MAX_HOSTS { MAX_HOSTS } else { n };
        let mut parts = [FNV_OFFSET; PARTS - 1];
        let mut h = 0;
        while h < n {
            let digits = [
                b'0' + (h / 100) as u8,
                b'0' + (h / 10 % 10) as u8,
                b'0' + (h % 10) as u8,
            ];
            let skip = if h >= 100 {
                0
            } else if h >= 10 {
                1
            } else {
                2
            };
            let id = digits.split_at(skip).1;
            parts[h / HOSTS_PER_PART] = add_id(parts[h / HOSTS_PER_PART], id);
            h += 1;
        }
        Self {
            count: n as u16,
            parts,
        }
    }

    /// Hosts named by `ids`, in the configured order (the first
    /// [`MAX_HOSTS`] count).
    pub fn named<I: AsRef<[u8]>>(ids: impl IntoIterator<Item = I>) -> Self {
        let mut parts = [FNV_OFFSET; PARTS - 1];
        let mut count = 0;
        for (h, id) in ids.into_iter().take(MAX_HOSTS).enumerate() {
            let p = &mut parts[h / HOSTS_PER_PART];
            *p = add_id(*p, id.as_ref());
            count = h + 1;
        }
        Self {
            count: count as u16,
            parts,
        }
    }

    /// Hosts on the loop.
    pub const fn count(&self) -> u16 {
        self.count
    }

    /// The hash of hosts' part `part` (`1..PARTS`) as kept in its record.
    pub fn part_hash(&self, part: usize) -> Option<u32> {
        self.parts.get(part.checked_sub(1)?).copied()
    }
}

/// Why a record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordError {
    /// Its length is not the layout's.
    Length(usize),
    /// Its version is not [`VERSION`].
    Version(u8),
    /// Of [`UNNAMED_VERSION`]: it does not say which hosts it was
    /// learned on.
    Unnamed,
    /// Part 0 kept for a loop of `kept` hosts, not the `configured`.
    HostCount {
        /// Hosts when it was kept.
        kept: u16,
        /// Hosts configured now.
        configured: u16,
    },
    /// A hosts' part kept for other hosts than those configured in it.
    OtherHosts {
        /// The part.
        part: usize,
    },
    /// A part that does not exist.
    Part(usize),
}

impl core::fmt::Display for RecordError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Length(n) => write!(f, "a learned record of {n} bytes"),
            Self::Version(v) => write!(f, "a learned record of version {v}, not {VERSION}"),
            Self::Unnamed => write!(
                f,
                "a learned record of version {UNNAMED_VERSION}, which does not say which hosts it was learned on"
            ),
            Self::HostCount { kept, configured } => write!(
                f,
                "learned on a loop of {kept} hosts, not the {configured} configured"
            ),
            Self::OtherHosts { part } => {
                let from = part.saturating_sub(1) * HOSTS_PER_PART;
                write!(
                    f,
                    "learned on other hosts than those configured as hosts {from} to {} (counted from 0): the host list was reordered or changed",
                    from + HOSTS_PER_PART - 1
                )
            }
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

/// Length of part 0: version, host count, two scalars, θ, the upper
/// triangle of P, the trusts and two counters.
const LOOP_LEN: usize = 1 + 2 + 2 * 16 + N * 4 + (N * (N + 1) / 2) * 4 + N * 4 + 8;
/// Length of a hosts' part: version, its hosts' hash, their figures.
const HOSTS_LEN: usize = 1 + 4 + HOSTS_PER_PART * 11;

impl Learned {
    /// Part `part` of the record (see the module's glossary), into
    /// `out`; returns its length. It names the hosts of [`Learned::ids`].
    pub fn encode_part(&self, part: usize, out: &mut [u8; MAX_LEN]) -> Result<usize, RecordError> {
        let mut w = Writer::new();
        if part == 0 {
            w.bytes(&self.ids.count().to_le_bytes());
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
        } else if let Some(hash) = self.ids.part_hash(part) {
            w.bytes(&hash.to_le_bytes());
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

    /// Reads part `part` from `b` into `self`; refused, and `self` left
    /// as it was, when `b` was kept for other hosts than `self.ids`.
    pub fn decode_part(&mut self, part: usize, b: &[u8]) -> Result<(), RecordError> {
        let want = match part {
            0 => LOOP_LEN,
            p if p < PARTS => HOSTS_LEN,
            p => return Err(RecordError::Part(p)),
        };
        // Version 1's parts are shorter: said as what they are.
        if b.first() == Some(&UNNAMED_VERSION) {
            return Err(RecordError::Unnamed);
        }
        if b.len() != want {
            return Err(RecordError::Length(b.len()));
        }
        if b[0] != VERSION {
            return Err(RecordError::Version(b[0]));
        }
        let mut r = Reader { b, at: 1 };
        if part == 0 {
            let kept = u16::from_le_bytes(r.take::<2>());
            let configured = self.ids.count();
            if kept != configured {
                return Err(RecordError::HostCount { kept, configured });
            }
            self.decode_loop(&mut r);
        } else {
            if Some(u32::from_le_bytes(r.take::<4>())) != self.ids.part_hash(part) {
                return Err(RecordError::OtherHosts { part });
            }
            let from = (part - 1) * HOSTS_PER_PART;
            for h in self.hosts[from..from + HOSTS_PER_PART].iter_mut() {
                *h = r.host();
            }
        }
        Ok(())
    }

    /// Part 0's figures from `r`, past its host count.
    fn decode_loop(&mut self, r: &mut Reader<'_>) {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::Scalar;
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
    /// Sixteen hosts by name, `swap`'s two exchanged.
    fn hall(swap: Option<(usize, usize)>) -> HostIds {
        let mut names: std::vec::Vec<std::string::String> = (0..16)
            .map(|h| std::format!("r{}h{:02}", h / 4, h))
            .collect();
        if let Some((a, b)) = swap {
            names.swap(a, b);
        }
        HostIds::named(names.iter().map(|n| n.as_bytes()))
    }

    /// Figures learned on `ids`: host 5's plate fouled and trusted, host
    /// 9 a little better than configured.
    fn fouled(ids: HostIds) -> Learned {
        let mut l = Learned::new(&CoreConfig::default());
        l.ids = ids;
        l.hosts[5] = Scalar {
            value: 1.37,
            var: 0.0004,
            fed_s: 3600.0,
            trust: 0.8,
        };
        l.hosts[9] = Scalar {
            value: 0.9,
            var: 0.0004,
            fed_s: 3600.0,
            trust: 0.8,
        };
        l.flow.value = 1.41;
        l
    }

    /// `l`'s parts read back into figures of `ids`: them, and each
    /// part's result.
    fn read_on(l: &Learned, ids: HostIds) -> (Learned, std::vec::Vec<Result<(), RecordError>>) {
        let mut back = Learned::new(&CoreConfig::default());
        back.ids = ids;
        let mut buf = [0u8; MAX_LEN];
        let got = (0..PARTS)
            .map(|part| {
                let n = l.encode_part(part, &mut buf).unwrap();
                back.decode_part(part, &buf[..n])
            })
            .collect();
        (back, got)
    }

    #[test]
    fn two_hosts_reordered_do_not_take_each_others_factors() {
        let l = fouled(hall(None));
        // Hosts 5 and 9 exchange places in the list (parts 1 and 2).
        let (back, got) = read_on(&l, hall(Some((5, 9))));
        assert_eq!(got[1], Err(RecordError::OtherHosts { part: 1 }));
        assert_eq!(got[2], Err(RecordError::OtherHosts { part: 2 }));
        assert!(got
            .iter()
            .enumerate()
            .all(|(p, r)| p == 1 || p == 2 || r.is_ok()));
        let configured = Learned::new(&CoreConfig::default());
        assert_eq!(back.hosts[..16], configured.hosts[..16], "as configured");
        assert_eq!(back.flow.value, 1.41, "the loop's part is the same loop's");
        // Within one part too.
        let (back, got) = read_on(&l, hall(Some((4, 5))));
        assert_eq!(got[1], Err(RecordError::OtherHosts { part: 1 }));
        assert_eq!((back.hosts[4].value, back.hosts[5].value), (1.0, 1.0));
        assert_eq!(back.hosts[9].value, 0.9, "part 2 is the same hosts'");
    }

    #[test]
    fn an_unchanged_host_list_reads_back_every_part() {
        let l = fouled(hall(None));
        let (back, got) = read_on(&l, hall(None));
        assert!(got.iter().all(Result::is_ok), "{got:?}");
        assert_eq!(back.hosts[5].value, 1.37);
        assert!((back.hosts[5].trust - 0.8).abs() < 0.005);
        assert_eq!(back.hosts[9].value, 0.9);
        // Known by index (the firmware) alike.
        let l = fouled(HostIds::indices(16));
        let (back, got) = read_on(&l, HostIds::indices(16));
        assert!(got.iter().all(Result::is_ok), "{got:?}");
        assert_eq!(back.hosts[5].value, 1.37);
    }

    #[test]
    fn a_host_added_refuses_the_loops_part_and_the_hosts_part_it_joins() {
        let l = fouled(HostIds::indices(16));
        let (back, got) = read_on(&l, HostIds::indices(17));
        let kept = 16;
        let configured = 17;
        assert_eq!(got[0], Err(RecordError::HostCount { kept, configured }));
        assert_eq!(got[3], Err(RecordError::OtherHosts { part: 3 }));
        assert!(got[1].is_ok() && got[2].is_ok() && got[4..].iter().all(Result::is_ok));
        let configured = Learned::new(&CoreConfig::default());
        assert_eq!(back.flow, configured.flow);
        assert_eq!(back.hosts[5].value, 1.37);
        // Hosts by index are hosts named by their index.
        let names = (0..17).map(|h| std::format!("{h}"));
        assert_eq!(HostIds::indices(17), HostIds::named(names));
    }

    #[test]
    fn a_record_of_the_version_that_named_no_hosts_is_refused() {
        let l = fouled(HostIds::indices(16));
        let mut buf = [0u8; MAX_LEN];
        // Version 1's hosts' part: the version, then the eight figures.
        let n = l.encode_part(1, &mut buf).unwrap();
        let mut v1 = std::vec![UNNAMED_VERSION];
        v1.extend_from_slice(&buf[5..n]);
        let mut back = Learned::new(&CoreConfig::default());
        assert_eq!(back.decode_part(1, &v1), Err(RecordError::Unnamed));
        assert_eq!(
            back,
            Learned::new(&CoreConfig::default()),
            "left as configured"
        );
        assert_eq!(
            back.decode_part(0, &[UNNAMED_VERSION; 113]),
            Err(RecordError::Unnamed)
        );
    }
}
