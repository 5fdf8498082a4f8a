//! The profile as every export and the summary read it, and as the JSON export writes it
//! (`allocscope/v1`, documented field by field in docs/json-schema.md): plain data types,
//! self-contained (nothing here imports the rest of the crate, so a reader of the format
//! reads this folder alone). How a profile is built from a recording's snapshot is
//! allocscope-engine's `profile`; the modules that compute a part of it (estimates, frames, costs,
//! losses) use the types defined here.

mod cost;
mod coverage;
mod frames;
mod losses;
mod numbers;

pub use cost::{Overhead, ProcessOverhead, Trap, TrapSource};
pub use coverage::{Coverage, CoverageStart, LateAllocator};
pub use frames::{FrameInfo, FrameKind, StackEnd, Unwinding};
pub use losses::Losses;
pub use numbers::infinite_if_null;
pub use numbers::{Estimate, Posterior, SeriesValues};

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Schema tag of the JSON export.
pub const SCHEMA: &str = "allocscope/v1";

/// The smallest sampling interval allocscope sets on its own: the throttle's band lowers
/// a quiet process's interval no further, and the summary suggests no smaller `-i`.
pub const SMALLEST_INTERVAL: u64 = 4096;

/// The frame that names the pseudo-stack of samples lost without a stack.
pub const LOST_FRAME: &str = "[samples lost: ring buffer full]";

/// The front end of a process counted in-process until it exec'd a program without the
/// library, and by uprobes from then on.
pub const IN_PROCESS_THEN_UPROBES: &str = "in-process, then uprobes";

/// The words of a process's `incomplete` note that says its memory grew by more than its
/// counted calls asked for (it allocates through something allocscope does not count).
pub const UNCOUNTED_MEMORY: &str = "allocates through something allocscope does not count";

/// The front end of a process counted in-process (the malloc family, through the library)
/// and by uprobes at the same time: an allocator linked into its executable (jemalloc in a
/// Rust program, its own `malloc`), which no preloaded library can interpose.
pub const IN_PROCESS_AND_UPROBES: &str = "in-process + uprobes";

/// Sampling parameters, as exported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Mean sampling interval in bytes (1/p).
    pub mean_interval_bytes: u64,
    /// Confidence level of every `lower`/`upper` pair.
    pub confidence: f64,
    /// When `--max-samples-per-sec` raised the interval: how (absent: it never did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<ThrottleRecord>,
    /// With `--max-overhead`: how the probes were duty-cycled (absent: always attached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duty: Option<DutyRecord>,
    /// One-line statement of the model.
    pub model: String,
}

/// What the sampling-rate throttle did (see allocscope-engine's `throttle`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThrottleRecord {
    /// The target, samples per second.
    pub max_samples_per_second: u32,
    /// The band's lower end, samples per second (0: the interval was never lowered below
    /// the one given).
    #[serde(default)]
    pub min_samples_per_second: u32,
    /// The largest interval it set.
    pub largest_interval_bytes: u64,
    /// The smallest interval it set (0 in files written before it existed).
    #[serde(default)]
    pub smallest_interval_bytes: u64,
    /// The changes, the first 1000 of them (`throttle`'s `LISTED_CHANGES`): seconds since
    /// the start, and the interval from then on (each thread takes it at its next sample;
    /// every sample carries its own).
    pub changes: Vec<IntervalChange>,
    /// Changes made after the list was full.
    #[serde(default)]
    pub changes_not_listed: u64,
}

/// How the probes were duty-cycled (see allocscope-engine's `duty::plan`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DutyRecord {
    /// The budget: most CPU time the probes may add, as a share of the targets' own.
    pub max_overhead: f64,
    /// Length of a slot.
    pub slot_seconds: f64,
    /// Strata begun (one on slot each).
    pub strata: u64,
    /// Share of the recording's time the probes were attached.
    pub observed_share: f64,
    /// The most slots a stratum had (one on slot in this many).
    pub largest_stratum_slots: u32,
    /// The on slots, the first [`DutyRecord::LISTED`] of them.
    pub on_slots: Vec<OnSlot>,
    /// On slots after the list was full.
    #[serde(default)]
    pub on_slots_not_listed: u64,
}

impl DutyRecord {
    /// On slots listed at most.
    pub const LISTED: usize = 1000;
}

/// One slot the probes were attached in.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OnSlot {
    /// Seconds since the recording started.
    pub at_seconds: f64,
    /// How long the gate was open.
    pub seconds: f64,
    /// Slots of its stratum: each of its calls stands for this many (times the planned
    /// over the actual length of the slot).
    pub stratum_slots: u32,
}

/// One interval change by the throttle.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct IntervalChange {
    /// Seconds since the recording started.
    pub at_seconds: f64,
    /// The new mean interval in bytes.
    pub interval_bytes: u64,
}

/// Exact counts from the kernel's counters (every call, not sampled).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExactCounts {
    /// Allocation calls.
    pub calls: u64,
    /// Bytes requested.
    pub bytes: u64,
}

/// The processes of one command name, summed: what the summary shows of a recording of
/// many processes (a build, a test suite, a shell loop).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommandGroup {
    /// Command name, as its processes' `command`.
    pub command: String,
    /// How many processes ran it.
    pub processes: u64,
    /// Their samples.
    pub samples: u64,
    /// Their exact counts, summed (0 where none were counted: another producer's).
    pub exact: ExactCounts,
    /// Bytes allocated by all of them: one estimate from their samples together (its
    /// bounds are those of the sum, narrower than the sum of each process's bounds).
    pub alloc_bytes: Estimate,
    /// Bytes live at the end (null when frees were not tracked).
    pub inuse_bytes: Option<Estimate>,
    /// The pids of the largest by estimated allocated bytes, largest first (at most
    /// [`GROUP_LARGEST`]).
    pub largest: Vec<u32>,
}

/// How many processes a [`CommandGroup`] names as its largest.
pub const GROUP_LARGEST: usize = 3;

/// Above this many processes, a recording is shown by command (the summary, `top`, the
/// HTML report) and [`Profile::command_stacks`] are built.
pub const GROUPED_ABOVE: usize = 8;

/// One stack as the processes of one command share it: the same frames (module, file
/// offset, name) in each, their samples taken together. What the summary's tables show of
/// a recording of many processes: a build's `cc1` stack once, ×33, not once per process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommandStackProfile {
    /// Command name, as its processes' `command`.
    pub command: String,
    /// How many of its processes have samples on this stack.
    pub processes: u64,
    /// The one with the most estimated bytes on it.
    pub largest_pid: u32,
    /// Its stack's index in [`Profile::stacks`]: the frames (the same in each process).
    pub stack: usize,
    /// Samples behind the estimates.
    pub samples: u64,
    /// Bytes allocated from it by all of them: one estimate over their samples together.
    pub alloc_bytes: Estimate,
    /// Bytes live at the end, likewise (null when frees were not tracked).
    pub inuse_bytes: Option<Estimate>,
    /// Bytes live when each process's live total was highest: the processes' estimates and
    /// bounds summed (each process's peak is its own moment; null when frees were not
    /// tracked).
    pub peak_bytes: Option<Estimate>,
    /// How long its sampled blocks lived, over their samples together (frees tracked, once
    /// one was freed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetimes: Option<LifetimeValues>,
    /// The processes' samples lost without a stack, not a call stack (see
    /// [`StackProfile::lost`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
}

/// One process's totals.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessProfile {
    /// Process id.
    pub pid: u32,
    /// Command name (`/proc/PID/comm`).
    pub command: String,
    /// Path of the executable (`/proc/PID/exe`).
    pub executable: String,
    /// Its cgroup (v2 path), grouping a container's or a systemd unit's processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The allocators probed in it ("jemalloc (/usr/lib/…/libjemalloc.so.2)"); host-wide
    /// (`--all`), those it mapped when first looked at, probed for every process (`probes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocators: Vec<String>,
    /// What measured it: `in-process` (allocscope's preload library counted every call and
    /// fired `allocscope:alloc` for sampled blocks), `in-process (otel_memory)` or
    /// `in-process (ddheap)` (the program's own allocator sampled itself and fired that
    /// contract's probes, weighing each sample: no exact counts), `go runtime` (a Go
    /// program's own heap sampler: no exact counts; `go runtime + malloc` with a
    /// cgo program's malloc probed too) or `uprobes` (a probe on every call).
    #[serde(default = "uprobes")]
    pub front_end: String,
    /// Exact counters.
    pub exact: ExactCounts,
    /// Where `exact` comes from when it is not allocscope's own counting: a Go program's
    /// runtime (`runtime.memstats, read at its exit`: its `TotalAlloc` and `Mallocs` over the
    /// recording, the objects as `calls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_source: Option<String>,
    /// Samples received.
    pub samples: u64,
    /// Estimated allocated bytes (check against `exact.bytes`).
    pub alloc_bytes: Estimate,
    /// Estimated allocated objects (check against `exact.calls`).
    pub alloc_objects: Estimate,
    /// Estimated bytes live at the end, of those allocated since `coverage.since` (`None`:
    /// frees not tracked).
    pub inuse_bytes: Option<Estimate>,
    /// Estimated blocks live at the end, of those allocated since `coverage.since`.
    pub inuse_objects: Option<Estimate>,
    /// When its estimated live total was highest, and what was live then (frees tracked,
    /// something was live at some point).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak: Option<PeakValues>,
    /// Sampled blocks whose frees could not be tracked (the kernel's live map was full):
    /// the live numbers leave them out.
    #[serde(default)]
    pub untracked_samples: u64,
    /// Samples lost without a stack (the ring buffer was full): the process's totals include
    /// them (its `lost` stack), its other stacks and its live numbers do not, so those may
    /// be low.
    #[serde(default)]
    pub lost_samples: u64,
    /// Resident set size last seen (`/proc/PID/status`), to set the live heap against.
    pub rss_bytes: Option<u64>,
    /// CPU seconds it used while recorded, the probes' cost included (`/proc/PID/stat`,
    /// read every 250 ms: up to that much short for a process that exited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// Duty cycling (`--max-overhead`): the share of its own work (its CPU time less the
    /// probes' cost) done while the probes were attached (its `exact` counts cover that
    /// work only; its estimates the whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_share: Option<f64>,
    /// From when its allocations were observed, and what may have been missed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Coverage>,
    /// Why its estimates are known to miss part of what it allocated (empty: nothing known
    /// is missing), e.g. a small-object allocator linked into the executable, whose calls
    /// inside it bypass the probed entry points.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incomplete: Vec<String>,
    /// Growth of its in-use bytes (frees tracked, not duty-cycled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<GrowthValues>,
    /// How long its sampled blocks lived (frees tracked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetimes: Option<LifetimeValues>,
    /// Its in-use bytes and allocation rate over time (not duty-cycled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<SeriesValues>,
}

/// A process's peak: the moment its estimated live bytes were highest (of blocks allocated
/// since `coverage.since`; each stack's share is its `peak_bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeakValues {
    /// Seconds since the recording's start (`None`: not kept (duty-cycled), or before it: a
    /// command's samples taken while its probes loaded).
    pub at_seconds: Option<f64>,
    /// Bytes live then, with bounds.
    pub inuse_bytes: Estimate,
    /// Blocks live then.
    pub inuse_objects: Estimate,
    /// How many times it filled its heap (bytes allocated / bytes at the peak, at least 1):
    /// the moment is the highest of that many noisy levels, so the lower bounds at the
    /// peak (this and every stack's `peak_bytes`) are taken at confidence
    /// `1 − (1 − confidence)/fillings`.
    #[serde(default = "one")]
    pub fillings: f64,
}

fn one() -> f64 {
    1.0
}

/// One call stack's estimates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StackProfile {
    /// Process id.
    pub pid: u32,
    /// Frames, leaf (the allocator's caller) first.
    pub frames: Vec<FrameInfo>,
    /// Samples behind the estimates.
    pub samples: u64,
    /// Bytes allocated from this stack.
    pub alloc_bytes: Estimate,
    /// Objects allocated from this stack.
    pub alloc_objects: Estimate,
    /// The alternative (trials) estimate of `alloc_bytes`: `Σ q_i/p_i + Σ u_i`.
    pub alloc_bytes_by_trials: f64,
    /// jemalloc #1751 posterior parameters of `alloc_bytes`, for your own inference.
    pub alloc_posterior: Posterior,
    /// Bytes allocated here and still live at the end (`None`: frees not tracked).
    pub inuse_bytes: Option<Estimate>,
    /// Objects allocated here and still live at the end (`None`: frees not tracked).
    pub inuse_objects: Option<Estimate>,
    /// Bytes allocated here and live when its process's live total was highest (`None`:
    /// frees not tracked, or a file written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<Estimate>,
    /// Objects allocated here and live then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_objects: Option<Estimate>,
    /// Live blocks older than the leak threshold (`--leaks-older-than` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leak: Option<LeakValues>,
    /// Values over the snapshot's period (`--every` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<PeriodValues>,
    /// This is not a call stack but the process's samples lost without one (the ring
    /// buffer was full): counted here so the process's totals and bounds stay whole.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
    /// This leaf frame also stands for longer stacks cut to it: the recording had more
    /// distinct stacks than `--max-stacks`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut_to_leaf: bool,
    /// How the stack was unwound: `dwarf` (CFI, from a copy of the stack) or
    /// `frame_pointers` (`None` for the lost-samples pseudo-stack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unwound: Option<Unwinding>,
    /// Where the walk ended: `root` (the stack is whole), `unknown` (the kernel's
    /// frame-pointer walk cannot tell), or why it was cut: `window`,
    /// `not_a_return_address`, `unmapped`, `unwind_failed`, `depth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<StackEnd>,
    /// Growth of its in-use bytes (frees tracked, not duty-cycled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<GrowthValues>,
    /// How long its sampled blocks lived (frees tracked, once one was freed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetimes: Option<LifetimeValues>,
    /// What it allocated per power-of-two size class, smallest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sizes: Vec<SizeClassValues>,
    /// What it allocated per thread, largest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<ThreadValues>,
    /// Its in-use bytes and allocation rate over time (the stacks with the most bytes
    /// allocated or in use, and every growing one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<SeriesValues>,
}

/// One process's stacks summed at their site.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiteProfile {
    /// Process id.
    pub pid: u32,
    /// The frames of its largest stack (by samples) from the site outward: the site first,
    /// then its callers.
    pub frames: Vec<FrameInfo>,
    /// The allocating frame of that stack, when it is not the site (`[via …]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<FrameInfo>,
    /// How many stacks it sums.
    pub stacks: u64,
    /// Their samples.
    pub samples: u64,
    /// Bytes allocated there.
    pub alloc_bytes: Estimate,
    /// Bytes allocated there and live at the end (`None`: frees not tracked).
    pub inuse_bytes: Option<Estimate>,
    /// Bytes allocated there and live at its process's peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<Estimate>,
    /// Growth of its in-use bytes (frees tracked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<GrowthValues>,
}

/// Growth of in-use bytes: the least-squares slope of the in-use bytes over the
/// recording's ticks, estimated from the sampled blocks' lifetimes (docs/design.md §10).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GrowthValues {
    /// Bytes per second (negative: shrinking), with bounds.
    pub bytes_per_second: Estimate,
    /// The lower bound is above zero.
    pub growing: bool,
    /// Seconds between the ticks it was measured on.
    pub tick_seconds: f64,
}

/// How long sampled blocks lived (docs/design.md §10).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LifetimeValues {
    /// Sampled blocks whose frees were seen.
    pub freed_samples: u64,
    /// Bytes freed within 1 ms of their allocation ("temporary"), with bounds.
    pub temporary_bytes: Estimate,
    /// Shares (0–1) of the bytes allocated: freed within 1 ms, within 1 s (not 1 ms),
    /// later, and still in use at the end; bounds conservative (Bonferroni).
    pub freed_within_1ms: Estimate,
    /// See `freed_within_1ms`.
    pub freed_within_1s: Estimate,
    /// See `freed_within_1ms`.
    pub freed_later: Estimate,
    /// See `freed_within_1ms`.
    pub still_in_use: Estimate,
    /// Quantiles of the freed bytes' lifetimes in seconds (to within a factor of two).
    pub p50_seconds: Option<f64>,
    /// See `p50_seconds`.
    pub p90_seconds: Option<f64>,
    /// See `p50_seconds`.
    pub p99_seconds: Option<f64>,
}

/// What a stack allocated in one power-of-two size class.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SizeClassValues {
    /// Smallest size in the class, bytes.
    pub from_bytes: u64,
    /// Largest size in the class, bytes (a power of two).
    pub to_bytes: u64,
    /// Bytes allocated in it.
    pub alloc_bytes: Estimate,
    /// Objects allocated in it.
    pub alloc_objects: Estimate,
}

/// What one thread allocated from a stack.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadValues {
    /// Thread id (`None`: the threads beyond the 16 kept apart, together).
    pub tid: Option<u32>,
    /// Its name (`comm`) at its latest sample (empty: unknown, or several threads).
    pub name: String,
    /// Bytes it allocated here.
    pub alloc_bytes: Estimate,
    /// Objects it allocated here.
    pub alloc_objects: Estimate,
}

/// A stack's leak candidates: sampled blocks still live and older than the threshold.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeakValues {
    /// The threshold.
    pub older_than_seconds: f64,
    /// Bytes in such blocks.
    pub inuse_bytes: Estimate,
    /// Such blocks.
    pub inuse_objects: Estimate,
    /// Age of the oldest sampled one.
    pub oldest_seconds: f64,
}

/// A stack's values over one snapshot period.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeriodValues {
    /// Length of the period.
    pub seconds: f64,
    /// Bytes allocated in the period.
    pub alloc_bytes: Estimate,
    /// Objects allocated in the period.
    pub alloc_objects: Estimate,
}

/// A mapped file that frames point into.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Module {
    /// Path as the process mapped it (the `module` of frames).
    pub path: String,
    /// GNU build id in hex, when the file has one.
    pub build_id: Option<String>,
}

/// A finished recording: the model all exporters and the summary read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// [`SCHEMA`].
    pub schema: String,
    /// Sampling parameters.
    pub sampling: Sampling,
    /// Seconds recorded.
    pub duration_seconds: f64,
    /// An agent's period: its counts are of those seconds alone, whatever its processes'
    /// coverage says (a window, compared per second).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub period: bool,
    /// A command allocscope started, recorded until it ended on its own: its counts are
    /// one run's (not a window cut by `--duration` or Ctrl-C).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole_run: bool,
    /// Whether frees were left untracked (then `inuse_*` are null).
    pub alloc_only: bool,
    /// The leak threshold, when leak candidates were asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaks_older_than_seconds: Option<f64>,
    /// Per process totals.
    pub processes: Vec<ProcessProfile>,
    /// The processes grouped by command name, largest estimated bytes first (absent in
    /// files written before it existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<CommandGroup>,
    /// Above [`GROUPED_ABOVE`] processes (not duty-cycled): the stacks of each command's
    /// processes taken together, largest estimated bytes first (absent otherwise, and in
    /// files written before it existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command_stacks: Vec<CommandStackProfile>,
    /// Events the kernel side could not deliver or count.
    pub losses: Losses,
    /// Every module (executable or library) a frame points into, with its build id.
    pub modules: Vec<Module>,
    /// Per stack estimates, largest estimated bytes first.
    pub stacks: Vec<StackProfile>,
    /// The stacks summed per process at their site (the first frame past the allocator
    /// and its wrappers, docs/manual.md, Sites), largest estimated bytes first; empty when
    /// duty-cycled, or in files written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<SiteProfile>,
    /// Every probe point attached: which function of which file, in which process (pid 0:
    /// every process, `--all`), and on which instruction.
    #[serde(default)]
    pub probes: Vec<ProbePoint>,
    /// Per-thread sampling states the kernel held when the counters were last read: about
    /// the number of live threads of the targets (exited threads' states are dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_states: Option<u64>,
    /// What the recording cost its targets, measured (see docs/json-schema.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<Overhead>,
}

/// See [`Profile::opens_on`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opening {
    /// Live bytes at each process's peak.
    Peak,
    /// Live bytes at the end.
    Live,
    /// Bytes allocated.
    Allocated,
}

/// One probe point, as attached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbePoint {
    /// Process (0: every process mapping the file).
    pub pid: u32,
    /// The file, as the process maps it.
    pub file: String,
    /// The function and how it is probed (`malloc (session)`, `free`).
    pub function: String,
    /// File offset of the probed instruction.
    pub offset: u64,
    /// That instruction, and whether the kernel emulates it (else it is single-stepped).
    pub instruction: String,
    /// Whether the kernel emulates the instruction (the cheap case).
    pub emulated: bool,
}

impl Profile {
    /// Whether every process was followed from its beginning (see
    /// [`ProcessProfile::seen_from_its_start`]).
    pub fn all_seen_from_their_start(&self) -> bool {
        !self.processes.is_empty()
            && self
                .processes
                .iter()
                .all(ProcessProfile::seen_from_its_start)
    }

    /// What a profile read from a file must hold for its rates, bounds and differences to
    /// mean anything: a positive, finite duration, a confidence level strictly between 0
    /// and 1, and an interval of at least one byte. The reason when it does not.
    pub fn check(&self) -> Result<(), String> {
        let duration = self.duration_seconds;
        if !(duration.is_finite() && duration > 0.0) {
            return Err(format!(
                "duration_seconds is {duration}: it must be a positive number of seconds"
            ));
        }
        let confidence = self.sampling.confidence;
        if !(confidence > 0.0 && confidence < 1.0) {
            return Err(format!(
                "sampling.confidence is {confidence}: it must lie strictly between 0 and 1"
            ));
        }
        if self.sampling.mean_interval_bytes == 0 {
            return Err("sampling.mean_interval_bytes is 0: it must be at least 1".into());
        }
        Ok(())
    }

    /// What a view of this profile opens on, as heaptrack and memray open: where frees were
    /// tracked, a recording of a command allocscope started opens on its live bytes at
    /// the peak (a command that frees what it held before it exits has nothing live at
    /// its end), one of running processes on their live bytes now; a view with nothing in
    /// it gives way to the next (peak, then allocated bytes).
    pub fn opens_on(&self) -> Opening {
        if self.alloc_only {
            return Opening::Allocated;
        }
        let has = |of: fn(&StackProfile) -> Option<Estimate>| {
            self.stacks
                .iter()
                .any(|s| of(s).is_some_and(|e| e.estimate > 0.0))
        };
        let started = self.processes.iter().any(|p| {
            p.coverage
                .as_ref()
                .is_some_and(|c| c.since == CoverageStart::Start)
        });
        let (peak, live) = (has(|s| s.peak_bytes), has(|s| s.inuse_bytes));
        match (started, peak, live) {
            (true, true, _) | (false, true, false) => Opening::Peak,
            (_, _, true) => Opening::Live,
            _ => Opening::Allocated,
        }
    }

    /// Each process's command and cgroup by pid: what exports label a stack with.
    pub fn process_labels(&self) -> HashMap<u32, (&str, Option<&str>)> {
        self.processes
            .iter()
            .map(|p| (p.pid, (p.command.as_str(), p.cgroup.as_deref())))
            .collect()
    }
}

/// The front end without the in-process library (what older profiles had).
pub fn uprobes() -> String {
    "uprobes".into()
}
