//! Measuring what the probes cost without making them cost more: the kernel's BPF run-time
//! statistics add two clock reads to every program run on the host (+75 ns per probe hit
//! here, 10% of the trap), so they are on only in windows. One opens at the start of the
//! recording and every [`PERIOD`] seconds, and stays open until it has seen [`MIN_CALLS`]
//! allocation calls over at least a second (at most [`PERIOD`] seconds). What a window
//! measures per allocation call (probe hits, time in our programs) is applied to every
//! call the exact counters counted. A program's cost per run depends on the kind of call, not on when it
//! happens, so a window is a fair sample unless the mix of calls changes between windows
//! (sampled calls cost more: a burst at a small interval outside every window is missed).

use std::os::fd::OwnedFd;

use super::Recording;
use crate::probe::runs::{self, ProgramRuns, Runs};

/// One statistics window opens every this many seconds (and at the start).
pub const PERIOD: u32 = 10;

/// A window stays open until it has seen this many allocation calls (or for [`PERIOD`]
/// seconds): a slow process costs little per second, and its figure needs calls.
pub const MIN_CALLS: u64 = 1000;

/// The statistics windows so far.
#[derive(Default)]
pub(super) struct CostWindows {
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

impl CostWindows {
    /// Whether any window measured something.
    pub fn measured(&self) -> bool {
        self.calls > 0
    }

    /// The programs' runs over the windows, scaled to `calls` allocation calls.
    pub fn runs_for(&self, calls: u64) -> ProgramRuns {
        if self.calls == 0 {
            return ProgramRuns::default();
        }
        let scale = calls as f64 / self.calls as f64;
        let scaled = |r: Runs| Runs {
            runs: (r.runs as f64 * scale).round() as u64,
            run_ns: (r.run_ns as f64 * scale).round() as u64,
        };
        ProgramRuns {
            allocations: scaled(self.runs.allocations),
            returns: scaled(self.runs.returns),
            frees: scaled(self.runs.frees),
        }
    }

    /// The runs and calls the windows measured.
    pub fn totals(&self) -> (ProgramRuns, u64) {
        (self.runs, self.calls)
    }
}

impl Recording {
    /// Opens a statistics window (if none is open and the kernel allows it).
    pub(super) async fn open_cost_window(&mut self) -> anyhow::Result<()> {
        if self.cost.opened.is_some() || self.cost.refused || self.probes.is_none() {
            return Ok(());
        }
        let Some(fd) = runs::enable() else {
            self.cost.refused = true;
            return Ok(());
        };
        self.cost.stats = Some(fd);
        let calls = self.calls_so_far().await?;
        self.cost.opened = Some((self.runs, calls));
        self.cost.opened_at = Some(std::time::Instant::now());
        Ok(())
    }

    /// Closes the open statistics window, adding what it measured.
    pub(super) async fn close_cost_window(&mut self) -> anyhow::Result<()> {
        if self.cost.opened.is_none() || self.probes.is_none() {
            return Ok(());
        }
        let calls = self.calls_so_far().await?;
        self.cost.stats = None;
        if let Some((runs, calls_then)) = self.cost.opened.take() {
            let measured = self.runs.since(runs);
            self.cost.runs = add(self.cost.runs, measured);
            self.cost.calls += calls.saturating_sub(calls_then);
        }
        if let Some(at) = self.cost.opened_at.take() {
            self.cost.seconds += at.elapsed().as_secs_f64();
        }
        Ok(())
    }

    /// Every second (the first tick comes at once): opens a window at the start and every
    /// [`PERIOD`] seconds; closes one that has seen [`MIN_CALLS`] calls, or is
    /// [`PERIOD`] seconds old.
    pub(super) async fn cost_tick(&mut self) -> anyhow::Result<()> {
        self.cost.ticks += 1;
        let Some((_, calls_then)) = self.cost.opened else {
            if self.cost.ticks % PERIOD == 1 {
                self.open_cost_window().await?;
            }
            return Ok(());
        };
        let open_for = self
            .cost
            .opened_at
            .map_or(0.0, |at| at.elapsed().as_secs_f64());
        let seen = self.calls_so_far().await?.saturating_sub(calls_then);
        if open_for >= f64::from(PERIOD) || (open_for >= 0.9 && seen >= MIN_CALLS) {
            self.close_cost_window().await?;
        }
        Ok(())
    }

    /// The targets' allocation calls so far (exact counters), reading the programs' runs
    /// at the same moment.
    async fn calls_so_far(&mut self) -> anyhow::Result<u64> {
        let (counters, _) = self.counters().await?;
        Ok(counters.values().map(|c| c.calls).sum())
    }
}

fn add(a: ProgramRuns, b: ProgramRuns) -> ProgramRuns {
    let sum = |x: Runs, y: Runs| Runs {
        runs: x.runs + y.runs,
        run_ns: x.run_ns + y.run_ns,
    };
    ProgramRuns {
        allocations: sum(a.allocations, b.allocations),
        returns: sum(a.returns, b.returns),
        frees: sum(a.frees, b.frees),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
