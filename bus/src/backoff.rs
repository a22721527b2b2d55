//! Reconnect backoff: exponential with jitter, so a hall of agents that lost
//! its broker does not reconnect in lock-step when it comes back (and so
//! rumqttc, which retries at once, does not spin).
//!
//! Pure: the random source is passed in. Each client and its presence
//! link draw from a source of their own, [`ReconnectRng`], seeded from the
//! operating system.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// Exponential backoff with "equal jitter": each wait is between half and
/// all of the current step, and the step doubles up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    /// A backoff that starts at `initial` and never waits longer than `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.max(Duration::from_millis(1));
        Self {
            initial,
            max: max.max(initial),
            step: initial,
        }
    }

    /// The next wait; doubles the step for the one after.
    pub fn next_wait(&mut self, rng: &mut impl Rng) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        let half = step / 2;
        let jitter_ms = rng.gen_range(0..=half.as_millis() as u64);
        half + Duration::from_millis(jitter_ms)
    }

    /// Back to the first step (after a successful connection).
    pub fn reset(&mut self) {
        self.step = self.initial;
    }
}

/// The random source of one client's reconnect waits: its own, seeded
/// from the operating system when the client (or its presence link) is
/// built, so that clients started together (a hall's agents after a power
/// cut, all from one image) draw different waits. The only way to build
/// one is [`ReconnectRng::new`]: no client can fall back to a fixed seed.
#[derive(Debug)]
pub(crate) struct ReconnectRng(StdRng);

impl ReconnectRng {
    /// A source of its own, seeded from the operating system.
    pub(crate) fn new() -> Self {
        Self(StdRng::from_entropy())
    }
}

impl RngCore for ReconnectRng {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.fill_bytes(dest)
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.0.try_fill_bytes(dest)
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(250), Duration::from_secs(30))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn waits_grow_to_the_cap_within_jitter_bounds() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let mut step = Duration::from_millis(100);
        for _ in 0..20 {
            let w = b.next_wait(&mut rng);
            assert!(
                w >= step / 2 && w <= step,
                "{w:?} outside [{:?}, {step:?}]",
                step / 2
            );
            step = (step * 2).min(Duration::from_secs(2));
        }
        b.reset();
        assert!(b.next_wait(&mut rng) <= Duration::from_millis(100));
    }

    /// Each client's random source is its own: four built as the
    /// client and its presence link build theirs draw four different
    /// series of waits (with a fixed seed they would reconnect in
    /// lock-step). 4001 waits are possible at each draw of an 8 s step.
    #[test]
    fn each_clients_reconnect_waits_are_its_own() {
        let series: Vec<Vec<Duration>> = (0..4)
            .map(|_| {
                let mut rng = ReconnectRng::new();
                let mut b = Backoff::new(Duration::from_secs(8), Duration::from_secs(8));
                (0..3).map(|_| b.next_wait(&mut rng)).collect()
            })
            .collect();
        for (i, a) in series.iter().enumerate() {
            for b in &series[i + 1..] {
                assert_ne!(a, b, "two clients draw the same waits: {series:?}");
            }
        }
    }

    #[test]
    fn jitter_spreads_agents_apart() {
        let waits: Vec<_> = (0..50)
            .map(|seed| {
                let mut rng = StdRng::seed_from_u64(seed);
                let mut b = Backoff::new(Duration::from_secs(8), Duration::from_secs(8));
                b.next_wait(&mut rng)
            })
            .collect();
        let min = waits.iter().min().unwrap();
        let max = waits.iter().max().unwrap();
        assert!(*max - *min > Duration::from_secs(2), "{min:?}..{max:?}");
    }

    /// The first wave of a hall that lost its broker: 200 agents with the
    /// default backoff (each its own random source, here one seeded source
    /// drawn 200 times) come back over the step's random half (125 to
    /// 250 ms), not in lock-step: no 40 ms holds half of them, and the
    /// wave spans at least 60 ms. (The system test of a node dying,
    /// `tests/tests/nats_cluster.rs`, prints the same figures as a real
    /// cluster accepted them.)
    #[test]
    fn the_first_wave_of_200_agents_is_spread_over_the_first_steps_half() {
        const AGENTS: usize = 200;
        let mut rng = StdRng::seed_from_u64(0x5eed);
        let mut waits: Vec<Duration> = (0..AGENTS)
            .map(|_| Backoff::default().next_wait(&mut rng))
            .collect();
        waits.sort();
        let (first, last) = (waits[0], waits[AGENTS - 1]);
        assert!(
            first >= Duration::from_millis(125) && last <= Duration::from_millis(250),
            "first wave {first:?}..{last:?} outside the first step's half (125 to 250 ms)"
        );
        let crowd = (0..AGENTS)
            .map(|i| {
                waits[i..]
                    .iter()
                    .take_while(|w| **w - waits[i] < Duration::from_millis(40))
                    .count()
            })
            .max()
            .unwrap_or(0);
        assert!(
            crowd < AGENTS / 2,
            "{crowd} of {AGENTS} agents come back within one 40 ms"
        );
        assert!(
            last - first >= Duration::from_millis(60),
            "the first wave of {AGENTS} agents spans only {:?}",
            last - first
        );
        eprintln!("first wave of {AGENTS}: {first:?} to {last:?}, at most {crowd} within 40 ms");
    }
}
