//! Coverage of processes that come and go: every process `--follow` takes in and
//! every one `--comm` matches at its exec is counted from its first allocation, however
//! briefly it lives, because the kernel adds it to the followed set before it runs.
//!
//! These tests live apart from the other reach tests: their file-wide probes make every
//! process on the host pay the trap, the recorders of tests running beside them included.
//!
//! The processes are mostly `brief` (tests/fixtures/brief.c): they allocate from their first
//! instruction and exit within milliseconds, so anything that attaches after the fork or
//! exec misses calls, and the exact counters show it.

use std::{collections::BTreeMap, process::Command, time::Duration};

use allocscope_model::schema::{CoverageStart, StackEnd, StackProfile};
use tests::{
    assert_bounds_exact, check_workload_profile, drain, fixture, interrupt, read_profile,
    record::{process_of, site_of, ProcessProfile, Profile},
    start_recording, start_recording_said, typed, wait_until, Record, TempDir, Workload,
};

/// Confidence of every bound checked: about 200 intervals are checked per test, so each
/// must fail rarely for the test not to.
const CONFIDENCE: &str = "0.999999";
/// The confidence and rounds of the workload tests (as in reach.rs), which check fewer
/// intervals.
const REACH_CONFIDENCE: &str = "0.9999";
const ROUNDS: u64 = 2000;
/// Calls each brief process makes at its site, and their size.
const CALLS: u64 = 5000;
const SIZE: u64 = 100;
const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

/// The processes named `command` in the profile, by pid.
fn processes<'a>(profile: &'a Profile, command: &str) -> BTreeMap<u32, &'a ProcessProfile> {
    profile
        .processes
        .iter()
        .filter(|p| p.command == command)
        .map(|p| (p.pid, p))
        .collect()
}

/// Whether `stack` has a frame named `function`.
fn passes_through(stack: &StackProfile, function: &str) -> bool {
    stack
        .frames
        .iter()
        .any(|f| f.function.as_deref() == Some(function))
}

/// Checks `pid`'s site: the one stack whose frames include `site` has estimated bytes and
/// objects that bound the truth (`CALLS` blocks of `SIZE` bytes). A process gone before
/// even the intake thread could read its maps (a few milliseconds of life, on a loaded
/// machine) has no names: its stacks end at an unmapped leaf, and then its process total
/// must bound the truth instead. Returns whether the site was named.
fn check_site(profile: &Profile, pid: u32, site: &str) -> bool {
    let process = process_of(profile, pid);
    let own: Vec<&StackProfile> = profile.stacks.iter().filter(|s| s.pid == pid).collect();
    let unnamed = own.iter().all(|s| {
        s.end == Some(StackEnd::Unmapped) && s.frames.first().is_none_or(|f| f.module.is_none())
    });
    let named: Vec<&&StackProfile> = own.iter().filter(|s| passes_through(s, site)).collect();
    let (bytes, objects) = if unnamed && !own.is_empty() {
        (&process.alloc_bytes, &process.alloc_objects)
    } else {
        assert_eq!(
            named.len(),
            1,
            "pid {pid}: stacks with {site}: {named:#?}; all of its stacks: {own:#?}; {process:#?}"
        );
        (&named[0].alloc_bytes, &named[0].alloc_objects)
    };
    for (value, e, truth) in [
        ("alloc_bytes", bytes, (CALLS * SIZE) as f64),
        ("alloc_objects", objects, CALLS as f64),
    ] {
        assert!(
            e.lower <= truth && truth <= e.upper,
            "pid {pid} {site}: true {value} {truth} outside {e:?}"
        );
    }
    !unnamed
}

/// `process` is covered from one of `since`, with no allocator probed late. (Whether its
/// maps were `checked` varies: a process gone before its mappings were read, as some of
/// these are under load, says nothing of allocators not probed, and then the exact counts
/// are what shows nothing was missed.)
fn assert_complete(process: &ProcessProfile, since: &[CoverageStart]) {
    let coverage = process
        .coverage
        .as_ref()
        .unwrap_or_else(|| panic!("pid {}: no coverage", process.pid));
    assert!(
        since.contains(&coverage.since),
        "pid {}: covered since {coverage:?}, expected one of {since:?}",
        process.pid
    );
    assert!(coverage.late.is_empty(), "{process:#?}");
}

#[test]
fn follow_counts_a_hundred_short_lived_processes_from_their_first_allocation() {
    tests::require_bpf!();
    let dir = TempDir::new("coverage-follow");
    let brief = fixture("brief", &[]);
    // 25 rounds of: brief exec'd by the shell and forking one child, the same under
    // jemalloc: 100 brief processes, half exec'd, half forked without exec.
    let script = dir.path("brood.sh");
    std::fs::write(
        &script,
        format!(
            "for i in $(seq 1 25); do\n  {b} {CALLS} {SIZE} 1\n  LD_PRELOAD={JEMALLOC} {b} {CALLS} {SIZE} 1\ndone\n",
            b = brief.display()
        ),
    )
    .unwrap();
    // Uprobes: the file-wide probes of the followed set are what this checks (with the
    // in-process front end, a child that replaces LD_PRELOAD drops the library and is
    // probed from its exec event, milliseconds late: marked so in its coverage).
    let recorded = Record::command("sh", &[script.to_str().unwrap()])
        .flags(&[
            "--follow",
            "--no-preload",
            "-i",
            "4KiB",
            "--confidence",
            CONFIDENCE,
        ])
        .run();
    let (profile, stderr) = (&recorded.profile, &recorded.stderr);
    let briefs = processes(profile, "brief");
    assert_eq!(
        briefs.len(),
        100,
        "brief processes seen: {:?}\n{stderr}",
        briefs.keys()
    );
    assert_eq!(profile.losses.process_event_lost, 0);
    assert_eq!(profile.losses.followed_full, 0);
    let (mut forked, mut named) = (0, 0);
    for (&pid, process) in &briefs {
        let (calls, bytes) = (process.exact.calls, process.exact.bytes);
        let is_forked = profile
            .stacks
            .iter()
            .any(|s| s.pid == pid && passes_through(s, "forked_site"));
        if is_forked {
            // Forked by brief, without exec: its calls are exactly forked_site's.
            forked += 1;
            assert_eq!(
                (calls, bytes),
                (CALLS, CALLS * SIZE),
                "pid {pid}: {process:#?}"
            );
            named += usize::from(check_site(profile, pid, "forked_site"));
        } else {
            // Forked by the shell, which may allocate a little before the exec (the same
            // process): brief_site's calls and at most a few of the shell's.
            assert!(
                (CALLS..CALLS + 4).contains(&calls) && bytes >= CALLS * SIZE,
                "pid {pid}: {calls} calls, {bytes} bytes: {process:#?}"
            );
            named += usize::from(check_site(profile, pid, "brief_site"));
        }
        assert_complete(process, &[CoverageStart::Fork]);
    }
    // A process whose maps were never read looks exec'd: at most 50 are forked.
    assert!(forked <= 50, "forked children without exec: {forked}");
    eprintln!("{named} of 100 brief processes had their sites named");
}

#[test]
fn comm_counts_processes_started_after_it_from_their_exec() {
    tests::require_bpf!();
    let dir = TempDir::new("coverage-comm");
    let out = dir.path("comm.json");
    let brief = fixture("brief", &[]);
    let renamed = dir.path("covcomm-brief");
    std::fs::copy(&brief, &renamed).unwrap();
    let out_arg = out.display().to_string();
    let (mut recorder, mut stderr) = start_recording(&[
        "record",
        "--comm",
        "^covcomm",
        "-i",
        "4KiB",
        "--confidence",
        CONFIDENCE,
        "-o",
        &out_arg,
    ]);
    // Ten matching processes, each forking one child (same name: matched too), and one
    // that does not match, all started after the recording and allocating at once.
    for _ in 0..10 {
        let status = Command::new(&renamed)
            .args([CALLS.to_string(), SIZE.to_string(), "1".into()])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let mut other = Command::new(&brief)
        .args([CALLS.to_string(), SIZE.to_string(), "0".into()])
        .spawn()
        .unwrap();
    let other_pid = other.id();
    assert!(other.wait().unwrap().success());
    // SAFETY: kill(2) on our own child, not reaped yet.
    unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) };
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
    assert!(recorder.wait().unwrap().success(), "{rest}");
    let profile = typed(&read_profile(&out));
    let matched = processes(&profile, "covcomm-brief");
    assert_eq!(matched.len(), 20, "{rest}");
    for (&pid, process) in &matched {
        // Exec'd by this test (nothing of ours allocates between its fork and exec), or
        // forked by one of them: exactly its site's calls.
        assert_eq!(
            (process.exact.calls, process.exact.bytes),
            (CALLS, CALLS * SIZE),
            "pid {pid}: {process:#?}"
        );
        let forked = process.coverage.as_ref().map(|c| c.since) == Some(CoverageStart::Fork);
        let site = if forked { "forked_site" } else { "brief_site" };
        check_site(&profile, pid, site);
        assert_complete(process, &[CoverageStart::Exec, CoverageStart::Fork]);
    }
    let pids: Vec<u32> = profile.processes.iter().map(|p| p.pid).collect();
    assert!(
        !pids.contains(&other_pid),
        "the process that does not match is in the profile: {pids:?}"
    );
    assert!(
        profile.stacks.iter().all(|s| matched.contains_key(&s.pid)),
        "stacks of processes that are not targets"
    );
}

#[test]
fn follow_takes_in_forked_and_execed_processes() {
    tests::require_bpf!();
    let forker = fixture("forker", &[]);
    let workload = fixture("workload", &[]);
    // Long enough for each child to be attached before it is done, even on a loaded
    // machine (attaching takes 1–26 ms after the fork; #14 is about not waiting at all).
    let iterations: u64 = 1_000_000;
    let iterations_arg = iterations.to_string();
    let recorded = Record::command(
        &forker,
        &["3", &iterations_arg, workload.to_str().unwrap(), "20000"],
    )
    .flags(&["--follow", "--confidence", REACH_CONFIDENCE])
    .run();
    let (profile, stderr) = (&recorded.profile, &recorded.stderr);
    let processes = &profile.processes;
    let seen: Vec<(u32, &str, u64)> = processes
        .iter()
        .map(|p| (p.pid, p.command.as_str(), p.exact.calls))
        .collect();
    assert_eq!(
        processes.len(),
        5,
        "parent, 3 children, 1 exec'd; seen (pid, command, calls): {seen:?}\n{stderr}"
    );
    let parent = processes[0].pid;
    // The parent from its first allocation: exactly its own calls.
    assert_eq!(
        site_of(profile, parent, "parent_site").len(),
        1,
        "parent_site in the parent"
    );
    let children: Vec<&ProcessProfile> = processes
        .iter()
        .filter(|p| p.command == "forker" && p.pid != parent)
        .collect();
    assert_eq!(children.len(), 3, "{processes:#?}");
    for child in children {
        let pid = child.pid;
        let stacks = site_of(profile, pid, "child_site");
        assert_eq!(stacks.len(), 1, "child {pid}: {stacks:#?}");
        // Attached within milliseconds of the fork: most of the child's calls are seen,
        // every one seen is attributed to it, and the estimate bounds what was counted.
        let calls = child.exact.calls;
        assert!(
            calls > iterations / 2 && calls <= iterations + 10,
            "child {pid}: {calls} calls of {iterations}"
        );
        assert_bounds_exact(child);
    }
    let execed = processes
        .iter()
        .find(|p| p.command == "workload")
        .unwrap_or_else(|| panic!("the exec'd workload is missing: {processes:#?}"));
    assert!(!site_of(profile, execed.pid, "site_realloc_null").is_empty());
}

#[test]
fn comm_waits_for_a_matching_process_and_takes_it_in() {
    tests::require_bpf!();
    let dir = TempDir::new("comm");
    let out = dir.path("comm.json");
    let renamed = dir.path("reachcomm-wl");
    std::fs::copy(fixture("workload", &[]), &renamed).unwrap();
    let (recorder, stderr, said) = start_recording_said(&[
        "record",
        "--comm",
        "^reachcomm",
        "--interval",
        "64KiB",
        "--confidence",
        REACH_CONFIDENCE,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(said.contains("waiting for one to start"), "{said}");
    let mut workload = Workload::start_with(Command::new(&renamed), ROUNDS, &[]);
    let pid = workload.pid();
    // Found at its exec, or by the next scan at the latest (stderr drained meanwhile).
    let _drained = drain(stderr);
    assert!(wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| !m.is_empty())
            && tests::first_byte(pid, workload.malloc) == tests::INT3
    }));
    workload.go();
    assert_eq!(workload.line(), "done");
    drop(workload);
    interrupt(recorder);
    let profile = typed(&read_profile(&out));
    check_workload_profile(&profile, pid, ROUNDS);
    assert_eq!(process_of(&profile, pid).command, "reachcomm-wl");
}
