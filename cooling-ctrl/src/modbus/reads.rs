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
//! 10 or 11) the next request is tried.
//!
//! Glossary:
//! - *gap*: a request of a read that failed while another answered.
use super::*;

/// Whether, after `e` failed a read's request, its next request is
/// worth trying: the CDU answered, and refused only that one.
fn next_worth_trying(e: &CduError) -> bool {
    e.refused_code().is_some() && !e.is_unanswered()
}

impl ModbusCdu {
    /// Each span's words, `None` for a span that failed or was not tried
    /// (the failures kept in `gaps`). Fails with the first failure when
    /// no span answered.
    pub(super) async fn read_spans(&mut self) -> Result<Vec<(Span, Option<Vec<u16>>)>, CduError> {
        self.gaps.clear();
        let mut out = Vec::new();
        let mut answered = false;
        let mut trying = true;
        for span in self.spans.clone() {
            if !trying {
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
                    self.gaps.push(e);
                    out.push((span, None));
                }
            }
        }
        if !answered && !self.gaps.is_empty() {
            let first = self.gaps.remove(0);
            self.gaps.clear();
            return Err(first);
        }
        Ok(out)
    }
}
