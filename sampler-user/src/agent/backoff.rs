//! When to try a sink again after a failure: exponential backoff with jitter.
//!
//! The wait doubles with each failure in a row from `base` up to `cap`, and is drawn
//! uniformly from the upper half of that ("equal jitter"): agents on many hosts that lost
//! the same store at once do not come back in step, and a wait is never shorter than half
//! its step, so a dead store is not hammered. Pure: the random word is given.

use std::time::Duration;

/// The backoff schedule of one sink.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    /// The first wait's step.
    pub base: Duration,
    /// The largest step.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The wait after `failures` failures in a row (1 for the first), with `random` a
    /// uniformly random word.
    pub fn wait(&self, failures: u32, random: u64) -> Duration {
        let doublings = failures.saturating_sub(1).min(32);
        let step = self
            .base
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.cap);
        let half = step / 2;
        let fraction = (random >> 11) as f64 / (1u64 << 53) as f64;
        half + half.mul_f64(fraction)
    }
}

/// A random word from the kernel (jitter).
pub(crate) fn random_word() -> u64 {
    let bytes = super::pyroscope::random_bytes();
    u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_within_their_upper_half() {
        let backoff = Backoff::default();
        for (failures, step) in [(1, 1), (2, 2), (3, 4), (7, 60), (100, 60)] {
            let step = Duration::from_secs(step);
            let low = backoff.wait(failures, 0);
            let high = backoff.wait(failures, u64::MAX);
            assert_eq!(low, step / 2, "failures {failures}");
            assert!(
                high <= step && high > step.mul_f64(0.99),
                "failures {failures}"
            );
        }
    }

    #[test]
    fn jitter_spreads_the_waits() {
        let backoff = Backoff::default();
        let waits: Vec<Duration> = (0..200).map(|_| backoff.wait(5, random_word())).collect();
        let (min, max) = (waits.iter().min().unwrap(), waits.iter().max().unwrap());
        assert!(*min >= Duration::from_secs(8) && *max <= Duration::from_secs(16));
        assert!(*max - *min > Duration::from_secs(4), "{min:?}..{max:?}");
    }
}
