//! Frames from the bus: the CDU's state (the cooling context of the
//! health engine) and commands to this host (cap leases, quarantine
//! releases), each logged to flash before it is acknowledged.

use loopwarden_bus::Inbound;
use loopwarden_protocol::{
    Ack, AckCode, CduMode, Correlation, Event, Family, Frame, GpuCap, GpuSelector, Message,
    MessageKind, QuarantineRelease, RackCooling, Text, TimestampMs, MAX_FRAME_LEN,
};

use super::Agent;
use crate::health::{Coolant, LoopState};

impl Agent {
    /// A frame from the bus: a command, or the cooling context.
    pub(super) async fn on_inbound(&mut self, msg: Inbound) {
        if self.coolant_topic.as_ref() == Some(&msg.topic) {
            if let Message::CduState(st) = &msg.frame.message {
                let now = self.clock.wall();
                let cdu = self.config.cdu.as_ref().expect("a coolant topic has a CDU");
                if let Err(why) = crate::commands::check_cdu_state(cdu, &msg.frame, now) {
                    tracing::warn!("cooling context not taken: {why}");
                    return;
                }
                let rack_lost = self.config.rack.is_some_and(|r| {
                    st.racks
                        .iter()
                        .any(|x| x.rack.get() == r && x.cooling == RackCooling::Lost)
                });
                self.on_rack_cooling(rack_lost);
                let state = match st.mode {
                    _ if rack_lost => LoopState::Failsafe,
                    CduMode::Normal => LoopState::Normal,
                    CduMode::Degraded | CduMode::Boot => LoopState::Degraded,
                    CduMode::Failsafe => LoopState::Failsafe,
                };
                let c = Coolant {
                    supply_c: st.supply.map(|c| c.value()),
                    flow_lpm_per_gpu: st.flow_per_gpu.map(|f| f.value()),
                    state,
                };
                let t = self.engine_now();
                let outs = self.health.coolant(t, c);
                self.on_health(outs, now).await;
            }
            return;
        }
        if msg.topic.family != Family::Cmd {
            return;
        }
        self.on_command(msg).await;
    }

    async fn on_command(&mut self, msg: Inbound) {
        let now = self.clock.wall();
        let frame = msg.frame;
        self.engine_now();
        let verdict = self.core.command(now, &frame);
        let mut code = verdict.code;
        let mut detail = verdict.detail;
        if let (Some(gpu), Message::QuarantineRelease(r)) = (verdict.release, &frame.message) {
            self.release(now, &frame, gpu, r, &mut code, &mut detail)
                .await;
        }
        let mut applied = Vec::new();
        if verdict.changed_caps {
            applied = self.take_lease(&frame, &mut code, &mut detail).await;
        }
        tracing::info!(
            "{} from {} seq {}: {code} {detail}",
            frame.message.kind().name(),
            frame.sender.id.as_str(),
            frame.seq
        );
        self.acknowledge(now, &frame, code, &detail);
        // The limits' events after the ack: the sender waits for the ack,
        // and an ack queued behind a flash write per GPU comes late.
        for ev in applied {
            self.emit(ev, now).await;
        }
    }

    /// Writes a command to the event log and waits until it is in flash.
    async fn log_command(&mut self, frame: &Frame, kind: MessageKind) -> Result<(), String> {
        let mut buf = [0u8; MAX_FRAME_LEN];
        match frame.encode(&mut buf) {
            Ok(n) => self
                .recorder
                .append_sync(frame.time, kind as u8, buf[..n].to_vec())
                .await
                .map(|_| ()),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    /// An operator's release of a quarantined GPU: logged, published, kept
    /// in flash; refused (`not_quarantined`) for a GPU that is not.
    async fn release(
        &mut self,
        now: TimestampMs,
        frame: &Frame,
        gpu: u8,
        r: &QuarantineRelease,
        code: &mut AckCode,
        detail: &mut String,
    ) {
        let t = self.engine_now();
        match self
            .health
            .release(t, gpu, r.operator.as_str(), r.note.as_str())
        {
            Ok(change) => {
                let logged = self
                    .log_command(frame, MessageKind::QuarantineRelease)
                    .await;
                if let Err(e) = logged {
                    tracing::error!("release not logged to flash: {e}");
                    *detail = format!(
                        "released, but not logged to flash ({e}): the quarantine may come back after a restart"
                    );
                }
                tracing::warn!(
                    "GPU {gpu} released by {}: {}",
                    r.operator.as_str(),
                    r.note.as_str()
                );
                self.publish_health(now);
                self.keep_health(gpu as usize).await;
                let ev = Event::QuarantineReleased {
                    gpu: r.gpu,
                    operator: r.operator.clone(),
                    note: r.note.clone(),
                };
                self.emit(ev, now).await;
                let ev = Event::HealthChanged {
                    gpu: r.gpu,
                    from: change.from,
                    to: change.to,
                    reason: change.reason,
                };
                self.emit(ev, now).await;
            }
            Err(state) => {
                *code = AckCode::NotQuarantined;
                let state = format!("{state:?}").to_lowercase();
                *detail = format!("GPU {gpu} is {state}, not quarantined");
            }
        }
    }

    /// A lease that changed the caps: logged before it is acknowledged (a
    /// crash now still knows it), then put in force at once; the
    /// `caps_applied` events of the limits it changed, to be emitted after
    /// the ack.
    async fn take_lease(
        &mut self,
        frame: &Frame,
        code: &mut AckCode,
        detail: &mut String,
    ) -> Vec<Event> {
        let logged = self.log_command(frame, MessageKind::CapLease).await;
        if let Err(e) = logged {
            // The cap still applies (the sender needs it now); the ack
            // says it will not survive a restart.
            tracing::error!("lease not logged to flash: {e}");
            *detail = format!("not logged to flash ({e}): lost if the agent restarts");
        }
        let (failures, events) = self.reconcile_quietly(true).await;
        if !failures.is_empty() {
            *code = AckCode::Failed;
            *detail = failures
                .into_iter()
                .map(|(_, why)| why)
                .collect::<Vec<_>>()
                .join("; ");
        }
        events
    }

    /// The ack of a command, with every limit now in force (read back).
    fn acknowledge(&mut self, now: TimestampMs, frame: &Frame, code: AckCode, detail: &str) {
        let mut in_force = heapless::Vec::new();
        for (i, g) in self.gpus.iter().enumerate() {
            if let Some(limit) = g.applied {
                let _ = in_force.push(GpuCap {
                    gpus: GpuSelector::Gpu(Self::gpu_index(i)),
                    limit,
                });
            }
        }
        let ack = Ack {
            correlation: Correlation {
                from: frame.sender.clone(),
                seq: frame.seq,
            },
            code,
            in_force,
            detail: Text::truncated(detail),
        };
        self.publish(Message::Ack(ack), now, true);
    }
}
