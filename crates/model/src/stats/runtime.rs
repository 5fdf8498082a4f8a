//! Samples a language runtime drew with its own sampler: Go's allocator keeps, per P, a
//! countdown over allocated bytes with exponential gaps of mean `MemProfileRate`, and
//! samples the block the countdown runs out in, then draws a fresh countdown (the rest of
//! the block is not carried over). By memorylessness a block of `n` bytes is sampled with
//! probability `π = 1 - e^(-n/R)`, independently of the others: weighing each sample by
//! `n / π` (Horvitz-Thompson) estimates the bytes without bias, as Go's own `pprof`
//! scales heap samples. The weighted estimator's bounds (Fay and Feuer's gamma interval
//! on `Σ w²`, [`super::estimate`]) then hold: `Σ w²` over-estimates the variance
//! `Σ n²(1-π)/π²` of the sum, so they are conservative.

/// The bytes a block of `size` bytes sampled at mean rate `rate` stands for: `size / π`,
/// rounded, never less than `size` (a rate of 1 samples every block).
pub fn runtime_weight(size: u64, rate: u64) -> u64 {
    if size == 0 || rate <= 1 {
        return size;
    }
    let n = size as f64;
    let pi = -(-n / rate as f64).exp_m1();
    if pi <= 0.0 {
        return size;
    }
    ((n / pi).round() as u64).max(size)
}

#[cfg(test)]
mod tests {
    use rand::{Rng as _, SeedableRng as _};

    use super::*;
    use crate::stats::{estimate::Window, SampleObs, SampleSet};

    #[test]
    fn weights_match_the_inclusion_probability() {
        // Far below the rate: about the rate plus half the block.
        assert_eq!(runtime_weight(16, 524_288), 524_296);
        // At the rate: n / (1 - 1/e).
        assert_eq!(runtime_weight(524_288, 524_288), 829_411);
        // Far above: the block itself.
        assert_eq!(runtime_weight(64 << 20, 524_288), 64 << 20);
        assert_eq!(runtime_weight(1000, 1), 1000);
        assert_eq!(runtime_weight(0, 524_288), 0);
    }

    /// Go's sampler replayed: exponential countdowns of mean `R`, restarted after each
    /// sample, over a stream of blocks of mixed sizes. Over many runs the weighted
    /// estimates are unbiased and the 95% bounds hold the truth at least 95% of the time,
    /// for all bytes and for the half left live.
    #[test]
    fn runtime_samples_are_unbiased_and_their_bounds_calibrated() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(41);
        const R: f64 = 65536.0;
        let sizes = [16u64, 1024, 4096, 40_960, 327_680];
        let counts = [8000u64, 2000, 300, 40, 6];
        let truth: f64 = sizes.iter().zip(&counts).map(|(s, c)| (s * c) as f64).sum();
        let runs = 2000;
        let (mut sum, mut held, mut live_held) = (0.0, 0, 0);
        let draw = |rng: &mut rand_pcg::Pcg64| -R * rng.random::<f64>().max(f64::MIN_POSITIVE).ln();
        for _ in 0..runs {
            let mut countdown = draw(&mut rng);
            let (mut all, mut live, mut live_truth) =
                (SampleSet::default(), SampleSet::default(), 0.0);
            for (&size, &count) in sizes.iter().zip(&counts) {
                for i in 0..count {
                    let freed = i % 2 == 0;
                    if !freed {
                        live_truth += size as f64;
                    }
                    if (size as f64) < countdown {
                        countdown -= size as f64;
                        continue;
                    }
                    countdown = draw(&mut rng);
                    let obs = SampleObs {
                        size,
                        offset: 0,
                        interval: 0,
                        weight: Some(runtime_weight(size, R as u64)),
                    };
                    all.add(obs);
                    if !freed {
                        live.add(obs);
                    }
                }
            }
            let e = all.estimate(0.95, Window::RECORDING, R as u64).bytes;
            sum += e.estimate;
            held += u32::from(e.lower <= truth && truth <= e.upper);
            let l = live.estimate(0.95, Window::RECORDING, R as u64).bytes;
            live_held += u32::from(l.lower <= live_truth && live_truth <= l.upper);
        }
        let mean = sum / f64::from(runs);
        assert!((mean / truth - 1.0).abs() < 0.01, "mean {mean} vs {truth}");
        let coverage = |h: u32| f64::from(h) / f64::from(runs);
        assert!(coverage(held) >= 0.94, "bytes covered {}", coverage(held));
        assert!(
            coverage(live_held) >= 0.94,
            "live covered {}",
            coverage(live_held)
        );
    }
}
