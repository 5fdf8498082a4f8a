//! Estimators of allocated (or live) bytes and objects from a set of samples, with bounds.
//!
//! Per sample `i`: size `n_i`, offset `o_i` of the successful byte, `u_i = n_i - o_i`, mean
//! interval `1/p_i`, inclusion probability `π_i = 1 - q_i^{n_i}` (the chance that an object
//! of `n_i` bytes holds at least one successful trial). Objects are included independently:
//! whether one is sampled depends only on its own bytes' trials.
//!
//! * bytes: Horvitz-Thompson `Σ n_i / π_i`, unbiased (.NET note, approach 1), with the
//!   unbiased variance estimate `Σ n_i² (1 - π_i) / π_i²`;
//! * objects: `Σ 1 / π_i`, variance `Σ (1 - π_i) / π_i²`;
//! * the trials estimate `Σ q_i/p_i + Σ u_i` (.NET note, approach 2; `s·q/p + u` for one
//!   interval), exported for comparison;
//! * bounds on bytes, negative-binomial construction (.NET note): the failed trials before
//!   the `s`-th success are `NegBin(s, p)`, so the bytes lie in
//!   `[Q((1-C)/2) + u, Q((1+C)/2) + u]`. Samples drawn under different intervals each
//!   contribute their own failure mean `q_i/p_i` and variance `q_i/p_i²`; the sum is
//!   matched by a negative binomial of the same two moments (exact when all intervals
//!   agree). A window whose end does not fall on a sample (a recording's end, any sliding
//!   window) adds one sample at the largest interval to the upper bound; one whose start
//!   does not removes one sample from the lower bound;
//! * with at least [`NORMAL_MIN_SAMPLES`] samples the normal interval from the
//!   Horvitz-Thompson variance is used instead when it is narrower (objects much larger
//!   than the interval are nearly always sampled, and their bytes nearly exact);
//! * bounds on objects: the weighted sum `Σ w_i` (`w_i = 1/π_i`) is a sum of rare weighted
//!   events, for which Fay and Feuer's gamma interval (Statistics in Medicine, 1997) is the
//!   standard conservative construction: lower at the `(1-C)/2` quantile of the gamma with
//!   the estimate's mean and variance, upper at the `(1+C)/2` quantile of the gamma whose
//!   mean and variance include one more event of the largest weight seen;
//! * every lower bound is at least what was seen: `Σ n_i` bytes and `s` objects.
//!
//! Samples another program's allocator took and weighed (`otel_memory:alloc(ptr, size,
//! weight)`, the weight being the bytes the sample stands for: the number of times its
//! countdown reached zero in the block times its mean interval) are estimated by their
//! weights: bytes `Σ w_i`, objects `Σ w_i / n_i`, both unbiased when the producer's
//! countdown crossings are a Poisson process (a block of `n` bytes is crossed `k ~
//! Poisson(n/T)` times). Each sample is a weighted rare event, so their bounds are Fay and
//! Feuer's gamma interval with the variance estimate `Σ w_i²` (`Σ (w_i/n_i)²` for objects)
//! and one more event of the largest weight seen on the upper side: conservative when one
//! sample stands for several crossings (`(kT)²` over-counts the `kT²` of `k` events). A
//! set holding both kinds sums the two estimates and bounds each part at half the tail
//! (Bonferroni).
//!
//! Zero samples estimate zero but keep a finite upper bound: "fewer than X bytes", not
//! "none". The posterior view of jemalloc #1751 is [`Posterior`].

pub use crate::schema::{Estimate, Posterior};

use super::negbin;

/// From this many samples on, the normal interval may replace the negative-binomial one.
pub const NORMAL_MIN_SAMPLES: u64 = 100;

/// One sampled allocation, as the estimators need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleObs {
    /// Allocation size in bytes (≥ 1).
    pub size: u64,
    /// Offset of the successful byte, `< size`.
    pub offset: u64,
    /// Mean sampling interval in force (1/p), ≥ 1.
    pub interval: u64,
    /// `Some`: another program's sampling allocator took the sample and stated the bytes it
    /// stands for (`otel_memory:alloc`'s weight); `offset` and `interval` are then unknown
    /// and the sample is estimated by its weight ([`SampleSet`]'s weighted part).
    pub weight: Option<u64>,
}

impl SampleObs {
    /// Probability that an allocation of `size` bytes is sampled: `1 - (1 - 1/interval)^size`.
    pub fn inclusion_probability(self) -> f64 {
        inclusion_probability(self.size, self.interval)
    }

    /// The bytes it stands for in a Horvitz-Thompson sum: its weight, or `size / π`.
    pub fn weighted_bytes(self) -> f64 {
        match self.weight {
            Some(weight) => weight as f64,
            None => {
                let pi = self.inclusion_probability();
                if pi > 0.0 {
                    self.size as f64 / pi
                } else {
                    0.0
                }
            }
        }
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
    /// A window cut out of a running recording (rates): neither end on a sample.
    pub const SLIDING: Window = Window {
        start_aligned: false,
        end_aligned: false,
    };
}

/// Estimated bytes and objects of one set of samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimates {
    /// Bytes (Horvitz-Thompson), with bounds.
    pub bytes: Estimate,
    /// Objects, with bounds.
    pub objects: Estimate,
    /// The trials estimate of bytes, `Σ q_i/p_i + Σ u_i`.
    pub bytes_by_trials: f64,
}

/// See [`SampleSet::horvitz_thompson`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HorvitzThompson {
    /// `Σ n_i / π_i`.
    pub bytes: f64,
    /// `Σ n_i² (1 - π_i) / π_i²`.
    pub bytes_variance: f64,
    /// `Σ 1 / π_i`.
    pub objects: f64,
    /// `Σ (1 - π_i) / π_i²`.
    pub objects_variance: f64,
    /// `Σ n_i`.
    pub sampled_bytes: f64,
}

/// Running sums over a set of samples: constant memory, order-independent, and removable
/// (a freed object's sample takes back exactly what it added).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SampleSet {
    samples: u64,
    sampled_bytes: f64,
    weighted_bytes: f64,
    weighted_objects: f64,
    variance_bytes: f64,
    variance_objects: f64,
    max_object_weight: f64,
    unseen_remainder: f64,
    failure_mean: f64,
    failure_variance: f64,
    max_interval: u64,
    weighted: WeightedSums,
}

/// Running sums over the samples another program's allocator weighed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct WeightedSums {
    samples: u64,
    /// `Σ n_i`.
    sampled_bytes: f64,
    /// `Σ w_i`.
    bytes: f64,
    /// `Σ w_i²`.
    bytes_variance: f64,
    /// `Σ w_i / n_i`.
    objects: f64,
    /// `Σ (w_i / n_i)²`.
    objects_variance: f64,
    /// Largest `w_i` and `w_i / n_i` seen (kept on removal: only widens the upper bound).
    max_bytes_weight: f64,
    max_object_weight: f64,
}

impl WeightedSums {
    fn apply(&mut self, size: u64, weight: u64, sign: f64) {
        let (n, w) = (size.max(1) as f64, weight as f64);
        if sign > 0.0 {
            self.samples += 1;
            self.max_bytes_weight = self.max_bytes_weight.max(w);
            self.max_object_weight = self.max_object_weight.max(w / n);
        } else {
            self.samples = self.samples.saturating_sub(1);
        }
        self.sampled_bytes += sign * n;
        self.bytes += sign * w;
        self.bytes_variance += sign * w * w;
        self.objects += sign * w / n;
        self.objects_variance += sign * (w / n) * (w / n);
    }

    fn merge(&mut self, other: &WeightedSums) {
        self.samples += other.samples;
        self.sampled_bytes += other.sampled_bytes;
        self.bytes += other.bytes;
        self.bytes_variance += other.bytes_variance;
        self.objects += other.objects;
        self.objects_variance += other.objects_variance;
        self.max_bytes_weight = self.max_bytes_weight.max(other.max_bytes_weight);
        self.max_object_weight = self.max_object_weight.max(other.max_object_weight);
    }

    /// Bytes and objects with Fay-Feuer bounds, `tail` outside each end.
    fn estimate(&self, tail: f64) -> (Estimate, Estimate) {
        let bounded = |estimate: f64, variance: f64, max: f64, seen: f64| {
            let (lower, upper) = gamma_interval(estimate, variance, max, tail);
            Estimate {
                samples: self.samples,
                estimate,
                lower: lower.max(seen).min(estimate),
                upper: upper.max(estimate),
            }
        };
        (
            bounded(
                self.bytes,
                self.bytes_variance,
                self.max_bytes_weight,
                self.sampled_bytes,
            ),
            bounded(
                self.objects,
                self.objects_variance,
                self.max_object_weight,
                self.samples as f64,
            ),
        )
    }
}

impl SampleSet {
    /// Adds one sample.
    pub fn add(&mut self, obs: SampleObs) {
        self.apply(obs, 1.0);
    }

    /// Removes a sample added before (its object was freed): exactly undoes [`Self::add`].
    pub fn remove(&mut self, obs: SampleObs) {
        if let Some(weight) = obs.weight {
            if self.weighted.samples > 0 {
                self.weighted.apply(obs.size, weight, -1.0);
                if self.weighted.samples == 0 {
                    self.weighted = WeightedSums {
                        max_bytes_weight: self.weighted.max_bytes_weight,
                        max_object_weight: self.weighted.max_object_weight,
                        ..WeightedSums::default()
                    };
                }
            }
            return;
        }
        if self.samples == 0 {
            return;
        }
        self.apply(obs, -1.0);
        if self.samples == 0 {
            // Drop floating-point residue: an empty set is exactly empty.
            *self = SampleSet {
                max_interval: self.max_interval,
                max_object_weight: self.max_object_weight,
                weighted: self.weighted,
                ..SampleSet::default()
            };
        }
    }

    /// Adds `count` samples of `size` bytes drawn at `interval` whose remainders
    /// `size - offset` sum to `unseen`: samples known only by these sums (those the kernel
    /// could not deliver). Every sum the estimators use is linear in the samples, so this is
    /// exactly `count` calls of [`Self::add`].
    pub fn add_many(&mut self, size: u64, interval: u64, count: u64, unseen: u64) {
        if count > 0 {
            self.apply_many(size, interval, count as f64, unseen as f64);
        }
    }

    fn apply(&mut self, obs: SampleObs, sign: f64) {
        if let Some(weight) = obs.weight {
            self.weighted.apply(obs.size, weight, sign);
            return;
        }
        let unseen = obs.size.saturating_sub(obs.offset) as f64;
        self.apply_many(obs.size, obs.interval, sign, sign * unseen);
    }

    /// Adds (`count` > 0) or removes (`count` < 0) `|count|` samples of `size` at
    /// `interval`, their remainders summing to `unseen` (signed like `count`).
    fn apply_many(&mut self, size: u64, interval: u64, count: f64, unseen: f64) {
        let pi = inclusion_probability(size, interval);
        if pi <= 0.0 {
            return;
        }
        let n = size as f64;
        let p = 1.0 / interval as f64;
        let q = 1.0 - p;
        if count > 0.0 {
            self.samples += count as u64;
            self.max_interval = self.max_interval.max(interval);
            // Kept on removal: a larger "one more event" only widens the upper bound.
            self.max_object_weight = self.max_object_weight.max(1.0 / pi);
        } else {
            self.samples -= (-count) as u64;
        }
        self.sampled_bytes += count * n;
        self.weighted_bytes += count * n / pi;
        self.weighted_objects += count / pi;
        self.variance_bytes += count * n * n * (1.0 - pi) / (pi * pi);
        self.variance_objects += count * (1.0 - pi) / (pi * pi);
        self.unseen_remainder += unseen;
        self.failure_mean += count * q / p;
        self.failure_variance += count * q / (p * p);
    }

    /// Merges another set into this one.
    pub fn merge(&mut self, other: &SampleSet) {
        self.samples += other.samples;
        self.sampled_bytes += other.sampled_bytes;
        self.weighted_bytes += other.weighted_bytes;
        self.weighted_objects += other.weighted_objects;
        self.variance_bytes += other.variance_bytes;
        self.variance_objects += other.variance_objects;
        self.max_object_weight = self.max_object_weight.max(other.max_object_weight);
        self.unseen_remainder += other.unseen_remainder;
        self.failure_mean += other.failure_mean;
        self.failure_variance += other.failure_variance;
        self.max_interval = self.max_interval.max(other.max_interval);
        self.weighted.merge(&other.weighted);
    }

    /// Number of samples.
    pub fn samples(&self) -> u64 {
        self.samples + self.weighted.samples
    }

    /// The Horvitz-Thompson sums: estimates of bytes and objects, their variance
    /// estimates, and the bytes seen (for estimators built on top, allocscope-engine's `duty`).
    pub fn horvitz_thompson(&self) -> HorvitzThompson {
        HorvitzThompson {
            bytes: self.weighted_bytes,
            bytes_variance: self.variance_bytes,
            objects: self.weighted_objects,
            objects_variance: self.variance_objects,
            sampled_bytes: self.sampled_bytes,
        }
    }

    /// The point estimate of the bytes behind these samples, both kinds (the weighted
    /// ones' weights too), without bounds.
    pub fn estimated_bytes(&self) -> f64 {
        self.weighted_bytes + self.weighted.bytes
    }

    /// The jemalloc #1751 posterior of the bytes behind these samples; `interval` stands in
    /// when the set is empty.
    pub fn posterior(&self, interval: u64) -> Posterior {
        let s = self.samples as f64;
        let p = if self.samples == 0 {
            1.0 / interval.max(1) as f64
        } else {
            // Σ 1/p_i = Σ (q_i/p_i + 1).
            s / (self.failure_mean + s)
        };
        let bytes_to_sample = (self.unseen_remainder - s).max(0.0);
        Posterior {
            bytes_sampled: self.samples,
            bytes_to_sample,
            p,
            mean: bytes_to_sample + s / p + (1.0 / p - 1.0),
            variance: (s + 1.0) * (1.0 - p) / (p * p),
        }
    }

    /// Estimates with bounds at `confidence` (e.g. 0.95) over a window of the given kind;
    /// `interval` is the mean interval assumed for an empty set's upper bound.
    pub fn estimate(&self, confidence: f64, window: Window, interval: u64) -> Estimates {
        let tail = (1.0 - confidence.clamp(0.0, 1.0)) / 2.0;
        if self.weighted.samples == 0 {
            return self.own_estimate(tail, window, interval);
        }
        if self.samples == 0 {
            let (bytes, objects) = self.weighted.estimate(tail);
            return Estimates {
                bytes,
                objects,
                bytes_by_trials: bytes.estimate,
            };
        }
        // Both kinds: each part bounded at half the tail, the bounds summed (Bonferroni).
        let own = self.own_estimate(tail / 2.0, window, interval);
        let (bytes, objects) = self.weighted.estimate(tail / 2.0);
        let sum = |a: Estimate, b: Estimate| Estimate {
            samples: a.samples + b.samples,
            estimate: a.estimate + b.estimate,
            lower: a.lower + b.lower,
            upper: a.upper + b.upper,
        };
        Estimates {
            bytes: sum(own.bytes, bytes),
            objects: sum(own.objects, objects),
            bytes_by_trials: own.bytes_by_trials + bytes.estimate,
        }
    }

    /// [`Self::estimate`] of the samples allocscope's countdown drew, `tail` outside each
    /// end.
    fn own_estimate(&self, tail: f64, window: Window, interval: u64) -> Estimates {
        let (mut lower, mut upper) = self.negbin_bounds(tail, window, interval);
        let z = if tail > 0.0 {
            super::memo::normal_quantile(1.0 - tail)
        } else {
            f64::INFINITY
        };
        let normal = |estimate: f64, variance: f64| {
            let half = z * variance.max(0.0).sqrt();
            (estimate - half, estimate + half)
        };
        // Not when a larger interval was in force than any sample's: the normal interval
        // has no room for what it hid (see `negbin_bounds`).
        let use_normal = self.samples >= NORMAL_MIN_SAMPLES && interval <= self.max_interval;
        if use_normal {
            let (normal_lower, normal_upper) = normal(self.weighted_bytes, self.variance_bytes);
            if normal_upper - normal_lower < upper - lower {
                (lower, upper) = (normal_lower, normal_upper);
            }
        }
        // Never below what was seen; always around the estimate (widening is always safe).
        let lower = lower.max(self.sampled_bytes).min(self.weighted_bytes);
        let bytes = Estimate {
            samples: self.samples,
            estimate: self.weighted_bytes,
            lower,
            upper: upper.max(self.weighted_bytes),
        };
        let (objects_lower, objects_upper) = if self.samples == 0 {
            // Nothing seen: at most one object per byte that could hide.
            (0.0, bytes.upper)
        } else {
            gamma_interval(
                self.weighted_objects,
                self.variance_objects,
                self.max_object_weight,
                tail,
            )
        };
        let objects_lower = objects_lower
            .max(self.samples as f64)
            .min(self.weighted_objects);
        let objects = Estimate {
            samples: self.samples,
            estimate: self.weighted_objects,
            lower: objects_lower,
            upper: objects_upper.max(self.weighted_objects),
        };
        Estimates {
            bytes,
            objects,
            bytes_by_trials: self.failure_mean + self.unseen_remainder,
        }
    }

    /// Negative-binomial bounds on bytes, moment-matched over the samples' intervals.
    fn negbin_bounds(&self, tail: f64, window: Window, interval: u64) -> (f64, f64) {
        if tail <= 0.0 {
            return (self.unseen_remainder, f64::INFINITY);
        }
        let s = self.samples as f64;
        let (mean, variance) = (self.failure_mean, self.failure_variance);
        // Lower: one sample fewer when the window starts mid-countdown (its average share).
        let lower_moments = if window.start_aligned || self.samples == 0 {
            (mean, variance)
        } else {
            let keep = (s - 1.0) / s;
            (mean * keep, variance * keep)
        };
        // Upper: one more sample, at the largest interval, when the window ends mid-countdown;
        // the largest in force, not only among the samples: a countdown cut short when the
        // interval changed (the throttle lowering it) hid up to one of its own, and a phase
        // at a larger interval may have left no sample at all (a quiet process's first
        // second at 512 KiB before the throttle lowered it to 5 KiB: its megabyte was
        // outside 99.99% bounds drawn from the 5 KiB samples alone).
        let extra = if self.samples == 0 {
            interval
        } else {
            self.max_interval.max(interval)
        }
        .max(1) as f64;
        let upper_moments = if window.end_aligned {
            (mean, variance)
        } else {
            let p = 1.0 / extra;
            (mean + (1.0 - p) / p, variance + (1.0 - p) / (p * p))
        };
        let lower = failures_quantile(lower_moments, tail) + self.unseen_remainder;
        let upper = failures_quantile(upper_moments, 1.0 - tail) + self.unseen_remainder;
        (lower, upper)
    }
}

/// Fay-Feuer gamma interval for a weighted sum of rare events: `estimate` with variance
/// `variance`, largest single weight `max_weight`, `tail` probability outside each end.
fn gamma_interval(estimate: f64, variance: f64, max_weight: f64, tail: f64) -> (f64, f64) {
    if tail <= 0.0 {
        return (0.0, f64::INFINITY);
    }
    // shape = mean²/variance, scale = variance/mean. Quantiles come from the unit-scale
    // gamma ([`super::gamma`]) times the scale, which is exact. A huge shape is a normal
    // distribution for every practical purpose (and strains the gamma's numerics), and so
    // is the fallback.
    let z = super::memo::normal_quantile(1.0 - tail);
    let quantile = |mean: f64, variance: f64, alpha: f64| -> f64 {
        if mean <= 0.0 {
            return 0.0;
        }
        let normal = || {
            let half = z * variance.sqrt();
            if alpha < 0.5 {
                mean - half
            } else {
                mean + half
            }
        };
        let shape = mean * mean / variance;
        if !shape.is_finite() || shape > 1e6 {
            return normal();
        }
        Some(super::gamma::quantile(shape, alpha) * variance / mean)
            .filter(|q| q.is_finite())
            .unwrap_or_else(normal)
    };
    let variance = variance.max(0.0);
    let lower = quantile(estimate, variance, tail);
    let upper = quantile(
        estimate + max_weight,
        variance + max_weight * max_weight,
        1.0 - tail,
    );
    (lower, upper)
}

/// Quantile of the negative binomial with the given failure mean and variance
/// (`p = mean/variance`, `r = mean·p/(1-p)`): `NegBin(s, p)` itself when every sample had
/// interval `1/p`.
fn failures_quantile((mean, variance): (f64, f64), alpha: f64) -> f64 {
    if !(mean > 0.0 && variance > mean) {
        // No failures expected (no samples, or every byte sampled).
        return 0.0;
    }
    let p = mean / variance;
    let successes = mean * p / (1.0 - p);
    negbin::quantile(successes, p, alpha)
}

#[cfg(test)]
mod json_tests {
    use super::Estimate;

    #[test]
    fn an_unbounded_estimate_survives_json() {
        let e = Estimate {
            samples: 3,
            estimate: 10.0,
            lower: 2.0,
            upper: f64::INFINITY,
        };
        let text = serde_json::to_string(&e).unwrap();
        assert!(text.contains("\"upper\":null"), "{text}");
        let back: Estimate = serde_json::from_str(&text).unwrap();
        assert_eq!(back, e);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn many_samples_by_their_sums_equal_each_added() {
        let mut one_by_one = SampleSet::default();
        let offsets = [3u64, 4000, 77, 12_000];
        for &offset in &offsets {
            one_by_one.add(SampleObs {
                size: 16_384,
                offset,
                interval: 4096,
                weight: None,
            });
        }
        let mut by_sums = SampleSet::default();
        let unseen: u64 = offsets.iter().map(|o| 16_384 - o).sum();
        by_sums.add_many(16_384, 4096, offsets.len() as u64, unseen);
        by_sums.add_many(99, 4096, 0, 0);
        assert_eq!(by_sums.samples(), one_by_one.samples());
        let (a, b) = (
            one_by_one.estimate(0.95, Window::RECORDING, 4096),
            by_sums.estimate(0.95, Window::RECORDING, 4096),
        );
        for (x, y) in [
            (a.bytes.estimate, b.bytes.estimate),
            (a.bytes.lower, b.bytes.lower),
            (a.bytes.upper, b.bytes.upper),
            (a.objects.upper, b.objects.upper),
            (a.bytes_by_trials, b.bytes_by_trials),
        ] {
            assert!((x - y).abs() <= 1e-9 * x.abs(), "{x} vs {y}");
        }
    }

    #[test]
    fn inclusion_probability_edges() {
        assert_eq!(inclusion_probability(0, 100), 0.0);
        assert_eq!(inclusion_probability(5, 1), 1.0);
        let p = inclusion_probability(1, 512 * 1024);
        assert!((p - 1.0 / (512.0 * 1024.0)).abs() < 1e-15);
        assert!(inclusion_probability(1 << 40, 1024) == 1.0);
    }

    /// Samples only at a small interval, in a recording where a larger one was in force
    /// (the throttle lowered it): the upper bound leaves room for what the larger one hid.
    #[test]
    fn a_larger_interval_in_force_widens_the_upper_bound() {
        let mut set = SampleSet::default();
        for _ in 0..500 {
            set.add(SampleObs {
                size: 4096,
                offset: 2048,
                interval: 5 << 10,
                weight: None,
            });
        }
        let alone = set.estimate(0.9999, Window::RECORDING, 5 << 10);
        let lowered = set.estimate(0.9999, Window::RECORDING, 512 << 10);
        assert_eq!(alone.bytes.estimate, lowered.bytes.estimate);
        assert!(lowered.bytes.lower <= alone.bytes.lower);
        // A megabyte at 512 KiB without a sample is within the upper bound.
        assert!(
            lowered.bytes.upper >= alone.bytes.estimate + (1 << 20) as f64,
            "{:?} vs {:?}",
            lowered.bytes,
            alone.bytes
        );
        assert!(alone.bytes.upper < alone.bytes.estimate + (1 << 20) as f64);
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
                weight: None,
            });
        }
        let e = set.estimate(0.95, Window::RECORDING, 1024);
        assert_eq!(e.bytes.samples, 10);
        assert!((e.bytes.estimate - 10.0 * (1u64 << 30) as f64).abs() < 1.0);
        assert!((e.objects.estimate - 10.0).abs() < 1e-9);
        assert!(e.bytes.lower <= e.bytes.estimate && e.bytes.estimate <= e.bytes.upper);
        assert!(
            e.objects.lower >= 10.0,
            "at least the objects seen: {:?}",
            e.objects
        );
        // A 1-byte object at interval 1000 stands for 1000 bytes and 1000 objects.
        let mut small = SampleSet::default();
        small.add(SampleObs {
            size: 1,
            offset: 0,
            interval: 1000,
            weight: None,
        });
        let e = small.estimate(0.95, Window::RECORDING, 1000);
        assert!((e.bytes.estimate - 1000.0).abs() < 1e-6);
        assert!((e.objects.estimate - 1000.0).abs() < 1e-6);
        // Trials estimate s·q/p + u = 999 + 1.
        assert!((e.bytes_by_trials - 1000.0).abs() < 1e-9);
    }

    /// The .NET worked example: 8 samples, u = 10908, p = 1/102400, aligned window:
    /// bounds [353666 + 10908, 1476870 + 10908].
    #[test]
    fn reproduces_the_dotnet_interval() {
        let mut set = SampleSet::default();
        let offsets = [0u64, 100, 200, 300, 400, 500, 600, 700];
        let sizes = [1000u64, 1500, 1200, 1400, 1600, 1800, 2000, 3208];
        let u: u64 = sizes.iter().zip(offsets).map(|(n, o)| n - o).sum();
        assert_eq!(u, 10908);
        for (size, offset) in sizes.into_iter().zip(offsets) {
            set.add(SampleObs {
                size,
                offset,
                interval: 102400,
                weight: None,
            });
        }
        let aligned = Window {
            start_aligned: true,
            end_aligned: true,
        };
        let e = set.estimate(0.95, aligned, 102400);
        assert!(
            (e.bytes.lower - (353666.0 + 10908.0)).abs() < 0.001 * 364574.0,
            "{:?}",
            e.bytes
        );
        assert!(
            (e.bytes.upper - (1476870.0 + 10908.0)).abs() < 0.001 * 1487778.0,
            "{:?}",
            e.bytes
        );
        // Unaligned ends widen: lower as if 7 samples, upper as if 9.
        let sliding = set.estimate(0.95, Window::SLIDING, 102400);
        assert!(sliding.bytes.lower < e.bytes.lower && sliding.bytes.upper > e.bytes.upper);
        assert!((sliding.bytes.upper - (1614137.0 + 10908.0)).abs() < 0.001 * 1625045.0);
    }

    /// Another producer's samples: a countdown with exponential gaps of mean `T` runs over
    /// a stream of blocks; a block the countdown reaches zero in `k` times is reported with
    /// weight `k·T`. Over many runs the weighted estimates of bytes and objects are
    /// unbiased and their 95% bounds hold the truth at least 95% of the time (the
    /// construction is conservative), also with half the blocks freed (removed again).
    #[test]
    fn producer_weights_are_unbiased_and_their_bounds_calibrated() {
        use rand::{Rng as _, SeedableRng as _};
        let mut rng = rand_pcg::Pcg64::seed_from_u64(23);
        const T: f64 = 65536.0;
        // Mixed sizes: far below, near and above the interval.
        let sizes = [64u64, 256, 4096, 40_000, 300_000];
        let counts = [4000u64, 2000, 300, 40, 6];
        let truth_bytes: f64 = sizes.iter().zip(&counts).map(|(s, c)| (s * c) as f64).sum();
        let truth_objects: f64 = counts.iter().sum::<u64>() as f64;
        let runs = 2000;
        let (mut bytes_sum, mut objects_sum) = (0.0, 0.0);
        let (mut bytes_held, mut objects_held, mut live_held) = (0, 0, 0);
        for _ in 0..runs {
            let mut countdown = -T * rng.random::<f64>().max(f64::MIN_POSITIVE).ln();
            let mut set = SampleSet::default();
            let mut live = SampleSet::default();
            let mut live_truth = 0.0;
            for (&size, &count) in sizes.iter().zip(&counts) {
                for i in 0..count {
                    countdown -= size as f64;
                    let mut k = 0u64;
                    while countdown <= 0.0 {
                        k += 1;
                        countdown -= T * rng.random::<f64>().max(f64::MIN_POSITIVE).ln();
                    }
                    let freed = i % 2 == 0;
                    if !freed {
                        live_truth += size as f64;
                    }
                    if k == 0 {
                        continue;
                    }
                    let obs = SampleObs {
                        size,
                        offset: 0,
                        interval: 0,
                        weight: Some(k * T as u64),
                    };
                    set.add(obs);
                    live.add(obs);
                    if freed {
                        live.remove(obs);
                    }
                }
            }
            let e = set.estimate(0.95, Window::RECORDING, 512 * 1024);
            bytes_sum += e.bytes.estimate;
            objects_sum += e.objects.estimate;
            bytes_held += u32::from(e.bytes.lower <= truth_bytes && truth_bytes <= e.bytes.upper);
            objects_held +=
                u32::from(e.objects.lower <= truth_objects && truth_objects <= e.objects.upper);
            let l = live.estimate(0.95, Window::RECORDING, 512 * 1024).bytes;
            live_held += u32::from(l.lower <= live_truth && live_truth <= l.upper);
        }
        let mean_bytes = bytes_sum / runs as f64;
        let mean_objects = objects_sum / runs as f64;
        assert!(
            (mean_bytes / truth_bytes - 1.0).abs() < 0.01,
            "bytes: mean {mean_bytes} vs {truth_bytes}"
        );
        assert!(
            (mean_objects / truth_objects - 1.0).abs() < 0.02,
            "objects: mean {mean_objects} vs {truth_objects}"
        );
        let coverage = |held: u32| f64::from(held) / runs as f64;
        assert!(
            coverage(bytes_held) >= 0.94,
            "bytes covered {}",
            coverage(bytes_held)
        );
        assert!(
            coverage(objects_held) >= 0.94,
            "objects covered {}",
            coverage(objects_held)
        );
        assert!(
            coverage(live_held) >= 0.94,
            "live covered {}",
            coverage(live_held)
        );
    }

    /// A set holding both kinds sums the two estimates, each part bounded at half the tail.
    #[test]
    fn own_and_producer_samples_add_up() {
        let ours = SampleObs {
            size: 100,
            offset: 10,
            interval: 1000,
            weight: None,
        };
        let theirs = SampleObs {
            size: 100,
            offset: 0,
            interval: 0,
            weight: Some(5000),
        };
        let (mut a, mut b, mut both) = (
            SampleSet::default(),
            SampleSet::default(),
            SampleSet::default(),
        );
        a.add(ours);
        b.add(theirs);
        both.add(ours);
        both.add(theirs);
        let w = Window::RECORDING;
        let (ea, eb, e) = (
            a.estimate(0.95, w, 1000),
            b.estimate(0.95, w, 1000),
            both.estimate(0.95, w, 1000),
        );
        assert_eq!(e.bytes.samples, 2);
        assert!((e.bytes.estimate - ea.bytes.estimate - 5000.0).abs() < 1e-6);
        assert_eq!(eb.bytes.estimate, 5000.0);
        assert!(e.bytes.lower <= ea.bytes.lower + eb.bytes.lower);
        assert!(e.bytes.upper >= ea.bytes.upper + eb.bytes.upper);
        both.remove(theirs);
        assert_eq!(both.estimate(0.95, w, 1000).bytes, ea.bytes);
    }

    #[test]
    fn zero_samples_have_an_upper_bound_not_a_zero() {
        let e = SampleSet::default().estimate(0.95, Window::RECORDING, 102400);
        assert_eq!(e.bytes.estimate, 0.0);
        assert_eq!(e.bytes.lower, 0.0);
        // One more sample's 97.5% quantile (the .NET table, s = 1).
        assert!(
            (e.bytes.upper - 377738.0).abs() < 400.0,
            "{}",
            e.bytes.upper
        );
        assert!(e.objects.upper > 0.0);
    }

    /// 111 samples of 64-byte objects at a 64 KiB interval (seen in a real recording): the
    /// object interval must hold the 128000 true objects' neighbourhood, not collapse.
    #[test]
    fn object_bounds_at_large_weights() {
        let mut set = SampleSet::default();
        for i in 0..111 {
            set.add(SampleObs {
                size: 64,
                offset: i % 64,
                interval: 65536,
                weight: None,
            });
        }
        let e = set.estimate(0.9999, Window::RECORDING, 65536);
        let (lower, upper) = (e.objects.lower, e.objects.upper);
        assert!(
            lower < 0.7 * e.objects.estimate && upper > 1.4 * e.objects.estimate,
            "{e:?}"
        );
        let (unit_lower, unit_upper) = gamma_interval(111.0, 111.0, 1.0, 0.025);
        // Gamma(111, 1): 2.5% and 97.5% quantiles near 91.3 and 132.6 (+ one event).
        assert!((unit_lower - 91.31).abs() < 0.01 && (unit_upper - 133.6).abs() < 0.5);
    }

    #[test]
    fn removing_undoes_adding() {
        let a = SampleObs {
            size: 100,
            offset: 3,
            interval: 4096,
            weight: None,
        };
        let b = SampleObs {
            size: 70000,
            offset: 900,
            interval: 65536,
            weight: None,
        };
        let mut set = SampleSet::default();
        set.add(a);
        let only_a = set;
        set.add(b);
        set.remove(b);
        assert_eq!(set.samples(), 1);
        assert!((set.weighted_bytes - only_a.weighted_bytes).abs() < 1e-6);
        set.remove(a);
        assert_eq!(
            set.estimate(0.95, Window::RECORDING, 4096).bytes.estimate,
            0.0
        );
        // Removing from an empty set (a free of an unknown sample) changes nothing.
        set.remove(a);
        assert_eq!(set.samples(), 0);
    }

    #[test]
    fn posterior_matches_jemalloc_formulas() {
        let mut set = SampleSet::default();
        for _ in 0..4 {
            set.add(SampleObs {
                size: 10,
                offset: 2,
                interval: 1000,
                weight: None,
            });
        }
        let posterior = set.posterior(1000);
        assert_eq!(posterior.bytes_sampled, 4);
        assert!((posterior.p - 0.001).abs() < 1e-12);
        assert!((posterior.bytes_to_sample - 28.0).abs() < 1e-9); // 4 × (8 - 1)
        assert!((posterior.mean - (28.0 + 4000.0 + 999.0)).abs() < 1e-6);
        assert!((posterior.variance - 5.0 * 0.999 / 1e-6).abs() < 1e-3);
    }

    #[test]
    fn mixed_intervals_reduce_to_one_interval_when_equal_and_stay_valid() {
        let mut uniform = SampleSet::default();
        let mut split = SampleSet::default();
        for i in 0..20 {
            let obs = SampleObs {
                size: 64,
                offset: i % 64,
                interval: 8192,
                weight: None,
            };
            uniform.add(obs);
            split.add(obs);
        }
        let e = uniform.estimate(0.95, Window::RECORDING, 8192);
        // Same samples added in two halves: identical sums, identical bounds.
        assert_eq!(split.estimate(0.95, Window::RECORDING, 8192), e);
        // Half of the samples at 4× the interval: each stands for 4× the bytes.
        let mut mixed = SampleSet::default();
        for i in 0..20 {
            let interval = if i % 2 == 0 { 8192 } else { 32768 };
            mixed.add(SampleObs {
                size: 64,
                offset: i % 64,
                interval,
                weight: None,
            });
        }
        let m = mixed.estimate(0.95, Window::RECORDING, 8192);
        assert!((m.bytes.estimate / e.bytes.estimate - 2.5).abs() < 0.01);
        assert!(m.bytes.lower < m.bytes.estimate && m.bytes.estimate < m.bytes.upper);
    }

    fn arbitrary_obs() -> impl Strategy<Value = SampleObs> {
        (
            1u64..=1 << 36,
            0.0f64..1.0,
            prop_oneof![Just(1u64), 2u64..=1 << 30, Just(1 << 30)],
        )
            .prop_map(|(size, fraction, interval)| SampleObs {
                size,
                // At interval 1 every byte succeeds: the first one is the sample.
                offset: if interval == 1 {
                    0
                } else {
                    ((size as f64 * fraction) as u64).min(size - 1)
                },
                interval,
                weight: None,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// No NaN or infinity, ordered bounds, lower ≥ what was seen, for any samples.
        #[test]
        fn estimates_are_finite_and_ordered(
            samples in prop::collection::vec(arbitrary_obs(), 0..40),
            confidence in 0.5f64..0.9999,
        ) {
            let mut set = SampleSet::default();
            for obs in &samples {
                set.add(*obs);
            }
            for window in [Window::RECORDING, Window::SLIDING] {
                let e = set.estimate(confidence, window, 4096);
                for value in [e.bytes.estimate, e.bytes.lower, e.bytes.upper, e.objects.estimate,
                              e.objects.lower, e.objects.upper, e.bytes_by_trials] {
                    prop_assert!(value.is_finite() && value >= 0.0, "{e:?}");
                }
                prop_assert!(e.bytes.lower <= e.bytes.estimate && e.bytes.estimate <= e.bytes.upper);
                prop_assert!(
                    e.objects.lower <= e.objects.estimate && e.objects.estimate <= e.objects.upper
                );
                let seen: f64 = samples.iter().map(|o| o.size as f64).sum();
                prop_assert!(e.bytes.lower >= seen * (1.0 - 1e-12));
                prop_assert!(e.bytes.estimate >= seen * (1.0 - 1e-12));
            }
            let posterior = set.posterior(4096);
            prop_assert!(posterior.mean.is_finite() && posterior.variance.is_finite());
        }

        /// More samples never lower the estimate; higher confidence never narrows bounds.
        #[test]
        fn monotone_in_samples_and_confidence(
            samples in prop::collection::vec(arbitrary_obs(), 1..30),
            extra in arbitrary_obs(),
        ) {
            let mut set = SampleSet::default();
            for obs in &samples {
                set.add(*obs);
            }
            let before = set.estimate(0.95, Window::RECORDING, 4096);
            let wider = set.estimate(0.99, Window::RECORDING, 4096);
            prop_assert!(wider.bytes.lower <= before.bytes.lower * (1.0 + 1e-9));
            prop_assert!(wider.bytes.upper >= before.bytes.upper * (1.0 - 1e-9));
            set.add(extra);
            let after = set.estimate(0.95, Window::RECORDING, 4096);
            prop_assert!(after.bytes.estimate >= before.bytes.estimate);
            prop_assert!(after.objects.estimate >= before.objects.estimate);
        }

        /// Sets merged from many (up to ~2,000 samples of one size, at any interval) keep
        /// finite, ordered bounds.
        #[test]
        fn merged_sample_sets_keep_finite_bounds(
            count in 1_000_000u64..5_000_000,
            interval in 1u64..=1 << 30,
        ) {
            // Tens of millions of samples at up to 1 GiB: failures beyond 2⁵³, where the
            // quantile search once never ended.
            let mut set = SampleSet::default();
            set.add_many(1, interval, count, count);
            let mut big = SampleSet::default();
            for _ in 0..20 {
                big.merge(&set);
            }
            let e = big.estimate(0.95, Window::RECORDING, interval);
            prop_assert!(e.bytes.lower.is_finite() && e.bytes.upper.is_finite());
            prop_assert!(e.bytes.lower <= e.bytes.estimate && e.bytes.estimate <= e.bytes.upper);
        }
    }
}
