//! What the aggregator hands out: every stack's sample sets at one moment, frames resolved,
//! with each one's leak candidates, growth sums and value at its process's peak, and each
//! process's pseudo-stack of samples lost without a stack.

use std::collections::HashMap;

use super::{Aggregator, LostCounts, OpenStratum, Readings};
use crate::schema::LOST_FRAME;
use crate::{
    collect::LostBatch,
    profile::{
        breakdown::Breakdown,
        processes::ProcessSamples,
        tally::{StackTally, Tally},
        timeline::Timeline,
    },
    stacks::{self, symbolize::FrameInfo, symbolize::Symbolizer, Frame, StackId},
    stats::{growth::GrowthSums, SampleSet},
};

impl Aggregator {
    /// Every stack's sample sets now (`now_ns`, CLOCK_MONOTONIC), frames resolved, and per
    /// process the samples the kernel could not deliver (`lost`, its latest cumulative
    /// count); live blocks allocated more than `leak_age` ago are `leaked` (none without a
    /// leak age).
    pub async fn tally(
        &self,
        symbolizer: &Symbolizer,
        readings: Readings<'_>,
        now_ns: u64,
        leak_age: Option<std::time::Duration>,
    ) -> Tally {
        let Readings {
            processes: book,
            lost,
            open_stratum,
        } = readings;
        let resolved = self.resolve_frames(symbolizer).await;
        let leaks = leak_age
            .map(|age| self.leak_candidates(age, now_ns))
            .unwrap_or_default();
        let growth = self.live_growth(now_ns);
        let stacks = self.stack_tallies(&resolved, &leaks, &growth, lost, open_stratum, now_ns);
        let recent_seconds = self.recent.as_ref().map_or(0.0, |recent| {
            recent.tracker().coverage(now_ns, recent.window_ns).1
        });
        let processes = book.tally(|pid| ProcessSamples {
            untracked: self.untracked.get(&pid).copied().unwrap_or(0),
            runtime_hits: self.runtime_hits.get(&pid).copied().unwrap_or(0),
            lost: lost
                .get(&pid)
                .map_or(0, |batches| batches.iter().map(|b| b.samples).sum()),
            duty: self.duty_of_process(pid, open_stratum),
        });
        let build_ids = self.build_ids(&resolved);
        let start_ns = self.timeline.as_ref().map(|t| t.grid().start_ns);
        let peak_seconds = processes
            .iter()
            .filter_map(|p| {
                let peak = self.peaks.process(p.pid)?;
                // A command's samples taken while its probes loaded are older than the
                // start: when then is not said.
                let seconds = start_ns
                    .filter(|&start| peak.at_ns >= start)
                    .map(|start| (peak.at_ns - start) as f64 / 1e9);
                Some((p.pid, seconds))
            })
            .collect();
        Tally {
            peak_seconds,
            period_only: false,
            stacks,
            processes,
            recent_seconds,
            build_ids,
            cut_samples: self.stacks.cut_samples(),
            duty_ns_per_call: open_stratum.map_or(0.0, |open| open.ns_per_call),
            timeline: self.timeline.clone(),
            ticks: self.timeline.as_ref().map_or(0, |t| t.grid().ticks(now_ns)),
            thread_names: self
                .thread_names
                .iter()
                .map(|(&key, comm)| (key, crate::collect::comm_name(comm)))
                .collect(),
        }
    }

    /// Per stack, the growth sums of its blocks: those freed, and those still live up to
    /// the tick of `now_ns` (see [`crate::stats::growth`]).
    fn live_growth(&self, now_ns: u64) -> HashMap<StackId, GrowthSums> {
        let Some(grid) = self.timeline.as_ref().map(Timeline::grid) else {
            return HashMap::new();
        };
        let ticks = grid.ticks(now_ns);
        let mut growth: HashMap<StackId, GrowthSums> = HashMap::new();
        for block in self.live.values() {
            let span = grid.span(block.allocated_ns, u64::MAX, ticks);
            growth.entry(block.stack).or_default().add(block.obs, span);
        }
        growth
    }

    /// Every stack's sample sets now, frames resolved, and per process the pseudo-stack of
    /// its samples lost without a stack.
    fn stack_tallies(
        &self,
        resolved: &HashMap<Frame, Vec<FrameInfo>>,
        leaks: &HashMap<StackId, (SampleSet, u64)>,
        growth: &HashMap<StackId, GrowthSums>,
        lost: &LostCounts,
        open_stratum: Option<&OpenStratum>,
        now_ns: u64,
    ) -> Vec<StackTally> {
        self.per_stack
            .iter()
            .enumerate()
            .map(|(id, all)| {
                let (pid, frames) = self.stacks.stack(id as StackId);
                let recent = self
                    .recent
                    .as_ref()
                    .and_then(|recent| {
                        let tracker = recent.per_stack.get(id)?;
                        Some(tracker.window(now_ns, recent.window_ns).0)
                    })
                    .unwrap_or_default();
                StackTally {
                    pid,
                    frames: {
                        // Sized exactly: 100,000 stacks hold these until written.
                        let count = frames.iter().map(|frame| resolved[frame].len()).sum();
                        let mut infos = Vec::with_capacity(count);
                        infos.extend(
                            frames
                                .iter()
                                .flat_map(|frame| resolved[frame].iter().cloned()),
                        );
                        infos
                    },
                    all: *all,
                    live: self.per_stack_live[id],
                    at_peak: self.peaks.at_peak(id, pid, &self.per_stack_live[id]),
                    leaked: leaks
                        .get(&(id as StackId))
                        .map(|(set, _)| *set)
                        .unwrap_or_default(),
                    oldest_leaked_seconds: leaks
                        .get(&(id as StackId))
                        .map(|(_, oldest_ns)| now_ns.saturating_sub(*oldest_ns) as f64 / 1e9),
                    period: self.per_stack_period[id],
                    recent,
                    lost: false,
                    cut_to_leaf: self.stacks.is_cut(id as StackId),
                    origin: Some(self.stacks.origin(id as StackId)),
                    duty: self.duty_of_stack(id as StackId, open_stratum),
                    id: Some(id),
                    breakdown: self.breakdowns.get(id).cloned().unwrap_or_default(),
                    growth: self.growth_of(id, growth),
                }
            })
            .chain(
                lost.iter()
                    .map(|(&pid, batches)| self.lost_tally(pid, batches)),
            )
            .collect()
    }

    /// The pseudo-stack of `pid`'s samples lost without a stack (`batches`: the kernel's
    /// cumulative counts).
    fn lost_tally(&self, pid: u32, batches: &[LostBatch]) -> StackTally {
        let before = self.lost_at_period_start.get(&pid);
        StackTally {
            pid,
            frames: vec![FrameInfo {
                function: Some(LOST_FRAME.into()),
                ..FrameInfo::default()
            }],
            all: lost_set(batches, &[]),
            live: SampleSet::default(),
            at_peak: SampleSet::default(),
            leaked: SampleSet::default(),
            oldest_leaked_seconds: None,
            period: lost_set(batches, before.map_or(&[], Vec::as_slice)),
            recent: SampleSet::default(),
            lost: true,
            cut_to_leaf: false,
            origin: None,
            duty: None,
            id: None,
            breakdown: Breakdown::default(),
            growth: GrowthSums::default(),
        }
    }

    /// Stack `id`'s growth sums: its blocks freed so far, and `live`'s (those still live).
    fn growth_of(&self, id: usize, live: &HashMap<StackId, GrowthSums>) -> GrowthSums {
        let mut sums = self
            .breakdowns
            .get(id)
            .map(|b| b.freed_growth)
            .unwrap_or_default();
        if let Some(live) = live.get(&(id as StackId)) {
            sums.merge(live);
        }
        sums
    }

    /// The build id of every module the resolved frames name.
    fn build_ids(
        &self,
        resolved: &HashMap<Frame, Vec<FrameInfo>>,
    ) -> HashMap<String, Option<String>> {
        let modules = self.stacks.modules();
        let module_ids: std::collections::HashSet<stacks::ModuleId> = resolved
            .keys()
            .filter_map(|frame| match *frame {
                Frame::File { module, .. } => Some(module),
                Frame::Unknown { .. } | Frame::Python { .. } => None,
            })
            .collect();
        module_ids
            .into_iter()
            .map(|module| {
                let id = modules.build_id(module).map(str::to_owned);
                (modules.name(module).to_owned(), id)
            })
            .collect()
    }

    /// Per stack: the live samples allocated more than `age` before `now_ns`, and the oldest
    /// one's allocation time.
    fn leak_candidates(
        &self,
        age: std::time::Duration,
        now_ns: u64,
    ) -> HashMap<StackId, (SampleSet, u64)> {
        let cutoff = now_ns.saturating_sub(age.as_nanos() as u64);
        let mut candidates: HashMap<StackId, (SampleSet, u64)> = HashMap::new();
        for block in self.live.values().filter(|b| b.allocated_ns <= cutoff) {
            let (set, oldest) = candidates
                .entry(block.stack)
                .or_insert((SampleSet::default(), u64::MAX));
            set.add(block.obs);
            *oldest = (*oldest).min(block.allocated_ns);
        }
        candidates
    }
}

/// `batches` minus what `before` (an earlier reading of the same cumulative counts) held,
/// as a sample set.
fn lost_set(batches: &[LostBatch], before: &[LostBatch]) -> SampleSet {
    // Indexed once: a process can have thousands of (size, interval) keys.
    let before: HashMap<(u64, u64), (u64, u64)> = before
        .iter()
        .map(|b| ((b.size, b.interval), (b.samples, b.unseen)))
        .collect();
    let mut set = SampleSet::default();
    for batch in batches {
        let (samples, unseen) = before
            .get(&(batch.size, batch.interval))
            .copied()
            .unwrap_or_default();
        set.add_many(
            batch.size,
            batch.interval,
            batch.samples.saturating_sub(samples),
            batch.unseen.saturating_sub(unseen),
        );
    }
    set
}
