//! The read-back of a two-word setting. A function-16 write's echo carries
//! the first register and the count, never the value, so a CDU that
//! clamps a 32-bit `pump_speed` (72.5 % to 70 %) echoes it as if it took
//! it: after the echo, the written registers are read back (function 3)
//! and compared word for word. A one-word write (function 6) needs none:
//! its echo carries the value.
use super::*;

impl ModbusCdu {
    /// Reads back holding register `r`'s words after the write of `value`
    /// as `words` was echoed right (`write_op`: that write, as its errors
    /// name it). Done only when the CDU holds `words`. Holding another
    /// value is a bad answer naming the value held; a read-back that fails
    /// (no answer, refused, a bad answer) fails the write: whether the
    /// CDU took the value is not known.
    pub(super) async fn read_back(
        &mut self,
        r: &Register,
        value: f64,
        words: &[u16],
        write_op: String,
    ) -> Result<(), CduError> {
        let n = words.len() as u16;
        let last = u32::from(r.address) + u32::from(n) - 1;
        let at = format!("holding {}-{last}", r.address);
        let op = format!("{write_op}, read back from {at}");
        let held = match self
            .exchange(op.clone(), Request::ReadHoldingRegisters(r.address, n))
            .await?
        {
            Response::ReadHoldingRegisters(held) if held.len() == words.len() => held,
            Response::ReadHoldingRegisters(held) => {
                let detail = format!("{} registers for {n} asked", held.len());
                return Err(self.bad_answer(op, detail));
            }
            other => return Err(self.bad_answer(op, format!("{other:?}"))),
        };
        if held == words {
            return Ok(());
        }
        let held_value = r.decode(self.map.word_order, &held);
        let detail = format!(
            "the CDU echoed the write, but {at} reads back {}, not the {} written: \
             it clamped the value or did not take it",
            written(held_value, &r.unit, &held),
            written(value, &r.unit, words)
        );
        Err(self.bad_answer(write_op, detail))
    }
}
