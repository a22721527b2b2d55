//! Times on the console: `--since` and UTC clock times.

/// `YYYY-MM-DD HH:MM:SS.mmm` of a time in ms since the epoch (UTC).
pub fn clock(ms: u64) -> String {
    let u = loopwarden_protocol::TimestampMs(ms).utc();
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
        u.year, u.month, u.day, u.hour, u.minute, u.second, u.milli
    )
}

/// The earliest time in ms since the epoch taken as one: a smaller
/// number (2001-09-09 in ms) is seconds since the epoch (`date +%s`).
const EPOCH_MS_FROM: u64 = 1_000_000_000_000;
/// How far ahead of this host's clock a time may be (another clock).
const AHEAD_MS: u64 = 60_000;

/// Parses `--since`: `30s`, `10m`, `2h`, `1d` before `now_ms`, or ms since
/// the epoch (refused when it reads as seconds, or lies in the future:
/// "no events" would then be false).
pub fn parse_since(text: &str, now_ms: u64) -> Result<u64, String> {
    let t = text.trim();
    if let Ok(ms) = t.parse::<u64>() {
        if ms < EPOCH_MS_FROM {
            return Err(format!(
                "--since {text:?}: looks like seconds since the epoch; give ms since the epoch ({ms}000) or 30s, 10m, 2h, 1d"
            ));
        }
        if ms > now_ms.saturating_add(AHEAD_MS) {
            return Err(format!(
                "--since {text:?}: {} is later than now ({})",
                clock(ms),
                clock(now_ms)
            ));
        }
        return Ok(ms);
    }
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = num.parse().map_err(|_| {
        format!("--since {text:?}: expected 30s, 10m, 2h, 1d or ms since the epoch")
    })?;
    let unit_ms: u64 = match unit {
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("--since {text:?}: unit must be s, m, h or d")),
    };
    // Further back than the epoch is everything since the epoch.
    Ok(now_ms.saturating_sub(n.saturating_mul(unit_ms)))
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
        let late = 1_795_953_600_123;
        assert_eq!(parse_since(&late.to_string(), late), Ok(late));
        // Seconds (`date +%s`), or a time to come: refused, not "no events".
        let e = parse_since("1795953600", late).unwrap_err();
        assert!(e.contains("looks like seconds"), "{e}");
        let e = parse_since(&(late + 3_600_000).to_string(), late).unwrap_err();
        assert!(e.contains("later than now"), "{e}");
        // A span too long for the clock is everything since the epoch,
        // never a wrapped time in the future.
        assert_eq!(parse_since("18446744073709551s", now), Ok(0));
        assert_eq!(parse_since("18446744073709551615d", now), Ok(0));
        assert_eq!(parse_since("1d", now), Ok(0));
        assert_eq!(
            parse_since("10x", now),
            Err("--since \"10x\": unit must be s, m, h or d".into())
        );
        assert!(parse_since("soon", now).is_err());
    }
}
