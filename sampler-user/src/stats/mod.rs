//! Pure statistics: what every number allocscope prints or exports is computed here.
//!
//! No I/O, no clocks, no aya: estimators take sample observations and return estimates with
//! bounds. Model and formulas: docs/design.md §3–§4, after the .NET "Randomized Allocation
//! Sampling" note (weighted and negative-binomial estimators) and jemalloc #1751.

pub(crate) mod difference;
pub mod estimate;
pub(crate) mod gamma;
pub(crate) mod growth;
pub(crate) mod lifetime;
pub(crate) mod memo;
pub(crate) mod negbin;
pub(crate) mod peak;
pub(crate) mod rate;
pub(crate) mod runtime;
#[cfg(any(test, feature = "simulation"))]
pub mod simulate;

pub use estimate::{Estimate, SampleObs, SampleSet};
