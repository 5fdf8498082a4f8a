//! `--all`: the whole host in one recording. A test binary of its own, so no other test's
//! processes run beside it (cargo runs the tests of one binary in parallel, the binaries
//! one after the other): host-wide probes fire in every process on the machine.

use std::{
    io::{BufRead as _, BufReader, Read as _},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tests::{
    check_workload_profile, fixture, read_profile, record::process_of, start_recording, typed,
    TempDir, Workload,
};

const ROUNDS: u64 = 2000;

#[test]
fn all_finds_known_workloads_and_leaves_the_excluded_and_itself_alone() {
    tests::require_bpf!();
    let dir = TempDir::new("host");
    let out = dir.path("host.json");
    // An unrelated busy process, left alone by name: it must keep going.
    let bystander_binary = dir.path("busybystander");
    std::fs::copy(fixture("workload", &[]), &bystander_binary).unwrap();
    let mut bystander = Command::new(&bystander_binary)
        .args(["100", "--forever"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut progress = BufReader::new(bystander.stdout.take().unwrap());
    let mut line = String::new();
    // Its first line ("malloc 0x…"): it is running.
    progress.read_line(&mut line).unwrap();
    // Two known workloads, started before the recording: found by the first scan.
    let mut workloads = [Workload::start(ROUNDS, &[]), Workload::start(ROUNDS, &[])];
    let (recorder, stderr) = start_recording(&[
        "record",
        "--all",
        "--exclude-comm",
        "^busyby",
        "--interval",
        "64KiB",
        "--confidence",
        "0.9999",
        "-o",
        out.to_str().unwrap(),
    ]);
    let recorder_pid = recorder.id();
    let drained = std::thread::spawn(move || {
        let mut rest = String::new();
        let mut stderr = stderr;
        let _ = stderr.read_to_string(&mut rest);
        rest
    });
    for workload in &mut workloads {
        workload.go();
    }
    for workload in &mut workloads {
        assert_eq!(workload.line(), "done");
    }
    // The bystander still makes progress under host-wide probes (it pays the trap, the
    // kernel drops its calls at the first lookup).
    let started = Instant::now();
    let mut batches = 0;
    while batches < 3 && started.elapsed() < Duration::from_secs(20) {
        line.clear();
        progress.read_line(&mut line).unwrap();
        batches += usize::from(line.starts_with("progress"));
    }
    assert_eq!(batches, 3, "the excluded bystander stalled");
    let stopped = Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(recorder_pid as libc::pid_t, libc::SIGINT) };
    let mut recorder = recorder;
    let status = recorder.wait().unwrap();
    let said = drained.join().unwrap();
    assert!(status.success(), "allocscope exited with {status}:\n{said}");
    eprintln!("stopped and wrote the profile in {:?}", stopped.elapsed());
    // Shown only if an assertion below fails.
    eprintln!("allocscope said:\n{said}");
    let profile = typed(&read_profile(&out));
    for workload in &workloads {
        // Every site found, attributed to its process, bounds calibrated; exact counters
        // from the host-wide per-process counters.
        check_workload_profile(&profile, workload.pid(), ROUNDS);
    }
    let pids: Vec<u32> = profile.processes.iter().map(|p| p.pid).collect();
    assert!(
        !pids.contains(&bystander.id()),
        "the excluded bystander was recorded"
    );
    assert!(!pids.contains(&recorder_pid), "allocscope recorded itself");
    let workload = process_of(&profile, workloads[0].pid());
    assert!(
        workload
            .allocators
            .first()
            .is_some_and(|a| a.starts_with("glibc")),
        "{workload:#?}"
    );
    // Probed once for every process (pid 0), not per process.
    assert!(!profile.probes.is_empty());
    assert!(
        profile.probes.iter().all(|p| p.pid == 0),
        "{:#?}",
        profile.probes
    );
    let _ = bystander.kill();
    let _ = bystander.wait();
}
