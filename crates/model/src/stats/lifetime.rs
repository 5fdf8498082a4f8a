//! How long sampled blocks lived: the "temporary allocations" of a stack.
//!
//! Every sampled block whose free was seen has a lifetime (its free's timestamp less its
//! allocation's). Its sample goes into one of three classes by that lifetime, each a
//! [`SampleSet`], so each class's bytes and objects are estimated with the same unbiased
//! estimators and bounds as everything else; blocks still live form the fourth class
//! (the stack's live set). A class's *share* of the stack's bytes is `A / (A + R)`, `R` the
//! other classes together: increasing in `A`, decreasing in `R`, so with `A ∈ [A⁻, A⁺]` and
//! `R ∈ [R⁻, R⁺]` each at half the tail (Bonferroni) the share lies in `[A⁻/(A⁻ + R⁺),
//! A⁺/(A⁺ + R⁻)]` with at least the stated confidence: conservative, never too narrow.
//!
//! Quantiles of the lifetimes of the bytes freed are read from a histogram of
//! power-of-two buckets of microseconds, each sample weighted by the bytes it stands for:
//! a quantile is known to within its bucket (a factor of two), and is the bucket's upper
//! edge. They are point estimates only; the shares carry the bounds.

use super::{
    estimate::{Estimate, SampleObs, SampleSet, Window},
    growth::bytes_terms,
};

/// Lifetime classes' upper edges: freed within 1 ms, within 1 s; later.
pub const CLASS_EDGES_NS: [u64; 2] = [1_000_000, 1_000_000_000];

/// Buckets of the lifetime histogram: bucket `j` holds lifetimes in `[2^j, 2^(j+1))` µs
/// (bucket 0 also everything shorter), up to 2^40 µs (12 days) and beyond in the last.
pub const HISTOGRAM_BUCKETS: usize = 41;

/// A stack's freed sampled blocks by lifetime.
#[derive(Clone, Debug, PartialEq)]
pub struct Lifetimes {
    /// Freed within 1 ms, within 1 s (not 1 ms), later.
    pub classes: [SampleSet; 3],
    /// Bytes freed per power-of-two bucket of microseconds.
    histogram: [f64; HISTOGRAM_BUCKETS],
}

impl Default for Lifetimes {
    fn default() -> Self {
        Lifetimes {
            classes: [SampleSet::default(); 3],
            histogram: [0.0; HISTOGRAM_BUCKETS],
        }
    }
}

/// The class of a lifetime.
fn class(lifetime_ns: u64) -> usize {
    CLASS_EDGES_NS
        .iter()
        .position(|&edge| lifetime_ns < edge)
        .unwrap_or(CLASS_EDGES_NS.len())
}

/// The histogram bucket of a lifetime.
fn bucket(lifetime_ns: u64) -> usize {
    let micros = lifetime_ns / 1000;
    if micros == 0 {
        return 0;
    }
    (micros.ilog2() as usize).min(HISTOGRAM_BUCKETS - 1)
}

impl Lifetimes {
    /// A sampled block lived `lifetime_ns`.
    pub fn add(&mut self, obs: SampleObs, lifetime_ns: u64) {
        self.classes[class(lifetime_ns)].add(obs);
        self.histogram[bucket(lifetime_ns)] += bytes_terms(obs).0;
    }

    /// Adds another's (a process's lifetimes are its stacks').
    pub fn merge(&mut self, other: &Lifetimes) {
        for (class, theirs) in self.classes.iter_mut().zip(&other.classes) {
            class.merge(theirs);
        }
        for (bucket, theirs) in self.histogram.iter_mut().zip(&other.histogram) {
            *bucket += theirs;
        }
    }

    /// Sampled blocks whose frees were seen.
    pub fn samples(&self) -> u64 {
        self.classes.iter().map(SampleSet::samples).sum()
    }

    /// The `q` quantile (0–1) of the freed bytes' lifetimes, in seconds: the upper edge of
    /// its bucket (`None`: nothing freed).
    pub fn quantile_seconds(&self, q: f64) -> Option<f64> {
        let total: f64 = self.histogram.iter().sum();
        if total <= 0.0 {
            return None;
        }
        let target = q.clamp(0.0, 1.0) * total;
        let mut cumulative = 0.0;
        for (j, bytes) in self.histogram.iter().enumerate() {
            cumulative += bytes;
            if cumulative >= target && *bytes > 0.0 {
                return Some((1u64 << (j + 1)) as f64 * 1e-6);
            }
        }
        Some((1u64 << HISTOGRAM_BUCKETS) as f64 * 1e-6)
    }

    /// Each class's share of the bytes of all blocks, freed or `live`, with conservative
    /// bounds at `confidence` (see the module doc); `interval` bounds an empty set.
    pub fn shares(&self, live: &SampleSet, confidence: f64, interval: u64) -> [Estimate; 4] {
        let sets = [self.classes[0], self.classes[1], self.classes[2], *live];
        let halved = 1.0 - (1.0 - confidence) / 2.0;
        let bytes = |set: &SampleSet| set.estimate(halved, Window::RECORDING, interval).bytes;
        let point = |set: &SampleSet| set.horvitz_thompson().bytes;
        let total: f64 = sets.iter().map(point).sum();
        std::array::from_fn(|i| {
            let mut rest = SampleSet::default();
            for (j, set) in sets.iter().enumerate() {
                if j != i {
                    rest.merge(set);
                }
            }
            let (part, others) = (bytes(&sets[i]), bytes(&rest));
            let ratio = |a: f64, b: f64| if a + b > 0.0 { a / (a + b) } else { 0.0 };
            let estimate = if total > 0.0 {
                point(&sets[i]) / total
            } else {
                0.0
            };
            Estimate {
                samples: sets[i].samples(),
                estimate,
                lower: ratio(part.lower, others.upper).min(estimate),
                upper: ratio(part.upper, others.lower).max(estimate),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng as _, SeedableRng as _};
    use rand_pcg::Pcg64;

    use super::*;

    fn obs(size: u64, interval: u64) -> SampleObs {
        SampleObs {
            size,
            offset: 0,
            interval,
            weight: None,
        }
    }

    #[test]
    fn lifetimes_fall_into_classes_and_buckets() {
        assert_eq!(class(999_999), 0);
        assert_eq!(class(1_000_000), 1);
        assert_eq!(class(999_999_999), 1);
        assert_eq!(class(5_000_000_000), 2);
        assert_eq!(bucket(500), 0);
        assert_eq!(bucket(1500), 0);
        assert_eq!(bucket(2500), 1);
        assert_eq!(bucket(u64::MAX), HISTOGRAM_BUCKETS - 1);
        let mut lifetimes = Lifetimes::default();
        assert_eq!(lifetimes.quantile_seconds(0.5), None);
        // Every block sampled (interval 1): 3 bytes at ~50 µs, 1 byte at ~3 s.
        lifetimes.add(obs(3, 1), 50_000);
        lifetimes.add(obs(1, 1), 3_000_000_000);
        assert_eq!(lifetimes.samples(), 2);
        // 50 µs is in [32, 64) µs: its edge 64 µs.
        assert_eq!(lifetimes.quantile_seconds(0.5), Some(64e-6));
        assert_eq!(lifetimes.quantile_seconds(0.75), Some(64e-6));
        let q99 = lifetimes.quantile_seconds(0.99).unwrap();
        assert!((2.0..=4.2).contains(&q99), "{q99}");
        let shares = lifetimes.shares(&SampleSet::default(), 0.95, 1);
        assert_eq!(shares[0].estimate, 0.75);
        assert_eq!(shares[2].estimate, 0.25);
        assert_eq!(shares[3].estimate, 0.0);
    }

    /// Over simulated recordings of a stack whose bytes are 50% freed within 1 ms, 30%
    /// within a second, 20% still live: the share estimates are unbiased and the bounds
    /// hold the truth in at least 95% of runs.
    #[test]
    fn shares_are_unbiased_and_their_bounds_cover() {
        let mut rng = Pcg64::seed_from_u64(1);
        let (runs, interval) = (500, 4096);
        let sizes = [64u64, 512, 3000];
        let (mut covered, mut sums) = ([0u32; 4], [0.0; 4]);
        for _ in 0..runs {
            let (mut lifetimes, mut live) = (Lifetimes::default(), SampleSet::default());
            let mut truth = [0.0; 4];
            for i in 0..20_000u64 {
                let size = sizes[(i % 3) as usize];
                let roll = rng.random::<f64>();
                let which = if roll < 0.5 {
                    0
                } else if roll < 0.8 {
                    1
                } else {
                    3
                };
                truth[which] += size as f64;
                let o = obs(size, interval);
                if rng.random::<f64>() >= o.inclusion_probability() {
                    continue;
                }
                match which {
                    0 => lifetimes.add(o, 200_000),
                    1 => lifetimes.add(o, 200_000_000),
                    _ => live.add(o),
                }
            }
            let total: f64 = truth.iter().sum();
            for (i, share) in lifetimes.shares(&live, 0.95, interval).iter().enumerate() {
                let t = truth[i] / total;
                covered[i] += u32::from(share.lower <= t && t <= share.upper);
                sums[i] += share.estimate;
            }
        }
        for (i, expected) in [0.5, 0.3, 0.0, 0.2].iter().enumerate() {
            let coverage = f64::from(covered[i]) / f64::from(runs);
            assert!(coverage >= 0.95, "class {i}: coverage {coverage}");
            let mean = sums[i] / f64::from(runs);
            assert!((mean - expected).abs() < 0.01, "class {i}: mean {mean}");
        }
    }
}
