//! What the controller tells the bus: its telemetry every period, its
//! retained state when it changes, and the console's snapshot.
//!
//! Glossary:
//! - *state*: the CDU's mode, setpoint and racks' cooling, retained on
//!   the `health` family.
use super::*;

impl<P: CduPort> Shell<P> {
    pub(super) fn snapshot(&self, r: Option<&CduMeasurements>, estimates: Estimates) -> Snapshot {
        let (mode, reason, since) = self.decider.core().mode();
        let sensors = Which::ALL.map(|which| SensorStatus {
            which,
            reading: r.and_then(|r| match which {
                Which::Supply => r.supply_c,
                Which::Return => r.return_c,
                Which::Flow => r.flow_lpm,
                Which::FacilitySupply => r.facility_supply_c,
            }),
            fault: self.decider.core().sensor_fault(which),
        });
        Snapshot {
            at: now_ms(),
            mode,
            reason,
            since: self.unix(since),
            readings: r.copied(),
            last_read: self.devices.last_read,
            sensors,
            leaks_now: self.leak_inputs.wet_now(),
            leaks_latched: self.decider.core().leaks_latched(),
            sensing_lost: self.decider.core().sensing_lost(),
            isolation_failed: self.decider.core().isolation_failed(),
            pumps_failed: self.decider.core().pumps_failed(),
            loops: self.decider.core().loops(),
            estimates: Box::new(estimates),
            outdoor_source: self.bms.outdoor_c.map(|(_, s)| s),
            events_dropped: self.decider.core().events_dropped(),
            bus_connected: self.bus.is_connected(),
            bus: self.bus.metrics(),
            resend: self.resender.counts().snapshot(),
            facility: self
                .facility
                .as_ref()
                .map(|f| f.status(self.now_ms(), self.decider.core().offer())),
        }
    }

    /// Publishes on our own topic (and its JSON mirror); counts.
    pub(super) fn publish(
        &mut self,
        message: Message,
        time: TimestampMs,
        mirror: bool,
        count: impl FnOnce(&mut ShellStats) -> &mut u64,
    ) -> bool {
        let kind = message.kind();
        match self.bus.publish_mirrored(message, time, mirror) {
            Ok(_) => {
                *count(&mut self.stats) += 1;
                true
            }
            Err(PublishError::Offline) => {
                self.stats.publish_errors += 1;
                false
            }
            Err(e) => {
                self.stats.publish_errors += 1;
                tracing::warn!("cooling shell: publishing {}: {e}", kind.name());
                false
            }
        }
    }

    /// Publishes the loop's state, signed with the sign key for this
    /// CDU's `health` topic: hosts take only a state their keyring's key
    /// for this CDU verifies. Without a key it still goes out, unsigned,
    /// for the facility's readers; hosts do not act on it (said at start).
    fn send_state(&mut self, st: CduState) -> bool {
        let (key_id, key) = (self.cfg.key_id, &self.cfg.key);
        let sign = |topic: &Topic, frame: &mut Frame| {
            if let Some(key) = key {
                if let Err(e) = frame.sign(topic, key_id, key) {
                    tracing::error!("cooling shell: signing the CDU state: {e}");
                }
            }
        };
        match self
            .bus
            .publish_signed(Message::CduState(st), now_ms(), true, sign)
        {
            Ok(_) => {
                self.stats.states_published += 1;
                true
            }
            Err(e) => {
                self.stats.publish_errors += 1;
                if !matches!(e, PublishError::Offline) {
                    tracing::warn!("cooling shell: publishing cdu_state: {e}");
                }
                false
            }
        }
    }

    /// A reading for the bus: null when the CDU did not answer, the map
    /// lacks it, or the core holds the sensor lost.
    fn sensor(
        &self,
        r: Option<&CduMeasurements>,
        w: Which,
        v: impl Fn(&CduMeasurements) -> Option<f64>,
    ) -> Option<f64> {
        if self.decider.core().sensor_fault(w)
            == Some(loopwarden_protocol::message::SensorFault::Lost)
        {
            return None;
        }
        r.and_then(v).filter(|x| x.is_finite())
    }

    pub(super) fn publish_telemetry(
        &mut self,
        c: &Commands,
        r: Option<&CduMeasurements>,
        estimates: &Estimates,
    ) {
        let lay = self.cfg.core.layout;
        let celsius = |x: Option<f64>| x.and_then(|v| Celsius::new(v).ok());
        let watts = |x: Option<f64>| {
            x.filter(|v| v.is_finite() && *v >= 0.0)
                .map(|v| Watts(v.round().min(f64::from(u32::MAX)) as u32))
        };
        let meter = |f: fn(&CduMeasurements) -> Option<f64>| r.and_then(f);
        let it = meter(|r| r.it_w);
        let facility = meter(|r| r.facility_w);
        let pue = match (it, facility) {
            (Some(it), Some(f)) if it > 0.0 && f.is_finite() => Pue::new(f / it).ok(),
            _ => None,
        };
        let speed = Percent::new((c.pump_speed * 100.0).round().clamp(0.0, 100.0) as u8)
            .unwrap_or(Percent::FULL);
        let pump = |i: usize| PumpStatus {
            running: r.and_then(|r| r.pumps_running[i]).unwrap_or(false),
            command: if c.pump_on[i] { speed } else { Percent::ZERO },
            feedback: None,
        };
        let mut racks = heapless::Vec::new();
        for i in 0..usize::from(lay.racks).min(16) {
            if let Some(rack) = RackIndex::new(i as u8) {
                let _ = racks.push(RackStatus {
                    rack,
                    valve: if c.valves_open & (1 << i) != 0 {
                        Percent::FULL
                    } else {
                        Percent::ZERO
                    },
                    leak: self.leak_inputs.reads_wet(i),
                });
            }
        }
        let t = CduTelemetry {
            supply: celsius(self.sensor(r, Which::Supply, |r| r.supply_c)),
            return_temp: celsius(self.sensor(r, Which::Return, |r| r.return_c)),
            setpoint: Celsius::new(f64::from(c.setpoint_c)).unwrap_or_default(),
            flow: self
                .sensor(r, Which::Flow, |r| r.flow_lpm)
                .and_then(|v| LitresPerMinute::new(v).ok()),
            diff_pressure: None,
            facility_supply: celsius(
                self.sensor(r, Which::FacilitySupply, |r| r.facility_supply_c),
            ),
            // As measured (the CDU's sensor or the BMS's fresh write),
            // never the configured fallback.
            ambient: self
                .bms
                .outdoor_c
                .and_then(|(a, _)| Celsius::new(f64::from(a)).ok()),
            reservoir: None,
            pump_a: pump(0),
            pump_b: pump(1),
            racks,
            it_power: watts(it),
            cooling_power: watts(meter(|r| r.cooling_w)),
            facility_power: watts(facility),
            pue,
            learned: Some(estimates.summary(&self.cfg.hosts)),
        };
        self.publish(Message::CduTelemetry(t), now_ms(), true, |s| {
            &mut s.telemetry_published
        });
    }

    pub(super) fn publish_state(&mut self, now: u64, c: &Commands, r: Option<&CduMeasurements>) {
        let (facility, facility_moved) = self.facility_state(now);
        let due = facility_moved
            || match &self.state_sent {
                None => true,
                Some((last, at)) => {
                    last.mode != c.mode
                        || last.reason != c.reason
                        || (last.setpoint_c - c.setpoint_c).abs() >= STATE_SETPOINT_K
                        || last.cooling_lost != c.cooling_lost
                        || last.sensing_lost != c.sensing_lost
                        || now.saturating_sub(*at) >= STATE_EVERY.as_millis() as u64
                }
            };
        if !due || !self.bus.is_connected() {
            return;
        }
        let lay = self.cfg.core.layout;
        let (_, _, since) = self.decider.core().mode();
        let open_gpus = c.valves_open.count_ones() as f64
            * f64::from(lay.hosts_per_rack)
            * f64::from(lay.gpus_per_host);
        let flow_per_gpu = self
            .sensor(r, Which::Flow, |r| r.flow_lpm)
            .filter(|_| open_gpus > 0.0)
            .and_then(|f| LitresPerMinute::new(f / open_gpus).ok());
        let mut racks = heapless::Vec::new();
        for i in 0..usize::from(lay.racks).min(16) {
            if let Some(rack) = RackIndex::new(i as u8) {
                let _ = racks.push(RackState {
                    rack,
                    cooling: if c.cooling_lost & (1 << i) != 0 {
                        RackCooling::Lost
                    } else {
                        RackCooling::Normal
                    },
                    sensing: if lay.unprotected & (1 << i) != 0 {
                        LeakSensing::Unprotected
                    } else if c.sensing_lost & (1 << i) != 0 {
                        LeakSensing::Lost
                    } else {
                        LeakSensing::Supervised
                    },
                });
            }
        }
        let st = CduState {
            mode: c.mode,
            reason: c.reason,
            since: self.unix(since),
            setpoint: Celsius::new(f64::from(c.setpoint_c)).unwrap_or_default(),
            supply: self
                .sensor(r, Which::Supply, |r| r.supply_c)
                .and_then(|v| Celsius::new(v).ok()),
            flow_per_gpu,
            racks,
            facility: facility.clone(),
            auth: Default::default(), // signed in `send_state`
        };
        if self.send_state(st) {
            self.state_sent = Some((c.clone(), now));
            self.facility_sent(facility);
        }
    }
}
