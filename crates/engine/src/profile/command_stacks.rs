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

use super::{
    insight::Estimating,
    tally::{ProcessTally, StackTally},
};
use crate::{
    schema::{CommandStackProfile, Estimate, FrameInfo, StackProfile},
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

/// `tallied`'s stacks merged per (command, frames), in order of first appearance; the
/// stacks of a pid not among `processes` stay apart (its own, under the empty name).
pub(super) fn merge(tallied: &[StackTally], processes: &[ProcessTally]) -> Vec<Merged> {
    let commands: HashMap<u32, &str> = processes
        .iter()
        .map(|p| (p.pid, p.command.as_str()))
        .collect();
    let mut at: HashMap<(&str, u32, &[FrameInfo], bool), usize> = HashMap::new();
    let mut merged: Vec<Merged> = Vec::new();
    for (index, stack) in tallied.iter().enumerate() {
        let (command, unknown) = match commands.get(&stack.pid) {
            Some(&command) => (command, 0),
            None => ("", stack.pid),
        };
        let key = (command, unknown, stack.frames.as_slice(), stack.lost);
        let slot = *at.entry(key).or_insert_with(|| {
            merged.push(Merged {
                command: command.to_owned(),
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

/// The merged stacks estimated, largest estimated bytes first; `stacks`: every stack as
/// built, in the tally's order (each one's `stack` is its largest member's index there,
/// until [`sorted`]); `tracking`: frees were tracked.
pub(super) fn estimate(
    merged: Vec<Merged>,
    stacks: &[(Option<usize>, StackProfile)],
    estimating: &Estimating,
    tracking: bool,
) -> Vec<CommandStackProfile> {
    let built: Vec<&StackProfile> = stacks.iter().map(|(_, s)| s).collect();
    let mut out = super::parallel::map(merged, |m| {
        let (processes, largest, peak_bytes) = members_of(&m.members, &built);
        let tracking = tracking && !m.lost;
        CommandStackProfile {
            processes,
            largest_pid: built[largest].pid,
            stack: largest,
            samples: m.all.samples(),
            alloc_bytes: estimating.estimate(&m.all).bytes,
            inuse_bytes: tracking.then(|| estimating.estimate(&m.live).bytes),
            peak_bytes: peak_bytes.filter(|_| tracking),
            lifetimes: m
                .lifetimes
                .as_ref()
                .and_then(|lifetimes| estimating.lifetimes(lifetimes, &m.live)),
            lost: m.lost,
            command: m.command,
        }
    });
    out.sort_by(|a, b| b.alloc_bytes.estimate.total_cmp(&a.alloc_bytes.estimate));
    out
}

/// `stacks` (in the tally's order) sorted by estimated bytes allocated, largest first, and
/// `command_stacks`' indices moved with them.
pub(super) fn sorted(
    stacks: Vec<(Option<usize>, StackProfile)>,
    command_stacks: &mut [CommandStackProfile],
) -> Vec<(Option<usize>, StackProfile)> {
    let mut stacks: Vec<(usize, (Option<usize>, StackProfile))> =
        stacks.into_iter().enumerate().collect();
    stacks.sort_by(|(_, a), (_, b)| {
        b.1.alloc_bytes
            .estimate
            .total_cmp(&a.1.alloc_bytes.estimate)
    });
    let mut sorted_at = vec![0; stacks.len()];
    for (at, (tallied_at, _)) in stacks.iter().enumerate() {
        sorted_at[*tallied_at] = at;
    }
    for command_stack in command_stacks {
        command_stack.stack = sorted_at[command_stack.stack];
    }
    stacks.into_iter().map(|(_, stack)| stack).collect()
}
