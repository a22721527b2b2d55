//! Frames from the bus: the CDU's state and commands to this host go to
//! the node, which checks and decides; what it decides (a lease logged
//! before its ack, limits set, the ack) is carried out here. Readers'
//! requests to resend go to the resender.

use loopwarden_bus::Inbound;
use loopwarden_protocol::Family;
use node_core::node::{Effect, Input};

use super::Agent;

impl Agent {
    /// A frame from the bus: a command, or the cooling context. Returns
    /// whether it may have changed what the console shows: a command or
    /// a state refused changes nothing (it is answered or said, no more),
    /// and a flood of forged ones must not cost a console snapshot each.
    pub(super) async fn on_inbound(&mut self, msg: Inbound) -> bool {
        if msg.topic.family == Family::Resend {
            self.resender.offer(msg);
            return false;
        }
        let now = self.now();
        let effects = self.node.step(now, Input::Frame(&msg.topic, &msg.frame));
        let refused = effects.iter().all(|e| {
            matches!(
                e,
                Effect::Acknowledge | Effect::KeepReplayFloor { .. } | Effect::Say(..)
            )
        });
        self.carry_out(now, effects, Some(&msg.frame)).await;
        !refused
    }
}
