//! Measuring what the probes cost without making them cost more: the kernel's BPF run-time
//! statistics add two clock reads to every program run on the host (docs/performance.md,
//! "What a recording cost, measured"), so they are on only in windows. One opens at the
//! start of the recording and every [`PERIOD`] seconds, and stays open until it has seen
//! [`MIN_CALLS`] allocation calls over at least a second (at most [`PERIOD`] seconds). What
//! a window measures per allocation call (probe hits, time in our programs) is applied to
//! every call the exact counters counted. A program's cost per run depends on the kind of
//! call, not on when it happens, so a window is a fair sample unless the mix of calls
//! changes between windows (sampled calls cost more: a burst at a small interval outside
//! every window is missed).

use std::os::fd::OwnedFd;

use crate::probe::runs::{self, ProgramRuns};

/// One statistics window opens every this many seconds (and at the start).
pub(crate) const PERIOD: u32 = 10;

/// A window stays open until it has seen this many allocation calls (or for [`PERIOD`]
/// seconds): a slow process costs little per second, and its figure needs calls.
pub(crate) const MIN_CALLS: u64 = 1000;

/// The statistics windows so far.
#[derive(Default)]
pub struct CostWindows {
    /// Keeps the statistics on while a window is open.
    stats: Option<OwnedFd>,
    /// The open window's start: program runs and the targets' calls.
    opened: Option<(ProgramRuns, u64)>,
    /// Program runs over the closed windows.
    runs: ProgramRuns,
    /// The targets' allocation calls over the closed windows.
    calls: u64,
    /// Seconds of closed windows.
    pub seconds: f64,
    opened_at: Option<std::time::Instant>,
    ticks: u32,
    /// True once the kernel refused statistics (logged once; no window opens again).
    refused: bool,
}

/// What a tick of the once-a-second clock asks of the windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostStep {
    /// Nothing: no window is open, none opens now.
    Idle,
    /// Open a window.
    Open,
    /// A window is open: close it if it is done.
    Check,
}

impl CostWindows {
    /// Whether any window measured something.
    pub fn measured(&self) -> bool {
        self.calls > 0 || self.runs.producers.runs > 0
    }

    /// The programs' runs over the windows, scaled to `calls` allocation calls.
    pub fn runs_for(&self, calls: u64) -> ProgramRuns {
        if self.calls == 0 {
            // Another sampler's probes (a Go runtime's) are charged per hit, counted from
            // the samples: the windows give their time per run only, calls or not.
            return ProgramRuns {
                producers: self.runs.producers,
                ..ProgramRuns::default()
            };
        }
        self.runs.scaled(calls as f64 / self.calls as f64)
    }

    /// The runs and calls the windows measured.
    pub fn totals(&self) -> (ProgramRuns, u64) {
        (self.runs, self.calls)
    }

    /// Counts a tick (the first comes at once): a window opens at the start and every
    /// [`PERIOD`] seconds.
    pub fn tick(&mut self) -> CostStep {
        self.ticks += 1;
        if self.opened.is_some() {
            CostStep::Check
        } else if self.ticks % PERIOD == 1 && !self.refused {
            CostStep::Open
        } else {
            CostStep::Idle
        }
    }

    /// Whether the open window, with `calls` counted so far, is done: it has seen
    /// [`MIN_CALLS`] calls over at least a second, or is [`PERIOD`] seconds old.
    pub fn done(&self, calls: u64) -> bool {
        let (Some((_, calls_then)), Some(at)) = (self.opened, self.opened_at) else {
            return false;
        };
        let open_for = at.elapsed().as_secs_f64();
        let seen = calls.saturating_sub(calls_then);
        open_for >= f64::from(PERIOD) || (open_for >= 0.9 && seen >= MIN_CALLS)
    }
}

impl CostWindows {
    /// Opens a window (unless one is open or the kernel refused statistics): `runs` are the
    /// programs' runs now, `calls` the targets' allocation calls counted so far.
    pub fn open(&mut self, runs: impl FnOnce() -> ProgramRuns, calls: u64) {
        if self.opened.is_some() || self.refused {
            return;
        }
        let Some(fd) = runs::enable() else {
            self.refused = true;
            return;
        };
        self.stats = Some(fd);
        self.opened = Some((runs(), calls));
        self.opened_at = Some(std::time::Instant::now());
    }

    /// Closes the open window, adding what it measured: `runs` are the programs' runs now
    /// (read before the statistics go off: the kernel stops counting then), `calls` the
    /// targets' allocation calls counted so far.
    pub fn close(&mut self, runs: ProgramRuns, calls: u64) {
        let Some((runs_then, calls_then)) = self.opened.take() else {
            return;
        };
        self.stats = None;
        self.runs.add_all(runs.since(runs_then));
        self.calls += calls.saturating_sub(calls_then);
        if let Some(at) = self.opened_at.take() {
            self.seconds += at.elapsed().as_secs_f64();
        }
    }

    /// Whether a window is open.
    #[cfg(test)]
    fn is_open(&self) -> bool {
        self.opened.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::runs::Runs;

    #[test]
    fn windows_scale_to_every_call() {
        let mut windows = CostWindows::default();
        assert!(!windows.measured());
        assert_eq!(windows.runs_for(1000), ProgramRuns::default());
        windows.calls = 100;
        windows.runs = ProgramRuns {
            allocations: Runs {
                runs: 100,
                run_ns: 20_000,
            },
            frees: Runs {
                runs: 90,
                run_ns: 9_000,
            },
            ..ProgramRuns::default()
        };
        let all = windows.runs_for(1000);
        assert_eq!(
            all.allocations,
            Runs {
                runs: 1000,
                run_ns: 200_000
            }
        );
        assert_eq!(
            all.frees,
            Runs {
                runs: 900,
                run_ns: 90_000
            }
        );
        assert_eq!(all.returns, Runs::default());
    }

    #[test]
    fn a_window_adds_what_it_saw_between_open_and_close() {
        let mut windows = CostWindows::default();
        let at = |runs: u64| ProgramRuns {
            allocations: Runs {
                runs,
                run_ns: runs * 200,
            },
            ..ProgramRuns::default()
        };
        // Closing with none open changes nothing.
        windows.close(at(10), 10);
        assert!(!windows.measured());
        windows.open(|| at(100), 1_000);
        if !windows.is_open() {
            // The kernel refused statistics (no root): nothing is measured, nothing opens.
            assert!(windows.refused);
            return;
        }
        windows.open(|| at(999), 5_000);
        windows.close(at(400), 1_300);
        assert_eq!(windows.totals(), (at(300), 300));
        assert!(!windows.is_open() && windows.stats.is_none());
    }
}
