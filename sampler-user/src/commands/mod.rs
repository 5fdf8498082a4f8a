//! The subcommands, each a thin layer over the engine ([`crate::recording`]) and the
//! outputs: `record` writes files, `top` draws a live view, `report` reads a saved
//! profile, `diff` compares two, `reference` is the benchmarks' hidden reference probe.

pub mod diff;
pub mod record;
pub mod reference;
pub mod report;
pub mod top;
