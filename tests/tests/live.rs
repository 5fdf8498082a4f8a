//! Free tracking on real processes: live bytes per site within bounds at several points in
//! time, reallocs in place and moving, posix_memalign, a leak found by the leak view and
//! nothing else; frees allocscope never saw allocated, free(NULL), a double free and a full
//! live map leave no negative number and are counted.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use serde_json::Value;
use tests::{
    read_profile,
    record::{assert_holds, leaf_is, process_of, site_of, Profile},
    start_recording, typed, wait_until, Fixture, TempDir,
};

/// Keeps the chance that any of the ~25 bound checks misses by bad luck near 0.25%.
const CONFIDENCE: &str = "0.9999";

/// Site → true live bytes after phase 1 of tests/fixtures/live.c.
const PHASE1: [(&str, u64); 9] = [
    ("keep_small", 20000 * 256),
    ("keep_big", 200 * 65536),
    ("churn", 0),
    ("keep_aligned", 2000 * 4096),
    ("grow_seed", 0),
    ("grow", 1000 * 8000),
    ("shrink_seed", 0),
    ("shrink", 1000 * 4000),
    ("leak", 300 * 10000),
];

/// The newest snapshot written after `after`, waiting for it.
fn snapshot_after(dir: &Path, after: SystemTime) -> PathBuf {
    let mut found = None;
    let appeared = wait_until(Duration::from_secs(10), || {
        found = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .filter(|e| e.metadata().unwrap().modified().unwrap() > after)
            .map(|e| e.path())
            .max();
        found.is_some()
    });
    assert!(appeared, "no snapshot after the phase");
    found.unwrap()
}

/// Checks every site's live bytes against its truth (`true_live(site)`).
fn check_live(profile: &Profile, pid: u32, sites: &[(&str, u64)], phase: &str) {
    for &(site, truth) in sites {
        let stacks = site_of(profile, pid, site);
        assert_eq!(stacks.len(), 1, "{phase} {site}: {stacks:#?}");
        let live = stacks[0].inuse_bytes.expect("frees tracked");
        assert_holds(
            &live,
            truth as f64,
            &format!("{phase} {site} live bytes"),
            "",
        );
    }
}

#[test]
fn live_heap_per_site_over_time_and_the_leak_view() {
    tests::require_bpf!();
    let dir = TempDir::new("live");
    let snapshots = dir.path("snapshots");
    let mut target = Fixture::start("live", &["--age", "3"], &[]);
    target.expect("ready");
    let pid = target.pid().to_string();
    let (mut recorder, _stderr) = start_recording(&[
        "record",
        "-p",
        &pid,
        "-i",
        "16KiB",
        "--confidence",
        CONFIDENCE,
        "--every",
        "250ms",
        "--leaks-older-than",
        "2s",
        "-o",
        snapshots.to_str().unwrap(),
    ]);
    target.go();
    target.expect("phase1");
    // A snapshot taken a whole period after the phase ended has all of its events.
    let after = SystemTime::now() + Duration::from_millis(300);
    std::thread::sleep(Duration::from_millis(300));
    let phase1 = typed(&read_profile(&snapshot_after(&snapshots, after)));
    check_live(&phase1, target.pid(), &PHASE1, "phase 1");
    assert_eq!(phase1.losses.live_map_full, 0);

    target.go();
    target.expect("phase2");
    let after = SystemTime::now() + Duration::from_millis(300);
    std::thread::sleep(Duration::from_millis(300));
    let phase2 = typed(&read_profile(&snapshot_after(&snapshots, after)));
    let only_leak: Vec<(&str, u64)> = PHASE1
        .iter()
        .map(|&(site, truth)| (site, if site == "leak" { truth } else { 0 }))
        .collect();
    check_live(&phase2, target.pid(), &only_leak, "phase 2");

    target.go();
    target.expect("done");
    assert!(recorder.wait().unwrap().success());
    let last = typed(&read_profile(&snapshot_after(
        &snapshots,
        SystemTime::now() - Duration::from_secs(1),
    )));
    let mut at_exit = only_leak.clone();
    at_exit.push(("keep_young", 1000 * 4096));
    check_live(&last, target.pid(), &at_exit, "exit");
    // Leak view: the 3 s old leak, not the young blocks (nor anything freed).
    assert_eq!(last.leaks_older_than_seconds, Some(2.0));
    let leaks: Vec<_> = last.stacks.iter().filter(|s| s.leak.is_some()).collect();
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    assert!(leaf_is(leaks[0], "leak"), "{:?}", leaks[0].frames);
    let leak = leaks[0].leak.expect("leak values");
    let leaked = &leak.inuse_bytes;
    assert!(leaked.lower <= 3e6 && 3e6 <= leaked.upper, "{leaked:?}");
    assert!(leak.oldest_seconds >= 2.0, "{leak:?}");
    let process = process_of(&last, target.pid());
    assert!(process.rss_bytes.is_some_and(|rss| rss > 0));
    assert_eq!(process.untracked_samples, 0);
}

/// Every number in a JSON document, for the no-negative check.
fn numbers(value: &Value, out: &mut Vec<f64>) {
    match value {
        Value::Number(n) => out.push(n.as_f64().unwrap()),
        Value::Array(items) => items.iter().for_each(|v| numbers(v, out)),
        Value::Object(fields) => fields.values().for_each(|v| numbers(v, out)),
        _ => {}
    }
}

#[test]
fn unknown_frees_double_frees_and_a_full_live_map_are_harmless_and_counted() {
    tests::require_bpf!();
    let dir = TempDir::new("frees");
    let out = dir.path("frees.json");
    // The double free passes glibc's checks only without the tcache.
    let mut target = Fixture::start(
        "frees",
        &[],
        &[("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0")],
    );
    target.expect("ready");
    let pid = target.pid().to_string();
    // Interval 1: every allocation is sampled, so the live numbers are exact counts.
    let (mut recorder, stderr) = start_recording(&[
        "record",
        "-p",
        &pid,
        "-i",
        "1",
        "--max-samples-per-sec",
        "0",
        "--max-tracked",
        "500",
        "-o",
        out.to_str().unwrap(),
    ]);
    target.go();
    target.expect("done");
    assert!(
        target.child.wait().unwrap().success(),
        "the target survived its double free"
    );
    assert!(recorder.wait().unwrap().success());
    // Every number in the file as written (a reader's view): none negative, none infinite.
    let profile = read_profile(&out);
    let mut all = Vec::new();
    numbers(&profile, &mut all);
    assert!(
        all.iter().all(|n| *n >= 0.0 && n.is_finite()),
        "a negative or non-finite number"
    );
    // 2000 kept blocks, at most 500 tracked at once: the rest counted, never silent.
    let profile = typed(&profile);
    let untracked = profile.processes[0].untracked_samples;
    let full = profile.losses.live_map_full;
    assert_eq!(untracked, full);
    assert!((1500..=2000).contains(&full), "live map full {full} times");
    let kept = site_of(&profile, target.pid(), "kept_block")[0];
    let live = kept.inuse_bytes.expect("frees tracked").estimate;
    assert!(
        live <= 500.0 * 64.0 && live >= (2000 - full) as f64 * 64.0 - 1.0,
        "live {live}"
    );
    // Frees of blocks allocated before attach took nothing away from anything.
    assert!(site_of(&profile, target.pid(), "early_block").is_empty());
    let mut text = String::new();
    std::io::Read::read_to_string(&mut { stderr }, &mut text).unwrap();
    assert!(text.contains("incomplete:"), "{text}");
}
