//! In-use bytes and allocation rate over time, per stack: the series a chart draws.
//!
//! At every tick (`--tick`) each stack's point records its estimated in-use bytes then and
//! the bytes it allocated since the previous point, with their variances (the
//! Horvitz-Thompson sums of its live and all-time sample sets). A series holds at most
//! [`CAPACITY`] points: when they are all used, every pair of neighbours is merged (the
//! later level, the summed allocations) and a point stands for twice as many ticks from
//! then on, so memory is bounded (16 bytes a point: 8 MiB for 8192 stacks) however long
//! the recording, and the series always spans all of it. Growth is not estimated from
//! these points (their errors are correlated): see [`crate::stats::growth`].

pub(crate) use crate::schema::SeriesValues;

use crate::stats::{growth::TickGrid, SampleSet};

/// Points a series holds at most.
pub(crate) const CAPACITY: usize = 64;

/// One point: the in-use bytes at its end and the bytes allocated over it, with variances.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Point {
    inuse: f32,
    inuse_variance: f32,
    allocated: f32,
    allocated_variance: f32,
}

/// One stack's series: its points from point `first` on.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Series {
    first: u64,
    points: Vec<Point>,
    /// The stack's all-time sums at the last point (bytes, variance).
    allocated_then: (f64, f64),
}

/// Every stack's series on one grid.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    grid: TickGrid,
    /// Ticks per point (a power of two).
    stride: u64,
    /// Points closed so far.
    points: u64,
    per_stack: Vec<Series>,
}

impl Timeline {
    /// An empty timeline on `grid`.
    pub fn new(grid: TickGrid) -> Timeline {
        Timeline {
            grid,
            stride: 1,
            points: 0,
            per_stack: Vec::new(),
        }
    }

    /// The grid.
    pub fn grid(&self) -> &TickGrid {
        &self.grid
    }

    /// When the next point closes (CLOCK_MONOTONIC ns).
    pub fn next_due_ns(&self) -> u64 {
        self.grid.start_ns + (self.points + 1) * self.stride * self.grid.tick_ns
    }

    /// Keeps the series of the stacks `remap` keeps (see `StackTable::forget`).
    pub fn retain_stacks(&mut self, remap: &[Option<crate::stacks::StackId>]) {
        crate::stacks::forget::retain_remapped(&mut self.per_stack, remap);
    }

    /// Closes every point due by `now_ns`, from the stacks' sets then (`all[i]`, `live[i]`
    /// of stack `i`).
    pub fn advance(&mut self, now_ns: u64, all: &[SampleSet], live: &[SampleSet]) {
        while now_ns >= self.next_due_ns() {
            self.close(all, live);
        }
    }

    fn close(&mut self, all: &[SampleSet], live: &[SampleSet]) {
        if self.per_stack.len() < all.len() {
            self.per_stack.resize(all.len(), Series::default());
        }
        let point = self.points;
        for (id, series) in self.per_stack.iter_mut().enumerate() {
            let ht = all[id].horvitz_thompson();
            if ht.bytes == 0.0 && series.points.is_empty() {
                continue;
            }
            if series.points.is_empty() {
                series.first = point;
            }
            let live = live
                .get(id)
                .map(SampleSet::horvitz_thompson)
                .unwrap_or_default();
            let (before, before_variance) = series.allocated_then;
            series.points.push(Point {
                inuse: live.bytes as f32,
                inuse_variance: live.bytes_variance as f32,
                allocated: (ht.bytes - before) as f32,
                allocated_variance: (ht.bytes_variance - before_variance).max(0.0) as f32,
            });
            series.allocated_then = (ht.bytes, ht.bytes_variance);
        }
        self.points += 1;
        if self.points as usize >= CAPACITY {
            self.halve();
        }
    }

    /// Merges every pair of points: a point stands for twice the ticks.
    fn halve(&mut self) {
        for series in &mut self.per_stack {
            // Pairs are aligned on the global point index: an odd first point is merged
            // with nothing before it (it stands alone for its half of the pair).
            let start = series.first;
            let mut merged: Vec<Point> = Vec::with_capacity(CAPACITY / 2);
            for (offset, point) in series.points.iter().enumerate() {
                let index = start + offset as u64;
                if index % 2 == 1 {
                    if let Some(last) = merged.last_mut().filter(|_| offset > 0) {
                        last.inuse = point.inuse;
                        last.inuse_variance = point.inuse_variance;
                        last.allocated += point.allocated;
                        last.allocated_variance += point.allocated_variance;
                        continue;
                    }
                }
                merged.push(*point);
            }
            series.first = start / 2;
            series.points = merged;
        }
        self.points = self.points.div_ceil(2);
        self.stride *= 2;
    }

    /// Stack `id`'s series, or the sum of `ids`' series (a process's), at `confidence`;
    /// `None` before a point closed.
    pub fn values(&self, ids: &[usize], confidence: f64) -> Option<SeriesValues> {
        if self.points == 0 {
            return None;
        }
        let mut sums = vec![Point::default(); self.points as usize];
        for series in ids.iter().filter_map(|&id| self.per_stack.get(id)) {
            for (offset, point) in series.points.iter().enumerate() {
                if let Some(sum) = sums.get_mut(series.first as usize + offset) {
                    sum.inuse += point.inuse;
                    sum.inuse_variance += point.inuse_variance;
                    sum.allocated += point.allocated;
                    sum.allocated_variance += point.allocated_variance;
                }
            }
        }
        let tail = (1.0 - confidence.clamp(0.0, 1.0)) / 2.0;
        let z = crate::stats::memo::normal_quantile(1.0 - tail.max(1e-12));
        let seconds = self.stride as f64 * self.grid.tick_seconds();
        let mut values = SeriesValues {
            seconds_per_point: seconds,
            ..SeriesValues::default()
        };
        for (i, point) in sums.iter().enumerate() {
            values.at_seconds.push((i + 1) as f64 * seconds);
            // A point's variance is a running sum, added to at allocation and taken from at
            // free: rounding can leave it a hair below zero (NaN bounds, `null` in JSON).
            let inuse_half = z * f64::from(point.inuse_variance).max(0.0).sqrt();
            let inuse = f64::from(point.inuse);
            values.inuse_bytes.push(inuse);
            values.inuse_lower.push((inuse - inuse_half).max(0.0));
            values.inuse_upper.push(inuse + inuse_half);
            let rate = f64::from(point.allocated) / seconds;
            let rate_half = z * f64::from(point.allocated_variance).max(0.0).sqrt() / seconds;
            values.alloc_bytes_per_second.push(rate);
            values.alloc_lower.push((rate - rate_half).max(0.0));
            values.alloc_upper.push(rate + rate_half);
        }
        Some(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::SampleObs;

    const SECOND: u64 = 1_000_000_000;

    fn one_byte_blocks(count: u64) -> SampleSet {
        let mut set = SampleSet::default();
        for _ in 0..count {
            set.add(SampleObs {
                size: 1,
                offset: 0,
                interval: 1,
                weight: None,
            });
        }
        set
    }

    #[test]
    fn points_record_levels_and_allocations_and_merge_when_full() {
        let mut timeline = Timeline::new(TickGrid {
            start_ns: 0,
            tick_ns: SECOND,
        });
        assert_eq!(timeline.values(&[0], 0.95), None);
        // Stack 0 allocates 10 bytes a second and keeps them; stack 1 appears at 5 s.
        for second in 1..=CAPACITY as u64 {
            let all = [
                one_byte_blocks(10 * second),
                one_byte_blocks(second.saturating_sub(4)),
            ];
            timeline.advance(second * SECOND, &all, &all[..1]);
        }
        let values = timeline.values(&[0], 0.95).unwrap();
        // Full at 64 points: merged into 32 of two seconds each.
        assert_eq!(values.seconds_per_point, 2.0);
        assert_eq!(values.inuse_bytes.len(), CAPACITY / 2);
        assert_eq!(values.inuse_bytes[0], 20.0);
        assert_eq!(*values.inuse_bytes.last().unwrap(), 10.0 * CAPACITY as f64);
        assert!(
            values.alloc_bytes_per_second.iter().all(|&r| r == 10.0),
            "{values:?}"
        );
        // Interval 1: exact, the bounds are the estimates.
        assert_eq!(values.inuse_lower, values.inuse_bytes);
        // The process's series sums its stacks'; stack 1 holds nothing in use.
        let both = timeline.values(&[0, 1], 0.95).unwrap();
        assert_eq!(both.inuse_bytes, values.inuse_bytes);
        let total: f64 = both.alloc_bytes_per_second.iter().map(|r| r * 2.0).sum();
        assert_eq!(total, 10.0 * 64.0 + 60.0);
        // The next point closes 2 s later.
        assert_eq!(timeline.next_due_ns(), (CAPACITY as u64 + 2) * SECOND);
    }

    /// A variance left a hair below zero by the running sums' rounding (seen under load:
    /// `null` bounds in the JSON, which its readers refused) gives bounds at the estimate.
    #[test]
    fn a_variance_rounded_below_zero_gives_finite_bounds() {
        let mut timeline = Timeline::new(TickGrid {
            start_ns: 0,
            tick_ns: SECOND,
        });
        timeline.points = 1;
        timeline.per_stack = vec![Series {
            first: 0,
            points: vec![Point {
                inuse: 100.0,
                inuse_variance: -1e-3,
                allocated: 50.0,
                allocated_variance: -2e-3,
            }],
            allocated_then: (50.0, 0.0),
        }];
        let values = timeline.values(&[0], 0.95).unwrap();
        assert_eq!(values.inuse_upper, [100.0]);
        assert_eq!(values.alloc_upper, [50.0]);
    }
}
