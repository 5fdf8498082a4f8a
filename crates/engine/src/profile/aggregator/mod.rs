//! Aggregation as samples arrive: normalize + intern the stack, add to running sums (O(1)
//! per event, nothing resolved); with frees tracked, a map of sampled live blocks so each
//! free takes back exactly what its sample added. [`Aggregator::tally`] symbolizes each
//! distinct frame once (cached across snapshots) and hands out every stack's sample sets;
//! [`Aggregator::tally`] hands them on (a recording builds them into a profile, `top` groups
//! them).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use sampler_common::ProcessCounters;

mod tallies;

use super::{
    breakdown::Breakdown,
    processes::{Forked, ProcessBook},
    timeline::Timeline,
};
use crate::{
    collect::{Event, Freed, LostBatch, Sample},
    duty::sums::{DutyPair, DutySums, StratumObserved},
    stacks::{self, symbolize::FrameInfo, symbolize::Symbolizer, Frame, StackId, StackTable},
    stats::{growth::TickGrid, peak::Peaks, rate::RateTracker, SampleObs, SampleSet},
};

/// Thread names kept at most ((pid, tid) pairs); later threads are shown by tid only.
const MAX_THREAD_NAMES: usize = 65_536;

/// A sampled block still live.
#[derive(Clone, Copy, Debug)]
struct LiveBlock {
    stack: StackId,
    obs: SampleObs,
    allocated_ns: u64,
}

/// Aggregates samples as they arrive.
#[derive(Debug, Default)]
pub struct Aggregator {
    stacks: StackTable,
    /// Samples per stack since the start.
    per_stack: Vec<SampleSet>,
    /// Samples per stack since the last snapshot (`--every`).
    per_stack_period: Vec<SampleSet>,
    /// Samples per stack whose blocks are still live (frees tracked).
    per_stack_live: Vec<SampleSet>,
    /// (pid, address) → the live sampled block there.
    live: HashMap<(u32, u64), LiveBlock>,
    /// Per pid: sampled blocks whose frees could not be tracked.
    untracked: BTreeMap<u32, u64>,
    /// Per pid: another sampler's samples and their frees seen, each a hit of its probes.
    runtime_hits: BTreeMap<u32, u64>,
    /// Frees are tracked: a sample with an address the kernel does not track (its live map
    /// full, or the in-process sampler's table) is untracked, whatever probe took it.
    frees_tracked: bool,
    /// Whether the unusual uprobe-area address was reported already.
    warned_area: bool,
    /// Per stack, samples in one-second buckets over the recent window (`top` only).
    recent: Option<Recent>,
    /// Per pid: the kernel's count of the samples it could not deliver (cumulative) at the
    /// start of the current period.
    lost_at_period_start: LostCounts,
    /// Duty cycling (`--max-overhead`): the sums per stratum.
    duty: Option<DutySums>,
    /// Per stack: sizes, threads, lifetimes and growth (not kept while duty-cycled: the
    /// on slots alone would not stand for the whole).
    breakdowns: Vec<Breakdown>,
    /// In-use bytes and allocation rates over time, on the grid growth is measured on.
    timeline: Option<Timeline>,
    /// (pid, tid) → the thread's name at its latest sample.
    thread_names: HashMap<(u32, u32), [u8; 16]>,
    /// Each process's peak of live bytes, and its stacks' live samples then.
    peaks: Peaks,
}

/// What a tally reads besides the samples, as the recording last read it: the targets'
/// descriptions, the samples the kernel could not deliver, and duty cycling's open stratum.
#[derive(Clone, Copy)]
pub struct Readings<'a> {
    /// The targets' descriptions.
    pub processes: &'a ProcessBook,
    /// The kernel's count of the samples it could not deliver (cumulative).
    pub lost: &'a LostCounts,
    /// Duty cycling: the current stratum as observed so far.
    pub open_stratum: Option<&'a OpenStratum>,
}

/// Duty cycling: the current stratum as observed so far, with the exact counters and the
/// probes' cost per call then: what a tally adds to the closed strata, and estimates with.
#[derive(Clone, Debug, Default)]
pub struct OpenStratum {
    /// The stratum's slots and work so far.
    pub observed: StratumObserved,
    /// The exact counters when it was observed.
    pub counters: BTreeMap<u32, ProcessCounters>,
    /// The probes' cost per call.
    pub ns_per_call: f64,
}

/// `open`'s observation, or an empty one (no stratum open).
fn observed_so_far(open: Option<&OpenStratum>) -> &StratumObserved {
    static NOTHING: StratumObserved = StratumObserved {
        slots: 0.0,
        work: BTreeMap::new(),
        ns_per_call: 0.0,
    };
    open.map_or(&NOTHING, |open| &open.observed)
}

/// Per process, the samples the kernel could not deliver (cumulative, by size and interval).
pub type LostCounts = BTreeMap<u32, Vec<LostBatch>>;

/// Per-stack rate trackers that all cover the same time.
#[derive(Debug)]
struct Recent {
    window_ns: u64,
    started_ns: u64,
    per_stack: Vec<RateTracker>,
}

impl Recent {
    const BUCKET_NS: u64 = 1_000_000_000;

    fn tracker(&self) -> RateTracker {
        let buckets = self.window_ns.div_ceil(Self::BUCKET_NS) as usize + 1;
        let mut tracker = RateTracker::new(Self::BUCKET_NS, buckets);
        // Every stack's window starts with the recording, not with its first sample:
        // otherwise a new stack's rate would be divided by the few seconds since it appeared.
        tracker.start(self.started_ns);
        tracker
    }
}

impl Aggregator {
    /// An aggregator that also keeps each stack's samples over the last `window`, for rates.
    pub fn with_recent(window: std::time::Duration) -> Aggregator {
        Aggregator {
            recent: Some(Recent {
                window_ns: window.as_nanos() as u64,
                started_ns: crate::collect::monotonic_ns(),
                per_stack: Vec::new(),
            }),
            ..Aggregator::default()
        }
    }

    /// Keeps in-use bytes and allocation rates over time on `grid`, whose ticks growth is
    /// measured on too.
    pub fn keep_timeline(&mut self, grid: TickGrid) {
        self.timeline = Some(Timeline::new(grid));
    }

    /// Closes the timeline's points due by `now_ns` (CLOCK_MONOTONIC): called as samples
    /// arrive and once a second, so quiet stretches get their points too.
    pub fn advance(&mut self, now_ns: u64) {
        if let Some(timeline) = &mut self.timeline {
            timeline.advance(now_ns, &self.per_stack, &self.per_stack_live);
        }
    }

    /// Frees are tracked (not `--alloc-only`): a sample with an address that is not
    /// tracked counts as untracked, whatever probe took it.
    pub fn track_frees(&mut self) {
        self.frees_tracked = true;
    }

    /// Starts tracking `pid`: its maps, read while it surely lives (again after an exec).
    pub fn track(&mut self, pid: u32) {
        self.stacks.snapshot(pid);
    }

    /// Starts tracking `pid`, a new process of `parent` (forked, not exec'd yet): it may
    /// already be gone, a few milliseconds of work being all it did, and its memory
    /// started as a copy of its parent's, whose maps stand in for its own. `forked`: one
    /// that still runs its parent's program takes its parent's maps without reading its
    /// own (any reading of its own later replaces them); one past an exec already is left
    /// to its exec event, which follows and reads the new program's maps (reading them
    /// here too was a third of what a shell loop's process cost allocscope in maps reads).
    pub fn track_fork(&mut self, pid: u32, parent: u32, forked: Forked) {
        match forked {
            Forked::Copy if self.stacks.inherit(pid, parent) => {}
            Forked::Execd => {}
            Forked::Copy | Forked::Other => {
                self.track(pid);
                self.stacks.inherit(pid, parent);
            }
        }
    }

    /// Takes `pid`'s maps as the intake thread read them at its first sample (see
    /// [`crate::collect::Event::Maps`]), before a fork event that copies them is handled.
    pub fn offer_maps(&mut self, pid: u32, read_ns: u64, text: &str) {
        self.stacks.offer_maps(pid, read_ns, text);
    }

    /// Re-reads the maps of targets still alive (late-loaded libraries), and checks where
    /// the kernel put the uprobe area of each of `pids`.
    pub fn refresh(&mut self, pids: &[u32]) {
        self.stacks.refresh_live();
        for &pid in pids {
            match self.stacks.uprobe_area(pid) {
                Some(area) if area != sampler_common::UPROBE_TRAMPOLINE && !self.warned_area => {
                    self.warned_area = true;
                    log::warn!(
                        "pid {pid}: the kernel's uprobe area is at {area:#x}, not {:#x}: a malloc \
                         tail-called by realloc(NULL) or aligned_alloc may be counted twice while \
                         other tools probe the same functions",
                        sampler_common::UPROBE_TRAMPOLINE
                    );
                }
                _ => {}
            }
        }
    }

    /// Samples whose stacks were unwound and interned, the mean time each took (ns) and
    /// the mean bytes of stack copied with each.
    pub fn stack_cost(&self) -> (u64, f64, f64) {
        self.stacks.intern_cost()
    }

    /// Makes a file allocscope holds open readable to the unwinder and the frame checks
    /// (see [`crate::stacks::ModuleTable::hold`]).
    pub fn hold_file(&mut self, file_id: crate::sys::maps::FileId, path: std::path::PathBuf) {
        self.stacks.hold_file(file_id, path);
    }

    /// Keeps at most `max` whole distinct stacks (see [`StackTable`]).
    pub fn limit_stacks(&mut self, max: usize) {
        self.stacks.limit(max);
    }

    /// How Python frames are merged into native stacks (`--python-frames all` keeps the
    /// interpreter's own frames).
    pub fn merge_python(&mut self, merge: crate::python::Merge) {
        self.stacks.merge_python(merge);
    }

    /// Notes that `pid` exited: its frames resolve with the maps it last had.
    pub fn mark_exited(&mut self, pid: u32) {
        self.stacks.mark_gone(pid);
    }

    /// Every process with maps or stacks kept here (sampled ones, whether or not the
    /// recording went on to track them).
    pub fn known(&self) -> std::collections::BTreeSet<u32> {
        let mut known = self.stacks.pids();
        known.extend(self.untracked.keys());
        known.extend(self.runtime_hits.keys());
        known
    }

    /// How many stacks are kept.
    pub fn stack_count(&self) -> usize {
        self.per_stack.len()
    }

    /// How many sampled blocks are live.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Forgets the processes in `gone` (exited, their last period sent: the agent): their
    /// stacks and every per-stack value, their live blocks, their counts. Not while
    /// duty-cycled (its strata sum over the whole recording). Returns each old stack id's
    /// new one (empty when nothing was forgotten: the ids stand).
    pub fn forget(&mut self, gone: &std::collections::BTreeSet<u32>) -> Vec<Option<StackId>> {
        if gone.is_empty() || self.duty.is_some() {
            return Vec::new();
        }
        let remap = self.stacks.forget(gone);
        let retain = |v: &mut Vec<SampleSet>| stacks::forget::retain_remapped(v, &remap);
        retain(&mut self.per_stack);
        retain(&mut self.per_stack_period);
        retain(&mut self.per_stack_live);
        stacks::forget::retain_remapped(&mut self.breakdowns, &remap);
        self.peaks
            .forget(|old| remap.get(old).is_none_or(Option::is_some), gone);
        if let Some(timeline) = &mut self.timeline {
            timeline.retain_stacks(&remap);
        }
        if let Some(recent) = &mut self.recent {
            stacks::forget::retain_remapped(&mut recent.per_stack, &remap);
        }
        self.live.retain(|(pid, _), block| {
            match remap.get(block.stack as usize).copied().flatten() {
                Some(id) if !gone.contains(pid) => {
                    block.stack = id;
                    true
                }
                _ => false,
            }
        });
        for pid in gone {
            self.untracked.remove(pid);
            self.runtime_hits.remove(pid);
            self.lost_at_period_start.remove(pid);
        }
        self.thread_names.retain(|(pid, _), _| !gone.contains(pid));
        remap
    }

    /// Takes a batch of events, in order.
    pub fn add_all(&mut self, events: impl IntoIterator<Item = Event>) {
        for event in events {
            self.add(&event);
        }
    }

    /// Takes one event from the kernel.
    pub fn add(&mut self, event: &Event) {
        match event {
            Event::Alloc(sample) => {
                self.advance(sample.timestamp_ns);
                self.add_sample(sample);
            }
            Event::Free(freed) => {
                self.advance(freed.timestamp_ns);
                self.free(freed, Some(freed.timestamp_ns));
            }
            // Control events are the recording's (discovery, `offer_maps`): none come here.
            Event::Process { .. }
            | Event::Maps { .. }
            | Event::PythonFrames(_)
            | Event::GoStats { .. } => {}
        }
    }

    fn add_sample(&mut self, sample: &Sample) {
        let stack = self.stacks.intern_sample(sample);
        let id = stack as usize;
        if id >= self.per_stack.len() {
            self.per_stack.resize(id + 1, SampleSet::default());
            self.per_stack_period.resize(id + 1, SampleSet::default());
            self.per_stack_live.resize(id + 1, SampleSet::default());
        }
        if self.breakdowns.len() <= id && self.duty.is_none() {
            self.breakdowns.resize(id + 1, Breakdown::default());
        }
        let obs = SampleObs {
            size: sample.size,
            offset: sample.offset,
            interval: sample.interval,
            weight: sample.weight,
        };
        self.per_stack[id].add(obs);
        self.per_stack_period[id].add(obs);
        if sample.weight.is_some() && !sample.runtime_traceback {
            *self.runtime_hits.entry(sample.pid).or_default() += 1;
        }
        if let Some(breakdown) = self.breakdowns.get_mut(id) {
            breakdown.add(obs, sample.tid);
            let key = (sample.pid, sample.tid);
            if self.thread_names.len() < MAX_THREAD_NAMES || self.thread_names.contains_key(&key) {
                self.thread_names.insert(key, sample.thread_comm);
            }
        }
        if let Some(duty) = &mut self.duty {
            duty.add(stack, sample.pid, obs);
        }
        if let Some(recent) = &mut self.recent {
            while recent.per_stack.len() <= id {
                let tracker = recent.tracker();
                recent.per_stack.push(tracker);
            }
            recent.per_stack[id].add(sample.timestamp_ns, obs);
        }
        if sample.tracked {
            // A free of the previous block here was lost (ring buffer full): forget it.
            let lost = Freed {
                pid: sample.pid,
                timestamp_ns: sample.timestamp_ns,
                address: sample.address,
                read: false,
            };
            self.free(&lost, None);
            self.peaks
                .before_change(id, sample.pid, &self.per_stack_live[id]);
            self.per_stack_live[id].add(obs);
            self.peaks
                .after_change(sample.pid, obs, true, sample.timestamp_ns);
            self.live.insert(
                (sample.pid, sample.address),
                LiveBlock {
                    stack,
                    obs,
                    allocated_ns: sample.timestamp_ns,
                },
            );
        } else if (sample.stack_at_return || self.frees_tracked) && sample.address != 0 {
            *self.untracked.entry(sample.pid).or_default() += 1;
        }
    }

    /// A tracked block was freed (at `freed_ns`; `None`: its free was lost, when is not
    /// known): its sample leaves the live sets (unknown blocks: nothing), and its lifetime
    /// goes into its stack's breakdown.
    fn free(&mut self, freed: &Freed, freed_ns: Option<u64>) {
        let pid = freed.pid;
        let Some(block) = self.live.remove(&(pid, freed.address)) else {
            return;
        };
        let id = block.stack as usize;
        self.peaks.before_change(id, pid, &self.per_stack_live[id]);
        self.per_stack_live[id].remove(block.obs);
        // A lost free's time is unknown: the block's own allocation is the latest it is known
        // to have been live at (only a fall, so never a peak).
        let at_ns = freed_ns.unwrap_or(block.allocated_ns);
        if freed_ns.is_some() && block.obs.weight.is_some() && !freed.read {
            *self.runtime_hits.entry(pid).or_default() += 1;
        }
        self.peaks.after_change(pid, block.obs, false, at_ns);
        let grid = self.timeline.as_ref().map(Timeline::grid);
        let breakdown = self.breakdowns.get_mut(block.stack as usize);
        // A reading's free: when the block was allocated and freed is known only to the
        // reading, no lifetime is made up.
        let freed_ns = freed_ns.filter(|_| !freed.read);
        if let (Some(freed_ns), Some(grid), Some(breakdown)) = (freed_ns, grid, breakdown) {
            breakdown.freed(block.obs, block.allocated_ns, freed_ns, grid);
        }
    }

    /// The probes are duty-cycled (`--max-overhead`): estimates are summed per stratum.
    pub fn duty_cycle(&mut self) {
        self.duty.get_or_insert_with(DutySums::default);
    }

    /// Duty cycling: the current stratum ended, as `observed`; `counters` are the exact
    /// counters now. Every sample of its on slot must have been taken (catch up first).
    pub fn close_stratum(
        &mut self,
        observed: &StratumObserved,
        counters: &BTreeMap<u32, ProcessCounters>,
    ) {
        if let Some(duty) = &mut self.duty {
            duty.close(observed, counters);
        }
    }

    fn duty_of_stack(&self, stack: StackId, open: Option<&OpenStratum>) -> Option<DutyPair> {
        let duty = self.duty.as_ref()?;
        duty.stack(stack, observed_so_far(open))
    }

    fn duty_of_process(&self, pid: u32, open: Option<&OpenStratum>) -> Option<DutyPair> {
        let duty = self.duty.as_ref()?;
        let counters = open
            .and_then(|open| open.counters.get(&pid).copied())
            .unwrap_or_default();
        Some(duty.process(pid, counters, observed_so_far(open)))
    }

    /// Starts a new period: the next snapshot's period values count from here; `lost`: the
    /// kernel's count of samples it could not deliver, now.
    pub fn start_period(&mut self, lost: &LostCounts) {
        self.per_stack_period.fill(SampleSet::default());
        self.lost_at_period_start = lost.clone();
    }

    /// See [`StackTable::file_frames_since`].
    pub fn file_frames_since(&self, from: usize) -> (Vec<(std::path::PathBuf, u64)>, usize) {
        self.stacks.file_frames_since(from)
    }

    async fn resolve_frames(&self, symbolizer: &Symbolizer) -> HashMap<Frame, Vec<FrameInfo>> {
        let mut distinct: Vec<Frame> = self
            .stacks
            .iter()
            .flat_map(|(_, _, frames)| frames.iter().copied())
            .collect();
        distinct.sort_unstable();
        distinct.dedup();
        let files: Vec<(std::path::PathBuf, u64)> = distinct
            .iter()
            .filter_map(|frame| match *frame {
                Frame::File { module, offset } => {
                    Some((self.stacks.modules().source(module), offset))
                }
                Frame::Unknown { .. } | Frame::Python { .. } => None,
            })
            .collect();
        let mut names = symbolizer.resolve(files).await.into_iter();
        // One copy of each module's name for all its frames.
        let mut shown_names: HashMap<_, Arc<str>> = HashMap::new();
        distinct
            .into_iter()
            .map(|frame| {
                let infos = match frame {
                    Frame::File { module, .. } => {
                        // Read through the open file; named as the process showed it.
                        let shown = shown_names
                            .entry(module)
                            .or_insert_with(|| self.stacks.modules().name(module).into())
                            .clone();
                        let mut infos = names.next().unwrap_or_default();
                        for info in &mut infos {
                            info.module = Some(shown.clone());
                        }
                        infos
                    }
                    Frame::Unknown { address } => vec![FrameInfo {
                        address,
                        ..FrameInfo::default()
                    }],
                    Frame::Python { function, line } => {
                        let function = self.stacks.python_functions().get(function);
                        vec![FrameInfo {
                            function: function.map(|f| Arc::clone(&f.qualname)),
                            file: function
                                .filter(|f| !f.filename.is_empty())
                                .map(|f| Arc::clone(&f.filename)),
                            line: (line > 0).then_some(line),
                            kind: Some(stacks::symbolize::FrameKind::Python),
                            ..FrameInfo::default()
                        }]
                    }
                };
                (frame, infos)
            })
            .collect()
    }
}
