//! The shell's side towards the building management system: the
//! northbound Modbus server's link (its snapshots out, the BMS's bounded
//! writes in), the settings the BMS made, its acknowledgement of the
//! alarms (as [`AlarmAck`] keeps it, the gateway's too), and the outdoor
//! temperature's sources ([`crate::decide::outdoor`]). The writes are taken as they
//! come, between steps, and shown at once: the northbound server answers
//! a write once its snapshot shows it. At the stop the writes channel is
//! closed and what it holds applied before the limits are kept
//! ([`Shell::last_bms_writes`]; the gateway's stop too,
//! [`last_bms_writes`]).
use super::*;
use crate::northbound::AlarmAck;

/// The BMS's link and what it set.
pub(super) struct Bms {
    link: Option<NorthboundLink>,
    settings: NorthboundSettings,
    outdoor: OutdoorSources,
    /// The outdoor temperature of the last step, °C, and its source.
    pub(super) outdoor_c: Option<(f32, OutdoorSource)>,
    /// The BMS's acknowledgement of the alarms the snapshots showed.
    ack: AlarmAck,
}

/// The limits the BMS set: the setpoint ceiling, °C, and the plan's
/// ceiling offset, K.
pub(super) type BmsLimits = (f32, f32);

impl Bms {
    pub(super) fn new(link: Option<NorthboundLink>, core: &CoreConfig) -> Self {
        Self {
            link,
            settings: NorthboundSettings::new(core),
            outdoor: OutdoorSources::new(),
            outdoor_c: None,
            ack: AlarmAck::default(),
        }
    }

    /// The BMS's writes, each request's together, for the shell's loop to
    /// take as they come ([`Bms::wrote`]); `None`: writes are disabled, or
    /// already taken.
    pub(super) fn writes(&mut self) -> Option<mpsc::Receiver<Vec<NorthboundWrite>>> {
        self.link.as_mut().and_then(|nb| nb.writes.take())
    }

    /// The BMS wrote `ws` in one request, taken at `now` (shell ms)
    /// between two steps: the settings hold them at once and the server's
    /// snapshot shows them together (the last step's, with the new
    /// settings), so the BMS reads back what it wrote and no reader sees
    /// half of it. The limits it set, when it set one.
    pub(super) fn wrote(&mut self, ws: &[NorthboundWrite], now: u64) -> Option<BmsLimits> {
        let mut limits = false;
        for w in ws {
            limits |= self.take(*w, now);
        }
        self.refresh(now);
        self.show_settings();
        let s = &self.settings;
        limits.then_some((s.setpoint_ceiling_c, s.plan_ceiling_offset_k))
    }

    /// Takes the BMS's write `w` at `now` into the settings; whether it
    /// set a limit. An `alarm_ack` acknowledges what the BMS had read
    /// ([`AlarmAck::acknowledge`]): one taken after more became alarming
    /// reads 0, and is said.
    fn take(&mut self, w: NorthboundWrite, now: u64) -> bool {
        let before = self.settings;
        self.settings.apply(w);
        let limits = match w {
            NorthboundWrite::OutdoorTemp { celsius } => {
                self.outdoor.bms_wrote(celsius, now);
                false
            }
            NorthboundWrite::AlarmAck { seen } => {
                let acked = self.ack.acknowledge(seen);
                self.settings.alarm_acknowledged = acked;
                if !acked {
                    tracing::warn!(
                        "cooling shell: the BMS acknowledged the alarms it had read, but more is alarming now: not acknowledged (alarm_ack reads 0 until written again)"
                    );
                }
                false
            }
            NorthboundWrite::SetpointCeiling { .. } | NorthboundWrite::PlanCeilingOffset { .. } => {
                true
            }
        };
        // A value written again as it was (a BMS that writes its block
        // on a cycle) is no news.
        if self.settings != before {
            tracing::info!("cooling shell: the BMS wrote {w}");
        } else {
            tracing::debug!("cooling shell: the BMS wrote {w} again");
        }
        limits
    }

    /// The limits the core holds after the BMS's write: where they differ
    /// from what it wrote (outside the site's setpoints), said, and the
    /// holding registers read them, not what was written.
    pub(super) fn in_force(&mut self, (ceiling_c, offset_k): BmsLimits) {
        let s = &mut self.settings;
        if (s.setpoint_ceiling_c, s.plan_ceiling_offset_k) == (ceiling_c, offset_k) {
            return;
        }
        tracing::warn!(
            "cooling shell: the BMS wrote a setpoint ceiling of {:.2} °C and a plan offset of {:.2} K; in force: {ceiling_c:.2} °C and {offset_k:.2} K (the site's setpoint range holds them)",
            s.setpoint_ceiling_c,
            s.plan_ceiling_offset_k
        );
        (s.setpoint_ceiling_c, s.plan_ceiling_offset_k) = (ceiling_c, offset_k);
        self.show_settings();
    }

    /// The limits the BMS set before this start, restored from flash and
    /// in force: the holding registers read them.
    pub(super) fn restored(&mut self, (ceiling_c, offset_k): BmsLimits) {
        let s = &mut self.settings;
        (s.setpoint_ceiling_c, s.plan_ceiling_offset_k) = (ceiling_c, offset_k);
        self.show_settings();
    }

    /// The server's snapshot takes the settings as they are now: the
    /// holding registers read them.
    fn show_settings(&self) {
        if let Some(nb) = &self.link {
            let settings = self.settings;
            nb.snapshots.send_modify(|s| s.settings = settings);
        }
    }

    /// At a step at `now` (shell ms): the holding registers read the
    /// BMS's outdoor temperature while it is in force.
    pub(super) fn refresh(&mut self, now: u64) {
        self.settings.outdoor_c = self.outdoor.bms_fresh(now);
    }

    /// This step's outdoor temperature from the CDU's reading `r` and the
    /// BMS's writes; a change of source (and the first step's) is logged,
    /// with the `fallback_c` planned with when there is none.
    pub(super) fn pick_outdoor(
        &mut self,
        now: u64,
        r: Option<&CduMeasurements>,
        first: bool,
        fallback_c: f32,
    ) {
        let picked = self.outdoor.pick(r.and_then(|r| r.outdoor_c), now);
        let (was, is) = (self.outdoor_c.map(|(_, s)| s), picked.map(|(_, s)| s));
        if was != is || first {
            match picked {
                Some((c, OutdoorSource::Cdu)) => {
                    tracing::info!("cooling shell: outdoor temperature from the CDU's sensor ({c:.1} °C)")
                }
                Some((c, OutdoorSource::Bms)) => tracing::warn!(
                    "cooling shell: outdoor temperature from the BMS's writes ({c:.1} °C): the CDU's sensor does not read"
                ),
                None => tracing::warn!(
                    "cooling shell: no outdoor temperature (the CDU's sensor does not read, no BMS value of the last {} s): planning with the fallback {fallback_c:.1} °C",
                    outdoor::BMS_FRESH.as_secs(),
                ),
            }
        }
        self.outdoor_c = picked;
    }

    /// After a step: the server gets the step's snapshot, and anything
    /// alarming in it that the BMS's acknowledgement did not cover clears
    /// it ([`AlarmAck`]).
    pub(super) fn publish(
        &mut self,
        core: &Core,
        c: &Commands,
        now: u64,
        readings: Option<&CduMeasurements>,
        took: CduTook,
        hosts: &[Option<cooling_core::HostReport>],
    ) {
        if let Some(nb) = &self.link {
            let mut snap = snapshot_from(core, c, now, readings, took, hosts, &self.settings);
            let gpu_max_c = core.config().gpu.max_operating_c;
            self.settings.alarm_acknowledged = self.ack.shown(&mut snap, gpu_max_c);
            nb.snapshots.send_replace(snap);
        }
    }
}

impl<P: CduPort> Shell<P> {
    /// At the stop, before the BMS's limits are kept: the writes channel
    /// `rx` is closed, so the server refuses a later write with
    /// exception 4 (server device failure) rather than answer it and
    /// lose it, and the writes it already handed on are applied (and so
    /// kept in flash): the BMS writes a limit once, when it changes.
    pub(super) fn last_bms_writes(&mut self, rx: Option<mpsc::Receiver<Vec<NorthboundWrite>>>) {
        last_bms_writes(rx, |ws| self.on_bms(ws));
    }
}

/// At the stop of `run` or the gateway, before the BMS's limits are
/// kept: the writes channel `rx` is closed (the server refuses a later
/// write with exception 4), and each request it already took goes to
/// `take`, in order, as the loop would have taken it.
pub(crate) fn last_bms_writes(
    rx: Option<mpsc::Receiver<Vec<NorthboundWrite>>>,
    mut take: impl FnMut(Vec<NorthboundWrite>),
) {
    let Some(mut rx) = rx else {
        return;
    };
    rx.close();
    while let Ok(ws) = rx.try_recv() {
        take(ws);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::northbound::snapshot_channel;

    #[test]
    fn a_write_between_steps_is_in_the_servers_snapshot_at_once() {
        let (snapshots, rx) = snapshot_channel();
        let (wtx, wrx) = mpsc::channel(4);
        let link = NorthboundLink {
            snapshots,
            writes: Some(wrx),
        };
        let mut bms = Bms::new(Some(link), &CoreConfig::default());
        assert!(bms.writes().is_some(), "the loop takes the writes");
        assert!(bms.writes().is_none(), "once");
        drop(wtx);
        let outdoor = NorthboundWrite::OutdoorTemp { celsius: -4.5 };
        assert_eq!(bms.wrote(&[outdoor], 1_000), None, "no limits set");
        assert_eq!(rx.borrow().settings.outdoor_c, Some(-4.5));
        let ceiling = NorthboundWrite::SetpointCeiling { celsius: 35.5 };
        let offset = NorthboundWrite::PlanCeilingOffset { kelvin: -2.0 };
        assert_eq!(bms.wrote(&[ceiling], 1_100), Some((35.5, 0.0)));
        assert_eq!(bms.wrote(&[offset], 1_200), Some((35.5, -2.0)));
        let shown = rx.borrow().settings;
        assert!(shown.shows(ceiling) && shown.shows(offset) && shown.shows(outdoor));
        // A block written in one request is shown whole, once.
        let mut seen = rx.clone();
        seen.mark_unchanged();
        let block = [
            NorthboundWrite::SetpointCeiling { celsius: 40.0 },
            NorthboundWrite::PlanCeilingOffset { kelvin: -5.0 },
        ];
        assert_eq!(bms.wrote(&block, 1_300), Some((40.0, -5.0)));
        assert!(seen.has_changed().unwrap());
        let shown = seen.borrow_and_update().settings;
        assert!(shown.shows(block[0]) && shown.shows(block[1]));
        // The BMS's outdoor temperature is in force 300 s from when it was
        // taken.
        bms.refresh(1_000 + 299_999);
        assert_eq!(bms.settings.outdoor_c, Some(-4.5));
        bms.refresh(1_000 + 300_000);
        assert_eq!(bms.settings.outdoor_c, None);
    }

    #[test]
    fn a_new_alarm_under_the_lit_beacon_clears_the_acknowledgement() {
        let (snapshots, rx) = snapshot_channel();
        let link = NorthboundLink {
            snapshots,
            writes: None,
        };
        let cfg = CoreConfig::default();
        let mut core = cooling_core::Core::new(cfg).unwrap();
        let mut bms = Bms::new(Some(link), &cfg);
        let hosts = [None; cooling_core::MAX_HOSTS];
        let mut cut = core.step(&cooling_core::Inputs {
            now_ms: 0,
            cdu: None,
            ambient_c: None,
            leaks: cooling_core::LeakInputs::DRY,
            cdu_taken: cooling_core::Taken::ALL,
            valves_held: 0,
            hosts: &hosts,
        });
        // Rack 1's rope is cut: the beacon lights; the BMS acknowledges.
        (cut.beacon, cut.sensing_lost) = (true, 1 << 1);
        bms.publish(&core, &cut, 1_000, None, CduTook::ALL, &hosts);
        let seen = rx.borrow().alarms;
        bms.wrote(&[NorthboundWrite::AlarmAck { seen }], 1_100);
        bms.publish(&core, &cut, 2_000, None, CduTook::ALL, &hosts);
        assert!(rx.borrow().settings.alarm_acknowledged);
        // Rack 4's sensing is lost too, the beacon still lit: new.
        let mut more = cut.clone();
        more.sensing_lost |= 1 << 4;
        bms.publish(&core, &more, 3_000, None, CduTook::ALL, &hosts);
        assert!(!rx.borrow().settings.alarm_acknowledged);
        assert!(!bms.settings.alarm_acknowledged);
    }

    #[test]
    fn a_ceiling_the_core_holds_higher_reads_back_as_held() {
        let (snapshots, rx) = snapshot_channel();
        let link = NorthboundLink {
            snapshots,
            writes: None,
        };
        let mut cfg = CoreConfig::default();
        cfg.cdu.min_setpoint_c = 24.0;
        let mut core = cooling_core::Core::new(cfg).unwrap();
        let mut bms = Bms::new(Some(link), &cfg);
        let ceiling = NorthboundWrite::SetpointCeiling { celsius: 20.0 };
        let (c, o) = bms.wrote(&[ceiling], 0).expect("a limit");
        core.set_limits(c, o);
        bms.in_force(core.limits());
        assert_eq!(rx.borrow().settings.setpoint_ceiling_c, 24.0, "in force");
        assert!(!rx.borrow().settings.shows(ceiling));
    }

    /// The BMS writes `alarm_ack` during a step, against what the
    /// registers showed then; the step shows a new alarm before the loop
    /// takes the write: the write does not cover it.
    #[test]
    fn an_acknowledgement_taken_after_a_new_alarm_does_not_cover_it() {
        let (snapshots, rx) = snapshot_channel();
        let link = NorthboundLink {
            snapshots,
            writes: None,
        };
        let cfg = CoreConfig::default();
        let mut core = cooling_core::Core::new(cfg).unwrap();
        let mut bms = Bms::new(Some(link), &cfg);
        let hosts = [None; cooling_core::MAX_HOSTS];
        let mut cut = core.step(&cooling_core::Inputs {
            now_ms: 0,
            cdu: None,
            ambient_c: None,
            leaks: cooling_core::LeakInputs::DRY,
            cdu_taken: cooling_core::Taken::ALL,
            valves_held: 0,
            hosts: &hosts,
        });
        (cut.beacon, cut.sensing_lost) = (true, 1 << 1);
        bms.publish(&core, &cut, 1_000, None, CduTook::ALL, &hosts);
        let read = rx.borrow().alarms;
        // Rack 4's sensing is lost in the step the write waited for.
        let mut more = cut.clone();
        more.sensing_lost |= 1 << 4;
        bms.publish(&core, &more, 2_000, None, CduTook::ALL, &hosts);
        let ack = NorthboundWrite::AlarmAck { seen: read };
        bms.wrote(&[ack], 2_100);
        assert!(!rx.borrow().settings.alarm_acknowledged, "at once");
        bms.publish(&core, &more, 3_000, None, CduTook::ALL, &hosts);
        assert!(!rx.borrow().settings.alarm_acknowledged, "rack 4 unread");
        // Written again against what the registers show: acknowledged.
        let seen = rx.borrow().alarms;
        assert_ne!(seen, read);
        bms.wrote(&[NorthboundWrite::AlarmAck { seen }], 3_100);
        assert!(rx.borrow().settings.alarm_acknowledged);
        bms.publish(&core, &more, 4_000, None, CduTook::ALL, &hosts);
        assert!(rx.borrow().settings.alarm_acknowledged);
    }
}
