//! allocscope's user side as a library: the `allocscope` binary (main.rs) is a thin shell
//! over these modules, and examples (e.g. the estimator calibration) reuse the pure parts.
//!
//! Data flows ① probe → ② collect → ③ stacks → ⑤ profile → ⑥ export, with ④ stats as pure
//! functions the profile and exporters call.
#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub(crate) mod agent;
pub mod cli;
pub mod commands;
pub mod config;
pub mod duty;
pub mod help;
pub(crate) mod preflight;
pub mod profile;
// The profile's format, its statistics and the renderings every output shares, in a
// crate of their own (pure).
pub use allocscope_model::{format, schema, stats, text, units};
// The summary, diffs and exports, in the outputs' crate.
pub use allocscope_outputs::{diff, export, summary};
// The processes, probes, stacks and runtimes, in the target side's crate.
pub use allocscope_target::{
    collect, cost, exits, infile, inject, interrupted, outfile, preload, probe, python, signals,
    spawn, stacks, sys, targets,
};
pub(crate) mod recording;
pub mod say;
pub(crate) mod throttle;
