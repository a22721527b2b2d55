//! How a core starts: new for a configuration ([`Core::new`]), from what
//! an earlier core latched ([`Core::restore`]), or again in place
//! ([`Core::reset`]); and the reference hall's core made at compile time
//! ([`Core::reference`]), which a microcontroller's static starts from.
//! A core is some 7.5 KB and its commands 3.9 KB, more than half a
//! microcontroller's stack budget together: there, nothing here builds a
//! second one on the stack.
//!
//! Glossary:
//! - *in place*: written field by field over a core that exists, each
//!   field's value the largest temporary (the coordinator's, about 3 KB).

use loopwarden_protocol::message::{CduMode, Pump};
use loopwarden_protocol::ReasonCode;

use crate::coordinate::Coordinator;
use crate::estimate::Estimator;
use crate::mode::ModeMachine;
use crate::optimise::{Optimiser, RejectionWatch};
use crate::pumps::Pumps;
use crate::regulate::Regulator;
use crate::safety::Safety;
use crate::sensors::Supervisor;
use crate::view::HallView;
use crate::{Commands, ConfigError, Core, CoreConfig, Latched, MAX_HOSTS};

impl Commands {
    /// No step's commands yet (every figure 0, nothing on, open, lost or
    /// capped; booting): a value for [`Core::step_into`] to write over.
    pub const UNSET: Commands = Commands {
        setpoint_c: 0.0,
        pump_speed: 0.0,
        pump_on: [false; 2],
        lead: Pump::A,
        valves_open: 0,
        cooling_lost: 0,
        sensing_lost: 0,
        isolation_failed: 0,
        valve_feedback_faults: 0,
        caps: [None; MAX_HOSTS],
        beacon: false,
        mode: CduMode::Boot,
        reason: ReasonCode::BOOTING,
        events: heapless::Vec::new(),
    };
}

impl Core {
    /// A core for `cfg`, booting.
    pub fn new(cfg: CoreConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self::booting(cfg))
    }

    /// The core [`Core::new`] gives for the reference hall
    /// ([`CoreConfig::reference`]), made at compile time: what a
    /// microcontroller's static starts from before [`Core::reset`] sets it
    /// up in place (a core is too large to build on its stack).
    pub const fn reference() -> Self {
        Self::booting(CoreConfig::reference())
    }

    /// A core for `cfg` (validated), booting.
    const fn booting(cfg: CoreConfig) -> Self {
        Self {
            cfg,
            last_ms: None,
            modes: ModeMachine::new(),
            sensors: Supervisor::new(),
            safety: Safety::new(),
            pumps: Pumps::new(),
            restored: None,
            applied: (cfg.margins.boot_setpoint_c, 1.0),
            hall: HallView::new(),
            regulator: Regulator::new(cfg.margins.boot_setpoint_c),
            optimiser: Optimiser::new(&cfg),
            rejection: RejectionWatch::new(),
            coordinator: Coordinator::new(),
            estimator: Estimator::new(&cfg),
            setpoint_ceiling_c: cfg.cdu.max_setpoint_c,
            plan_offset_k: 0.0,
            events_dropped: 0,
            facility_target: None,
            valves_commanded: None,
            heard: 0,
        }
    }

    /// Starts again in place for `cfg`: booting (`latched` `None`), or
    /// from what an earlier core latched. What [`Core::new`] or
    /// [`Core::restore`] gives, made field by field so that no second
    /// core is on the stack (a microcontroller's). On an error the core
    /// is as it was.
    pub fn reset(&mut self, cfg: CoreConfig, latched: Option<&Latched>) -> Result<(), ConfigError> {
        cfg.validate()?;
        // Every field named: one added to the core and not here fails to
        // build. Each as `booting` makes it (a test compares the two).
        let Self {
            cfg: c,
            last_ms,
            modes,
            sensors,
            safety,
            pumps,
            restored,
            applied,
            hall,
            regulator,
            optimiser,
            rejection,
            coordinator,
            estimator,
            setpoint_ceiling_c,
            plan_offset_k,
            events_dropped,
            facility_target,
            valves_commanded,
            heard,
        } = self;
        *c = cfg;
        *last_ms = None;
        *modes = ModeMachine::new();
        *sensors = Supervisor::new();
        *safety = Safety::new();
        *pumps = Pumps::new();
        *restored = None;
        *applied = (cfg.margins.boot_setpoint_c, 1.0);
        *hall = HallView::new();
        *regulator = Regulator::new(cfg.margins.boot_setpoint_c);
        *optimiser = Optimiser::new(&cfg);
        *rejection = RejectionWatch::new();
        // Copied from the image, not built on the stack first (3 KB).
        *coordinator = const { Coordinator::new() };
        *estimator = Estimator::new(&cfg);
        *setpoint_ceiling_c = cfg.cdu.max_setpoint_c;
        *plan_offset_k = 0.0;
        *events_dropped = 0;
        *facility_target = None;
        *valves_commanded = None;
        *heard = 0;
        if let Some(l) = latched {
            self.take_latched(l);
        }
        Ok(())
    }

    /// A core for `cfg` that starts from what an earlier one latched
    /// (read back from flash): leaks stay latched and their valves shut,
    /// failed pumps stay out of service and never lead, a valve position
    /// input found lying stays unbelieved, a failsafe and the sensor
    /// faults stand until judged again. Its first step reports
    /// [`Event::ControllerRestored`](loopwarden_protocol::message::Event::ControllerRestored).
    pub fn restore(cfg: CoreConfig, l: &Latched) -> Result<Self, ConfigError> {
        let mut core = Self::new(cfg)?;
        core.take_latched(l);
        Ok(core)
    }

    /// What an earlier core latched, taken over by a booting one.
    fn take_latched(&mut self, l: &Latched) {
        self.safety.restore(l, self.cfg.layout.racks as usize);
        self.pumps.restore(l);
        self.sensors.restore(&l.sensors);
        self.modes.restore(l.failsafe);
        self.restored = Some(*l);
    }
}
