//! The shell's devices: the CDU on its Modbus link and the controller
//! board's pins. Each read and write goes here, and each failure is
//! counted and logged once per change of its message; what a reading
//! means and what is written are the decision path's.
use super::*;
use crate::decide::Plan;

/// The CDU, the board, and what each last said.
pub(super) struct Devices<P> {
    pub(super) cdu: P,
    board: Option<Box<dyn BoardIo>>,
    cdu_error: Option<String>,
    write_error: Option<String>,
    board_error: Option<String>,
    /// When the CDU last answered a read.
    pub(super) last_read: Option<TimestampMs>,
    /// The pumps' fault bits as last read.
    pub(super) pump_faults: [bool; 2],
}

impl<P: CduPort> Devices<P> {
    pub(super) fn new(cdu: P, board: Option<Box<dyn BoardIo>>) -> Self {
        Self {
            cdu,
            board,
            cdu_error: None,
            write_error: None,
            board_error: None,
            last_read: None,
            pump_faults: [false; 2],
        }
    }

    /// The last read's error, while the CDU does not answer.
    pub(super) fn cdu_error(&self) -> Option<&String> {
        self.cdu_error.as_ref()
    }

    /// Reads the CDU.
    pub(super) async fn read_cdu(&mut self, stats: &mut ShellStats) -> Option<CduMeasurements> {
        match self.cdu.read().await {
            Ok(r) => {
                if let Some(e) = self.cdu_error.take() {
                    tracing::info!("cooling shell: the CDU answers again (was: {e})");
                }
                stats.cdu_reads += 1;
                self.last_read = Some(now_ms());
                self.pump_faults = [0, 1].map(|i| r.pump_faults[i].unwrap_or(false));
                Some(r)
            }
            Err(e) => {
                stats.cdu_read_errors += 1;
                self.cdu_failed(&e);
                None
            }
        }
    }

    /// The board's leak lines this step.
    pub(super) fn read_board(&mut self) -> BoardRead {
        match self.board.as_mut().map(|b| b.ropes()) {
            Some(Ok(ropes)) => BoardRead::Read {
                wet: ropes.wet,
                faults: ropes.faults,
            },
            Some(Err(e)) => {
                self.board_failed(e);
                BoardRead::Failed
            }
            None => BoardRead::Absent,
        }
    }

    /// Writes `plan` to the CDU in its order, each setting on its own
    /// (one that is not due after an earlier failure is skipped).
    pub(super) async fn write(&mut self, plan: &Plan, stats: &mut ShellStats) -> Outcome {
        let mut outcome = Outcome::default();
        for w in &plan.writes {
            if !outcome.due(w) {
                continue;
            }
            let r = self.cdu.write_setting(w).await.map_err(|e| e.to_string());
            outcome.record(w.setting, r);
        }
        match outcome.first_error() {
            None => {
                if let Some(e) = self.write_error.take() {
                    tracing::info!("cooling shell: the CDU takes its settings again (was: {e})");
                }
            }
            Some(e) => {
                let msg = e.to_string();
                stats.cdu_write_errors += 1;
                if self.write_error.as_deref() != Some(msg.as_str()) {
                    tracing::error!("cooling shell: writing the CDU's settings: {msg}");
                    self.write_error = Some(msg);
                }
            }
        }
        outcome
    }

    /// One pulse of the healthy relay (once per completed step), and the
    /// beacon as the step left it.
    pub(super) fn pulse(&mut self, beacon: bool) {
        if let Some(b) = self.board.as_mut() {
            if let Err(e) = b.pulse_healthy().and_then(|()| b.beacon(beacon)) {
                self.board_failed(e);
            }
        }
    }

    fn board_failed(&mut self, e: String) {
        if self.board_error.as_deref() != Some(e.as_str()) {
            tracing::error!("cooling shell: board pins: {e}");
            self.board_error = Some(e);
        }
    }

    fn cdu_failed(&mut self, e: &CduError) {
        let msg = e.to_string();
        if self.cdu_error.as_deref() != Some(msg.as_str()) {
            let what = if e.refused_code().is_some() {
                "refused"
            } else if e.is_no_answer() {
                "no answer"
            } else {
                "failed"
            };
            tracing::error!("cooling shell: reading the CDU ({what}): {msg}");
            self.cdu_error = Some(msg);
        }
    }
}
