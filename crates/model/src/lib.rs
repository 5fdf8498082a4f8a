//! allocscope's model of a profile, apart from the profiler: the format its JSON export
//! writes and every reader (summary, exports, diff) reads ([`schema`]), and the statistics
//! that turn sampled allocations into estimates with bounds ([`stats`]). Pure: no I/O, no
//! clocks, no kernel; a third party reads our JSON with this crate alone. Beside them, what
//! every output shares: [`mod@format`] (byte units, frame names), [`text`] (strings from targets
//! made safe to show), [`units`] (sizes and durations as typed).
//!
//! [`schema`] imports nothing of the crate (plain data); [`stats`] uses its estimate types.

#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod format;
pub mod schema;
pub mod stats;
pub mod text;
pub mod units;
