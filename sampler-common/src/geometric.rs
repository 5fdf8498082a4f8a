//! Integer inverse-transform sampling of the geometric distribution, for the BPF countdown.
//!
//! Model (docs/design.md §3, .NET "Randomized Allocation Sampling"): every allocated byte is a
//! Bernoulli trial with success probability `p = 1/interval`; the number of failed trials
//! before the next success is `G ~ Geometric(p)` with `P(G = k) = q^k p`, `q = 1 - p`. By
//! inverse transform, `G = floor(ln(U) / ln(q)) = floor(E · c)` with `U ~ Uniform(0, 1]`,
//! `E = -ln(U) ~ Exp(1)` and `c = 1 / -ln(q)`.
//!
//! BPF has no floating point, so `E` is computed in Q32 fixed point from a random word:
//! `U = m · 2^-63` with `m` in `[1, 2^63]`; with `z` leading zeros, `U = y · 2^-z` for a
//! mantissa `y` in `[1, 2)`, so `E = z·ln 2 - ln y`. `ln y` comes from a 64-entry table at
//! `t = 1 + i/64` plus the series of `ln(1 + d)` for the small remainder `y/t = 1 + d`
//! (`|d| < 1/64`, four terms: error < 2^-31). User space computes `c` once, in floating
//! point, as [`scale_q32`]; the product `E · c` is a 64×64→128-bit multiply done with 32-bit
//! limbs (BPF has no 128-bit arithmetic). The absolute error of `E` is below 2^-26 (rounding of `ln 2`), so the
//! draw differs from the exact inverse transform by less than `interval · 2^-26` bytes.
//!
//! No division, no unbounded loop, and table indices masked to their length: the verifier
//! sees straight-line code with no panic path.

/// `ln(1 + i/64)` in Q31.
const LN_Q31: [u32; 64] = [
    0, 33294987, 66081634, 98375230, 130190384, 161541067, 192440645, 222901917, 252937143,
    282558077, 311775992, 340601709, 369045617, 397117698, 424827549, 452184399, 479197128,
    505874286, 532224109, 558254533, 583973207, 609387512, 634504566, 659331243, 683874180,
    708139790, 732134271, 755863613, 779333613, 802549879, 825517838, 848242744, 870729689,
    892983605, 915009272, 936811323, 958394255, 979762428, 1000920074, 1021871300, 1042620095,
    1063170335, 1083525783, 1103690096, 1123666833, 1143459449, 1163071308, 1182505682, 1201765754,
    1220854623, 1239775306, 1258530741, 1277123789, 1295557238, 1313833805, 1331956138, 1349926817,
    1367748360, 1385423223, 1402953799, 1420342425, 1437591383, 1454702897, 1471679141,
];

/// `1 / (1 + i/64)` in Q31.
const INV_Q31: [u32; 64] = [
    2147483648, 2114445438, 2082408386, 2051327664, 2021161080, 1991868891, 1963413621, 1935759908,
    1908874354, 1882725390, 1857283155, 1832519380, 1808407283, 1784921474, 1762037865, 1739733588,
    1717986918, 1696777203, 1676084798, 1655891006, 1636178018, 1616928864, 1598127366, 1579758086,
    1561806289, 1544257904, 1527099483, 1510318170, 1493901668, 1477838209, 1462116526, 1446725826,
    1431655765, 1416896428, 1402438301, 1388272257, 1374389535, 1360781718, 1347440720, 1334358772,
    1321528399, 1308942414, 1296593901, 1284476201, 1272582903, 1260907830, 1249445032, 1238188770,
    1227133513, 1216273925, 1205604855, 1195121335, 1184818564, 1174691910, 1164736894, 1154949189,
    1145324612, 1135859120, 1126548799, 1117389866, 1108378657, 1099511628, 1090785345, 1082196484,
];

/// `ln 2` in Q32.
const LN2_Q32: u64 = 2_977_044_472;

/// Largest mean interval [`scale_q32`] accepts: `c ≈ interval - 1/2` must fit in Q32.32.
pub const MAX_INTERVAL: u64 = 1 << 32;

/// `-ln(U)` in Q32 for `U = ((random >> 1) + 1) · 2^-63`, uniform on `(0, 1]`.
#[inline(always)]
pub fn neg_ln_uniform_q32(random: u64) -> u64 {
    let m = (random >> 1) + 1; // in [1, 2^63]
    let zeros = m.leading_zeros(); // in [0, 63]; U = y · 2^-zeros
    let normalized = m.wrapping_shl(zeros); // top bit set: y = normalized / 2^63
    let y_q31 = normalized >> 32; // in [2^31, 2^32)
    let index = ((y_q31 >> 25) & 63) as usize;
    // z = y / t in Q31, close to 1; d = z - 1 in [-tiny, 1/64).
    // Rounding of the table can leave z a hair below 1; clamping d at 0 costs < 2^-31.
    // Unsigned shifts and a reciprocal multiply: BPF has no signed division, and d < 2^25
    // keeps every product below 2^63.
    let z_q31 = (y_q31 * INV_Q31[index] as u64) >> 31;
    let d = z_q31.saturating_sub(1 << 31);
    let d2 = (d * d) >> 31;
    let d3 = (d2 * d) >> 31;
    let d4 = (d3 * d) >> 31;
    let d3_third = (d3 * 0x5555_5556) >> 32;
    let ln_remainder_q31 = d - (d2 >> 1) + d3_third - (d4 >> 2);
    let ln_y_q32 = (LN_Q31[index] as u64 + ln_remainder_q31) << 1;
    (zeros as u64 * LN2_Q32).saturating_sub(ln_y_q32)
}

/// High 64 bits of the 128-bit product `a · b`, from 32-bit limbs.
#[inline(always)]
pub fn mul_high(a: u64, b: u64) -> u64 {
    let (a_hi, a_lo) = (a >> 32, a & 0xffff_ffff);
    let (b_hi, b_lo) = (b >> 32, b & 0xffff_ffff);
    let lo_lo = a_lo * b_lo;
    let hi_lo = a_hi * b_lo;
    let lo_hi = a_lo * b_hi;
    let hi_hi = a_hi * b_hi;
    let middle = (lo_lo >> 32) + (hi_lo & 0xffff_ffff) + (lo_hi & 0xffff_ffff);
    hi_hi + (hi_lo >> 32) + (lo_hi >> 32) + (middle >> 32)
}

/// `a · b`, or `u64::MAX` when the product overflows (calloc's `nmemb * size`), without the
/// 128-bit multiply `u64::saturating_mul` compiles to.
#[inline(always)]
pub fn saturating_product(a: u64, b: u64) -> u64 {
    if mul_high(a, b) != 0 {
        u64::MAX
    } else {
        a.wrapping_mul(b)
    }
}

/// One geometric draw: failed trials before the next success, for the interval whose
/// [`scale_q32`] is `scale`. `random` is any uniformly random 64-bit word.
#[inline(always)]
pub fn draw(random: u64, scale: u64) -> u64 {
    // Q32 × Q32 = Q64: the integer part is the high word.
    mul_high(neg_ln_uniform_q32(random), scale)
}

/// `c = 1 / -ln(1 - 1/interval)` in Q32.32, computed once in user space and handed to the
/// kernel as a load-time global. `interval` 1 samples every allocation (`c = 0`). Returns
/// `None` for 0 or intervals above [`MAX_INTERVAL`].
#[cfg(any(test, feature = "float"))]
pub fn scale_q32(interval: u64) -> Option<u64> {
    if interval == 0 || interval > MAX_INTERVAL {
        return None;
    }
    if interval == 1 {
        return Some(0);
    }
    let p = 1.0 / interval as f64;
    // log1p keeps full precision for tiny p, where 1 - p would round (the libm crate's:
    // the in-process front end uses this and must not need the C library's libm).
    let c = 1.0 / -libm::log1p(-p);
    Some(libm::round(c * 4_294_967_296.0) as u64)
}

#[cfg(test)]
mod tests {
    use rand::{RngCore, SeedableRng};
    use rand_pcg::Pcg64;
    use statrs::distribution::{ChiSquared, ContinuousCDF};

    use super::*;

    #[test]
    fn tables_match_their_definitions() {
        for i in 0..64 {
            let t = 1.0 + i as f64 / 64.0;
            assert_eq!(
                LN_Q31[i] as f64,
                (t.ln() * 2f64.powi(31)).round(),
                "ln table {i}"
            );
            assert_eq!(
                INV_Q31[i] as f64,
                (2f64.powi(31) / t).round(),
                "inv table {i}"
            );
        }
        assert_eq!(LN2_Q32 as f64, (2f64.ln() * 2f64.powi(32)).round());
    }

    #[test]
    fn mul_high_matches_u128() {
        let mut rng = Pcg64::seed_from_u64(1);
        for _ in 0..100_000 {
            let (a, b) = (rng.next_u64(), rng.next_u64());
            assert_eq!(mul_high(a, b), ((a as u128 * b as u128) >> 64) as u64);
        }
        assert_eq!(mul_high(u64::MAX, u64::MAX), u64::MAX - 1);
        assert_eq!(saturating_product(1 << 32, 1 << 32), u64::MAX);
        assert_eq!(saturating_product(1 << 31, 1 << 32), 1 << 63);
        assert_eq!(saturating_product(7, 9), 63);
    }

    #[test]
    fn neg_ln_is_accurate_over_the_whole_range() {
        let mut rng = Pcg64::seed_from_u64(2);
        let mut words: Vec<u64> = (0..200_000).map(|_| rng.next_u64()).collect();
        // Extremes: U = 1, U = 2^-63, and mantissas at table boundaries.
        words.extend([u64::MAX, u64::MAX - 1, 0, 1, 2, 3, 1 << 40, (1 << 63) - 2]);
        for random in words {
            let u = ((random >> 1) + 1) as f64 / 2f64.powi(63);
            let exact = -u.ln();
            let got = neg_ln_uniform_q32(random) as f64 / 2f64.powi(32);
            assert!(
                (got - exact).abs() < 1e-8,
                "random {random:#x}: -ln(U) {got} vs {exact}"
            );
        }
    }

    #[test]
    fn scale_covers_the_edges() {
        assert_eq!(scale_q32(0), None);
        assert_eq!(scale_q32(MAX_INTERVAL + 1), None);
        assert_eq!(scale_q32(1), Some(0));
        // Every byte sampled at interval 1.
        assert_eq!(draw(12345, 0), 0);
        let c = scale_q32(MAX_INTERVAL).unwrap() as f64 / 2f64.powi(32);
        assert!((c - (MAX_INTERVAL as f64 - 0.5)).abs() < 1.0);
        // Largest possible draw stays far from overflow: E ≤ 63 ln 2.
        assert!(draw(0, scale_q32(MAX_INTERVAL).unwrap()) < 50 * MAX_INTERVAL);
    }

    /// Mean within 0.5% of the geometric mean q/p over 10^6 draws, for several intervals.
    #[test]
    fn mean_matches_the_geometric_distribution() {
        let mut rng = Pcg64::seed_from_u64(3);
        for interval in [2u64, 100, 4096, 512 * 1024, 1 << 30] {
            let scale = scale_q32(interval).unwrap();
            let n = 1_000_000;
            let sum: f64 = (0..n).map(|_| draw(rng.next_u64(), scale) as f64).sum();
            let mean = sum / n as f64;
            let p = 1.0 / interval as f64;
            let expected = (1.0 - p) / p;
            // Standard error of the mean is ~ sqrt(q)/p/1000 = 0.1%: 0.5% is 5 sigma.
            assert!(
                (mean - expected).abs() <= 0.005 * expected,
                "interval {interval}: mean {mean} vs {expected}"
            );
        }
    }

    /// Pearson chi-square goodness of fit against the exact geometric CDF, on 40 bins of
    /// (nearly) equal probability, rejecting at the 0.1% level.
    #[test]
    fn draws_fit_the_exact_distribution() {
        let mut rng = Pcg64::seed_from_u64(4);
        for interval in [3u64, 1000, 512 * 1024, 64 * 1024 * 1024] {
            let scale = scale_q32(interval).unwrap();
            let q = 1.0 - 1.0 / interval as f64;
            let cdf = |k: u64| 1.0 - q.powf(k as f64 + 1.0);
            // Bin edges: k_j = smallest k with CDF(k) >= j/bins.
            let bins = 40usize;
            let mut edges: Vec<u64> = (1..bins)
                .map(|j| {
                    let target = j as f64 / bins as f64;
                    ((1.0 - target).ln() / q.ln() - 1.0).ceil().max(0.0) as u64
                })
                .collect();
            edges.dedup();
            let mut probabilities = Vec::new();
            let mut previous = 0.0;
            for &edge in &edges {
                let c = cdf(edge);
                probabilities.push(c - previous);
                previous = c;
            }
            probabilities.push(1.0 - previous);
            let n = 400_000usize;
            let mut counts = vec![0usize; probabilities.len()];
            for _ in 0..n {
                let g = draw(rng.next_u64(), scale);
                counts[edges.partition_point(|&e| e < g)] += 1;
            }
            let chi2: f64 = counts
                .iter()
                .zip(&probabilities)
                .map(|(&o, &p)| {
                    let e = p * n as f64;
                    (o as f64 - e).powi(2) / e
                })
                .sum();
            let dof = (probabilities.len() - 1) as f64;
            let critical = ChiSquared::new(dof).unwrap().inverse_cdf(0.999);
            assert!(
                chi2 < critical,
                "interval {interval}: chi2 {chi2:.1} >= {critical:.1} ({dof} dof)"
            );
        }
    }
}
