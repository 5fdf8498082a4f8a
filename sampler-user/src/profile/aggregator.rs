//! Aggregation as samples arrive: normalize + intern the stack, add to running sums (O(1)
//! per event, nothing resolved); with frees tracked, a map of sampled live blocks so each
//! free takes back exactly what its sample added. [`Aggregator::tally`] symbolizes each
//! distinct frame once (cached across snapshots) and hands out every stack's sample sets;
//! [`Aggregator::tally`] hands them on (a recording builds them into a profile, `top` groups
//! them).

use std::collections::{BTreeMap, HashMap};

use sampler_common::ProcessCounters;

use crate::{
    collect::{Event, LostBatch, Sample},
    duty::sums::{DutyPair, DutySums, StratumObserved},
    probe::{allocator::Allocator, maps::FileId},
    stacks::{
        self, symbolize::FrameInfo, symbolize::Symbolizer, Frame, StackId, StackOrigin, StackTable,
    },
    stats::{rate::RateTracker, SampleObs, SampleSet},
};

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
    commands: BTreeMap<u32, String>,
    executables: BTreeMap<u32, String>,
    cgroups: BTreeMap<u32, String>,
    /// Per pid: its allocator files, each as first described to users.
    allocators: BTreeMap<u32, Vec<(FileId, String)>>,
    /// Per pid: the last resident set size read (kept after the process exits).
    rss: BTreeMap<u32, u64>,
    /// Per pid: its CPU time (clock ticks) when first and last read.
    cpu: BTreeMap<u32, (u64, u64)>,
    /// Whether the unusual uprobe-area address was reported already.
    warned_area: bool,
    /// Per stack, samples in one-second buckets over the recent window (`top` only).
    recent: Option<Recent>,
    /// Per pid: samples the kernel could not deliver, as last read (cumulative).
    lost: BTreeMap<u32, Vec<LostBatch>>,
    /// The same at the start of the current period.
    lost_at_period_start: BTreeMap<u32, Vec<LostBatch>>,
    /// Duty cycling (`--max-overhead`): the sums per stratum.
    duty: Option<DutySums>,
    /// The current stratum as observed so far, the exact counters then and the probes'
    /// cost per call: what a tally adds to the closed strata, and estimates with.
    duty_now: Option<(StratumObserved, BTreeMap<u32, ProcessCounters>, f64)>,
}

/// The frame that names the pseudo-stack of samples lost without a stack.
pub const LOST_FRAME: &str = "[samples lost: ring buffer full]";

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

/// One stack's raw sample sets with its frames resolved: for views that group stacks and
/// estimate the groups themselves (`top`).
#[derive(Clone, Debug, PartialEq)]
pub struct StackTally {
    /// Process id.
    pub pid: u32,
    /// Frames, leaf (the allocator's caller) first.
    pub frames: Vec<FrameInfo>,
    /// Samples since the start.
    pub all: SampleSet,
    /// Samples whose blocks are still live.
    pub live: SampleSet,
    /// Live samples older than the leak age.
    pub leaked: SampleSet,
    /// Age in seconds of the oldest of them (`None`: none).
    pub oldest_leaked_seconds: Option<f64>,
    /// Samples since the last [`Aggregator::start_period`].
    pub period: SampleSet,
    /// Samples in the recent window (estimate with `Window::SLIDING`, divide by
    /// [`Tally::recent_seconds`]).
    pub recent: SampleSet,
    /// The pseudo-stack of the process's samples lost without a stack (one [`LOST_FRAME`]).
    pub lost: bool,
    /// Holds stacks cut to this leaf frame (beyond `--max-stacks`).
    pub cut_to_leaf: bool,
    /// How the stack was unwound and where it ended (`None`: not a stack).
    pub origin: Option<StackOrigin>,
    /// Duty cycling: its totals over time-sampled strata (`None`: always on, or the lost
    /// samples' pseudo-stack).
    pub duty: Option<DutyPair>,
}

/// One process's side of a [`Tally`].
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessTally {
    /// Process id.
    pub pid: u32,
    /// Command name.
    pub command: String,
    /// Path of the executable (empty when it could not be read).
    pub executable: String,
    /// Resident set size last read.
    pub rss_bytes: Option<u64>,
    /// CPU seconds it used from when it was first to when it was last seen (every 250 ms
    /// while it runs), probes included.
    pub cpu_seconds: Option<f64>,
    /// Sampled blocks whose frees could not be tracked.
    pub untracked_samples: u64,
    /// Samples lost without a stack (the ring buffer was full).
    pub lost_samples: u64,
    /// Its cgroup (v2 path): a container, a systemd unit.
    pub cgroup: Option<String>,
    /// Its allocators as probed ("jemalloc (/usr/lib/…)"); host-wide (`--all`), those it
    /// mapped when it was first looked at.
    pub allocators: Vec<String>,
    /// Duty cycling: its bytes and calls over time-sampled strata, from the exact counters.
    pub duty: Option<DutyPair>,
}

/// Every stack's raw sample sets at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    /// Stacks, in no particular order.
    pub stacks: Vec<StackTally>,
    /// Targets.
    pub processes: Vec<ProcessTally>,
    /// Seconds the `recent` sets cover.
    pub recent_seconds: f64,
    /// Build id of every module the frames name, read from the file the process mapped.
    pub build_ids: HashMap<String, Option<String>>,
    /// Samples whose stack was cut to its leaf (beyond `--max-stacks`).
    pub cut_samples: u64,
    /// Duty cycling: the probes' cost per call, which the estimates take out of the
    /// targets' CPU time (see [`crate::duty::estimate`]).
    pub duty_ns_per_call: f64,
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

    /// Starts tracking `pid`: remembers its command name, executable, maps and RSS while it
    /// surely lives.
    pub fn track(&mut self, pid: u32) {
        let command = crate::targets::comm_of(pid).unwrap_or_default();
        self.commands.insert(pid, command);
        if let Some(cgroup) = crate::targets::cgroup_of(pid) {
            self.cgroups.insert(pid, cgroup);
        }
        if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
            self.executables.insert(pid, exe.display().to_string());
        }
        self.stacks.snapshot(pid);
        if let Some(bytes) = read_rss(pid) {
            self.rss.insert(pid, bytes);
        }
        self.note_cpu(pid);
    }

    /// Reads `pid`'s CPU time: the first reading is where its recorded time starts (a new
    /// process's is ~0), the latest where it ends.
    fn note_cpu(&mut self, pid: u32) {
        if let Some(ticks) = read_cpu_ticks(pid) {
            self.cpu
                .entry(pid)
                .and_modify(|(_, last)| *last = ticks)
                .or_insert((ticks, ticks));
        }
    }

    /// Starts tracking `pid`, a new process of `parent` (forked, not exec'd yet): what it
    /// cannot tell about itself any more (it may already be gone, a few milliseconds of
    /// work being all it did) is its parent's, whose memory it started as a copy of.
    pub fn track_fork(&mut self, pid: u32, parent: u32) {
        self.track(pid);
        self.stacks.inherit(pid, parent);
        for names in [&mut self.commands, &mut self.executables] {
            if names.get(&pid).is_none_or(String::is_empty) {
                if let Some(name) = names.get(&parent).cloned() {
                    names.insert(pid, name);
                }
            }
        }
        if !self.cgroups.contains_key(&pid) {
            if let Some(cgroup) = self.cgroups.get(&parent).cloned() {
                self.cgroups.insert(pid, cgroup);
            }
        }
    }

    /// Takes `pid`'s maps as the intake thread read them at its first sample (see
    /// [`crate::collect::Event::Maps`]), before a fork event that copies them is handled.
    pub fn offer_maps(&mut self, pid: u32, read_ns: u64, text: &str) {
        self.stacks.offer_maps(pid, read_ns, text);
    }

    /// Names `pid` `command` (as the kernel reported it at an exec or fork) if it could not
    /// be read from /proc: it was gone already.
    pub fn name_if_unknown(&mut self, pid: u32, command: &str) {
        let name = self.commands.entry(pid).or_default();
        if name.is_empty() {
            command.clone_into(name);
        }
    }

    /// Re-reads the maps of targets still alive (late-loaded libraries) and their RSS, and
    /// checks where the kernel put each one's uprobe area.
    pub fn refresh(&mut self) {
        self.stacks.refresh_live();
        for (&pid, command) in &mut self.commands {
            if let Some(ticks) = read_cpu_ticks(pid) {
                if let Some((_, last)) = self.cpu.get_mut(&pid) {
                    *last = ticks;
                }
            }
            if let Some(bytes) = read_rss(pid) {
                self.rss.insert(pid, bytes);
                // Alive: an exec since it was tracked gave it a new name.
                if let Some(now) = crate::targets::comm_of(pid) {
                    *command = now;
                }
            }
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
    pub fn hold_file(&mut self, file_id: crate::probe::maps::FileId, path: std::path::PathBuf) {
        self.stacks.hold_file(file_id, path);
    }

    /// Keeps at most `max` whole distinct stacks (see [`StackTable`]).
    pub fn limit_stacks(&mut self, max: usize) {
        self.stacks.limit(max);
    }

    /// Whether `pid` is tracked already.
    pub fn tracks(&self, pid: u32) -> bool {
        self.commands.contains_key(&pid)
    }

    /// Adds the allocators probed in `pid` (each file described once, as JSON reports
    /// them, by the first path it was seen at: /lib and /usr/lib are one file) to those
    /// probed in it before: a process attached at exec, before its libraries are mapped,
    /// gains its C library a moment later.
    pub fn add_allocators(&mut self, pid: u32, allocators: &[Allocator]) {
        let described = self.allocators.entry(pid).or_default();
        for allocator in allocators {
            if !described.iter().any(|(file, _)| *file == allocator.file_id) {
                described.push((allocator.file_id.clone(), allocator.describe()));
            }
        }
    }

    /// Notes that `pid` exited: its frames resolve with the maps it last had.
    pub fn mark_exited(&mut self, pid: u32) {
        self.stacks.mark_gone(pid);
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
            Event::Alloc(sample) => self.add_sample(sample),
            Event::Free(freed) => self.free(freed.pid, freed.address),
            // Taken in order with the process events, by the recording: see `offer_maps`.
            Event::Process { .. } | Event::Maps { .. } => {}
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
        let obs = SampleObs {
            size: sample.size,
            offset: sample.offset,
            interval: sample.interval,
            weight: sample.weight,
        };
        self.per_stack[id].add(obs);
        self.per_stack_period[id].add(obs);
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
            self.free(sample.pid, sample.address);
            self.per_stack_live[id].add(obs);
            self.live.insert(
                (sample.pid, sample.address),
                LiveBlock {
                    stack,
                    obs,
                    allocated_ns: sample.timestamp_ns,
                },
            );
        } else if sample.stack_at_return && sample.address != 0 {
            *self.untracked.entry(sample.pid).or_default() += 1;
        }
    }

    /// A tracked block was freed: its sample leaves the live sets (unknown blocks: nothing).
    fn free(&mut self, pid: u32, address: u64) {
        if let Some(block) = self.live.remove(&(pid, address)) {
            self.per_stack_live[block.stack as usize].remove(block.obs);
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

    /// Duty cycling: the current stratum as observed so far, with the exact counters and
    /// the probes' cost per call now, for the next tally.
    pub fn set_open_stratum(
        &mut self,
        observed: StratumObserved,
        counters: BTreeMap<u32, ProcessCounters>,
        ns_per_call: f64,
    ) {
        self.duty_now = Some((observed, counters, ns_per_call));
    }

    fn duty_of_stack(&self, stack: StackId) -> Option<DutyPair> {
        let duty = self.duty.as_ref()?;
        duty.stack(stack, self.open_stratum())
    }

    fn duty_of_process(&self, pid: u32) -> Option<DutyPair> {
        let duty = self.duty.as_ref()?;
        let counters = self
            .duty_now
            .as_ref()
            .and_then(|(_, counters, _)| counters.get(&pid).copied())
            .unwrap_or_default();
        Some(duty.process(pid, counters, self.open_stratum()))
    }

    fn open_stratum(&self) -> &StratumObserved {
        static NOTHING: StratumObserved = StratumObserved {
            slots: 0.0,
            work: BTreeMap::new(),
            ns_per_call: 0.0,
        };
        self.duty_now
            .as_ref()
            .map_or(&NOTHING, |(observed, _, _)| observed)
    }

    /// Starts a new period: the next snapshot's period values count from here.
    pub fn start_period(&mut self) {
        self.per_stack_period.fill(SampleSet::default());
        self.lost_at_period_start = self.lost.clone();
    }

    /// Takes the kernel's latest (cumulative) count of the samples it could not deliver.
    pub fn set_lost(&mut self, lost: BTreeMap<u32, Vec<LostBatch>>) {
        self.lost = lost;
    }

    /// Every stack's sample sets now (`now_ns`, CLOCK_MONOTONIC), frames resolved; live
    /// blocks allocated more than `leak_age` ago are `leaked` (none without a leak age).
    pub async fn tally(
        &self,
        symbolizer: &Symbolizer,
        now_ns: u64,
        leak_age: Option<std::time::Duration>,
    ) -> Tally {
        let resolved = self.resolve_frames(symbolizer).await;
        let leaks = leak_age
            .map(|age| self.leak_candidates(age, now_ns))
            .unwrap_or_default();
        let stacks = self
            .per_stack
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
                    duty: self.duty_of_stack(id as StackId),
                }
            })
            .chain(self.lost.iter().map(|(&pid, batches)| {
                let before = self.lost_at_period_start.get(&pid);
                StackTally {
                    pid,
                    frames: vec![FrameInfo {
                        function: Some(LOST_FRAME.into()),
                        ..FrameInfo::default()
                    }],
                    all: lost_set(batches, &[]),
                    live: SampleSet::default(),
                    leaked: SampleSet::default(),
                    oldest_leaked_seconds: None,
                    period: lost_set(batches, before.map_or(&[], Vec::as_slice)),
                    recent: SampleSet::default(),
                    lost: true,
                    cut_to_leaf: false,
                    origin: None,
                    duty: None,
                }
            }))
            .collect();
        let recent_seconds = self.recent.as_ref().map_or(0.0, |recent| {
            recent.tracker().coverage(now_ns, recent.window_ns).1
        });
        let processes =
            self.commands
                .iter()
                .map(|(&pid, command)| ProcessTally {
                    pid,
                    command: command.clone(),
                    executable: self.executables.get(&pid).cloned().unwrap_or_default(),
                    rss_bytes: self.rss.get(&pid).copied(),
                    cpu_seconds: self.cpu.get(&pid).map(|&(first, last)| {
                        last.saturating_sub(first) as f64 / ticks_per_second()
                    }),
                    untracked_samples: self.untracked.get(&pid).copied().unwrap_or(0),
                    lost_samples: self
                        .lost
                        .get(&pid)
                        .map_or(0, |batches| batches.iter().map(|b| b.samples).sum()),
                    cgroup: self.cgroups.get(&pid).cloned(),
                    allocators: self
                        .allocators
                        .get(&pid)
                        .map(|files| files.iter().map(|(_, name)| name.clone()).collect())
                        .unwrap_or_default(),
                    duty: self.duty_of_process(pid),
                })
                .collect();
        let modules = self.stacks.modules();
        let module_ids: std::collections::HashSet<stacks::ModuleId> = resolved
            .keys()
            .filter_map(|frame| match *frame {
                Frame::File { module, .. } => Some(module),
                Frame::Unknown { .. } => None,
            })
            .collect();
        let build_ids = module_ids
            .into_iter()
            .map(|module| {
                let id = modules.build_id(module).map(str::to_owned);
                (modules.name(module).to_owned(), id)
            })
            .collect();
        Tally {
            stacks,
            processes,
            recent_seconds,
            build_ids,
            cut_samples: self.stacks.cut_samples(),
            duty_ns_per_call: self.duty_now.as_ref().map_or(0.0, |(_, _, ns)| *ns),
        }
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
                Frame::Unknown { .. } => None,
            })
            .collect();
        let mut names = symbolizer.resolve(files).await.into_iter();
        // One copy of each module's name for all its frames.
        let mut shown_names: HashMap<_, std::sync::Arc<str>> = HashMap::new();
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
                };
                (frame, infos)
            })
            .collect()
    }
}

/// CPU time of `pid` (user and system, every thread's, in clock ticks) from
/// /proc/PID/stat, if it is alive.
fn read_cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_ticks_of_stat(&stat)
}

/// utime + stime of a /proc/PID/stat line (fields 14 and 15; the command name, field 2,
/// may hold spaces and parentheses, so fields count from its last `)`).
fn cpu_ticks_of_stat(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second of /proc's CPU times.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// Resident set size of `pid` from /proc/PID/status (`VmRSS`), if it is alive.
fn read_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_of_a_stat_line() {
        // A command name with a space and parentheses; utime 1234, stime 56.
        let stat = "4242 (we(ird) name) S 1 4242 4242 0 -1 4194560 300 0 0 0 1234 56 0 0 \
                    20 0 1 0 100 1000000 200 18446744073709551615";
        assert_eq!(cpu_ticks_of_stat(stat), Some(1290));
        assert_eq!(cpu_ticks_of_stat("4242 (x) S 1"), None);
        assert!(read_cpu_ticks(std::process::id()).is_some());
    }
}
