//! Estimators of allocated bytes and objects from a set of samples, with bounds.
//!
//! Per sample `i`: size `n_i`, offset `o_i` of the successful byte, `u_i = n_i - o_i`, mean
//! interval `1/p_i`, inclusion probability `π_i = 1 - q_i^{n_i}` (the chance an object of
//! `n_i` bytes holds at least one successful trial).
//!
//! * bytes: Horvitz-Thompson `Σ n_i / π_i`, unbiased (.NET note, approach 1);
//! * objects: `Σ 1 / π_i`, unbiased by the same argument;
//! * bounds on bytes: the negative-binomial construction (.NET note, approach 2): the failed
//!   trials before the `s`-th success are `NegBin(s, p)`, so with `C` the confidence the
//!   bytes lie in `[Q(s, (1-C)/2) + u, Q(s, (1+C)/2) + u]`, `u = Σ u_i`. A window whose end
//!   does not fall on a sample (every recording: bytes after the last sample are unseen)
//!   takes the upper quantile at `s + 1`; one whose start does not takes the lower at `s - 1`.
//!   With mixed intervals the lower bound uses the smallest interval and the upper the
//!   largest, which can only widen the interval;
//! * bounds on objects: the byte bounds scaled by objects/bytes (exact for one object size).
//!
//! Zero samples estimate zero but keep a finite upper bound: "fewer than X bytes", not "none".

use super::negbin;

/// One sampled allocation, as the estimators need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleObs {
    /// Allocation size in bytes (≥ 1).
    pub size: u64,
    /// Offset of the successful byte, `< size`.
    pub offset: u64,
    /// Mean sampling interval in force (1/p), ≥ 1.
    pub interval: u64,
}

impl SampleObs {
    /// Probability that an allocation of `size` bytes is sampled: `1 - (1 - 1/interval)^size`.
    pub fn inclusion_probability(self) -> f64 {
        inclusion_probability(self.size, self.interval)
    }
}

/// `1 - (1 - 1/interval)^size`, computed without cancellation for tiny `1/interval`.
pub fn inclusion_probability(size: u64, interval: u64) -> f64 {
    if size == 0 || interval == 0 {
        return 0.0;
    }
    if interval == 1 {
        return 1.0;
    }
    let log_q = (-1.0 / interval as f64).ln_1p();
    -(size as f64 * log_q).exp_m1()
}

/// A number with its bounds, as every output shows it.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Estimate {
    /// Samples the estimate rests on.
    pub samples: u64,
    /// Point estimate (unbiased).
    pub estimate: f64,
    /// Lower bound at the chosen confidence.
    pub lower: f64,
    /// Upper bound at the chosen confidence.
    pub upper: f64,
}

/// Which ends of the estimation window coincide with a sample (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The window starts where every thread's countdown was freshly drawn (a recording's
    /// start: countdowns are drawn at the first allocation after attach).
    pub start_aligned: bool,
    /// The window ends right after a sample (never true for a recording).
    pub end_aligned: bool,
}

impl Window {
    /// A whole recording: fresh countdowns at the start, unseen bytes at the end.
    pub const RECORDING: Window = Window {
        start_aligned: true,
        end_aligned: false,
    };
}

/// Running sums over a set of samples: constant memory, order-independent, and removable
/// (a freed object's sample leaves exactly what it added).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SampleSet {
    samples: u64,
    weighted_bytes: f64,
    weighted_objects: f64,
    unseen_remainder: f64,
    min_interval: u64,
    max_interval: u64,
}

impl SampleSet {
    /// Adds one sample.
    pub fn add(&mut self, obs: SampleObs) {
        let pi = obs.inclusion_probability();
        if pi <= 0.0 {
            return;
        }
        self.samples += 1;
        self.weighted_bytes += obs.size as f64 / pi;
        self.weighted_objects += 1.0 / pi;
        self.unseen_remainder += obs.size.saturating_sub(obs.offset) as f64;
        self.min_interval = if self.samples == 1 {
            obs.interval
        } else {
            self.min_interval.min(obs.interval)
        };
        self.max_interval = self.max_interval.max(obs.interval);
    }

    /// Merges another set into this one.
    pub fn merge(&mut self, other: &SampleSet) {
        if other.samples == 0 {
            return;
        }
        self.min_interval = if self.samples == 0 {
            other.min_interval
        } else {
            self.min_interval.min(other.min_interval)
        };
        self.max_interval = self.max_interval.max(other.max_interval);
        self.samples += other.samples;
        self.weighted_bytes += other.weighted_bytes;
        self.weighted_objects += other.weighted_objects;
        self.unseen_remainder += other.unseen_remainder;
    }

    /// Number of samples.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Estimated bytes and objects with bounds at `confidence` (e.g. 0.95). `interval` is the
    /// mean interval to assume for an empty set's upper bound.
    pub fn estimate(&self, confidence: f64, window: Window, interval: u64) -> (Estimate, Estimate) {
        let tail = (1.0 - confidence.clamp(0.0, 1.0)) / 2.0;
        let (min_interval, max_interval) = if self.samples == 0 {
            (interval, interval)
        } else {
            (self.min_interval, self.max_interval)
        };
        let lower_samples = if window.start_aligned {
            self.samples
        } else {
            self.samples.saturating_sub(1)
        };
        let upper_samples = if window.end_aligned {
            self.samples
        } else {
            self.samples + 1
        };
        let failures = |samples: u64, interval: u64, alpha: f64| {
            if samples == 0 || tail <= 0.0 {
                0.0
            } else {
                negbin::quantile(samples, 1.0 / interval.max(1) as f64, alpha)
            }
        };
        let mut lower = failures(lower_samples, min_interval, tail) + self.unseen_remainder;
        let mut upper = failures(upper_samples, max_interval, 1.0 - tail) + self.unseen_remainder;
        if tail <= 0.0 {
            (lower, upper) = (self.unseen_remainder, f64::INFINITY);
        }
        let bytes = Estimate {
            samples: self.samples,
            estimate: self.weighted_bytes,
            lower,
            upper,
        };
        let per_byte = if self.weighted_bytes > 0.0 {
            self.weighted_objects / self.weighted_bytes
        } else {
            // No samples: at most one object per byte.
            1.0
        };
        let objects = Estimate {
            samples: self.samples,
            estimate: self.weighted_objects,
            lower: lower * per_byte,
            upper: upper * per_byte,
        };
        (bytes, objects)
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;

    use super::*;

    #[test]
    fn inclusion_probability_edges() {
        assert_eq!(inclusion_probability(0, 100), 0.0);
        assert_eq!(inclusion_probability(5, 1), 1.0);
        let p = inclusion_probability(1, 512 * 1024);
        assert!((p - 1.0 / (512.0 * 1024.0)).abs() < 1e-15);
        assert!(inclusion_probability(1 << 40, 1024) == 1.0);
    }

    #[test]
    fn weighted_estimates_on_known_samples() {
        let mut set = SampleSet::default();
        // Objects far bigger than the interval are always sampled: weight 1, exact. (Offsets
        // at the geometric mean, as they would be on average.)
        for _ in 0..10 {
            set.add(SampleObs {
                size: 1 << 30,
                offset: 1023,
                interval: 1024,
            });
        }
        let (bytes, objects) = set.estimate(0.95, Window::RECORDING, 1024);
        assert_eq!(bytes.samples, 10);
        assert!((bytes.estimate - 10.0 * (1u64 << 30) as f64).abs() < 1.0);
        assert!((objects.estimate - 10.0).abs() < 1e-9);
        assert!(bytes.lower <= bytes.estimate && bytes.estimate <= bytes.upper);
        // A 1-byte object at interval 1000 stands for 1000 bytes and 1000 objects.
        let mut small = SampleSet::default();
        small.add(SampleObs {
            size: 1,
            offset: 0,
            interval: 1000,
        });
        let (bytes, objects) = small.estimate(0.95, Window::RECORDING, 1000);
        assert!((bytes.estimate - 1000.0).abs() < 1e-6);
        assert!((objects.estimate - 1000.0).abs() < 1e-6);
    }

    #[test]
    fn zero_samples_have_an_upper_bound_not_a_zero() {
        let (bytes, objects) = SampleSet::default().estimate(0.95, Window::RECORDING, 102400);
        assert_eq!(bytes.estimate, 0.0);
        assert_eq!(bytes.lower, 0.0);
        // One more sample's 97.5% quantile (the .NET table, s = 1).
        assert!((bytes.upper - 377738.0).abs() < 400.0, "{}", bytes.upper);
        assert!(objects.upper > 0.0);
    }

    /// Simulates the per-byte Bernoulli model with a countdown (exactly what the kernel
    /// does) and checks unbiasedness and coverage of the byte bounds.
    #[test]
    fn simulated_recordings_are_unbiased_and_covered() {
        let interval = 4096u64;
        let p = 1.0 / interval as f64;
        let mut rng = Pcg64::seed_from_u64(7);
        let runs = 2000;
        let mut covered = 0;
        let mut sum_estimates = 0.0;
        let sizes = [16u64, 100, 3000, 20000];
        let mut truth = 0u64;
        for run in 0..runs {
            let mut set = SampleSet::default();
            let mut countdown = geometric(&mut rng, p);
            let mut total = 0u64;
            for i in 0..400 {
                let size = sizes[i % sizes.len()];
                total += size;
                if countdown < size {
                    set.add(SampleObs {
                        size,
                        offset: countdown,
                        interval,
                    });
                    countdown = geometric(&mut rng, p);
                } else {
                    countdown -= size;
                }
            }
            if run == 0 {
                truth = total;
            }
            let (bytes, _) = set.estimate(0.95, Window::RECORDING, interval);
            sum_estimates += bytes.estimate;
            if bytes.lower <= total as f64 && total as f64 <= bytes.upper {
                covered += 1;
            }
        }
        let mean = sum_estimates / runs as f64;
        let coverage = covered as f64 / runs as f64;
        assert!(
            (mean - truth as f64).abs() < 0.02 * truth as f64,
            "mean {mean} vs {truth}"
        );
        assert!((0.93..=0.995).contains(&coverage), "coverage {coverage}");
    }

    fn geometric(rng: &mut Pcg64, p: f64) -> u64 {
        let u: f64 = 1.0 - rng.random::<f64>();
        (u.ln() / (-p).ln_1p()).floor() as u64
    }
}
