//! A stack's (or process's) breakdowns turned into the profile's values: growth, lifetimes,
//! sizes and threads, each with bounds at the recording's confidence. Pure: the estimators
//! are [`crate::stats::growth`], [`crate::stats::lifetime`] and [`SampleSet`]'s.

use std::collections::HashMap;

use super::{breakdown::Breakdown, Tally};
use crate::schema::{GrowthValues, LifetimeValues, SizeClassValues, ThreadValues};
use crate::stats::{
    estimate::{Estimates, Window},
    growth::GrowthSums,
    lifetime::Lifetimes,
    Estimate, SampleSet,
};

/// Stacks given a timeline in the profile (by bytes allocated, and by bytes in use),
/// besides every growing one: the file stays small with thousands of stacks.
pub(super) const TIMELINE_STACKS: usize = 50;

/// The estimators' parameters.
#[derive(Clone, Copy, Debug)]
pub(super) struct Estimating {
    /// Confidence of every bound.
    pub confidence: f64,
    /// The interval an empty set's upper bound assumes.
    pub largest_interval: u64,
}

impl Estimating {
    pub(super) fn estimate(&self, set: &SampleSet) -> Estimates {
        set.estimate(self.confidence, Window::RECORDING, self.largest_interval)
    }

    /// Growth from `sums` on the tally's grid (`None`: no grid, or fewer than three ticks).
    pub(super) fn growth(&self, sums: &GrowthSums, tally: &Tally) -> Option<GrowthValues> {
        let grid = tally.timeline.as_ref()?.grid();
        let growth = sums.slope(tally.ticks, grid.tick_seconds(), self.confidence)?;
        Some(GrowthValues {
            bytes_per_second: Estimate {
                samples: growth.samples,
                estimate: growth.bytes_per_second,
                lower: growth.lower,
                upper: growth.upper,
            },
            growing: growth.growing(),
            tick_seconds: grid.tick_seconds(),
        })
    }

    /// Lifetime shares and quantiles (`None`: no sampled block was freed).
    pub(super) fn lifetimes(
        &self,
        lifetimes: &Lifetimes,
        live: &SampleSet,
    ) -> Option<LifetimeValues> {
        let freed_samples = lifetimes.samples();
        if freed_samples == 0 {
            return None;
        }
        let [within_1ms, within_1s, later, still] =
            lifetimes.shares(live, self.confidence, self.largest_interval);
        Some(LifetimeValues {
            freed_samples,
            temporary_bytes: self.estimate(&lifetimes.classes[0]).bytes,
            freed_within_1ms: within_1ms,
            freed_within_1s: within_1s,
            freed_later: later,
            still_in_use: still,
            p50_seconds: lifetimes.quantile_seconds(0.5),
            p90_seconds: lifetimes.quantile_seconds(0.9),
            p99_seconds: lifetimes.quantile_seconds(0.99),
        })
    }

    /// Bytes and objects per size class.
    pub(super) fn sizes(&self, breakdown: &Breakdown) -> Vec<SizeClassValues> {
        breakdown
            .sizes
            .iter()
            .map(|(class, set)| {
                let e = self.estimate(set);
                let to_bytes = 1u64.checked_shl(u32::from(*class)).unwrap_or(u64::MAX);
                SizeClassValues {
                    from_bytes: if *class == 0 { 1 } else { (to_bytes >> 1) + 1 },
                    to_bytes,
                    alloc_bytes: e.bytes,
                    alloc_objects: e.objects,
                }
            })
            .collect()
    }

    /// Bytes and objects per thread of `pid`, largest first, named from `names`.
    pub(super) fn threads(
        &self,
        breakdown: &Breakdown,
        pid: u32,
        names: &HashMap<(u32, u32), String>,
    ) -> Vec<ThreadValues> {
        let mut threads: Vec<ThreadValues> = breakdown
            .threads
            .iter()
            .map(|(tid, set)| (Some(*tid), set))
            .chain(
                (breakdown.other_threads.samples() > 0).then_some((None, &breakdown.other_threads)),
            )
            .map(|(tid, set)| {
                let e = self.estimate(set);
                ThreadValues {
                    tid,
                    name: tid
                        .and_then(|tid| names.get(&(pid, tid)).cloned())
                        .unwrap_or_default(),
                    alloc_bytes: e.bytes,
                    alloc_objects: e.objects,
                }
            })
            .collect();
        threads.sort_by(|a, b| b.alloc_bytes.estimate.total_cmp(&a.alloc_bytes.estimate));
        threads
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::SampleObs;

    fn obs(size: u64) -> SampleObs {
        SampleObs {
            size,
            offset: 0,
            interval: 1,
            weight: None,
        }
    }

    #[test]
    fn sizes_and_threads_read_out_exactly_with_every_block_sampled() {
        let mut breakdown = Breakdown::default();
        for (size, tid) in [(100, 7), (100, 7), (30, 8), (1, 8)] {
            breakdown.add(obs(size), tid);
        }
        let estimating = Estimating {
            confidence: 0.95,
            largest_interval: 1,
        };
        let sizes = estimating.sizes(&breakdown);
        let classes: Vec<(u64, u64, f64)> = sizes
            .iter()
            .map(|c| (c.from_bytes, c.to_bytes, c.alloc_bytes.estimate))
            .collect();
        assert_eq!(classes, vec![(1, 1, 1.0), (17, 32, 30.0), (65, 128, 200.0)]);
        let names = HashMap::from([((5, 7), "worker".to_owned())]);
        let threads = estimating.threads(&breakdown, 5, &names);
        assert_eq!(threads.len(), 2);
        assert_eq!(threads[0].tid, Some(7));
        assert_eq!(threads[0].name, "worker");
        assert_eq!(threads[0].alloc_bytes.estimate, 200.0);
        assert_eq!(threads[1].name, "", "no name known for tid 8");
        assert_eq!(threads[1].alloc_objects.estimate, 2.0);
    }
}
