//! The shell's side towards the building management system: the
//! northbound Modbus server's link (its snapshots out, the BMS's bounded
//! writes in), the settings the BMS made, and the outdoor temperature's
//! sources ([`crate::decide::outdoor`]).
use super::*;

/// The BMS's link and what it set.
pub(super) struct Bms {
    link: Option<NorthboundLink>,
    settings: NorthboundSettings,
    outdoor: OutdoorSources,
    /// The outdoor temperature of the last step, °C, and its source.
    pub(super) outdoor_c: Option<(f32, OutdoorSource)>,
    /// The beacon as the last step left it.
    beacon: bool,
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
            beacon: false,
        }
    }

    /// Takes the bounded writes the BMS made since the last step (at
    /// `now`, shell ms); the holding registers then read the BMS's outdoor
    /// temperature while it is in force. The limits it set, if it set
    /// any.
    pub(super) fn take_writes(&mut self, now: u64) -> Option<BmsLimits> {
        let rx = self.link.as_mut().and_then(|nb| nb.writes.as_mut())?;
        let mut changed = false;
        while let Ok(w) = rx.try_recv() {
            tracing::info!("cooling shell: the BMS wrote {w}");
            match w {
                NorthboundWrite::OutdoorTemp { celsius } => self.outdoor.bms_wrote(celsius, now),
                _ => changed = true,
            }
            self.settings.apply(w);
        }
        self.settings.outdoor_c = self.outdoor.bms_fresh(now);
        let s = &self.settings;
        changed.then_some((s.setpoint_ceiling_c, s.plan_ceiling_offset_k))
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

    /// After a step: a new alarm needs a new acknowledgement, and the
    /// server gets the step's snapshot.
    pub(super) fn publish(
        &mut self,
        core: &Core,
        c: &Commands,
        now: u64,
        readings: Option<&CduMeasurements>,
        hosts: &[Option<cooling_core::HostReport>],
    ) {
        if c.beacon && !self.beacon {
            self.settings.alarm_acknowledged = false;
        }
        self.beacon = c.beacon;
        if let Some(nb) = &self.link {
            nb.snapshots
                .send_replace(snapshot_from(core, c, now, readings, hosts, &self.settings));
        }
    }
}
