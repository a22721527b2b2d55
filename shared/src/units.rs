//! Units at the boundary: every quantity on the bus is a newtype that says
//! what it measures and in which unit, so a temperature can never be passed
//! where a power was meant.
//!
//! On the wire (postcard) each unit is a fixed-point integer: compact,
//! exact and the same on a microcontroller without an FPU. In the JSON form
//! for facility subscribers the same value is a plain number in the natural
//! unit (°C, W, L/min, %, kPa, ms), so a Grafana panel needs no scaling.
//!
//! Glossary:
//! - *raw*: the integer carried on the wire (for `Celsius`, hundredths of a
//!   degree).
//! - *value*: the quantity in its natural unit as a float (`32.15` °C).
//! - *whole*: units whose wire resolution is already their natural unit
//!   (`Watts`, `Percent`, ...) have no scaling at all.

use core::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value that does not fit its unit's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutOfRange {
    /// The unit that refused the value (`"Celsius"`, `"Percent"`, ...).
    pub unit: &'static str,
}

impl fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "value out of range for {}", self.unit)
    }
}

impl core::error::Error for OutOfRange {}

/// Rounds half away from zero without `std` (core has no `f64::round`).
fn round_to_i64(v: f64) -> Option<i64> {
    if !v.is_finite() {
        return None;
    }
    let r = if v >= 0.0 { v + 0.5 } else { v - 0.5 };
    if r >= i64::MAX as f64 || r <= i64::MIN as f64 {
        return None;
    }
    Some(r as i64)
}

/// A fixed-point unit: the raw integer is `value × SCALE`.
macro_rules! fixed_point_unit {
    (
        $(#[$meta:meta])*
        $name:ident($raw:ty), scale = $scale:expr, symbol = $symbol:literal
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name($raw);

        impl $name {
            /// Raw units per natural unit.
            pub const SCALE: $raw = $scale;
            /// The smallest representable value.
            pub const MIN: Self = Self(<$raw>::MIN);
            /// The largest representable value.
            pub const MAX: Self = Self(<$raw>::MAX);

            /// From the wire integer (`value × SCALE`).
            pub const fn from_raw(raw: $raw) -> Self {
                Self(raw)
            }

            /// The wire integer (`value × SCALE`).
            pub const fn raw(self) -> $raw {
                self.0
            }

            /// From a value in the natural unit, rounded to the wire resolution.
            pub fn new(value: f64) -> Result<Self, OutOfRange> {
                let out = OutOfRange { unit: stringify!($name) };
                let raw = round_to_i64(value * (Self::SCALE as f64)).ok_or(out)?;
                <$raw>::try_from(raw).map(Self).map_err(|_| out)
            }

            /// The value in the natural unit.
            pub fn value(self) -> f64 {
                self.0 as f64 / Self::SCALE as f64
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{} {}", self.value(), $symbol)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                if s.is_human_readable() {
                    s.serialize_f64(self.value())
                } else {
                    self.0.serialize(s)
                }
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                if d.is_human_readable() {
                    let v = f64::deserialize(d)?;
                    Self::new(v).map_err(|_| {
                        serde::de::Error::custom(concat!("value out of range for ", stringify!($name)))
                    })
                } else {
                    <$raw>::deserialize(d).map(Self)
                }
            }
        }

        #[cfg(feature = "std")]
        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": "number",
                    "description": concat!("in ", $symbol, ", resolution 1/", stringify!($scale)),
                    "minimum": <$raw>::MIN as f64 / $scale as f64,
                    "maximum": <$raw>::MAX as f64 / $scale as f64,
                })
            }
        }
    };
}

/// A whole-number unit: the wire integer is the value itself.
macro_rules! whole_unit {
    (
        $(#[$meta:meta])*
        $name:ident($raw:ty), symbol = $symbol:literal
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
        #[serde(transparent)]
        #[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
        #[cfg_attr(feature = "std", schemars(description = concat!("in ", $symbol)))]
        pub struct $name(pub $raw);

        impl $name {
            /// The value in its unit.
            pub const fn get(self) -> $raw {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{} {}", self.0, $symbol)
            }
        }
    };
}

fixed_point_unit! {
    /// A temperature of the coolant, the air or a setpoint, in hundredths of
    /// a degree Celsius (−327.68 to 327.67 °C).
    Celsius(i16), scale = 100, symbol = "°C"
}

fixed_point_unit! {
    /// A coolant flow in hundredths of a litre per minute.
    LitresPerMinute(u32), scale = 100, symbol = "L/min"
}

fixed_point_unit! {
    /// A pressure (loop differential pressure) in tenths of a kilopascal.
    KiloPascals(u16), scale = 10, symbol = "kPa"
}

fixed_point_unit! {
    /// Power usage effectiveness (facility power ÷ IT power) in thousandths.
    Pue(u16), scale = 1000, symbol = "PUE"
}

whole_unit! {
    /// A GPU die or memory (HBM) temperature in whole degrees Celsius, the
    /// resolution at which NVML reports them.
    WholeCelsius(u8), symbol = "°C"
}

whole_unit! {
    /// An electrical power in whole watts (a GPU's draw and limits, a host, a
    /// pump, a hall). NVML's milliwatts are rounded to the nearest watt.
    Watts(u32), symbol = "W"
}

whole_unit! {
    /// A clock frequency in megahertz.
    MegaHertz(u16), symbol = "MHz"
}

whole_unit! {
    /// A span of time in milliseconds (a lease, a period, a timeout).
    DurationMs(u32), symbol = "ms"
}

whole_unit! {
    /// A point in time: milliseconds since the Unix epoch (UTC). A sender
    /// without a real-time clock uses milliseconds since boot and says so in
    /// its `online` message.
    TimestampMs(u64), symbol = "ms"
}

impl WholeCelsius {
    /// The same temperature at the finer resolution of [`Celsius`].
    pub fn to_celsius(self) -> Celsius {
        Celsius::from_raw(self.0 as i16 * 100)
    }
}

impl Watts {
    /// From NVML's milliwatts, rounded to the nearest watt (saturating).
    pub const fn from_milliwatts(mw: u32) -> Self {
        Self(mw / 1000 + if mw % 1000 >= 500 { 1 } else { 0 })
    }

    /// From NVML's milliwatts, rounded down: a power limit read as a
    /// ceiling, never above what was set (450.6 W is 450 W).
    pub const fn from_milliwatts_down(mw: u32) -> Self {
        Self(mw / 1000)
    }

    /// From NVML's milliwatts, rounded up: a lowest settable limit, never
    /// below what the GPU takes.
    pub const fn from_milliwatts_up(mw: u32) -> Self {
        Self(mw.div_ceil(1000))
    }

    /// In milliwatts, as NVML takes a power limit (saturating).
    pub const fn milliwatts(self) -> u32 {
        self.0.saturating_mul(1000)
    }
}

impl TimestampMs {
    /// `later − self`, or zero when `later` is earlier.
    pub const fn until(self, later: TimestampMs) -> u64 {
        later.0.saturating_sub(self.0)
    }

    /// `self + span`, saturating.
    pub const fn after(self, span: DurationMs) -> TimestampMs {
        TimestampMs(self.0.saturating_add(span.0 as u64))
    }

    /// The UTC calendar date and time of day (proleptic Gregorian, no
    /// leap seconds), for the consoles and tools that print times.
    pub const fn utc(self) -> Utc {
        let days = (self.0 / 86_400_000) as i64;
        let rem = self.0 % 86_400_000;
        // Civil date from days since 1970-01-01.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        Utc {
            year: yoe + era * 400 + (month <= 2) as i64,
            month: month as u8,
            day: (doy - (153 * mp + 2) / 5 + 1) as u8,
            hour: (rem / 3_600_000) as u8,
            minute: (rem / 60_000 % 60) as u8,
            second: (rem / 1000 % 60) as u8,
            milli: (rem % 1000) as u16,
        }
    }
}

/// A time as a UTC calendar date and time of day ([`TimestampMs::utc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utc {
    /// The year.
    pub year: i64,
    /// 1 to 12.
    pub month: u8,
    /// 1 to 31.
    pub day: u8,
    /// 0 to 23.
    pub hour: u8,
    /// 0 to 59.
    pub minute: u8,
    /// 0 to 59.
    pub second: u8,
    /// 0 to 999.
    pub milli: u16,
}

/// A share from 0 to 100 % in whole percent (GPU utilisation, pump speed,
/// valve position, reservoir level). Values above 100 are refused, on the
/// wire as in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(transparent)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "std", schemars(description = "in %"))]
pub struct Percent(#[cfg_attr(feature = "std", schemars(range(max = 100)))] u8);

impl Percent {
    /// 0 %.
    pub const ZERO: Self = Self(0);
    /// 100 %.
    pub const FULL: Self = Self(100);

    /// A share in whole percent; more than 100 is refused.
    pub const fn new(pct: u8) -> Result<Self, OutOfRange> {
        if pct <= 100 {
            Ok(Self(pct))
        } else {
            Err(OutOfRange { unit: "Percent" })
        }
    }

    /// The share in whole percent.
    pub const fn get(self) -> u8 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Percent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u8::deserialize(d)?;
        Percent::new(v).map_err(|_| serde::de::Error::custom("percent above 100"))
    }
}

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} %", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timestamp_reads_as_its_utc_date_and_time() {
        let utc = |ms| TimestampMs(ms).utc();
        let at = |year, month, day, hour, minute, second, milli| Utc {
            year,
            month,
            day,
            hour,
            minute,
            second,
            milli,
        };
        assert_eq!(utc(0), at(1970, 1, 1, 0, 0, 0, 0));
        // A leap day of a century divisible by 400, and the day after.
        assert_eq!(utc(951_782_400_000), at(2000, 2, 29, 0, 0, 0, 0));
        assert_eq!(utc(951_868_800_000 - 1), at(2000, 2, 29, 23, 59, 59, 999));
        assert_eq!(utc(951_868_800_000), at(2000, 3, 1, 0, 0, 0, 0));
        // 2100 is not a leap year: 28 February, then 1 March.
        assert_eq!(utc(4_107_456_000_000), at(2100, 2, 28, 0, 0, 0, 0));
        assert_eq!(utc(4_107_542_400_000), at(2100, 3, 1, 0, 0, 0, 0));
        assert_eq!(utc(1_795_953_600_123), at(2026, 11, 29, 12, 0, 0, 123));
    }

    #[test]
    fn fixed_point_rounds_to_resolution() {
        assert_eq!(Celsius::new(32.154).unwrap().raw(), 3215);
        assert_eq!(Celsius::new(32.155).unwrap().raw(), 3216);
        assert_eq!(Celsius::new(-5.0).unwrap().raw(), -500);
        assert_eq!(Celsius::from_raw(3215).value(), 32.15);
        assert_eq!(LitresPerMinute::new(1.4).unwrap().raw(), 140);
    }

    #[test]
    fn fixed_point_refuses_what_does_not_fit() {
        assert!(Celsius::new(400.0).is_err());
        assert!(Celsius::new(f64::NAN).is_err());
        assert!(LitresPerMinute::new(-1.0).is_err());
        assert!(Pue::new(1e12).is_err());
    }

    #[test]
    fn percent_refuses_above_full() {
        assert!(Percent::new(100).is_ok());
        assert_eq!(Percent::new(101), Err(OutOfRange { unit: "Percent" }));
        assert!(postcard::from_bytes::<Percent>(&[101]).is_err());
        assert_eq!(postcard::from_bytes::<Percent>(&[42]).unwrap().get(), 42);
    }

    #[test]
    fn watts_from_nvml_milliwatts_rounds() {
        assert_eq!(Watts::from_milliwatts(655_200), Watts(655));
        assert_eq!(Watts::from_milliwatts(655_500), Watts(656));
        assert_eq!(Watts::from_milliwatts_down(450_600), Watts(450));
        assert_eq!(Watts::from_milliwatts_down(450_000), Watts(450));
        assert_eq!(Watts::from_milliwatts_up(200_001), Watts(201));
        assert_eq!(Watts::from_milliwatts_up(200_000), Watts(200));
        assert_eq!(Watts::from_milliwatts_up(u32::MAX), Watts(4_294_968));
        assert_eq!(Watts(700).milliwatts(), 700_000);
        assert_eq!(WholeCelsius(61).to_celsius(), Celsius::from_raw(6100));
    }

    #[test]
    fn wire_form_is_the_raw_integer() {
        let mut buf = [0u8; 8];
        let used = postcard::to_slice(&Celsius::from_raw(-1), &mut buf).unwrap();
        assert_eq!(used, &[0x01]); // zigzag varint of −1
    }
}
