//! One period of a long recording (the agent's `--period`): a snapshot of what happened
//! since the last period closed, and nothing older.
//!
//! Why at the snapshot: a period's profile is then built by the same estimators as any
//! other, from the period's own samples, exact counts and losses, so its bounds are honest
//! for the period (a process's bounds are not the sum of its stacks' bounds). Each closed
//! period leaves a [`PeriodStart`]: the cumulative counts it ended on, which the next one
//! subtracts. What is a level at the period's end (live blocks, leak suspects, resident
//! size) stays a level; what accumulates (allocations, calls, CPU time, lost samples) is
//! counted from the period's start; what describes the whole recording (peaks, timelines,
//! growth, the size, thread and lifetime breakdowns, the probes' cost) is left out. Pure:
//! tested without BPF.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sampler_common::ProcessCounters;

use super::{build::Snapshot, StackTally};
use crate::{collect::Losses, schema::ExactCounts};

/// The cumulative counts a period ended on: where the next one starts.
#[derive(Debug, Default)]
pub struct PeriodStart {
    counters: BTreeMap<u32, ProcessCounters>,
    losses: Losses,
    cut_samples: u64,
    processes: HashMap<u32, ProcessStart>,
}

/// A process's cumulative counts at a period's end.
#[derive(Debug, Default)]
struct ProcessStart {
    untracked: u64,
    lost: u64,
    runtime_hits: u64,
    cpu_seconds: Option<f64>,
    go_exact: Option<ExactCounts>,
}

impl PeriodStart {
    /// Where a period that starts at `snapshot` (a whole recording's, before
    /// [`Snapshot::period_only`]) counts from.
    pub fn of(snapshot: &Snapshot) -> PeriodStart {
        let processes = snapshot
            .tally
            .processes
            .iter()
            .map(|p| {
                let start = ProcessStart {
                    untracked: p.untracked_samples,
                    lost: p.lost_samples,
                    runtime_hits: p.runtime_hits,
                    cpu_seconds: p.cpu_seconds,
                    go_exact: p.go_totals.as_ref().map(|(exact, _)| *exact),
                };
                (p.pid, start)
            })
            .collect();
        PeriodStart {
            counters: snapshot.counters.clone(),
            losses: snapshot.losses,
            cut_samples: snapshot.tally.cut_samples,
            processes,
        }
    }

    /// Forgets `gone` (processes dropped from the recording): a pid used again later
    /// starts from nothing.
    pub fn forget(&mut self, gone: &BTreeSet<u32>) {
        self.counters.retain(|pid, _| !gone.contains(pid));
        self.processes.retain(|pid, _| !gone.contains(pid));
    }
}

impl Snapshot {
    /// The part of this snapshot (a whole recording's) since `start`, `seconds` long:
    /// stacks that allocated in the period or hold memory at its end, the processes that
    /// have one or were counted in the period, and counts, CPU time and losses of the
    /// period alone.
    pub fn period_only(mut self, start: &PeriodStart, seconds: f64) -> Snapshot {
        let tally = &mut self.tally;
        tally.stacks.retain_mut(|stack| {
            keep_period(stack);
            stack.all.samples() > 0 || stack.live.samples() > 0 || stack.leaked.samples() > 0
        });
        let mut counters = std::mem::take(&mut self.counters);
        for (pid, now) in counters.iter_mut() {
            let before = start.counters.get(pid).copied().unwrap_or_default();
            now.calls = now.calls.saturating_sub(before.calls);
            now.bytes = now.bytes.saturating_sub(before.bytes);
        }
        let with_stacks: BTreeSet<u32> = tally.stacks.iter().map(|s| s.pid).collect();
        counters.retain(|pid, c| c.calls > 0 || with_stacks.contains(pid));
        tally.processes.retain_mut(|p| {
            if let Some(before) = start.processes.get(&p.pid) {
                p.untracked_samples = p.untracked_samples.saturating_sub(before.untracked);
                p.lost_samples = p.lost_samples.saturating_sub(before.lost);
                p.runtime_hits = p.runtime_hits.saturating_sub(before.runtime_hits);
                p.cpu_seconds = p
                    .cpu_seconds
                    .map(|now| (now - before.cpu_seconds.unwrap_or(0.0)).max(0.0));
                if let (Some((now, _)), Some(then)) = (&mut p.go_totals, before.go_exact) {
                    now.calls = now.calls.saturating_sub(then.calls);
                    now.bytes = now.bytes.saturating_sub(then.bytes);
                }
            }
            let counted = p.go_totals.as_ref().is_some_and(|(e, _)| e.calls > 0);
            with_stacks.contains(&p.pid) || counters.contains_key(&p.pid) || counted
        });
        tally.cut_samples = tally.cut_samples.saturating_sub(start.cut_samples);
        // Peaks, timelines and growth describe the whole recording.
        tally.timeline = None;
        tally.peak_seconds.clear();
        tally.period_only = true;
        tally.ticks = 0;
        self.counters = counters;
        self.losses = losses_since(&self.losses, &start.losses);
        self.period_seconds = None;
        self.settings.duration_seconds = seconds;
        // What the probes cost is measured over the whole recording.
        self.overhead = None;
        self
    }
}

/// `stack` over its period: its period's samples are all it allocated; what it holds is
/// kept; what describes the whole recording is dropped.
fn keep_period(stack: &mut StackTally) {
    stack.all = stack.period;
    stack.at_peak = Default::default();
    stack.recent = Default::default();
    stack.breakdown = Default::default();
    stack.growth = Default::default();
    stack.duty = None;
    stack.id = None;
}

/// Each loss counted since `start`.
fn losses_since(now: &Losses, start: &Losses) -> Losses {
    let since = |now: u64, then: u64| now.saturating_sub(then);
    Losses {
        ringbuf_full: since(now.ringbuf_full, start.ringbuf_full),
        stack_missing: since(now.stack_missing, start.stack_missing),
        counters_full: since(now.counters_full, start.counters_full),
        thread_state_full: since(now.thread_state_full, start.thread_state_full),
        live_map_full: since(now.live_map_full, start.live_map_full),
        free_event_lost: since(now.free_event_lost, start.free_event_lost),
        process_event_lost: since(now.process_event_lost, start.process_event_lost),
        lost_unrecorded: since(now.lost_unrecorded, start.lost_unrecorded),
        followed_full: since(now.followed_full, start.followed_full),
        front_end_full: since(now.front_end_full, start.front_end_full),
        stacks_cut_to_leaf: since(now.stacks_cut_to_leaf, start.stacks_cut_to_leaf),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        profile::build::tests::{process, set, snapshot, stack},
        stats::{estimate::Window, SampleSet},
    };

    /// A recording of pid 7 (stacks "busy" and "holder") and pid 8 (idle in the second
    /// period, nothing live), as it stands at the end of its second period.
    fn second_period() -> (Snapshot, PeriodStart) {
        let mut first = snapshot(crate::profile::Tally {
            stacks: vec![
                stack(7, "busy", &[(4096, 10)]),
                stack(8, "idle", &[(64, 1)]),
            ],
            processes: vec![process(7), process(8)],
            cut_samples: 2,
            ..Default::default()
        });
        first.losses.ringbuf_full = 5;
        first.counters.insert(
            8,
            ProcessCounters {
                calls: 4,
                bytes: 256,
            },
        );
        let start = PeriodStart::of(&first);
        let mut busy = stack(7, "busy", &[(4096, 10), (4096, 20), (8192, 5)]);
        busy.period = set(&[(4096, 20), (8192, 5)]);
        let mut holder = stack(7, "holder", &[(512, 3)]);
        holder.period = SampleSet::default();
        let mut idle = stack(8, "idle", &[(64, 1)]);
        idle.period = SampleSet::default();
        idle.live = SampleSet::default();
        let mut now = snapshot(crate::profile::Tally {
            stacks: vec![busy, holder, idle],
            processes: vec![process(7), process(8)],
            cut_samples: 3,
            ..Default::default()
        });
        now.losses.ringbuf_full = 9;
        now.counters.insert(
            7,
            ProcessCounters {
                calls: 160,
                bytes: 100_000,
            },
        );
        now.counters.insert(
            8,
            ProcessCounters {
                calls: 4,
                bytes: 256,
            },
        );
        now.tally.processes[0].cpu_seconds = Some(2.0);
        (now, start)
    }

    #[test]
    fn a_period_counts_what_happened_since_its_start() {
        let (now, start) = second_period();
        let expected = set(&[(4096, 20), (8192, 5)]).estimate(0.95, Window::RECORDING, 1024);
        let profile = Snapshot::into_profile(now.period_only(&start, 10.0));
        assert_eq!(profile.duration_seconds, 10.0);
        let busy = profile
            .stacks
            .iter()
            .find(|s| s.frames[0].function.as_deref() == Some("busy"))
            .unwrap();
        assert_eq!(busy.samples, 2);
        assert_eq!(busy.alloc_bytes, expected.bytes);
        assert_eq!(busy.period, None, "the values are the period's already");
        assert_eq!(busy.peak_bytes, None);
        // Exact counts, CPU time and losses of the period alone.
        let app = &profile.processes[0];
        assert_eq!(app.pid, 7);
        assert_eq!((app.exact.calls, app.exact.bytes), (60, 36_000));
        assert_eq!(app.cpu_seconds, Some(1.5));
        assert_eq!(app.samples, 2);
        assert_eq!(app.alloc_bytes, expected.bytes);
        assert_eq!(app.peak, None);
        assert_eq!(profile.losses.ringbuf_full, 4);
        assert_eq!(profile.losses.stacks_cut_to_leaf, 1);
    }

    #[test]
    fn what_is_held_stays_and_what_is_idle_goes() {
        let (now, start) = second_period();
        let profile = Snapshot::into_profile(now.period_only(&start, 10.0));
        let names: Vec<_> = profile
            .stacks
            .iter()
            .map(|s| s.frames[0].function.as_deref().unwrap())
            .collect();
        // "holder" allocated nothing in the period but holds a block at its end.
        assert_eq!(names, ["busy", "holder"]);
        let holder = &profile.stacks[1];
        assert_eq!(holder.alloc_bytes.estimate, 0.0);
        assert!(holder.inuse_bytes.unwrap().estimate > 0.0);
        // Pid 8 allocated nothing and holds nothing: not in the period at all.
        let pids: Vec<u32> = profile.processes.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [7]);
    }

    #[test]
    fn a_pid_forgotten_and_used_again_starts_from_nothing() {
        let (mut now, mut start) = second_period();
        start.forget(&BTreeSet::from([8]));
        now.tally.stacks[2].period = set(&[(64, 7)]);
        let profile = Snapshot::into_profile(now.period_only(&start, 10.0));
        let new = profile.processes.iter().find(|p| p.pid == 8).unwrap();
        assert_eq!((new.exact.calls, new.exact.bytes), (4, 256));
    }

    #[test]
    fn the_first_period_is_the_recording_so_far() {
        let (now, _) = second_period();
        let whole = Snapshot::into_profile(now.period_only(&PeriodStart::default(), 10.0));
        let app = &whole.processes[0];
        assert_eq!((app.exact.calls, app.exact.bytes), (160, 100_000));
        assert_eq!(whole.losses.ringbuf_full, 9);
    }
}
