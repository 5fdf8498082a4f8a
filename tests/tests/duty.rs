//! `--max-overhead`: duty-cycled probes on a real process. The benchmark's loop does a
//! known number of 64-byte allocations with ~1 µs of arithmetic between them; the probes
//! are attached in some slots only, so the exact counters see part of the calls, and the
//! estimate, weighted by each target's work per stratum, must bound the whole.

use std::{io::Write as _, process::Stdio};

use tests::{allocscope, fixture, read_profile, TempDir};

/// Allocations per chunk and chunks: 6 million calls, ~7 s.
const PER_CHUNK: u64 = 2000;
const CHUNKS: u64 = 3000;

#[test]
fn a_duty_cycled_recording_bounds_what_it_did_not_see() {
    tests::require_bpf!();
    let dir = TempDir::new("duty");
    let out = dir.path("duty.json");
    let mut child = std::process::Command::new(allocscope())
        // Bounds at 99.99%: at 95% they would miss the truth in one run of 20 by design
        // (their calibration is the simulation's to prove, stats::duty).
        .args(["record", "-v", "--alloc-only", "--max-overhead", "10%"])
        .args(["--confidence", "0.9999"])
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(fixture("bench_loop", &[]))
        .args([PER_CHUNK.to_string(), CHUNKS.to_string(), "1000".to_owned()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let profile = read_profile(&out);
    let duty = &profile["sampling"]["duty"];
    assert_eq!(duty["max_overhead"], 0.1, "{stderr}");
    assert!(
        duty["largest_stratum_slots"].as_u64().unwrap() > 1,
        "never cycled: {duty}"
    );
    assert!(duty["strata"].as_u64().unwrap() >= 10, "{duty}");
    assert!(!duty["on_slots"].as_array().unwrap().is_empty(), "{duty}");
    let share = duty["observed_share"].as_f64().unwrap();
    assert!(share > 0.0 && share < 0.9, "{duty}");
    assert!(stderr.contains("duty cycle: attaching takes"), "{stderr}");

    let process = &profile["processes"][0];
    let truth_calls = (PER_CHUNK * CHUNKS) as f64;
    let truth = truth_calls * 64.0;
    let own = process["observed_share"].as_f64().unwrap();
    assert!(own > 0.0 && own < 1.0, "{process}");
    // The counters saw the on slots only.
    let exact_calls = process["exact"]["calls"].as_f64().unwrap();
    assert!(
        exact_calls > 0.0 && exact_calls < truth_calls * 0.9,
        "{process}"
    );
    // The loop's other allocations (its chunk timings, stdio) are a few KiB.
    let slack = 1024.0 * 1024.0;
    for (field, truth) in [("alloc_bytes", truth), ("alloc_objects", truth_calls)] {
        let estimate = &process[field];
        let lower = estimate["lower"].as_f64().unwrap();
        let upper = estimate["upper"].as_f64();
        assert!(
            lower <= truth + slack,
            "{field}: {estimate} vs {truth}\n{stderr}"
        );
        let upper = upper.unwrap_or_else(|| panic!("{field}: no upper bound: {estimate}"));
        assert!(truth <= upper, "{field}: {estimate} vs {truth}\n{stderr}");
    }
    // `report` reads the profile back (an unbounded `upper` is `null` in JSON) and says
    // how it was recorded.
    let report = std::process::Command::new(allocscope())
        .arg("report")
        .arg(&out)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&report.stdout).into_owned()
        + &String::from_utf8_lossy(&report.stderr);
    assert!(report.status.success(), "{said}");
    assert!(said.contains("duty-cycled (--max-overhead 10%)"), "{said}");
    // Stacks are estimated the same way: the loop's one site holds nearly all.
    let stacks = profile["stacks"].as_array().unwrap();
    let top = &stacks[0]["alloc_bytes"];
    assert!(
        top["lower"].as_f64().unwrap() <= truth + slack,
        "{top} vs {truth}"
    );
    assert!(
        top["upper"]
            .as_f64()
            .is_none_or(|upper| upper >= truth * 0.99),
        "{top} vs {truth}"
    );
}
