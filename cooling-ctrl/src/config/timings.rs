//! The timings: the control period, the cap lease, one Modbus request's
//! timeout, and the fallback outdoor temperature the core plans with when
//! no sensor reads.

use std::time::Duration;

use loopwarden_field::common;
use loopwarden_field::config::{range, ConfigError, Sources};
use loopwarden_field::pick;

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
/// hosts take by default), the Modbus timeout at most three quarters of
/// the period (a step whose read the CDU does not answer waits it out,
/// and the rest of the step needs the remainder).
pub(super) fn timings(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<Timings, ConfigError> {
    let period = common::period_ms(src, pick!(flags.period_ms, file.period_ms, "period-ms"))?;
    let lease = range(
        src,
        pick!(flags.lease_ms, file.lease_ms, "lease-ms"),
        "lease_ms",
        30_000.max(3 * period),
        3 * period,
        600_000,
        " ms, at least 3 periods, at most the hosts' 10-minute cap",
    )?;
    let modbus_timeout = range(
        src,
        pick!(
            flags.modbus_timeout_ms,
            file.modbus_timeout_ms,
            "modbus-timeout-ms"
        ),
        "modbus_timeout_ms",
        500.min(most_timeout_ms(period)),
        10,
        most_timeout_ms(period),
        &format!(" ms: at most three quarters of the period of {period} ms"),
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

/// The longest Modbus timeout a period of `period_ms` leaves room for:
/// three quarters of it.
fn most_timeout_ms(period_ms: u64) -> u64 {
    period_ms * 3 / 4
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use crate::config::{resolve, Overrides};

    const MIN: &str =
        "cdu = \"cdu-1\"\ndemo_key = true\ncdu_tcp = \"127.0.0.1:5020\"\nembedded_broker = true\n";

    fn timeout(extra: &str) -> Result<Duration, String> {
        let text = format!("{MIN}{extra}");
        resolve(Some(Path::new("cdu.toml")), &text, &Overrides::default())
            .map(|c| c.modbus_timeout)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_modbus_timeout_leaves_a_quarter_of_the_period() {
        assert_eq!(timeout(""), Ok(Duration::from_millis(500)));
        assert_eq!(timeout("period_ms = 200\n"), Ok(Duration::from_millis(150)));
        let most = "period_ms = 1000\nmodbus_timeout_ms = 750\n";
        assert_eq!(timeout(most), Ok(Duration::from_millis(750)));
        let e = timeout("period_ms = 1000\nmodbus_timeout_ms = 800\n").unwrap_err();
        assert!(
            e.contains(
                "modbus_timeout_ms = 800 is out of range \
                 (10 to 750 ms: at most three quarters of the period of 1000 ms)"
            ),
            "{e}"
        );
    }
}
