//! Totals from time-sampled slots: the estimator for duty cycling (`--max-overhead`),
//! where probes are attached in some time slots only and a target pays nothing
//! in the others.
//!
//! **Design: one slot on per stratum.** Time is cut into strata of `m_h` slots (`m_h`
//! chosen before the stratum starts, from anything seen before: a controller's choice);
//! exactly one slot of each stratum, drawn uniformly, is on. A burst longer than a stratum
//! cannot be skipped wholesale, as it can when each slot is switched on independently
//! (that design's estimate and its variance estimate are low together when the on slots
//! mostly miss a burst: 86–91% coverage of 95% bounds in simulation).
//!
//! **Why a ratio to the target's own work, not time alone.** The probes slow the target
//! while they are on. A process that waits on I/O makes its calls at the pace of its
//! input, on or off; but a CPU-bound one makes fewer calls in an on slot than in an off
//! one (sqlite3: 2.5 times fewer; a bare malloc loop: 100 times), so weighting an on slot's
//! calls by `m` (Horvitz-Thompson over time) under-counts it by that much: measured, a
//! malloc loop's estimate was 1% of the truth. What an on slot samples is a stretch of the
//! program's *work*: its own CPU time, which the probes' cost is taken out of
//! (`own = cpu − κ·calls`, `κ` the measured cost per call). Allocations follow the work,
//! whatever the pace. So with `y_h`, `n_h`, `o_h = c_h − κ n_h` the on slot's quantity
//! (bytes, calls), calls and own work (`c_h` its CPU time), and `W_h = C_h − κ n_h` the
//! stratum's own work (`C_h` its CPU time, measured on and off: the CPU clock runs
//! throughout):
//!
//! * each stratum's total is the separate ratio `T̂_h = y_h W_h / o_h` (Cochran, *Sampling
//!   Techniques*, §6.10): exact whenever allocations follow the work at a steady density
//!   within the stratum, however much the probes slowed its on slot. With time as the
//!   work (`c_h` the on slot's length, `C_h` the stratum's, no calls) it is
//!   Horvitz-Thompson over time, `m_h y_h`, corrected for slots not quite as long as
//!   planned;
//! * a stratum whose on slot saw (almost) none of its work (a server idle in that slot,
//!   busy in others) cannot be scaled: its total is imputed at the ratio of all the seen
//!   strata, `W_h Σ y / Σ o`, which adds the ratio estimator's variance
//!   `W_unseen² Σ (y − R o)² / (Σ o)² · n/(n−1)`. (Pooling the ratio over all strata
//!   instead was biased by a quarter where the density changed between strata; leaving
//!   such strata at zero, by half where a target was idle in most slots: both simulated);
//! * variance: Cochran's collapsed strata (§5A.12): with one unit per stratum there is no
//!   within-stratum variance to estimate, so consecutive sampled strata are grouped in
//!   pairs (the last group a triple when their number is odd) and each group of `g` adds
//!   `g/(g-1) Σ (T̂_h - T̄)²`, whose expectation holds the byte sampling's variance too (it
//!   is inside each `y_h`), conservative by as much as the strata differ. A group is
//!   reduced to numbers when it closes, at the cost per call then;
//! * strata of one slot (always on) are certain: they add their byte-sampling variance
//!   only;
//! * bounds: Student's t with as many degrees of freedom as groups, on the log scale
//!   (`T̂ e^{±t s}`, `s² = ln(1 + V̂/T̂²)`): the estimate is skewed right;
//! * `κ` is known to within tens of percent only (the trap calibrated on our own process,
//!   the programs' time measured in windows), and where the probes cost the target far
//!   more than its own work (`c_h ≈ κ n_h`: a bare malloc loop) the own work of an on slot
//!   is a difference of two nearly equal numbers. The estimate is at the likeliest cost
//!   and the bounds the widest over the range ([`COST_RANGE`]): infinite above when the on
//!   slots' own work may be nothing at all. The estimate says so rather than being
//!   confidently wrong.
//!
//! No stratum with a slot on (none at all) bounds nothing: the upper bound is infinite.

use statrs::distribution::{ContinuousCDF as _, StudentsT};

use crate::stats::estimate::Estimate;

/// The probes' real cost per call to a target, as multiples of the cost measured (the
/// trap calibrated on allocscope's own probed function, the programs' time from the
/// kernel's statistics): the least, the likeliest and the most the bounds allow for. Real
/// targets pay more or less than the measure (caches and TLB entries the trap evicts, or
/// a warmer path than the calibration's): sqlite3 (1M inserts) spent 14% more CPU time
/// per call probed than measured; the benchmark's loop with 1 µs of arithmetic per
/// allocation 13% less (docs/performance.md, "Figures quoted from the code").
pub const COST_RANGE: [f64; 3] = [0.85, 1.0, 1.2];

/// What one stratum's on slot observed of a quantity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlotTotal {
    /// The slot's estimate `y` of the quantity (unbiased; exact for counted calls).
    pub estimate: f64,
    /// Its variance estimate (byte sampling).
    pub variance: f64,
    /// What was seen for sure (sampled bytes, exact calls): the lower bound's floor.
    pub seen: f64,
    /// Samples it rests on.
    pub samples: u64,
}

impl SlotTotal {
    /// The bytes and the objects of a set of samples taken in one on slot.
    pub fn of_samples(set: &crate::stats::SampleSet) -> (SlotTotal, SlotTotal) {
        let ht = set.horvitz_thompson();
        let samples = set.samples();
        (
            SlotTotal {
                estimate: ht.bytes,
                variance: ht.bytes_variance,
                seen: ht.sampled_bytes,
                samples,
            },
            SlotTotal {
                estimate: ht.objects,
                variance: ht.objects_variance,
                seen: samples as f64,
                samples,
            },
        )
    }

    /// Counts known exactly (the kernel's counters over an on slot): no variance.
    pub fn exact(count: u64) -> SlotTotal {
        SlotTotal {
            estimate: count as f64,
            variance: 0.0,
            seen: count as f64,
            samples: 0,
        }
    }
}

/// The target's work over one stratum: the auxiliary variable of the ratio.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StratumWork {
    /// Slots in the stratum, `m` (≤ 1: always on, certain).
    pub slots: f64,
    /// The target's CPU seconds over the stratum (or its length in seconds, where CPU time
    /// is not known), probes included.
    pub cpu: f64,
    /// The same over its on slot.
    pub on_cpu: f64,
    /// Allocation calls the probes saw in the on slot (each cost the target `κ`).
    pub on_calls: f64,
}

/// One sampled stratum, kept until its group closes.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Sampled {
    m: f64,
    y: f64,
    on_cpu: f64,
    on_calls: f64,
    cpu: f64,
}

impl Sampled {
    /// Own work of its on slot at `κ`: `o = c − κ n`.
    fn own(&self, kappa: f64) -> f64 {
        self.on_cpu - kappa * self.on_calls
    }

    /// Own work of the stratum at `κ`: `W = C − κ n`.
    fn work(&self, kappa: f64) -> f64 {
        self.cpu - kappa * self.on_calls
    }

    /// Its total `y W / o`, when its on slot saw some of its work (`None`: it saw none, or
    /// [`TOO_LITTLE_WORK`]).
    fn total(&self, kappa: f64) -> Option<f64> {
        let (o, w) = (self.own(kappa), self.work(kappa));
        (w > 0.0 && o > TOO_LITTLE_WORK * w / self.m).then(|| self.y * w / o)
    }
}

/// A total over strata with one slot on each, as a ratio to the target's own work.
#[derive(Clone, Debug, PartialEq)]
pub struct DutyTotal {
    /// The multiples of the measured `κ` allowed for ([`COST_RANGE`]).
    cost_range: [f64; 3],
    /// Certain strata: the quantity, its byte-sampling variance.
    certain: f64,
    certain_variance: f64,
    /// Closed groups' sums at each multiple of `κ` in the cost range.
    closed: [RatioSums; 3],
    groups: u64,
    /// The last complete pair of sampled strata, with the `κ` in force, and a stratum not
    /// paired yet.
    last_pair: Option<([Sampled; 2], f64)>,
    pending: Option<Sampled>,
    /// Own work observed (on slots and certain strata) and done, as CPU and calls (κ is
    /// applied when asked).
    observed: [f64; 2],
    done: [f64; 2],
    seen: f64,
    samples: u64,
    strata: u64,
}

impl Default for DutyTotal {
    fn default() -> Self {
        DutyTotal::with_cost_range(COST_RANGE)
    }
}

impl DutyTotal {
    /// An empty total allowing for the cost per call to be any of `cost_range` (least,
    /// likeliest, most) times the measured one.
    pub fn with_cost_range(cost_range: [f64; 3]) -> DutyTotal {
        DutyTotal {
            cost_range,
            certain: 0.0,
            certain_variance: 0.0,
            closed: [RatioSums::default(); 3],
            groups: 0,
            last_pair: None,
            pending: None,
            observed: [0.0; 2],
            done: [0.0; 2],
            seen: 0.0,
            samples: 0,
            strata: 0,
        }
    }

    /// Adds a stratum whose work was `work` and whose on slot observed `on`, the probes
    /// costing `ns_per_call` while it lasted.
    pub fn add_stratum(&mut self, work: StratumWork, on: SlotTotal, ns_per_call: f64) {
        self.strata += 1;
        self.seen += on.seen;
        self.samples += on.samples;
        self.done[0] += work.cpu;
        self.done[1] += work.on_calls;
        self.observed[0] += work.on_cpu;
        self.observed[1] += work.on_calls;
        if work.slots <= 1.0 {
            self.certain += on.estimate;
            self.certain_variance += on.variance;
            return;
        }
        let stratum = Sampled {
            m: work.slots,
            y: on.estimate,
            on_cpu: work.on_cpu,
            on_calls: work.on_calls,
            cpu: work.cpu,
        };
        let kappa = ns_per_call.max(0.0) * 1e-9;
        match self.pending.take() {
            None => self.pending = Some(stratum),
            Some(first) => {
                if let Some((pair, kappa)) = self.last_pair.replace(([first, stratum], kappa)) {
                    let kappas = self.kappas(kappa);
                    for (closed, k) in self.closed.iter_mut().zip(kappas) {
                        closed.add_group(&pair, k);
                    }
                    self.groups += 1;
                }
            }
        }
    }

    /// The cost range at a measured `κ`.
    fn kappas(&self, kappa: f64) -> [f64; 3] {
        self.cost_range.map(|multiple| kappa * multiple)
    }

    /// Strata added.
    pub fn strata(&self) -> u64 {
        self.strata
    }

    /// Share of the target's own work observed, at `ns_per_call` per observed call (of
    /// its time, where work is time).
    pub fn coverage(&self, ns_per_call: f64) -> f64 {
        let kappa = ns_per_call * 1e-9;
        let own = |[cpu, calls]: [f64; 2]| (cpu - kappa * calls).max(0.0);
        let done = own(self.done);
        if done > 0.0 {
            (own(self.observed) / done).min(1.0)
        } else {
            0.0
        }
    }

    /// The total with bounds at `confidence`, the probes costing the target `ns_per_call`
    /// now (earlier groups were closed at the cost then); the bounds are the widest over
    /// the cost's uncertainty.
    pub fn estimate(&self, confidence: f64, ns_per_call: f64) -> Estimate {
        let tail = (1.0 - confidence.clamp(0.0, 1.0)) / 2.0;
        let kappas = self.kappas(ns_per_call.max(0.0) * 1e-9);
        let mut results = [(0.0, 0.0, 0.0); 3];
        for (i, result) in results.iter_mut().enumerate() {
            let mut sums = self.closed[i];
            let mut groups = self.groups;
            match (self.last_pair, self.pending) {
                (Some(([a, b], _)), Some(c)) => sums.add_group(&[a, b, c], kappas[i]),
                (Some((pair, kappa)), None) => sums.add_group(&pair, self.kappas(kappa)[i]),
                // Nothing to compare a single sampled stratum with: unbounded.
                (None, Some(single)) => sums.add_group(&[single], kappas[i]),
                (None, None) => {}
            }
            if self.last_pair.is_some() || self.pending.is_some() {
                groups += 1;
            }
            let (mut total, mut variance) = sums.total();
            total += self.certain;
            variance += self.certain_variance;
            let (lower, upper) = bounds(total, variance, groups, tail);
            *result = (total, lower, upper);
        }
        let estimate = results[1].0;
        let lower = results.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
        let upper = results.iter().map(|r| r.2).fold(0.0, f64::max);
        Estimate {
            samples: self.samples,
            estimate,
            lower: lower.max(self.seen).min(estimate),
            upper: upper.max(estimate),
        }
    }
}

/// The share of a stratum's own work per slot below which its on slot is taken to have
/// seen none of it (its total is then imputed).
const TOO_LITTLE_WORK: f64 = 0.01;

/// Sums over sampled strata at one `κ`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct RatioSums {
    /// `Σ y_h W_h / o_h` over strata whose on slot saw some of their work.
    seen_total: f64,
    /// Collapsed-strata variance of the closed groups.
    variance: f64,
    /// Own work of strata whose on slot saw none of it: imputed at the end.
    unseen_work: f64,
    /// No own work seen where something was allocated, or more probe cost than CPU time
    /// (κ too large): the total is unbounded.
    unbounded: bool,
    /// `Σ m y`: the estimate by time alone, standing in when no own work was seen at all.
    time_alone: f64,
    /// Over the seen strata, for the imputation ratio and its variance: `Σ y`, `Σ o`,
    /// `Σ y²`, `Σ y o`, `Σ o²`, count.
    y: f64,
    o: f64,
    yy: f64,
    yo: f64,
    oo: f64,
    n: f64,
}

impl RatioSums {
    /// The ratio of quantity to own work over the seen strata so far.
    fn ratio(&self) -> Option<f64> {
        (self.o > 0.0).then(|| self.y / self.o)
    }

    /// The total and its variance: seen strata, plus the unseen ones' work at the ratio
    /// (with the ratio estimator's variance, `Σ (y − R o)² / (Σ o)² · n/(n−1)`).
    fn total(&self) -> (f64, f64) {
        let Some(r) = self.ratio() else {
            let variance = if self.time_alone > 0.0 || self.unseen_work > 0.0 {
                f64::INFINITY
            } else {
                self.variance
            };
            return (self.time_alone, variance);
        };
        let total = self.seen_total + r * self.unseen_work;
        if self.unbounded || (self.unseen_work > 0.0 && self.n < 2.0) {
            return (total, f64::INFINITY);
        }
        if self.unseen_work <= 0.0 {
            return (total, self.variance);
        }
        let residual = (self.yy - 2.0 * r * self.yo + r * r * self.oo).max(0.0);
        let ratio_variance = residual / (self.o * self.o) * self.n / (self.n - 1.0);
        (
            total,
            self.variance + self.unseen_work * self.unseen_work * ratio_variance,
        )
    }

    /// Adds a group of sampled strata: each stratum's total is what its on slot saw times
    /// the stratum's own work over the on slot's (`y_h W_h / o_h`: exact whenever
    /// allocations follow the work at a steady density within the stratum, however the
    /// probes slowed it); one whose on slot saw (almost) none of its work is imputed at
    /// the ratio of all seen strata.
    fn add_group(&mut self, strata: &[Sampled], kappa: f64) {
        for s in strata {
            let total = s.total(kappa);
            if s.work(kappa) < 0.0 || (total.is_none() && s.y > 0.0) {
                // The probes cost more than the target spent, or it allocated with no
                // work seen: κ is wrong here.
                self.unbounded = true;
            }
            if let Some(total) = total {
                let o = s.own(kappa);
                self.seen_total += total;
                self.y += s.y;
                self.o += o;
                self.yy += s.y * s.y;
                self.yo += s.y * o;
                self.oo += o * o;
                self.n += 1.0;
            } else {
                self.unseen_work += s.work(kappa).max(0.0);
            }
        }
        self.time_alone += strata.iter().map(|s| s.m * s.y).sum::<f64>();
        self.variance += group_variance(strata, kappa, self.ratio());
    }
}

/// Cochran's collapsed-strata variance of a group: `g/(g-1) Σ (T̂_h − T̄)²` over its
/// strata's totals, `y_h W_h / o_h`, or `ratio · W_h` where the on slot saw none of the
/// stratum's work; infinite for a single stratum.
fn group_variance(strata: &[Sampled], kappa: f64, ratio: Option<f64>) -> f64 {
    if strata.len() < 2 {
        return f64::INFINITY;
    }
    let totals: Vec<f64> = strata
        .iter()
        .map(|s| {
            s.total(kappa)
                .unwrap_or_else(|| ratio.unwrap_or(0.0) * s.work(kappa).max(0.0))
        })
        .collect();
    let g = totals.len() as f64;
    let mean = totals.iter().sum::<f64>() / g;
    g / (g - 1.0) * totals.iter().map(|t| (t - mean).powi(2)).sum::<f64>()
}

/// Bounds at `tail` on each side of `total` with `variance`, from `groups` groups of
/// sampled strata (none: the variance is byte sampling's only, normal).
fn bounds(total: f64, variance: f64, groups: u64, tail: f64) -> (f64, f64) {
    if tail <= 0.0 || !variance.is_finite() {
        return (0.0, f64::INFINITY);
    }
    if variance <= 0.0 {
        return (total, total);
    }
    let quantile = if groups == 0 {
        crate::stats::memo::normal_quantile(1.0 - tail)
    } else {
        StudentsT::new(0.0, 1.0, groups as f64)
            .map(|t| t.inverse_cdf(1.0 - tail))
            .unwrap_or(f64::INFINITY)
    };
    if total <= 0.0 {
        return (0.0, quantile * variance.sqrt());
    }
    let log_sd = (variance / (total * total)).ln_1p().sqrt();
    let factor = (quantile * log_sd).exp();
    (total / factor, total * factor)
}

#[cfg(test)]
mod tests {
    use rand::{Rng as _, SeedableRng as _};
    use rand_pcg::Pcg64;

    use super::*;
    use crate::stats::estimate::inclusion_probability;

    const SIZE: u64 = 64;
    const INTERVAL: u64 = 16 * 1024;
    const SLOT: f64 = 0.1;

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

    /// A simulated target. Its program is a sequence of work (own CPU seconds) whose
    /// allocation density (calls per own second) is `density(position)`. A CPU-bound
    /// target works through a whole slot of CPU, slowed by `cost` per call while on; an
    /// I/O-bound one does `SLOT · busy` of work per slot whatever the probes cost (its
    /// CPU time grows instead).
    struct Target<'a> {
        density: &'a dyn Fn(f64) -> f64,
        cost: f64,
        cpu_bound: bool,
        /// I/O-bound: the share of slot `i` it works.
        busy: &'a dyn Fn(u64) -> f64,
    }

    /// Slot `index` from work position `at`: (own work done, calls, CPU used).
    fn slot(target: &Target, index: u64, at: f64, on: bool) -> (f64, f64, f64) {
        let rate = (target.density)(at);
        let slowed = if on { target.cost * rate } else { 0.0 };
        let work = if target.cpu_bound {
            SLOT / (1.0 + slowed)
        } else {
            SLOT * (target.busy)(index)
        };
        let calls = work * rate;
        (
            work,
            calls,
            work + if on { target.cost * calls } else { 0.0 },
        )
    }

    /// Simulates `runs` duty-cycled recordings of `slots` slots; strata have `calm_m`
    /// slots, `busy_m` after a stratum whose on slot saw more than `busy` calls. With
    /// `sampled_bytes`, the on slots' bytes are byte-sampled (a stack); else counted
    /// exactly (a process). The estimator is told the cost per call divided by
    /// `measured_as`, and allows for `range` of multiples of it.
    /// Returns (mean estimate / truth, share of runs whose 95% bounds held the truth, mean
    /// width / truth).
    #[allow(clippy::too_many_arguments)]
    fn simulate(
        runs: u32,
        slots: u64,
        target: &Target,
        (calm_m, busy_m, busy): (u32, u32, f64),
        sampled_bytes: bool,
        (measured_as, range): (f64, [f64; 3]),
    ) -> (f64, f64, f64) {
        let pi = inclusion_probability(SIZE, INTERVAL);
        let n = SIZE as f64;
        let mut rng = Pcg64::seed_from_u64(15);
        let (mut ratio, mut held, mut width) = (0.0, 0u32, 0.0);
        for _ in 0..runs {
            let mut total = DutyTotal::with_cost_range(range);
            let ns = target.cost * 1e9 / measured_as;
            let (mut start, mut m, mut at, mut truth) = (0u64, calm_m, 0.0, 0.0);
            while start < slots {
                let size = u64::from(m).min(slots - start);
                let on_slot = rng.random_range(0..size);
                let mut work = StratumWork {
                    slots: f64::from(m),
                    cpu: 0.0,
                    on_cpu: 0.0,
                    on_calls: 0.0,
                };
                let mut on = SlotTotal::exact(0);
                for s in 0..size {
                    let (done, calls, cpu) = slot(target, start + s, at, s == on_slot);
                    let calls = calls.round();
                    at += done;
                    truth += calls * n;
                    work.cpu += cpu;
                    if s == on_slot {
                        work.on_cpu = cpu;
                        work.on_calls = calls;
                        on = if sampled_bytes {
                            let k = sampled(&mut rng, calls as u64, pi) as f64;
                            SlotTotal {
                                estimate: k * n / pi,
                                variance: k * n * n * (1.0 - pi) / (pi * pi),
                                seen: k * n,
                                samples: k as u64,
                            }
                        } else {
                            SlotTotal::exact((calls * n) as u64)
                        };
                    }
                }
                total.add_stratum(work, on, ns);
                m = if work.on_calls > busy { busy_m } else { calm_m };
                start += size;
            }
            let e = total.estimate(0.95, ns);
            ratio += e.estimate / truth;
            held += u32::from(e.lower <= truth && truth <= e.upper);
            width += (e.upper - e.lower) / truth;
        }
        let runs = f64::from(runs);
        (ratio / runs, f64::from(held) / runs, width / runs)
    }

    /// Unbiased within `bias`, 95% bounds holding the truth in `held` of the runs, and no
    /// wider than `max_width` of the truth on average.
    fn check(
        name: &str,
        (ratio, held, width): (f64, f64, f64),
        bias: f64,
        coverage: std::ops::RangeInclusive<f64>,
        max_width: f64,
    ) {
        eprintln!("{name}: estimate/truth {ratio:.4}, held {held:.3}, width {width:.3}");
        assert!(
            (ratio - 1.0).abs() < bias,
            "{name}: estimate / truth {ratio:.4}"
        );
        assert!(
            coverage.contains(&held),
            "{name}: 95% bounds held the truth in {held:.3}"
        );
        assert!(
            width < max_width,
            "{name}: mean width {width:.3} of the truth"
        );
    }

    const CALIBRATED: std::ops::RangeInclusive<f64> = 0.93..=0.99;
    const CONSERVATIVE: std::ops::RangeInclusive<f64> = 0.95..=1.0;
    /// κ known exactly; measured low by the likeliest multiple, allowed for as
    /// recordings do.
    const EXACT_KAPPA: (f64, [f64; 3]) = (1.0, [1.0; 3]);
    const AS_RECORDED: (f64, [f64; 3]) = (COST_RANGE[1], COST_RANGE);

    /// A target waiting on I/O at a steady pace: the probes do not change its calls.
    #[test]
    fn steady_io_bound() {
        let target = Target {
            density: &|_| 50_000.0,
            cost: 850e-9,
            cpu_bound: false,
            busy: &|_| 0.5,
        };
        let calm = (5, 5, f64::INFINITY);
        let result = simulate(1000, 200, &target, calm, true, EXACT_KAPPA);
        check("steady I/O-bound", result, 0.01, CALIBRATED, 0.3);
        // κ hardly matters to it (its probes cost 4% of its own time while on).
        let result = simulate(1000, 200, &target, calm, true, AS_RECORDED);
        check("steady I/O-bound, κ range", result, 0.01, CALIBRATED, 0.3);
    }

    /// sqlite3's density: 1.75 million calls per own second, 850 ns each while on (2.5
    /// times slower): time alone would estimate 40% of the truth.
    #[test]
    fn cpu_bound_slowed_by_the_probes() {
        let target = Target {
            density: &|_| 1.75e6,
            cost: 850e-9,
            cpu_bound: true,
            busy: &|_| 1.0,
        };
        let calm = (10, 10, f64::INFINITY);
        let result = simulate(1000, 200, &target, calm, true, EXACT_KAPPA);
        check("CPU-bound, byte-sampled", result, 0.01, CALIBRATED, 0.3);
        // Exact counts: the strata agree, the bounds are κ's.
        let result = simulate(1000, 200, &target, calm, false, AS_RECORDED);
        check("CPU-bound, exact, κ range", result, 0.01, CONSERVATIVE, 0.6);
        // The real cost at either end of the range.
        for end in [COST_RANGE[0], COST_RANGE[2]] {
            let result = simulate(1000, 200, &target, calm, true, (end, COST_RANGE));
            let (ratio, held, _) = result;
            eprintln!("CPU-bound, κ × {end}: estimate/truth {ratio:.4}, held {held:.3}");
            assert!(held >= 0.95, "{held}");
        }
    }

    /// Phases: a ramp, a burst 5× the density, a quiet stretch; the controller samples
    /// less after busy strata (one slot in 10 instead of 4). The collapsed strata count
    /// the changes of pace as variance: conservative.
    #[test]
    fn phases_under_a_controller() {
        let density = |work: f64| {
            let base = 200_000.0 * (1.0 + work);
            match work {
                w if (3.0..4.0).contains(&w) => 5.0 * base,
                w if (6.0..7.5).contains(&w) => base / 10.0,
                _ => base,
            }
        };
        for cpu_bound in [false, true] {
            let target = Target {
                density: &density,
                cost: 850e-9,
                cpu_bound,
                busy: &|_| 0.5,
            };
            let controller = (4, 10, 30_000.0);
            let result = simulate(1000, 200, &target, controller, true, EXACT_KAPPA);
            let name = format!("phases, CPU-bound {cpu_bound}");
            check(&name, result, 0.02, CONSERVATIVE, 1.5);
        }
    }

    /// Short bursts (one slot in 25 at 20× the base), shorter than a stratum.
    #[test]
    fn short_bursts() {
        let target = Target {
            density: &|work: f64| {
                if (work / (SLOT * 0.5)) as u64 % 25 == 7 {
                    400_000.0
                } else {
                    20_000.0
                }
            },
            cost: 850e-9,
            cpu_bound: false,
            busy: &|_| 0.5,
        };
        let calm = (5, 5, f64::INFINITY);
        let result = simulate(1000, 400, &target, calm, true, EXACT_KAPPA);
        check("short bursts", result, 0.03, 0.90..=0.99, 1.2);
    }

    /// Requests now and then: the target works in 2 slots of every 7 (the on slot often
    /// sees none of its work), at a density that drifts.
    #[test]
    fn idle_between_bursts_of_work() {
        let target = Target {
            density: &|work: f64| 300_000.0 * (1.0 + (work * 3.0).sin().abs()),
            cost: 850e-9,
            cpu_bound: false,
            busy: &|slot| if slot % 7 < 2 { 0.9 } else { 0.0 },
        };
        let calm = (5, 5, f64::INFINITY);
        let result = simulate(1000, 400, &target, calm, true, AS_RECORDED);
        check("idle between bursts", result, 0.03, 0.93..=1.0, 1.5);
    }

    /// A bare malloc loop: the probes cost 100 times its own work. The own work of an on
    /// slot is within κ's uncertainty of nothing: no upper bound, and the truth is held.
    #[test]
    fn a_storm_swamped_by_the_probes_has_no_upper_bound() {
        let target = Target {
            density: &|_| 1.1e8,
            cost: 850e-9,
            cpu_bound: true,
            busy: &|_| 1.0,
        };
        let storm = (21, 21, f64::INFINITY);
        let (ratio, held, _) = simulate(200, 200, &target, storm, false, AS_RECORDED);
        eprintln!("storm: estimate/truth {ratio:.4}, held {held:.3}");
        assert!(held >= 0.99, "{held}");
        assert!((ratio - 1.0).abs() < 0.05, "{ratio}");
        let mut total = DutyTotal::default();
        for _ in 0..4 {
            let (_, calls, cpu) = slot(&target, 0, 0.0, true);
            let work = StratumWork {
                slots: 21.0,
                cpu: cpu + 20.0 * SLOT,
                on_cpu: cpu,
                on_calls: calls.round(),
            };
            total.add_stratum(work, SlotTotal::exact(calls.round() as u64 * SIZE), 850.0);
        }
        assert!(total.estimate(0.95, 850.0).upper.is_infinite());
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
        let work = StratumWork {
            slots: 1.0,
            cpu: 1.0,
            on_cpu: 1.0,
            on_calls: 10.0,
        };
        total.add_stratum(work, slot, 800.0);
        total.add_stratum(work, slot, 800.0);
        assert_eq!(total.coverage(0.0), 1.0);
        let e = total.estimate(0.95, 800.0);
        assert_eq!(e.estimate, 2000.0);
        // Normal bounds from the byte-sampling variance alone: ±1.96 · √800.
        assert!(
            (e.upper - e.estimate - 1.96 * 800f64.sqrt()).abs() < 2.0,
            "{e:?}"
        );
        assert!(e.lower >= 200.0 && e.lower < 2000.0);
    }

    #[test]
    fn one_sampled_stratum_bounds_nothing() {
        let mut total = DutyTotal::default();
        assert_eq!(total.estimate(0.95, 0.0).upper, 0.0);
        let work = StratumWork {
            slots: 4.0,
            cpu: 0.4,
            on_cpu: 0.1,
            on_calls: 0.0,
        };
        total.add_stratum(work, SlotTotal::exact(10), 0.0);
        let e = total.estimate(0.95, 0.0);
        assert_eq!(e.estimate, 40.0);
        assert!(e.upper.is_infinite());
        assert_eq!(total.coverage(0.0), 0.25);
    }

    /// With time as the work and slots as planned, the estimate is Horvitz-Thompson over
    /// time: `m` times what the on slots saw, and the collapsed strata as in Cochran.
    #[test]
    fn time_as_work_is_horvitz_thompson() {
        let mut total = DutyTotal::default();
        for seen in [1u64, 3, 5, 5, 2] {
            let work = StratumWork {
                slots: 2.0,
                cpu: 2.0 * SLOT,
                on_cpu: SLOT,
                on_calls: 0.0,
            };
            total.add_stratum(work, SlotTotal::exact(seen), 0.0);
        }
        let e = total.estimate(0.95, 0.0);
        assert!((e.estimate - 32.0).abs() < 1e-9, "{e:?}");
        // Strata totals 2, 6, 10, 10, 4: the pair (2, 6), then the triple (10, 10, 4), each
        // with Cochran's collapsed-strata variance.
        assert_eq!(total.groups, 1);
        let stratum = |y: f64| Sampled {
            m: 2.0,
            y,
            on_cpu: SLOT,
            on_calls: 0.0,
            cpu: 2.0 * SLOT,
        };
        let group = |strata: &[Sampled]| {
            let mut sums = RatioSums::default();
            sums.add_group(strata, 0.0);
            sums.total()
        };
        let pair = group(&[stratum(1.0), stratum(3.0)]);
        assert!(
            (pair.0 - 8.0).abs() < 1e-9 && (pair.1 - 16.0).abs() < 1e-9,
            "{pair:?}"
        );
        let triple = group(&[stratum(5.0), stratum(5.0), stratum(2.0)]);
        assert!((triple.0 - 24.0).abs() < 1e-9 && (triple.1 - 36.0).abs() < 1e-9);
        let t = StudentsT::new(0.0, 1.0, 2.0).unwrap().inverse_cdf(0.975);
        let factor = (t * (52.0f64 / (32.0 * 32.0)).ln_1p().sqrt()).exp();
        assert!((e.upper - 32.0 * factor).abs() < 1e-6, "{e:?}");
    }
}
