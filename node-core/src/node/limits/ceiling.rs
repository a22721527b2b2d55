//! A GPU's ceiling from the limits read from it: the first read after
//! the start (against what the flash kept and what the agent asked since),
//! and a later one the agent did not leave (an administrator's).

use loopwarden_protocol::Watts;

use super::within;
use crate::node::{Effect, GpuCaps, Level};

/// The ceiling of GPU `i` (set up as `g`) from the first limit read from
/// it, `found`; whether it moved from a kept one. A limit the agent
/// asked since the start (read back as asked, or not read back) is its
/// own too; one only read back after a set (an administrator's, found
/// under a set that failed) is not.
pub(super) fn first_ceiling(
    i: usize,
    g: &mut GpuCaps,
    found: Watts,
    out: &mut Vec<Effect>,
) -> bool {
    let was = g.ceiling;
    let own = g.asked_since_start(found);
    match g.kept {
        Some(k) if k.left(found) || own => {
            g.ceiling = within(&g.setup, k.ceiling);
            return g.ceiling != was;
        }
        Some(k) => {
            g.ceiling = within(&g.setup, found);
            out.push(Effect::Say(
                Level::Warn,
                format!(
                    "GPU {i}: found at {} W, not a limit the agent left on it ({} W uncapped, {} W asked): set outside the agent while it was stopped; uncapped limit now {} W",
                    found.0, k.ceiling.0, k.asked.0, g.ceiling.0
                ),
            ));
        }
        None => {
            g.ceiling = within(&g.setup, found);
            let site = g
                .setup
                .site_limit
                .map_or(String::new(), |s| format!("; site limit {} W", s.0));
            let (level, line) = if g.kept_unreadable {
                (Level::Error, unreadable_words(i, g.ceiling, found, &site))
            } else {
                let line = format!(
                    "GPU {i}: uncapped limit {} W (found at {} W{site})",
                    g.ceiling.0, found.0
                );
                (Level::Info, line)
            };
            out.push(Effect::Say(level, line));
            // Nothing was known before: no change to announce.
            return false;
        }
    }
    g.ceiling != was
}

/// What is said of GPU `i` whose kept limits could not be read, its
/// ceiling taken from the limit `found` on it (`site`: the site limit's
/// words, or none).
fn unreadable_words(i: usize, ceiling: Watts, found: Watts, site: &str) -> String {
    format!(
        "GPU {i}: uncapped limit {} W, the limit found on it ({} W{site}), since its kept limits were unreadable: \
         if a cap was in force when the agent stopped, that cap is now taken for the GPU's uncapped limit and stays \
         after the lease lifts; check the GPU's limit against the site's (`ctl caps`) and, if it is lower, \
         set the site's limit on it (`nvidia-smi -i {i} -pl W`: the agent takes it as the new ceiling)",
        ceiling.0, found.0
    )
}

/// GPU `i` (as `g`) found at `found`, which is no limit the agent left
/// on it: an administrator's, the new ceiling; whether the ceiling moved.
pub(super) fn changed_outside(
    i: usize,
    g: &mut GpuCaps,
    found: Watts,
    out: &mut Vec<Effect>,
) -> bool {
    let was = g.ceiling;
    g.ceiling = within(&g.setup, found);
    out.push(Effect::Say(
        Level::Warn,
        format!(
            "GPU {i}: its power limit was changed outside the agent ({} to {} W)",
            g.left_words(),
            found.0
        ),
    ));
    g.ceiling != was
}
