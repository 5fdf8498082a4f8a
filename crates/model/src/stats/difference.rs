//! The difference of two independent estimates, each known by its bounds, and when it is
//! news: the statistics of `allocscope diff`.
//!
//! A saved profile keeps each estimate with its bounds at the recording's confidence `C`,
//! skewed as the estimators made them (negative-binomial, gamma, log-normal). Each side is
//! read back as a normal with one standard error below and one above the estimate
//! (`(E − L)/z_C`, `(U − E)/z_C`); sums of stacks (a function's total) add the errors in
//! quadrature (stacks are sampled independently: disjoint blocks). The difference `D = N −
//! B` of two recordings (independent samples) is bounded by the method of variance
//! estimates recovery (MOVER, Zou & Donner 2008): below by `D − z √(N₋² + B₊²)`, above by
//! `D + z √(N₊² + B₋²)`, where `N₋` is the new side's error below and `B₊` the base
//! side's above — each direction uses the side of each estimate it moves towards, which
//! keeps the estimators' skew.
//!
//! **Many comparisons.** A diff compares hundreds of stacks; at 95% each, a few would be
//! "significant" by chance. The bounds use `z` for `1 − α/(2m)` over the `m` comparisons
//! made (Bonferroni): they hold *simultaneously* with probability at least `C`, so the
//! chance that any unchanged stack is flagged is at most `α = 1 − C` (the simulation
//! below measures it).

use super::Estimate;

/// An estimate as a diff reads it: the point and one standard error on each side.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    /// The estimate.
    pub estimate: f64,
    /// Standard error below it.
    pub below: f64,
    /// Standard error above it (infinite: unbounded).
    pub above: f64,
}

/// `z` for a two-sided interval at `confidence`.
pub fn z(confidence: f64) -> f64 {
    let tail = ((1.0 - confidence) / 2.0).clamp(1e-300, 0.5);
    super::memo::normal_quantile(1.0 - tail)
}

impl Spread {
    /// An estimate with bounds at `confidence`.
    pub fn of(estimate: &Estimate, confidence: f64) -> Spread {
        let z = z(confidence);
        Spread {
            estimate: estimate.estimate,
            below: ((estimate.estimate - estimate.lower) / z).max(0.0),
            above: ((estimate.upper - estimate.estimate) / z).max(0.0),
        }
    }

    /// Adds an independent estimate (a sum over disjoint stacks).
    pub fn add(&mut self, other: &Spread) {
        self.estimate += other.estimate;
        self.below = self.below.hypot(other.below);
        self.above = self.above.hypot(other.above);
    }

    /// Bounds at `confidence` again (`z` standard errors each side, the lower one not
    /// below zero): a single stack's own bounds, a sum's in quadrature.
    pub fn bounds(&self, confidence: f64) -> (f64, f64) {
        let z = z(confidence);
        (
            (self.estimate - z * self.below).max(0.0),
            self.estimate + z * self.above,
        )
    }

    /// Every field times `scale` (> 0): a rate from a total.
    pub fn scaled(self, scale: f64) -> Spread {
        Spread {
            estimate: self.estimate * scale,
            below: self.below * scale,
            above: self.above * scale,
        }
    }
}

/// The change from `base` to `new` with bounds at `confidence` over `comparisons`
/// simultaneous comparisons (Bonferroni); significant when they exclude zero.
pub fn change(base: &Spread, new: &Spread, confidence: f64, comparisons: usize) -> Change {
    let alpha = 1.0 - confidence;
    let z = z(1.0 - alpha / comparisons.max(1) as f64);
    let estimate = new.estimate - base.estimate;
    let lower = estimate - z * new.below.hypot(base.above);
    let upper = estimate + z * new.above.hypot(base.below);
    Change {
        estimate,
        lower,
        upper,
        significant: lower > 0.0 || upper < 0.0,
    }
}

/// A change with simultaneous bounds.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Change {
    /// New less base.
    pub estimate: f64,
    /// Lower bound.
    pub lower: f64,
    /// Upper bound (`null` in JSON when unbounded).
    #[serde(deserialize_with = "crate::schema::infinite_if_null")]
    pub upper: f64,
    /// The bounds exclude zero.
    pub significant: bool,
}

#[cfg(test)]
mod tests {
    use rand::{Rng as _, SeedableRng as _};
    use rand_pcg::Pcg64;

    use super::*;
    use crate::stats::{
        estimate::{SampleObs, Window},
        SampleSet,
    };

    #[test]
    fn a_change_uses_each_sides_error_towards_it() {
        let base = Spread {
            estimate: 100.0,
            below: 1.0,
            above: 3.0,
        };
        let new = Spread {
            estimate: 110.0,
            below: 4.0,
            above: 2.0,
        };
        let c = change(&base, &new, 0.95, 1);
        let z = 1.959_963_984_540_054;
        assert!((c.lower - (10.0 - z * 5.0)).abs() < 1e-9, "{c:?}");
        // Below: the new side's error below (4) and the base's above (3); above: 2 and 1.
        assert!((c.upper - (10.0 + z * 5f64.sqrt())).abs() < 1e-9, "{c:?}");
        assert!(c.significant);
        // Over 100 comparisons the bounds widen (z for 1 − 0.05/200).
        let wide = change(&base, &new, 0.95, 100);
        assert!(wide.lower < c.lower && !wide.significant, "{wide:?}");
        let mut sum = base;
        sum.add(&new);
        assert_eq!(sum.estimate, 210.0);
        assert!((sum.below - 17f64.sqrt()).abs() < 1e-12);
    }

    /// Samples of a workload of `objects` blocks of 64 to 4096 bytes at `interval`.
    fn recorded(rng: &mut Pcg64, objects: u64, interval: u64) -> SampleSet {
        let mut set = SampleSet::default();
        for i in 0..objects {
            let size = 64 << (i % 7);
            let obs = SampleObs {
                size,
                offset: 0,
                interval,
                weight: None,
            };
            if rng.random::<f64>() < obs.inclusion_probability() {
                set.add(obs);
            }
        }
        set
    }

    /// 20 stacks recorded twice: unchanged, at most 5% of diffs flag any of them (the
    /// stated level); one doubled and one removed are flagged.
    #[test]
    fn unchanged_stacks_are_flagged_at_most_at_the_stated_rate() {
        let mut rng = Pcg64::seed_from_u64(7);
        let (confidence, interval, runs) = (0.95, 64 * 1024, 200);
        let spread = |set: &SampleSet| {
            let e = set.estimate(confidence, Window::RECORDING, interval).bytes;
            Spread::of(&e, confidence)
        };
        let (mut any_false, mut found_doubled, mut found_removed) = (0, 0, 0);
        for _ in 0..runs {
            let stacks = 20;
            let mut flagged = Vec::new();
            for stack in 0..stacks {
                let objects = 8000 + 1000 * stack;
                let base = recorded(&mut rng, objects, interval);
                let new_objects = match stack {
                    0 => 2 * objects,
                    1 => 0,
                    _ => objects,
                };
                let new = recorded(&mut rng, new_objects, interval);
                if change(&spread(&base), &spread(&new), confidence, stacks as usize).significant {
                    flagged.push(stack);
                }
            }
            any_false += u32::from(flagged.iter().any(|&s| s > 1));
            found_doubled += u32::from(flagged.contains(&0));
            found_removed += u32::from(flagged.contains(&1));
        }
        let false_rate = f64::from(any_false) / f64::from(runs);
        eprintln!("false flags {false_rate}, doubled found {found_doubled}, removed {found_removed} of {runs}");
        assert!(false_rate <= 0.05, "false flags in {false_rate} of diffs");
        assert!(f64::from(found_doubled) / f64::from(runs) > 0.95);
        assert!(f64::from(found_removed) / f64::from(runs) > 0.95);
    }
}
