//! allocscope's target side: the processes it samples and what it does to and reads from
//! them. It finds processes and their allocators (`targets`, `sys`), starts commands
//! (`spawn`, `signals`, `exits`), loads the in-process front end into them (`preload`,
//! `inject`), probes their allocators (`probe`, `cost`), collects what the front ends
//! send (`collect`) and turns stacks into named frames (`stacks`, `python`). Beside them:
//! Ctrl-C during the set-up (`interrupted`), files read (`infile`) and created (`outfile`)
//! safely as root, and messages to the user (`say!`, `say_raw!`, `show!`).
//!
//! It depends on the model (`allocscope-model`) and on nothing of the engine, the outputs
//! or the command line above it, so a change there never rebuilds it.
#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod collect;
pub mod cost;
pub mod exits;
pub mod infile;
pub mod inject;
pub mod interrupted;
pub mod outfile;
pub mod preload;
pub mod probe;
pub mod python;
mod say;
pub mod signals;
pub mod spawn;
pub mod stacks;
pub mod sys;
pub mod targets;
// The model's modules under the names the target side has always used.
pub use allocscope_model::{format, schema, stats, text, units};
