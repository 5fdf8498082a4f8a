//! What the probe programs cost, as the kernel measures it: with BPF run-time statistics on
//! (`BPF_ENABLE_STATS`, held for as long as the returned descriptor lives), every program
//! keeps `run_cnt` (times it ran: one per uprobe hit) and `run_time_ns` (time inside it),
//! which `/proc/self/fdinfo/FD` of its descriptor shows. The uprobe trap around each run is
//! not in `run_time_ns`; [`crate::cost::trap`] calibrates it.
//!
//! Statistics are global: while on, every BPF program on the host takes two clock reads per
//! run (measured by `cargo xtask bench`: docs/performance.md, "Figures quoted from the code").

use sampler_common::kernel;
use std::{io, os::fd::OwnedFd};

use serde::{Deserialize, Serialize};

/// Runs of a group of programs and the time spent in them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Runs {
    /// Times the programs ran (uprobe hits).
    pub runs: u64,
    /// Nanoseconds inside the programs.
    pub run_ns: u64,
}

impl Runs {
    /// Counts since `earlier` (a reading of the same programs).
    pub fn since(self, earlier: Runs) -> Runs {
        Runs {
            runs: self.runs.saturating_sub(earlier.runs),
            run_ns: self.run_ns.saturating_sub(earlier.run_ns),
        }
    }

    fn add(&mut self, other: Runs) {
        self.runs += other.runs;
        self.run_ns += other.run_ns;
    }

    fn scaled(self, factor: f64) -> Runs {
        Runs {
            runs: (self.runs as f64 * factor).round() as u64,
            run_ns: (self.run_ns as f64 * factor).round() as u64,
        }
    }
}

/// The sampler's programs' runs, by what the probe is on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramRuns {
    /// Entries of allocation functions (with sessions, also the returns they asked for).
    pub allocations: Runs,
    /// Classic return probes of allocation functions.
    pub returns: Runs,
    /// Entries of `free`.
    pub frees: Runs,
    /// Another sampler's probes (`otel_memory`, `ddheap`, a Go runtime's): hit per
    /// sampled block and its free, not per call, so kept out of [`Self::total`] (their
    /// hits are counted from the samples themselves, see [`crate::cost::measure`]).
    #[serde(default)]
    pub producers: Runs,
}

impl ProgramRuns {
    /// Every run of the probes hit per allocation call (not [`Self::producers`]).
    pub fn total(&self) -> Runs {
        let mut total = self.allocations;
        total.add(self.returns);
        total.add(self.frees);
        total
    }

    /// Counts since `earlier`.
    pub fn since(self, earlier: ProgramRuns) -> ProgramRuns {
        ProgramRuns {
            allocations: self.allocations.since(earlier.allocations),
            returns: self.returns.since(earlier.returns),
            frees: self.frees.since(earlier.frees),
            producers: self.producers.since(earlier.producers),
        }
    }

    /// Adds `other`'s runs, group by group.
    pub fn add_all(&mut self, other: ProgramRuns) {
        self.allocations.add(other.allocations);
        self.returns.add(other.returns);
        self.frees.add(other.frees);
        self.producers.add(other.producers);
    }

    /// Every group's runs and time multiplied by `factor` (rounded).
    pub fn scaled(self, factor: f64) -> ProgramRuns {
        ProgramRuns {
            allocations: self.allocations.scaled(factor),
            returns: self.returns.scaled(factor),
            frees: self.frees.scaled(factor),
            producers: self.producers.scaled(factor),
        }
    }

    /// Adds one program's runs to its group (named as in the eBPF object).
    pub fn add(&mut self, program: &str, runs: Runs) {
        match program {
            kernel::programs::RETURN => self.returns.add(runs),
            kernel::programs::FREE => self.frees.add(runs),
            kernel::programs::PRODUCER => self.producers.add(runs),
            _ => self.allocations.add(runs),
        }
    }
}

/// Turns BPF run-time statistics on until the descriptor is dropped; `None` (with the reason
/// logged) when the kernel refuses.
pub(crate) fn enable() -> Option<OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| log::info!("BPF run-time statistics unavailable: {e}"))
        .ok()
}

/// `run_cnt` and `run_time_ns` of the program behind `fd`, from its fdinfo.
pub(crate) fn of_fd(fd: impl std::os::fd::AsFd) -> io::Result<Runs> {
    let text = crate::sys::own::fdinfo(fd.as_fd())?;
    parse_fdinfo(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "no run_cnt/run_time_ns in the program's fdinfo",
        )
    })
}

/// `run_cnt` and `run_time_ns` of a BPF program's fdinfo text.
pub(crate) fn parse_fdinfo(text: &str) -> Option<Runs> {
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse::<u64>().ok())
    };
    Some(Runs {
        runs: field("run_cnt:")?,
        run_ns: field("run_time_ns:")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_programs_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1066\nprog_type:\t2\n\
                    prog_jited:\t1\nprog_tag:\t3b185187f1855c4c\nmemlock:\t4096\nprog_id:\t52\n\
                    run_time_ns:\t123456\nrun_cnt:\t789\nrecursion_misses:\t0\n\
                    verified_insns:\t12\n";
        assert_eq!(
            parse_fdinfo(text),
            Some(Runs {
                runs: 789,
                run_ns: 123456
            })
        );
        assert_eq!(parse_fdinfo("pos:\t0\n"), None);
    }

    #[test]
    fn groups_by_probe() {
        let mut runs = ProgramRuns::default();
        let one = Runs {
            runs: 2,
            run_ns: 10,
        };
        runs.add("malloc_enter", one);
        runs.add("alloc_session", one);
        runs.add("alloc_return", one);
        runs.add("free_enter", one);
        assert_eq!(
            runs.allocations,
            Runs {
                runs: 4,
                run_ns: 20
            }
        );
        assert_eq!(
            runs.total(),
            Runs {
                runs: 8,
                run_ns: 40
            }
        );
        assert_eq!(runs.since(runs).total(), Runs::default());
    }
}
