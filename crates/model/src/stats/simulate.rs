//! Calibration by simulation: replays the kernel's sampling decision (the same integer
//! geometric draw, `sampler_common::geometric::draw`) over allocation patterns whose totals
//! are known, many times, and measures bias and interval coverage of every estimator.
//!
//! Used by the unit tests (which assert unbiasedness and calibrated coverage) and by the
//! `calibration` example, which prints the table so anyone can re-check a change:
//! `cargo run --release -p sampler-user --example calibration --features simulation`.

use rand::{RngCore as _, SeedableRng as _};
use rand_pcg::Pcg64;
use sampler_common::geometric;

use super::estimate::{SampleObs, SampleSet, Window};

/// An allocation pattern: one period of sizes, repeated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// 32-byte objects only (the weighted estimator's worst case: tiny inclusion probability).
    TinyFixed,
    /// Sizes from 16 bytes to 5× the interval.
    MixedSizes,
    /// Blocks of one to three intervals (most are sampled, some are not).
    LargeBlocks,
    /// One big block then 64 tiny ones per interval-sized period: fixed-stride sampling
    /// would see only the big block.
    PeriodicBigTiny,
}

impl Pattern {
    /// Every pattern.
    pub const ALL: [Pattern; 4] = [
        Pattern::TinyFixed,
        Pattern::MixedSizes,
        Pattern::LargeBlocks,
        Pattern::PeriodicBigTiny,
    ];

    /// One period of allocation sizes at mean interval `interval`.
    pub fn period(self, interval: u64) -> Vec<u64> {
        match self {
            Pattern::TinyFixed => vec![32],
            Pattern::MixedSizes => vec![16, 100, 700, 3000, interval / 2, 5 * interval, 48],
            Pattern::LargeBlocks => vec![interval, 3 * interval / 2, 2 * interval, 3 * interval],
            Pattern::PeriodicBigTiny => {
                let mut period = vec![interval - 64 * 16];
                period.extend([16; 64]);
                period
            }
        }
    }
}

/// Bias and coverage measured over many simulated recordings.
#[derive(Clone, Copy, Debug)]
pub struct Calibration {
    /// Simulated recordings.
    pub runs: u32,
    /// Mean samples per recording.
    pub mean_samples: f64,
    /// Mean Horvitz-Thompson estimate / truth.
    pub weighted_bias: f64,
    /// Mean trials estimate / truth.
    pub trials_bias: f64,
    /// Fraction of runs whose reported byte interval held the truth.
    pub coverage: f64,
    /// Fraction of runs whose object interval held the true count.
    pub objects_coverage: f64,
    /// Mean live-bytes estimate / true live bytes (every third object stays live).
    pub live_bias: f64,
    /// Fraction of runs whose live-bytes interval held the true live bytes.
    pub live_coverage: f64,
}

/// Simulates `runs` recordings of `pattern` allocating about `target_samples` intervals'
/// worth of bytes each, at `interval`, seeded by `seed`.
pub fn calibrate(
    pattern: Pattern,
    interval: u64,
    target_samples: u64,
    runs: u32,
    confidence: f64,
    seed: u64,
) -> Calibration {
    let period = pattern.period(interval);
    let period_bytes: u64 = period.iter().sum();
    let periods = (target_samples * interval).div_ceil(period_bytes).max(1);
    let scale = geometric::scale_q32(interval).expect("valid interval");
    let mut rng = Pcg64::seed_from_u64(seed);
    let (mut samples, mut weighted, mut trials, mut covered, mut objects_covered) =
        (0u64, 0.0, 0.0, 0u32, 0u32);
    let (mut live_sum, mut live_covered) = (0.0, 0u32);
    let (mut truth_bytes, mut truth_live) = (0u64, 0u64);
    for _ in 0..runs {
        let mut all = SampleSet::default();
        let mut live = SampleSet::default();
        let mut countdown = geometric::draw(rng.next_u64(), scale);
        let (mut bytes, mut objects, mut live_bytes) = (0u64, 0u64, 0u64);
        for index in 0..periods * period.len() as u64 {
            let size = period[(index % period.len() as u64) as usize];
            let keep = index % 3 == 0;
            bytes += size;
            objects += 1;
            if keep {
                live_bytes += size;
            }
            if countdown < size {
                let obs = SampleObs {
                    size,
                    offset: countdown,
                    interval,
                    weight: None,
                };
                all.add(obs);
                live.add(obs);
                if !keep {
                    live.remove(obs);
                }
                countdown = geometric::draw(rng.next_u64(), scale);
            } else {
                countdown -= size;
            }
        }
        (truth_bytes, truth_live) = (bytes, live_bytes);
        let e = all.estimate(confidence, Window::RECORDING, interval);
        samples += all.samples();
        weighted += e.bytes.estimate;
        trials += e.bytes_by_trials;
        covered += u32::from(e.bytes.lower <= bytes as f64 && bytes as f64 <= e.bytes.upper);
        objects_covered +=
            u32::from(e.objects.lower <= objects as f64 && objects as f64 <= e.objects.upper);
        let l = live.estimate(confidence, Window::RECORDING, interval);
        live_sum += l.bytes.estimate;
        live_covered +=
            u32::from(l.bytes.lower <= live_bytes as f64 && live_bytes as f64 <= l.bytes.upper);
    }
    let runs_f = f64::from(runs);
    Calibration {
        runs,
        mean_samples: samples as f64 / runs_f,
        weighted_bias: weighted / runs_f / truth_bytes as f64,
        trials_bias: trials / runs_f / truth_bytes as f64,
        coverage: f64::from(covered) / runs_f,
        objects_coverage: f64::from(objects_covered) / runs_f,
        live_bias: live_sum / runs_f / truth_live as f64,
        live_coverage: f64::from(live_covered) / runs_f,
    }
}

/// Bias and coverage of allocated bytes when the interval steps from `before` to `after`
/// halfway through (the throttle's change, allocscope-engine's `throttle`), replayed as the kernel
/// does it: a countdown drawn at the old interval runs out before the new one applies, and
/// each sample carries the interval its countdown was drawn at. Returns (mean estimate /
/// truth, coverage of the bytes interval, mean samples).
pub fn calibrate_step(
    pattern: Pattern,
    (before, after): (u64, u64),
    target_samples: u64,
    runs: u32,
    confidence: f64,
    seed: u64,
) -> (f64, f64, f64) {
    let period = pattern.period(before);
    let period_bytes: u64 = period.iter().sum();
    let periods = (target_samples * before).div_ceil(period_bytes).max(1);
    let allocations = periods * period.len() as u64;
    let scale = |interval| geometric::scale_q32(interval).expect("valid interval");
    let mut rng = Pcg64::seed_from_u64(seed);
    let (mut ratio, mut covered, mut samples) = (0.0, 0u32, 0u64);
    for _ in 0..runs {
        let mut all = SampleSet::default();
        let mut drawn_at = before;
        let mut countdown = geometric::draw(rng.next_u64(), scale(drawn_at));
        let mut bytes = 0u64;
        for index in 0..allocations {
            let size = period[(index % period.len() as u64) as usize];
            let in_force = if index < allocations / 2 {
                before
            } else {
                after
            };
            bytes += size;
            if countdown < size {
                all.add(SampleObs {
                    size,
                    offset: countdown,
                    interval: drawn_at,
                    weight: None,
                });
                drawn_at = in_force;
                countdown = geometric::draw(rng.next_u64(), scale(drawn_at));
            } else {
                countdown -= size;
            }
        }
        let e = all.estimate(confidence, Window::RECORDING, before.max(after));
        samples += all.samples();
        ratio += e.bytes.estimate / bytes as f64;
        covered += u32::from(e.bytes.lower <= bytes as f64 && bytes as f64 <= e.bytes.upper);
    }
    let runs = f64::from(runs);
    (
        ratio / runs,
        f64::from(covered) / runs,
        samples as f64 / runs,
    )
}

/// A heap's shape over time, for [`calibrate_peak`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeakShape {
    /// Builds `blocks` blocks once, then frees them all.
    OneRise,
    /// Builds `blocks` blocks and frees them, `rounds` times over: the same peak each time.
    Sawtooth {
        /// Fillings.
        rounds: u32,
    },
    /// Builds `blocks` blocks once while allocating and freeing at once 20 times as many
    /// small temporary ones.
    RiseWithChurn,
}

/// Coverage of the estimate at the peak ([`super::peak`]) over `runs` recordings
/// of `shape`, `blocks` blocks of `size` bytes per filling, at `interval`: (runs whose
/// bounds held the true live bytes at the chosen moment, runs whose bounds held the true
/// peak, mean estimate / true peak).
pub fn calibrate_peak(
    shape: PeakShape,
    (blocks, size): (u64, u64),
    interval: u64,
    runs: u32,
    confidence: f64,
    seed: u64,
) -> (f64, f64, f64) {
    use super::peak::{estimate_at_peak, fillings};
    let mut sampler = Sampler::new(interval, seed);
    let (mut at_moment, mut at_peak, mut ratio) = (0u32, 0u32, 0.0);
    for _ in 0..runs {
        let run = PeakRun::simulate(shape, (blocks, size), &mut sampler);
        let k = fillings(run.all.estimated_bytes(), run.at_peak.estimated_bytes());
        let e = estimate_at_peak(&run.at_peak, confidence, k, interval).bytes;
        let holds = |truth: u64| e.lower <= truth as f64 && truth as f64 <= e.upper;
        at_moment += u32::from(holds(run.true_then));
        at_peak += u32::from(holds(run.true_peak));
        ratio += e.estimate / run.true_peak as f64;
    }
    let runs = f64::from(runs);
    (
        f64::from(at_moment) / runs,
        f64::from(at_peak) / runs,
        ratio / runs,
    )
}

/// The kernel's countdown over a stream of allocations.
struct Sampler {
    rng: Pcg64,
    scale: u64,
    interval: u64,
    countdown: u64,
}

impl Sampler {
    fn new(interval: u64, seed: u64) -> Sampler {
        let scale = geometric::scale_q32(interval).expect("valid interval");
        let mut rng = Pcg64::seed_from_u64(seed);
        let countdown = geometric::draw(rng.next_u64(), scale);
        Sampler {
            rng,
            scale,
            interval,
            countdown,
        }
    }

    /// An allocation of `size` bytes: its sample, when the countdown runs out in it.
    fn allocate(&mut self, size: u64) -> Option<SampleObs> {
        if self.countdown >= size {
            self.countdown -= size;
            return None;
        }
        let obs = SampleObs {
            size,
            offset: self.countdown,
            interval: self.interval,
            weight: None,
        };
        self.countdown = geometric::draw(self.rng.next_u64(), self.scale);
        Some(obs)
    }
}

/// One simulated recording for [`calibrate_peak`]: the samples live at the peak found, all
/// samples, and the truth (live bytes at the moment found, and the true peak).
struct PeakRun {
    at_peak: SampleSet,
    all: SampleSet,
    true_then: u64,
    true_peak: u64,
}

impl PeakRun {
    fn simulate(shape: PeakShape, (blocks, size): (u64, u64), sampler: &mut Sampler) -> PeakRun {
        let rounds = match shape {
            PeakShape::Sawtooth { rounds } => rounds,
            _ => 1,
        };
        let mut peaks = super::peak::Peaks::default();
        let (mut live, mut all) = (SampleSet::default(), SampleSet::default());
        let (mut true_live, mut true_peak, mut true_then) = (0u64, 0u64, 0u64);
        let mut clock = 0u64;
        let mut change = |live: &mut SampleSet, obs: SampleObs, added: bool, clock: u64| {
            peaks.before_change(0, 1, live);
            if added {
                live.add(obs);
            } else {
                live.remove(obs);
            }
            peaks.after_change(1, obs, added, clock);
            peaks.process(1).map(|p| p.at_ns) == Some(clock)
        };
        for _ in 0..rounds {
            let mut held = Vec::with_capacity(blocks as usize);
            for _ in 0..blocks {
                let obs = sampler.allocate(size);
                (true_live, clock) = (true_live + size, clock + 1);
                true_peak = true_peak.max(true_live);
                if let Some(obs) = obs {
                    all.add(obs);
                    if change(&mut live, obs, true, clock) {
                        true_then = true_live;
                    }
                }
                held.push(obs);
                if shape == PeakShape::RiseWithChurn {
                    // 20 temporary blocks of a tenth of the size, freed at once.
                    for obs in (0..20).filter_map(|_| sampler.allocate(size / 10 + 1)) {
                        all.add(obs);
                    }
                }
            }
            for obs in held {
                (true_live, clock) = (true_live - size, clock + 1);
                if let Some(obs) = obs {
                    change(&mut live, obs, false, clock);
                }
            }
        }
        PeakRun {
            at_peak: peaks.at_peak(0, 1, &live),
            all,
            true_then,
            true_peak,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The estimate at the peak: 95% bounds hold the live bytes at the chosen moment, and
    /// the true peak, in at least 93% of 1000 runs whether the heap is filled once, 100
    /// times over (without the widening, about 0.975¹⁰⁰ ≈ 8% of runs), or beside heavy
    /// churn. Filled once, the estimate is unbiased (within 2%); filled 100 times it leans
    /// high by selection (measured +9% at ~250 samples a filling), which the bounds hold.
    #[test]
    fn the_peak_is_bounded_however_often_the_heap_is_refilled() {
        for (i, shape) in [
            PeakShape::OneRise,
            PeakShape::Sawtooth { rounds: 100 },
            PeakShape::RiseWithChurn,
        ]
        .into_iter()
        .enumerate()
        {
            let (moment, peak, ratio) =
                calibrate_peak(shape, (400, 4096), 4096, 1000, 0.95, 500 + i as u64);
            eprintln!("{shape:?}: at the moment {moment:.3}, the peak {peak:.3}, estimate/peak {ratio:.4}");
            assert!(moment >= 0.93 && peak >= 0.93, "{shape:?}: {moment} {peak}");
            let most = match shape {
                PeakShape::Sawtooth { .. } => 0.15,
                _ => 0.02,
            };
            assert!((ratio - 1.0).abs() < most, "{shape:?}: {ratio}");
        }
    }

    /// The throttle raising the interval 16-fold halfway (a storm) and lowering it 16-fold
    /// (the storm over): unbiased within 1.5%, 95% bounds covering 93–97.5% of 2000 runs.
    #[test]
    fn a_step_change_of_the_interval_keeps_estimates_unbiased_and_calibrated() {
        for (i, pattern) in Pattern::ALL.into_iter().enumerate() {
            for step in [(4096, 65536), (65536, 4096)] {
                let (ratio, coverage, samples) =
                    calibrate_step(pattern, step, 400, 2000, 0.95, 300 + i as u64);
                eprintln!("{pattern:?} {step:?}: estimate/truth {ratio:.4}, coverage {coverage:.3}, {samples:.0} samples");
                assert!((ratio - 1.0).abs() < 0.015, "{pattern:?} {step:?}: {ratio}");
                assert!(
                    (0.93..=0.975).contains(&coverage),
                    "{pattern:?} {step:?}: coverage {coverage}"
                );
            }
        }
    }

    /// Unbiased within 1% and 95% intervals covering the truth in 93–97% of 2000 runs, for
    /// every pattern, for allocated and live bytes.
    #[test]
    fn estimators_are_unbiased_and_calibrated() {
        for (i, pattern) in Pattern::ALL.into_iter().enumerate() {
            let c = calibrate(pattern, 4096, 200, 2000, 0.95, 100 + i as u64);
            eprintln!("{pattern:?}: {c:?}");
            assert!(
                (c.weighted_bias - 1.0).abs() < 0.01,
                "{pattern:?} weighted: {c:?}"
            );
            assert!(
                (c.trials_bias - 1.0).abs() < 0.01,
                "{pattern:?} trials: {c:?}"
            );
            assert!((c.live_bias - 1.0).abs() < 0.01, "{pattern:?} live: {c:?}");
            assert!(
                (0.93..=0.97).contains(&c.coverage),
                "{pattern:?} coverage: {c:?}"
            );
            assert!(
                (0.93..=0.97).contains(&c.live_coverage),
                "{pattern:?} live coverage: {c:?}"
            );
            // Objects: Fay-Feuer is conservative when the unsampled objects resemble the sampled
            // ones. MixedSizes breaks that on purpose (16-byte objects that are sampled in one
            // run out of eight stand for 256 objects each); its coverage is reported by the
            // example, not asserted. One stack usually allocates one type, where it holds.
            if pattern != Pattern::MixedSizes {
                assert!(
                    (0.93..=0.995).contains(&c.objects_coverage),
                    "{pattern:?} objects: {c:?}"
                );
            }
        }
    }
}
