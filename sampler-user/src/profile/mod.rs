//! ⑤ The profile: samples aggregated per stack ([`Aggregator`]), then a recording's
//! [`Snapshot`] built into the one model every exporter and the summary read ([`Profile`],
//! its types in [`schema`]).

mod aggregator;
mod build;
mod processes;
pub mod schema;

pub use aggregator::{
    Aggregator, LostCounts, OpenStratum, ProcessTally, Readings, StackTally, Tally, LOST_FRAME,
};
pub use build::{incomplete_reasons, target_uses, Settings, Snapshot};
pub use processes::ProcessBook;
pub use schema::*;
