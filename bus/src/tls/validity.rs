//! When a certificate is valid: its `notBefore` and `notAfter`, read from
//! its DER (RFC 5280: `Certificate` → `tbsCertificate` → `validity`),
//! so an agent says at start that a certificate has expired or soon will,
//! where the bus would only say "broker unreachable" once it had.
//!
//! Glossary:
//! - *DER*: the binary encoding of a certificate; each element a tag, a
//!   length and its contents.
//! - *validity*: the two times a certificate is valid between.

use loopwarden_protocol::TimestampMs;

/// A certificate's validity, ms since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Not valid before.
    pub not_before: TimestampMs,
    /// Not valid after.
    pub not_after: TimestampMs,
    /// Its issuer is its subject: a root, not an intermediate.
    pub self_signed: bool,
}

/// The validity of the certificate `der`; `None` where it is not a
/// certificate this reads (it is then checked by the TLS library alone).
pub fn validity(der: &[u8]) -> Option<Validity> {
    let (issuer, validity, subject) = names_and_validity(der)?;
    let (not_before, after) = time(validity)?;
    let (not_after, _) = time(after)?;
    Some(Validity {
        not_before,
        not_after,
        self_signed: issuer == subject,
    })
}

/// The contents of the issuer, the validity and the subject of the
/// certificate `der` (each a `SEQUENCE`).
pub(super) fn names_and_validity(der: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let (cert, _) = element(der, 0x30)?;
    let (tbs, _) = element(cert, 0x30)?;
    // The version, when there ([0] EXPLICIT).
    let mut rest = match element(tbs, 0xa0) {
        Some((_, after)) => after,
        None => tbs,
    };
    // The serial number, the signature's algorithm, the issuer.
    for tag in [0x02, 0x30] {
        rest = element(rest, tag)?.1;
    }
    let (issuer, rest) = element(rest, 0x30)?;
    let (validity, rest) = element(rest, 0x30)?;
    let (subject, _) = element(rest, 0x30)?;
    Some((issuer, validity, subject))
}

/// The contents of the element of tag `tag` at the start of `b`, and what
/// follows it.
pub(super) fn element(b: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, rest) = b.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |l, &b| (l << 8) | usize::from(b));
        (len, &rest[n..])
    };
    (t == tag && rest.len() >= len).then(|| (&rest[..len], &rest[len..]))
}

/// A `UTCTime` (`YYMMDDHHMMSSZ`, 1950 to 2049) or `GeneralizedTime`
/// (`YYYYMMDDHHMMSSZ`) at the start of `b`, and what follows it.
fn time(b: &[u8]) -> Option<(TimestampMs, &[u8])> {
    let (utc, long) = (element(b, 0x17), element(b, 0x18));
    let ((v, after), digits) = match (utc, long) {
        (Some(e), _) => (e, 2),
        (_, Some(e)) => (e, 4),
        _ => return None,
    };
    let s = std::str::from_utf8(v).ok()?.strip_suffix('Z')?;
    if s.len() != digits + 10 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let num = |i: usize, n: usize| s[i..i + n].parse::<i64>().ok();
    let year = match (digits, num(0, digits)?) {
        (2, yy) if yy >= 50 => 1900 + yy,
        (2, yy) => 2000 + yy,
        (_, yyyy) => yyyy,
    };
    let f = |i: usize| num(digits + i, 2);
    let (month, day) = (f(0)?, f(2)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + f(4)? * 3_600 + f(6)? * 60 + f(8)?;
    let ms = u64::try_from(secs).ok()?.checked_mul(1000)?;
    Some((TimestampMs(ms), after))
}

/// Days since 1970-01-01 of a date of the proleptic Gregorian calendar.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Ms since the Unix epoch at the start of a day (tests).
#[cfg(test)]
pub(super) fn tests_day(year: i64, month: i64, day: i64) -> u64 {
    days_from_civil(year, month, day) as u64 * 86_400_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_count_days_as_the_calendar_does() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 2, 29), 11_016);
        let t = TimestampMs(days_from_civil(2026, 11, 29) as u64 * 86_400_000);
        let u = t.utc();
        assert_eq!((u.year, u.month, u.day), (2026, 11, 29));
    }

    #[test]
    fn a_generated_certificates_validity_reads_back() {
        let mut p = rcgen::CertificateParams::new(vec!["broker".into()]).unwrap();
        p.not_before = rcgen::date_time_ymd(2026, 1, 2);
        p.not_after = rcgen::date_time_ymd(2051, 3, 4);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        let v = validity(cert.der()).expect("read");
        let at = |y, m, d| TimestampMs(days_from_civil(y, m, d) as u64 * 86_400_000);
        assert_eq!(v.not_before, at(2026, 1, 2));
        assert_eq!(v.not_after, at(2051, 3, 4), "GeneralizedTime past 2049");
        assert!(v.self_signed);
        assert_eq!(validity(b"\x30\x03\x02\x01\x00"), None, "not a certificate");
        assert_eq!(validity(&cert.der()[..40]), None, "cut short");
    }
}
