//! Other producers: a program whose own allocator samples itself and fires the
//! OpenTelemetry memory-profiling contract's USDT probes (`otel_memory:alloc(ptr, size,
//! weight)`, `otel_memory:free(ptr)`), or libdatadog's `ddheap:*` behind USDT semaphores,
//! is recorded through those probes by `-p`: its samples weighed by the producer's weights,
//! every site's truth inside its bounds, freed blocks out of the live heap, and the summary
//! saying there are no exact counts. The fixture's probes are `sys/sdt.h`'s, their argument
//! locations chosen by the compiler.

use allocscope_model::stats::Estimate;
use tests::{
    drain, fixture_as, interrupt, read_typed,
    record::{process_of, Profile, StackProfile},
    start_recording, Fixture, TempDir,
};

const ROUNDS: u64 = 20;
/// The producer's mean sampling interval (its own, not allocscope's).
const INTERVAL: u64 = 64 * 1024;
/// Per round: (site, blocks, bytes each, kept live).
const SITES: [(&str, u64, u64, bool); 2] = [
    ("site_small", 1000, 256, false),
    ("site_big", 10, 1 << 20, true),
];

/// The stacks of `pid` through `function`.
fn through<'a>(profile: &'a Profile, pid: u32, function: &str) -> Vec<&'a StackProfile> {
    profile
        .stacks
        .iter()
        .filter(|s| {
            s.pid == pid
                && s.frames
                    .iter()
                    .any(|f| f.function.as_deref() == Some(function))
        })
        .collect()
}

/// Sums an estimate (estimate, lower, upper) over stacks.
fn summed(stacks: &[&StackProfile], field: fn(&StackProfile) -> Estimate) -> (f64, f64, f64) {
    stacks.iter().fold((0.0, 0.0, 0.0), |(e, l, u), s| {
        let v = field(s);
        (e + v.estimate, l + v.lower, u + v.upper)
    })
}

fn recorded_through_its_probes(binary_name: &str, flags: &[&str], provider: &str) {
    tests::require_bpf!();
    let binary = fixture_as("otel_producer", binary_name, flags);
    let dir = TempDir::new(&format!("producer-{binary_name}"));
    let out = dir.path("profile.json");
    let mut producer =
        Fixture::start_binary(&binary, &[&ROUNDS.to_string(), &INTERVAL.to_string()], &[]);
    producer.expect("ready");
    let pid = producer.pid();
    let (recorder, stderr) = start_recording(&[
        "record",
        "-p",
        &pid.to_string(),
        "--confidence",
        "0.999",
        "-o",
        out.to_str().unwrap(),
    ]);
    let log = drain(stderr);
    producer.go();
    producer.expect("done");
    // Stopped while the producer runs: the blocks it keeps are live.
    interrupt(recorder);
    let log = log.join().unwrap();
    let profile = read_typed(&out);
    let totals = process_of(&profile, pid);
    assert_eq!(
        totals.front_end,
        format!("in-process ({provider})"),
        "{log}"
    );
    assert!(
        log.contains(&format!("no exact counts (sampled by its own allocator, reported through its {provider} probes)")),
        "the summary must not show zero exact counts as if they were counted:\n{log}"
    );
    for (function, blocks, size, kept) in SITES {
        let stacks = through(&profile, pid, function);
        assert!(!stacks.is_empty(), "no stack through {function}:\n{log}");
        let samples: u64 = stacks.iter().map(|s| s.samples).sum();
        let truth_bytes = (ROUNDS * blocks * size) as f64;
        let truth_objects = (ROUNDS * blocks) as f64;
        let (estimate, lower, upper) = summed(&stacks, |s| s.alloc_bytes);
        assert!(
            lower <= truth_bytes && truth_bytes <= upper,
            "{function}: {truth_bytes} bytes outside [{lower}, {upper}] (estimate {estimate}, {samples} samples)"
        );
        let (estimate, lower, upper) = summed(&stacks, |s| s.alloc_objects);
        assert!(
            lower <= truth_objects && truth_objects <= upper,
            "{function}: {truth_objects} objects outside [{lower}, {upper}] (estimate {estimate})"
        );
        let (live, lower, upper) = summed(&stacks, |s| s.inuse_bytes.expect("frees tracked"));
        if kept {
            assert!(
                lower <= truth_bytes && truth_bytes <= upper,
                "{function}: {truth_bytes} live bytes outside [{lower}, {upper}] (estimate {live})"
            );
        } else {
            assert_eq!(
                live, 0.0,
                "{function}'s blocks were all freed (their frees reported through {provider}:free)"
            );
        }
    }
}

#[test]
fn an_otel_memory_producer_is_recorded_through_its_probes() {
    recorded_through_its_probes("otel_producer", &[], "otel_memory");
}

/// libdatadog's probes fire only while a consumer has raised their semaphores: without the
/// kernel raising them for our links, no sample would arrive and every bound would miss.
#[test]
fn a_ddheap_producer_behind_semaphores_is_recorded_through_its_probes() {
    recorded_through_its_probes("ddheap_producer", &["-DDDHEAP"], "ddheap");
}
