//! Cost control: what the probes cost the targets (the trap, calibrated at start; the
//! programs' run times, measured in statistics windows) and the two ways a recording bounds
//! it (the sampling-rate throttle, [`crate::throttle`]; duty cycling,
//! [`super::duty_cycling`]).
//!
//! Why one component: the three read the same once-a-second exact counters and answer the
//! same question (what the recording costs, and what to do about it); the profile's
//! `overhead`, `sampling.throttle` and `sampling.duty` come from here alone.

use crate::{
    cost::{
        self,
        windows::{CostStep, CostWindows},
        Overhead, TargetUse, Trap,
    },
    probe::runs::ProgramRuns,
    profile::{DutyRecord, ThrottleRecord},
};

use crate::duty::DutyCycling;
use crate::throttle::Throttling;

/// The probes' cost and what bounds it.
pub(super) struct CostControl {
    /// The uprobe trap's cost, calibrated at start.
    trap: Trap,
    /// The windows the programs' cost is measured in.
    windows: CostWindows,
    /// The sampling-rate throttle (`None`: `--max-samples-per-sec 0`).
    throttling: Option<Throttling>,
    /// Duty cycling (`None`: no `--max-overhead`, the probes stay attached).
    pub(super) duty: Option<DutyCycling>,
}

impl CostControl {
    pub(super) fn new(
        trap: Trap,
        throttling: Option<Throttling>,
        duty: Option<DutyCycling>,
    ) -> CostControl {
        CostControl {
            trap,
            windows: CostWindows::default(),
            throttling,
            duty,
        }
    }

    /// Whether the probes are duty cycled (`--max-overhead`).
    pub(super) fn duty_cycled(&self) -> bool {
        self.duty.is_some()
    }

    /// The throttle counts from `ns` (when the command was let go), not from its creation.
    pub(super) fn throttle_since(&mut self, ns: u64) {
        if let Some(throttling) = self.throttling.as_mut() {
            throttling.since(ns);
        }
    }

    /// The throttle's answer to the totals so far (see [`Throttling::tick`]): the new mean
    /// sampling interval, if it changes.
    pub(super) fn throttle_tick(
        &mut self,
        now: u64,
        bytes: u64,
        samples: u64,
        lost: u64,
    ) -> Option<u64> {
        self.throttling.as_mut()?.tick(now, bytes, samples, lost)
    }

    /// What the cost of the probes is measured with; `file_wide`: processes that are not
    /// targets hit the probes too.
    fn meter(&self, file_wide: bool) -> Meter {
        Meter {
            trap: self.trap,
            stats: self.windows.measured(),
            file_wide,
        }
    }

    /// The probes' cost per allocation call of the targets, as the statistics windows so
    /// far measured it (the trap alone before the first window closes).
    pub(super) fn ns_per_call(&self, file_wide: bool) -> f64 {
        if !self.windows.measured() {
            return self.trap.ns;
        }
        let (runs, calls) = self.windows.totals();
        let meter = self.meter(file_wide);
        cost::ns_per_call(meter.trap, runs, meter.stats, meter.file_wide, calls)
    }

    /// What the recording cost `targets` (their `calls` in all) over `seconds`.
    pub(super) fn overhead(
        &self,
        file_wide: bool,
        calls: u64,
        seconds: f64,
        targets: &[TargetUse],
    ) -> Overhead {
        let runs = self.windows.runs_for(calls);
        let mut overhead = self.meter(file_wide).measure(runs, seconds, targets);
        overhead.statistics_seconds = self.windows.seconds;
        overhead
    }

    /// The largest sampling interval in force so far (the throttle may have raised it).
    pub(super) fn largest_interval(&self) -> u64 {
        self.throttling.as_ref().map_or(0, |t| t.largest())
    }

    /// What the throttle did, if it changed the interval.
    pub(super) fn throttle_record(&self) -> Option<ThrottleRecord> {
        self.throttling.as_ref().and_then(|t| t.record())
    }

    /// How the probes were duty-cycled until `now_ns`, if they were.
    pub(super) fn duty_record(&self, now_ns: u64) -> Option<DutyRecord> {
        self.duty.as_ref().map(|d| d.record(now_ns))
    }

    /// Once a second: the statistics windows' step, `None` when neither they nor the
    /// throttle need the counters this time.
    pub(super) fn tick(&mut self) -> Option<CostStep> {
        let step = self.windows.tick();
        (step != CostStep::Idle || self.throttling.is_some()).then_some(step)
    }

    /// Opens a statistics window with the programs' `runs` and the targets' `calls` now.
    pub(super) fn open_window(&mut self, runs: impl FnOnce() -> ProgramRuns, calls: u64) {
        self.windows.open(runs, calls);
    }

    /// Whether the open window has seen enough calls to close.
    pub(super) fn window_done(&self, calls: u64) -> bool {
        self.windows.done(calls)
    }

    /// Closes the open window with the programs' `runs` and the targets' `calls` now.
    pub(super) fn close_window(&mut self, runs: ProgramRuns, calls: u64) {
        self.windows.close(runs, calls);
    }
}

/// How a recording's cost is measured (see [`cost::measure`]).
#[derive(Clone, Copy, Debug)]
struct Meter {
    /// The trap per probe hit.
    trap: Trap,
    /// Whether the kernel measures the programs' run times.
    stats: bool,
    /// Whether processes that are not targets hit the probes too.
    file_wide: bool,
}

impl Meter {
    /// The cost of `runs` to `targets` over `seconds` (see [`cost::measure`]).
    fn measure(&self, runs: ProgramRuns, seconds: f64, targets: &[TargetUse]) -> Overhead {
        cost::measure(
            self.trap,
            runs,
            self.stats,
            self.file_wide,
            seconds,
            targets,
        )
    }
}
