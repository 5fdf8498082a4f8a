//! Quantiles of the negative binomial distribution of failed trials.
//!
//! `X ~ NegBin(s, p)` counts the failures before the `s`-th success of Bernoulli(p) trials;
//! its CDF is the regularized incomplete beta function, `P(X ≤ k) = I_p(s, k + 1)`
//! (computed by statrs). For many successes the Camp-Paulson approximation (Wilson-Hilferty
//! cube-root transform of the equivalent F distribution; the .NET note, after Barko 1966)
//! replaces it: at `s ≥` [`CAMP_PAULSON_MIN_SUCCESSES`] its CDF error is below 5·10⁻⁵ (a
//! quantile error of a few parts per million). A
//! quantile is the smallest `k` with `P(X ≤ k) ≥ α`, found by bisection between bounds from
//! the normal approximation, widened until they bracket it.

use statrs::{
    distribution::{ContinuousCDF as _, Normal},
    function::beta::checked_beta_reg,
};

/// From this many successes on, [`cdf`] uses the Camp-Paulson approximation.
pub const CAMP_PAULSON_MIN_SUCCESSES: f64 = 100.0;

/// Camp-Paulson approximation of `P(X ≤ k)`, `X ~ NegBin(successes, p)`: through
/// `P(X ≤ k) = 1 - P(Bin(k + s, p) ≤ s - 1)` and the binomial's F-distribution form.
pub fn camp_paulson_cdf(successes: f64, p: f64, k: f64) -> f64 {
    if p >= 1.0 {
        return 1.0;
    }
    // P(Bin(n, p) ≤ m) = P(F(2(m+1), 2(n-m)) > f0) with n = k + s, m = s - 1.
    let (m, n) = (successes - 1.0, k + successes);
    let (nu1, nu2) = (2.0 * (m + 1.0), 2.0 * (n - m));
    let f0 = (n - m) * p / ((m + 1.0) * (1.0 - p));
    let (a, b) = (2.0 / (9.0 * nu1), 2.0 / (9.0 * nu2));
    let cube_root = f0.cbrt();
    let z = ((1.0 - b) * cube_root - (1.0 - a)) / (b * cube_root * cube_root + a).sqrt();
    let standard = Normal::standard();
    // 1 - P(Bin ≤ m) = 1 - (1 - Φ(z)) = Φ(z).
    standard.cdf(z)
}

/// `P(X ≤ k)` for `X ~ NegBin(successes, p)`; `successes > 0` (real values allowed: the
/// moment-matched distribution of mixed intervals has a fractional shape), `0 < p ≤ 1`.
pub fn cdf(successes: f64, p: f64, k: f64) -> f64 {
    if p >= 1.0 {
        return 1.0;
    }
    if successes >= CAMP_PAULSON_MIN_SUCCESSES {
        return camp_paulson_cdf(successes, p, k);
    }
    checked_beta_reg(successes, k + 1.0, p).unwrap_or(f64::NAN)
}

thread_local! {
    /// Quantiles computed so far on this thread, by their exact arguments: a profile's
    /// stacks with the same number of samples at the same interval ask for the same bound
    /// (a build's 6,000 samples in 100 processes: a quarter of allocscope's CPU was these
    /// bisections).
    static MEMO: super::memo::Memo<3> = std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Smallest `k` (whole failures) with `P(X ≤ k) ≥ alpha`. `successes > 0`, `0 < p ≤ 1`,
/// `0 < alpha < 1`; returns 0 for degenerate input rather than NaN. Remembered per thread
/// ([`super::memo`]): a pure function of its arguments.
pub fn quantile(successes: f64, p: f64, alpha: f64) -> f64 {
    super::memo::remembered(&MEMO, [successes, p, alpha], || {
        compute_quantile(successes, p, alpha)
    })
}

/// [`quantile`], computed.
fn compute_quantile(successes: f64, p: f64, alpha: f64) -> f64 {
    let in_range = |x: f64, low: f64, high: f64| x > low && x < high;
    if !(in_range(successes, 0.0, f64::INFINITY)
        && in_range(p, 0.0, 1.0)
        && in_range(alpha, 0.0, 1.0))
    {
        return 0.0;
    }
    let s = successes;
    let mean = s * (1.0 - p) / p;
    let sd = (s * (1.0 - p)).sqrt() / p;
    // Bracket: lo has CDF < alpha (or is 0), hi has CDF ≥ alpha.
    let mut lo = 0.0f64;
    let mut hi = (mean + 10.0 * sd).max(1.0);
    while cdf(successes, p, hi) < alpha {
        lo = hi;
        hi *= 2.0;
        if !hi.is_finite() {
            return f64::MAX;
        }
    }
    let guess = (mean - 10.0 * sd).floor();
    if guess > lo && cdf(successes, p, guess) < alpha {
        lo = guess;
    }
    if cdf(successes, p, lo) >= alpha {
        return lo;
    }
    // Invariant: CDF(lo) < alpha ≤ CDF(hi). Whole failures down to a spacing of one, or
    // of a few parts per 10¹², where f64 no longer holds every integer (beyond 2⁵³ the
    // midpoint would round back onto an end and the loop never end).
    let resolution = |hi: f64| (hi * 1e-12).max(1.0);
    while hi - lo > resolution(hi) {
        let mid = ((lo + hi) / 2.0).floor();
        if mid <= lo || mid >= hi {
            break;
        }
        if cdf(successes, p, mid) < alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Failures beyond 2⁵³ (millions of samples at a 1 GiB interval): the bisection ends,
    /// at the right place within its resolution.
    #[test]
    fn quantiles_beyond_exact_integers_end() {
        for &(s, p) in &[(5e7, 1e-9), (1e9, 1e-10), (3e8, 2f64.powi(-30))] {
            let q = quantile(s, p, 0.975);
            let (mean, sd) = (s * (1.0 - p) / p, (s * (1.0 - p)).sqrt() / p);
            let z = (q - mean) / sd;
            assert!(
                (z - 1.959964).abs() < 1e-3,
                "s={s} p={p}: q={q} is {z} sd from the mean"
            );
        }
    }

    /// The .NET note's table: successes, CDF⁻¹(0.025), CDF⁻¹(0.975) at p = 1/102400.
    const DOTNET_TABLE: [(u64, f64, f64); 25] = [
        (1, 2591.0, 377738.0),
        (2, 24800.0, 570531.0),
        (3, 63349.0, 739802.0),
        (4, 111599.0, 897761.0),
        (5, 166241.0, 1048730.0),
        (6, 225469.0, 1194827.0),
        (7, 288185.0, 1337279.0),
        (8, 353666.0, 1476870.0),
        (9, 421407.0, 1614137.0),
        (10, 491039.0, 1749469.0),
        (20, 1250954.0, 3038270.0),
        (30, 2072639.0, 4264804.0),
        (40, 2926207.0, 5459335.0),
        (50, 3800118.0, 6633475.0),
        (100, 8331581.0, 12342053.0),
        (200, 17739679.0, 23413825.0),
        (300, 27341465.0, 34291862.0),
        (400, 37043463.0, 45069676.0),
        (500, 46809487.0, 55783459.0),
        (1000, 96149867.0, 108842093.0),
        (2000, 195919830.0, 213870137.0),
        (3000, 296301551.0, 318286418.0),
        (4000, 396999923.0, 422386047.0),
        (5000, 497900649.0, 526283322.0),
        (10000, 1004017229.0, 1044156743.0),
    ];

    #[test]
    fn reproduces_the_dotnet_quantile_table_within_0_1_percent() {
        let p = 1.0 / 102400.0;
        for (s, low, high) in DOTNET_TABLE {
            let got_low = quantile(s as f64, p, 0.025);
            let got_high = quantile(s as f64, p, 0.975);
            assert!(
                (got_low - low).abs() <= 0.001 * low,
                "s={s}: {got_low} vs {low}"
            );
            assert!(
                (got_high - high).abs() <= 0.001 * high,
                "s={s}: {got_high} vs {high}"
            );
        }
    }

    /// The note reports Camp-Paulson within ~0.01 of the true CDF at s = 1 and ~0.001 at
    /// s = 5, improving with s; checked on its table, and against the exact CDF where the
    /// fast path takes over.
    #[test]
    fn camp_paulson_is_within_the_reported_tolerance() {
        let p = 1.0 / 102400.0;
        for (s, low, high) in DOTNET_TABLE {
            let tolerance = match s {
                1..=4 => 0.015,
                5..=99 => 0.001,
                _ => 5e-5,
            };
            for (k, target) in [(low, 0.025), (high, 0.975)] {
                let approx = camp_paulson_cdf(s as f64, p, k);
                assert!(
                    (approx - target).abs() <= tolerance,
                    "s={s} k={k}: {approx} vs {target}"
                );
            }
        }
        for k in [8.0e6, 1.0e7, 1.2e7] {
            let exact = checked_beta_reg(100.0, k + 1.0, p).unwrap();
            let approx = camp_paulson_cdf(100.0, p, k);
            assert!(
                (approx - exact).abs() < 5e-5,
                "k={k}: {approx} vs exact {exact}"
            );
        }
    }

    #[test]
    fn reproduces_the_dotnet_worked_example() {
        let p = 1.0 / 102400.0;
        assert!((cdf(8.0, p, 353666.0) - 0.025).abs() < 1e-4);
        assert!((cdf(8.0, p, 1476870.0) - 0.975).abs() < 1e-4);
    }

    #[test]
    fn degenerate_inputs_give_finite_answers() {
        assert_eq!(quantile(0.0, 0.5, 0.5), 0.0);
        assert_eq!(quantile(f64::NAN, 0.5, 0.5), 0.0);
        assert_eq!(quantile(3.0, 1.0, 0.5), 0.0);
        assert_eq!(quantile(3.0, 0.0, 0.5), 0.0);
        assert_eq!(quantile(3.0, 0.5, 1.0), 0.0);
        // Interval of 1 GiB, one sample: large but finite.
        let q = quantile(1.0, 1.0 / (1u64 << 30) as f64, 0.975);
        assert!(q.is_finite() && q > 1e9);
    }

    #[test]
    fn a_remembered_quantile_is_the_computed_one() {
        for s in [0.5, 1.0, 3.0, 17.25, 150.0] {
            for alpha in [0.0005, 0.025, 0.975] {
                let computed = compute_quantile(s, 1.0 / 4096.0, alpha);
                assert_eq!(quantile(s, 1.0 / 4096.0, alpha), computed);
                assert_eq!(quantile(s, 1.0 / 4096.0, alpha), computed, "remembered");
            }
        }
        assert_eq!(quantile(f64::NAN, 0.5, 0.5), 0.0);
        assert_eq!(quantile(f64::NAN, 0.5, 0.5), 0.0, "remembered");
    }
}
