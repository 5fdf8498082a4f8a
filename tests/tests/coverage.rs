//! Coverage of processes that come and go (#14): every process `--follow` takes in and
//! every one `--comm` matches at its exec is counted from its first allocation, however
//! briefly it lives, because the kernel adds it to the followed set before it runs.
//!
//! The processes are `brief` (tests/fixtures/brief.c): they allocate from their first
//! instruction and exit within milliseconds, so anything that attaches after the fork or
//! exec misses calls, and the exact counters show it.

use std::{collections::BTreeMap, process::Command};

use serde_json::Value;
use tests::{allocscope, bpf_available, fixture, read_profile, start_recording, TempDir};

/// Confidence of every bound checked: about 200 intervals are checked per test, so each
/// must fail rarely for the test not to.
const CONFIDENCE: &str = "0.999999";
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
    if !bpf_available("follow_counts_a_hundred_short_lived_processes_from_their_first_allocation") {
        return;
    }
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
        .args([
            "record",
            "--follow",
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
    if !bpf_available("comm_counts_processes_started_after_it_from_their_exec") {
        return;
    }
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
