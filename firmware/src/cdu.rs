//! What the CDU measures, decoded from its input registers with the map's
//! scale and word order into [`CduMeasurements`], the same fields and
//! meanings as the Linux controller's (`cooling_ctrl::modbus`), and
//! turned into the control core's readings as its decision path does.
//!
//! Glossary:
//! - *span words*: the registers one read request returned, by address
//!   from the span's start.

use cooling_core::CduReadings;

use crate::map::{self, Register, Span};

/// What the CDU measures. `None`: the map of this CDU model has no such
/// register.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CduMeasurements {
    /// Secondary supply temperature, °C (`supply_temp`).
    pub supply_c: Option<f64>,
    /// Secondary return temperature, °C (`return_temp`).
    pub return_c: Option<f64>,
    /// Secondary flow, L/min (`flow`).
    pub flow_lpm: Option<f64>,
    /// Facility water supply temperature, °C (`facility_supply_temp`).
    pub facility_supply_c: Option<f64>,
    /// Pump A and B contactor feedback (`pump_a_running`, `pump_b_running`).
    pub pumps_running: [Option<bool>; 2],
    /// Leak inputs, bit n = rack n (`leak_inputs`).
    pub leaks: Option<u16>,
    /// Loop differential pressure, kPa (`diff_pressure`).
    pub diff_pressure_kpa: Option<f64>,
    /// Rack valves reading closed, bit n = rack n (`valves_closed`).
    pub valves_closed: Option<u16>,
    /// Pump A and B drive or overload fault (`pump_a_fault`, `pump_b_fault`).
    pub pump_faults: [Option<bool>; 2],
    /// IT power meter, W (`it_power`).
    pub it_w: Option<f64>,
    /// Cooling plant power meter, W (`cooling_power`).
    pub cooling_w: Option<f64>,
    /// Facility power meter, W (`facility_power`).
    pub facility_w: Option<f64>,
    /// Outdoor air temperature, °C (`outdoor_temp`).
    pub outdoor_c: Option<f64>,
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
            let end = (at + r.ty.words()).min(words.len());
            self.values[i] = words.get(at..end).map(|w| r.decode(w));
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
        let bits = |v: Option<f64>| v.map(|v| v as u16);
        CduMeasurements {
            supply_c: self.get(map::SUPPLY_TEMP),
            return_c: self.get(map::RETURN_TEMP),
            flow_lpm: self.get(map::FLOW),
            facility_supply_c: self.get(map::FACILITY_SUPPLY_TEMP),
            pumps_running: [
                on(self.get(map::PUMP_A_RUNNING)),
                on(self.get(map::PUMP_B_RUNNING)),
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

/// The core's readings of `r`, as the Linux controller's decision path
/// makes them (`cooling_ctrl::decide::core_readings`).
pub fn core_readings(r: &CduMeasurements) -> CduReadings {
    let f = |x: Option<f64>| x.map(|v| v as f32);
    CduReadings {
        supply_c: f(r.supply_c),
        return_c: f(r.return_c),
        flow_lpm: f(r.flow_lpm),
        facility_supply_c: f(r.facility_supply_c),
        pumps_running: r.pumps_running.map(|p| p.unwrap_or(false)),
        pump_faults: r.pump_faults.map(|p| p.unwrap_or(false)),
        diff_pressure_kpa: f(r.diff_pressure_kpa),
        valves_closed: r.valves_closed,
        it_w: f(r.it_w),
        facility_w: f(r.facility_w),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let c = core_readings(&m);
        assert_eq!(c.pumps_running, [true, false]);
        assert_eq!(c.diff_pressure_kpa, Some(100.0));
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
