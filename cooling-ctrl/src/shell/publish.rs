//! What the controller tells the bus: its telemetry every period, its
//! retained state when it changes, and the console's snapshot.
//!
//! The messages are built by plain functions from a step's [`StepFacts`]
//! ([`cdu_telemetry`], [`cdu_state`]), sent by one ([`send_state`]), and
//! timed by one rule ([`StateSent::due`]): the shell gives them what its
//! core decided, and the gateway (`crate::gateway`) what a
//! microcontroller's status says, so both publish alike.
//!
//! Glossary:
//! - *state*: the CDU's mode, setpoint and racks' cooling, retained on
//!   the `health` family.
//! - *step facts*: what one control step leaves for the bus, whoever ran
//!   it.
use super::*;
use cooling_core::config::Layout;
use cooling_core::LeakInputs;
use loopwarden_protocol::message::{FacilityState, HallEstimates};

/// What one control step leaves for the bus, whoever ran it: the shell's
/// core, or a microcontroller's status heard by the gateway.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepFacts<'a> {
    /// The mode.
    pub mode: CduMode,
    /// Why.
    pub reason: ReasonCode,
    /// Since when (Unix ms).
    pub since: TimestampMs,
    /// Supply setpoint in force, °C: the shell's, the last the CDU took,
    /// as written (one it refused or did not answer is not in force), and
    /// before one of its run went in, the one its core takes the CDU to
    /// run at (the boot setpoint); the gateway's, as the microcontroller's
    /// status gives it.
    pub setpoint_c: f32,
    /// Pump speed commanded, a share of full speed from 0 to 1 (the
    /// pumps' `command`).
    pub pump_speed: f32,
    /// Pumps A and B commanded on.
    pub pump_on: [bool; 2],
    /// Valves open as last written, bit n = rack n: what the CDU last
    /// took, else every valve open (the shell before a valve write of its
    /// run went in; the gateway when the MCU's step did not write every
    /// setting), so a close that failed is not shown as done.
    pub valves_open: u16,
    /// Racks whose cooling is lost, bit n = rack n.
    pub cooling_lost: u16,
    /// Racks whose leak sensing is lost, bit n = rack n.
    pub sensing_lost: u16,
    /// Racks a leak input reads wet now, or read wet when it last
    /// answered and has not answered since, bit n = rack n: an input gone
    /// silent does not make a wet rack dry.
    pub leaks_wet: u16,
    /// What the CDU answered this step (`None`: it did not).
    pub readings: Option<&'a CduMeasurements>,
    /// The fault each supervised sensor stands under, in
    /// [`Which::ALL`]'s order (supply, return, flow, facility supply).
    pub sensor_faults: [Option<SensorFault>; 4],
    /// The outdoor temperature as measured (the CDU's sensor or the BMS's
    /// fresh write), °C; never the configured fallback.
    pub outdoor_c: Option<f32>,
}

impl StepFacts<'_> {
    /// The valves open (bit n = rack n, of `racks`) as the CDU reports
    /// their positions where it reads them (a valve held shut by a
    /// pending relatch or a latched record the flash did not keep shows
    /// shut, not as commanded), else as last written
    /// ([`StepFacts::valves_open`]: one whose close the CDU did not take
    /// shows open).
    pub fn valves_open_now(&self, racks: u8) -> u16 {
        use crate::northbound::{valves_held, valves_shown};
        let held = valves_held(self.readings, Some(self.valves_open), racks);
        valves_shown(held, racks)
    }

    /// A reading for the bus: null when the CDU did not answer, the map
    /// lacks it, the sensor is held lost, or the value is outside any
    /// plausible reading (a sentinel, before its fault is confirmed).
    pub fn reading(&self, w: Which) -> Option<f64> {
        let r = self.readings?;
        let reading = match w {
            Which::Supply => r.supply_c,
            Which::Return => r.return_c,
            Which::Flow => r.flow_lpm,
            Which::FacilitySupply => r.facility_supply_c,
        };
        super::stats::shown(w, reading, self.sensor_faults[w as usize])
    }

    /// What decides whether the state is published again.
    pub fn state_key(&self) -> StateKey {
        StateKey {
            mode: self.mode,
            reason: self.reason,
            setpoint_c: self.setpoint_c,
            cooling_lost: self.cooling_lost,
            sensing_lost: self.sensing_lost,
        }
    }
}

/// The parts of a state whose change publishes it again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StateKey {
    /// The mode.
    pub mode: CduMode,
    /// Why.
    pub reason: ReasonCode,
    /// The setpoint, °C.
    pub setpoint_c: f32,
    /// Racks whose cooling is lost.
    pub cooling_lost: u16,
    /// Racks whose leak sensing is lost.
    pub sensing_lost: u16,
}

/// The state last published, and when (ms of the publisher's clock).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StateSent {
    /// What it said.
    pub key: StateKey,
    /// When, ms.
    pub at_ms: u64,
}

impl StateSent {
    /// Whether a state saying `key` at `now_ms` is due after `last`: the
    /// first, a change of mode, reason, rack cooling or leak sensing, a
    /// setpoint moved by [`STATE_SETPOINT_K`] or more, or [`STATE_EVERY`]
    /// since the last.
    pub fn due(last: Option<&StateSent>, key: &StateKey, now_ms: u64) -> bool {
        let Some(last) = last else {
            return true;
        };
        let was = &last.key;
        was.mode != key.mode
            || was.reason != key.reason
            || (was.setpoint_c - key.setpoint_c).abs() >= STATE_SETPOINT_K
            || was.cooling_lost != key.cooling_lost
            || was.sensing_lost != key.sensing_lost
            || now_ms.saturating_sub(last.at_ms) >= STATE_EVERY.as_millis() as u64
    }
}

/// The racks of `lay`, at most 16, with `f(rack index)` for each.
fn racks_of<T, const N: usize>(
    lay: &Layout,
    f: impl Fn(usize, RackIndex) -> T,
) -> heapless::Vec<T, N> {
    let mut racks = heapless::Vec::new();
    for i in 0..usize::from(lay.racks).min(16) {
        if let Some(rack) = RackIndex::new(i as u8) {
            let _ = racks.push(f(i, rack));
        }
    }
    racks
}

/// The CDU's telemetry after a step of `f`, on a loop laid out as `lay`,
/// with what the controller has `learned` of its hall, if it says.
pub fn cdu_telemetry(
    f: &StepFacts<'_>,
    lay: &Layout,
    learned: Option<HallEstimates>,
) -> CduTelemetry {
    let celsius = |x: Option<f64>| x.and_then(|v| Celsius::new(v).ok());
    let watts = |x: Option<f64>| {
        x.filter(|v| v.is_finite() && *v >= 0.0)
            .map(|v| Watts(v.round().min(f64::from(u32::MAX)) as u32))
    };
    let r = f.readings;
    let meter = |m: fn(&CduMeasurements) -> Option<f64>| r.and_then(m);
    let it = meter(|r| r.it_w);
    let facility = meter(|r| r.facility_w);
    let pue = match (it, facility) {
        (Some(it), Some(fw)) if it > 0.0 && fw.is_finite() => Pue::new(fw / it).ok(),
        _ => None,
    };
    let speed = Percent::new((f.pump_speed * 100.0).round().clamp(0.0, 100.0) as u8)
        .unwrap_or(Percent::FULL);
    let pump = |i: usize| PumpStatus {
        running: r.and_then(|r| r.pumps_running[i]).unwrap_or(false),
        command: if f.pump_on[i] { speed } else { Percent::ZERO },
        feedback: None,
    };
    let open = f.valves_open_now(lay.racks);
    let racks = racks_of(lay, |i, rack| RackStatus {
        rack,
        valve: if open & (1 << i) != 0 {
            Percent::FULL
        } else {
            Percent::ZERO
        },
        leak: f.leaks_wet & (1 << i) != 0,
    });
    CduTelemetry {
        supply: celsius(f.reading(Which::Supply)),
        return_temp: celsius(f.reading(Which::Return)),
        setpoint: Celsius::new(f64::from(f.setpoint_c)).unwrap_or_default(),
        flow: f
            .reading(Which::Flow)
            .and_then(|v| LitresPerMinute::new(v).ok()),
        diff_pressure: None,
        facility_supply: celsius(f.reading(Which::FacilitySupply)),
        ambient: f.outdoor_c.and_then(|a| Celsius::new(f64::from(a)).ok()),
        reservoir: None,
        pump_a: pump(0),
        pump_b: pump(1),
        racks,
        it_power: watts(it),
        cooling_power: watts(meter(|r| r.cooling_w)),
        facility_power: watts(facility),
        pue,
        learned,
    }
}

/// The CDU's state after a step of `f`, on a loop laid out as `lay`, with
/// its part in a hall of several CDUs (`facility`), unsigned.
pub fn cdu_state(f: &StepFacts<'_>, lay: &Layout, facility: Option<FacilityState>) -> CduState {
    let open_gpus = f.valves_open_now(lay.racks).count_ones() as f64
        * f64::from(lay.hosts_per_rack)
        * f64::from(lay.gpus_per_host);
    let flow_per_gpu = f
        .reading(Which::Flow)
        .filter(|_| open_gpus > 0.0)
        .and_then(|v| LitresPerMinute::new(v / open_gpus).ok());
    let racks = racks_of(lay, |i, rack| RackState {
        rack,
        cooling: if f.cooling_lost & (1 << i) != 0 {
            RackCooling::Lost
        } else {
            RackCooling::Normal
        },
        sensing: if lay.unprotected & (1 << i) != 0 {
            LeakSensing::Unprotected
        } else if f.sensing_lost & (1 << i) != 0 {
            LeakSensing::Lost
        } else {
            LeakSensing::Supervised
        },
    });
    CduState {
        mode: f.mode,
        reason: f.reason,
        since: f.since,
        setpoint: Celsius::new(f64::from(f.setpoint_c)).unwrap_or_default(),
        supply: f.reading(Which::Supply).and_then(|v| Celsius::new(v).ok()),
        flow_per_gpu,
        racks,
        facility,
        auth: Default::default(), // signed in `send_state`
    }
}

/// Publishes the loop's state `st` (retained, with its JSON mirror),
/// signed with `key` for this CDU's `health` topic: hosts take only a
/// state their keyring's key for this CDU verifies. Without a key it
/// still goes out, unsigned, for the facility's readers; hosts do not act
/// on it (said at start). `who` names the publisher in the log.
pub fn send_state(
    bus: &Bus,
    st: CduState,
    key: Option<(u8, &SigningKey)>,
    who: &str,
) -> Result<Frame, PublishError> {
    let sign = |topic: &Topic, frame: &mut Frame| {
        if let Some((key_id, key)) = key {
            if let Err(e) = frame.sign(topic, key_id, key) {
                tracing::error!("{who}: signing the CDU state: {e}");
            }
        }
    };
    bus.publish_signed(Message::CduState(st), now_ms(), true, sign)
}

/// The leak inputs as this step read them, and what each last said when
/// it answered: a rack whose input read it wet and has not answered since
/// is not shown as dry (the core's safety reads an unread input as not
/// wet; its latch is its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HeardLeaks {
    now: LeakInputs,
    /// The ropes as last read, bit n = rack n wet.
    board_wet: u16,
    /// The CDU's leak register as last read.
    cdu_wet: u16,
}

impl Default for HeardLeaks {
    /// Before the first step: every rope dry, nothing heard wet (the core
    /// holds what it restored from flash apart).
    fn default() -> Self {
        Self {
            now: LeakInputs::DRY,
            board_wet: 0,
            cdu_wet: 0,
        }
    }
}

impl HeardLeaks {
    /// Takes this step's reads: the board's `board`, the CDU's `cdu`.
    pub(super) fn hear(&mut self, board: BoardRead, cdu: Option<&CduMeasurements>) {
        self.take(decide::leak_inputs(board, cdu.and_then(|r| r.leaks)));
    }

    /// Takes this step's leak inputs.
    fn take(&mut self, now: LeakInputs) {
        if now.read_ok {
            self.board_wet = now.wet;
        }
        if let Some(w) = now.cdu {
            self.cdu_wet = w;
        }
        self.now = now;
    }

    /// The leak inputs as this step read them.
    pub(super) fn now(&self) -> &LeakInputs {
        &self.now
    }

    /// The racks an input that answered reads wet now, bit n = rack n.
    pub(super) fn wet_now(&self) -> u16 {
        self.now.wet_now()
    }

    /// The racks no input reads wet now but one that has not answered this
    /// step read wet when it last did: neither wet nor dry is known.
    pub(super) fn unheard_wet(&self) -> u16 {
        let board = if self.now.read_ok { 0 } else { self.board_wet };
        let cdu = if self.now.cdu.is_some() {
            0
        } else {
            self.cdu_wet
        };
        (board | cdu) & !self.wet_now()
    }

    /// The racks whose leak inputs answered this step, bit n = rack n,
    /// of `racks`: every rack when the CDU's leak register was read; else
    /// the racks with a rope on the board (`roped`; `None`: no board
    /// pins) when its lines were read, less those whose rope is faulted
    /// (cut or shorted: its line says nothing of the rack); else none. A
    /// rack without a rope (`unprotected_racks`) is heard only through the
    /// CDU's register.
    pub(super) fn heard(&self, racks: u8, roped: Option<u16>) -> u16 {
        let all = cooling_core::safety::all_racks(usize::from(racks));
        match roped {
            _ if self.now.cdu.is_some() => all,
            Some(roped) if self.now.read_ok => roped & !self.now.rope_faults & all,
            _ => 0,
        }
    }

    /// The racks wet as last heard: read wet now, or read wet by an input
    /// that has not answered since (what the bus's `leak` flag says).
    pub(super) fn wet_as_heard(&self) -> u16 {
        self.wet_now() | self.unheard_wet()
    }
}

/// The valves open as last written to the CDU (bit n = rack n, of
/// `racks`): what it last took, else, before a valve write of this run
/// went in, every valve open ([`crate::northbound::valves_shown`], as the
/// BMS's register): a close the CDU has not taken is never shown done.
fn valves_written(d: &Decider, racks: u8) -> u16 {
    crate::northbound::valves_shown(d.valves_taken(), racks)
}

/// The valves open as the CDU has them (bit n = rack n, of `racks`):
/// [`crate::northbound::valves_held`] on what the decision path last saw
/// the CDU take.
fn valves_held(d: &Decider, r: Option<&CduMeasurements>, racks: u8) -> Option<u16> {
    crate::northbound::valves_held(r, d.valves_taken(), racks)
}

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
            leaks_unheard: self.leak_inputs.unheard_wet(),
            leaks_heard: self
                .leak_inputs
                .heard(self.cfg.core.layout.racks, self.devices.roped()),
            leaks_latched: self.decider.core().leaks_latched(),
            sensing_lost: self.decider.core().sensing_lost(),
            unprotected: self.cfg.core.layout.unprotected,
            ropes: self.devices.has_board(),
            isolation_failed: self.decider.core().isolation_failed(),
            valves_open: valves_held(&self.decider, r, self.cfg.core.layout.racks),
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

    /// What the step of commands `c` on readings `r` leaves for the bus.
    fn facts<'a>(&self, c: &Commands, r: Option<&'a CduMeasurements>) -> StepFacts<'a> {
        let core = self.decider.core();
        let (_, _, since) = core.mode();
        StepFacts {
            mode: c.mode,
            reason: c.reason,
            since: self.unix(since),
            setpoint_c: self.setpoint_in_force(),
            pump_speed: c.pump_speed,
            pump_on: c.pump_on,
            valves_open: valves_written(&self.decider, self.cfg.core.layout.racks),
            cooling_lost: c.cooling_lost,
            sensing_lost: c.sensing_lost,
            leaks_wet: self.leak_inputs.wet_as_heard(),
            readings: r,
            sensor_faults: Which::ALL.map(|w| core.sensor_fault(w)),
            outdoor_c: self.bms.outdoor_c.map(|(a, _)| a),
        }
    }

    /// The supply setpoint in force, °C: the last the CDU took this run,
    /// as written (held to its map's range); before one went in, the one
    /// the core takes it to run at (its boot setpoint).
    pub(super) fn setpoint_in_force(&self) -> f32 {
        let assumed = self.decider.core().applied().0;
        self.stats.setpoint_written_c.map_or(assumed, |v| v as f32)
    }

    pub(super) fn publish_telemetry(
        &mut self,
        c: &Commands,
        r: Option<&CduMeasurements>,
        estimates: &Estimates,
    ) {
        let learned = Some(estimates.summary(&self.cfg.hosts));
        let t = cdu_telemetry(&self.facts(c, r), &self.cfg.core.layout, learned);
        self.publish(Message::CduTelemetry(t), now_ms(), true, |s| {
            &mut s.telemetry_published
        });
    }

    pub(super) fn publish_state(&mut self, now: u64, c: &Commands, r: Option<&CduMeasurements>) {
        let (facility, facility_moved) = self.facility_state(now);
        let facts = self.facts(c, r);
        let key = facts.state_key();
        let due = facility_moved || StateSent::due(self.state_sent.as_ref(), &key, now);
        if !due || !self.bus.is_connected() {
            return;
        }
        let st = cdu_state(&facts, &self.cfg.core.layout, facility.clone());
        let signing = self.cfg.key.as_ref().map(|k| (self.cfg.key_id, k));
        match send_state(&self.bus, st, signing, "cooling shell") {
            Ok(_) => {
                self.stats.states_published += 1;
                self.state_sent = Some(StateSent { key, at_ms: now });
                self.facility_sent(facility);
            }
            Err(e) => {
                self.stats.publish_errors += 1;
                if !matches!(e, PublishError::Offline) {
                    tracing::warn!("cooling shell: publishing cdu_state: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(readings: Option<&CduMeasurements>) -> StepFacts<'_> {
        StepFacts {
            mode: CduMode::Normal,
            reason: ReasonCode::BOOTING,
            since: TimestampMs(0),
            setpoint_c: 32.0,
            pump_speed: 0.6,
            pump_on: [true, false],
            valves_open: 0b1111,
            cooling_lost: 0,
            sensing_lost: 0,
            leaks_wet: 0,
            readings,
            sensor_faults: [None; 4],
            outdoor_c: None,
        }
    }

    #[test]
    fn a_rack_valve_shows_the_position_the_cdu_reads_else_what_it_last_took() {
        let lay = CoreConfig::default().layout;
        let read = CduMeasurements {
            valves_closed: Some(0b0100),
            ..CduMeasurements::default()
        };
        let shown = |f: &StepFacts<'_>| -> Vec<u8> {
            let t = cdu_telemetry(f, &lay, None);
            t.racks.iter().map(|r| r.valve.get()).collect()
        };
        // Commanded open, held shut (or stuck): it shows shut.
        assert_eq!(shown(&facts(Some(&read))), [100, 100, 0, 100]);
        // No position read: as commanded.
        let unread = CduMeasurements::default();
        assert_eq!(shown(&facts(Some(&unread))), [100; 4]);
        assert_eq!(shown(&facts(None)), [100; 4]);
        // A leak on rack 2 on a map without positions, and the valve
        // write fails: as the CDU last took it, still open.
        let (c, d) = a_close_not_taken(&lay);
        assert_eq!(c.valves_open, 0b1011, "rack 2 commanded closed");
        let mut f = facts(Some(&unread));
        f.valves_open = valves_written(&d, lay.racks);
        assert_eq!(shown(&f), [100; 4]);
    }

    #[test]
    fn a_close_before_any_valve_write_was_taken_shows_open_not_the_command() {
        let lay = CoreConfig::default().layout;
        let (c, d) = a_close_not_taken_first(&lay);
        assert_eq!(c.valves_open, 0b1011, "rack 2 commanded closed");
        assert_eq!(d.valves_taken(), None, "no valve write went in");
        let unread = CduMeasurements::default();
        for r in [Some(&unread), None] {
            let mut f = facts(r);
            f.valves_open = valves_written(&d, lay.racks);
            let t = cdu_telemetry(&f, &lay, None);
            let valves: Vec<u8> = t.racks.iter().map(|r| r.valve.get()).collect();
            assert_eq!(valves, [100; 4], "rack 2 shows open");
        }
        // The flow per GPU shares the flow among the four racks open.
        let flow = CduMeasurements {
            flow_lpm: Some(640.0),
            ..CduMeasurements::default()
        };
        let mut f = facts(Some(&flow));
        f.valves_open = valves_written(&d, lay.racks);
        let gpus =
            f64::from(lay.racks) * f64::from(lay.hosts_per_rack) * f64::from(lay.gpus_per_host);
        let per_gpu = cdu_state(&f, &lay, None).flow_per_gpu;
        assert_eq!(per_gpu, LitresPerMinute::new(640.0 / gpus).ok());
    }

    #[test]
    fn the_snapshot_holds_the_valves_as_the_cdu_has_them_not_as_commanded() {
        let lay = CoreConfig::default().layout;
        let all = cooling_core::safety::all_racks(usize::from(lay.racks));
        let (c, d) = a_close_not_taken(&lay);
        assert_eq!(c.valves_open, 0b1011, "rack 2 commanded closed");
        // No position read: as last taken, rack 2 still open.
        let unread = CduMeasurements::default();
        assert_eq!(valves_held(&d, Some(&unread), lay.racks), Some(all));
        assert_eq!(valves_held(&d, None, lay.racks), Some(all));
        // Positions read: as read.
        let read = CduMeasurements {
            valves_closed: Some(0b0100),
            ..CduMeasurements::default()
        };
        assert_eq!(valves_held(&d, Some(&read), lay.racks), Some(0b1011));
        // Nothing written yet and no position read: unknown, not the
        // command.
        let fresh: Result<Option<crate::journal::LatchRecord>, &str> = Ok(None);
        let limits = MapLimits {
            mapped: [true; 6],
            setpoint_c: None,
            speed_pct: None,
            positions: false,
        };
        let d = Decider::new(CoreConfig::default(), limits, &fresh).unwrap();
        assert_eq!(valves_held(&d, Some(&unread), lay.racks), None);
    }

    #[test]
    fn a_wet_rack_whose_input_went_silent_stays_wet_as_last_heard() {
        let mut h = HeardLeaks::default();
        let cdu = |leaks: Option<u16>| CduMeasurements {
            leaks,
            ..CduMeasurements::default()
        };
        let dry_board = BoardRead::Read { wet: 0, faults: 0 };
        // The CDU's register reads rack 2 wet.
        h.hear(dry_board, Some(&cdu(Some(0b0100))));
        assert_eq!((h.wet_now(), h.unheard_wet()), (0b0100, 0));
        // The CDU goes silent: rack 2 is not known dry, and the bus says
        // it as last heard.
        h.hear(dry_board, None);
        assert_eq!(h.wet_now(), 0, "the core's reading of the step");
        assert_eq!(h.unheard_wet(), 0b0100);
        assert_eq!(h.wet_as_heard(), 0b0100);
        let mut f = facts(None);
        f.leaks_wet = h.wet_as_heard();
        let t = cdu_telemetry(&f, &CoreConfig::default().layout, None);
        let leaks: Vec<bool> = t.racks.iter().map(|r| r.leak).collect();
        assert_eq!(leaks, [false, false, true, false]);
        // Its map without the register answers the same way.
        h.hear(dry_board, Some(&cdu(None)));
        assert_eq!(h.unheard_wet(), 0b0100);
        // It answers dry: dry.
        h.hear(dry_board, Some(&cdu(Some(0))));
        assert_eq!((h.wet_now(), h.unheard_wet(), h.wet_as_heard()), (0, 0, 0));
        // A rope read wet, then the board's read fails.
        h.hear(
            BoardRead::Read {
                wet: 0b0001,
                faults: 0,
            },
            Some(&cdu(Some(0))),
        );
        h.hear(BoardRead::Failed, Some(&cdu(Some(0))));
        assert_eq!((h.wet_now(), h.unheard_wet()), (0, 0b0001));
        // Another input reading it wet now: wet, known.
        h.hear(BoardRead::Failed, Some(&cdu(Some(0b0001))));
        assert_eq!((h.wet_now(), h.unheard_wet()), (0b0001, 0));
    }

    #[test]
    fn the_racks_heard_are_those_an_input_that_answered_covers() {
        let mut h = HeardLeaks::default();
        let cdu = |leaks: Option<u16>| CduMeasurements {
            leaks,
            ..CduMeasurements::default()
        };
        let dry_board = BoardRead::Read { wet: 0, faults: 0 };
        // The CDU's register read: every rack.
        h.hear(BoardRead::Absent, Some(&cdu(Some(0))));
        assert_eq!(h.heard(4, None), 0b1111);
        // No pins and the CDU silent, or its map without the register:
        // none.
        h.hear(BoardRead::Absent, None);
        assert_eq!(h.heard(4, None), 0);
        h.hear(BoardRead::Absent, Some(&cdu(None)));
        assert_eq!(h.heard(4, None), 0);
        // Ropes on racks 0, 1 and 3 (rack 2 unprotected), read: those.
        h.hear(dry_board, None);
        assert_eq!(h.heard(4, Some(0b1011)), 0b1011);
        // Rack 0's rope cut: its line says nothing of it.
        h.hear(
            BoardRead::Read {
                wet: 0,
                faults: 0b0001,
            },
            None,
        );
        assert_eq!(h.heard(4, Some(0b1011)), 0b1010);
        // The board's read fails too: none.
        h.hear(BoardRead::Failed, None);
        assert_eq!(h.heard(4, Some(0b1011)), 0);
    }

    /// A decider on a map without valve positions whose CDU took every
    /// valve open, then did not take the close of rack 2, leaking: the
    /// leaking step's commands.
    fn a_close_not_taken(lay: &Layout) -> (Commands, Decider) {
        steps_taking(lay, [true, false])
    }

    /// As [`a_close_not_taken`], but the CDU took no valve write at all.
    fn a_close_not_taken_first(lay: &Layout) -> (Commands, Decider) {
        steps_taking(lay, [false, false])
    }

    /// A decider on a map without valve positions stepped twice, rack 2
    /// leaking at the second step, the CDU taking the writes of each step
    /// as `taken` says: the last step's commands.
    fn steps_taking(lay: &Layout, taken: [bool; 2]) -> (Commands, Decider) {
        let limits = MapLimits {
            mapped: [true; 6],
            setpoint_c: None,
            speed_pct: None,
            positions: false,
        };
        let fresh: Result<Option<crate::journal::LatchRecord>, &str> = Ok(None);
        let mut d = Decider::new(CoreConfig::default(), limits, &fresh).unwrap();
        let all = cooling_core::safety::all_racks(usize::from(lay.racks));
        let mut c = Commands::UNSET;
        for (s, leaks, taken) in [(0, 0, taken[0]), (1, 0b0100, taken[1])] {
            let read = CduMeasurements {
                leaks: Some(leaks),
                ..CduMeasurements::default()
            };
            let input = StepIn {
                now_ms: s * 1000,
                board: BoardRead::Absent,
                ambient_c: Some(20.0),
            };
            c = d.step(Some(&read), &input);
            if d.to_keep().is_some() {
                d.kept(true);
            }
            let p = d.plan(&c, None);
            d.written(&Outcome::whole(&p, taken));
            if taken {
                assert_eq!(d.valves_taken(), Some(all));
            }
        }
        (c, d)
    }
}
