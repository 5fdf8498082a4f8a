//! allocscope's user side as a library: the `allocscope` binary (main.rs) is a thin shell
//! over these modules, and examples (e.g. the estimator calibration) reuse the pure parts.
//!
//! Data flows ① probe → ② collect → ③ stacks → ⑤ profile → ⑥ export, with ④ stats as pure
//! functions the profile and exporters call.
#![deny(missing_docs)]

pub mod agent;
pub mod cli;
pub mod collect;
pub mod commands;
pub mod config;
pub mod cost;
pub mod diff;
pub mod duty;
pub mod exits;
pub mod export;
pub mod format;
pub mod help;
pub mod infile;
pub mod inject;
pub mod outfile;
pub mod preflight;
pub mod preload;
pub mod probe;
pub mod profile;
pub mod python;
pub mod recording;
pub mod say;
pub mod schema;
pub mod signals;
pub mod spawn;
pub mod stacks;
pub mod stats;
pub mod summary;
pub mod sys;
pub mod targets;
pub mod text;
pub mod throttle;
pub mod units;
