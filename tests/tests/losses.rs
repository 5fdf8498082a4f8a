//! A number never hides a loss: samples the kernel could not deliver (the ring buffer was
//! full) stay in their process's totals, whose bounds still hold the exact counts, and the
//! profile says how many were lost and where they went.

use serde_json::Value;
use tests::{allocscope, assert_estimate_bounds_exact, fixture, read_profile, TempDir};

/// Records a storm (the workload fixture, `rounds` rounds) with the smallest ring buffer,
/// so that samples are lost, and returns the profile.
fn storm(dir: &TempDir, interval: &str, extra: &[&str], rounds: &str) -> Value {
    let out = dir.path(&format!("storm-{interval}.json"));
    let output = std::process::Command::new(allocscope())
        // A storm that must overflow the ring buffer: the throttle would prevent it.
        .args(["record", "--ring-buffer", "64KiB", "--confidence", "0.9999"])
        .args(["--max-samples-per-sec", "0"])
        .args(["-i", interval])
        .args(extra)
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(fixture("workload", &[]))
        .arg(rounds)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let profile = read_profile(&out);
    let lost = profile["losses"]["ringbuf_full"].as_u64().unwrap();
    assert!(
        lost > 0,
        "the storm lost nothing; make it bigger:\n{stderr}"
    );
    assert!(
        stderr.contains("samples lost without a stack"),
        "the summary says so:\n{stderr}"
    );
    profile
}

fn check_losses_counted(profile: &Value) {
    let process = &profile["processes"][0];
    let lost = profile["losses"]["ringbuf_full"].as_u64().unwrap();
    let unrecorded = profile["losses"]["lost_unrecorded"].as_u64().unwrap();
    assert_eq!(unrecorded, 0, "16384 (size, interval) keys are plenty here");
    assert_eq!(process["lost_samples"].as_u64().unwrap(), lost);
    let lost_stacks: Vec<&Value> = profile["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["lost"].as_bool() == Some(true))
        .collect();
    assert_eq!(lost_stacks.len(), 1, "one pseudo-stack per process");
    assert_eq!(lost_stacks[0]["samples"].as_u64().unwrap(), lost);
    assert_eq!(
        lost_stacks[0]["frames"][0]["function"].as_str().unwrap(),
        "[samples lost: ring buffer full]"
    );
    let stack_samples: u64 = profile["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["samples"].as_u64().unwrap())
        .sum();
    assert_eq!(stack_samples, process["samples"].as_u64().unwrap());
    assert_estimate_bounds_exact(process);
}

#[test]
fn every_call_sampled_and_some_lost_still_sums_to_the_exact_total() {
    tests::require_bpf!();
    let dir = TempDir::new("losses-storm");
    // At an interval of one byte every call is sampled: the estimate is a plain sum.
    let profile = storm(&dir, "1", &["--alloc-only"], "3000");
    check_losses_counted(&profile);
    let process = &profile["processes"][0];
    assert_eq!(
        process["samples"].as_u64(),
        process["exact"]["calls"].as_u64(),
        "one sample per call, lost ones included"
    );
    assert_eq!(
        process["alloc_bytes"]["estimate"].as_f64().unwrap(),
        process["exact"]["bytes"].as_f64().unwrap()
    );
}

#[test]
fn bounds_hold_the_exact_total_when_samples_are_lost() {
    tests::require_bpf!();
    let dir = TempDir::new("losses-bounds");
    // Frees tracked too: a lost sample's block is forgotten by the kernel as well.
    let profile = storm(&dir, "256", &[], "5000");
    check_losses_counted(&profile);
    let process = &profile["processes"][0];
    assert!(
        process["inuse_bytes"].is_object(),
        "live numbers still reported"
    );
}

#[test]
fn a_million_distinct_stacks_stay_bounded_and_counted() {
    tests::require_bpf!();
    let dir = TempDir::new("losses-paths");
    let out = dir.path("paths.json");
    // 2^20 calls, each reaching `site` through a call path of its own.
    let output = std::process::Command::new(allocscope())
        .args([
            "record",
            "-i",
            "1",
            "--alloc-only",
            "--max-stacks",
            "500",
            // Every call sampled, on purpose.
            "--max-samples-per-sec",
            "0",
            "-o",
        ])
        .arg(&out)
        .arg("--")
        .arg(fixture("paths", &[]))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // SAFETY: rusage is plain integers: all zeros is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills a live struct of the right type.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let peak_mib = usage.ru_maxrss / 1024;
    assert!(
        peak_mib < 256,
        "peak RSS {peak_mib} MiB (it grew to 4 GiB without a limit)"
    );
    let profile = read_profile(&out);
    let stacks = profile["stacks"].as_array().unwrap();
    let cut: Vec<&Value> = stacks
        .iter()
        .filter(|s| s["cut_to_leaf"].as_bool() == Some(true))
        .collect();
    assert!(!cut.is_empty(), "some stacks were cut to their leaf");
    // Every stack beyond the cap is cut to its leaf: the paths to `site`, and any other new
    // one after the cap (the stdio buffer `puts` allocates at the end, when its sample is
    // not lost).
    assert!(
        cut.iter()
            .all(|s| s["frames"].as_array().unwrap().len() == 1),
        "{cut:#?}"
    );
    assert!(
        cut.iter().any(|s| s["frames"][0]["function"] == "site"),
        "{cut:#?}"
    );
    // 500 whole stacks, the leaf stacks beyond them, the lost samples' pseudo-stack.
    assert!(stacks.len() <= 500 + 3, "{} stacks", stacks.len());
    assert!(profile["losses"]["stacks_cut_to_leaf"].as_u64().unwrap() > 0);
    assert!(stderr.contains("cut to their leaf frame"), "{stderr}");
    let process = &profile["processes"][0];
    assert_eq!(
        process["alloc_bytes"]["estimate"].as_f64().unwrap(),
        process["exact"]["bytes"].as_f64().unwrap(),
        "every sample still counted"
    );
}

/// A storm the throttle tames: at `-i 256` the workload would send tens of thousands of
/// samples a second; `--max-samples-per-sec 2000` raises the interval, samples are
/// weighted by the interval each was drawn at, and the estimate still bounds the exact
/// total.
#[test]
fn the_throttle_raises_the_interval_and_the_estimate_still_holds() {
    tests::require_bpf!();
    let dir = TempDir::new("losses-throttle");
    let out = dir.path("throttle.json");
    let output = std::process::Command::new(allocscope())
        .args(["record", "-v", "-i", "256", "--alloc-only"])
        .args(["--max-samples-per-sec", "2000", "--confidence", "0.9999"])
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(fixture("workload", &[]))
        .arg("6000")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let profile = read_profile(&out);
    let throttle = &profile["sampling"]["throttle"];
    assert_eq!(throttle["max_samples_per_second"], 2000, "{stderr}");
    let largest = throttle["largest_interval_bytes"].as_u64().unwrap();
    assert!(largest > 256, "{throttle}");
    assert!(
        !throttle["changes"].as_array().unwrap().is_empty(),
        "{throttle}"
    );
    assert!(stderr.contains("sampling interval now"), "{stderr}");
    assert_eq!(profile["sampling"]["mean_interval_bytes"], 256);
    let process = &profile["processes"][0];
    assert_estimate_bounds_exact(process);
    // Fewer samples than calls sampled at 256 bytes would have given.
    let at_256 = process["exact"]["bytes"].as_f64().unwrap() / 256.0;
    assert!(
        (process["samples"].as_u64().unwrap() as f64) < at_256 / 2.0,
        "{process}"
    );
}
