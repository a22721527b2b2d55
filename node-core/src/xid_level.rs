//! The health level a driver XID calls for, by its code alone.
//!
//! One rule, shared by the health engine (which raises a GPU to it) and
//! the node agent's XID queue (which keeps, in a storm, the XIDs that
//! change a GPU's state before those that change nothing):
//!
//! - quarantined: an XID the catalog calls fatal hardware
//!   (`xid::XidInfo::is_fatal_hardware`);
//! - degraded: XID 92 (a high rate of corrected ECC errors), or an XID
//!   whose action is drain-and-reset or "follow the recovery action";
//! - none: any other XID, or one the catalog does not know (an
//!   application's fault such as 13, 31 or 43 changes nothing).
//!
//! Glossary:
//! - *level*: the state an XID raises its GPU to at least (`None`: the
//!   XID changes nothing).

use loopwarden_protocol::{xid, HealthState};

/// The state `code` raises its GPU to, or `None` when it changes nothing
/// (the rule above; `docs/health.md` §3, §5).
pub fn xid_level(code: u16) -> Option<HealthState> {
    let info = xid::lookup(code)?;
    if info.is_fatal_hardware() {
        Some(HealthState::Quarantined)
    } else if code == 92
        || matches!(
            info.action,
            xid::XidAction::DrainAndReset | xid::XidAction::FollowRecoveryAction
        )
    {
        Some(HealthState::Degraded)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::{HealthEngine, Limits, Policy};
    use loopwarden_protocol::TimestampMs;

    #[test]
    fn xid_level_ranks_fatal_hardware_then_92_and_reset_actions_then_the_rest() {
        assert_eq!(xid_level(79), Some(HealthState::Quarantined));
        assert_eq!(xid_level(48), Some(HealthState::Quarantined));
        assert_eq!(xid_level(92), Some(HealthState::Degraded));
        assert_eq!(xid_level(13), None);
        assert_eq!(xid_level(31), None);
        assert_eq!(xid_level(43), None);
        assert_eq!(xid_level(u16::MAX), None, "not in the catalog");
    }

    #[test]
    fn xid_level_is_the_state_the_health_engine_raises_a_gpu_to() {
        let limits = Limits {
            max_operating_c: 87.0,
        };
        for info in xid::XID_CATALOG {
            let mut e = HealthEngine::new(1, limits, Policy::default(), TimestampMs(0));
            e.xid(TimestampMs(1_000), 0, info.code);
            let state = e.status(0).expect("GPU 0").state;
            let want = xid_level(info.code).unwrap_or(HealthState::Healthy);
            assert_eq!(state, want, "XID {}", info.code);
        }
    }
}
