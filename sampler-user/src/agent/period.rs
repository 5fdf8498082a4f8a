//! One period of the agent, per process: what the process allocated in the period and what
//! it holds at its end, as a profile of its own.
//!
//! A process is the unit the stores keep apart (a Pyroscope series, an OTLP resource), so
//! the recording's profile is split by pid here. Allocation values become the period's
//! (`StackProfile::period`): the stores add up successive pushes, and a cumulative value
//! pushed every minute would be counted again each minute. In-use values stay what they
//! are, a level at the period's end. Pure: the agent's I/O is elsewhere.

use crate::profile::{Profile, StackProfile};

/// A process's part of one period.
#[derive(Clone, Debug)]
pub(crate) struct ProcessPeriod {
    /// The process.
    pub pid: u32,
    /// Its name (`comm`, sanitized by the profile).
    pub command: String,
    /// Its executable's path.
    pub executable: String,
    /// Its cgroup (v2 path), when known.
    pub cgroup: Option<String>,
    /// The container id found in the cgroup path, when it names one.
    pub container_id: Option<String>,
    /// Which front end measured it (`in-process (otel_memory)`, `uprobes`).
    pub front_end: String,
    /// The process's stacks over the period only (allocation values of the period, in-use
    /// values at its end), no per-thread split, `duration_seconds` the period's.
    pub profile: Profile,
}

/// Splits `profile` (built with a period, see `Recording::profile`) into one
/// [`ProcessPeriod`] per process with something to say: a stack that allocated in the period
/// or holds memory at its end. `period_seconds`: the period's length.
pub(crate) fn split(profile: &Profile, period_seconds: f64) -> Vec<ProcessPeriod> {
    profile
        .processes
        .iter()
        .filter_map(|process| {
            let stacks: Vec<StackProfile> = profile
                .stacks
                .iter()
                .filter(|s| s.pid == process.pid)
                .filter_map(period_stack)
                .collect();
            if stacks.is_empty() {
                return None;
            }
            let mut own = Profile {
                schema: profile.schema.clone(),
                sampling: profile.sampling.clone(),
                duration_seconds: period_seconds,
                period: profile.period,
                whole_run: false,
                alloc_only: profile.alloc_only,
                leaks_older_than_seconds: profile.leaks_older_than_seconds,
                processes: vec![process.clone()],
                commands: Vec::new(),
                command_stacks: Vec::new(),
                losses: profile.losses,
                modules: profile.modules.clone(),
                stacks,
                sites: Vec::new(),
                probes: Vec::new(),
                thread_states: None,
                overhead: None,
            };
            own.processes[0].timeline = None;
            own.processes[0].peak = None;
            Some(ProcessPeriod {
                pid: process.pid,
                command: process.command.clone(),
                executable: process.executable.clone(),
                cgroup: process.cgroup.clone(),
                container_id: process.cgroup.as_deref().and_then(container_id),
                front_end: process.front_end.clone(),
                profile: own,
            })
        })
        .collect()
}

/// `stack` over the period: its allocation values replaced by the period's; `None` when it
/// neither allocated in the period nor holds anything at its end.
fn period_stack(stack: &StackProfile) -> Option<StackProfile> {
    let mut own = stack.clone();
    // Without period values (a profile built without a period) the stack's values are
    // already the recording's, which then is the period.
    if let Some(period) = &stack.period {
        own.alloc_bytes = period.alloc_bytes;
        own.alloc_objects = period.alloc_objects;
        own.samples = period.alloc_bytes.samples;
    }
    own.threads.clear();
    own.timeline = None;
    own.sizes.clear();
    // The peak is the recording's, not the period's.
    own.peak_bytes = None;
    own.peak_objects = None;
    let holds = own.inuse_bytes.is_some_and(|e| e.estimate > 0.0);
    (own.alloc_bytes.estimate > 0.0 || holds).then_some(own)
}

/// The container id a cgroup path names: the 64-hex-digit id of Docker
/// (`/docker/<id>`, `docker-<id>.scope`), containerd (`cri-containerd-<id>.scope`), CRI-O
/// (`crio-<id>.scope`) and Podman (`libpod-<id>.scope`), the last one on the path.
pub(crate) fn container_id(cgroup: &str) -> Option<String> {
    cgroup.rsplit('/').find_map(|part| {
        let part = part.strip_suffix(".scope").unwrap_or(part);
        let id = part.rsplit(['-', ':']).next().unwrap_or(part);
        (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{profile::PeriodValues, stats::Estimate};
    use allocscope_model::fixtures::synthetic;

    fn estimate(value: f64) -> Estimate {
        Estimate {
            samples: 3,
            estimate: value,
            lower: value / 2.0,
            upper: value * 2.0,
        }
    }

    #[test]
    fn a_period_holds_the_periods_allocations_per_process() {
        let mut profile = synthetic();
        let mut other = profile.processes[0].clone();
        other.pid = 43;
        other.command = "other".into();
        profile.processes.push(other);
        // Stack 0 allocated 100 bytes in the period, stack 1 nothing; a stack of 43 too.
        profile.stacks[0].period = Some(PeriodValues {
            seconds: 60.0,
            alloc_bytes: estimate(100.0),
            alloc_objects: estimate(2.0),
        });
        profile.stacks[1].period = Some(PeriodValues {
            seconds: 60.0,
            alloc_bytes: estimate(0.0),
            alloc_objects: estimate(0.0),
        });
        let mut of_43 = profile.stacks[0].clone();
        of_43.pid = 43;
        profile.stacks.push(of_43);
        let periods = split(&profile, 60.0);
        assert_eq!(periods.len(), 2);
        let first = &periods[0];
        assert_eq!((first.pid, first.command.as_str()), (42, "app"));
        assert_eq!(first.profile.stacks.len(), 1, "the idle stack is left out");
        assert_eq!(first.profile.stacks[0].alloc_bytes, estimate(100.0));
        assert_eq!(first.profile.stacks[0].alloc_objects, estimate(2.0));
        assert_eq!(first.profile.duration_seconds, 60.0);
        assert_eq!(first.profile.processes.len(), 1);
        assert!(periods[1].profile.stacks.iter().all(|s| s.pid == 43));
    }

    #[test]
    fn a_stack_idle_in_the_period_but_holding_memory_stays() {
        let mut profile = synthetic();
        for stack in &mut profile.stacks {
            stack.period = Some(PeriodValues {
                seconds: 1.0,
                alloc_bytes: estimate(0.0),
                alloc_objects: estimate(0.0),
            });
        }
        assert!(split(&profile, 1.0).is_empty(), "nothing to say");
        profile.stacks[1].inuse_bytes = Some(estimate(4096.0));
        let periods = split(&profile, 1.0);
        assert_eq!(periods[0].profile.stacks.len(), 1);
        assert_eq!(
            periods[0].profile.stacks[0].inuse_bytes,
            Some(estimate(4096.0))
        );
    }

    #[test]
    fn container_ids_come_from_the_runtimes_cgroup_names() {
        let id = "4f1c2a9e8b7d6c5a4f1c2a9e8b7d6c5a4f1c2a9e8b7d6c5a4f1c2a9e8b7d6c5a";
        for path in [
            format!("/docker/{id}"),
            format!("/system.slice/docker-{id}.scope"),
            format!("/kubepods.slice/kubepods-pod1.slice/cri-containerd-{id}.scope"),
            format!("/machine.slice/libpod-{id}.scope/container"),
            format!("/kubepods/besteffort/pod1/crio-{id}.scope"),
        ] {
            assert_eq!(container_id(&path).as_deref(), Some(id), "{path}");
        }
        assert_eq!(container_id("/system.slice/nginx.service"), None);
        assert_eq!(container_id("/user.slice/user-1000.slice"), None);
        assert_eq!(container_id(&format!("/docker/{}", &id[1..])), None);
    }
}
