//! Duty cycling (`--max-overhead`), the whole feature but its driver: probes attached in
//! some time slots only, so a target pays nothing in the others, and totals estimated from
//! the slots that were on.
//!
//! - [`plan`]: which slots are on (one per stratum, the stratum's length by feedback on the
//!   measured cost);
//! - [`estimate`]: the estimator of totals from the on slots, with its variance (pure
//!   statistics, proved by simulation in its tests);
//! - [`sums`]: what a recording accumulates per stack and process for the estimator;
//! - [`DutyCycling`]: its state in a recording (the targets' CPU clocks, the controller,
//!   the profile's record).
//!
//! The recording drives it (`recording::duty_cycling`: opens and closes the gate and the
//! probes at the slot boundaries).

mod cycling;
pub mod estimate;
pub(crate) mod plan;
pub(crate) mod sums;

pub use cycling::{DutyCycling, SLOT};
