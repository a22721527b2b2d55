//! Carrying out the node's effects: the one place the shell turns a
//! decision into an act (a limit set, a publish, a line in the log, a
//! record in flash, an action started), in the order decided. An effect
//! with a result is answered to the node at once, and what that answer
//! leads to is carried out before the rest.

use std::collections::VecDeque;

use loopwarden_protocol::{Frame, Message, MAX_FRAME_LEN};
use node_core::node::{push_front, Effect, Input, Level, Now};

use super::Agent;

impl Agent {
    /// Gives the node `input` now and carries out what it decides.
    pub(super) async fn step(&mut self, input: Input<'_>) {
        let now = self.now();
        let effects = self.node.step(now, input);
        self.carry_out(now, effects, None).await;
    }

    /// Carries out `effects`, in order; `frame` is the command being
    /// handled, for [`Effect::LogCommand`].
    pub(super) async fn carry_out(
        &mut self,
        now: Now,
        effects: Vec<Effect>,
        frame: Option<&Frame>,
    ) {
        // Stamps are those of the step; answers are given at their own
        // time (a limit set may take a deadline).
        let wall = now.wall();
        let mut queue = VecDeque::from(effects);
        while let Some(effect) = queue.pop_front() {
            let answer = match effect {
                Effect::Say(level, text) => {
                    say(level, &text);
                    continue;
                }
                Effect::PublishHealth => {
                    let health = self.node.host_health();
                    self.publish(Message::HostHealth(health), wall, true);
                    continue;
                }
                Effect::KeepHealth(gpu) => {
                    self.keep_health(gpu).await;
                    continue;
                }
                Effect::Emit(event) => {
                    self.emit(event, wall).await;
                    continue;
                }
                Effect::Quarantine { gpu, reason } => {
                    self.start_actions(gpu, &reason);
                    continue;
                }
                Effect::Reprobe => {
                    self.reprobe_gpus().await;
                    continue;
                }
                Effect::KeepCooling(phase) => {
                    // With the steps decided with it: one record.
                    let mut steps = Vec::new();
                    while let Some(Effect::RunCooling { .. }) = queue.front() {
                        if let Some(Effect::RunCooling { step, reason }) = queue.pop_front() {
                            steps.push((step, reason));
                        }
                    }
                    self.keep_and_run_cooling(Some(phase), steps);
                    continue;
                }
                Effect::KeepReplayFloor { sender, floor } => {
                    super::replay_floor::keep(&self.recorder, sender, floor);
                    continue;
                }
                Effect::KeepStateFloor { cdu, floor, last } => {
                    super::replay_floor::keep_state(&self.recorder, cdu, floor, last);
                    continue;
                }
                Effect::DropCooling(step) => {
                    self.drop_cooling(step);
                    continue;
                }
                Effect::RunCooling { step, reason } => {
                    self.keep_and_run_cooling(None, vec![(step, reason)]);
                    continue;
                }
                Effect::Ack(ack) => {
                    self.publish(Message::Ack(ack), wall, true);
                    continue;
                }
                Effect::KeepLimits(limits) => {
                    self.keep_limits(limits).await;
                    continue;
                }
                Effect::SetLimits(sets) => {
                    let results = self.set_limits(&sets).await;
                    self.node.step(self.now(), Input::LimitsSet(&results))
                }
                Effect::ReadLimits => {
                    let read = self.read_limits().await;
                    self.node.step(self.now(), Input::LimitsRead(&read))
                }
                Effect::LogCommand => {
                    let logged = match frame {
                        Some(f) => self.log_command(f).await,
                        None => Err("no command is being handled".to_string()),
                    };
                    self.node.step(
                        self.now(),
                        Input::Logged(logged.as_ref().map_err(|e| e.as_str()).copied()),
                    )
                }
                Effect::Acknowledge => self.node.step(self.now(), Input::Acknowledge),
            };
            push_front(&mut queue, answer);
        }
    }

    /// Writes a command to the event log and waits until it is in flash.
    async fn log_command(&mut self, frame: &Frame) -> Result<(), String> {
        let mut buf = [0u8; MAX_FRAME_LEN];
        let kind = frame.message.kind();
        // As its sender wrote it: its signature is checked again at a
        // restart, over the sender's minor. The record's time is when this
        // host took it, from which a lease runs again after a restart.
        let taken = self.clock.wall();
        match frame.encode_as_received(&mut buf) {
            Ok(n) => self
                .recorder
                .append_sync(taken, kind as u8, buf[..n].to_vec())
                .await
                .map(|_| ()),
            Err(e) => Err(format!("{e}")),
        }
    }
}

/// A line of the node's in the log, at its level.
fn say(level: Level, text: &str) {
    match level {
        Level::Info => tracing::info!("{text}"),
        Level::Warn => tracing::warn!("{text}"),
        Level::Error => tracing::error!("{text}"),
    }
}
