//! The numbers a picture carries to the table, as plain data: the settings it was taken
//! with and the estimates of a row. The model computes them, the columns render them.

use crate::stats::Estimate;

/// Sampling settings the picture was taken with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ViewSettings {
    /// Mean sampling interval in bytes.
    pub interval: u64,
    /// Confidence of the bounds.
    pub confidence: f64,
    /// Frees are not tracked (no live numbers).
    pub alloc_only: bool,
    /// Leak view threshold in seconds.
    pub leak_age_seconds: f64,
    /// The rate window asked for, in seconds.
    pub window_seconds: f64,
    /// The targets were seen from their start (a command top started), not attached to.
    pub from_start: bool,
}

/// The estimates a row (or a member stack) shows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Values {
    /// Bytes per second over the recent window.
    pub rate: Estimate,
    /// Bytes per second since the start.
    pub average: Estimate,
    /// Bytes live now (frees tracked).
    pub live: Option<Estimate>,
    /// Objects live now (frees tracked), else objects allocated since the start.
    pub objects: Estimate,
    /// Bytes live for longer than the leak age (frees tracked).
    pub leaked: Option<Estimate>,
    /// Objects live for longer than the leak age.
    pub leaked_objects: Option<Estimate>,
    /// Growth of the in-use bytes, bytes per second (frees tracked, three ticks on).
    pub growth: Option<Estimate>,
    /// Bytes freed within 1 ms of their allocation, per second since the start.
    pub temporary: Option<Estimate>,
    /// Objects allocated since the start.
    pub allocated: Estimate,
    /// Samples since the start.
    pub samples: u64,
}
