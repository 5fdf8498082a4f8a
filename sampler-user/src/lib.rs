//! allocscope's user side as a library: the `allocscope` binary (main.rs) is a thin shell
//! over these modules, and examples (e.g. the estimator calibration) reuse the pure parts.
//!
//! Data flows ① probe → ② collect → ③ stacks → ⑤ profile → ⑥ export, with ④ stats as pure
//! functions the profile and exporters call.
#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub(crate) mod agent;
pub mod cli;
pub(crate) mod collect;
pub mod commands;
pub mod config;
pub mod cost;
pub(crate) mod diff;
pub mod duty;
pub(crate) mod exits;
pub mod export;
pub mod help;
pub(crate) mod infile;
pub(crate) mod inject;
pub mod interrupted;
pub(crate) mod outfile;
pub(crate) mod preflight;
pub(crate) mod preload;
pub mod probe;
pub mod profile;
pub mod python;
// The profile's format, its statistics and the renderings every output shares, in a
// crate of their own (pure).
pub use allocscope_model::{format, schema, stats, text, units};
pub(crate) mod recording;
pub mod say;
pub(crate) mod signals;
pub(crate) mod spawn;
pub mod stacks;
pub mod summary;
pub mod sys;
pub mod targets;
pub(crate) mod throttle;
