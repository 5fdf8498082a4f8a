//! What a tally hands out: every stack's raw sample sets at one moment, frames resolved,
//! and each process's side, for the profile's build and for views that group stacks
//! themselves (`top`). Types only; [`super::Aggregator::tally`] fills them.

use std::collections::HashMap;

use super::{breakdown::Breakdown, timeline::Timeline};
use crate::{
    duty::sums::DutyPair,
    stacks::{symbolize::FrameInfo, StackOrigin},
    stats::{growth::GrowthSums, SampleSet},
};

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
    /// Samples whose blocks were live when its process's live total was highest (see
    /// [`crate::stats::peak`]).
    pub at_peak: SampleSet,
    /// Live samples older than the leak age.
    pub leaked: SampleSet,
    /// Age in seconds of the oldest of them (`None`: none).
    pub oldest_leaked_seconds: Option<f64>,
    /// Samples since the last [`super::Aggregator::start_period`].
    pub period: SampleSet,
    /// Samples in the recent window (estimate with `Window::SLIDING`, divide by
    /// [`Tally::recent_seconds`]).
    pub recent: SampleSet,
    /// The pseudo-stack of the process's samples lost without a stack (one [`super::LOST_FRAME`]).
    pub lost: bool,
    /// Holds stacks cut to this leaf frame (beyond `--max-stacks`).
    pub cut_to_leaf: bool,
    /// How the stack was unwound and where it ended (`None`: not a stack).
    pub origin: Option<StackOrigin>,
    /// Duty cycling: its totals over time-sampled strata (`None`: always on, or the lost
    /// samples' pseudo-stack).
    pub duty: Option<DutyPair>,
    /// Its index in [`Tally::timeline`] (`None`: the lost samples' pseudo-stack).
    pub id: Option<usize>,
    /// Sizes, threads and lifetimes of its samples (empty while duty-cycled).
    pub breakdown: Breakdown,
    /// The growth sums of its sampled blocks, freed and still live, up to the tally's
    /// tick (see [`crate::stats::growth`]).
    pub growth: GrowthSums,
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
    /// Its anonymous memory when first read (at its start, its fork or exec, or when the
    /// recording found it) and the most read since, in bytes.
    pub anon_first_and_peak: Option<(u64, u64)>,
    /// CPU seconds it used from when it was first to when it was last seen (every 250 ms
    /// while it runs), probes included.
    pub cpu_seconds: Option<f64>,
    /// Sampled blocks whose frees could not be tracked.
    pub untracked_samples: u64,
    /// Samples lost without a stack (the ring buffer was full).
    pub lost_samples: u64,
    /// Hits of another sampler's probes (a Go runtime's): its samples and their frees
    /// seen, what the cost is charged for ([`crate::cost::TargetUse::runtime_hits`]).
    pub runtime_hits: u64,
    /// Its cgroup (v2 path): a container, a systemd unit.
    pub cgroup: Option<String>,
    /// Its allocators as probed ("jemalloc (/usr/lib/…)"); host-wide (`--all`), those it
    /// mapped when it was first looked at.
    pub allocators: Vec<String>,
    /// Duty cycling: its bytes and calls over time-sampled strata, from the exact counters.
    pub duty: Option<DutyPair>,
    /// A Go process's own exact totals over the recording (its runtime's TotalAlloc and
    /// Mallocs), and where they come from.
    pub go_totals: Option<(crate::schema::ExactCounts, String)>,
    /// Why the in-process sampler was not loaded into it (`-p`).
    pub not_loaded: Option<String>,
    /// What its counts leave out, beyond what its allocators say.
    pub incomplete: Vec<String>,
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
    /// Every stack's series over time, and the grid of ticks growth is measured on
    /// (`None`: not kept).
    pub timeline: Option<Timeline>,
    /// Ticks of that grid so far.
    pub ticks: u64,
    /// (pid, tid) → the thread's name (raw, as the kernel gave it: sanitize to show).
    pub thread_names: HashMap<(u32, u32), String>,
    /// Per process whose blocks were ever live: when its live total was highest, seconds
    /// since the recording's start (`None`: the start is not kept, duty-cycled, or the peak
    /// came before it: a command's samples taken while its probes loaded).
    pub peak_seconds: HashMap<u32, Option<f64>>,
    /// One period of a long recording alone ([`super::period`]): no peaks, which
    /// describe the whole recording.
    pub period_only: bool,
}
