//! The throttle in a running recording: once a second, the bytes the targets allocated
//! (exact counters) and the samples the kernel drew (received, or lost for want of
//! ring-buffer room; samples still on their way are counted the next second) go to the
//! controller; a new interval it chooses is listed for the profile and returned for the
//! recording to set (the kernel's `RATE` map, the in-process regions).

use log::info;

use super::controller::{Throttle, LISTED_CHANGES};
use crate::schema::{IntervalChange, ThrottleRecord};

/// The throttle's state in a recording.
pub(crate) struct Throttling {
    controller: Throttle,
    target: u32,
    minimum: u32,
    /// Bytes and samples at the last update.
    last: (u64, u64),
    last_ns: u64,
    started_ns: u64,
    changes: Vec<IntervalChange>,
    changes_not_listed: u64,
    largest: u64,
    smallest: u64,
}

impl Throttling {
    /// Aims at `target` samples per second from the user's `interval` up (`None`: off);
    /// with a `minimum` (no `--interval` given), keeps the rate between the two, the
    /// interval from `interval` down to [`super::SMALLEST_INTERVAL`] too.
    pub(crate) fn new(target: u32, minimum: u32, interval: u64) -> Option<Throttling> {
        (target > 0).then(|| {
            let now = crate::sys::clock::monotonic_ns();
            let floor = if minimum > 0 {
                super::SMALLEST_INTERVAL.min(interval)
            } else {
                interval
            };
            Throttling {
                controller: Throttle::band(f64::from(minimum), f64::from(target), floor, interval),
                target,
                minimum,
                last: (0, 0),
                last_ns: now,
                started_ns: now,
                changes: Vec::new(),
                changes_not_listed: 0,
                largest: interval,
                smallest: interval,
            }
        })
    }

    /// Counts from `ns` (CLOCK_MONOTONIC) on: a command that ran before the recording was
    /// assembled (`crate::recording`'s early run) had its samples since then.
    pub(crate) fn since(&mut self, ns: u64) {
        self.last_ns = ns;
        self.started_ns = ns;
    }

    /// The largest interval set so far.
    pub(crate) fn largest(&self) -> u64 {
        self.largest
    }

    /// Once a second, at `now` (CLOCK_MONOTONIC ns): the targets' `bytes` and the `samples`
    /// drawn so far (cumulative; `lost` of them for want of ring-buffer room); the new
    /// interval, if the controller changes it.
    pub(crate) fn tick(&mut self, now: u64, bytes: u64, samples: u64, lost: u64) -> Option<u64> {
        let seconds = now.saturating_sub(self.last_ns) as f64 / 1e9;
        if seconds < SHORTEST_TICK {
            // The tick right after the start: its rate would be a guess from a few
            // milliseconds (a 10 ms command's one sample lowered the interval 13×).
            return None;
        }
        let (bytes_then, samples_then) = self.last;
        self.last = (bytes, samples);
        self.last_ns = now;
        let (bytes, samples) = (
            bytes.saturating_sub(bytes_then),
            samples.saturating_sub(samples_then),
        );
        log::debug!(
            "throttle: {seconds:.2} s, {bytes} bytes, {samples} samples ({lost} lost so far)"
        );
        let interval = self.controller.update(seconds, bytes, samples)?;
        self.largest = self.largest.max(interval);
        self.smallest = self.smallest.min(interval);
        self.note(IntervalChange {
            at_seconds: now.saturating_sub(self.started_ns) as f64 / 1e9,
            interval_bytes: interval,
        });
        info!(
            "sampling interval now {} (--min-samples-per-sec {}, --max-samples-per-sec {})",
            crate::format::bytes(interval as f64),
            self.minimum,
            self.target
        );
        Some(interval)
    }

    /// Lists a change, or counts it once [`LISTED_CHANGES`] are listed.
    fn note(&mut self, change: IntervalChange) {
        if self.changes.len() < LISTED_CHANGES {
            self.changes.push(change);
        } else {
            self.changes_not_listed += 1;
        }
    }

    /// What it did, if it ever changed the interval.
    pub(crate) fn record(&self) -> Option<ThrottleRecord> {
        (!self.changes.is_empty()).then(|| ThrottleRecord {
            max_samples_per_second: self.target,
            min_samples_per_second: self.minimum,
            largest_interval_bytes: self.largest,
            smallest_interval_bytes: self.smallest,
            changes: self.changes.clone(),
            changes_not_listed: self.changes_not_listed,
        })
    }
}

/// The shortest span the throttle judges a rate over, in seconds.
const SHORTEST_TICK: f64 = 0.5;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_listed_up_to_the_bound_then_counted() {
        let mut throttling = Throttling::new(100, 0, 512).unwrap();
        assert!(throttling.record().is_none());
        for i in 0..LISTED_CHANGES + 5 {
            throttling.note(IntervalChange {
                at_seconds: i as f64,
                interval_bytes: 1024,
            });
        }
        let record = throttling.record().unwrap();
        assert_eq!(record.changes.len(), LISTED_CHANGES);
        assert_eq!(record.changes_not_listed, 5);
        assert!(Throttling::new(0, 0, 512).is_none());
    }
}
