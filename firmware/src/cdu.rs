//! What the CDU measures, decoded from its input registers with the map's
//! scale and word order into the decision path's
//! [`CduMeasurements`] (the same fields and meanings as the Linux
//! controller's `cooling_ctrl::modbus`), and what the map says of the
//! settings ([`map_limits`], as `cooling_ctrl::modbus::map_limits` reads
//! it).
//!
//! Glossary:
//! - *span words*: the registers one read request returned, by address
//!   from the span's start.

use cooling_decide::{CduMeasurements, MapLimits, Setting};

use loopwarden_modbus_map::{every_valve, range_holds};

use crate::map::{self, Kind, Register, Span};

/// The holding register of the map named `name`, if it has one.
pub fn holding(name: &str) -> Option<&'static Register> {
    map::REGISTERS
        .iter()
        .find(|r| r.name == name && r.kind == Kind::Holding)
}

/// What the map says of the settings: which it has, the setpoint's and
/// the speed's ranges, and whether it reads the valve positions.
pub fn map_limits() -> MapLimits {
    let range = |s: Setting| holding(s.register()).and_then(|r| r.min.zip(r.max));
    MapLimits {
        mapped: Setting::ORDER.map(|s| holding(s.register()).is_some()),
        setpoint_c: range(Setting::Setpoint),
        speed_pct: range(Setting::PumpSpeed),
        positions: map::REGISTERS.iter().any(|r| r.name == "valves_closed"),
    }
}

/// The map's valve word cannot carry every valve of the hall's racks
/// ([`valves_fit`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValvesUnfit {
    /// The word's range in the map.
    pub min: f64,
    /// The word's range in the map.
    pub max: f64,
    /// The racks of the figures.
    pub racks: u8,
}

impl core::fmt::Display for ValvesUnfit {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let Self { min, max, racks } = self;
        write!(
            f,
            "valves_open: its range {min} to {max} must hold 0 to {} (every valve of {racks} racks, bit n = rack n)",
            every_valve(*racks)
        )
    }
}

/// Whether `valves` (the map's `valves_open`) holds every valve of
/// `racks` racks open to all closed, as the Linux controller asks of a
/// map at start: the build checked the rest of the map, but the racks
/// come with the hall's figures. A narrower word would have the CDU
/// refuse every write that opens a rack past it, a leak's closing
/// included.
pub fn valves_fit(valves: &Register, racks: u8) -> Result<(), ValvesUnfit> {
    let (min, max) = (valves.min.unwrap_or(0.0), valves.max.unwrap_or(0.0));
    if range_holds(min, max, every_valve(racks)) {
        Ok(())
    } else {
        Err(ValvesUnfit { min, max, racks })
    }
}

/// The values of every input register, by index into
/// [`map::REGISTERS`], as the spans were read.
#[derive(Debug, Clone, Copy)]
pub struct InputValues {
    values: [Option<f64>; map::REGISTERS.len()],
}

impl Default for InputValues {
    fn default() -> Self {
        Self {
            values: [None; map::REGISTERS.len()],
        }
    }
}

impl InputValues {
    /// Decodes the words `span` returned.
    pub fn take(&mut self, span: &Span, words: &[u16]) {
        for &i in span.registers {
            let r = &map::REGISTERS[i];
            let at = usize::from(r.address - span.start);
            let end = (at + usize::from(r.ty.words())).min(words.len());
            self.values[i] = words.get(at..end).and_then(|w| map::reading(r, w));
        }
    }

    fn get(&self, r: &Register) -> Option<f64> {
        let i = map::REGISTERS.iter().position(|x| x.name == r.name)?;
        self.values[i]
    }

    fn maybe(&self, r: Option<&Register>) -> Option<f64> {
        r.and_then(|r| self.get(r))
    }

    /// The measurements, as `cooling_ctrl::modbus::ModbusCdu::read` makes
    /// them.
    pub fn measurements(&self) -> CduMeasurements {
        let on = |v: Option<f64>| v.map(|v| v != 0.0);
        // A running flag says running only as 1 and stopped only as 0:
        // any other value (a "not available" 0xFFFF, a status word's 2
        // for a fault) reads no value, which the decision path takes as
        // not running.
        let running = |v: Option<f64>| match v {
            Some(0.0) => Some(false),
            Some(1.0) => Some(true),
            _ => None,
        };
        let bits = |v: Option<f64>| v.map(|v| v as u16);
        CduMeasurements {
            supply_c: self.get(map::SUPPLY_TEMP),
            return_c: self.get(map::RETURN_TEMP),
            flow_lpm: self.get(map::FLOW),
            facility_supply_c: self.get(map::FACILITY_SUPPLY_TEMP),
            pumps_running: [
                running(self.get(map::PUMP_A_RUNNING)),
                running(self.get(map::PUMP_B_RUNNING)),
            ],
            leaks: bits(self.get(map::LEAK_INPUTS)),
            diff_pressure_kpa: self.maybe(map::DIFF_PRESSURE),
            valves_closed: bits(self.get(map::VALVES_CLOSED)),
            pump_faults: [
                on(self.get(map::PUMP_A_FAULT)),
                on(self.get(map::PUMP_B_FAULT)),
            ],
            it_w: self.get(map::IT_POWER),
            cooling_w: self.maybe(map::COOLING_POWER),
            facility_w: self.maybe(map::FACILITY_POWER),
            outdoor_c: self.maybe(map::OUTDOOR_TEMP),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn the_valve_word_must_carry_every_rack_of_the_figures() {
        for racks in 1..=16 {
            assert_eq!(
                valves_fit(map::VALVES_OPEN, racks),
                Ok(()),
                "the shipped map"
            );
        }
        let narrow = Register {
            max: Some(255.0),
            ..*map::VALVES_OPEN
        };
        assert_eq!(valves_fit(&narrow, 8), Ok(()));
        let e = valves_fit(&narrow, 10).unwrap_err();
        assert_eq!(
            e.to_string(),
            "valves_open: its range 0 to 255 must hold 0 to 1023 (every valve of 10 racks, bit n = rack n)"
        );
        let from_one = Register {
            min: Some(1.0),
            ..*map::VALVES_OPEN
        };
        assert!(valves_fit(&from_one, 1).is_err(), "all closed left out");
    }

    #[test]
    fn the_two_reads_decode_into_the_controllers_fields() {
        let mut v = InputValues::default();
        // 0-6: supply 30.12 °C, return 38.5 °C, flow 192.3 L/min, facility
        // 27 °C, pump A on, B off, rack 2 leaking.
        v.take(&map::SPANS[0], &[3012, 3850, 1923, 2700, 1, 0, 0b100]);
        // 10-20: IT 80 kW, cooling 5 kW, facility 86 kW, 100 kPa, rack 2
        // closed, pump A faulted, outdoor -3.5 °C.
        let w = [
            1,
            14_464,
            0,
            5000,
            1,
            20_464,
            1000,
            0b100,
            1,
            0,
            (-350i16) as u16,
        ];
        v.take(&map::SPANS[1], &w);
        let m = v.measurements();
        assert_eq!(m.supply_c, Some(30.12));
        assert_eq!(m.flow_lpm, Some(192.3));
        assert_eq!(m.pumps_running, [Some(true), Some(false)]);
        assert_eq!(m.leaks, Some(0b100));
        assert_eq!(m.it_w, Some(80_000.0));
        assert_eq!(m.facility_w, Some(86_000.0));
        assert_eq!(m.valves_closed, Some(0b100));
        assert_eq!(m.pump_faults, [Some(true), Some(false)]);
        assert_eq!(m.outdoor_c, Some(-3.5));
        assert_eq!(m.diff_pressure_kpa, Some(100.0));
    }

    #[test]
    fn the_maps_limits_are_the_linux_controllers() {
        // As cooling-ctrl reads boards/cdus/sim-cdu.toml (its test
        // `the_simulated_cdus_map_limits_are_those_the_decision_path_is_tested_on`).
        let l = map_limits();
        assert_eq!(l.mapped, [true; 6]);
        assert_eq!(l.setpoint_c, Some((17.0, 45.0)));
        assert_eq!(l.speed_pct, Some((30.0, 100.0)));
        assert!(l.positions);
        assert_eq!(
            holding("heartbeat").map(|r| r.address),
            Some(map::HEARTBEAT.address)
        );
        assert_eq!(
            holding("supply_temp"),
            None,
            "an input register is no setting"
        );
    }

    #[test]
    fn the_cdus_sentinels_read_as_no_reading_and_its_bit_words_as_bits() {
        let mut v = InputValues::default();
        // Supply 0x8000 (i16), flow 0xFFFF (u16), every leak input wet.
        v.take(&map::SPANS[0], &[0x8000, 3850, 0xFFFF, 2700, 1, 0, 0xFFFF]);
        // The IT meter 0xFFFFFFFF (u32), every valve closed.
        let mut w = [0u16; 11];
        w[..2].copy_from_slice(&[0xFFFF, 0xFFFF]);
        w[7] = 0xFFFF;
        v.take(&map::SPANS[1], &w);
        let m = v.measurements();
        assert_eq!((m.supply_c, m.flow_lpm, m.it_w), (None, None, None));
        assert_eq!(m.return_c, Some(38.5));
        assert_eq!((m.leaks, m.valves_closed), (Some(0xFFFF), Some(0xFFFF)));
    }

    #[test]
    fn a_pump_running_flag_other_than_0_or_1_reads_no_value() {
        let mut v = InputValues::default();
        // Pump A's flag 0xFFFF ("not available"), pump B's 2 (a fault).
        v.take(&map::SPANS[0], &[3012, 3850, 1923, 2700, 0xFFFF, 2, 0]);
        assert_eq!(v.measurements().pumps_running, [None, None]);
        v.take(&map::SPANS[0], &[3012, 3850, 1923, 2700, 1, 0, 0]);
        assert_eq!(v.measurements().pumps_running, [Some(true), Some(false)]);
    }

    #[test]
    fn a_span_not_read_leaves_its_registers_unknown() {
        let mut v = InputValues::default();
        v.take(&map::SPANS[0], &[3012, 3850, 1923, 2700, 1, 0, 0]);
        let m = v.measurements();
        assert_eq!(m.supply_c, Some(30.12));
        assert_eq!(
            (m.it_w, m.valves_closed, m.pump_faults[0]),
            (None, None, None)
        );
    }
}
