//! Per stack, what its samples say beyond their totals: the sizes it asked for, the threads
//! that asked, how long its blocks lived, and how its in-use bytes grew. Each part is a
//! set of running sums ([`SampleSet`]s, [`GrowthSums`]) split by one more key, so every
//! figure is estimated with the same unbiased estimators and bounds as the totals, and
//! memory stays bounded: at most 64 size classes and [`MAX_THREADS`] threads per stack
//! (further threads share one "other threads" set, counted).

use crate::stats::{
    growth::{GrowthSums, TickGrid},
    lifetime::Lifetimes,
    SampleObs, SampleSet,
};

/// Threads kept apart per stack; later ones are summed into [`Breakdown::other_threads`].
pub(crate) const MAX_THREADS: usize = 16;

/// The power-of-two size class of `size`: `k` holds sizes in `(2^(k-1), 2^k]` (0 holds 1).
pub(crate) fn size_class(size: u64) -> u8 {
    if size <= 1 {
        0
    } else {
        ((size - 1).ilog2() + 1) as u8
    }
}

/// One stack's breakdowns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Breakdown {
    /// Samples per size class, by class.
    pub sizes: Vec<(u8, SampleSet)>,
    /// Samples per thread (tid), in order of first sample.
    pub threads: Vec<(u32, SampleSet)>,
    /// Samples of threads beyond [`MAX_THREADS`].
    pub other_threads: SampleSet,
    /// Freed sampled blocks by lifetime (frees tracked; `None` until one is freed).
    pub lifetimes: Option<Box<Lifetimes>>,
    /// Growth sums of the blocks freed so far (live ones are added at a tally).
    pub freed_growth: GrowthSums,
}

impl Breakdown {
    /// A sample of thread `tid`.
    pub fn add(&mut self, obs: SampleObs, tid: u32) {
        let class = size_class(obs.size);
        match self.sizes.binary_search_by_key(&class, |(c, _)| *c) {
            Ok(at) => self.sizes[at].1.add(obs),
            Err(at) => {
                let mut set = SampleSet::default();
                set.add(obs);
                self.sizes.insert(at, (class, set));
            }
        }
        if let Some((_, set)) = self.threads.iter_mut().find(|(t, _)| *t == tid) {
            set.add(obs);
        } else if self.threads.len() < MAX_THREADS {
            let mut set = SampleSet::default();
            set.add(obs);
            self.threads.push((tid, set));
        } else {
            self.other_threads.add(obs);
        }
    }

    /// A sampled block allocated at `allocated_ns` was freed at `freed_ns`.
    pub fn freed(&mut self, obs: SampleObs, allocated_ns: u64, freed_ns: u64, grid: &TickGrid) {
        self.lifetimes
            .get_or_insert_with(Box::default)
            .add(obs, freed_ns.saturating_sub(allocated_ns));
        self.freed_growth
            .add(obs, grid.span(allocated_ns, freed_ns, u64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(size: u64) -> SampleObs {
        SampleObs {
            size,
            offset: 0,
            interval: 1,
            weight: None,
        }
    }

    #[test]
    fn sizes_fall_into_power_of_two_classes() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(1), 0);
        assert_eq!(size_class(2), 1);
        assert_eq!(size_class(64), 6);
        assert_eq!(size_class(65), 7);
        assert_eq!(size_class(u64::MAX), 64);
        let mut breakdown = Breakdown::default();
        for size in [100, 64, 128, 4096, 33] {
            breakdown.add(obs(size), 1);
        }
        let classes: Vec<(u8, u64)> = breakdown
            .sizes
            .iter()
            .map(|(c, set)| (*c, set.samples()))
            .collect();
        assert_eq!(classes, vec![(6, 2), (7, 2), (12, 1)]);
    }

    #[test]
    fn threads_beyond_the_limit_share_one_set() {
        let mut breakdown = Breakdown::default();
        for tid in 0..MAX_THREADS as u32 + 3 {
            breakdown.add(obs(8), tid);
            breakdown.add(obs(8), tid);
        }
        assert_eq!(breakdown.threads.len(), MAX_THREADS);
        assert!(breakdown.threads.iter().all(|(_, set)| set.samples() == 2));
        assert_eq!(breakdown.other_threads.samples(), 6);
    }

    #[test]
    fn a_free_adds_a_lifetime_and_its_growth_terms() {
        let grid = TickGrid {
            start_ns: 0,
            tick_ns: 1_000_000_000,
        };
        let mut breakdown = Breakdown::default();
        assert!(breakdown.lifetimes.is_none());
        breakdown.freed(obs(10), 500_000_000, 2_500_000_000, &grid);
        let lifetimes = breakdown.lifetimes.as_ref().unwrap();
        assert_eq!(
            lifetimes.classes[2].samples(),
            1,
            "2 s: freed later than 1 s"
        );
        // Live at 1 s and 2 s, ticks 0 and 1 of 0..4: the slope is
        // ((0 − 1.5) + (1 − 1.5))·10/5 = −4 bytes a second.
        let growth = breakdown.freed_growth.slope(4, 1.0, 0.95).unwrap();
        assert!((growth.bytes_per_second + 4.0).abs() < 1e-9, "{growth:?}");
    }
}
