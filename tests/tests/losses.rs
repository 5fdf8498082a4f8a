//! A number never hides a loss: samples the kernel could not deliver (the ring buffer was
//! full) stay in their process's totals, whose bounds still hold the exact counts, and the
//! profile says how many were lost and where they went.

use tests::{assert_bounds_exact, fixture, record::leaf_is, Record, Recorded};

/// Records a storm (the workload fixture, `rounds` rounds) with the smallest ring buffer,
/// so that samples are lost.
fn storm(interval: &str, extra: &[&str], rounds: &str) -> Recorded {
    let recorded = Record::command(fixture("workload", &[]), &[rounds])
        // A storm that must overflow the ring buffer: the throttle would prevent it.
        .flags(&["--ring-buffer", "64KiB", "--confidence", "0.9999"])
        .flags(&["--max-samples-per-sec", "0", "-i", interval])
        .flags(extra)
        .run();
    let stderr = &recorded.stderr;
    assert!(
        recorded.profile.losses.ringbuf_full > 0,
        "the storm lost nothing; make it bigger:\n{stderr}"
    );
    assert!(
        stderr.contains("samples lost without a stack"),
        "the summary says so:\n{stderr}"
    );
    recorded
}

fn check_losses_counted(recorded: &Recorded) {
    let profile = &recorded.profile;
    let process = recorded.only_process();
    let lost = profile.losses.ringbuf_full;
    assert_eq!(
        profile.losses.lost_unrecorded, 0,
        "16384 (size, interval) keys are plenty here"
    );
    assert_eq!(process.lost_samples, lost);
    let lost_stacks: Vec<_> = profile.stacks.iter().filter(|s| s.lost).collect();
    assert_eq!(lost_stacks.len(), 1, "one pseudo-stack per process");
    assert_eq!(lost_stacks[0].samples, lost);
    assert!(
        leaf_is(lost_stacks[0], "[samples lost: ring buffer full]"),
        "{:?}",
        lost_stacks[0].frames
    );
    let stack_samples: u64 = profile.stacks.iter().map(|s| s.samples).sum();
    assert_eq!(stack_samples, process.samples);
    assert_bounds_exact(process);
}

#[test]
fn every_call_sampled_and_some_lost_still_sums_to_the_exact_total() {
    tests::require_bpf!();
    // At an interval of one byte every call is sampled: the estimate is a plain sum.
    let recorded = storm("1", &["--alloc-only"], "3000");
    check_losses_counted(&recorded);
    let process = recorded.only_process();
    assert_eq!(
        process.samples, process.exact.calls,
        "one sample per call, lost ones included"
    );
    assert_eq!(process.alloc_bytes.estimate, process.exact.bytes as f64);
}

#[test]
fn bounds_hold_the_exact_total_when_samples_are_lost() {
    tests::require_bpf!();
    // Frees tracked too: a lost sample's block is forgotten by the kernel as well.
    let recorded = storm("256", &[], "5000");
    check_losses_counted(&recorded);
    // Live numbers are still reported, and bound the truth from below: the workload frees
    // every block it allocates (what stays is stdio's few KiB); lost samples can only make
    // them low, never high.
    let live = recorded
        .only_process()
        .inuse_bytes
        .expect("live numbers still reported");
    assert!(live.lower <= 65536.0, "{live:?}");
}

#[test]
fn a_million_distinct_stacks_stay_bounded_and_counted() {
    tests::require_bpf!();
    // 2^20 calls, each reaching `site` through a call path of its own; every call sampled,
    // on purpose.
    let recorded = Record::command(fixture("paths", &[]), &[])
        .flags(&["-i", "1", "--alloc-only", "--max-stacks", "500"])
        .flags(&["--max-samples-per-sec", "0"])
        .run();
    // SAFETY: rusage is plain integers: all zeros is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills a live struct of the right type.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let peak_mib = usage.ru_maxrss / 1024;
    assert!(
        peak_mib < 256,
        "peak RSS {peak_mib} MiB (it grew to 4 GiB without a limit)"
    );
    let profile = &recorded.profile;
    let stacks = &profile.stacks;
    let cut: Vec<_> = stacks.iter().filter(|s| s.cut_to_leaf).collect();
    assert!(!cut.is_empty(), "some stacks were cut to their leaf");
    // Every stack beyond the cap is cut to its leaf: the paths to `site`, and any other new
    // one after the cap (the stdio buffer `puts` allocates at the end, when its sample is
    // not lost).
    assert!(cut.iter().all(|s| s.frames.len() == 1), "{cut:#?}");
    assert!(cut.iter().any(|s| leaf_is(s, "site")), "{cut:#?}");
    // 500 whole stacks, the leaf stacks beyond them, the lost samples' pseudo-stack.
    assert!(stacks.len() <= 500 + 3, "{} stacks", stacks.len());
    assert!(profile.losses.stacks_cut_to_leaf > 0);
    assert!(
        recorded.stderr.contains("cut to their leaf frame"),
        "{}",
        recorded.stderr
    );
    let process = recorded.only_process();
    assert_eq!(
        process.alloc_bytes.estimate, process.exact.bytes as f64,
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
    let recorded = Record::command(fixture("workload", &[]), &["6000"])
        .flags(&["-v", "-i", "256", "--alloc-only"])
        .flags(&["--max-samples-per-sec", "2000", "--confidence", "0.9999"])
        .run();
    let (profile, stderr) = (&recorded.profile, &recorded.stderr);
    let throttle = profile.sampling.throttle.as_ref().expect(stderr);
    assert_eq!(throttle.max_samples_per_second, 2000, "{stderr}");
    assert!(throttle.largest_interval_bytes > 256, "{throttle:?}");
    assert!(!throttle.changes.is_empty(), "{throttle:?}");
    assert!(stderr.contains("sampling interval now"), "{stderr}");
    assert_eq!(profile.sampling.mean_interval_bytes, 256);
    let process = recorded.only_process();
    assert_bounds_exact(process);
    // Fewer samples than calls sampled at 256 bytes would have given.
    let at_256 = process.exact.bytes as f64 / 256.0;
    assert!((process.samples as f64) < at_256 / 2.0, "{process:?}");
}
