//! The stacks of one command's processes taken together: what the summary's tables show of
//! a recording of many processes.
//!
//! Why: a build runs `cc1` dozens of times and a shell loop `sort` hundreds; each process's
//! copy of the same stack was a row of its own, so a table's ten rows could be ten copies
//! of one stack, one sample and bounds that say nothing each, and the stack that allocated
//! most over the whole command was not shown at all. Taken together (the same frames —
//! module, file offset, name — in processes of one command name), their samples give one
//! estimate with the bounds of the sum, as a command's total does ([`super::groups`]).
//! Live bytes at the peak are the exception: each process peaks at its own moment, so the
//! processes' estimates and bounds are summed.

use std::collections::HashMap;

use super::tally::StackTally;
use crate::{
    schema::{Estimate, FrameInfo, StackProfile},
    stats::{lifetime::Lifetimes, SampleSet},
};

/// One stack of one command, its processes' samples merged.
#[derive(Debug, Default)]
pub(super) struct Merged {
    pub command: String,
    pub all: SampleSet,
    pub live: SampleSet,
    pub lifetimes: Option<Lifetimes>,
    pub lost: bool,
    /// The merged stacks' indices in the tally's stacks.
    pub members: Vec<usize>,
}

/// `tallied`'s stacks merged per (command, frames), in order of first appearance;
/// `command_of` names a pid's command (stacks of a pid it does not know stay apart, under
/// an empty name of their own pid's).
pub(super) fn merge<'a>(
    tallied: &[StackTally],
    command_of: impl Fn(u32) -> Option<&'a str>,
) -> Vec<Merged> {
    let mut at: HashMap<(String, &[FrameInfo], bool), usize> = HashMap::new();
    let mut merged: Vec<Merged> = Vec::new();
    for (index, stack) in tallied.iter().enumerate() {
        let command = command_of(stack.pid).map_or_else(String::new, str::to_owned);
        let key = (command.clone(), stack.frames.as_slice(), stack.lost);
        let slot = *at.entry(key).or_insert_with(|| {
            merged.push(Merged {
                command,
                lost: stack.lost,
                ..Merged::default()
            });
            merged.len() - 1
        });
        let into = &mut merged[slot];
        into.all.merge(&stack.all);
        into.live.merge(&stack.live);
        if let Some(lifetimes) = &stack.breakdown.lifetimes {
            into.lifetimes
                .get_or_insert_with(Lifetimes::default)
                .merge(lifetimes);
        }
        into.members.push(index);
    }
    merged
}

/// Of a merged stack's members (indices in `stacks`, every stack as built in the tally's
/// order; at least one): how many processes, the index of the one with most estimated
/// bytes, and their peak values summed (`None` when no member has one).
pub(super) fn members_of(
    members: &[usize],
    stacks: &[&StackProfile],
) -> (u64, usize, Option<Estimate>) {
    let of: Vec<&StackProfile> = members.iter().map(|&i| stacks[i]).collect();
    let mut pids: Vec<u32> = of.iter().map(|s| s.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    let bytes = |i: usize| stacks[i].alloc_bytes.estimate;
    let largest = members
        .iter()
        .copied()
        .max_by(|&a, &b| bytes(a).total_cmp(&bytes(b)))
        .unwrap_or_default();
    let peaks: Vec<Estimate> = of.iter().filter_map(|s| s.peak_bytes).collect();
    let peak = (!peaks.is_empty()).then(|| super::groups::summed(peaks.iter()));
    (pids.len() as u64, largest, peak)
}
