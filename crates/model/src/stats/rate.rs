//! Allocation rates over sliding windows (bytes/s, objects/s), with bounds.
//!
//! Samples go into fixed-width time buckets; a rate merges the buckets inside the window and
//! estimates with [`super::estimate::Window::SLIDING`] (neither end of a window falls on a
//! sample, so the bounds widen by one sample at each end), divided by the window's length.
//! Memory is bounded by the number of buckets kept. Time is passed in: no clock is read
//! here.

use std::collections::VecDeque;

#[cfg(test)]
use super::estimate::{Estimate, Window};
use super::estimate::{SampleObs, SampleSet};

/// Rates over one window (what `top` computes from [`RateTracker::window`] for merged
/// groups; kept whole here for the tests of the estimator).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    /// Bytes per second.
    pub bytes_per_second: Estimate,
    /// Objects per second.
    pub objects_per_second: Estimate,
    /// Seconds the rates cover (shorter than asked while the recording is young).
    pub seconds: f64,
}

/// Samples bucketed by time, for rates over the last few seconds or minutes.
#[derive(Clone, Debug)]
pub struct RateTracker {
    bucket_ns: u64,
    capacity: usize,
    start_ns: Option<u64>,
    /// (bucket number since the epoch of the timestamps, samples in it), oldest first.
    buckets: VecDeque<(u64, SampleSet)>,
}

impl RateTracker {
    /// Buckets of `bucket_ns` nanoseconds, keeping at most `capacity` of them.
    pub fn new(bucket_ns: u64, capacity: usize) -> RateTracker {
        RateTracker {
            bucket_ns: bucket_ns.max(1),
            capacity: capacity.max(1),
            start_ns: None,
            buckets: VecDeque::new(),
        }
    }

    /// Notes that observation started at `now_ns` (rates never cover time before it).
    pub fn start(&mut self, now_ns: u64) {
        self.start_ns.get_or_insert(now_ns);
    }

    /// Adds a sample taken at `timestamp_ns`. Samples older than the kept buckets are ignored.
    pub fn add(&mut self, timestamp_ns: u64, obs: SampleObs) {
        self.start(timestamp_ns);
        let bucket = timestamp_ns / self.bucket_ns;
        match self.buckets.iter_mut().rev().find(|(b, _)| *b == bucket) {
            Some((_, set)) => set.add(obs),
            None => {
                if self.buckets.back().is_some_and(|(last, _)| *last > bucket) {
                    return; // Out of order and too old to place: only the ring buffer reorders
                            // this much, and it never does across buckets.
                }
                let mut set = SampleSet::default();
                set.add(obs);
                self.buckets.push_back((bucket, set));
                while self.buckets.len() > self.capacity {
                    self.buckets.pop_front();
                }
            }
        }
    }

    /// Rates over the `window_ns` before `now_ns`.
    #[cfg(test)]
    pub fn rates(&self, now_ns: u64, window_ns: u64, confidence: f64, interval: u64) -> Rates {
        let (set, seconds) = self.window(now_ns, window_ns);
        let e = set.estimate(confidence, Window::SLIDING, interval);
        Rates {
            bytes_per_second: e.bytes.per_second(seconds),
            objects_per_second: e.objects.per_second(seconds),
            seconds,
        }
    }

    /// The samples of the `window_ns` before `now_ns` (whole buckets) and the seconds they
    /// cover, for callers that merge several trackers before estimating (estimate the merged
    /// set with [`super::estimate::Window::SLIDING`]).
    pub fn window(&self, now_ns: u64, window_ns: u64) -> (SampleSet, f64) {
        let (first_bucket, seconds) = self.coverage(now_ns, window_ns);
        let mut set = SampleSet::default();
        for (_, bucket) in self.buckets.iter().filter(|(b, _)| *b >= first_bucket) {
            set.merge(bucket);
        }
        (set, seconds)
    }

    /// The first bucket inside the window, and the seconds from its start (or the start of
    /// observation) to `now_ns`: every tracker with the same bucket width and start covers
    /// the same time.
    pub fn coverage(&self, now_ns: u64, window_ns: u64) -> (u64, f64) {
        let start = self.start_ns.unwrap_or(now_ns);
        let from = now_ns.saturating_sub(window_ns).max(start);
        let first_bucket = from / self.bucket_ns;
        let covered_from = (first_bucket * self.bucket_ns).max(start);
        (
            first_bucket,
            now_ns.saturating_sub(covered_from) as f64 / 1e9,
        )
    }
}

#[cfg(test)]
mod tests {
    use rand::{RngCore as _, SeedableRng as _};
    use rand_pcg::Pcg64;
    use sampler_common::geometric;

    use super::*;

    /// A steady 1 MB/s of 64-byte objects for 20 s: the 5 s rate is unbiased and its bounds
    /// hold the true rate in at least 93% of runs (sliding windows widen them, so coverage
    /// sits at or above nominal).
    #[test]
    fn steady_rate_is_estimated_within_bounds() {
        let interval = 4096;
        let scale = geometric::scale_q32(interval).unwrap();
        let mut rng = Pcg64::seed_from_u64(11);
        let (size, per_second, seconds) = (64u64, 1_000_000u64, 20u64);
        let objects_per_second = per_second / size;
        let step_ns = 1_000_000_000 / objects_per_second;
        let runs = 500;
        let (mut covered, mut sum) = (0, 0.0);
        for _ in 0..runs {
            let mut tracker = RateTracker::new(1_000_000_000, 60);
            tracker.start(0);
            let mut countdown = geometric::draw(rng.next_u64(), scale);
            for i in 0..objects_per_second * seconds {
                if countdown < size {
                    tracker.add(
                        i * step_ns,
                        SampleObs {
                            size,
                            offset: countdown,
                            interval,
                            weight: None,
                        },
                    );
                    countdown = geometric::draw(rng.next_u64(), scale);
                } else {
                    countdown -= size;
                }
            }
            let now = seconds * 1_000_000_000;
            let rates = tracker.rates(now, 5_000_000_000, 0.95, interval);
            assert!((rates.seconds - 5.0).abs() < 1e-9);
            let truth = per_second as f64;
            let r = rates.bytes_per_second;
            sum += r.estimate;
            covered += u32::from(r.lower <= truth && truth <= r.upper);
        }
        let mean = sum / runs as f64;
        assert!((mean / 1e6 - 1.0).abs() < 0.01, "mean rate {mean}");
        let coverage = f64::from(covered) / runs as f64;
        assert!((0.93..=1.0).contains(&coverage), "coverage {coverage}");
    }

    #[test]
    fn young_recordings_and_old_buckets() {
        let mut tracker = RateTracker::new(1_000_000_000, 3);
        tracker.start(0);
        let obs = SampleObs {
            size: 10,
            offset: 0,
            interval: 1,
            weight: None,
        };
        tracker.add(500_000_000, obs);
        // Half a second recorded: the rate covers half a second, not the whole window.
        let r = tracker.rates(500_000_000, 10_000_000_000, 0.95, 1);
        assert!((r.seconds - 0.5).abs() < 1e-9);
        assert!((r.bytes_per_second.estimate - 20.0).abs() < 1e-9);
        // Buckets beyond capacity are forgotten.
        for second in 1..10 {
            tracker.add(second * 1_000_000_000, obs);
        }
        assert_eq!(tracker.buckets.len(), 3);
        // No samples in the window: zero with an upper bound.
        let empty = tracker.rates(100_000_000_000, 1_000_000_000, 0.95, 4096);
        assert_eq!(empty.bytes_per_second.estimate, 0.0);
        assert!(empty.bytes_per_second.upper > 0.0);
    }
}
