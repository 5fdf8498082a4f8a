//! Profiles built by hand for the tests of every crate that reads one (feature
//! `fixtures`, a dev-dependency only: never in the allocscope binary).

use crate::{
    schema::{
        ExactCounts, FrameInfo, Losses, Module, ProcessProfile, Profile, Sampling, StackEnd,
        StackProfile, Unwinding, SCHEMA,
    },
    stats::{estimate::Posterior, Estimate},
};

/// An estimate of `value` from `samples` samples, its bounds ±10%.
pub fn estimate(value: f64, samples: u64) -> Estimate {
    Estimate {
        samples,
        estimate: value,
        lower: value * 0.9,
        upper: value * 1.1,
    }
}

/// A frame of `module` named `function`, in /src/app.c at `line`.
pub fn frame(function: &str, module: &str, address: u64, line: u32) -> FrameInfo {
    FrameInfo {
        function: Some(function.into()),
        module: Some(module.into()),
        file: Some("/src/app.c".into()),
        line: Some(line),
        address,
        kind: None,
    }
}

/// A small profile: two stacks of one process, one with an inlined frame.
pub fn synthetic() -> Profile {
    Profile {
        schema: SCHEMA.to_owned(),
        sampling: Sampling {
            mean_interval_bytes: 1024,
            confidence: 0.95,
            throttle: None,
            duty: None,
            model: "m".into(),
        },
        duration_seconds: 2.5,
        period: false,
        whole_run: false,
        alloc_only: true,
        leaks_older_than_seconds: None,
        processes: vec![process()],
        commands: Vec::new(),
        command_stacks: Vec::new(),
        losses: Losses::default(),
        modules: vec![Module {
            path: "/bin/app".into(),
            build_id: Some("abcd".into()),
        }],
        stacks: vec![
            stack(
                vec![
                    frame("inlined_leaf", "/bin/app", 0x110, 7),
                    frame("leaf", "/bin/app", 0x110, 9),
                    frame("main", "/bin/app", 0x220, 20),
                ],
                20000.0,
                100.0,
            ),
            stack(
                vec![
                    frame("other", "/bin/app", 0x330, 3),
                    frame("main", "/bin/app", 0x228, 21),
                ],
                10000.0,
                200.0,
            ),
        ],
        sites: Vec::new(),
        probes: Vec::new(),
        thread_states: None,
        overhead: None,
    }
}

/// One stack of process 42 sampled 10 times.
fn stack(frames: Vec<FrameInfo>, bytes: f64, objects: f64) -> StackProfile {
    StackProfile {
        pid: 42,
        frames,
        samples: 10,
        alloc_bytes: estimate(bytes, 10),
        alloc_objects: estimate(objects, 10),
        alloc_bytes_by_trials: bytes,
        alloc_posterior: Posterior {
            bytes_sampled: 10,
            bytes_to_sample: 5.0,
            p: 0.001,
            mean: bytes,
            variance: 1.0,
        },
        inuse_bytes: None,
        inuse_objects: None,
        peak_bytes: None,
        peak_objects: None,
        leak: None,
        period: None,
        lost: false,
        cut_to_leaf: false,
        unwound: Some(Unwinding::Dwarf),
        end: Some(StackEnd::Root),
        growth: None,
        lifetimes: None,
        sizes: Vec::new(),
        threads: Vec::new(),
        timeline: None,
    }
}

/// Process 42, `app`, counted by uprobes.
fn process() -> ProcessProfile {
    ProcessProfile {
        pid: 42,
        command: "app".into(),
        executable: "/bin/app".into(),
        cgroup: Some("/system.slice/app.service".into()),
        front_end: "uprobes".into(),
        allocators: vec!["glibc (/lib/libc.so.6)".into()],
        exact: ExactCounts {
            calls: 300,
            bytes: 30000,
        },
        exact_source: None,
        samples: 20,
        alloc_bytes: estimate(30000.0, 20),
        alloc_objects: estimate(300.0, 20),
        inuse_bytes: None,
        inuse_objects: None,
        peak: None,
        observed_share: None,
        untracked_samples: 0,
        lost_samples: 0,
        rss_bytes: Some(1 << 20),
        cpu_seconds: Some(1.5),
        coverage: None,
        incomplete: Vec::new(),
        growth: None,
        lifetimes: None,
        timeline: None,
    }
}
