//! The validated settings a recording runs with: what to profile (`Targets`) and how to
//! sample (`SamplingConfig`). The command line (sampler-user's `config`) parses flags into
//! them, checking each once; the engine takes them as they are.

use std::{ffi::OsString, path::PathBuf, time::Duration};

use crate::profile::Settings;

/// An error in the user's input, reported before anything is attached (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// What to profile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Targets {
    /// Running processes (`-p`).
    pub pids: Vec<u32>,
    /// Processes by name, now and later (`--comm`).
    pub comm: Option<Pattern>,
    /// Every process (`--all`).
    pub all: bool,
    /// A command to start (`-- CMD`); empty if none.
    pub command: Vec<OsString>,
    /// Follow the targets' new processes (`--follow`).
    pub follow: bool,
    /// Follow the command's new processes where that costs no other process anything (its
    /// tree carries the in-process front end): the default for `-- CMD`, `--no-follow`
    /// turns it off.
    pub children: bool,
    /// Only processes in a cgroup matching this (`--cgroup`, with `--all`, `--comm`).
    pub cgroup: Option<Pattern>,
    /// Processes never profiled, by name.
    pub exclude_comm: Option<Pattern>,
    /// Processes never profiled, by pid.
    pub exclude_pids: Vec<u32>,
}

impl Targets {
    /// Whether new processes can become targets while recording (so a recording does not
    /// end when the current ones exit).
    pub fn waits_for_new(&self) -> bool {
        self.all || self.comm.is_some()
    }

    /// Whether `pid` named `comm` must be left alone (its cgroup is read when `--cgroup`
    /// selects: a process whose cgroup cannot be read is left alone then).
    pub fn excludes(&self, pid: u32, comm: &str) -> bool {
        pid == std::process::id()
            || self.exclude_pids.contains(&pid)
            || self
                .exclude_comm
                .as_ref()
                .is_some_and(|p| p.0.is_match(comm))
            || self.cgroup.as_ref().is_some_and(|p| {
                !crate::sys::process::cgroup_of(pid).is_some_and(|cgroup| p.0.is_match(&cgroup))
            })
    }
}

/// A regular expression over process names, compared by its text.
#[derive(Clone, Debug)]
pub struct Pattern(pub regex::Regex);

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for Pattern {}

impl Pattern {
    /// The pattern `text` given to `flag`, or an error naming the flag.
    pub fn parse(flag: &str, text: &str) -> Result<Pattern, BadInput> {
        regex::Regex::new(text)
            .map(Pattern)
            .map_err(|e| BadInput(format!("invalid {flag} {text:?}: {e}")))
    }
}

/// How sampled stacks are unwound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unwind {
    /// The kernel walks frame pointers.
    FramePointers,
    /// The kernel copies this many bytes of user stack; user space unwinds them with CFI.
    Cfi {
        /// Bytes copied per sample.
        stack_bytes: u32,
    },
}

/// Which frames of a CPython target a stack shows (`--python-frames`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PythonFrames {
    /// Python frames where a target is or may be CPython, else native frames only.
    Auto,
    /// Python frames merged, the interpreter's call machinery left out.
    Merged,
    /// Python frames merged, every native frame kept.
    MergedAll,
    /// Native frames only.
    Off,
}

impl Unwind {
    /// Bytes of stack the kernel copies per sample (0: none, frame pointers walked).
    pub fn stack_bytes(self) -> u32 {
        match self {
            Unwind::FramePointers => 0,
            Unwind::Cfi { stack_bytes } => stack_bytes,
        }
    }
}

/// Whether to load allocscope's in-process sampler into a running process (`--front-end`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadIntoRunning {
    /// Never: uprobes.
    Never,
    /// Where it can be; uprobes elsewhere, said.
    WherePossible,
    /// Always: a process it cannot be loaded into is an error.
    Always,
}

/// How to sample, validated (shared by `record` and `top`).
#[derive(Clone, Debug)]
pub struct SamplingConfig {
    /// Mean sampling interval in bytes.
    pub interval: u64,
    /// No free tracking.
    pub alloc_only: bool,
    /// Capacity of the kernel's live map.
    pub max_tracked: u32,
    /// Bytes of the kernel's sample ring buffer (a power of two).
    pub ring_buffer: u32,
    /// Most distinct whole stacks kept.
    pub max_stacks: usize,
    /// How stacks are unwound.
    pub unwind: Unwind,
    /// Directories of separate debug files searched first.
    pub debug_dirs: Vec<PathBuf>,
    /// Python frames (`--python-frames`).
    pub python_frames: PythonFrames,
    /// Use uprobe sessions where the kernel has them.
    pub sessions: bool,
    /// Probe USDT sites at the 5-byte nop the kernel optimises (benchmark only: a forked
    /// child crashes at an optimised site on Linux 6.18).
    pub usdt_nop5: bool,
    /// Load the in-process front end into a command allocscope starts (`-- CMD`, unless
    /// `--no-preload`), except under duty cycling (whose estimates need every call counted by
    /// the probes it detaches).
    pub preload: bool,
    /// Whether to load the in-process front end into running processes (`-p`).
    pub load_into_running: LoadIntoRunning,
    /// Confidence of the bounds.
    pub confidence: f64,
    /// Time between the timeline's ticks (`--tick`).
    pub tick: Duration,
    /// Verbose diagnostics.
    pub verbose: bool,
    /// Samples per second the throttle aims at (0: no throttle).
    pub max_samples_per_sec: u32,
    /// Samples per second below which the throttle lowers the interval, down to
    /// [`crate::throttle::SMALLEST_INTERVAL`] (0: never below `interval`).
    pub min_samples_per_sec: u32,
    /// `--max-overhead` as a fraction (0.02 for 2%): the probes are duty-cycled to keep
    /// their cost under it (`None`: always attached).
    pub max_overhead: Option<f64>,
}

impl SamplingConfig {
    /// The settings a profile records: these, `recorded` long, with leak candidates older
    /// than `leaks_older_than` (ignored without free tracking).
    pub fn settings(&self, recorded: Duration, leaks_older_than: Option<Duration>) -> Settings {
        Settings {
            interval: self.interval,
            largest_interval: self.interval,
            confidence: self.confidence,
            // Never 0 (a profile says it lasted some time: rates divide by it).
            duration_seconds: recorded.as_secs_f64().max(1e-9),
            alloc_only: self.alloc_only,
            leaks_older_than,
        }
    }
}
