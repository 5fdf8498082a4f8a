//! The controller: from a second's bytes and samples to the next second's interval (pure).

/// Interval changes a profile lists (at most one a second: over 15 minutes of changes);
/// later ones are counted.
pub(super) const LISTED_CHANGES: usize = 1000;

/// The largest interval the throttle sets: the kernel's (4 GiB; one constant, so the
/// throttle never chooses an interval the probes refuse).
pub(super) use sampler_common::geometric::MAX_INTERVAL;

/// Weight of the newest second in the allocation-rate EWMA.
const EWMA_WEIGHT: f64 = 0.5;
/// Gain of the integral correction, per second.
const INTEGRAL_GAIN: f64 = 0.3;
/// The correction's bound, either way (a factor of 100).
const INTEGRAL_LIMIT: f64 = 4.6;
/// Changes smaller than this factor are not made.
const DEADBAND: f64 = 1.2;
/// The most the band lowers the interval in one second (512 KiB to 5 KiB in two): a lull
/// is not taken for a quiet process at once, since the burst after it would meet a small
/// interval for up to a second before the ceiling answers.
const STEP_DOWN: f64 = 16.0;
// The smallest interval the band lowers to when no `--interval` was given.
pub(crate) use crate::schema::SMALLEST_INTERVAL;

/// The controller's state.
#[derive(Clone, Debug)]
pub(super) struct Throttle {
    target: f64,
    /// The band's lower end, samples per second (0: a ceiling only).
    minimum: f64,
    floor: u64,
    interval: u64,
    bytes_rate: Option<f64>,
    correction: f64,
}

impl Throttle {
    /// Aims at `target` samples per second, the interval never below `floor` (the user's).
    #[cfg(test)]
    pub(super) fn new(target: f64, floor: u64) -> Throttle {
        Throttle::band(0.0, target, floor, floor)
    }

    /// Keeps the rate between `minimum` and `target` samples per second, from `start`,
    /// never below `floor` (the default when no `--interval` is given).
    pub(super) fn band(minimum: f64, target: f64, floor: u64, start: u64) -> Throttle {
        Throttle {
            target,
            minimum: minimum.min(target),
            floor: floor.max(1),
            interval: start.max(floor).max(1),
            bytes_rate: None,
            correction: 0.0,
        }
    }

    /// The interval in force.
    #[cfg(test)]
    pub(super) fn interval(&self) -> u64 {
        self.interval
    }

    /// Takes the last `seconds`: `bytes` allocated (exact counters) and `samples` drawn
    /// (delivered or lost) at the interval in force; returns the new interval if it
    /// changes.
    pub(super) fn update(&mut self, seconds: f64, bytes: u64, samples: u64) -> Option<u64> {
        if seconds <= 0.0 || self.target <= 0.0 {
            return None;
        }
        let rate = bytes as f64 / seconds;
        // Up at once (a storm is answered within a second), down smoothly.
        let expected = match self.bytes_rate {
            Some(old) if rate < old => EWMA_WEIGHT * rate + (1.0 - EWMA_WEIGHT) * old,
            _ => rate,
        };
        self.bytes_rate = Some(expected);
        // Integral: the log-ratio of the samples seen to the target, learnt near the
        // operating point only (within 4× of the target: farther, the feed-forward's
        // error is a lag, not the byte model's bias) and not while held at the floor.
        let seen = samples as f64 / seconds;
        let near = seen <= 4.0 * self.target && seen >= self.target / 4.0;
        let floored = self.interval == self.floor && seen < self.target;
        // A band learns only where its ceiling binds: within it, the rate is where it should
        // be (learning toward the target there would push every busy process to it).
        let within_band = self.minimum > 0.0 && seen <= self.target;
        if near && !floored && !within_band {
            let error = ((samples as f64 + 0.5) / (self.target * seconds)).ln();
            self.correction =
                (self.correction + INTEGRAL_GAIN * error).clamp(-INTEGRAL_LIMIT, INTEGRAL_LIMIT);
        }
        let interval_for = |rate: f64| {
            (expected / rate * self.correction.exp()).clamp(self.floor as f64, MAX_INTERVAL as f64)
        };
        // The interval that gives the target (the ceiling's).
        let tight = interval_for(self.target);
        let wanted = if self.minimum > 0.0 {
            if bytes == 0 && samples == 0 {
                // Idle: nothing to go by (lowering now would meet the next burst small).
                return None;
            }
            // Kept while within the band; down to the minimum's, a step at a time.
            let loose = interval_for(self.minimum).max(tight);
            let now = self.interval as f64;
            now.clamp(tight, loose).max(now / STEP_DOWN)
        } else {
            tight
        };
        let wanted = wanted.clamp(self.floor as f64, MAX_INTERVAL as f64).round() as u64;
        let ratio = wanted as f64 / self.interval as f64;
        let at_floor = wanted == self.floor && self.interval != self.floor;
        if !(1.0 / DEADBAND..=DEADBAND).contains(&ratio) || at_floor {
            self.interval = wanted;
            return Some(wanted);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples at `interval` from `bytes` of small objects (the byte model exactly).
    fn samples(bytes: u64, interval: u64) -> u64 {
        bytes / interval
    }

    #[test]
    fn a_storm_is_brought_to_the_target_and_released_after() {
        let mut throttle = Throttle::new(1000.0, 4096);
        // Quiet: 1 MiB/s at 4 KiB is 256 samples/s, under the target: nothing changes.
        for _ in 0..5 {
            assert_eq!(throttle.update(1.0, 1 << 20, samples(1 << 20, 4096)), None);
        }
        // A storm of 1 GiB/s: 262,144 samples/s at 4 KiB.
        let storm = 1u64 << 30;
        let mut seen = Vec::new();
        for _ in 0..6 {
            let interval = throttle.interval();
            throttle.update(1.0, storm, samples(storm, interval));
            seen.push(samples(storm, throttle.interval()));
        }
        let settled = *seen.last().unwrap() as f64;
        assert!((700.0..1400.0).contains(&settled), "{seen:?}");
        // Within two seconds the rate is within 2× of the target.
        assert!(seen[1] < 2000, "{seen:?}");
        // The storm ends: back to the user's interval within a dozen seconds (the rate
        // estimate halves each second: 1 GiB/s to 1 MiB/s is ten halvings).
        for _ in 0..12 {
            let interval = throttle.interval();
            throttle.update(1.0, 1 << 20, samples(1 << 20, interval));
        }
        assert_eq!(throttle.interval(), 4096);
    }

    #[test]
    fn large_objects_are_corrected_by_the_integral() {
        // 100 MiB/s of 4 MiB objects at a 64 KiB floor: each object is sampled once, so
        // the byte model over-predicts samples 64-fold; the target is 10 samples/s, and the
        // true rate is 25 objects/s: the integral must shrink the interval back toward
        // where 10 samples/s come (one object in 2.5 sampled: interval ≈ 4.5 MiB).
        let mut throttle = Throttle::new(10.0, 64 << 10);
        let object = 4u64 << 20;
        let objects = 25u64;
        let sampled = |interval: u64| {
            // P(sampled) = 1 - (1 - 1/interval)^object.
            let p = 1.0 - (-(object as f64) / interval as f64).exp();
            (objects as f64 * p).round() as u64
        };
        for _ in 0..30 {
            let interval = throttle.interval();
            throttle.update(1.0, object * objects, sampled(interval));
        }
        let rate = sampled(throttle.interval());
        assert!(
            (6..=16).contains(&rate),
            "{rate} samples/s at {}",
            throttle.interval()
        );
    }

    /// Without `--interval`: a quiet process's interval comes down (16× a second at most)
    /// until it gives the minimum, a storm's goes up to the ceiling's, and a rate within
    /// the band, or an idle second, changes nothing.
    #[test]
    fn the_band_lowers_a_quiet_process_and_caps_a_storm() {
        let mut throttle = Throttle::band(200.0, 5000.0, 4096, 512 << 10);
        // 1 MiB/s: 2 samples/s at 512 KiB; 200/s wants ~5 KiB.
        let quiet = 1u64 << 20;
        let mut intervals = Vec::new();
        for _ in 0..8 {
            let interval = throttle.interval();
            throttle.update(1.0, quiet, samples(quiet, interval));
            intervals.push(throttle.interval());
        }
        assert_eq!(intervals[0], 32 << 10, "{intervals:?}");
        let settled = samples(quiet, throttle.interval());
        assert!(
            (150..=260).contains(&settled),
            "{settled} samples/s: {intervals:?}"
        );
        // Idle: nothing changes.
        let before = throttle.interval();
        assert_eq!(throttle.update(1.0, 0, 0), None);
        assert_eq!(throttle.interval(), before);
        // A storm of 1 GiB/s: up to the ceiling's 5000/s within a second.
        let storm = 1u64 << 30;
        let interval = throttle.interval();
        throttle.update(1.0, storm, samples(storm, interval));
        let rate = samples(storm, throttle.interval());
        assert!((4000..=6000).contains(&rate), "{rate}");
        // 100 MiB/s at that interval: ~500 samples/s, inside the band: kept.
        let steady = 100u64 << 20;
        let held = throttle.interval();
        for _ in 0..3 {
            throttle.update(1.0, steady, samples(steady, held));
        }
        // (The rate estimate falls smoothly, so the interval may come down once toward
        // the band's edge, never below the minimum's.)
        assert!(samples(steady, throttle.interval()) <= 5000);
        assert!(samples(steady, throttle.interval()) >= 200);
        // A busy process inside the band (2000/s) is left there for a minute, not pushed
        // toward the ceiling by the integral.
        let mut busy = Throttle::band(200.0, 5000.0, 4096, 512 << 10);
        let rate = 2000 * (512u64 << 10);
        for _ in 0..60 {
            let interval = busy.interval();
            busy.update(1.0, rate, samples(rate, interval));
        }
        assert_eq!(busy.interval(), 512 << 10);
    }

    #[test]
    fn off_and_degenerate_inputs_change_nothing() {
        let mut off = Throttle::new(0.0, 512);
        assert_eq!(off.update(1.0, u64::MAX, u64::MAX), None);
        let mut on = Throttle::new(100.0, 512);
        assert_eq!(on.update(0.0, 1 << 40, 1 << 30), None);
        // Nothing allocated: stays at the floor.
        assert_eq!(on.update(1.0, 0, 0), None);
        assert_eq!(on.interval(), 512);
        // The ceiling holds.
        on.update(1.0, u64::MAX, u64::MAX / 512);
        assert!(on.interval() <= MAX_INTERVAL);
        // 30 MiB blocks at a storm's rate with a target of one sample a second (the
        // throttle once chose 326 GB, which the kernel refused and the recording
        // ended): whatever it chooses, the kernel takes.
        let mut storm = Throttle::new(1.0, 512 * 1024);
        for _ in 0..50 {
            if let Some(interval) = storm.update(1.0, 200 << 30, 20_000) {
                assert!(
                    sampler_common::geometric::scale_q32(interval).is_some(),
                    "{interval}"
                );
            }
        }
        assert_eq!(storm.interval(), MAX_INTERVAL);
    }
}
