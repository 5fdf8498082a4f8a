//! `--max-overhead`: duty-cycled probes on a real process. The benchmark's loop does a
//! known number of 64-byte allocations with ~20 µs of arithmetic between them; the probes
//! are attached in some slots only, so the exact counters see part of the calls, and the
//! estimate, weighted by each target's work per stratum, must bound the whole.

use tests::{allocscope, fixture, Record};

/// Allocations per chunk and chunks: 200,000 calls, ~5 s.
const PER_CHUNK: u64 = 200;
const CHUNKS: u64 = 1000;
/// Arithmetic steps between allocations: ~20 µs, twenty times the probes' cost per call
/// (~1 µs), so the on slots' own work stays far above zero over the whole cost range
/// the bounds allow for (`COST_RANGE` in allocscope-engine's `duty::estimate`) even when a cost
/// window measures a passing spike. At ~1 µs and ~3 µs of work a cost measured high on a
/// loaded CI machine made that own work possibly nothing, and the upper bound rightly
/// infinite (CI, 2026-11-25, twice).
const WORK: u64 = 20_000;

#[test]
fn a_duty_cycled_recording_bounds_what_it_did_not_see() {
    tests::require_bpf!();
    let loop_args = [PER_CHUNK.to_string(), CHUNKS.to_string(), WORK.to_string()];
    let loop_args: Vec<&str> = loop_args.iter().map(String::as_str).collect();
    let recorded = Record::command(fixture("bench_loop", &[]), &loop_args)
        // Bounds at 99.99%: at 95% they would miss the truth in one run of 20 by design
        // (their calibration is the simulation's to prove, duty::estimate).
        // The probes cost ~5% of this loop's own work: 1% makes them cycle.
        .flags(&["-v", "--alloc-only", "--max-overhead", "1%"])
        .flags(&["--confidence", "0.9999"])
        .input(b"go\n")
        .run();
    let (profile, stderr) = (&recorded.profile, &recorded.stderr);
    let duty = profile.sampling.duty.as_ref().expect("sampling.duty");
    assert_eq!(duty.max_overhead, 0.01, "{stderr}");
    assert!(duty.largest_stratum_slots > 1, "never cycled: {duty:?}");
    assert!(duty.strata >= 10, "{duty:?}");
    assert!(!duty.on_slots.is_empty(), "{duty:?}");
    assert!(
        duty.observed_share > 0.0 && duty.observed_share < 0.9,
        "{duty:?}"
    );
    assert!(stderr.contains("duty cycle: attaching takes"), "{stderr}");

    let process = recorded.only_process();
    let truth_calls = (PER_CHUNK * CHUNKS) as f64;
    let truth = truth_calls * 64.0;
    let own = process.observed_share.expect("observed_share");
    assert!(own > 0.0 && own < 1.0, "{process:?}");
    // The counters saw the on slots only.
    let exact_calls = process.exact.calls as f64;
    assert!(
        exact_calls > 0.0 && exact_calls < truth_calls * 0.9,
        "{process:?}"
    );
    // The loop's other allocations (its chunk timings, stdio) are a few KiB.
    let slack = 1024.0 * 1024.0;
    for (field, estimate, truth) in [
        ("alloc_bytes", &process.alloc_bytes, truth),
        ("alloc_objects", &process.alloc_objects, truth_calls),
    ] {
        assert!(
            estimate.lower <= truth + slack,
            "{field}: {estimate:?} vs {truth}\n{stderr}"
        );
        assert!(
            estimate.upper.is_finite(),
            "{field}: no upper bound: {estimate:?}\n{stderr}"
        );
        assert!(
            truth <= estimate.upper,
            "{field}: {estimate:?} vs {truth}\n{stderr}"
        );
    }
    // `report` reads the profile back (an unbounded `upper` is `null` in JSON) and says
    // how it was recorded.
    let report = std::process::Command::new(allocscope())
        .arg("report")
        .arg(&recorded.file)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&report.stdout).into_owned()
        + &String::from_utf8_lossy(&report.stderr);
    assert!(report.status.success(), "{said}");
    assert!(said.contains("duty-cycled (--max-overhead 1%)"), "{said}");
    // Stacks are estimated the same way: the loop's one site holds nearly all.
    let top = &profile.stacks[0].alloc_bytes;
    assert!(top.lower <= truth + slack, "{top:?} vs {truth}");
    assert!(top.upper >= truth * 0.99, "{top:?} vs {truth}");
}
