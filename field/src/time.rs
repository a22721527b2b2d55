//! Times on the console: `--since` and UTC clock times.

/// `YYYY-MM-DD HH:MM:SS.mmm` of a time in ms since the epoch (UTC).
pub fn clock(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Parses `--since`: `30s`, `10m`, `2h`, `1d` before `now_ms`, or ms since
/// the epoch.
pub fn parse_since(text: &str, now_ms: u64) -> Result<u64, String> {
    let t = text.trim();
    if let Ok(ms) = t.parse::<u64>() {
        return Ok(ms);
    }
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = num.parse().map_err(|_| {
        format!("--since {text:?}: expected 30s, 10m, 2h, 1d or ms since the epoch")
    })?;
    let ms = match unit {
        "s" => n * 1000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        "d" => n * 86_400_000,
        _ => return Err(format!("--since {text:?}: unit must be s, m, h or d")),
    };
    Ok(now_ms.saturating_sub(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_and_since() {
        assert_eq!(clock(1_795_953_600_123), "2026-11-29 12:00:00.123");
        assert_eq!(clock(0), "1970-01-01 00:00:00.000");
        let now = 1_000_000;
        assert_eq!(parse_since("10s", now), Ok(990_000));
        assert_eq!(parse_since("2m", now), Ok(880_000));
        assert_eq!(parse_since("123", now), Ok(123));
        assert_eq!(parse_since("1d", now), Ok(0));
        assert_eq!(
            parse_since("10x", now),
            Err("--since \"10x\": unit must be s, m, h or d".into())
        );
        assert!(parse_since("soon", now).is_err());
    }
}
