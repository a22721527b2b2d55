//! The heartbeat's count moves only with a heartbeat that went out on
//! the line (`Outcome::heartbeat_sent`: taken, refused or unanswered):
//! one withheld after a safety write failed, or not tried after a write
//! the CDU did not answer, leaves it, so the next differs from the last
//! one sent even in a register of two values (0 to 1: the count mod 2 is
//! written); one refused is counted, so a value the CDU refuses is not
//! sent again and again.
use super::scripted::{measured, started, step, Script};
use super::*;
use crate::modbus::CduError;

/// A CDU that holds what it takes, refuses the valve write (exception 4)
/// or leaves it unanswered at the steps named, and records each
/// heartbeat count written to it.
#[derive(Default)]
struct Toggle {
    step: u64,
    refuse_valves: Vec<u64>,
    valves_unanswered: Vec<u64>,
    beat_unanswered: Vec<u64>,
    beat_refused: Vec<u64>,
    /// With `beat_refused`: only counts that are a multiple of this are
    /// refused at those steps.
    refuse_count_multiple_of: Option<u64>,
    sent: Vec<(u64, f64)>,
}

impl Script for Toggle {
    fn write(&mut self, w: &Write) -> Result<(), CduError> {
        let op = format!("write {}", w.setting.register());
        let valves = w.setting == Setting::Valves;
        if valves && self.refuse_valves.contains(&self.step) {
            let meaning = crate::modbus::exception_meaning(4);
            return Err(CduError::Refused {
                op,
                code: 4,
                meaning,
            });
        }
        if w.setting == Setting::Heartbeat {
            self.sent.push((self.step, w.value));
            if self.beat_unanswered.contains(&self.step) {
                return Err(CduError::NoAnswer { op, after_ms: 500 });
            }
            let refused_value = self
                .refuse_count_multiple_of
                .is_none_or(|m| (w.value as u64) % m == 0);
            if self.beat_refused.contains(&self.step) && refused_value {
                let meaning = crate::modbus::exception_meaning(3);
                return Err(CduError::Refused {
                    op,
                    code: 3,
                    meaning,
                });
            }
        }
        if valves && self.valves_unanswered.contains(&self.step) {
            return Err(CduError::NoAnswer { op, after_ms: 500 });
        }
        Ok(())
    }
}

/// Steps 0 to 7 of a CDU as `cdu` scripts it: the heartbeat counts sent,
/// as (step, count), and whether each step's outcome said it sent one.
fn run_steps(cdu: Toggle) -> (Vec<(u64, f64)>, Vec<bool>) {
    let (mut decider, mut d) = started(super::scripted::Scripted(cdu));
    let mut said_sent = Vec::new();
    for s in 0..8 {
        d.cdu.step = s;
        let (_, o) = step(&mut decider, &mut d, s, &measured(true, 0));
        said_sent.push(o.heartbeat_sent);
    }
    (std::mem::take(&mut d.cdu.sent), said_sent)
}

#[test]
fn a_heartbeat_withheld_or_not_tried_is_not_counted_one_unanswered_is() {
    let cdu = Toggle {
        refuse_valves: vec![2, 3],
        valves_unanswered: vec![5],
        beat_unanswered: vec![6],
        ..Toggle::default()
    };
    let (sent, said_sent) = run_steps(cdu);
    let steps: Vec<u64> = sent.iter().map(|(s, _)| *s).collect();
    // Step 0 waits for its read-back after the start; 2 and 3 withhold
    // the heartbeat (the valves refused); 5 tries nothing after the
    // valves went unanswered; 6's heartbeat goes out unanswered.
    assert_eq!(steps, [1, 4, 6, 7]);
    let sent_steps: Vec<bool> = (0..8).map(|s| steps.contains(&s)).collect();
    assert_eq!(said_sent, sent_steps, "the outcome says which went out");
    // Each one past the last sent: on a 0-to-1 register, each differs
    // from the one before it.
    let counts: Vec<f64> = sent.iter().map(|(_, c)| *c).collect();
    assert_eq!(counts, [1.0, 2.0, 3.0, 4.0]);
    let toggled: Vec<f64> = counts.iter().map(|c| c % 2.0).collect();
    assert!(toggled.windows(2).all(|w| w[0] != w[1]), "{toggled:?}");
}

/// A heartbeat the CDU refused is counted: a CDU that refuses some
/// values (here every count that is a multiple of 4, exception 3) gets
/// the next value at the next step, never the refused one again.
#[test]
fn a_heartbeat_the_cdu_refused_is_counted_so_a_refused_value_is_not_sent_again() {
    let cdu = Toggle {
        beat_refused: (0..8).collect(),
        refuse_count_multiple_of: Some(4),
        ..Toggle::default()
    };
    let (sent, said_sent) = run_steps(cdu);
    let counts: Vec<f64> = sent.iter().map(|(_, c)| *c).collect();
    // Step 0 waits for its read-back; every later step sends one.
    assert_eq!(counts, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    assert!(said_sent[4], "the refused count 4 is counted");
    assert!(counts.windows(2).all(|w| w[0] != w[1]), "{counts:?}");
}
