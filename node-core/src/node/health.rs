//! The health engine's decisions carried out: each change logged,
//! published, kept in flash, and a quarantine's actions started; XIDs from
//! the driver and the XID watch going down or up.
//!
//! Glossary:
//! - *XID watch*: the driver's event stream the XIDs come on; while it is
//!   down the host's health says so, since XIDs go unseen.

use loopwarden_protocol::{Event, HealthState};

use super::{gpu_index, Effect, KeptLimit, Level, Node, Now};
use crate::health::{fmt_time, GpuStatus, Output};

impl Node {
    /// What the health engine decided, as effects: for a change the
    /// retained health first (it is what the hall waits for, and needs no
    /// flash write), then a quarantine's actions, the state in flash and
    /// the event.
    pub(super) fn health_outputs(&mut self, outputs: Vec<Output>, out: &mut Vec<Effect>) {
        for o in outputs {
            match o {
                Output::Change(c) => {
                    // `xid-79`, `dbe-volatile`: the name a site command
                    // gets in `{reason}`.
                    let name = c.reason.to_string();
                    // Warn, as every GPU fault found: the agent did its
                    // job; an error is what it fails to do.
                    out.push(Effect::Say(
                        Level::Warn,
                        if c.to == HealthState::Quarantined {
                            format!("GPU {} quarantined ({name}): {}", c.gpu, c.evidence)
                        } else {
                            format!(
                                "GPU {}: {} → {} ({name}): {}",
                                c.gpu, c.from, c.to, c.evidence
                            )
                        },
                    ));
                    // Kept first: a quarantine is in flash before it is
                    // published or acted on, so a crash right after the
                    // fault (an XID 79 often takes the host down with it)
                    // does not bring the GPU back healthy.
                    out.push(Effect::KeepHealth(c.gpu));
                    out.push(Effect::PublishHealth);
                    if c.to == HealthState::Quarantined {
                        out.push(Effect::Quarantine {
                            gpu: c.gpu,
                            reason: format!("{name}: {}", c.evidence),
                        });
                    }
                    out.push(Effect::Emit(Event::HealthChanged {
                        gpu: gpu_index(c.gpu),
                        from: c.from,
                        to: c.to,
                        reason: c.reason,
                    }));
                }
                Output::CoolingAttributed { gpus, reason, .. } => {
                    out.push(Effect::Say(
                        Level::Warn,
                        format!(
                            "the cooling explains the heat of GPUs {gpus:#06x}; no GPU is marked for it"
                        ),
                    ));
                    out.push(Effect::Emit(Event::CoolingAttributed { gpus, reason }));
                }
                Output::HostStall { since, gpus, .. } => {
                    out.push(Effect::Say(
                        Level::Warn,
                        format!(
                            "every GPU (mask {gpus:#06x}) stopped answering together since {}: \
                             a driver or host stall, no GPU is blamed",
                            fmt_time(since)
                        ),
                    ));
                    out.push(Effect::PublishHealth);
                    out.push(Effect::Emit(Event::HostStalled { gpus, since }));
                }
                Output::HostStallEnded { since, .. } => {
                    out.push(Effect::Say(
                        Level::Warn,
                        format!(
                            "the GPUs answer again after a stall since {}",
                            fmt_time(since)
                        ),
                    ));
                    out.push(Effect::PublishHealth);
                    out.push(Effect::Emit(Event::HostResumed {
                        stalled_since: since,
                    }));
                    out.push(Effect::Reprobe);
                }
            }
        }
    }

    /// A GPU told its UUID late ([`Input::Identified`](super::Input)): a
    /// state `kept` for it above its state now is put back (a GPU
    /// quarantined before the restart is quarantined again, its site
    /// actions run again), its kept ceiling where the limit found on it
    /// was the agent's (`limit`, [`Node::identified_limit`]), and its
    /// health and every GPU's limits are kept in flash, since nothing was
    /// kept for it while its UUID was unknown.
    pub(super) fn identified(
        &mut self,
        now: Now,
        gpu: u8,
        (kept, limit): (Option<&GpuStatus>, Option<KeptLimit>),
        out: &mut Vec<Effect>,
    ) {
        if gpu as usize >= self.gpus.len() {
            return;
        }
        let from = out.len();
        if let Some(k) = kept {
            let outputs = self.health.identified(now.steady, gpu, k);
            self.health_outputs(outputs, out);
        }
        let moved = limit.is_some_and(|l| self.identified_limit(gpu, l, out));
        if !out[from..].contains(&Effect::KeepHealth(gpu)) {
            out.push(Effect::KeepHealth(gpu));
        }
        // Kept before any set the new ceiling brings: each set keeps its
        // own record first, and this one must not come after it.
        out.push(Effect::KeepLimits(self.kept_limits()));
        if moved {
            self.reconcile(now, false, out);
        }
    }

    /// An XID: the decision first (a quarantine is what the hall waits
    /// for), then the event.
    pub(super) fn xid(&mut self, now: Now, gpu: u8, xid: u16, out: &mut Vec<Effect>) {
        if gpu as usize >= self.gpus.len() {
            out.push(Effect::Say(
                Level::Warn,
                format!("XID {xid} for unknown GPU {gpu}"),
            ));
            return;
        }
        if let Some(unsaid) = self.xid_log.allow(now.steady.0) {
            if unsaid > 0 {
                out.push(Effect::Say(
                    Level::Warn,
                    format!("{unsaid} more XIDs in the last second, not logged one by one"),
                ));
            }
            out.push(Effect::Say(Level::Warn, format!("GPU {gpu}: XID {xid}")));
        }
        let outputs = self.health.xid(now.steady, gpu, xid);
        self.health_outputs(outputs, out);
        out.push(Effect::Emit(Event::Xid {
            gpu: gpu_index(gpu),
            xid,
        }));
    }

    /// The XID watch stopped or runs again: the host's health says so;
    /// once it runs again the GPUs are asked again what was not supported
    /// (the driver may have been reloaded).
    pub(super) fn xid_watch(&mut self, now: Now, down: Option<&str>, out: &mut Vec<Effect>) {
        let running = down.is_none();
        if let Some(why) = down {
            out.push(Effect::Say(
                Level::Error,
                format!("the XID watch is down ({why}); XIDs are not seen until it restarts"),
            ));
            self.xid_watch_down.get_or_insert(now.wall());
        } else {
            out.push(Effect::Say(Level::Warn, "the XID watch runs again".into()));
            self.xid_watch_down = None;
            out.push(Effect::Reprobe);
        }
        out.push(Effect::PublishHealth);
        out.push(Effect::Emit(Event::XidWatch { running }));
    }
}
