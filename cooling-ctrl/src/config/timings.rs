//! The timings: the control period, the cap lease, one Modbus request's
//! timeout, and the fallback outdoor temperature the core plans with when
//! no sensor reads.

use std::time::Duration;

use loopwarden_field::common::{self, MOST_PERIOD_MS};
use loopwarden_field::config::{range, ConfigError, Sources};
use loopwarden_field::pick;

use super::plant::HeartbeatTimeout;
use super::{FileConfig, Overrides};

/// The control period, the lease, the Modbus timeout and the fallback
/// outdoor temperature.
pub(super) struct Timings {
    /// Control period.
    pub(super) period: Duration,
    /// Cap lease duration.
    pub(super) lease: Duration,
    /// One Modbus request's timeout.
    pub(super) modbus_timeout: Duration,
    /// Fallback outdoor temperature.
    pub(super) ambient_c: Option<f32>,
}

/// The timings: the lease at least 3 periods and at most 10 minutes (what
/// hosts take by default), the Modbus timeout at most three eighths of
/// the period ([`most_timeout_ms`]): a step whose CDU is silent waits it
/// out twice, and the rest of the step needs the remainder; the period
/// within the CDU's heartbeat timeout where the site figures say it
/// ([`within_heartbeat`]).
pub(super) fn timings(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    heartbeat: Option<&HeartbeatTimeout>,
) -> Result<Timings, ConfigError> {
    let picked_period = pick!(flags.period_ms, file.period_ms, "period-ms");
    let period = common::period_ms(src, picked_period)?;
    within_heartbeat(src, period, picked_period.1, heartbeat)?;
    let lease = range(
        src,
        pick!(flags.lease_ms, file.lease_ms, "lease-ms"),
        "lease_ms",
        30_000.max(3 * period),
        3 * period,
        600_000,
        " ms, at least 3 periods, at most the hosts' 10-minute cap",
    )?;
    let picked = pick!(
        flags.modbus_timeout_ms,
        file.modbus_timeout_ms,
        "modbus-timeout-ms"
    );
    // What the timeout asked for would need, for the operator who keeps it.
    let needs = picked
        .0
        .filter(|t| *t > most_timeout_ms(period))
        .map_or(String::new(), |t| match least_period_ms(t) {
            p if p <= MOST_PERIOD_MS => format!("; {t} ms needs period_ms = {p} or more"),
            _ => format!("; {t} ms fits no period_ms (at most {MOST_PERIOD_MS} ms)"),
        });
    let modbus_timeout = range(
        src,
        picked,
        "modbus_timeout_ms",
        DEFAULT_TIMEOUT_MS.min(most_timeout_ms(period)),
        10,
        most_timeout_ms(period),
        &format!(
            " ms: at most three eighths of the period of {period} ms, \
             as a step waits out a read and a write the CDU does not answer{needs}"
        ),
    )?;
    let ambient_c = match pick!(flags.ambient_c, file.ambient_c, "ambient-c") {
        (None, _) => None,
        p => Some(range(src, p, "ambient_c", 0.0, -50.0, 60.0, " °C")?),
    };
    Ok(Timings {
        period: Duration::from_millis(period),
        lease: Duration::from_millis(lease),
        modbus_timeout: Duration::from_millis(modbus_timeout),
        ambient_c,
    })
}

/// A control period of `period_ms` (from `flag`, else the file) at most a
/// third of the CDU's heartbeat timeout: the controller writes the
/// heartbeat once a step, and a CDU that sees no write for its timeout
/// falls back to its own control (full pump speed, its own setpoint,
/// pumps the controller stopped started again); a third leaves room for
/// a missed write or two. Figures that do not say the timeout check
/// nothing.
fn within_heartbeat(
    src: &Sources,
    period_ms: u64,
    flag: Option<&str>,
    heartbeat: Option<&HeartbeatTimeout>,
) -> Result<(), ConfigError> {
    let Some(h) = heartbeat else {
        return Ok(());
    };
    let most = heartbeat_third_ms(h);
    if period_ms <= most {
        return Ok(());
    }
    Err(src.error(
        flag,
        "period_ms",
        format!(
            "period_ms = {period_ms} is more than a third of the CDU's heartbeat timeout, \
             heartbeat_timeout_s = {} s in the site figures' [loop] ({}): the controller \
             writes the heartbeat once a step, and the CDU would fall back to its own \
             control between writes; at most {most} ms, a third so that a missed write or \
             two does not trip it (heartbeat_timeout_s must be the CDU's real timeout)",
            h.s, h.figures
        ),
    ))
}

/// A third of the CDU's heartbeat timeout, ms: the longest period it
/// allows ([`within_heartbeat`]).
fn heartbeat_third_ms(h: &HeartbeatTimeout) -> u64 {
    (h.s * 1000.0 / 3.0).floor().max(0.0) as u64
}

/// The longest control period allowed, ms, and what sets it: a third of
/// the CDU's heartbeat timeout where the site figures give it, else the
/// longest period there is.
pub(super) fn most_period_ms(heartbeat: Option<&HeartbeatTimeout>) -> (u64, String) {
    match heartbeat {
        Some(h) if heartbeat_third_ms(h) < MOST_PERIOD_MS => (
            heartbeat_third_ms(h),
            format!(
                "a third of the CDU's heartbeat timeout, heartbeat_timeout_s = {} s in {}",
                h.s, h.figures
            ),
        ),
        _ => (MOST_PERIOD_MS, "the longest period".into()),
    }
}

/// The Modbus timeout where the period leaves room for it.
const DEFAULT_TIMEOUT_MS: u64 = 500;

/// The longest Modbus timeout a period of `period_ms` leaves room for:
/// three eighths of it. A step whose CDU does not answer waits out its
/// read, then its first write (tried all the same, so a leak's valve
/// close still goes out), two timeouts; on a serial line the link's
/// reopen comes on top, and the rest of the step (the board, the hosts'
/// caps, the relay pulse) needs the remaining quarter.
pub(super) fn most_timeout_ms(period_ms: u64) -> u64 {
    period_ms * 3 / 8
}

/// The shortest period that leaves room for a timeout of `timeout_ms`
/// (saturating: a timeout no period fits gives `u64::MAX`).
pub(super) fn least_period_ms(timeout_ms: u64) -> u64 {
    timeout_ms.saturating_mul(8).div_ceil(3)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::least_period_ms;

    use crate::config::{resolve, Overrides};

    const MIN: &str =
        "cdu = \"cdu-1\"\ndemo_key = true\ncdu_tcp = \"127.0.0.1:5020\"\nembedded_broker = true\n";

    fn timeout(extra: &str) -> Result<Duration, String> {
        let text = format!("{MIN}{extra}");
        resolve(Some(Path::new("cdu.toml")), &text, &Overrides::default())
            .map(|c| c.modbus_timeout)
            .map_err(|e| e.to_string())
    }

    /// The CDU falls back to its own control when its heartbeat register
    /// goes unwritten for its timeout; the controller writes it once a
    /// step, so a period past a third of that timeout is refused (a
    /// missed write or two must not trip it), naming both keys.
    #[test]
    fn a_period_past_a_third_of_the_cdus_heartbeat_timeout_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let figures = dir.path().join("site.toml");
        let with = |loop_: &str, period: u64| {
            let hall = "racks = 4\nhosts_per_rack = 4\n";
            std::fs::write(&figures, format!("{hall}{loop_}")).unwrap();
            let text = format!("{MIN}site_figures = {figures:?}\nperiod_ms = {period}\n");
            resolve(Some(Path::new("cdu.toml")), &text, &Overrides::default())
                .map(|c| c.period.as_millis())
                .map_err(|e| e.to_string())
        };
        let ten = "[loop]\nheartbeat_timeout_s = 10\n";
        let e = with(ten, 15_000).unwrap_err();
        assert!(e.starts_with("cdu.toml line 6: period_ms = 15000 "), "{e}");
        assert!(
            e.contains(&format!(
                "heartbeat_timeout_s = 10 s in the site figures' [loop] ({})",
                figures.display()
            )),
            "{e}"
        );
        assert!(e.contains("at most 3333 ms"), "{e}");
        assert_eq!(with(ten, 3000), Ok(3000));
        assert_eq!(with(ten, 3333), Ok(3333));
        assert!(with(ten, 3334).is_err());
        // Figures that do not say the CDU's timeout: nothing is assumed.
        assert_eq!(with("", 15_000), Ok(15_000));
    }

    /// The CDU's heartbeat timeout the site figures give is kept for the
    /// shell ([`crate::config::Config::shell_config`]): it bounds the heartbeat's wait after a start for a
    /// read-back; figures without it leave the shell's own bound.
    #[test]
    fn the_cdus_heartbeat_timeout_is_kept_to_bound_the_wait_after_a_start() {
        let dir = tempfile::tempdir().unwrap();
        let figures = dir.path().join("site.toml");
        let with = |loop_: &str| {
            let hall = "racks = 4\nhosts_per_rack = 4\n";
            std::fs::write(&figures, format!("{hall}{loop_}")).unwrap();
            let text = format!("{MIN}site_figures = {figures:?}\n");
            let c = resolve(Some(Path::new("cdu.toml")), &text, &Overrides::default()).unwrap();
            c.heartbeat_timeout
        };
        let twelve = "[loop]\nheartbeat_timeout_s = 12.5\n";
        assert_eq!(with(twelve), Some(Duration::from_millis(12_500)));
        assert_eq!(with(""), None);
    }

    /// A CDU heartbeat timeout that is no number of seconds (`inf`,
    /// `nan`) or none above 0 is refused at load, naming the key and the
    /// figures: `inf` passed the period's check and bounded the wait
    /// after a start by never, so a CDU whose read-back proves nothing
    /// got no heartbeat at all.
    #[test]
    fn a_heartbeat_timeout_that_is_no_finite_time_is_refused_naming_the_key_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let figures = dir.path().join("site.toml");
        let with = |loop_: &str| {
            let hall = "racks = 4\nhosts_per_rack = 4\n";
            std::fs::write(&figures, format!("{hall}{loop_}")).unwrap();
            let text = format!("{MIN}site_figures = {figures:?}\n");
            resolve(Some(Path::new("cdu.toml")), &text, &Overrides::default())
                .map(|c| c.heartbeat_timeout)
                .map_err(|e| e.to_string())
        };
        for bad in ["inf", "+inf", "nan", "0", "-2"] {
            let e = with(&format!("[loop]\nheartbeat_timeout_s = {bad}\n")).unwrap_err();
            assert!(
                e.contains("heartbeat_timeout_s") && e.contains(&figures.display().to_string()),
                "{bad}: {e}"
            );
        }
        let ok = with("[loop]\nheartbeat_timeout_s = 10\n");
        assert_eq!(ok, Ok(Some(Duration::from_secs(10))));
    }

    #[test]
    fn the_modbus_timeout_leaves_room_for_a_read_and_a_write() {
        // The default: a silent CDU's read and write fit the period with
        // a quarter of it to spare.
        for (period, default) in [(None, 375), (Some(200), 75), (Some(2000), 500)] {
            let extra = period.map_or(String::new(), |p| format!("period_ms = {p}\n"));
            let t = timeout(&extra).expect("valid");
            assert_eq!(t, Duration::from_millis(default), "{extra}");
            let period = Duration::from_millis(period.unwrap_or(1000));
            assert!(2 * t <= period * 3 / 4, "{period:?}: {t:?}");
        }
        // A timeout kept from before the bound: the period it needs is said.
        let e = timeout("period_ms = 1000\nmodbus_timeout_ms = 500\n").unwrap_err();
        assert!(e.contains("500 ms needs period_ms = 1334 or more"), "{e}");
        assert!(timeout("period_ms = 1334\nmodbus_timeout_ms = 500\n").is_ok());
        // One no period fits, up to a number's end: refused, not a panic.
        for huge in ["30000", "3000000000000000000", "9223372036854775807"] {
            let e = timeout(&format!("modbus_timeout_ms = {huge}\n")).unwrap_err();
            assert!(e.contains(&format!("{huge} ms fits no period_ms")), "{e}");
        }
        let most = "period_ms = 1000\nmodbus_timeout_ms = 375\n";
        assert_eq!(timeout(most), Ok(Duration::from_millis(375)));
        for past in [376, 750] {
            let e =
                timeout(&format!("period_ms = 1000\nmodbus_timeout_ms = {past}\n")).unwrap_err();
            assert!(
                e.contains(&format!(
                    "modbus_timeout_ms = {past} is out of range \
                     (10 to 375 ms: at most three eighths of the period of 1000 ms, \
                     as a step waits out a read and a write the CDU does not answer; \
                     {past} ms needs period_ms = {} or more)",
                    least_period_ms(past)
                )),
                "{e}"
            );
        }
    }
}
