//! Totals from time-sampled slots: the estimator for duty cycling (`--max-overhead`,
//! issue #15), where probes are attached in some time slots only and a target pays nothing
//! in the others.
//!
//! **Design: one slot on per stratum.** Time is cut into strata of `m_h` slots (`m_h`
//! chosen before the stratum starts, from anything seen before: a controller's choice);
//! exactly one slot of each stratum, drawn uniformly, is on. A slot's inclusion
//! probability is `1/m_h`, and a burst longer than a stratum cannot be skipped wholesale,
//! as it can when each slot is switched on independently (that design's estimator is
//! unbiased too, but when the on slots mostly miss a burst its estimate and its variance
//! estimate are low together: in the simulation below its 95% bounds held the truth in
//! 86–91% of runs, whatever interval was put around it).
//!
//! * total: `T̂ = Σ_h T̂_h`, `T̂_h = m_h Ŷ_h`, where `Ŷ_h` is the on slot's byte-sampling
//!   estimate (unbiased), so each `T̂_h` is unbiased for its stratum;
//! * variance, collapsed strata (Cochran, *Sampling Techniques*, §5A.12): with one unit
//!   per stratum there is no within-stratum variance to estimate, so consecutive strata
//!   are grouped in pairs (the last group a triple when their number is odd) and each
//!   group of `g` adds `g/(g-1) Σ (T̂_h - T̄)²`. Its expectation is the true variance (the
//!   byte sampling's included, as it is inside each `T̂_h`) plus the spread of the
//!   strata's true totals within groups: conservative, by as much as the rate changes
//!   from one stratum to the next;
//! * strata of one slot (always on) are certain: they add their byte-sampling variance
//!   only;
//! * bounds: Student's t with as many degrees of freedom as groups, on the log scale
//!   (`T̂ e^{±t s}`, `s² = ln(1 + V̂/T̂²)`): the estimate is skewed right (a short burst
//!   caught in an on slot is weighted `m`-fold).
//!
//! No stratum with a slot on (none at all) bounds nothing: the upper bound is infinite.

use statrs::distribution::{ContinuousCDF as _, StudentsT};

use super::estimate::Estimate;

/// What one stratum's on slot observed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlotTotal {
    /// The slot's byte-sampling estimate `Ŷ` (unbiased).
    pub estimate: f64,
    /// Its variance estimate.
    pub variance: f64,
    /// What was seen for sure (sampled bytes, exact calls): the lower bound's floor.
    pub seen: f64,
    /// Samples it rests on.
    pub samples: u64,
}

/// A total over strata with one slot on each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DutyTotal {
    estimate: f64,
    /// Collapsed-strata variance of the groups before the last pair.
    grouped_variance: f64,
    groups: u64,
    /// The last complete pair of sampled strata's `T̂_h`, and a stratum not paired yet.
    last_pair: Option<(f64, f64)>,
    pending: Option<f64>,
    /// Byte-sampling variance of the certain strata (one slot, always on).
    certain_variance: f64,
    seen: f64,
    samples: u64,
    strata: u64,
    seconds: f64,
    on_seconds: f64,
}

impl DutyTotal {
    /// Adds a stratum of `slots` slots of `slot_seconds` each, one of which was on and
    /// observed `on`.
    pub fn add_stratum(&mut self, slots: u32, slot_seconds: f64, on: SlotTotal) {
        let m = f64::from(slots.max(1));
        self.strata += 1;
        self.seconds += m * slot_seconds;
        self.on_seconds += slot_seconds;
        self.seen += on.seen;
        self.samples += on.samples;
        let total = m * on.estimate;
        self.estimate += total;
        if slots <= 1 {
            self.certain_variance += on.variance;
            return;
        }
        match self.pending.take() {
            None => self.pending = Some(total),
            Some(first) => {
                if let Some((a, b)) = self.last_pair.replace((first, total)) {
                    self.grouped_variance += group_variance(&[a, b]);
                    self.groups += 1;
                }
            }
        }
    }

    /// Share of the time observed.
    pub fn coverage(&self) -> f64 {
        if self.seconds > 0.0 {
            self.on_seconds / self.seconds
        } else {
            0.0
        }
    }

    /// The collapsed-strata variance estimate, and its degrees of freedom (groups).
    fn variance(&self) -> (f64, u64) {
        let (tail, groups) = match (self.last_pair, self.pending) {
            (Some((a, b)), Some(c)) => (group_variance(&[a, b, c]), 1),
            (Some((a, b)), None) => (group_variance(&[a, b]), 1),
            // A single sampled stratum: nothing to compare it with.
            (None, Some(_)) => (f64::INFINITY, 1),
            (None, None) => (0.0, 0),
        };
        (
            self.grouped_variance + tail + self.certain_variance,
            self.groups + groups,
        )
    }

    /// The total with bounds at `confidence`.
    pub fn estimate(&self, confidence: f64) -> Estimate {
        let tail = (1.0 - confidence.clamp(0.0, 1.0)) / 2.0;
        if self.strata == 0 {
            return Estimate {
                samples: 0,
                estimate: 0.0,
                lower: 0.0,
                upper: 0.0,
            };
        }
        let (variance, groups) = self.variance();
        let (lower, upper) = if tail <= 0.0 || !variance.is_finite() {
            (0.0, f64::INFINITY)
        } else if variance <= 0.0 {
            (self.estimate, self.estimate)
        } else if self.estimate <= 0.0 {
            // Every on slot saw nothing, yet strata differ in their byte-sampling noise only
            // if something was seen: keep the normal upper end.
            (0.0, variance.sqrt() * 3.0)
        } else {
            let freedom = groups.max(1) as f64;
            let t = StudentsT::new(0.0, 1.0, freedom)
                .map(|t| t.inverse_cdf(1.0 - tail))
                .unwrap_or(f64::INFINITY);
            let log_sd = (variance / (self.estimate * self.estimate)).ln_1p().sqrt();
            let factor = (t * log_sd).exp();
            (self.estimate / factor, self.estimate * factor)
        };
        Estimate {
            samples: self.samples,
            estimate: self.estimate,
            lower: lower.max(self.seen).min(self.estimate),
            upper: upper.max(self.estimate),
        }
    }
}

/// `g/(g-1) Σ (x - x̄)²` over a group of `g` strata totals.
fn group_variance(totals: &[f64]) -> f64 {
    let g = totals.len() as f64;
    let mean = totals.iter().sum::<f64>() / g;
    g / (g - 1.0) * totals.iter().map(|x| (x - mean).powi(2)).sum::<f64>()
}

#[cfg(test)]
mod tests {
    use rand::{Rng as _, SeedableRng as _};
    use rand_pcg::Pcg64;

    use super::*;
    use crate::stats::estimate::inclusion_probability;

    const SIZE: u64 = 64;
    const INTERVAL: u64 = 16 * 1024;

    /// Samples among `objects` allocations each sampled with probability `pi` (binomial,
    /// drawn by geometric gaps).
    fn sampled(rng: &mut Pcg64, objects: u64, pi: f64) -> u64 {
        let log_q = (1.0 - pi).ln();
        let (mut at, mut hits) = (0u64, 0u64);
        loop {
            let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
            at += (u.ln() / log_q).floor() as u64 + 1;
            if at > objects {
                return hits;
            }
            hits += 1;
        }
    }

    /// Simulates `runs` duty-cycled recordings of a workload making `objects(slot)`
    /// allocations of 64 bytes per slot; the stratum size after a stratum whose on slot
    /// saw more than `busy` objects is `busy_m`, else `calm_m`. Returns (mean estimate /
    /// truth, share of runs whose 95% bounds held the truth, mean width / truth).
    fn simulate(
        runs: u32,
        slots: u64,
        objects: impl Fn(u64) -> u64,
        (calm_m, busy_m, busy): (u32, u32, f64),
    ) -> (f64, f64, f64) {
        let pi = inclusion_probability(SIZE, INTERVAL);
        let truth: f64 = (0..slots).map(|s| (objects(s) * SIZE) as f64).sum();
        let mut rng = Pcg64::seed_from_u64(15);
        let (mut ratio, mut held, mut width) = (0.0, 0u32, 0.0);
        for _ in 0..runs {
            let mut total = DutyTotal::default();
            let (mut start, mut m) = (0u64, calm_m);
            while start < slots {
                let size = u64::from(m).min(slots - start) as u32;
                let on = start + rng.random_range(0..u64::from(size));
                let k = sampled(&mut rng, objects(on), pi);
                let n = SIZE as f64;
                let slot = SlotTotal {
                    estimate: k as f64 * n / pi,
                    variance: k as f64 * n * n * (1.0 - pi) / (pi * pi),
                    seen: k as f64 * n,
                    samples: k,
                };
                total.add_stratum(size, 0.5, slot);
                m = if slot.estimate / n > busy {
                    busy_m
                } else {
                    calm_m
                };
                start += u64::from(size);
            }
            let e = total.estimate(0.95);
            ratio += e.estimate / truth;
            held += u32::from(e.lower <= truth && truth <= e.upper);
            width += (e.upper - e.lower) / truth;
        }
        let runs = f64::from(runs);
        (ratio / runs, f64::from(held) / runs, width / runs)
    }

    /// A ramp, a burst 5× the base, a quiet stretch; the controller samples less after
    /// busy strata (one slot in 10 instead of 4).
    #[test]
    fn bursty_workload_under_a_controller() {
        let objects = |s: u64| {
            let base = 2_000 + 20 * s;
            match s {
                60..=79 => 5 * base,
                120..=149 => base / 10,
                _ => base,
            }
        };
        let (ratio, held, width) = simulate(1000, 200, objects, (4, 10, 8_000.0));
        eprintln!("bursty: estimate/truth {ratio:.4}, held {held:.3}, width {width:.3}");
        assert!(
            (ratio - 1.0).abs() < 0.02,
            "mean estimate / truth {ratio:.4}"
        );
        assert!(
            (0.93..=0.995).contains(&held),
            "95% bounds held the truth in {held:.3}"
        );
        assert!(width < 0.8, "mean width {width:.3} of the truth");
    }

    /// A steady rate: the bounds are about as wide as they need be.
    #[test]
    fn steady_workload() {
        let (ratio, held, width) = simulate(1000, 200, |_| 5_000, (5, 5, f64::INFINITY));
        eprintln!("steady: estimate/truth {ratio:.4}, held {held:.3}, width {width:.3}");
        assert!(
            (ratio - 1.0).abs() < 0.01,
            "mean estimate / truth {ratio:.4}"
        );
        assert!(
            (0.93..=0.99).contains(&held),
            "95% bounds held the truth in {held:.3}"
        );
        assert!(width < 0.2, "mean width {width:.3} of the truth");
    }

    /// Short bursts (one slot in 25 at 20× the base), shorter than a stratum.
    #[test]
    fn short_bursts() {
        let objects = |s: u64| if s % 25 == 7 { 60_000 } else { 3_000 };
        let (ratio, held, width) = simulate(1000, 400, objects, (5, 5, f64::INFINITY));
        eprintln!("short bursts: estimate/truth {ratio:.4}, held {held:.3}, width {width:.3}");
        assert!(
            (ratio - 1.0).abs() < 0.03,
            "mean estimate / truth {ratio:.4}"
        );
        assert!(
            (0.90..=0.995).contains(&held),
            "95% bounds held the truth in {held:.3}"
        );
    }

    #[test]
    fn always_on_is_the_byte_sampling_estimate() {
        let mut total = DutyTotal::default();
        let slot = SlotTotal {
            estimate: 1000.0,
            variance: 400.0,
            seen: 100.0,
            samples: 10,
        };
        total.add_stratum(1, 1.0, slot);
        total.add_stratum(1, 1.0, slot);
        assert_eq!(total.variance(), (800.0, 0));
        assert_eq!(total.coverage(), 1.0);
        let e = total.estimate(0.95);
        assert_eq!(e.estimate, 2000.0);
        assert!(e.lower >= 200.0 && e.lower < 2000.0 && e.upper > 2000.0);
    }

    #[test]
    fn one_sampled_stratum_bounds_nothing() {
        let mut total = DutyTotal::default();
        assert_eq!(total.estimate(0.95).upper, 0.0);
        let slot = SlotTotal {
            estimate: 10.0,
            variance: 1.0,
            seen: 5.0,
            samples: 1,
        };
        total.add_stratum(4, 1.0, slot);
        let e = total.estimate(0.95);
        assert_eq!(e.estimate, 40.0);
        assert!(e.upper.is_infinite());
        assert_eq!(total.coverage(), 0.25);
    }

    #[test]
    fn collapsed_groups() {
        assert_eq!(group_variance(&[1.0, 3.0]), 2.0 * 2.0);
        let mut total = DutyTotal::default();
        for estimate in [1.0, 3.0, 5.0, 5.0, 2.0] {
            let slot = SlotTotal {
                estimate,
                variance: 0.0,
                seen: 0.0,
                samples: 1,
            };
            total.add_stratum(2, 1.0, slot);
        }
        // Strata totals 2, 6, 10, 10, 4: the pair (2, 6), then the triple (10, 10, 4).
        let (variance, groups) = total.variance();
        assert_eq!(groups, 2);
        assert!(
            (variance - (group_variance(&[2.0, 6.0]) + group_variance(&[10.0, 10.0, 4.0]))).abs()
                < 1e-9
        );
    }
}
