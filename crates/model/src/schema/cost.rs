//! What a recording cost its targets, as exported (the profile's `overhead`). How it is
//! measured is allocscope-target's `cost`.

use serde::{Deserialize, Serialize};

/// Where the trap cost comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrapSource {
    /// Measured at start on a probe of our own, in our own process.
    Calibrated,
    /// The development machine's figure (calibration failed; see the log).
    Modelled,
}

/// The cost of one uprobe trap, without any program's run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trap {
    /// Nanoseconds per hit.
    pub ns: f64,
    /// How it was found.
    pub source: TrapSource,
}

impl Trap {
    /// The trap measured by docs/design.md §5 on the development VM.
    pub const MODELLED: Trap = Trap {
        ns: 700.0,
        source: TrapSource::Modelled,
    };
}

/// One target's share of the cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessOverhead {
    /// Process id.
    pub pid: u32,
    /// Allocation calls per second while recorded.
    pub calls_per_second: f64,
    /// CPU seconds the probes added to it.
    pub added_cpu_seconds: f64,
    /// CPU seconds it used while recorded, the probes' included (`None`: never read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// `added / (cpu - added)`: how much longer it ran on the CPU because of the probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
}

/// What the recording cost (the JSON profile's `overhead`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Overhead {
    /// The trap per probe hit.
    pub trap: Trap,
    /// Probe hits counted by the kernel (every process's, on every probe), and those of
    /// another sampler's probes (a Go runtime's: its samples and their frees seen).
    pub runs: u64,
    /// Mean nanoseconds inside our programs per hit (`None`: statistics unavailable, and
    /// the programs' own time is left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program_ns_per_run: Option<f64>,
    /// Probe hits per allocation call of the targets (frees and returns included; a Go
    /// runtime's own allocations count as calls).
    pub runs_per_call: f64,
    /// Nanoseconds added per allocation call: `runs_per_call × (trap + program)`.
    pub ns_per_call: f64,
    /// CPU seconds the probes cost everyone who hit them.
    pub added_cpu_seconds: f64,
    /// The targets' part of it, each target's share at most the CPU time it used (the
    /// probes' time is part of it).
    pub targets_added_cpu_seconds: f64,
    /// What the model gave for the targets when it exceeded a target's measured CPU time
    /// (the trap and the programs cost more when calibrated than on this run, or the
    /// statistics windows ran slow): `targets_added_cpu_seconds` is capped, this is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets_modelled_cpu_seconds: Option<f64>,
    /// CPU seconds the targets used while recorded (`None`: never read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets_cpu_seconds: Option<f64>,
    /// `added / (cpu - added)` over the targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
    /// Per target.
    pub processes: Vec<ProcessOverhead>,
    /// Seconds the kernel's statistics were on (they cost every program run on the host two
    /// clock reads, so they are on one second in ten; docs/performance.md, "What a
    /// recording cost, measured"): the runs and program time above are
    /// those windows' figures per call, applied to every call.
    #[serde(default)]
    pub statistics_seconds: f64,
}
