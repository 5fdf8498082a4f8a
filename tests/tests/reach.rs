//! Reach: several processes and allocators in one session, processes that exit while
//! others are recorded, statically linked allocators, a containerized target, and the bad
//! input around them. (`--comm` and `--follow`, whose file-wide probes make every process on
//! the host pay the trap, and so would slow the tests running beside them: coverage.rs.)

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use tests::{
    assert_bounds_exact, check_workload_profile, drain, fixture, fixture_as, interrupt, read_typed,
    record::{process_of, site_of, Profile},
    run, rust_fixture, start_recording, wait_until, Fixture, Record, TempDir, Workload,
};

const CONFIDENCE: &str = "0.9999";
const ROUNDS: u64 = 2000;

fn pids(profile: &Profile) -> Vec<u32> {
    profile.processes.iter().map(|p| p.pid).collect()
}

/// Waits for the recorder to exit by itself and checks it succeeded.
fn finish(mut recorder: std::process::Child) {
    let status = recorder.wait().unwrap();
    assert!(status.success(), "allocscope exited with {status}");
}

#[test]
fn statically_linked_allocator_is_found_in_the_executable() {
    tests::require_bpf!();
    let workload = fixture_as("workload", "workload-static", &["-static"]);
    let recorded = Record::command(&workload, &[&ROUNDS.to_string()])
        .flags(&["--interval", "64KiB", "--confidence", CONFIDENCE])
        .run();
    let profile = &recorded.profile;
    let pid = pids(profile)[0];
    check_workload_profile(profile, pid, ROUNDS);
    let allocators = process_of(profile, pid).allocators.join(", ");
    assert!(
        allocators.contains("static, in") && allocators.contains("workload-static"),
        "{allocators}"
    );
}

#[test]
fn rust_programs_with_their_allocator_linked_in_are_counted_in_process_from_the_start() {
    tests::require_bpf!();
    // tikv-jemallocator (`_rjem_*`) and mimalloc (`mi_*_aligned`, `mi_free`) linked into
    // the executable, behind a counter of the program's own: no preloaded library can
    // interpose them. The library patches their entry points (the plan allocscope made,
    // `probe::patch`): every call is counted in the process from its first, frees tracked,
    // and nothing of the file is probed. Before, they were probed with uprobes once the
    // program ran (12.7× and 77× slower, the calls before missed); before that the
    // mimalloc one showed "0 samples … too little was allocated" for 1.1 GB.
    const RUST_ROUNDS: u64 = 500;
    for allocator in ["jemalloc", "mimalloc"] {
        let program = rust_fixture(allocator);
        let recorded = Record::command(&program, &[&RUST_ROUNDS.to_string()])
            .flags(&["--interval", "64KiB", "--confidence", CONFIDENCE])
            .run();
        let own: Vec<u64> = recorded
            .stdout
            .split_whitespace()
            .filter_map(|word| word.parse().ok())
            .collect();
        let [own_calls, own_bytes] = own[..] else {
            panic!("{allocator}: no counts in {:?}", recorded.stdout);
        };
        let profile = &recorded.profile;
        let process = profile
            .processes
            .iter()
            .find(|p| p.command == "rustalloc")
            .unwrap_or_else(|| panic!("{allocator}: {:#?}", profile.processes));
        // Counted in-process, the linked-in allocator by its patch. (Once in CI, under load,
        // glibc was also probed for every process 50 ms in, as if the command had exec'd
        // without the library: `then uprobes`, its calls still the library's; the cause
        // is not found yet. Any allocator of the executable left probed fails.)
        assert!(
            [
                "in-process",
                allocscope_model::schema::IN_PROCESS_THEN_UPROBES
            ]
            .contains(&process.front_end.as_str())
                && !process
                    .allocators
                    .iter()
                    .any(|a| a.contains("(static, in ") && !a.ends_with(", patched in-process)")),
            "{allocator}: {}: {:?}\n{}",
            process.front_end,
            process.allocators,
            recorded.stderr
        );
        let patched = format!("(static, in {}, patched in-process)", program.display());
        assert!(
            process.allocators.iter().any(|a| a.ends_with(&patched)),
            "{allocator}: {:?}",
            process.allocators
        );
        assert!(
            process.incomplete.is_empty(),
            "{allocator}: {:?}",
            process.incomplete
        );
        // Every call of the program's (and the few the C library makes at start, through
        // the library's malloc), none twice.
        let (calls, bytes) = (process.exact.calls, process.exact.bytes);
        assert!(
            own_calls <= calls && calls <= own_calls + 16,
            "{allocator}: {calls} calls counted, the program's own {own_calls}"
        );
        assert!(
            own_bytes <= bytes && bytes <= own_bytes + 65536,
            "{allocator}: {bytes} bytes counted, the program's own {own_bytes}"
        );
        assert_bounds_exact(process);
        // Each site's bytes inside its bounds, named by the program's functions (symbols,
        // as cargo builds a release), not by the allocator's Rust layers.
        let per_round = [
            ("site_small", 200 * 48),
            ("site_zeroed", 20 * 4096),
            ("site_big", 61440),
        ];
        for (site, bytes) in per_round {
            let function = format!("rustalloc::{site}");
            let through: Vec<_> = profile
                .stacks
                .iter()
                .filter(|s| s.pid == process.pid)
                .filter(|s| {
                    s.frames
                        .iter()
                        .any(|f| f.function.as_deref() == Some(&function))
                })
                .collect();
            let [stack] = through[..] else {
                panic!("{allocator}: {} stacks through {function}", through.len());
            };
            let expected = (RUST_ROUNDS * bytes) as f64;
            let estimate = &stack.alloc_bytes;
            assert!(
                estimate.lower <= expected && expected <= estimate.upper,
                "{allocator}: {function}: {estimate:?} does not bound {expected}"
            );
            // Frees tracked: every block of the round is freed within it.
            let live = stack.inuse_bytes.as_ref().map_or(f64::MAX, |l| l.estimate);
            assert!(
                live < expected / 10.0,
                "{allocator}: {function}: {:?} still live",
                stack.inuse_bytes
            );
        }
        assert!(
            !recorded.stderr.contains("without the library")
                && !recorded.stderr.contains("too little")
                && !recorded.stderr.contains("uprobes"),
            "{allocator}: {}",
            recorded.stderr
        );
    }
}

#[test]
fn memory_from_an_allocator_allocscope_does_not_know_is_said_not_too_little() {
    tests::require_bpf!();
    // 128 MiB from a function of the program's own over mmap, one malloc counted: before,
    // "no samples: too little was allocated for this interval". Its anonymous memory grew
    // far beyond what its counted calls asked for, which is said, with the function that
    // looks like its allocator.
    let program = fixture("own_arena", &[]);
    let recorded = Record::command(&program, &["128"]).run();
    let process = recorded
        .profile
        .processes
        .iter()
        .find(|p| p.command == "own_arena")
        .unwrap_or_else(|| panic!("{:#?}", recorded.profile.processes));
    let said = process
        .incomplete
        .iter()
        .find(|why| why.contains(allocscope_model::schema::UNCOUNTED_MEMORY))
        .unwrap_or_else(|| panic!("{:?}\n{}", process.incomplete, recorded.stderr));
    assert!(said.contains("arena_alloc"), "{said}");
    assert!(
        !recorded.stderr.contains("too little was allocated")
            && recorded.stderr.contains("does not count"),
        "{}",
        recorded.stderr
    );
}

#[test]
fn a_programs_own_malloc_wrapping_glibcs_is_counted_once() {
    tests::require_bpf!();
    const WRAPPED_ROUNDS: u64 = 50_000;
    let wrapper = fixture("wrapper", &[]);
    // Every way returns are observed: sessions, classic return probes, none. Uprobes: the
    // nesting of two probed mallocs is what is checked (with the in-process front end the
    // executable's malloc keeps its probes and the library's own 3 set-up allocations reach
    // it: docs/preload.md).
    for mode in [
        &["--no-preload"][..],
        &["--no-preload", "--no-sessions"],
        &["--no-preload", "--alloc-only"],
    ] {
        let recorded = Record::command(&wrapper, &[&WRAPPED_ROUNDS.to_string()])
            .flags(&["--interval", "64KiB", "--confidence", CONFIDENCE])
            .flags(mode)
            .run();
        let profile = &recorded.profile;
        let pid = pids(profile)[0];
        let process = process_of(profile, pid);
        // Both mallocs are probed, yet each allocation counts once (stdio adds one).
        let calls = process.exact.calls;
        assert!(
            (11 * WRAPPED_ROUNDS..=11 * WRAPPED_ROUNDS + 2).contains(&calls),
            "{mode:?}: {calls} calls counted"
        );
        assert_bounds_exact(process);
        for (function, bytes) in [("small", 10 * 100), ("big", 20_000)] {
            let truth = (bytes * WRAPPED_ROUNDS) as f64;
            let stacks = site_of(profile, pid, function);
            assert_eq!(stacks.len(), 1, "{mode:?}: {function}: {stacks:?}");
            let estimate = &stacks[0].alloc_bytes;
            assert!(
                estimate.lower <= truth && truth <= estimate.upper,
                "{mode:?}: {function}: {estimate:?} does not bound {truth}"
            );
        }
    }
}

#[test]
fn glibc_jemalloc_tcmalloc_and_mimalloc_processes_in_one_session() {
    tests::require_bpf!();
    let dir = TempDir::new("allocators");
    let out = dir.path("allocators.json");
    // Debian's libjemalloc2, libgoogle-perftools4 and libmimalloc2.0 (cargo xtask setup
    // installs them).
    let preloads = [
        ("glibc", None),
        (
            "jemalloc",
            Some("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
        ),
        (
            "tcmalloc",
            Some("/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"),
        ),
        (
            "mimalloc",
            Some("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"),
        ),
    ];
    let mut workloads: Vec<(&str, Workload)> = preloads
        .iter()
        .map(|&(family, preload)| {
            let mut command = Command::new(fixture("workload", &[]));
            if let Some(library) = preload {
                assert!(
                    Path::new(library).exists(),
                    "{library} missing: run cargo xtask setup"
                );
                command.env("LD_PRELOAD", library);
            }
            (family, Workload::start_with(command, ROUNDS, &[]))
        })
        .collect();
    // Each allocator's entry points probed with uprobes (what this test is for; loaded
    // into them, the in-process sampler counts them all alike, see attach.rs).
    let mut args = vec![
        "record".to_owned(),
        "--front-end".into(),
        "uprobes".into(),
        "--interval".into(),
        "64KiB".into(),
        "--confidence".into(),
        CONFIDENCE.into(),
        "-o".into(),
        out.display().to_string(),
    ];
    for (_, workload) in &workloads {
        args.extend(["-p".to_owned(), workload.pid().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (recorder, stderr) = start_recording(&args);
    let drained = drain(stderr);
    for (_, workload) in &mut workloads {
        workload.go();
    }
    // They exit one after the other while the others still allocate: each exit detaches
    // that process's probes during the recording.
    for (_, workload) in &mut workloads {
        assert_eq!(workload.line(), "done");
    }
    interrupt(recorder);
    let said = drained.join().unwrap();
    let profile = read_typed(&out);
    for (family, workload) in &workloads {
        let pid = workload.pid();
        // Every site of each process within bounds and attributed to that process.
        check_workload_profile(&profile, pid, ROUNDS);
        let allocators = &process_of(&profile, pid).allocators;
        assert!(
            allocators[0].starts_with(family),
            "pid {pid} should use {family} first: {allocators:?}\n{said}"
        );
    }
    let probed = |file: &str, function: &str| {
        profile
            .probes
            .iter()
            .any(|p| p.file.contains(file) && p.function.starts_with(function))
    };
    assert!(
        probed("libjemalloc.so.2", "mallocx"),
        "{:#?}",
        profile.probes
    );
    assert!(probed("libjemalloc.so.2", "sdallocx"));
    assert!(probed("libtcmalloc.so", "malloc"));
    assert!(probed("libtcmalloc.so", "tc_new_nothrow"));
    assert!(probed("libmimalloc.so", "mi_posix_memalign"));
    // mimalloc's malloc moves the size to rsi before reusing rdi: the probe follows it to
    // the first emulated instruction instead of single-stepping the entry (the sizes read
    // there are checked above: exact bytes and every site's bounds).
    let mimalloc_malloc = profile
        .probes
        .iter()
        .find(|p| p.file.contains("libmimalloc.so") && p.function.starts_with("malloc"))
        .expect("mimalloc's malloc probed");
    assert!(mimalloc_malloc.emulated, "{mimalloc_malloc:#?}");
    assert!(
        mimalloc_malloc.instruction.contains("(rdi in rsi)"),
        "{mimalloc_malloc:#?}"
    );
    assert!(probed("libmimalloc.so", "mi_cfree"));
}

#[test]
fn threads_by_the_thousand_keep_their_attribution_and_leave_no_state() {
    tests::require_bpf!();
    let dir = TempDir::new("threads");
    let out = dir.path("threads.json");
    let (threads, per_thread) = (4000u64, 500u64);
    let mut fixture = Fixture::start(
        "threads",
        &[&threads.to_string(), &per_thread.to_string()],
        &[],
    );
    fixture.expect("ready");
    let pid = fixture.pid();
    let (recorder, stderr) = start_recording(&[
        "record",
        "-p",
        &pid.to_string(),
        "--interval",
        "64KiB",
        "--confidence",
        CONFIDENCE,
        "-o",
        out.to_str().unwrap(),
    ]);
    let drained = drain(stderr);
    fixture.go();
    assert_eq!(fixture.line(), "done");
    // Every worker has exited; the process lives on.
    interrupt(recorder);
    let said = drained.join().unwrap();
    let profile = read_typed(&out);
    let calls = threads * per_thread;
    let process = process_of(&profile, pid);
    // Besides the workers' calls, glibc allocates a thread's TLS vector at its creation.
    let exact = process.exact.calls;
    assert!(
        (calls..calls + 3 * threads).contains(&exact),
        "exact calls {exact}, expected {calls} and a few per thread"
    );
    assert_bounds_exact(process);
    let stacks = site_of(&profile, pid, "thread_site");
    assert_eq!(stacks.len(), 1, "{stacks:#?}");
    assert!(
        tests::record::frame_is(stacks[0], 1, "worker"),
        "{stacks:#?}"
    );
    let truth = (calls * 512) as f64;
    let bytes = &stacks[0].alloc_bytes;
    assert!(
        bytes.lower <= truth && truth <= bytes.upper,
        "thread_site: true {truth} outside {bytes:?}"
    );
    let losses = &profile.losses;
    assert_eq!(losses.thread_state_full, 0, "{losses:?}");
    assert_eq!(losses.ringbuf_full, 0, "{losses:?}");
    // Each thread's countdown went with the thread: what is left is the main thread's.
    let states = profile.thread_states.unwrap();
    assert!(
        states <= 2,
        "{states} thread states left after 4000 threads\n{said}"
    );
}

#[test]
fn attaching_mid_run_the_estimates_cover_what_the_counters_cover() {
    tests::require_bpf!();
    let mut workload = Workload::start(100, &["--forever"]);
    workload.go();
    // Classic return probes: the most links to remove, the longest detach, during which
    // the probes still fire (what used to inflate the estimates by a third).
    let recorded = Record::pid(workload.pid())
        .flags(&[
            "--duration",
            "2",
            "--no-sessions",
            "--confidence",
            CONFIDENCE,
        ])
        .run();
    assert_bounds_exact(recorded.process(workload.pid()));
}

#[test]
fn a_process_in_its_own_mount_namespace_and_root_is_profiled_and_symbolized() {
    tests::require_bpf!();
    let dir = TempDir::new("container");
    let root = dir.path("root");
    let workload = fixture("workload", &[]);
    // A root of its own: the workload and copies (new inodes) of its libc, at the path the
    // host's has, and of the loader.
    let copy = |from: &Path, to: &Path| {
        let target = root.join(to.strip_prefix("/").unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(from, &target).unwrap();
    };
    copy(&workload, Path::new("/workload"));
    let host_libc_path = std::fs::canonicalize("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    copy(&host_libc_path, &host_libc_path);
    let loader = Path::new("/lib64/ld-linux-x86-64.so.2");
    copy(&std::fs::canonicalize(loader).unwrap(), loader);
    // And a process on the host beside it, in the host's libc.
    let mut neighbour = Workload::start(ROUNDS, &[]);
    // As a container runtime does: a mount namespace of its own, the root bind-mounted and
    // pivoted into, so its maps show its own paths (`/usr/lib/…/libc.so.6`), not the
    // host's path to them.
    std::fs::create_dir_all(root.join("old")).unwrap();
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$0" "$0" && cd "$0" && pivot_root . old && exec /workload "$@""#)
        .arg(&root);
    let mut target = Workload::start_with(command, ROUNDS, &[]);
    let pid = target.pid();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains("libc.so.6"), "{maps}");
    let out = dir.path("container.json");
    let (recorder, _stderr) = start_recording(&[
        "record",
        "-p",
        &pid.to_string(),
        "-p",
        &neighbour.pid().to_string(),
        "--interval",
        "64KiB",
        "--confidence",
        CONFIDENCE,
        "-o",
        out.to_str().unwrap(),
    ]);
    target.go();
    neighbour.go();
    assert_eq!(target.line(), "done");
    assert_eq!(neighbour.line(), "done");
    finish(recorder);
    let profile = read_typed(&out);
    // Probed in its own libc, and symbolized from its own files.
    check_workload_profile(&profile, pid, ROUNDS);
    check_workload_profile(&profile, neighbour.pid(), ROUNDS);
    // Two files by one path: two modules, told apart, each with its file's build id.
    let shown = host_libc_path.to_str().unwrap();
    let libcs: Vec<_> = profile
        .modules
        .iter()
        .filter(|m| m.path.starts_with(shown))
        .collect();
    assert_eq!(libcs.len(), 2, "{:#?}", profile.modules);
    assert_ne!(libcs[0].path, libcs[1].path);
    assert!(libcs.iter().all(|m| m.build_id.is_some()), "{libcs:#?}");
    let host_libc = std::fs::metadata("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let probed: Vec<PathBuf> = profile
        .probes
        .iter()
        .map(|p| PathBuf::from(&p.file))
        .collect();
    assert!(!probed.is_empty());
    use std::os::unix::fs::MetadataExt as _;
    for file in probed {
        let through_target = PathBuf::from(format!("/proc/{pid}/root"))
            .join(file.strip_prefix("/").unwrap_or(&file));
        if let Ok(metadata) = std::fs::metadata(&through_target) {
            assert_ne!(
                metadata.ino(),
                host_libc.ino(),
                "the host's libc was probed"
            );
        }
    }
}

#[test]
fn bad_targets_are_refused_or_left_out() {
    tests::require_bpf!();
    // A process that exited (a zombie, not reaped yet): said to be one, exit 2.
    let mut zombie = Command::new("true").spawn().unwrap();
    let zombie_pid = zombie.id();
    assert!(wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{zombie_pid}/stat"))
            .is_ok_and(|s| s.contains(") Z "))
    }));
    let output = run(&["record", "-p", &zombie_pid.to_string(), "-o", "/tmp/x.json"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("a zombie: it has exited"), "{stderr}");
    // Next to a live target, a process without an allocator and the gone one are left
    // out with a warning, and the recording goes on.
    let no_libc = fixture("no_libc", &["-static", "-nostdlib"]);
    let mut bare = Command::new(&no_libc).spawn().unwrap();
    let dir = TempDir::new("bad-targets");
    let out = dir.path("mixed.json");
    let mut workload = Workload::start(100, &["--forever"]);
    workload.go();
    let output = run(&[
        "record",
        "-p",
        &bare.id().to_string(),
        "-p",
        &workload.pid().to_string(),
        "-p",
        &zombie_pid.to_string(),
        "--duration",
        "1",
        "-o",
        out.to_str().unwrap(),
    ]);
    bare.kill().unwrap();
    bare.wait().unwrap();
    zombie.wait().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("no allocator found"), "{stderr}");
    assert!(
        stderr.contains(&format!("pid {zombie_pid}: a zombie")),
        "{stderr}"
    );
    assert_eq!(stderr.matches("left out").count(), 2, "{stderr}");
    assert_eq!(pids(&read_typed(&out)), vec![workload.pid()]);
    // A comm regex that does not compile: exit 2 before anything is attached.
    let output = run(&["record", "--comm", "(", "-o", "/tmp/x.json"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("invalid --comm"));
    // Targets that contradict each other.
    let output = run(&["record", "--all", "-p", "1", "-o", "/tmp/x.json"]);
    assert_eq!(output.status.code(), Some(2));
}
