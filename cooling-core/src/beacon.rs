//! The alarm beacon: what calls a person to the CDU. It lights for a
//! latched leak, lost leak sensing, a valve position input not believed,
//! a failed isolation (failsafe), a pump out of service, a required
//! sensor under a fault (stood in for or not), failsafe, the CDU
//! refusing writes, or a GPU above its maximum operating temperature.
//!
//! Glossary:
//! - *required sensor*: supply, return and flow ([`crate::sensors::Which`]).

use loopwarden_protocol::message::CduMode;
use loopwarden_protocol::ReasonCode;

use crate::view::Tick;
use crate::Core;

impl Core {
    /// The beacon in step `t`, settled in `mode`, with the `hottest` GPU
    /// reported (see the module's note). The CDU refusing writes lights
    /// it whatever reason the mode settled on (a capacity cap standing
    /// comes first in the mode's reason, and would hide it).
    pub(crate) fn beacon(&self, t: &Tick<'_>, mode: CduMode, hottest: Option<f32>) -> bool {
        let (_, reason, _) = self.modes.get();
        let writes_refused = t.inp.cdu.is_some() && !t.inp.cdu_taken.all;
        self.safety.leaks_latched() != 0
            || self.safety.sensing_lost() != 0
            || self.safety.feedback_faults() != 0
            || self.pumps.faults().iter().any(|f| f.is_some())
            || !self.sensors.required_ok()
            || mode == CduMode::Failsafe
            || reason == ReasonCode::CDU_WRITES_REFUSED
            || writes_refused
            || hottest.is_some_and(|h| h > t.cfg.gpu.max_operating_c)
    }
}
