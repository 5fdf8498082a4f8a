//! allocscope's engine: the recording loop both `record` and `top` (and the agent) run,
//! and what it owns. `recording` attaches, routes the kernel's and the front ends' events
//! to its components and gathers a snapshot; `profile` turns the samples into per-stack
//! estimates (a `schema::Profile`); `duty` and `throttle` keep its cost within budget.
//! It takes validated `settings` and runs its `preflight` checks before attaching.
//!
//! It uses the model and the target side, and nothing of the outputs or the command line
//! above it, so a change there never rebuilds it.
#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod duty;
pub mod preflight;
pub mod profile;
pub mod recording;
pub mod settings;
pub mod throttle;
// The model's and the target side's modules under the names the engine has always used.
pub use allocscope_model::{format, schema, stats, text, units};
pub use allocscope_target::{
    collect, cost, exits, infile, inject, interrupted, outfile, preload, probe, python, say,
    signals, spawn, stacks, sys, targets,
};
