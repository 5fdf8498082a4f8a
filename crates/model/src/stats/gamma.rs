//! Quantiles of the unit-scale gamma distribution, for the Fay-Feuer bounds
//! ([`super::estimate`]).
//!
//! Why not statrs's `Gamma::inverse_cdf`: it brackets the quantile by doubling from [1, 2],
//! bisects eight times, then takes up to four Newton steps: ~20 evaluations of the
//! incomplete gamma function per quantile, each costlier the larger the shape (the number
//! of samples, roughly). Building the profile of a build of ~100 processes spent a quarter
//! of its time there. Here the Wilson-Hilferty approximation (a normal quantile of the cube
//! root, within about 1% of the quantile from shape 1 on) starts a Newton iteration kept
//! inside a bracket, which converges in two to four evaluations.

use statrs::function::gamma::{gamma_lr, ln_gamma};

/// The `alpha` quantile of the gamma distribution with `shape` and scale 1: the `x` with
/// `P(shape, x) = alpha`. 0 for `alpha` ≤ 0, infinity for `alpha` ≥ 1; NaN for a shape
/// that is not positive and finite.
pub fn quantile(shape: f64, alpha: f64) -> f64 {
    super::memo::remembered(&MEMO, [shape, alpha], || compute_quantile(shape, alpha))
}

thread_local! {
    /// Quantiles computed so far on this thread ([`super::memo`]): the same shapes recur
    /// across a profile's stacks (the same sample sizes in each of a build's processes).
    static MEMO: super::memo::Memo<2> = std::cell::RefCell::new(std::collections::HashMap::new());
}

/// [`quantile`], computed.
fn compute_quantile(shape: f64, alpha: f64) -> f64 {
    if !(shape > 0.0 && shape.is_finite()) || alpha.is_nan() {
        return f64::NAN;
    }
    if alpha <= 0.0 {
        return 0.0;
    }
    if alpha >= 1.0 {
        return f64::INFINITY;
    }
    let log_norm = ln_gamma(shape);
    // The density at x, for Newton's step.
    let density = |x: f64| ((shape - 1.0) * x.ln() - x - log_norm).exp();
    let (mut low, mut high) = (0.0_f64, f64::INFINITY);
    let mut x = first_guess(shape, alpha);
    for _ in 0..100 {
        let error = gamma_lr(shape, x) - alpha;
        if error == 0.0 {
            return x;
        }
        if error < 0.0 {
            low = x;
        } else {
            high = x;
        }
        let step = error / density(x);
        let mut next = x - step;
        if !(next > low && next < high && next.is_finite()) {
            // Outside what is known: halve the bracket (or grow it while it has no top).
            next = if high.is_finite() {
                0.5 * (low + high)
            } else {
                2.0 * x.max(1.0)
            };
        }
        if (next - x).abs() <= 1e-13 * x.abs().max(f64::MIN_POSITIVE) {
            return next;
        }
        x = next;
    }
    x
}

/// Where the iteration starts: Wilson-Hilferty from shape 1/2 on; below it, the lower
/// tail's `P(a, x) ≈ x^a / Γ(a + 1)`, whose quantile is `(alpha Γ(a + 1))^(1/a)`.
fn first_guess(shape: f64, alpha: f64) -> f64 {
    if shape >= 0.5 {
        let z = super::memo::normal_quantile(alpha);
        let c = 1.0 / (9.0 * shape);
        let cube = 1.0 - c + z * c.sqrt();
        if cube > 0.0 {
            return shape * cube * cube * cube;
        }
        return shape * 1e-3;
    }
    let guess = ((alpha.ln() + ln_gamma(shape + 1.0)) / shape).exp();
    if guess.is_finite() && guess > 0.0 {
        guess
    } else {
        f64::MIN_POSITIVE
    }
}

#[cfg(test)]
mod tests {
    use statrs::distribution::{ContinuousCDF as _, Gamma};

    use super::*;

    /// The bounds' shapes are (Σw)²/Σw² ≥ 1 (Cauchy-Schwarz); well below 1 the far lower
    /// tail is below what statrs's incomplete gamma resolves.
    const SHAPES: [f64; 12] = [
        0.9, 1.0, 1.5, 2.0, 5.0, 10.0, 33.3, 100.0, 1e3, 1e4, 1e5, 1e6,
    ];
    const ALPHAS: [f64; 13] = [
        1e-9, 1e-6, 1e-4, 5e-4, 0.005, 0.025, 0.05, 0.5, 0.95, 0.975, 0.995, 0.9995, 0.9999,
    ];

    #[test]
    fn matches_chi_square_tables() {
        // χ²(k) is gamma(k/2) at scale 2: the tables' 95% points for 1 and 10 degrees of
        // freedom, 3.841458820694124 and 18.307038053275146.
        assert!((2.0 * quantile(0.5, 0.95) - 3.841_458_820_694_124).abs() < 1e-9);
        assert!((2.0 * quantile(5.0, 0.95) - 18.307_038_053_275_146).abs() < 1e-9);
        // The lower 5% point for 1 degree of freedom, 0.003932140000019522 (statrs's own
        // inverse is 1.8e-6 off there).
        assert!((2.0 * quantile(0.5, 0.05) / 0.003_932_140_000_019_522 - 1.0).abs() < 1e-9);
        // And the exponential (shape 1) in closed form: -ln(1 - alpha).
        for alpha in ALPHAS {
            let exact = -(-alpha).ln_1p();
            assert!((quantile(1.0, alpha) / exact - 1.0).abs() < 1e-9, "{alpha}");
        }
    }

    #[test]
    fn inverts_the_distribution_function_everywhere_we_ask() {
        for shape in SHAPES {
            for alpha in ALPHAS {
                let x = quantile(shape, alpha);
                assert!(
                    x.is_finite() && x >= 0.0,
                    "shape {shape} alpha {alpha}: {x}"
                );
                let back = gamma_lr(shape, x);
                assert!(
                    (back - alpha).abs() <= (1e-7 * alpha.min(1.0 - alpha)).max(1e-14),
                    "shape {shape} alpha {alpha}: P({x}) = {back}"
                );
            }
        }
    }

    #[test]
    fn agrees_with_statrs_where_statrs_answers() {
        // (Not beyond: statrs's four Newton steps stop short there, 3.6e-5 off at shape 1e5;
        // the test above is the proof, this one a second opinion.)
        for shape in SHAPES.into_iter().filter(|&s| s <= 1e3) {
            let gamma = Gamma::new(shape, 1.0).unwrap();
            for alpha in ALPHAS.into_iter().filter(|&a| a >= 1e-4) {
                let theirs = gamma.inverse_cdf(alpha);
                if theirs.is_nan() {
                    // statrs gives up in the far lower tail below shape 1 (the bounds fell
                    // back to a normal there before).
                    continue;
                }
                let ours = quantile(shape, alpha);
                assert!(
                    (ours / theirs - 1.0).abs() < 1e-5,
                    "shape {shape} alpha {alpha}: ours {ours}, statrs {theirs}"
                );
            }
        }
    }

    #[test]
    fn edges() {
        assert_eq!(quantile(3.0, 0.0), 0.0);
        assert_eq!(quantile(3.0, 1.0), f64::INFINITY);
        assert!(quantile(0.0, 0.5).is_nan());
        assert!(quantile(f64::INFINITY, 0.5).is_nan());
    }
}
