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

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use tests::{
    allocscope, assert_estimate_bounds_exact, check_workload_profile, drain, fixture, interrupt,
    process, read_profile, site, start_recording, typed, wait_until, TempDir, Workload,
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
fn processes<'a>(profile: &'a Value, command: &str) -> BTreeMap<u64, &'a Value> {
    profile["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["command"] == command)
        .map(|p| (p["pid"].as_u64().unwrap(), p))
        .collect()
}

/// Checks `pid`'s site: the one stack whose frames include `site` has estimated bytes and
/// objects that bound the truth (`CALLS` blocks of `SIZE` bytes). A process gone before
/// even the intake thread could read its maps (a few milliseconds of life, on a loaded
/// machine) has no names: its stacks end at an unmapped leaf, and then its process total
/// must bound the truth instead. Returns whether the site was named.
fn check_site(profile: &Value, pid: u64, site: &str) -> bool {
    let process = profile["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap();
    let own: Vec<&Value> = profile["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["pid"] == pid)
        .collect();
    let unnamed = own
        .iter()
        .all(|s| s["end"] == "unmapped" && s["frames"][0]["module"].is_null());
    let named: Vec<&&Value> = own
        .iter()
        .filter(|s| {
            s["frames"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["function"] == site))
        })
        .collect();
    let checked = if unnamed && !own.is_empty() {
        process
    } else {
        assert_eq!(
            named.len(),
            1,
            "pid {pid}: stacks with {site}: {named:#?}; all of its stacks: {own:#?}; {process}"
        );
        named[0]
    };
    for (value, truth) in [
        ("alloc_bytes", (CALLS * SIZE) as f64),
        ("alloc_objects", CALLS as f64),
    ] {
        let e = &checked[value];
        assert!(
            e["lower"].as_f64().unwrap() <= truth && truth <= e["upper"].as_f64().unwrap(),
            "pid {pid} {site}: true {value} {truth} outside {e}"
        );
    }
    !unnamed
}

fn assert_complete(process: &Value, since: &[&str]) {
    let coverage = &process["coverage"];
    assert!(
        since.contains(&coverage["since"].as_str().unwrap_or("")),
        "pid {}: covered since {coverage}, expected one of {since:?}",
        process["pid"]
    );
    // `checked` is false for a process gone before its mappings were read (under load,
    // some of these are): then nothing says whether it used an allocator not probed, so
    // the exact counts above are what shows nothing was missed.
    assert!(coverage["checked"].is_boolean(), "{process:#}");
    assert!(coverage.get("late").is_none(), "{process:#}");
}

#[test]
fn follow_counts_a_hundred_short_lived_processes_from_their_first_allocation() {
    tests::require_bpf!();
    let dir = TempDir::new("coverage-follow");
    let out = dir.path("follow.json");
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
    let output = Command::new(allocscope())
        // Uprobes: the file-wide probes of the followed set are what this checks (with the
        // in-process front end, a child that replaces LD_PRELOAD drops the library and is
        // probed from its exec event, milliseconds late: marked so in its coverage).
        .args([
            "record",
            "--follow",
            "--no-preload",
            "-i",
            "4KiB",
            "--confidence",
            CONFIDENCE,
        ])
        .arg("-o")
        .arg(&out)
        .args(["--", "sh"])
        .arg(&script)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "allocscope failed:\n{stderr}");
    let profile = read_profile(&out);
    let briefs = processes(&profile, "brief");
    assert_eq!(
        briefs.len(),
        100,
        "brief processes seen: {:?}\n{stderr}",
        briefs.keys()
    );
    assert_eq!(profile["losses"]["process_event_lost"], 0);
    assert_eq!(profile["losses"]["followed_full"], 0);
    let (mut forked, mut named) = (0, 0);
    for (&pid, process) in &briefs {
        let calls = process["exact"]["calls"].as_u64().unwrap();
        let bytes = process["exact"]["bytes"].as_u64().unwrap();
        let is_forked = profile["stacks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["pid"] == pid && s.to_string().contains("forked_site"));
        if is_forked {
            // Forked by brief, without exec: its calls are exactly forked_site's.
            forked += 1;
            assert_eq!(
                (calls, bytes),
                (CALLS, CALLS * SIZE),
                "pid {pid}: {process:#}"
            );
            named += usize::from(check_site(&profile, pid, "forked_site"));
        } else {
            // Forked by the shell, which may allocate a little before the exec (the same
            // process): brief_site's calls and at most a few of the shell's.
            assert!(
                (CALLS..CALLS + 4).contains(&calls) && bytes >= CALLS * SIZE,
                "pid {pid}: {calls} calls, {bytes} bytes: {process:#}"
            );
            named += usize::from(check_site(&profile, pid, "brief_site"));
        }
        assert_complete(process, &["fork"]);
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
    let other_pid = u64::from(other.id());
    assert!(other.wait().unwrap().success());
    // SAFETY: kill(2) on our own child, not reaped yet.
    unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) };
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
    assert!(recorder.wait().unwrap().success(), "{rest}");
    let profile = read_profile(&out);
    let matched = processes(&profile, "covcomm-brief");
    assert_eq!(matched.len(), 20, "{rest}");
    for (&pid, process) in &matched {
        // Exec'd by this test (nothing of ours allocates between its fork and exec), or
        // forked by one of them: exactly its site's calls.
        let calls = process["exact"]["calls"].as_u64().unwrap();
        let bytes = process["exact"]["bytes"].as_u64().unwrap();
        assert_eq!(
            (calls, bytes),
            (CALLS, CALLS * SIZE),
            "pid {pid}: {process:#}"
        );
        let site = if process["coverage"]["since"] == "fork" {
            "forked_site"
        } else {
            "brief_site"
        };
        check_site(&profile, pid, site);
        assert_complete(process, &["exec", "fork"]);
    }
    let pids: Vec<u64> = profile["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert!(
        !pids.contains(&other_pid),
        "the process that does not match is in the profile: {pids:?}"
    );
    assert!(
        profile["stacks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| matched.contains_key(&s["pid"].as_u64().unwrap())),
        "stacks of processes that are not targets"
    );
}

#[test]
fn follow_takes_in_forked_and_execed_processes() {
    tests::require_bpf!();
    let dir = TempDir::new("follow");
    let out = dir.path("follow.json");
    let forker = fixture("forker", &[]);
    let workload = fixture("workload", &[]);
    // Long enough for each child to be attached before it is done, even on a loaded
    // machine (attaching takes 1–26 ms after the fork; #14 is about not waiting at all).
    let iterations: u64 = 1_000_000;
    let output = Command::new(allocscope())
        .args(["record", "--follow", "--confidence", REACH_CONFIDENCE, "-o"])
        .arg(&out)
        .arg("--")
        .arg(&forker)
        .args(["3", &iterations.to_string()])
        .arg(&workload)
        .arg("20000")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "allocscope failed:\n{stderr}");
    let profile = read_profile(&out);
    let processes = profile["processes"].as_array().unwrap();
    let seen: Vec<(u64, &str, u64)> = processes
        .iter()
        .map(|p| {
            let pid = p["pid"].as_u64().unwrap_or(0);
            let calls = p["exact"]["calls"].as_u64().unwrap_or(0);
            (pid, p["command"].as_str().unwrap_or("?"), calls)
        })
        .collect();
    assert_eq!(
        processes.len(),
        5,
        "parent, 3 children, 1 exec'd; seen (pid, command, calls): {seen:?}\n{stderr}"
    );
    let parent = processes[0]["pid"].as_u64().unwrap() as u32;
    // The parent from its first allocation: exactly its own calls.
    assert_eq!(
        site(&profile, parent, "parent_site").len(),
        1,
        "parent_site in the parent"
    );
    let children: Vec<&Value> = processes
        .iter()
        .filter(|p| p["command"] == "forker" && p["pid"] != parent)
        .collect();
    assert_eq!(children.len(), 3, "{processes:#?}");
    for child in children {
        let pid = child["pid"].as_u64().unwrap() as u32;
        let stacks = site(&profile, pid, "child_site");
        assert_eq!(stacks.len(), 1, "child {pid}: {stacks:#?}");
        // Attached within milliseconds of the fork: most of the child's calls are seen,
        // every one seen is attributed to it, and the estimate bounds what was counted.
        let calls = child["exact"]["calls"].as_u64().unwrap();
        assert!(
            calls > iterations / 2 && calls <= iterations + 10,
            "child {pid}: {calls} calls of {iterations}"
        );
        assert_estimate_bounds_exact(child);
    }
    let execed = processes
        .iter()
        .find(|p| p["command"] == "workload")
        .unwrap_or_else(|| panic!("the exec'd workload is missing: {processes:#?}"));
    let pid = execed["pid"].as_u64().unwrap() as u32;
    assert!(!site(&profile, pid, "site_realloc_null").is_empty());
}

#[test]
fn comm_waits_for_a_matching_process_and_takes_it_in() {
    tests::require_bpf!();
    let dir = TempDir::new("comm");
    let out = dir.path("comm.json");
    let renamed = dir.path("reachcomm-wl");
    std::fs::copy(fixture("workload", &[]), &renamed).unwrap();
    let mut recorder = Command::new(allocscope())
        .args([
            "record",
            "--comm",
            "^reachcomm",
            "--interval",
            "64KiB",
            "--confidence",
            REACH_CONFIDENCE,
            "-o",
            out.to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(recorder.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("allocscope: recording ") {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "said: {said}");
        said.push_str(&line);
    }
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
    let profile = read_profile(&out);
    check_workload_profile(&typed(&profile), pid, ROUNDS);
    assert_eq!(process(&profile, pid)["command"], "reachcomm-wl");
}
