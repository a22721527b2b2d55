//! The gateway's loop, as `cooling_ctrl::gateway` runs its core, and the
//! checks of what comes out.

use super::*;

impl World {
    /// The loop's tick.
    pub(crate) fn tick(&mut self) -> Check {
        let now = self.now();
        let acts = self.gw.bridge.tick(now);
        let handed = self.perform(acts, None, now)?;
        prop_assert!(handed.is_empty(), "a tick hands on {handed:?}");
        for (id, token) in self.gw.pending.expired(now.mono_ms) {
            let sent = self.tokens[token].sent.expect("it was sent");
            let waited = self.t - sent;
            prop_assert!(
                (ANSWER_WITHIN_MS..ANSWER_WITHIN_MS + TICK_MS).contains(&waited),
                "clear {id} given up after {waited} ms"
            );
            self.outcome(token, Outcome::NoAnswer)?;
        }
        if let Some(down) = self.gw.bms.due(now.mono_ms, false) {
            self.bms_down(&down)?;
        }
        self.check_quiet()?;
        self.check_bms(now)
    }

    /// Bytes `from..to` of piece `i` reach the gateway.
    pub(crate) fn hear(&mut self, i: usize, from: usize, to: usize) -> Check {
        let ended = self.x.run.feed(&self.pieces, i, from, to);
        let now = self.now();
        let before = self.gw.bridge.counts();
        let bytes = self.pieces[i].bytes[from..to].to_vec();
        let acts = self.gw.bridge.hear(&bytes, now);
        let after = self.gw.bridge.counts();
        let started_acts = acts.iter().filter(|a| matches!(a, Act::Started)).count();
        let (mut renumbered, mut hello) = (false, false);
        match ended {
            Ended::Nothing => prop_assert!(acts.is_empty(), "no frame ended: {acts:?}"),
            Ended::Piece(p) if self.pieces[p].kind == Kind::Whole => {
                (renumbered, hello) = self.taken(p, acts, now)?
            }
            Ended::Piece(_) | Ended::Junk => {
                // A frame that passes its CRC and does not read is
                // numbered: frames lost before it are said too.
                let gap = usize::from(after.gaps > before.gaps);
                prop_assert!(
                    acts.len() == 1 + gap && acts.iter().all(|a| matches!(a, Act::Say(..))),
                    "a harmed frame gives a log line, nothing else: {acts:?}"
                );
                prop_assert!(
                    gap == 0
                        || matches!(ended, Ended::Piece(p) if self.pieces[p].kind == Kind::Unread),
                    "only a frame that passes its CRC is numbered: {acts:?}"
                );
                prop_assert_eq!(after.dropped.total(), before.dropped.total() + 1);
                prop_assert_eq!(after.frames_in, before.frames_in);
                match ended {
                    Ended::Piece(p) if self.pieces[p].kind == Kind::Unread => self.unread(p),
                    _ => {}
                }
            }
        }
        let restarted = after.restarts > before.restarts;
        prop_assert_eq!(restarted, renumbered, "an MCU restart by its numbers");
        // A hello or numbers starting again: the MCU started, once.
        let started = renumbered || hello;
        prop_assert_eq!(started_acts, usize::from(started), "started once");
        // The gateway's loop: a started MCU has forgotten the limits.
        if started {
            if let Some(down) = self.gw.bms.due(now.mono_ms, true) {
                self.bms_down(&down)?;
            }
        }
        if let Some(down) = self.gw.bms.due(now.mono_ms, false) {
            self.bms_down(&down)?;
        }
        if started && self.x.limits_down.is_some() {
            prop_assert_eq!(self.x.limits_down, Some(self.t), "limits again at a start");
        }
        self.check_bms(now)
    }

    /// Piece `p` was taken whole, its acts `acts`: checks them against
    /// what the MCU said. Whether its numbers say the MCU started again,
    /// and whether it was a hello.
    pub(crate) fn taken(
        &mut self,
        p: usize,
        acts: Vec<Act>,
        now: Now,
    ) -> Result<(bool, bool), TestCaseError> {
        let said = self.pieces[p].said.clone();
        let bytes = self.pieces[p].bytes.clone();
        if self.x.last_in.as_ref() == Some(&(said.seq, bytes.clone())) {
            prop_assert!(
                acts.iter().all(|a| matches!(a, Act::Say(..))),
                "a frame the line repeated is taken again: {acts:?}"
            );
            return Ok((false, false));
        }
        let renumbered = std::mem::take(&mut self.x.restart_unread)
            || self
                .x
                .last_in
                .as_ref()
                .is_some_and(|(seq, _)| said.seq <= *seq);
        if renumbered || matches!(said.up, Up::Hello(_)) {
            self.x.offer = None;
        }
        self.x.last_in = Some((said.seq, bytes));
        let mut want = Vec::new();
        let mut status = None;
        match &said.up {
            Up::Status(s) => {
                self.x.last_status = Some((s.clone(), self.t));
                status = Some(s);
            }
            Up::Lease { host, lease, lift } => want.push(Act::Lease {
                host: usize::from(*host),
                lease: lease.clone(),
                lift: *lift,
            }),
            Up::Event(e) => want.push(Act::Event(e.clone())),
            Up::Answer { id, outcome } => want.push(Act::Answer {
                id: *id,
                outcome: outcome.clone().map_err(|w| w.as_str().to_string()),
            }),
            Up::Offer(o) => self.x.offer = o.clone(),
            Up::Hello(_) | Up::Said { .. } => {}
        }
        let published_before = self.x.published.as_ref().map(|(at, _)| *at);
        let taken = Taken {
            status,
            answers: said.answers,
        };
        let handed = self.perform(acts, Some(&taken), now)?;
        prop_assert_eq!(&handed, &want, "handed on once, as the MCU said it");
        if let Some(s) = status {
            prop_assert!(!self.gw.bridge.silent(), "a status ends the silence");
            if self.bus {
                self.check_retained(s)?;
                if published_before.is_some_and(|at| self.t - at >= STATE_EVERY_MS) {
                    let at = self.x.published.as_ref().map(|(at, _)| *at);
                    prop_assert_eq!(at, Some(self.t), "a state every 60 s");
                }
            }
        }
        Ok((renumbered, matches!(said.up, Up::Hello(_))))
    }

    /// Piece `p` was checked, and its message did not read: its number
    /// counts.
    pub(crate) fn unread(&mut self, p: usize) {
        let seq = self.pieces[p].said.seq;
        let x = &mut self.x;
        x.restart_unread |= x.last_in.as_ref().is_some_and(|(last, _)| seq <= *last);
        x.last_in = Some((seq, self.pieces[p].bytes.clone()));
    }

    /// With the broker connected, after status `s`: the state it keeps
    /// says what `s` says, by `run`'s rule (the setpoint within 0.5 K).
    pub(crate) fn check_retained(&self, s: &Status) -> Check {
        let r = self.retained.as_ref();
        let r = r.ok_or_else(|| TestCaseError::fail("no state on the bus after a status"))?;
        prop_assert_eq!((r.mode, r.reason), (s.mode.0, s.mode.1), "{:?}", r);
        prop_assert!((r.setpoint.value() - f64::from(s.setpoint_c)).abs() < 0.5);
        prop_assert_eq!(
            lost_bits(r),
            s.racks.cooling_lost & rack_mask(&self.core.layout)
        );
        Ok(())
    }

    /// Performs `acts` as the gateway's loop does, checking each; `taken`:
    /// the frame they came of (none: a tick, or the bus). Returns what
    /// the MCU said that was handed on (leases, events, answers).
    pub(crate) fn perform(
        &mut self,
        acts: Vec<Act>,
        taken: Option<&Taken<'_>>,
        now: Now,
    ) -> Result<Vec<Act>, TestCaseError> {
        let mut handed = Vec::new();
        let mut telemetry = 0;
        for act in acts {
            match act {
                Act::Telemetry(_) => telemetry += 1,
                Act::State(st, key) => {
                    self.check_state(&st, taken, now)?;
                    if self.bus {
                        let facility = st.facility.clone();
                        self.gw.bridge.state_published(key, facility, now.mono_ms);
                        self.retained = Some((*st).clone());
                        self.x.published = Some((self.t, *st));
                    }
                }
                Act::FacilityTarget(water_c) => self.check_water(water_c)?,
                Act::Say(..) | Act::Started => {}
                Act::Answer { id, outcome } => {
                    self.answered(id, &outcome, taken)?;
                    handed.push(Act::Answer { id, outcome });
                }
                a @ (Act::Lease { .. } | Act::Event(_)) => handed.push(a),
            }
        }
        let statuses = usize::from(taken.is_some_and(|t| t.status.is_some()));
        prop_assert_eq!(telemetry, statuses, "telemetry once a status");
        Ok(handed)
    }

    /// A state the bridge gives at `now`.
    pub(crate) fn check_state(&self, st: &CduState, taken: Option<&Taken<'_>>, now: Now) -> Check {
        let silent = st.reason == ReasonCode::CONTROLLER_SILENT;
        match taken.and_then(|t| t.status) {
            Some(s) => prop_assert_eq!((st.mode, st.reason), (s.mode.0, s.mode.1)),
            None => prop_assert!(
                silent && st.mode == CduMode::Failsafe && taken.is_none(),
                "only a status, or silence at a tick, makes a state: {st:?}"
            ),
        }
        // 1. The racks as the last status taken says them, or none.
        match &self.x.last_status {
            None => prop_assert!(st.racks.is_empty(), "racks from no status: {st:?}"),
            Some((s, _)) => {
                let layout = &self.core.layout;
                prop_assert_eq!(st.racks.len(), usize::from(layout.racks.min(16)));
                prop_assert_eq!(lost_bits(st), s.racks.cooling_lost & rack_mask(layout));
            }
        }
        // 5. A mode never begins after the state that says it.
        prop_assert!(
            st.since.0 <= now.unix_ms + ANCHOR_SLACK_MS,
            "since {} ms after the wall clock: {st:?}",
            st.since.0 - now.unix_ms
        );
        if self.hall == Hall::Alone {
            prop_assert!(st.facility.is_none());
        } else {
            let f = st.facility.as_ref();
            let offer = f.and_then(|f| f.offer.clone());
            let want = if silent { None } else { self.x.offer.clone() };
            prop_assert_eq!(offer, want, "the MCU's offer since its start");
        }
        Ok(())
    }

    /// The MCU answered clear `id`: to whoever waits for it (the
    /// gateway's loop).
    pub(crate) fn answered(
        &mut self,
        id: u32,
        outcome: &Result<(), String>,
        taken: Option<&Taken<'_>>,
    ) -> Check {
        let Some(token) = self.gw.pending.answered(id) else {
            return Ok(());
        };
        let meant = taken.and_then(|t| t.answers);
        prop_assert_eq!(
            Some(token),
            meant,
            "the answer to clear {} went to another clear of that id",
            id
        );
        prop_assert_eq!(self.tokens[token].id, id);
        let o = if outcome.is_ok() {
            Outcome::Done
        } else {
            Outcome::Refused
        };
        self.outcome(token, o)
    }

    pub(crate) fn outcome(&mut self, token: usize, o: Outcome) -> Check {
        let t = &mut self.tokens[token];
        prop_assert!(
            t.outcome.is_none(),
            "clear {} {:?}, then {:?}",
            t.id,
            t.outcome,
            o
        );
        t.outcome = Some(o);
        Ok(())
    }

    /// The hall's water going down to the MCU.
    pub(crate) fn check_water(&self, water_c: f32) -> Check {
        match self.hall {
            Hall::Alone => prop_assert!(false, "water {water_c} °C outside a hall"),
            Hall::Member => prop_assert!(
                self.x.waters.iter().any(|w| (w - water_c).abs() < 0.01),
                "water {water_c} °C is no plan heard: {:?}",
                self.x.waters
            ),
            Hall::Coordinator => prop_assert!((5.0..=60.0).contains(&water_c)),
        }
        Ok(())
    }

    /// An operator asks clear `id`: down the line if it is open, awaited.
    pub(crate) fn clear(&mut self, id: u32, reaches: bool) -> Check {
        let token = self.tokens.len();
        self.tokens.push(Token {
            id,
            sent: None,
            outcome: None,
        });
        if !self.line {
            return self.outcome(token, Outcome::NotSent);
        }
        let framed = self.gw.bridge.frame(&Down::Clear(signed_clear(id)));
        prop_assert!(framed.is_ok(), "{framed:?}");
        self.gw.bridge.wrote(true);
        self.gw.pending.wait(id, self.now().mono_ms, token);
        self.tokens[token].sent = Some(self.t);
        if reaches {
            self.mcu.clears.push((id, token));
        }
        Ok(())
    }

    pub(crate) fn bms_write(&mut self, w: BmsWrite) -> Check {
        let w = match w {
            BmsWrite::Ceiling(c) => NorthboundWrite::SetpointCeiling {
                celsius: 30.0 + f32::from(c % 100) / 10.0,
            },
            BmsWrite::Offset(k) => NorthboundWrite::PlanCeilingOffset {
                kelvin: -f32::from(k % 50) / 10.0,
            },
            BmsWrite::Outdoor(c) => {
                self.x.outdoor.0 += 1;
                NorthboundWrite::OutdoorTemp {
                    celsius: f32::from(c) / 4.0,
                }
            }
            BmsWrite::Ack => NorthboundWrite::AlarmAck {
                seen: self.x.alarms_shown,
            },
        };
        if let Some(down) = self.gw.bms.write(w) {
            self.bms_down(&down)?;
        }
        Ok(())
    }

    pub(crate) fn bms_down(&mut self, down: &Down) -> Check {
        match down {
            Down::Limits { .. } => self.x.limits_down = Some(self.t),
            Down::Outdoor(_) => self.x.outdoor.1 += 1,
            other => prop_assert!(false, "the BMS sends {other:?}"),
        }
        let framed = self.gw.bridge.frame(down);
        prop_assert!(framed.is_ok(), "{framed:?}");
        Ok(())
    }

    /// A hall's state heard on the bus: the coordinator's plan of `water_c`
    /// (to a coordinator: the other CDU's offer).
    pub(crate) fn plan(&mut self, water_c: f32) -> Check {
        let (from, st) = match self.hall {
            Hall::Coordinator => (id("cdu-2"), hall_state(Some(offer(water_c + 8.0)), None)),
            _ => (id("cdu-1"), hall_state(None, Some(water_c))),
        };
        if self.hall == Hall::Member {
            self.x.waters.push(water_c);
        }
        let now = self.now();
        let acts = self.gw.bridge.hall_state(&from, &st, now, 0);
        prop_assert!(
            acts.iter().all(|a| matches!(a, Act::FacilityTarget(_))),
            "{acts:?}"
        );
        self.perform(acts, None, now).map(drop)
    }

    /// At a tick: the silence (2) and the states' pace (5), the BMS's.
    pub(crate) fn check_quiet(&self) -> Check {
        let last = self.x.last_status.as_ref().map(|(_, at)| *at);
        let quiet = self.t - last.unwrap_or(self.gw.started);
        let silent = quiet >= SILENT_AFTER_MS;
        prop_assert_eq!(self.gw.bridge.silent(), silent, "quiet for {} ms", quiet);
        if silent && self.bus {
            let r = self.retained.as_ref();
            prop_assert!(
                r.is_some_and(
                    |s| s.mode == CduMode::Failsafe && s.reason == ReasonCode::CONTROLLER_SILENT
                ),
                "quiet for {quiet} ms, the bus keeps {r:?}"
            );
        }
        if self.bus {
            let from = self
                .x
                .published
                .as_ref()
                .map_or(self.gw.started, |(at, _)| *at);
            let from = from.max(self.bus_since);
            let every = STATE_EVERY_MS + SILENT_AFTER_MS + TICK_MS;
            prop_assert!(self.t - from <= every, "no state for {} ms", self.t - from);
        }
        if let Some(at) = self.x.limits_down {
            prop_assert!(
                self.t - at < LIMITS_EVERY_MS + TICK_MS,
                "limits not renewed"
            );
        }
        prop_assert_eq!(self.x.outdoor.0, self.x.outdoor.1, "outdoor once per write");
        Ok(())
    }

    /// What the BMS reads at `now`: the status's mode and racks, or the
    /// silence.
    pub(crate) fn check_bms(&mut self, now: Now) -> Check {
        let g = &mut self.gw;
        let silent = g.bridge.silent();
        let heard = match (silent, g.bridge.last_status()) {
            (true, last) => Heard::Silent {
                last,
                quiet_ms: g.bridge.quiet_ms(now),
            },
            (false, Some(s)) => Heard::Speaking(s),
            (false, None) => Heard::Nothing,
        };
        let snap = g.bms.snapshot(heard, now.mono_ms);
        self.x.alarms_shown = snap.alarms;
        let last = self.x.last_status.as_ref().map(|(s, _)| s);
        if silent {
            prop_assert_eq!(
                (snap.mode, snap.reason),
                (CduMode::Failsafe, ReasonCode::CONTROLLER_SILENT)
            );
            prop_assert_eq!(snap.cooling_lost, last.map_or(0, |s| s.racks.cooling_lost));
        } else if let Some(s) = last {
            let said = (s.mode.0, s.mode.1, s.racks.cooling_lost);
            prop_assert_eq!((snap.mode, snap.reason, snap.cooling_lost), said);
        }
        Ok(())
    }

    /// The end: every clear waited for is given up, so each has its
    /// outcome.
    pub(crate) fn finish(&mut self) -> Check {
        self.advance(ANSWER_WITHIN_MS + 2 * TICK_MS)?;
        for t in &self.tokens {
            prop_assert!(t.outcome.is_some(), "clear {} has no outcome", t.id);
        }
        Ok(())
    }
}

/// The racks a state lists as cooling lost, bit n = rack n.
pub(crate) fn lost_bits(st: &CduState) -> u16 {
    st.racks
        .iter()
        .filter(|r| r.cooling == RackCooling::Lost)
        .fold(0, |bits, r| bits | 1 << r.rack.get())
}

/// A clear as an operator signs it (the gateway checks no signature).
pub(crate) fn signed_clear(id: u32) -> loopwarden_link::SignedClear {
    loopwarden_link::SignedClear {
        clear: loopwarden_link::Clear {
            id,
            cdu: self::id("cdu-1"),
            operator: self::id("jdoe"),
            at: loopwarden_protocol::TimestampMs(T0),
            action: loopwarden_link::ClearAction::Leak(1),
        },
        key_id: 1,
        signature: [[0; 32]; 2],
    }
}

/// Another CDU's retained state, with its part in the hall.
pub(crate) fn hall_state(offer: Option<FacilityOffer>, water_c: Option<f32>) -> CduState {
    let loopwarden_protocol::Message::CduState(mut st) =
        samples::message(loopwarden_protocol::MessageKind::CduState)
    else {
        unreachable!("a sample state")
    };
    st.facility = Some(FacilityState {
        offer,
        plan: water_c.map(|w| FacilityPlan {
            water: cooling_ctrl::decide::facility::celsius(w),
            chiller_stages: 1,
            offers: 2,
            capping: 0,
        }),
    });
    st
}
