//! Pure statistics: what every number allocscope prints or exports is computed here.
//!
//! No I/O, no clocks, no aya: estimators take sample observations and return estimates with
//! bounds. Model and formulas: docs/design.md §3–§4, after the .NET "Randomized Allocation
//! Sampling" note (weighted and negative-binomial estimators) and jemalloc #1751.

pub mod difference;
pub mod estimate;
pub mod gamma;
pub mod growth;
pub mod lifetime;
pub mod memo;
pub mod negbin;
pub mod peak;
pub mod rate;
pub mod runtime;
#[cfg(any(test, feature = "simulation"))]
pub mod simulate;

pub use estimate::{Estimate, SampleObs, SampleSet};
