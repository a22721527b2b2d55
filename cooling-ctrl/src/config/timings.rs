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
/// hosts take by default), the Modbus timeout at most one period.
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
        500.min(period),
        10,
        period,
        " ms, at most the period",
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
