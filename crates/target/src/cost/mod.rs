//! What the recording cost its targets, measured rather than modelled.
//!
//! Every uprobe hit costs the trap into the kernel and back (calibrated at start by
//! [`trap`]; docs/performance.md, "What a recording cost, measured") plus the program's own
//! run, which the kernel measures ([`crate::probe::runs`]). Both are spent in the context
//! of the process that hit the probe, so they are inside the CPU time `/proc/PID/stat`
//! reports for it: the process's own work is its CPU time minus what the probes added, and
//! the share we report is `added / own` — "the program ran 8% longer on the CPU because of us".
//!
//! With file-wide probes (`--all`, `--follow`, `--comm`) processes that are not targets
//! hit them too; the targets' part of the runs is taken in proportion to their allocation
//! calls (the exact counters) among all allocation-probe runs.

pub use crate::schema::{Overhead, ProcessOverhead, Trap, TrapSource};

pub mod trap;
pub mod windows;

use crate::probe::runs::ProgramRuns;

/// One target as the cost computation needs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TargetUse {
    /// Process id.
    pub pid: u32,
    /// Its allocation calls (exact counters).
    pub calls: u64,
    /// Its CPU time while recorded, probes included.
    pub cpu_seconds: Option<f64>,
    /// Hits of another sampler's probes (a Go runtime's): its sampled blocks and their
    /// frees, counted from the samples, each charged the trap and the producer program's
    /// time per run (they come per sample, not per call: see [`ProgramRuns::producers`]).
    pub runtime_hits: u64,
    /// Allocations that sampler counted itself (a Go runtime's objects), 0 if none: the
    /// calls its hits are spread over in the per-call figure.
    pub runtime_calls: u64,
}

/// The cost of `runs` (since attach; `stats` false when the kernel kept no run times) to
/// `targets` over `seconds`; `file_wide` when non-targets hit the probes too.
pub fn measure(
    trap: Trap,
    runs: ProgramRuns,
    stats: bool,
    file_wide: bool,
    seconds: f64,
    targets: &[TargetUse],
) -> Overhead {
    let calls: u64 = targets.iter().map(|t| t.calls).sum();
    let Charge {
        program_ns_per_run,
        added_ns: per_call_added_ns,
        part,
    } = charge(trap, runs, stats, file_wide, calls);
    let counted_ns_per_call = if calls > 0 {
        per_call_added_ns * part / calls as f64
    } else {
        0.0
    };
    let ns_per_runtime_hit = ns_per_runtime_hit(trap, runs, stats, program_ns_per_run);
    let runtime_hits: u64 = targets.iter().map(|t| t.runtime_hits).sum();
    let runtime_added_ns = runtime_hits as f64 * ns_per_runtime_hit;
    let added_ns = per_call_added_ns + runtime_added_ns;
    let targets_added_ns = per_call_added_ns * part + runtime_added_ns;
    let all_calls = calls + targets.iter().map(|t| t.runtime_calls).sum::<u64>();
    let ns_per_call = if all_calls > 0 {
        targets_added_ns / all_calls as f64
    } else {
        0.0
    };
    let (processes, capped) =
        per_process(targets, (counted_ns_per_call, ns_per_runtime_hit), seconds);
    let targets_cpu_seconds = targets
        .iter()
        .any(|t| t.cpu_seconds.is_some())
        .then(|| targets.iter().filter_map(|t| t.cpu_seconds).sum::<f64>());
    let modelled_total = targets_added_ns / 1e9;
    let targets_added = if capped {
        processes.iter().map(|p| p.added_cpu_seconds).sum()
    } else {
        modelled_total
    };
    // Over the processes whose CPU time is known only.
    let known_added: f64 = processes
        .iter()
        .filter(|p| p.cpu_seconds.is_some())
        .map(|p| p.added_cpu_seconds)
        .sum();
    let total = runs.total();
    // Shown: the mean over every run the windows measured, another sampler's among them
    // (the per-call figure above took the per-call programs' alone).
    let measured_runs = total.runs + runs.producers.runs;
    let shown_ns_per_run = (stats && measured_runs > 0)
        .then(|| (total.run_ns + runs.producers.run_ns) as f64 / measured_runs as f64);
    Overhead {
        trap,
        runs: total.runs + runtime_hits,
        program_ns_per_run: shown_ns_per_run,
        runs_per_call: if all_calls > 0 {
            (total.runs as f64 * part + runtime_hits as f64) / all_calls as f64
        } else {
            0.0
        },
        ns_per_call,
        added_cpu_seconds: added_ns / 1e9,
        targets_added_cpu_seconds: targets_added,
        targets_modelled_cpu_seconds: capped.then_some(modelled_total),
        targets_cpu_seconds,
        share: targets_cpu_seconds.and_then(|cpu| share(known_added, cpu)),
        processes,
        statistics_seconds: 0.0,
    }
}

/// Each target's cost: its counted calls at `ns_per_call`, its runtime's probe hits at
/// `ns_per_hit`; and whether a target's was capped at its CPU time.
fn per_process(
    targets: &[TargetUse],
    (ns_per_call, ns_per_hit): (f64, f64),
    seconds: f64,
) -> (Vec<ProcessOverhead>, bool) {
    let mut capped = false;
    let processes = targets
        .iter()
        .map(|t| {
            let modelled =
                (t.calls as f64 * ns_per_call + t.runtime_hits as f64 * ns_per_hit) / 1e9;
            // A process cannot have been added more CPU time than it used (read in clock
            // ticks: a tenth of a second or more).
            let added = match t.cpu_seconds {
                Some(cpu) if modelled > cpu && cpu >= 0.1 => {
                    capped = true;
                    cpu
                }
                _ => modelled,
            };
            ProcessOverhead {
                pid: t.pid,
                calls_per_second: (t.calls + t.runtime_calls) as f64 / seconds.max(1e-9),
                added_cpu_seconds: added,
                cpu_seconds: t.cpu_seconds,
                share: t.cpu_seconds.and_then(|cpu| share(added, cpu)),
            }
        })
        .collect();
    (processes, capped)
}

/// What a hit of another sampler's probes costs (its targets' own, scoped to them or to
/// their files): the trap and the producer program's time per run where the windows
/// measured it, else the other programs' (`program_ns_per_run`), else the trap alone.
fn ns_per_runtime_hit(
    trap: Trap,
    runs: ProgramRuns,
    stats: bool,
    program_ns_per_run: Option<f64>,
) -> f64 {
    let producer_ns = (stats && runs.producers.runs > 0)
        .then(|| runs.producers.run_ns as f64 / runs.producers.runs as f64)
        .or(program_ns_per_run)
        .unwrap_or(0.0);
    trap.ns + producer_ns
}

/// Nanoseconds `runs` add per allocation call of targets that made `calls` of them (see
/// [`measure`]).
pub fn ns_per_call(trap: Trap, runs: ProgramRuns, stats: bool, file_wide: bool, calls: u64) -> f64 {
    if calls == 0 {
        return 0.0;
    }
    let charge = charge(trap, runs, stats, file_wide, calls);
    charge.added_ns * charge.part / calls as f64
}

/// What the probe hits cost everyone, and the targets' part of it.
struct Charge {
    program_ns_per_run: Option<f64>,
    added_ns: f64,
    part: f64,
}

fn charge(trap: Trap, runs: ProgramRuns, stats: bool, file_wide: bool, calls: u64) -> Charge {
    let total = runs.total();
    let program_ns_per_run =
        (stats && total.runs > 0).then(|| total.run_ns as f64 / total.runs as f64);
    let per_run = trap.ns + program_ns_per_run.unwrap_or(0.0);
    // The targets' part: all of it with per-process probes; with file-wide ones, their
    // calls among every allocation-probe hit.
    let part = if !file_wide {
        1.0
    } else if runs.allocations.runs == 0 {
        0.0
    } else {
        (calls as f64 / runs.allocations.runs as f64).min(1.0)
    };
    Charge {
        program_ns_per_run,
        added_ns: total.runs as f64 * per_run,
        part,
    }
}

/// `added / (cpu - added)`; `None` when the CPU time read is not above what was added
/// (too short to tell: `/proc` counts in 10 ms ticks).
pub fn share(added: f64, cpu: f64) -> Option<f64> {
    let own = cpu - added;
    (own > 0.01).then(|| added / own)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::runs::Runs;

    #[test]
    fn a_model_beyond_the_measured_cpu_is_capped_and_says_so() {
        let trap = Trap {
            ns: 700.0,
            source: TrapSource::Calibrated,
        };
        // 1M calls at 1000 ns each modelled (1 s), against 0.5 s of CPU measured.
        let targets = [TargetUse {
            pid: 1,
            calls: 1_000_000,
            cpu_seconds: Some(0.5),
            runtime_hits: 0,
            runtime_calls: 0,
        }];
        let o = measure(trap, runs(1_000_000, 0, 300), true, false, 1.0, &targets);
        assert!((o.targets_added_cpu_seconds - 0.5).abs() < 1e-9, "{o:?}");
        assert!((o.processes[0].added_cpu_seconds - 0.5).abs() < 1e-9);
        let modelled = o.targets_modelled_cpu_seconds.unwrap();
        assert!((modelled - 1.0).abs() < 1e-9, "{modelled}");
        // Within the measured CPU, or a CPU time too short to hold it to: not capped.
        for cpu in [2.0, 0.05] {
            let targets = [TargetUse {
                cpu_seconds: Some(cpu),
                ..targets[0]
            }];
            let o = measure(trap, runs(1_000_000, 0, 300), true, false, 1.0, &targets);
            assert_eq!(o.targets_modelled_cpu_seconds, None, "{cpu}");
            assert!((o.targets_added_cpu_seconds - 1.0).abs() < 1e-9);
        }
    }

    fn runs(allocations: u64, frees: u64, ns_per_run: u64) -> ProgramRuns {
        ProgramRuns {
            allocations: Runs {
                runs: allocations,
                run_ns: allocations * ns_per_run,
            },
            returns: Runs::default(),
            frees: Runs {
                runs: frees,
                run_ns: frees * ns_per_run,
            },
            producers: Runs::default(),
        }
    }

    const TRAP: Trap = Trap {
        ns: 700.0,
        source: TrapSource::Calibrated,
    };

    #[test]
    fn per_process_probes_charge_every_run_to_the_targets() {
        // 1M allocations and 1M frees at 700 + 100 ns: 1.6 s added to a process that used
        // 3.6 s of CPU, 2 s of it its own: 80% longer.
        let target = TargetUse {
            pid: 7,
            calls: 1_000_000,
            cpu_seconds: Some(3.6),
            runtime_hits: 0,
            runtime_calls: 0,
        };
        let o = measure(
            TRAP,
            runs(1_000_000, 1_000_000, 100),
            true,
            false,
            4.0,
            &[target],
        );
        assert_eq!(o.program_ns_per_run, Some(100.0));
        assert!((o.runs_per_call - 2.0).abs() < 1e-12);
        assert!((o.ns_per_call - 1600.0).abs() < 1e-9);
        assert!((o.added_cpu_seconds - 1.6).abs() < 1e-9);
        assert!((o.share.unwrap() - 0.8).abs() < 1e-9);
        let p = &o.processes[0];
        assert!((p.calls_per_second - 250_000.0).abs() < 1e-6);
        assert!((p.share.unwrap() - 0.8).abs() < 1e-9);
    }

    #[test]
    fn a_runtimes_sampler_is_charged_per_hit_not_per_call() {
        // A Go program: 20,000 samples and 18,000 of their frees seen at 700 + 1,000 ns,
        // 4.5M objects allocated by its runtime, none through malloc; a C program beside
        // it whose 1M calls hit at 700 + 100 ns. The producer program's windows' runs do
        // not dilute the C program's per-call figure.
        let mut measured = runs(1_000_000, 0, 100);
        measured.producers = Runs {
            runs: 10_000,
            run_ns: 10_000 * 1_000,
        };
        let go = TargetUse {
            pid: 1,
            calls: 0,
            cpu_seconds: Some(2.5),
            runtime_hits: 38_000,
            runtime_calls: 4_500_000,
        };
        let c = TargetUse {
            pid: 2,
            calls: 1_000_000,
            cpu_seconds: Some(2.0),
            runtime_hits: 0,
            runtime_calls: 0,
        };
        let o = measure(TRAP, measured, true, false, 2.0, &[go, c]);
        let go_added = 38_000.0 * 1700e-9;
        assert!(
            (o.processes[0].added_cpu_seconds - go_added).abs() < 1e-12,
            "{o:?}"
        );
        assert!(
            (o.processes[1].added_cpu_seconds - 0.8).abs() < 1e-12,
            "{o:?}"
        );
        assert!((o.added_cpu_seconds - (0.8 + go_added)).abs() < 1e-12);
        assert_eq!(o.runs, 1_000_000 + 38_000);
        let share = o.processes[0].share.unwrap();
        assert!((share - go_added / (2.5 - go_added)).abs() < 1e-12);
        assert!((o.processes[0].calls_per_second - 2_250_000.0).abs() < 1e-6);
        // Per call: over both programs' allocations.
        assert!((o.ns_per_call - (0.8 + go_added) * 1e9 / 5_500_000.0).abs() < 1e-9);
    }

    #[test]
    fn file_wide_probes_charge_targets_their_part() {
        // Targets made a quarter of the allocation calls that hit the probes.
        let targets = [
            TargetUse {
                pid: 1,
                calls: 100,
                cpu_seconds: Some(1.0),
                runtime_hits: 0,
                runtime_calls: 0,
            },
            TargetUse {
                pid: 2,
                calls: 150,
                cpu_seconds: None,
                runtime_hits: 0,
                runtime_calls: 0,
            },
        ];
        let o = measure(TRAP, runs(1000, 0, 100), true, true, 1.0, &targets);
        assert!((o.added_cpu_seconds - 800e-9 * 1000.0).abs() < 1e-15);
        assert!((o.targets_added_cpu_seconds - 800e-9 * 250.0).abs() < 1e-15);
        assert!((o.ns_per_call - 800.0).abs() < 1e-9);
        // The total share covers only the process whose CPU time is known.
        let added = 100.0 * 800e-9;
        assert!((o.share.unwrap() - added / (1.0 - added)).abs() < 1e-12);
        assert_eq!(o.processes[1].share, None);
    }

    #[test]
    fn without_statistics_the_trap_alone_counts() {
        let target = TargetUse {
            pid: 1,
            calls: 10,
            cpu_seconds: Some(0.001),
            runtime_hits: 0,
            runtime_calls: 0,
        };
        let o = measure(TRAP, runs(10, 0, 50), false, false, 1.0, &[target]);
        assert_eq!(o.program_ns_per_run, None);
        assert!((o.ns_per_call - 700.0).abs() < 1e-9);
        // 10 ms of CPU is below what /proc can resolve: no share.
        assert_eq!(o.share, None);
    }

    #[test]
    fn nothing_recorded_costs_nothing() {
        let o = measure(TRAP, ProgramRuns::default(), true, true, 0.0, &[]);
        assert_eq!(o.runs, 0);
        assert_eq!(o.ns_per_call, 0.0);
        assert_eq!(o.share, None);
        assert!(o.processes.is_empty());
    }
}
