//! What the steps cost the microcontroller, in instructions: each step's
//! decision (the decision path's step and plan, counted on the board by
//! SysTick under QEMU's `-icount`), the median of the last steps and the
//! worst since the start.
//!
//! Glossary:
//! - *median*: of the last [`WINDOW`] steps' counts.

/// Steps the median is taken over.
pub const WINDOW: usize = 256;

/// Instructions per step: the last [`WINDOW`] and the worst.
#[derive(Debug, Default)]
pub struct InsnStats {
    last: heapless::Deque<u32, WINDOW>,
    max: u32,
    steps: u32,
}

impl InsnStats {
    /// An empty record.
    pub const fn new() -> Self {
        Self {
            last: heapless::Deque::new(),
            max: 0,
            steps: 0,
        }
    }

    /// Adds a step's count.
    pub fn add(&mut self, insn: u32) {
        if self.last.is_full() {
            self.last.pop_front();
        }
        let _ = self.last.push_back(insn);
        self.max = self.max.max(insn);
        self.steps = self.steps.saturating_add(1);
    }

    /// The median of the last steps (0 before any).
    pub fn median(&self) -> u32 {
        let mut v: heapless::Vec<u32, WINDOW> = self.last.iter().copied().collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    }

    /// The most of any step since the start.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// Steps counted.
    pub fn steps(&self) -> u32 {
        self.steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_of_the_window_and_the_worst_of_all_time() {
        let mut s = InsnStats::new();
        assert_eq!((s.median(), s.max()), (0, 0));
        s.add(1_000_000);
        for i in 0..WINDOW as u32 {
            s.add(10 + i % 3);
        }
        assert_eq!(s.median(), 11, "the first step left the window");
        assert_eq!(s.max(), 1_000_000);
        assert_eq!(s.steps(), WINDOW as u32 + 1);
    }
}
