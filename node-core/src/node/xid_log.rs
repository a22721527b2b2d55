//! At most [`XID_LOG_PER_S`] XID lines a second: in a storm of thousands
//! the log says how many it left out instead of writing each (the events,
//! the counts and every decision are kept whatever the log says).

/// XID lines logged a second at most.
const XID_LOG_PER_S: u32 = 10;

/// The XID lines said in the current second.
#[derive(Debug, Default)]
pub(crate) struct XidLog {
    /// The second being counted, steady ms.
    window: u64,
    logged: u32,
    unsaid: u64,
}

impl XidLog {
    /// Whether to log an XID at `t` (steady ms): `Some(n)` with the count
    /// of those left out since the last line logged.
    pub(crate) fn allow(&mut self, t: u64) -> Option<u64> {
        if t.saturating_sub(self.window) >= 1_000 {
            self.window = t;
            self.logged = 0;
        }
        if self.logged < XID_LOG_PER_S {
            self.logged += 1;
            return Some(std::mem::take(&mut self.unsaid));
        }
        self.unsaid += 1;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::XidLog;

    #[test]
    fn a_storm_logs_ten_lines_a_second_and_says_how_many_it_left_out() {
        let mut l = XidLog::default();
        let logged: Vec<_> = (0..1_000u64).filter_map(|k| l.allow(k)).collect();
        assert_eq!(logged, vec![0; 10], "ten lines in the first second");
        assert_eq!(
            l.allow(1_000),
            Some(990),
            "the next second says what was left out"
        );
    }
}
