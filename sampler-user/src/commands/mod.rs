//! The subcommands, each a thin layer over the engine ([`crate::recording`]) and the
//! outputs: `record` writes files, `top` draws a live view, `report` reads a saved
//! profile, `diff` compares two, `agent` sends
//! profiles to the stores fleets use, `generate` writes man pages and completions,
//! `reference` is the benchmarks' hidden reference probe.

pub mod agent;
pub mod diff;
pub mod generate;
pub mod record;
pub mod reference;
pub mod report;
pub mod top;
