//! The core's configuration as bytes, for an image that cannot read a
//! site's TOML: `cooling-ctrl firmware-figures` writes the configuration
//! `run` builds from a site figures file, a microcontroller's build
//! embeds it, and the firmware decodes it at start. One field list
//! (`fields`) serves both directions, so the two cannot disagree on an
//! order; a field added to the configuration does not build until it is
//! named there.
//!
//! The record, 271 bytes: the tag `LWFG`, the format's version (1 byte),
//! every figure in `fields`'s order (`u8`, `u16` and `u64` as
//! little-endian integers, `f32` as its bits little-endian), the CDU's
//! heartbeat timeout (ms, `u32` little-endian; 0: the site figures did
//! not give it), then a CRC-32 (ISO-HDLC, little-endian) of all before
//! it. The heartbeat timeout is no figure of the core's (the core never
//! uses it: it bounds the firmware's wait after a start and its control
//! period), so it lies beside the configuration in the record, not in
//! [`CoreConfig`]. A version 1 record (267 bytes) is the same without
//! it, and still decodes, the timeout not given.
//!
//! Glossary:
//! - *figures record*: those bytes; [`decode`] takes one only when its
//!   tag, version, length (its version's: a version byte that reads the
//!   other version's is refused as such) and CRC are right and the configuration it
//!   holds passes [`CoreConfig::validate`].
//! - *heartbeat timeout*: how long the CDU waits for its heartbeat
//!   register to be written before it falls back to its own control (the
//!   site figures' `[loop] heartbeat_timeout_s`).

use core::num::NonZeroU32;

use crc::{Crc, CRC_32_ISO_HDLC};

use super::{
    CduParams, ConfigError, CoreConfig, FacilityParams, GpuParams, HostParams, Layout, Margins,
    Timing,
};

/// The record's first bytes.
pub const TAG: [u8; 4] = *b"LWFG";
/// The record's format, the one [`encode`] writes; a record of another
/// but version 1 (the same without the heartbeat timeout) is refused.
pub const VERSION: u8 = 2;
/// The figures' bytes: the layout (3 `u8` and a `u16`), 47 `f32` and the
/// facility's `cdus` (`u8`), 8 timings (`u64`).
const FIGURES_BYTES: usize = 3 + 2 + 47 * 4 + 1 + 8 * 8;
/// The heartbeat timeout's bytes (a `u32`, ms), after the figures.
const HEARTBEAT_BYTES: usize = 4;
/// A whole record's bytes, as [`encode`] writes it.
pub const RECORD_BYTES: usize = TAG.len() + 1 + FIGURES_BYTES + HEARTBEAT_BYTES + 4;
/// A version 1 record's bytes: no heartbeat timeout.
pub const RECORD_V1_BYTES: usize = RECORD_BYTES - HEARTBEAT_BYTES;

const CRC: Crc<u32> = Crc::<u32>::new(&CRC_32_ISO_HDLC);

/// Why a figures record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FiguresError {
    /// Neither [`RECORD_BYTES`] nor [`RECORD_V1_BYTES`] long.
    Length(usize),
    /// One version's length, its version byte reading the other version
    /// (a damaged version byte, or a record cut or padded to the other's
    /// length).
    VersionLength {
        /// The version its byte reads.
        version: u8,
        /// Its length, bytes.
        len: usize,
    },
    /// It does not start with [`TAG`].
    Tag,
    /// A format other than [`VERSION`] or 1.
    Version(u8),
    /// The CRC it carries is not that of its bytes.
    Crc {
        /// The CRC the record carries.
        carried: u32,
        /// The CRC of its bytes.
        computed: u32,
    },
    /// It decoded, and the core refuses the configuration.
    Refused(ConfigError),
}

impl core::fmt::Display for FiguresError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Length(n) => write!(
                f,
                "{n} bytes, not a figures record's {RECORD_BYTES} (version {VERSION}) \
                 or {RECORD_V1_BYTES} (version 1)"
            ),
            Self::VersionLength { version, len } => {
                let (own, other, other_len) = match *version {
                    1 => (RECORD_V1_BYTES, VERSION, RECORD_BYTES),
                    _ => (RECORD_BYTES, 1, RECORD_V1_BYTES),
                };
                write!(
                    f,
                    "a version {version} record of {len} bytes: version {version} records are \
                     {own} bytes, version {other} {other_len} (a damaged version byte, or a \
                     record cut or padded)"
                )
            }
            Self::Tag => write!(f, "not a figures record (its tag is not LWFG)"),
            Self::Version(v) => write!(f, "a figures record of version {v}, not {VERSION} (or 1)"),
            Self::Crc { carried, computed } => write!(
                f,
                "its CRC-32 {carried:#010x} is not its bytes' {computed:#010x} (damaged)"
            ),
            Self::Refused(e) => write!(f, "the core refuses its configuration: {e}"),
        }
    }
}

/// `cfg` as a figures record, the CDU's heartbeat timeout not given.
pub fn encode(cfg: &CoreConfig) -> [u8; RECORD_BYTES] {
    encode_with(cfg, None)
}

/// `cfg` as a figures record, with the CDU's heartbeat timeout
/// (`heartbeat_timeout_ms`, ms; `None`: not given, written as 0).
pub fn encode_with(
    cfg: &CoreConfig,
    heartbeat_timeout_ms: Option<NonZeroU32>,
) -> [u8; RECORD_BYTES] {
    let mut out = [0u8; RECORD_BYTES];
    out[..4].copy_from_slice(&TAG);
    out[4] = VERSION;
    let mut w = Writer {
        out: &mut out[5..5 + FIGURES_BYTES],
        at: 0,
    };
    fields(&mut cfg.clone(), &mut w);
    debug_assert_eq!(w.at, FIGURES_BYTES, "the field list fills the record");
    let ms = heartbeat_timeout_ms.map_or(0, NonZeroU32::get);
    out[5 + FIGURES_BYTES..RECORD_BYTES - 4].copy_from_slice(&ms.to_le_bytes());
    let crc = CRC.checksum(&out[..RECORD_BYTES - 4]);
    out[RECORD_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The configuration a figures record holds, checked as the core checks
/// it ([`CoreConfig::validate`]).
pub fn decode(bytes: &[u8]) -> Result<CoreConfig, FiguresError> {
    decode_with(bytes).map(|(cfg, _)| cfg)
}

/// As [`decode`], with the CDU's heartbeat timeout the record carries,
/// ms (`None`: not given, and in every version 1 record).
pub fn decode_with(bytes: &[u8]) -> Result<(CoreConfig, Option<NonZeroU32>), FiguresError> {
    let mut cfg = CoreConfig::reference();
    let heartbeat = decode_parts(bytes, &mut cfg)?;
    Ok((cfg, heartbeat))
}

/// As [`decode`], into `cfg` (a microcontroller's static, off its
/// stack); on an error `cfg` holds no configuration to run.
pub fn decode_into(bytes: &[u8], cfg: &mut CoreConfig) -> Result<(), FiguresError> {
    decode_parts(bytes, cfg).map(|_| ())
}

/// The record's checks, its figures into `cfg`, and its heartbeat
/// timeout.
fn decode_parts(bytes: &[u8], cfg: &mut CoreConfig) -> Result<Option<NonZeroU32>, FiguresError> {
    if bytes.len() != RECORD_BYTES && bytes.len() != RECORD_V1_BYTES {
        return Err(FiguresError::Length(bytes.len()));
    }
    if bytes[..4] != TAG {
        return Err(FiguresError::Tag);
    }
    let length = match bytes[4] {
        VERSION => RECORD_BYTES,
        1 => RECORD_V1_BYTES,
        v => return Err(FiguresError::Version(v)),
    };
    if bytes.len() != length {
        return Err(FiguresError::VersionLength {
            version: bytes[4],
            len: bytes.len(),
        });
    }
    let (body, tail) = bytes.split_at(length - 4);
    let carried = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let computed = CRC.checksum(body);
    if carried != computed {
        return Err(FiguresError::Crc { carried, computed });
    }
    let (figures, heartbeat) = body[5..].split_at(FIGURES_BYTES);
    let mut r = Reader {
        bytes: figures,
        at: 0,
    };
    fields(cfg, &mut r);
    cfg.validate().map_err(FiguresError::Refused)?;
    Ok(match heartbeat {
        [a, b, c, d] => NonZeroU32::new(u32::from_le_bytes([*a, *b, *c, *d])),
        _ => None,
    })
}

/// One direction of the record: each figure in turn.
trait Figure {
    fn u8(&mut self, v: &mut u8);
    fn u16(&mut self, v: &mut u16);
    fn u64(&mut self, v: &mut u64);
    fn f32(&mut self, v: &mut f32);
}

/// Every figure of `c`, in the record's order. Each struct is taken
/// apart whole, so a field added to one is a build error here.
fn fields(c: &mut CoreConfig, v: &mut impl Figure) {
    let CoreConfig {
        layout,
        gpu,
        host,
        cdu,
        facility,
        margins,
        timing,
    } = c;
    let Layout {
        racks,
        hosts_per_rack,
        gpus_per_host,
        unprotected,
    } = layout;
    for n in [racks, hosts_per_rack, gpus_per_host] {
        v.u8(n);
    }
    v.u16(unprotected);
    let GpuParams {
        tdp_w,
        min_cap_w,
        static_w,
        leak_per_k,
        r_jc_k_per_w,
        r_cp,
        max_operating_c,
    } = gpu;
    for x in [tdp_w, min_cap_w, static_w, leak_per_k, r_jc_k_per_w] {
        v.f32(x);
    }
    r_cp.iter_mut().flatten().for_each(|x| v.f32(x));
    v.f32(max_operating_c);
    let HostParams { full_w, idle_w } = host;
    for x in [full_w, idle_w] {
        v.f32(x);
    }
    let CduParams {
        design_lpm_per_gpu,
        min_speed,
        pump_max_w,
        approach_k,
        min_setpoint_c,
        max_setpoint_c,
        cp_j_per_kg_k,
        density_kg_per_m3,
        design_dp_kpa,
    } = cdu;
    for x in [
        design_lpm_per_gpu,
        min_speed,
        pump_max_w,
        approach_k,
        min_setpoint_c,
        max_setpoint_c,
        cp_j_per_kg_k,
        density_kg_per_m3,
        design_dp_kpa,
    ] {
        v.f32(x);
    }
    facility_fields(facility, v);
    margin_fields(margins, v);
    timing_fields(timing, v);
}

fn facility_fields(f: &mut FacilityParams, v: &mut impl Figure) {
    let FacilityParams {
        water_kg_per_s,
        water_cp_j_per_kg_k,
        dry_cooler_ua_w_per_k,
        fan_max_w,
        pinch_k,
        chiller_max_w,
        cop_max,
        carnot_fraction,
        pumps_w,
        distribution_loss,
        fixed_w,
        cdus,
    } = f;
    for x in [
        water_kg_per_s,
        water_cp_j_per_kg_k,
        dry_cooler_ua_w_per_k,
        fan_max_w,
        pinch_k,
        chiller_max_w,
        cop_max,
        carnot_fraction,
        pumps_w,
        distribution_loss,
        fixed_w,
    ] {
        v.f32(x);
    }
    v.u8(cdus);
}

fn margin_fields(m: &mut Margins, v: &mut impl Figure) {
    let Margins {
        plan_ceiling_c,
        cap_target_c,
        boot_setpoint_c,
        failsafe_setpoint_c,
        design_ambient_c,
        setpoint_rise_k_per_min,
        speed_fall_per_s,
    } = m;
    for x in [
        plan_ceiling_c,
        cap_target_c,
        boot_setpoint_c,
        failsafe_setpoint_c,
        design_ambient_c,
        setpoint_rise_k_per_min,
        speed_fall_per_s,
    ] {
        v.f32(x);
    }
}

fn timing_fields(t: &mut Timing, v: &mut impl Figure) {
    let Timing {
        sensor_timeout_ms,
        host_timeout_ms,
        boot_settle_ms,
        optimise_every_ms,
        fault_confirm_ms,
        fault_clear_ms,
        cap_release_ms,
        valve_confirm_ms,
    } = t;
    for x in [
        sensor_timeout_ms,
        host_timeout_ms,
        boot_settle_ms,
        optimise_every_ms,
        fault_confirm_ms,
        fault_clear_ms,
        cap_release_ms,
        valve_confirm_ms,
    ] {
        v.u64(x);
    }
}

/// Writes figures into `out` (its length checked by the caller).
struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put<const N: usize>(&mut self, b: [u8; N]) {
        self.out[self.at..self.at + N].copy_from_slice(&b);
        self.at += N;
    }
}

impl Figure for Writer<'_> {
    fn u8(&mut self, v: &mut u8) {
        self.put([*v]);
    }
    fn u16(&mut self, v: &mut u16) {
        self.put(v.to_le_bytes());
    }
    fn u64(&mut self, v: &mut u64) {
        self.put(v.to_le_bytes());
    }
    fn f32(&mut self, v: &mut f32) {
        self.put(v.to_bits().to_le_bytes());
    }
}

/// Reads figures from `bytes` ([`FIGURES_BYTES`] long, checked by
/// [`decode`]).
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        b.copy_from_slice(&self.bytes[self.at..self.at + N]);
        self.at += N;
        b
    }
}

impl Figure for Reader<'_> {
    fn u8(&mut self, v: &mut u8) {
        *v = self.take::<1>()[0];
    }
    fn u16(&mut self, v: &mut u16) {
        *v = u16::from_le_bytes(self.take());
    }
    fn u64(&mut self, v: &mut u64) {
        *v = u64::from_le_bytes(self.take());
    }
    fn f32(&mut self, v: &mut f32) {
        *v = f32::from_bits(u32::from_le_bytes(self.take()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    /// A configuration whose every figure differs from the reference's,
    /// still valid.
    fn other() -> CoreConfig {
        let mut c = CoreConfig::reference();
        let mut n = 0u32;
        let mut w = Bump(&mut n);
        fields(&mut c, &mut w);
        c.layout = Layout {
            racks: 6,
            hosts_per_rack: 3,
            gpus_per_host: 4,
            unprotected: 0b10_0001,
        };
        c.facility.cdus = 4;
        c.margins.plan_ceiling_c = c.gpu.max_operating_c - 4.5;
        c.margins.cap_target_c = c.gpu.max_operating_c - 1.5;
        c.validate().expect("still a configuration the core takes");
        c
    }

    /// Raises every float a little and every timing by a second, so a
    /// field written in one place and read into another shows.
    struct Bump<'a>(&'a mut u32);
    impl Figure for Bump<'_> {
        fn u8(&mut self, _: &mut u8) {}
        fn u16(&mut self, _: &mut u16) {}
        fn u64(&mut self, v: &mut u64) {
            *self.0 += 1;
            *v += 1000 * u64::from(*self.0);
        }
        fn f32(&mut self, v: &mut f32) {
            *self.0 += 1;
            *v *= 1.0 + 0.001 * *self.0 as f32;
        }
    }

    #[test]
    fn a_record_gives_back_the_configuration_it_was_made_of() {
        for c in [CoreConfig::reference(), other()] {
            let r = encode(&c);
            assert_eq!(r.len(), RECORD_BYTES);
            assert_eq!(&r[..5], b"LWFG\x02");
            assert_eq!(decode(&r), Ok(c));
            assert_eq!(decode_with(&r), Ok((c, None)), "no timeout given");
        }
        assert_ne!(other(), CoreConfig::reference());
    }

    /// 30 s, ms.
    const THIRTY_S: Option<NonZeroU32> = NonZeroU32::new(30_000);

    #[test]
    fn a_record_with_the_cdus_heartbeat_timeout_gives_it_back() {
        let c = other();
        let r = encode_with(&c, THIRTY_S);
        assert_eq!(r.len(), RECORD_BYTES);
        assert_eq!(
            &r[RECORD_BYTES - 8..RECORD_BYTES - 4],
            &30_000u32.to_le_bytes()
        );
        assert_eq!(decode_with(&r), Ok((c, THIRTY_S)));
        assert_eq!(decode(&r), Ok(c));
        let mut into = CoreConfig::reference();
        assert_eq!(decode_into(&r, &mut into), Ok(()));
        assert_eq!(into, c);
        assert_ne!(r, encode(&c), "the timeout is in the record");
    }

    /// A version 1 record: the tag, version 1, the figures and the CRC of
    /// them, no heartbeat timeout.
    fn version_1(c: &CoreConfig) -> std::vec::Vec<u8> {
        let mut r = encode_with(c, THIRTY_S)[..5 + FIGURES_BYTES].to_vec();
        r[4] = 1;
        let crc = CRC.checksum(&r);
        r.extend_from_slice(&crc.to_le_bytes());
        r
    }

    #[test]
    fn a_version_1_record_still_decodes_with_no_heartbeat_timeout() {
        let c = other();
        let r = version_1(&c);
        assert_eq!(r.len(), RECORD_V1_BYTES);
        assert_eq!(RECORD_V1_BYTES, 267);
        assert_eq!(decode_with(&r), Ok((c, None)));
        assert_eq!(decode(&r), Ok(c));
        let e = FiguresError::Length(3).to_string();
        assert!(e.contains("271 (version 2) or 267 (version 1)"), "{e}");
    }

    #[test]
    fn a_version_at_the_other_versions_length_is_refused_naming_both() {
        let c = other();
        // Each version at its own length only: a record of one length
        // whose version byte reads the other is refused as such, never
        // as a length no record has.
        let mut long = encode(&c);
        long[4] = 1;
        let e = decode(&long).expect_err("version 1 at 271 bytes");
        assert_eq!(
            e.to_string(),
            "a version 1 record of 271 bytes: version 1 records are 267 bytes, version 2 \
             271 (a damaged version byte, or a record cut or padded)"
        );
        let mut short = version_1(&c);
        short[4] = VERSION;
        let e = decode(&short)
            .expect_err("version 2 at 267 bytes")
            .to_string();
        assert!(
            e.starts_with("a version 2 record of 267 bytes: version 2 records are 271 bytes")
                && !e.contains("not a figures record's"),
            "{e}"
        );
    }

    #[test]
    fn the_field_list_fills_the_record_exactly() {
        let mut out = [0u8; FIGURES_BYTES];
        let mut w = Writer {
            out: &mut out,
            at: 0,
        };
        fields(&mut CoreConfig::reference(), &mut w);
        assert_eq!(w.at, FIGURES_BYTES);
    }

    #[test]
    fn any_damaged_byte_is_refused() {
        let r = encode(&other());
        for i in 0..RECORD_BYTES {
            let mut bad = r;
            bad[i] ^= 0x10;
            let e = decode(&bad).unwrap_err();
            let want = match i {
                0..=3 => matches!(e, FiguresError::Tag),
                4 => matches!(e, FiguresError::Version(0x12)),
                _ => matches!(e, FiguresError::Crc { .. }),
            };
            assert!(want, "byte {i}: {e}");
        }
        assert_eq!(decode(&r[1..]), Err(FiguresError::Length(RECORD_BYTES - 1)));
    }

    #[test]
    fn a_configuration_the_core_refuses_is_refused_whole() {
        let mut c = other();
        c.layout.racks = 0;
        let e = decode(&encode(&c)).unwrap_err();
        assert!(
            matches!(e, FiguresError::Refused(ConfigError::Layout(_))),
            "{e}"
        );
        assert!(e.to_string().starts_with("the core refuses"), "{e}");
    }
}
