//! ⑤ The profile: samples aggregated per stack ([`Aggregator`]), then a recording's
//! [`Snapshot`] built into the one model every exporter and the summary read ([`Profile`],
//! its types in [`crate::schema`]).

mod aggregator;
pub(crate) mod breakdown;
mod build;
mod command_stacks;
mod groups;
mod incomplete;
mod insight;
mod measured;
mod parallel;
mod period;
mod processes;
mod sites;
mod tally;
pub(crate) mod timeline;

pub use crate::schema::*;
pub use aggregator::{Aggregator, LostCounts, OpenStratum, Readings};
pub use breakdown::Breakdown;
pub use build::{target_uses, Settings, Snapshot};
pub use incomplete::incomplete_reasons;
pub use period::PeriodStart;
pub use processes::{Forked, ProcessBook};
pub use tally::{ProcessTally, StackTally, Tally};
pub use timeline::Timeline;
