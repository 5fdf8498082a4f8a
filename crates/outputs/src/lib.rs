//! What a profile becomes: the summary printed at the end (`summary`), the comparison of
//! two profiles (`diff`), and the files other tools open (`export`: JSON, pprof, folded
//! stacks, SVG, speedscope, the HTML report).
//!
//! Every output reads a finished `schema::Profile` (allocscope-model) and nothing of the
//! recording that built it; the target side lends only what names a frame (`stacks`), a
//! front end (`probe`), the probes' cost (`cost`) and the safe file writer (`outfile`).
#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod diff;
pub mod export;
pub mod summary;
// The model's and the target side's modules under the names the outputs have always used.
pub use allocscope_model::{format, schema, stats, text, units};
pub use allocscope_target::{cost, outfile, probe, stacks};
