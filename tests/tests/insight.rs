//! What a recording answers beyond totals, on a real process with known sites
//! (tests/fixtures/lifecycle.c, on a fixed 1 ms schedule): which stacks grow, how long
//! blocks live, what sizes and which threads allocate; and `allocscope diff` of two
//! recordings, one with a site doubled and one removed.
//!
//! Bounds are asked at 99.9% here: a test asserts that *none* of several non-growing
//! stacks is flagged, and at 95% each may be in 2.5% of runs (their calibration is the
//! simulations' to prove: stats::growth, stats::difference).

use std::process::Command;

use allocscope_model::schema::{Profile, StackProfile};
use tests::{allocscope, fixture_as, record::leaf_is, Record, Recorded, TempDir};

/// Seconds the fixture runs (its schedule: 1000 iterations a second).
const SECONDS: u64 = 4;
const ITERATIONS: f64 = (SECONDS * 1000) as f64;

fn record(variant: &str, dir: &TempDir, interval: &str) -> Recorded {
    record_as("lifecycle", variant, dir, interval)
}

/// [`record`] with the fixture built under the file name `binary`.
fn record_as(binary: &str, variant: &str, dir: &TempDir, interval: &str) -> Recorded {
    let truths = dir.path(&format!("truths-{binary}-{variant}"));
    let truths = truths.to_str().unwrap();
    let seconds = SECONDS.to_string();
    let recorded = Record::command(
        fixture_as("lifecycle", binary, &["-pthread"]),
        &[truths, &seconds, variant],
    )
    .flags(&["--tick", "250ms", "-i", interval, "--confidence", "0.999"])
    .input(b"go\n")
    .run();
    let said = std::fs::read_to_string(truths).expect("the fixture wrote its truths");
    assert_eq!(said.trim(), format!("iterations {}", ITERATIONS as u64));
    recorded
}

fn stacks<'a>(profile: &'a Profile, function: &str) -> Vec<&'a StackProfile> {
    let found: Vec<&StackProfile> = profile
        .stacks
        .iter()
        .filter(|s| leaf_is(s, function))
        .collect();
    assert!(!found.is_empty(), "no {function} stack");
    found
}

fn within(truth: f64, lower: f64, upper: f64, what: &str) {
    assert!(
        lower <= truth && truth <= upper,
        "{what}: truth {truth} outside [{lower}, {upper}]"
    );
}

#[test]
fn a_recording_answers_what_grows_how_long_blocks_live_and_who_allocates_what() {
    tests::require_bpf!();
    let dir = TempDir::new("insight");
    let recorded = record("a", &dir, "64KiB");
    let profile = &recorded.profile;
    let stderr = &recorded.stderr;

    // Growth: leak_site's two mallocs leak 4096 bytes each per iteration, 4.1 MB/s each.
    for stack in stacks(profile, "leak_site") {
        let growth = stack.growth.expect("growth");
        assert!(growth.growing, "{growth:?}\n{stderr}");
        let e = growth.bytes_per_second;
        // The fixture starts a few ms after the recording and the last tick may fall
        // after its end: a few percent either way.
        within(
            4096.0 * 1000.0,
            e.lower * 0.95,
            e.upper * 1.05,
            "leak slope",
        );
    }
    for function in [
        "steady_site",
        "temporary_site",
        "held_site",
        "sized_site",
        "shared_site",
        "changed_site",
        "removed_site",
    ] {
        for stack in stacks(profile, function) {
            let growth = stack.growth.expect("growth");
            assert!(!growth.growing, "{function} flagged growing: {growth:?}");
        }
    }
    let process = recorded.only_process();
    assert!(process.growth.is_some_and(|g| g.growing), "{process:?}");
    // The site sums its two stacks: one row, twice the slope.
    let site = profile
        .sites
        .iter()
        .find(|s| s.frames[0].function.as_deref() == Some("leak_site"))
        .expect("the leak_site site");
    assert_eq!(site.stacks, 2, "{site:?}");
    let growth = site.growth.expect("the site's growth");
    assert!(growth.growing, "{growth:?}");
    let e = growth.bytes_per_second;
    within(
        2.0 * 4096.0 * 1000.0,
        e.lower * 0.95,
        e.upper * 1.05,
        "the site's slope",
    );
    let row = stderr
        .lines()
        .skip_while(|l| !l.starts_with("growing sites"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        row.contains("leak_site ← ") && row.ends_with("(2 stacks)"),
        "{stderr}"
    );

    // Lifetimes: temporary_site's blocks are freed at once, held_site's after ~50 ms (the
    // last 50 of 4000 are still in use at the end).
    // (Nearly all: a thread preempted between its malloc and its free, on a loaded
    // machine, holds a block for longer.)
    for stack in stacks(profile, "temporary_site") {
        let l = stack.lifetimes.expect("lifetimes");
        let within_1ms = l.freed_within_1ms;
        assert!(
            within_1ms.upper >= 0.999 && within_1ms.estimate > 0.9,
            "{l:?}"
        );
        assert!(l.p50_seconds.unwrap() <= 1e-3, "{l:?}");
    }
    let held = stacks(profile, "held_site")[0]
        .lifetimes
        .expect("lifetimes");
    let kept = 50.0 / ITERATIONS;
    within(
        1.0 - kept,
        held.freed_within_1s.lower,
        held.freed_within_1s.upper,
        "held <1s",
    );
    within(
        0.0,
        held.freed_within_1ms.lower,
        held.freed_within_1ms.upper,
        "held <1ms",
    );
    within(
        kept,
        held.still_in_use.lower,
        held.still_in_use.upper,
        "held in use",
    );
    let p50 = held.p50_seconds.unwrap();
    assert!((0.03..=0.14).contains(&p50), "held p50 {p50}");
    assert!(stderr.contains("temporary allocations"), "{stderr}");

    // Sizes: sized_site asks for 10 × 24 bytes and 1 × 1000 per iteration.
    let mut classes: Vec<(u64, u64, f64, f64)> = Vec::new();
    for stack in stacks(profile, "sized_site") {
        for class in &stack.sizes {
            let e = class.alloc_bytes;
            classes.push((class.from_bytes, class.to_bytes, e.lower, e.upper));
        }
    }
    classes.sort_by_key(|c| c.0);
    assert_eq!(classes.len(), 2, "{classes:?}");
    assert_eq!((classes[0].0, classes[0].1), (17, 32));
    within(
        24.0 * 10.0 * ITERATIONS,
        classes[0].2,
        classes[0].3,
        "24-byte class",
    );
    assert_eq!((classes[1].0, classes[1].1), (513, 1024));
    within(
        1000.0 * ITERATIONS,
        classes[1].2,
        classes[1].3,
        "1000-byte class",
    );

    // Threads: alpha allocates 2 × 2048 bytes per iteration from shared_site, beta 1 ×.
    let shared = stacks(profile, "shared_site");
    assert_eq!(shared.len(), 1);
    let threads = &shared[0].threads;
    let named = |name: &str| {
        threads
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no thread {name}: {threads:?}"))
    };
    let (alpha, beta) = (named("alpha"), named("beta"));
    within(
        2.0 * 2048.0 * ITERATIONS,
        alpha.alloc_bytes.lower,
        alpha.alloc_bytes.upper,
        "alpha",
    );
    within(
        2048.0 * ITERATIONS,
        beta.alloc_bytes.lower,
        beta.alloc_bytes.upper,
        "beta",
    );
    assert_ne!(alpha.tid, beta.tid);

    // Timeline: 16 points of 250 ms (no merging under 64); the process's in-use bytes
    // rise with the leak; the leaking stacks have theirs.
    let timeline = process.timeline.as_ref().expect("process timeline");
    assert_eq!(timeline.seconds_per_point, 0.25);
    assert!(
        (15..=17).contains(&timeline.inuse_bytes.len()),
        "{timeline:?}"
    );
    // From the second point to the last the leak adds 8.19 MB/s (the steady site's 8.2 MB
    // sit in both): the rise's bounds (the two points' bounds combined) must hold it. The
    // fixture starts a few ms after the recording and the last point may close after its
    // end: 15% less to 5% more. (A ratio of the two points, asked before, failed once in
    // CI where sampling noise put the first point 7% high: 2.94 against 3.)
    let last = timeline.inuse_bytes.len() - 1;
    let seconds = timeline.at_seconds[last] - timeline.at_seconds[1];
    let rise = 2.0 * 4096.0 * 1000.0 * seconds;
    let rise_lower = timeline.inuse_lower[last] - timeline.inuse_upper[1];
    let rise_upper = timeline.inuse_upper[last] - timeline.inuse_lower[1];
    assert!(
        rise_lower <= rise * 1.05 && rise * 0.85 <= rise_upper,
        "rise {rise} outside [{rise_lower}, {rise_upper}]: {timeline:?}"
    );
    assert!(stacks(profile, "leak_site")
        .iter()
        .all(|s| s.timeline.is_some()));
}

fn diff(base: &Recorded, new: &Recorded, extra: &[&str]) -> (String, Option<i32>) {
    let output = Command::new(allocscope())
        .arg("diff")
        .arg(&base.file)
        .arg(&new.file)
        .args(["--confidence", "0.999"])
        .args(extra)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (said, output.status.code())
}

#[test]
fn diff_flags_exactly_the_doubled_and_the_removed_site() {
    tests::require_bpf!();
    let dir = TempDir::new("diff");
    let a = record("a", &dir, "16KiB");
    let again = record("a", &dir, "16KiB");
    let b = record("b", &dir, "16KiB");

    let out = dir.path("diff.json");
    let (said, code) = diff(
        &a,
        &b,
        &["--fail-on-growth", "50", "-o", out.to_str().unwrap()],
    );
    assert_eq!(
        code,
        Some(1),
        "changed_site doubled: the gate fails\n{said}"
    );
    assert!(
        said.contains("significant growth above 50%: changed_site"),
        "{said}"
    );
    let found: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let significant: Vec<(String, f64)> = found["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["alloc_change"]["significant"] == true)
        .map(|c| {
            let leaf = c["key"][1].as_str().unwrap().to_owned();
            (leaf, c["alloc_change"]["estimate"].as_f64().unwrap())
        })
        .collect();
    let leaves: Vec<&str> = significant.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(leaves.len(), 2, "{significant:?}\n{said}");
    assert!(
        leaves.contains(&"changed_site") && leaves.contains(&"removed_site"),
        "{said}"
    );
    // Two whole runs of a command: their totals are compared.
    assert_eq!(found["basis"], "per_run", "{found}");
    assert!(
        said.contains("compared: bytes allocated per run: each recording is a whole run"),
        "{said}"
    );
    for (leaf, change) in &significant {
        // changed_site: +512 bytes per iteration; removed_site: −512.
        let truth = if leaf == "changed_site" {
            512.0
        } else {
            -512.0
        } * ITERATIONS;
        let c = found["stacks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["key"][1] == leaf.as_str())
            .unwrap();
        let (lower, upper) = (
            c["alloc_change"]["lower"].as_f64().unwrap(),
            c["alloc_change"]["upper"].as_f64().unwrap(),
        );
        within(truth, lower, upper, leaf);
        assert_eq!(change.signum(), truth.signum());
    }

    // Two runs of the same workload: nothing significant, the gate passes.
    let (said, code) = diff(&a, &again, &["--fail-on-growth", "50"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("stacks: 0 of"), "{said}");
    // Reversed, removed_site is new and changed_site halves: the gate fails on the new one.
    let (said, code) = diff(&b, &a, &["--fail-on-growth", "50"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("significant growth above 50%: removed_site"),
        "{said}"
    );
    assert!(!said.contains("above 50%: changed_site"), "{said}");

    // Bad input: a clear error, exit 2.
    let (said, code) = diff(&a, &b, &["--fail-on-growth", "-5"]);
    assert_eq!(code, Some(2), "{said}");
}

/// A program that spins until dropped, on a CPU of its own.
struct Hog(std::process::Child);

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The same run of a program, once alone and once while two other programs keep both CPUs
/// busy: the busy run takes longer and allocates the same. Compared per run (both are whole
/// runs of a command), nothing changed and the gate passes, both ways; `--per-second`
/// compares rates, as asked.
#[test]
fn a_run_on_a_busy_machine_is_no_change() {
    tests::require_bpf!();
    let run = || {
        Record::command(tests::fixture("workload", &[]), &["2000"])
            .flags(&["-i", "16KiB"])
            .run()
    };
    let alone = run();
    let hogs: Vec<Hog> = (0..2)
        .map(|_| {
            Hog(Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap())
        })
        .collect();
    let busy = run();
    drop(hogs);
    eprintln!(
        "alone {:.2} s, busy {:.2} s",
        alone.profile.duration_seconds, busy.profile.duration_seconds
    );
    for (base, new) in [(&alone, &busy), (&busy, &alone)] {
        let (said, code) = diff(base, new, &["--fail-on-growth", "10"]);
        assert_eq!(code, Some(0), "{said}");
        assert!(said.contains("stacks: 0 of"), "{said}");
        assert!(said.contains("functions: 0 of"), "{said}");
        assert!(
            said.contains("compared: bytes allocated per run: each recording is a whole run"),
            "{said}"
        );
    }
    let (said, _) = diff(&alone, &busy, &["--per-second"]);
    assert!(
        said.contains("compared: bytes allocated per second, as asked"),
        "{said}"
    );
}

#[test]
fn diff_matches_the_same_program_under_another_file_name() {
    tests::require_bpf!();
    let dir = TempDir::new("diff-renamed");
    let a = record("a", &dir, "16KiB");
    let renamed = record_as("lifecycle-v2", "a", &dir, "16KiB");
    assert_eq!(renamed.profile.processes[0].command, "lifecycle-v2");
    // Matched by their frames: nothing new, nothing gone, the gate passes.
    let out = dir.path("renamed.json");
    let (said, code) = diff(
        &a,
        &renamed,
        &["--fail-on-growth", "50", "-o", out.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("stacks: 0 of"), "{said}");
    let found: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    // A stack sampled in both runs is one comparison, shown with both names.
    let both: Vec<&serde_json::Value> = found["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["base_alloc"].as_f64() > Some(0.0))
        .filter(|c| c["new_alloc"].as_f64() > Some(0.0))
        .collect();
    assert!(both.len() >= 4, "{found}");
    for stack in both {
        assert_eq!(
            stack["commands"],
            serde_json::json!(["lifecycle-v2", "lifecycle"]),
            "{stack}"
        );
    }
    // Within each command only, every stack is new: the gate fails.
    let (said, code) = diff(&a, &renamed, &["--fail-on-growth", "50", "--by-command"]);
    assert_eq!(code, Some(1), "{said}");
}
