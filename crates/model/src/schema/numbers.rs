//! Numbers with their bounds, as every output shows them: an [`Estimate`], the posterior it
//! comes from ([`Posterior`], exported for `diff`), and a series of them over time.
//! What computes them is [`crate::stats`].

/// A number with its bounds, as every output shows it.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Estimate {
    /// Samples the estimate rests on.
    pub samples: u64,
    /// Point estimate (unbiased).
    pub estimate: f64,
    /// Lower bound at the chosen confidence.
    pub lower: f64,
    /// Upper bound at the chosen confidence; infinite when nothing bounds it (`null` in
    /// JSON, which has no infinity).
    #[serde(deserialize_with = "infinite_if_null")]
    pub upper: f64,
}

/// A number, or `null` for infinity (serde_json writes non-finite numbers as `null`).
pub fn infinite_if_null<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<f64, D::Error> {
    let value: Option<f64> = serde::Deserialize::deserialize(deserializer)?;
    Ok(value.unwrap_or(f64::INFINITY))
}

impl Estimate {
    /// Every field divided by `seconds` (a rate); zero for a non-positive duration.
    pub fn per_second(self, seconds: f64) -> Estimate {
        self.scaled(if seconds > 0.0 { 1.0 / seconds } else { 0.0 })
    }

    /// Every field times `scale`.
    pub fn scaled(self, scale: f64) -> Estimate {
        Estimate {
            samples: self.samples,
            estimate: self.estimate * scale,
            lower: self.lower * scale,
            upper: self.upper * scale,
        }
    }
}

/// The posterior of jemalloc #1751 for the bytes behind a set of samples: with
/// `bytes_sampled` successful trials (one per sample), `bytes_to_sample` bytes that were
/// never trialed (the rest of each sampled object after its successful byte) and success
/// probability `p`, the total is `bytes_to_sample + bytes_sampled + NegBin(bytes_sampled +
/// 1, p)` failures (flat prior). For mixed intervals `p` is the one giving the same expected
/// failures, `s / Σ(1/p_i)`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Posterior {
    /// Successful trials: the number of samples.
    pub bytes_sampled: u64,
    /// Bytes skipped after each successful trial, `Σ (u_i - 1)`.
    pub bytes_to_sample: f64,
    /// Per-byte success probability.
    pub p: f64,
    /// Posterior mean: `bytes_to_sample + bytes_sampled/p + (1/p - 1)`.
    pub mean: f64,
    /// Posterior variance: `(bytes_sampled + 1)(1 - p)/p²`.
    pub variance: f64,
}

/// A series as exported: per point, its end in seconds since the start, and estimates
/// with normal bounds.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SeriesValues {
    /// Seconds between points.
    pub seconds_per_point: f64,
    /// Each point's time, seconds since the recording's start.
    pub at_seconds: Vec<f64>,
    /// In-use bytes at each point (of blocks allocated since the start).
    pub inuse_bytes: Vec<f64>,
    /// Their bounds.
    pub inuse_lower: Vec<f64>,
    /// Their bounds.
    pub inuse_upper: Vec<f64>,
    /// Bytes allocated per second over each point.
    pub alloc_bytes_per_second: Vec<f64>,
    /// Their bounds.
    pub alloc_lower: Vec<f64>,
    /// Their bounds.
    pub alloc_upper: Vec<f64>,
}
