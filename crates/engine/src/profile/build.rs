//! Building the profile, one way: the recording gathers a [`Snapshot`] (the aggregator's
//! tally, the kernel's counters and losses, the probe points, what the throttle and the
//! duty cycle did, each target's coverage, what it all cost) and [`Snapshot::into_profile`] turns
//! it into estimates with bounds, nothing patched afterwards. Pure: tested without BPF.

use std::collections::{BTreeMap, HashMap};

use sampler_common::ProcessCounters;

use super::{
    breakdown::Breakdown,
    command_stacks,
    insight::{Estimating, TIMELINE_STACKS},
    StackTally, Tally,
};
use crate::schema::{
    Coverage, DutyRecord, LeakValues, Module, PeakValues, PeriodValues, ProbePoint, ProcessProfile,
    Profile, Sampling, SiteProfile, StackProfile, ThrottleRecord, GROUPED_ABOVE, SCHEMA,
};
use crate::{
    collect::Losses,
    cost::{Overhead, TargetUse},
    stats::{estimate::Window, growth::GrowthSums, lifetime::Lifetimes, Estimate, SampleSet},
};

/// Everything a profile is built from, gathered by the recording at one moment.
pub struct Snapshot {
    /// The samples per stack and process, frames resolved.
    pub tally: Tally,
    /// What the recording was asked to do.
    pub settings: Settings,
    /// The kernel's exact counters per target.
    pub counters: BTreeMap<u32, ProcessCounters>,
    /// What the kernel could not deliver or count.
    pub losses: Losses,
    /// Values over the current period too (`--every`), this long.
    pub period_seconds: Option<f64>,
    /// Every probe point attached.
    pub probes: Vec<ProbePoint>,
    /// What the throttle did, if it raised the interval.
    pub throttle: Option<ThrottleRecord>,
    /// What duty cycling did.
    pub duty: Option<DutyRecord>,
    /// Entries of the kernel's per-thread state map at the last counter read.
    pub thread_states: Option<u64>,
    /// How each target is covered.
    pub coverage: HashMap<u32, Coverage>,
    /// What the recording cost its targets.
    pub overhead: Option<Overhead>,
}

/// The targets of `tally` (every process with samples, every one tracked), with their
/// exact calls and CPU time: what the cost is measured over, with another sampler's probe
/// hits (a Go runtime's).
pub fn target_uses(tally: &Tally, counters: &BTreeMap<u32, ProcessCounters>) -> Vec<TargetUse> {
    let mut pids: Vec<u32> = tally.processes.iter().map(|p| p.pid).collect();
    pids.extend(tally.stacks.iter().map(|s| s.pid));
    pids.sort_unstable();
    pids.dedup();
    pids.into_iter()
        .map(|pid| {
            let process = tally.processes.iter().find(|p| p.pid == pid);
            TargetUse {
                pid,
                calls: counters.get(&pid).map_or(0, |c| c.calls),
                cpu_seconds: process.and_then(|p| p.cpu_seconds),
                runtime_hits: process.map_or(0, |p| p.runtime_hits),
                runtime_calls: process
                    .and_then(|p| p.go_totals.as_ref())
                    .map_or(0, |(exact, _)| exact.calls),
            }
        })
        .collect()
}

/// What every stack's and process's estimate needs from the snapshot.
struct Context<'a> {
    settings: &'a Settings,
    tally: &'a Tally,
    leak_age: Option<f64>,
    period_seconds: Option<f64>,
    /// Per process: how many times it filled its heap (see [`crate::stats::peak`]).
    fillings: HashMap<u32, f64>,
}

impl Context<'_> {
    /// Every stack's estimates (with its id), in order, on several threads when there are
    /// many: their bounds' quantiles are most of a profile's cost (docs/performance.md,
    /// "Figures quoted from the code"), paid at the end of every recording.
    fn stacks(&self, tallied: Vec<StackTally>) -> Vec<(Option<usize>, StackProfile)> {
        super::parallel::map(tallied, |s| (s.id, self.stack(s)))
    }

    fn estimating(&self) -> Estimating {
        Estimating {
            confidence: self.settings.confidence,
            largest_interval: self.settings.largest_interval,
        }
    }

    fn estimate(&self, set: &SampleSet) -> crate::stats::estimate::Estimates {
        set.estimate(
            self.settings.confidence,
            Window::RECORDING,
            self.settings.largest_interval,
        )
    }

    /// The estimates of `pid`'s samples live at its peak.
    fn at_peak(&self, set: &SampleSet, pid: u32) -> crate::stats::estimate::Estimates {
        crate::stats::peak::estimate_at_peak(
            set,
            self.settings.confidence,
            self.fillings.get(&pid).copied().unwrap_or(1.0),
            self.settings.largest_interval,
        )
    }

    /// `pid`'s peak (frees tracked, and something of it was live at some moment).
    fn peak(&self, pid: u32, totals: &ProcessTotals) -> Option<PeakValues> {
        let &at_seconds = self.tally.peak_seconds.get(&pid)?;
        let e = self
            .tracking()
            .then(|| self.at_peak(&totals.at_peak, pid))?;
        Some(PeakValues {
            fillings: self.fillings.get(&pid).copied().unwrap_or(1.0),
            at_seconds,
            inuse_bytes: e.bytes,
            inuse_objects: e.objects,
        })
    }

    fn tracking(&self) -> bool {
        !self.settings.alloc_only
    }

    /// Whether peaks are estimated: frees tracked over the whole recording.
    fn peaks(&self) -> bool {
        self.tracking() && !self.tally.period_only
    }

    /// One stack's estimates: since the start; over the period when asked; leak values
    /// when it has leaked samples and leaks are asked for (frees tracked).
    fn stack(&self, stack: StackTally) -> StackProfile {
        let settings = self.settings;
        let mut alloc = self.estimate(&stack.all);
        if let Some(pair) = &stack.duty {
            let ns = self.tally.duty_ns_per_call;
            alloc.bytes = pair.bytes.estimate(settings.confidence, ns);
            alloc.objects = pair.objects.estimate(settings.confidence, ns);
        } else if stack.lost {
            // Duty-cycled, the lost samples' time is unknown: weighted as the process's
            // calls were on average (approximate, unlike the other estimates).
            let scale = duty_scale(self.tally, stack.pid);
            alloc.bytes = alloc.bytes.scaled(scale);
            alloc.objects = alloc.objects.scaled(scale);
        }
        let inuse = (self.tracking() && !stack.lost).then(|| self.estimate(&stack.live));
        let peak = (self.peaks() && !stack.lost).then(|| self.at_peak(&stack.at_peak, stack.pid));
        let leak = self
            .leak_age
            .zip(stack.oldest_leaked_seconds)
            .map(|(age, oldest)| {
                let e = self.estimate(&stack.leaked);
                LeakValues {
                    older_than_seconds: age,
                    inuse_bytes: e.bytes,
                    inuse_objects: e.objects,
                    oldest_seconds: oldest,
                }
            });
        let period = self.period_seconds.map(|seconds| {
            let e = stack.period.estimate(
                settings.confidence,
                Window::SLIDING,
                settings.largest_interval,
            );
            PeriodValues {
                seconds,
                alloc_bytes: e.bytes,
                alloc_objects: e.objects,
            }
        });
        let estimating = self.estimating();
        let growth = self
            .tracking()
            .then(|| estimating.growth(&stack.growth, self.tally))
            .flatten();
        let lifetimes = stack
            .breakdown
            .lifetimes
            .as_ref()
            .and_then(|lifetimes| estimating.lifetimes(lifetimes, &stack.live));
        StackProfile {
            growth,
            lifetimes,
            sizes: estimating.sizes(&stack.breakdown),
            threads: estimating.threads(&stack.breakdown, stack.pid, &self.tally.thread_names),
            timeline: None,
            pid: stack.pid,
            frames: stack.frames,
            samples: stack.all.samples(),
            alloc_bytes: alloc.bytes,
            alloc_objects: alloc.objects,
            alloc_bytes_by_trials: alloc.bytes_by_trials,
            alloc_posterior: stack.all.posterior(settings.largest_interval),
            inuse_bytes: inuse.map(|e| e.bytes),
            inuse_objects: inuse.map(|e| e.objects),
            peak_bytes: peak.map(|e| e.bytes),
            peak_objects: peak.map(|e| e.objects),
            leak,
            period,
            lost: stack.lost,
            cut_to_leaf: stack.cut_to_leaf,
            unwound: stack.origin.map(|origin| origin.unwinding),
            end: stack.origin.map(|origin| origin.end),
        }
    }

    /// The stacks summed at their sites, largest estimated bytes first (none when
    /// duty-cycled: a stack's estimates then come from its strata, not its samples).
    fn sites(&self, tallied: &[StackTally]) -> Vec<SiteProfile> {
        if tallied.iter().any(|s| s.duty.is_some()) {
            return Vec::new();
        }
        let estimating = self.estimating();
        let mut sites: Vec<SiteProfile> = super::sites::by_site(tallied)
            .into_iter()
            .filter_map(|sums| {
                let stack = sums.largest?;
                Some(SiteProfile {
                    pid: stack.pid,
                    frames: stack.frames[sums.site..].to_vec(),
                    via: (sums.site > 0).then(|| stack.frames[0].clone()),
                    stacks: sums.stacks,
                    samples: sums.all.samples(),
                    alloc_bytes: self.estimate(&sums.all).bytes,
                    inuse_bytes: self.tracking().then(|| self.estimate(&sums.live).bytes),
                    peak_bytes: self
                        .peaks()
                        .then(|| self.at_peak(&sums.at_peak, stack.pid).bytes),
                    growth: self
                        .tracking()
                        .then(|| estimating.growth(&sums.growth, self.tally))
                        .flatten(),
                })
            })
            .collect();
        sites.sort_by(|a, b| b.alloc_bytes.estimate.total_cmp(&a.alloc_bytes.estimate));
        sites
    }

    /// Every stack's estimates, largest estimated bytes first, with their timelines; and
    /// above [`GROUPED_ABOVE`] processes (not duty-cycled) each command's stacks taken
    /// together.
    fn all_stacks(
        &self,
        tallied: Vec<StackTally>,
    ) -> (Vec<StackProfile>, Vec<crate::schema::CommandStackProfile>) {
        let processes = &self.tally.processes;
        let merged = (processes.len() > GROUPED_ABOVE && !tallied.iter().any(|s| s.duty.is_some()))
            .then(|| command_stacks::merge(&tallied, processes));
        let stacks = self.stacks(tallied);
        let estimating = self.estimating();
        let mut command_stacks = merged
            .map(|merged| command_stacks::estimate(merged, &stacks, &estimating, self.tracking()))
            .unwrap_or_default();
        let mut stacks = command_stacks::sorted(stacks, &mut command_stacks);
        self.add_timelines(&mut stacks);
        let stacks = stacks.into_iter().map(|(_, stack)| stack).collect();
        (stacks, command_stacks)
    }

    /// `processes` by command name, each group estimated from its processes' samples
    /// together (`per_pid`).
    fn commands(
        &self,
        processes: &[ProcessProfile],
        per_pid: &BTreeMap<u32, ProcessTotals>,
    ) -> Vec<super::CommandGroup> {
        let sets = per_pid
            .iter()
            .map(|(&pid, totals)| {
                let (all, live) = (&totals.all, &totals.live);
                (pid, super::groups::ProcessSets { all, live })
            })
            .collect();
        super::groups::by_command(processes, &sets, |set| self.estimate(set), self.tracking())
    }

    /// One process's estimates from its stacks' samples (`totals`), its exact counts and
    /// what is known of it.
    fn process(
        &self,
        pid: u32,
        totals: &ProcessTotals,
        exact: ProcessCounters,
        coverage: Option<Coverage>,
    ) -> ProcessProfile {
        let (set, live) = (&totals.all, &totals.live);
        let estimating = self.estimating();
        let mut alloc = self.estimate(set);
        let mut inuse = self.tracking().then(|| self.estimate(live));
        let known = self.tally.processes.iter().find(|p| p.pid == pid);
        let duty = known.and_then(|p| p.duty.as_ref());
        let ns = self.tally.duty_ns_per_call;
        if let Some(pair) = duty {
            // From the exact counters of the on slots: time-sampled only.
            let (confidence, samples) = (self.settings.confidence, set.samples());
            let bytes = pair.bytes.estimate(confidence, ns);
            let objects = pair.objects.estimate(confidence, ns);
            alloc.bytes = Estimate { samples, ..bytes };
            alloc.objects = Estimate { samples, ..objects };
        }
        let allocators: Vec<String> = known.map(|p| p.allocators.clone()).unwrap_or_default();
        let super::measured::Measured {
            front_end,
            incomplete,
            exact,
            exact_source,
            unsampled,
        } = super::measured::measured(known, &allocators, set.samples(), exact, coverage.as_ref());
        if unsampled {
            // Its sampler was off for some or all of its time: no upper bound.
            for estimates in std::iter::once(&mut alloc).chain(inuse.as_mut()) {
                estimates.bytes.upper = f64::INFINITY;
                estimates.objects.upper = f64::INFINITY;
            }
        }
        ProcessProfile {
            pid,
            command: known.map(|p| p.command.clone()).unwrap_or_default(),
            executable: known.map(|p| p.executable.clone()).unwrap_or_default(),
            cgroup: known.and_then(|p| p.cgroup.clone()),
            front_end,
            incomplete,
            allocators,
            exact,
            exact_source,
            samples: set.samples(),
            alloc_bytes: alloc.bytes,
            alloc_objects: alloc.objects,
            inuse_bytes: inuse.map(|e| e.bytes),
            inuse_objects: inuse.map(|e| e.objects),
            peak: self.peak(pid, totals).map(|mut peak| {
                if unsampled {
                    peak.inuse_bytes.upper = f64::INFINITY;
                    peak.inuse_objects.upper = f64::INFINITY;
                }
                peak
            }),
            untracked_samples: known.map_or(0, |p| p.untracked_samples),
            lost_samples: known.map_or(0, |p| p.lost_samples),
            rss_bytes: known.and_then(|p| p.rss_bytes),
            cpu_seconds: known.and_then(|p| p.cpu_seconds),
            observed_share: duty.map(|pair| pair.bytes.coverage(ns)),
            coverage,
            growth: self
                .tracking()
                .then(|| estimating.growth(&totals.growth, self.tally))
                .flatten(),
            lifetimes: estimating.lifetimes(&totals.lifetimes, live),
            timeline: self
                .tally
                .timeline
                .as_ref()
                .and_then(|t| t.values(&totals.ids, self.settings.confidence)),
        }
    }
}

impl Snapshot {
    /// The profile: every estimate of the snapshot, per stack since the start and, when
    /// `period_seconds` is given, over the current period; leak values for the stacks with
    /// leaked samples when `settings.leaks_older_than` applies (frees tracked); per process
    /// from its stacks and its exact counters.
    pub fn into_profile(self) -> Profile {
        let Snapshot {
            mut tally,
            settings,
            counters,
            losses,
            period_seconds,
            probes,
            throttle,
            duty,
            thread_states,
            mut coverage,
            overhead,
        } = self;
        let leak_age = settings
            .leaks_older_than
            .filter(|_| !settings.alloc_only)
            .map(|age| age.as_secs_f64());
        // Frames move into the profile (one copy of each stack's frames at a time).
        let tallied = std::mem::take(&mut tally.stacks);
        let per_pid = totals(&tally, &tallied);
        let context = Context {
            settings: &settings,
            tally: &tally,
            leak_age,
            period_seconds,
            fillings: fillings(&per_pid),
        };
        let sites = context.sites(&tallied);
        let (stacks, command_stacks) = context.all_stacks(tallied);
        let processes: Vec<ProcessProfile> = per_pid
            .iter()
            .map(|(&pid, totals)| {
                let exact = counters.get(&pid).copied().unwrap_or_default();
                context.process(pid, totals, exact, coverage.remove(&pid))
            })
            .collect();
        let commands = context.commands(&processes, &per_pid);
        let executables: Vec<&str> = tally
            .processes
            .iter()
            .map(|p| p.executable.as_str())
            .filter(|exe| !exe.is_empty())
            .collect();
        let modules = modules_of(&stacks, &executables, &tally.build_ids);
        Profile {
            schema: SCHEMA.to_owned(),
            sampling: Sampling {
                throttle,
                duty,
                ..settings.sampling()
            },
            duration_seconds: settings.duration_seconds,
            period: false,
            whole_run: false,
            alloc_only: settings.alloc_only,
            leaks_older_than_seconds: leak_age,
            processes,
            commands,
            command_stacks,
            sites,
            losses: Losses {
                stacks_cut_to_leaf: tally.cut_samples,
                ..losses
            },
            modules,
            stacks,
            probes,
            thread_states,
            overhead,
        }
    }
}

/// Each process's sums over its stacks (every target's, with stacks or not).
fn totals(tally: &Tally, tallied: &[StackTally]) -> BTreeMap<u32, ProcessTotals> {
    let mut per_pid: BTreeMap<u32, ProcessTotals> = tally
        .processes
        .iter()
        .map(|p| (p.pid, Default::default()))
        .collect();
    for stack in tallied {
        per_pid.entry(stack.pid).or_default().add(stack);
    }
    per_pid
}

/// Per process: how many times it filled its heap (see [`crate::stats::peak`]).
fn fillings(per_pid: &BTreeMap<u32, ProcessTotals>) -> HashMap<u32, f64> {
    per_pid
        .iter()
        .map(|(&pid, totals)| {
            let (all, at_peak) = (&totals.all, &totals.at_peak);
            let fillings =
                crate::stats::peak::fillings(all.estimated_bytes(), at_peak.estimated_bytes());
            (pid, fillings)
        })
        .collect()
}

/// A process's sums over its stacks.
#[derive(Default)]
struct ProcessTotals {
    all: SampleSet,
    live: SampleSet,
    at_peak: SampleSet,
    growth: GrowthSums,
    lifetimes: Lifetimes,
    /// Its stacks' timeline ids.
    ids: Vec<usize>,
}

impl ProcessTotals {
    fn add(&mut self, stack: &StackTally) {
        self.all.merge(&stack.all);
        self.live.merge(&stack.live);
        self.at_peak.merge(&stack.at_peak);
        self.growth.merge(&stack.growth);
        let Breakdown { lifetimes, .. } = &stack.breakdown;
        if let Some(lifetimes) = lifetimes {
            self.lifetimes.merge(lifetimes);
        }
        self.ids.extend(stack.id);
    }
}

impl Context<'_> {
    /// Gives a timeline to the stacks (sorted by bytes allocated, with their timeline
    /// ids) that allocated or hold the most, and to every growing one.
    fn add_timelines(&self, stacks: &mut [(Option<usize>, StackProfile)]) {
        let Some(timeline) = &self.tally.timeline else {
            return;
        };
        let mut by_inuse: Vec<(usize, f64)> = stacks
            .iter()
            .enumerate()
            .map(|(at, (_, s))| (at, s.inuse_bytes.map_or(0.0, |e| e.estimate)))
            .collect();
        by_inuse.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut chosen: Vec<usize> = (0..stacks.len().min(TIMELINE_STACKS)).collect();
        chosen.extend(by_inuse.iter().take(TIMELINE_STACKS).map(|(at, _)| *at));
        chosen.extend(
            stacks
                .iter()
                .enumerate()
                .filter(|(_, (_, s))| s.growth.is_some_and(|g| g.growing))
                .map(|(at, _)| at),
        );
        for at in chosen {
            let (id, stack) = &mut stacks[at];
            if let (Some(id), None) = (*id, &stack.timeline) {
                stack.timeline = timeline.values(&[id], self.settings.confidence);
            }
        }
    }
}

/// What the recording was asked to do (carried into every export).
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Mean sampling interval in bytes, as asked for.
    pub interval: u64,
    /// The largest interval in force at any time (the throttle may raise it): what a stack
    /// without samples may have hidden is bounded at this one.
    pub largest_interval: u64,
    /// Confidence of every interval.
    pub confidence: f64,
    /// Seconds recorded.
    pub duration_seconds: f64,
    /// Frees were not tracked.
    pub alloc_only: bool,
    /// Live blocks older than this are leak candidates (frees tracked only).
    pub leaks_older_than: Option<std::time::Duration>,
}

impl Settings {
    fn sampling(&self) -> Sampling {
        Sampling {
            mean_interval_bytes: self.interval,
            confidence: self.confidence,
            throttle: None,
            duty: None,
            model: "each allocated byte is sampled with probability 1/mean_interval_bytes \
                    (per-thread geometric countdown); estimates are Horvitz-Thompson, bounds \
                    negative-binomial"
                .to_owned(),
        }
    }
}

/// Duty cycling: the inverse of the share of `pid`'s time observed (1 when always on).
fn duty_scale(tally: &Tally, pid: u32) -> f64 {
    tally
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .and_then(|p| p.duty.as_ref())
        .map(|pair| pair.bytes.coverage(tally.duty_ns_per_call))
        .filter(|&share| share > 0.0)
        .map_or(1.0, |share| 1.0 / share)
}

/// The distinct modules of `stacks`, with the build ids read from the files the processes
/// mapped (`build_ids`, by module name; else from the path); the targets' executables first
/// (pprof takes the first mapping for the main binary).
fn modules_of(
    stacks: &[StackProfile],
    executables: &[&str],
    build_ids: &HashMap<String, Option<String>>,
) -> Vec<Module> {
    // A set, not every frame's path (millions with 100,000 deep stacks).
    let distinct: std::collections::HashSet<&str> = stacks
        .iter()
        .flat_map(|stack| stack.frames.iter().filter_map(|f| f.module.as_deref()))
        .collect();
    let mut paths: Vec<&str> = distinct.into_iter().collect();
    paths.sort_unstable_by_key(|path| (!executables.contains(path), *path));
    paths
        .into_iter()
        .map(|path| Module {
            path: path.to_owned(),
            build_id: match build_ids.get(path) {
                Some(id) => id.clone(),
                None => crate::stacks::build_id(std::path::Path::new(path)),
            },
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::{
        probe::allocator::AllocatorKind,
        profile::{CoverageStart, ProcessTally},
        stats::SampleObs,
    };

    /// Samples of `(size, offset)` each, at an interval of 1 KiB.
    pub(in crate::profile) fn set(samples: &[(u64, u64)]) -> SampleSet {
        let mut set = SampleSet::default();
        for &(size, offset) in samples {
            set.add(SampleObs {
                size,
                offset,
                interval: 1024,
                weight: None,
            });
        }
        set
    }

    pub(in crate::profile) fn stack(pid: u32, name: &str, samples: &[(u64, u64)]) -> StackTally {
        let all = set(samples);
        StackTally {
            pid,
            frames: vec![crate::stacks::symbolize::FrameInfo {
                function: Some(name.into()),
                ..Default::default()
            }],
            live: all,
            at_peak: all,
            leaked: SampleSet::default(),
            period: all,
            recent: SampleSet::default(),
            all,
            oldest_leaked_seconds: None,
            lost: false,
            cut_to_leaf: false,
            origin: None,
            duty: None,
            id: None,
            breakdown: Default::default(),
            growth: Default::default(),
        }
    }

    pub(in crate::profile) fn process(pid: u32) -> ProcessTally {
        ProcessTally {
            pid,
            command: "app".into(),
            executable: "/usr/bin/app".into(),
            rss_bytes: Some(1 << 20),
            anon_first_and_peak: None,
            cpu_seconds: Some(0.5),
            untracked_samples: 0,
            lost_samples: 0,
            runtime_hits: 0,
            cgroup: None,
            allocators: vec![format!("{} (/usr/lib/libc.so.6)", AllocatorKind::Glibc)],
            duty: None,
            go_totals: None,
            not_loaded: None,
            incomplete: Vec::new(),
        }
    }

    pub(in crate::profile) fn snapshot(tally: Tally) -> Snapshot {
        Snapshot {
            tally,
            settings: Settings {
                interval: 1024,
                largest_interval: 1024,
                confidence: 0.95,
                duration_seconds: 2.0,
                alloc_only: false,
                leaks_older_than: None,
            },
            counters: BTreeMap::from([(
                7,
                ProcessCounters {
                    calls: 100,
                    bytes: 64_000,
                },
            )]),
            losses: Losses::default(),
            period_seconds: Some(1.0),
            probes: Vec::new(),
            throttle: None,
            duty: None,
            thread_states: Some(3),
            coverage: HashMap::from([(
                7,
                Coverage {
                    since: CoverageStart::Start,
                    late: Vec::new(),
                    checked: true,
                },
            )]),
            overhead: None,
        }
    }

    #[test]
    fn a_snapshot_builds_every_part_of_the_profile_once() {
        let tally = Tally {
            // A stack of a process never tracked still has its process line.
            stacks: vec![
                stack(7, "small", &[(100, 3)]),
                stack(7, "large", &[(4096, 10), (4096, 900)]),
                stack(9, "other", &[(64, 0)]),
            ],
            processes: vec![process(7)],
            cut_samples: 4,
            ..Tally::default()
        };
        let profile = Snapshot::into_profile(snapshot(tally));
        let names: Vec<_> = profile
            .stacks
            .iter()
            .map(|s| s.frames[0].function.as_deref().unwrap())
            .collect();
        assert_eq!(names[0], "large", "largest estimate first: {names:?}");
        let pids: Vec<u32> = profile.processes.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [7, 9]);
        let app = &profile.processes[0];
        assert_eq!((app.exact.calls, app.exact.bytes), (100, 64_000));
        assert_eq!(app.samples, 3);
        assert_eq!(app.front_end, "uprobes");
        assert_eq!(app.coverage.as_ref().unwrap().since, CoverageStart::Start);
        // The process's estimate is the sum of its stacks' (Horvitz-Thompson is additive).
        let summed: f64 = profile.stacks[..2]
            .iter()
            .map(|s| s.alloc_bytes.estimate)
            .sum();
        assert!((app.alloc_bytes.estimate - summed).abs() < 1e-6 * summed);
        assert!(profile
            .stacks
            .iter()
            .all(|s| s.period.is_some() && s.inuse_bytes.is_some()));
        assert_eq!(profile.losses.stacks_cut_to_leaf, 4);
        assert_eq!(profile.thread_states, Some(3));
        assert_eq!(profile.processes[1].command, "", "unknown, not guessed");
    }

    #[test]
    fn cost_is_measured_over_every_process_with_calls_or_samples() {
        let tally = Tally {
            stacks: vec![stack(9, "other", &[(64, 0)])],
            processes: vec![process(7)],
            ..Tally::default()
        };
        let uses = target_uses(&tally, &snapshot(Tally::default()).counters);
        let seen: Vec<_> = uses
            .iter()
            .map(|u| (u.pid, u.calls, u.cpu_seconds))
            .collect();
        assert_eq!(seen, [(7, 100, Some(0.5)), (9, 0, None)]);
    }

    #[test]
    fn a_profile_with_no_duration_or_an_impossible_confidence_is_refused() {
        let built = Snapshot::into_profile(snapshot(Tally {
            stacks: vec![stack(7, "a", &[(100, 3)])],
            processes: vec![process(7)],
            ..Tally::default()
        }));
        assert_eq!(built.check(), Ok(()));
        for duration in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let mut profile = built.clone();
            profile.duration_seconds = duration;
            assert!(profile.check().unwrap_err().contains("duration_seconds"));
        }
        for confidence in [0.0, 1.0, 1.5, -0.95, f64::NAN] {
            let mut profile = built.clone();
            profile.sampling.confidence = confidence;
            assert!(profile.check().unwrap_err().contains("confidence"));
        }
        let mut profile = built;
        profile.sampling.mean_interval_bytes = 0;
        assert!(profile.check().is_err());
    }

    #[test]
    fn alloc_only_has_no_in_use_values_and_no_leaks() {
        let mut snapshot = snapshot(Tally {
            stacks: vec![stack(7, "a", &[(100, 3)])],
            processes: vec![process(7)],
            ..Tally::default()
        });
        snapshot.settings.alloc_only = true;
        snapshot.settings.leaks_older_than = Some(std::time::Duration::from_secs(1));
        let profile = Snapshot::into_profile(snapshot);
        assert!(profile.stacks[0].inuse_bytes.is_none());
        assert!(profile.processes[0].inuse_bytes.is_none());
        assert_eq!(profile.leaks_older_than_seconds, None);
    }

    /// Above [`GROUPED_ABOVE`] processes, a command's processes' alike stacks are taken
    /// together: one estimate over their samples (the sum of theirs, with narrower bounds
    /// than their bounds summed), the peak summed; another command's stack with the same
    /// frames stays apart, and no command stacks are built for fewer processes.
    #[test]
    fn a_commands_processes_alike_stacks_are_taken_together() {
        let pids: Vec<u32> = (10..10 + GROUPED_ABOVE as u32 + 2).collect();
        let mut stacks: Vec<StackTally> = pids
            .iter()
            .map(|&pid| stack(pid, "parse", &[(4096, 7), (512, u64::from(pid))]))
            .collect();
        stacks.push(stack(pids[0], "other", &[(64, 0)]));
        stacks.push(stack(99, "parse", &[(4096, 1)]));
        let mut processes: Vec<ProcessTally> = pids.iter().map(|&pid| process(pid)).collect();
        processes.push(ProcessTally {
            command: "tool".into(),
            ..process(99)
        });
        let tally = Tally {
            stacks,
            processes,
            ..Tally::default()
        };
        let profile = Snapshot::into_profile(snapshot(tally.clone()));
        let parse = &profile.command_stacks[0];
        assert_eq!(
            (parse.command.as_str(), parse.processes, parse.samples),
            ("app", pids.len() as u64, 2 * pids.len() as u64)
        );
        let frames = &profile.stacks[parse.stack].frames;
        assert_eq!(profile.stacks[parse.stack].pid, parse.largest_pid);
        let members: Vec<&StackProfile> = profile
            .stacks
            .iter()
            .filter(|s| s.frames == *frames && pids.contains(&s.pid))
            .collect();
        assert_eq!(members.len(), pids.len());
        let sum = |f: fn(&StackProfile) -> f64| members.iter().map(|s| f(s)).sum::<f64>();
        let estimate = parse.alloc_bytes.estimate;
        assert!((estimate - sum(|s| s.alloc_bytes.estimate)).abs() < 1e-6 * estimate);
        assert!(parse.alloc_bytes.upper < sum(|s| s.alloc_bytes.upper));
        assert!(parse.alloc_bytes.lower > sum(|s| s.alloc_bytes.lower));
        let peak = parse.peak_bytes.unwrap();
        assert!((peak.upper - sum(|s| s.peak_bytes.unwrap().upper)).abs() < 1e-6 * peak.upper);
        assert!(parse.inuse_bytes.is_some());
        let of = |command: &str, name: &str| {
            profile
                .command_stacks
                .iter()
                .filter(|s| s.command == command)
                .filter(|s| profile.stacks[s.stack].frames[0].function.as_deref() == Some(name))
                .map(|s| (s.processes, s.largest_pid))
                .collect::<Vec<_>>()
        };
        assert_eq!(of("tool", "parse"), [(1, 99)]);
        // A pid no process line knows keeps its stacks apart.
        let mut unknown = tally.clone();
        unknown.stacks.push(stack(500, "parse", &[(64, 0)]));
        unknown.stacks.push(stack(501, "parse", &[(64, 0)]));
        let apart = Snapshot::into_profile(snapshot(unknown)).command_stacks;
        assert_eq!(apart.iter().filter(|s| s.command.is_empty()).count(), 2);
        assert_eq!(of("app", "other"), [(1, pids[0])]);
        assert_eq!(profile.command_stacks.len(), 3);

        let few = Tally {
            stacks: tally.stacks[..3].to_vec(),
            processes: tally.processes[..3].to_vec(),
            ..Tally::default()
        };
        assert!(Snapshot::into_profile(snapshot(few))
            .command_stacks
            .is_empty());
    }
}
