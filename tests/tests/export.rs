//! Profiles open in the tools people have: `go tool pprof` reads the pprof export, inferno
//! renders the folded stacks, the SVG is XML naming the sites; `report` converts a saved
//! recording; `--every` writes rotating snapshots.

use std::{path::Path, process::Command, time::Duration};

use tests::{allocscope, fixture, read_profile, run, start_recording, TempDir, Workload};

/// Records 1000 workload rounds at 64 KiB into `out` (format from the extension). The
/// workload frees everything, so folded and SVG show allocated bytes.
fn record(out: &Path, extra: &[&str]) {
    // Unthrottled: counted in-process the workload runs fast enough for the sampling-rate
    // throttle to raise the interval, and the order checks below assume ~600 samples a site.
    let output = Command::new(allocscope())
        .args([
            "record",
            "--interval",
            "64KiB",
            "--max-samples-per-sec",
            "0",
        ])
        .args(["--value", "alloc-bytes"])
        .args(extra)
        .arg("-o")
        .arg(out)
        .arg("--")
        .arg(fixture("workload", &[]))
        .arg("1000")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn go_pprof(args: &[&str], file: &Path) -> String {
    let output = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .output()
        .expect("go tool pprof (Debian golang-go; cargo xtask setup installs it)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The sites in `go tool pprof -top` order.
fn top_sites(top: &str) -> Vec<String> {
    top.lines()
        .filter_map(|line| line.split_whitespace().last())
        .filter(|name| name.starts_with("site_"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn pprof_export_opens_in_go_tool_pprof() {
    tests::require_bpf!();
    let dir = TempDir::new("pprof");
    let file = dir.path("heap.pb.gz");
    record(&file, &[]);
    let raw = go_pprof(&["-raw"], &file);
    assert!(raw.contains("PeriodType: space bytes"), "{raw}");
    assert!(raw.contains("Period: 65536"), "{raw}");
    // Per-process labels pprof can focus on and group by.
    let tags = go_pprof(&["-tags"], &file);
    for tag in ["pid:", "command:", "cgroup:"] {
        assert!(tags.contains(tag), "no {tag} label in\n{tags}");
    }
    // Sample types in Go's heap order, then the peak's (pprof marks the default one
    // "[dflt]").
    let types = raw
        .lines()
        .find(|l| l.starts_with("alloc_objects/count"))
        .expect(&raw);
    let types: Vec<&str> = types
        .split_whitespace()
        .map(|t| t.trim_end_matches("[dflt]"))
        .collect();
    assert_eq!(
        types,
        [
            "alloc_objects/count",
            "alloc_space/bytes",
            "inuse_objects/count",
            "inuse_space/bytes",
            "peak_objects/count",
            "peak_space/bytes"
        ]
    );
    // By bytes: the true totals per round are 81920 (realloc), 61440 (big), 51200 (calloc),
    // 40960 (posix_memalign) ... 4096 (tiny); the top four are far enough apart to keep
    // their order at ~1000 samples each.
    let by_bytes = top_sites(&go_pprof(&["-top", "-sample_index=alloc_space"], &file));
    assert_eq!(
        by_bytes[..4],
        [
            "site_realloc_null",
            "site_periodic_big",
            "site_calloc",
            "site_posix_memalign"
        ],
        "{by_bytes:?}"
    );
    assert_eq!(
        by_bytes.last().map(String::as_str),
        Some("site_periodic_tiny"),
        "{by_bytes:?}"
    );
    assert_eq!(by_bytes.len(), 7);
    // By objects: 200 small allocations per round lead.
    let by_objects = top_sites(&go_pprof(&["-top", "-sample_index=alloc_objects"], &file));
    assert_eq!(by_objects[0], "site_small", "{by_objects:?}");
    // Frees tracked, a command recorded from its start: the default sample type is the
    // live bytes at its peak (all freed by its end: nothing live then).
    let default = go_pprof(&["-top"], &file);
    assert!(default.contains("Type: peak_space"), "{default}");
    assert!(!top_sites(&default).is_empty(), "{default}");
    let at_end = go_pprof(&["-top", "-sample_index=inuse_space"], &file);
    assert!(top_sites(&at_end).is_empty(), "{at_end}");
    // Without free tracking it is alloc_space.
    let alloc_only = dir.path("alloc-only.pb.gz");
    record(&alloc_only, &["--alloc-only"]);
    let default = go_pprof(&["-top"], &alloc_only);
    assert!(default.contains("Type: alloc_space"), "{default}");
}

#[test]
fn folded_renders_with_inferno_and_svg_names_the_sites() {
    tests::require_bpf!();
    let dir = TempDir::new("flame");
    let folded = dir.path("heap.folded");
    record(&folded, &[]);
    let mut options = inferno::flamegraph::Options::default();
    let mut svg = Vec::new();
    inferno::flamegraph::from_files(&mut options, std::slice::from_ref(&folded), &mut svg)
        .expect("inferno renders our folded stacks");
    assert!(String::from_utf8_lossy(&svg).contains("site_periodic_tiny"));

    let svg_file = dir.path("heap.svg");
    record(&svg_file, &[]);
    let text = std::fs::read_to_string(&svg_file).unwrap();
    let xml = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let document = roxmltree::Document::parse_with_options(&text, xml).expect("SVG is XML");
    let titles: Vec<&str> = document
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    for site in [
        "site_small",
        "site_calloc",
        "site_realloc_null",
        "site_periodic_tiny",
    ] {
        assert!(
            titles.iter().any(|t| t.starts_with(site)),
            "{site} not in {titles:?}"
        );
    }
    assert!(
        text.contains("allocscope: workload ("),
        "title names the target"
    );
    assert!(text.contains("mean sampling interval 64.0 KiB"));
}

#[test]
fn report_prints_and_converts_a_saved_recording() {
    tests::require_bpf!();
    let dir = TempDir::new("report");
    let json = dir.path("heap.json");
    record(&json, &[]);
    let output = run(&["report", json.to_str().unwrap(), "--top", "3"]);
    assert!(output.status.success());
    let table = String::from_utf8(output.stdout).unwrap();
    assert!(table.contains("site_realloc_null"), "{table}");
    let allocated = table
        .split("top stacks by estimated allocated bytes:")
        .nth(1)
        .expect("the allocated-bytes table");
    assert_eq!(allocated.matches(" samples  pid ").count(), 3, "{table}");
    // By default as many rows as `record` prints.
    let output = run(&["report", json.to_str().unwrap()]);
    let table = String::from_utf8(output.stdout).unwrap();
    let allocated = table
        .split("top stacks by estimated allocated bytes:")
        .nth(1)
        .expect("the allocated-bytes table");
    assert!(allocated.matches(" samples  pid ").count() <= 10, "{table}");
    // JSON → JSON is the identity; JSON → pprof matches a direct recording's shape. With a
    // file written, the summary goes to stderr (as `record`'s), stdout stays empty.
    let copy = dir.path("copy.json");
    let converted = run(&[
        "report",
        json.to_str().unwrap(),
        "-o",
        copy.to_str().unwrap(),
    ]);
    assert!(converted.status.success());
    assert!(converted.stdout.is_empty());
    assert!(String::from_utf8_lossy(&converted.stderr).contains("top stacks by estimated"));
    assert_eq!(read_profile(&copy), read_profile(&json));
    let pprof = dir.path("converted.pb.gz");
    assert!(run(&[
        "report",
        json.to_str().unwrap(),
        "-o",
        pprof.to_str().unwrap()
    ])
    .status
    .success());
    let top = top_sites(&go_pprof(&["-top", "-sample_index=alloc_space"], &pprof));
    assert_eq!(top[0], "site_realloc_null");
    // Not a profile: exit 2 with a reason.
    let bad = run(&["report", pprof.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not an allocscope/v1 JSON profile"));
}

#[test]
fn every_writes_rotating_snapshots_and_the_last_partial_period() {
    tests::require_bpf!();
    let dir = TempDir::new("snapshots");
    let snapshots = dir.path("snaps");
    // Batches of 20,000 rounds: its unread "progress" lines must not fill the pipe and
    // stop it allocating (see record.rs, duration_limits_the_recording).
    let mut target = Workload::start(20_000, &["--forever"]);
    target.go();
    let pid = target.pid().to_string();
    let (mut recorder, _stderr) = start_recording(&[
        "record",
        "-p",
        &pid,
        "-i",
        "16KiB",
        "--every",
        "1s",
        "--keep",
        "2",
        "-o",
        snapshots.to_str().unwrap(),
    ]);
    // A third snapshot written (so --keep 2 deleted the first): four with the last, partial.
    let mut seen = std::collections::BTreeSet::new();
    let third = tests::wait_until(Duration::from_secs(30), || {
        seen.extend(
            std::fs::read_dir(&snapshots)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name()),
        );
        seen.len() >= 3
    });
    assert!(third, "no third snapshot within 30 s: {seen:?}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) };
    assert!(recorder.wait().unwrap().success());
    let mut names: Vec<String> = std::fs::read_dir(&snapshots)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names.len(),
        2,
        "--keep 2 keeps two of four snapshots: {names:?}"
    );
    assert!(names
        .iter()
        .all(|n| n.starts_with("allocscope-") && n.ends_with(".json")));
    let last = read_profile(&snapshots.join(&names[1]));
    let previous = read_profile(&snapshots.join(&names[0]));
    // Since-start values grow; period values cover the period only.
    let duration = |p: &serde_json::Value| p["duration_seconds"].as_f64().unwrap();
    assert!(duration(&last) > duration(&previous));
    let period = &last["stacks"][0]["period"];
    let seconds = period["seconds"].as_f64().unwrap();
    assert!(seconds < 1.2, "the last period is partial: {seconds}");
    let since_start = last["stacks"][0]["alloc_bytes"]["estimate"]
        .as_f64()
        .unwrap();
    assert!(period["alloc_bytes"]["estimate"].as_f64().unwrap() < since_start);
}
