//! A read of the CDU's measurements, request by request: a request that
//! fails loses its own registers only. The others' readings are kept (a
//! meter sub-device that fails must not take the temperatures and the
//! leak inputs with it), the failed request's registers read `None`, and
//! its failure is kept beside the readings ([`CduPort::read_gaps`]) for
//! the shell to report. The read fails as a whole only when no request
//! answered. After a request the CDU did not answer (no answer, garbled,
//! the link failed, a gateway that could not reach it) or answered
//! wrongly, the read's later requests are not tried: each would wait out
//! its own timeout, or, on a serial line, for a quiet line first; their
//! registers read `None` too. After a refusal (an exception other than
//! 10 or 11) the next request is tried. A read whose lost requests hold
//! a pump's running flag fails as a whole, as a read none answered: a
//! flag not read would be taken as a pump stopped, and a healthy lead
//! (then its lag) judged tripped and latched out of service on a CDU
//! merely busy (exception 6); failed whole, the read leads to the
//! sensor timeout's failsafe, as when the CDU does not answer.
//!
//! Glossary:
//! - *gap*: a request of a read that failed while another answered.
use super::*;

/// Whether, after `e` failed a read's request, its next request is
/// worth trying: the CDU answered, and refused only that one.
fn next_worth_trying(e: &CduError) -> bool {
    e.refused_code().is_some() && !e.is_unanswered()
}

/// Failure `e` of a read that lost running flag `flag`, saying that it
/// fails the read as a whole.
fn flag_unread(e: CduError, flag: &str) -> CduError {
    let why = format!(
        " (it lost {flag}: the whole read fails, since a pump's running flag not read \
         would be taken as the pump stopped)"
    );
    noted(e, &why)
}

/// Failure `e` with `why` added to what was asked (its `op`); a whole
/// write's failure as it is.
pub(super) fn noted(e: CduError, why: &str) -> CduError {
    match e {
        CduError::Refused { op, code, meaning } => CduError::Refused {
            op: op + why,
            code,
            meaning,
        },
        CduError::NoAnswer { op, after_ms } => CduError::NoAnswer {
            op: op + why,
            after_ms,
        },
        CduError::Garbled {
            op,
            bytes,
            after_ms,
        } => CduError::Garbled {
            op: op + why,
            bytes,
            after_ms,
        },
        CduError::Io { op, source } => CduError::Io {
            op: op + why,
            source,
        },
        CduError::BadAnswer { op, detail } => CduError::BadAnswer {
            op: op + why,
            detail,
        },
        CduError::Value { op, source } => CduError::Value {
            op: op + why,
            source,
        },
        whole @ (CduError::Partial { .. } | CduError::ReadBack { .. }) => whole,
    }
}

impl ModbusCdu {
    /// Each span's words, `None` for a span that failed or was not tried
    /// (the failures kept in `gaps`). Fails with the first failure when
    /// no span answered, and with the failure that lost a pump's running
    /// flag (its own, or the one after which it was not tried), saying
    /// so, when a span that holds one has no words.
    pub(super) async fn read_spans(&mut self) -> Result<Vec<(Span, Option<Vec<u16>>)>, CduError> {
        self.gaps.clear();
        let mut out = Vec::new();
        let mut answered = false;
        let mut trying = true;
        let mut flag_lost: Option<(usize, &'static str)> = None;
        for span in self.spans.clone() {
            let flag = span
                .registers
                .iter()
                .find_map(|(n, _, _)| [PUMP_A, PUMP_B].into_iter().find(|f| f == n));
            if !trying {
                if let Some(f) = flag {
                    flag_lost.get_or_insert((self.gaps.len() - 1, f));
                }
                out.push((span, None));
                continue;
            }
            match self.read_span(&span).await {
                Ok(words) => {
                    answered = true;
                    out.push((span, Some(words)));
                }
                Err(e) => {
                    trying = next_worth_trying(&e);
                    if let Some(f) = flag {
                        flag_lost.get_or_insert((self.gaps.len(), f));
                    }
                    self.gaps.push(e);
                    out.push((span, None));
                }
            }
        }
        if let Some((i, flag)) = flag_lost.filter(|_| answered) {
            let e = self.gaps.swap_remove(i);
            self.gaps.clear();
            return Err(flag_unread(e, flag));
        }
        if !answered && !self.gaps.is_empty() {
            let first = self.gaps.remove(0);
            self.gaps.clear();
            return Err(first);
        }
        Ok(out)
    }
}
