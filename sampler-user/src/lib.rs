//! allocscope's command line as a library: the `allocscope` binary (main.rs) is a thin
//! shell over these modules (`cli`, `config`, `help`, `commands`, the agent,
//! `output_check`), and examples (e.g.
//! the estimator calibration) reuse the crates below it, re-exported here under the
//! names every module has always used.
//!
//! Data flows ① probe → ② collect → ③ stacks (allocscope-target) → ⑤ profile and the
//! recording loop (allocscope-engine) → ⑥ summary and export (allocscope-outputs), with
//! ④ stats and the schema (allocscope-model) as pure functions and types every part uses.
#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub(crate) mod agent;
pub mod cli;
pub mod commands;
pub mod config;
pub mod help;
pub(crate) mod output_check;
// The recording loop, the profile it builds and its cost control, in the engine's crate.
pub use allocscope_engine::{duty, profile};
pub(crate) use allocscope_engine::{preflight, recording};
// The profile's format, its statistics and the renderings every output shares, in a
// crate of their own (pure).
pub use allocscope_model::{format, schema, stats, text, units};
// The summary, diffs and exports, in the outputs' crate.
pub use allocscope_outputs::{diff, export, summary};
// The processes, probes, stacks and runtimes, in the target side's crate; messages to
// the user (`say!`, `say_raw!`, `show!`).
pub use allocscope_target::{
    collect, cost, exits, infile, inject, interrupted, outfile, preload, probe, python, say,
    say_raw, show, signals, spawn, stacks, sys, targets,
};
