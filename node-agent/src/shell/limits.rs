//! Power limits as the node asks: set each and read it back, or read
//! every GPU's as it is now, each through its worker within the deadline.
//! What the values mean (what is in force, what to retry, what to say) is
//! the node's.

use loopwarden_protocol::Watts;
use node_core::node::{LimitResult, SetLimit};

use super::Agent;

impl Agent {
    /// Reads every GPU's limit as it is now.
    pub(super) async fn read_limits(&mut self) -> Vec<Result<Watts, String>> {
        let deadline = self.config.deadline;
        let mut read = Vec::with_capacity(self.workers.len());
        for w in &self.workers {
            read.push(w.read_limit(deadline).await.map_err(|e| e.to_string()));
        }
        read
    }

    /// Sets each limit and reads it back.
    pub(super) async fn set_limits(&mut self, sets: &[SetLimit]) -> Vec<LimitResult> {
        let deadline = self.config.deadline;
        let mut results = Vec::with_capacity(sets.len());
        for s in sets {
            let Some(w) = self.workers.get(s.gpu as usize) else {
                continue;
            };
            let set = w.set_limit(s.limit, deadline).await;
            let back = w.read_limit(deadline).await;
            results.push(LimitResult {
                gpu: s.gpu,
                limit: s.limit,
                set: set.map_err(|e| e.to_string()),
                back: back.map_err(|e| e.to_string()),
            });
        }
        results
    }
}
