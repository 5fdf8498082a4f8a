//! The processes of one command, summed: how a recording of many processes is shown.
//!
//! Why: a build, a test suite or a shell loop is thousands of short processes, and a
//! summary that prints each (469 lines for 150 of them) hides what matters: which program
//! allocated most, and where. A group's estimate comes from its processes' samples taken
//! together (a [`SampleSet`] merge, as a process's comes from its stacks'), so its bounds
//! are those of the sum: a hundred processes with no sample each are not "< 1.8 MiB" a
//! hundred times over, and the group's bounds are narrower than the sum of theirs.

use std::collections::BTreeMap;

use crate::schema::{CommandGroup, ExactCounts, ProcessProfile, GROUP_LARGEST};
use crate::stats::{estimate::Estimates, SampleSet};

/// One process's sample sets: all its samples, and those still live.
pub(super) struct ProcessSets<'a> {
    pub all: &'a SampleSet,
    pub live: &'a SampleSet,
}

/// The groups of `processes` by command name, largest estimated bytes first (then bytes
/// counted); `sets` has each process's sample sets by pid, `estimate` turns a set into
/// estimates, `tracking` whether frees were tracked. Where a process's estimate did not
/// come from its samples (duty cycling: from its exact counters' strata), its group sums
/// the processes' estimates and bounds instead (wider than the sum's own bounds).
pub(super) fn by_command(
    processes: &[ProcessProfile],
    sets: &BTreeMap<u32, ProcessSets<'_>>,
    estimate: impl Fn(&SampleSet) -> Estimates,
    tracking: bool,
) -> Vec<CommandGroup> {
    let mut members: BTreeMap<&str, Vec<&ProcessProfile>> = BTreeMap::new();
    for process in processes {
        members.entry(&process.command).or_default().push(process);
    }
    let mut groups: Vec<CommandGroup> = members
        .into_iter()
        .map(|(command, mut of)| {
            of.sort_by(|a, b| b.alloc_bytes.estimate.total_cmp(&a.alloc_bytes.estimate));
            let (mut all, mut live) = (SampleSet::default(), SampleSet::default());
            for process in &of {
                if let Some(set) = sets.get(&process.pid) {
                    all.merge(set.all);
                    live.merge(set.live);
                }
            }
            let duty_cycled = of.iter().any(|p| p.observed_share.is_some());
            let (alloc_bytes, inuse_bytes) = if duty_cycled {
                (
                    summed(of.iter().map(|p| &p.alloc_bytes)),
                    tracking.then(|| summed(of.iter().filter_map(|p| p.inuse_bytes.as_ref()))),
                )
            } else {
                (
                    estimate(&all).bytes,
                    tracking.then(|| estimate(&live).bytes),
                )
            };
            CommandGroup {
                command: command.to_owned(),
                processes: of.len() as u64,
                samples: of.iter().map(|p| p.samples).sum(),
                exact: ExactCounts {
                    calls: of.iter().map(|p| p.exact.calls).sum(),
                    bytes: of.iter().map(|p| p.exact.bytes).sum(),
                },
                alloc_bytes,
                inuse_bytes,
                largest: of.iter().take(GROUP_LARGEST).map(|p| p.pid).collect(),
            }
        })
        .collect();
    // Without samples, by the bytes counted.
    groups.sort_by(|a, b| {
        (b.alloc_bytes.estimate.total_cmp(&a.alloc_bytes.estimate))
            .then(b.exact.bytes.cmp(&a.exact.bytes))
    });
    groups
}

/// The sum of `estimates`, their bounds summed.
pub(super) fn summed<'a>(
    estimates: impl Iterator<Item = &'a crate::stats::Estimate>,
) -> crate::stats::Estimate {
    let mut sum = crate::stats::Estimate {
        samples: 0,
        estimate: 0.0,
        lower: 0.0,
        upper: 0.0,
    };
    for e in estimates {
        sum.samples += e.samples;
        sum.estimate += e.estimate;
        sum.lower += e.lower;
        sum.upper += e.upper;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{estimate::Window, SampleObs};

    fn set(samples: u64) -> SampleSet {
        let mut set = SampleSet::default();
        for _ in 0..samples {
            set.add(SampleObs {
                size: 64,
                offset: 0,
                interval: 4096,
                weight: None,
            });
        }
        set
    }

    fn process(pid: u32, command: &str, set: &SampleSet, calls: u64) -> ProcessProfile {
        let mut p = allocscope_model::fixtures::synthetic().processes.remove(0);
        let e = set.estimate(0.95, Window::RECORDING, 4096);
        p.pid = pid;
        p.command = command.to_owned();
        p.samples = set.samples();
        p.alloc_bytes = e.bytes;
        p.exact = ExactCounts {
            calls,
            bytes: calls * 64,
        };
        p.observed_share = None;
        p
    }

    #[test]
    fn a_group_is_estimated_from_its_processes_samples_together() {
        let sets: Vec<SampleSet> = [3, 5, 0, 40].into_iter().map(set).collect();
        let processes = vec![
            process(1, "cc", &sets[0], 10),
            process(2, "cc", &sets[1], 20),
            process(3, "cc", &sets[2], 1),
            process(4, "ld", &sets[3], 400),
        ];
        let by_pid: BTreeMap<u32, ProcessSets> = (1..=4)
            .map(|pid| {
                let s = &sets[pid as usize - 1];
                (pid, ProcessSets { all: s, live: s })
            })
            .collect();
        let estimate = |s: &SampleSet| s.estimate(0.95, Window::RECORDING, 4096);
        let groups = by_command(&processes, &by_pid, estimate, false);
        assert_eq!(
            groups
                .iter()
                .map(|g| g.command.as_str())
                .collect::<Vec<_>>(),
            ["ld", "cc"]
        );
        let cc = &groups[1];
        assert_eq!((cc.processes, cc.samples, cc.exact.calls), (3, 8, 31));
        assert_eq!(cc.largest, [2, 1, 3]);
        assert!(cc.inuse_bytes.is_none());
        // Its estimate is the sum's: the processes' estimates add up, the bounds are
        // narrower than the sum of theirs (three processes, one with no sample).
        let sum = |f: fn(&ProcessProfile) -> f64| processes[..3].iter().map(f).sum::<f64>();
        assert!((cc.alloc_bytes.estimate - sum(|p| p.alloc_bytes.estimate)).abs() < 1e-6);
        assert!(cc.alloc_bytes.upper < sum(|p| p.alloc_bytes.upper));
        assert!(cc.alloc_bytes.lower > sum(|p| p.alloc_bytes.lower));
    }

    #[test]
    fn duty_cycled_processes_are_summed_with_their_bounds() {
        let one = set(4);
        let mut processes = vec![process(1, "x", &one, 1), process(2, "x", &one, 1)];
        processes[0].observed_share = Some(0.5);
        let groups = by_command(
            &processes,
            &BTreeMap::new(),
            |s| s.estimate(0.95, Window::RECORDING, 4096),
            false,
        );
        let e = &processes[0].alloc_bytes;
        assert_eq!(groups[0].alloc_bytes.upper, 2.0 * e.upper);
        assert_eq!(groups[0].alloc_bytes.lower, 2.0 * e.lower);
    }
}
