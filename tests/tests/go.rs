//! Go programs, recorded through their runtime's own heap sampler (tests/fixtures/go/, built
//! by the tests with Debian's Go 1.19 and with the current release `cargo xtask setup`
//! unpacks): per-site bytes against the program's own exact counts, samples against the
//! runtime's own, the process's total against `runtime.MemStats.TotalAlloc`, a leaking
//! site's in-use bytes against what it holds, a method and a function inlined into it named
//! as Go names them, from the start (`-- CMD`) and attached to a running program (`-p`,
//! `--comm`, `--all`; by pid its heap profile is read, no probe in it); a program whose
//! heap profiling is off is said to be, not shown as empty.

use tests::{
    go_fixture, go_fixture_pie, go_fixture_with, go_toolchains, interrupt, read_profile,
    record::{assert_holds, site_of},
    start_recording, typed, Fixture, Record, TempDir,
};

/// What a Go runtime read, not probed, says of itself.
const READ: &str = "its heap profile read every 100 ms, no probe in the process";

/// What the fixture counted itself: each site's (function, bytes, objects) and the
/// runtime's TotalAlloc over the same time.
struct Truth {
    sites: Vec<(String, u64, u64)>,
    /// The runtime's own samples per site (`-memprofile`).
    sampled: Vec<(String, u64)>,
    /// TotalAlloc since the process started.
    total: u64,
    /// TotalAlloc over the allocation loop alone.
    looped: u64,
    /// TotalAlloc from the loop's start to the end (the counts written, the runtime's
    /// own samples taken).
    since_wait: u64,
}

impl Truth {
    fn parse(text: &str) -> Truth {
        let mut truth = Truth {
            sites: Vec::new(),
            sampled: Vec::new(),
            total: 0,
            looped: 0,
            since_wait: 0,
        };
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["site", name, bytes, objects] => truth.sites.push((
                    (*name).to_owned(),
                    bytes.parse().unwrap(),
                    objects.parse().unwrap(),
                )),
                ["sampled", name, count] => truth
                    .sampled
                    .push(((*name).to_owned(), count.parse().unwrap())),
                ["total", bytes] => truth.total = bytes.parse().unwrap(),
                ["allocating", bytes] => truth.looped = bytes.parse().unwrap(),
                ["since_wait", bytes] => truth.since_wait = bytes.parse().unwrap(),
                _ => {}
            }
        }
        assert_eq!(truth.sites.len(), 4, "the fixture's counts: {text:?}");
        truth
    }

    fn bytes_of(&self, site: &str) -> u64 {
        self.sites.iter().find(|s| s.0 == site).unwrap().1
    }
}

/// Each site of the fixture is one stack led by its function (the runtime's allocation
/// frames left out), its allocated bytes' bounds holding the program's own count; the
/// process's bounds hold TotalAlloc; the leaking site's in-use bytes hold what it keeps.
fn check(profile: &tests::record::Profile, pid: u32, truth: &Truth, said: &str) {
    let process = tests::record::process_of(profile, pid);
    assert_eq!(process.front_end, "go runtime", "{process:#?}\n{said}");
    assert!(
        process.allocators[0].starts_with("go runtime (go1."),
        "{:?}",
        process.allocators
    );
    assert!(process.samples > 300, "{} samples\n{said}", process.samples);
    for (site, bytes, _) in &truth.sites {
        let stacks = site_of(profile, pid, site);
        assert_eq!(stacks.len(), 1, "{site}: {stacks:#?}\n{said}");
        assert_holds(&stacks[0].alloc_bytes, *bytes as f64, site, said);
        // The stack goes on to the program's main, no runtime frame leads it, and a
        // method is named as Go names it, the function inlined into it expanded.
        let functions: Vec<&str> = stacks[0]
            .frames
            .iter()
            .filter_map(|f| f.function.as_deref())
            .collect();
        let callers: &[&str] = if site == "main.buffer" {
            &["main.(*server).handle", "main.main"]
        } else {
            &["main.main"]
        };
        assert_eq!(
            functions.get(1..=callers.len()),
            Some(callers),
            "{functions:?}"
        );
        // Walked by frame pointers to the goroutine's root (runtime.goexit, left out).
        let end = stacks[0].end.map(|e| format!("{e:?}"));
        assert_eq!(end.as_deref(), Some("Root"), "{site}: {:?}", stacks[0]);
    }
    let leak = site_of(profile, pid, "main.leak")[0];
    let held = truth.bytes_of("main.leak") as f64;
    let inuse = leak.inuse_bytes.as_ref().expect("frees are tracked");
    assert_holds(inuse, held, "main.leak's in-use bytes", said);
}

/// `record -- ./goalloc` at the runtime's default rate (heap profiling on: the program
/// reads its own heap profile): the whole run, the process's total against TotalAlloc, and
/// each site's samples one for one with the runtime's own.
#[test]
fn a_go_command_is_recorded_through_its_runtime_sampler() {
    tests::require_bpf!();
    for (tag, go) in go_toolchains() {
        recorded_from_the_start(&go_fixture_with("goalloc", (&tag, &go)), &tag);
    }
}

/// [`a_go_command_is_recorded_through_its_runtime_sampler`] for one build of the program.
fn recorded_from_the_start(program: &std::path::Path, tag: &str) {
    let dir = TempDir::new(&format!("go-command-{tag}"));
    let counts = dir.path("counts.txt");
    let recorded = Record::command(
        program,
        &[
            "-memprofile",
            "-rounds",
            "300000",
            "-out",
            counts.to_str().unwrap(),
        ],
    )
    .flags(&["--confidence", "0.9999"])
    .run();
    let truth = Truth::parse(&std::fs::read_to_string(&counts).unwrap());
    let process = recorded.only_process();
    check(&recorded.profile, process.pid, &truth, &recorded.stderr);
    let total = truth.total as f64;
    assert_holds(&process.alloc_bytes, total, "TotalAlloc", &recorded.stderr);
    // The runtime's own totals, read by the kernel as the program exited: its last
    // ReadMemStats flushed every P's counts, and what it allocated after (writing the
    // counts) is not published by then: TotalAlloc to the byte, give or take a span.
    assert_eq!(
        process.exact_source.as_deref(),
        Some("runtime.memstats, read at its exit"),
        "{process:#?}"
    );
    assert_near(
        process.exact.bytes,
        truth.total,
        "TotalAlloc",
        &recorded.stderr,
    );
    assert!(process.exact.calls > 300_000, "{:?}", process.exact);
    assert!(
        recorded
            .stderr
            .contains(" objects (the Go runtime's runtime.memstats"),
        "{}",
        recorded.stderr
    );
    // A re-entered probe (a signal during its single-step, a stack growth) is not a sample:
    // counted twice, they made 1.1–1.8 times the runtime's own. The runtime may keep no
    // record of a sample (go1.23+, a new M's first allocations): a difference of one or two.
    samples_match(&recorded.profile, process.pid, &truth, 2, tag);
    assert!(!process.allocators[0].contains("heap profiling off"));
    // What it cost: each sample (and each free of one) a hit of the runtime's probes,
    // charged the trap and the program's time, over the runtime's own allocations (it
    // said "+0.0% CPU" once, the hits not being calls counted by allocscope).
    let overhead = recorded.profile.overhead.as_ref().expect("overhead");
    assert!(overhead.runs >= process.samples, "{overhead:#?}");
    assert!(
        overhead.program_ns_per_run.is_some_and(|ns| ns > 0.0),
        "{overhead:#?}"
    );
    let cost = &overhead.processes[0];
    let per_hit = overhead.trap.ns + overhead.program_ns_per_run.unwrap_or(0.0);
    assert!(
        cost.added_cpu_seconds >= process.samples as f64 * overhead.trap.ns / 1e9,
        "{overhead:#?}"
    );
    assert!(
        cost.added_cpu_seconds <= overhead.runs as f64 * per_hit * 1.5 / 1e9,
        "{overhead:#?}"
    );
    assert!(overhead.ns_per_call > 0.0, "{overhead:#?}");
}

/// `exact` within 256 KiB of `truth` (the allocations of the Ps' cached spans that the
/// runtime had not published when it was read).
fn assert_near(exact: u64, truth: u64, what: &str, said: &str) {
    assert!(
        exact.abs_diff(truth) <= 256 << 10,
        "the runtime's exact {exact} bytes against {what} {truth}\n{said}"
    );
}

/// What the fixture prints of its counts, up to its "done".
fn counts_until_done(fixture: &mut Fixture) -> String {
    let mut counts = String::new();
    loop {
        let line = fixture.line();
        if line == "done" {
            return counts;
        }
        counts.push_str(&line);
        counts.push('\n');
    }
}

/// Each site's samples are the runtime's own (`-memprofile`), give or take `slack`.
fn samples_match(
    profile: &tests::record::Profile,
    pid: u32,
    truth: &Truth,
    slack: u64,
    context: &str,
) {
    assert_eq!(truth.sampled.len(), 4);
    for (site, own) in &truth.sampled {
        let ours: u64 = site_of(profile, pid, site).iter().map(|s| s.samples).sum();
        assert!(
            ours.abs_diff(*own) <= slack,
            "{site} ({context}): {ours} samples against the runtime's own {own}"
        );
    }
}

/// A running Go program, found by pid, by name and among all processes.
#[test]
fn a_running_go_program_is_attached_by_pid_comm_and_all() {
    tests::require_bpf!();
    let dir = TempDir::new("go-attach");
    let builds = go_toolchains()
        .into_iter()
        .map(|(tag, go)| go_fixture_with("goalloc", (&tag, &go)));
    let runs =
        builds.flat_map(|program| ["-p", "--comm", "--all"].map(|mode| (program.clone(), mode)));
    for (n, (program, mode)) in runs.enumerate() {
        let mut fixture = Fixture::start_binary(
            &program,
            &[
                "-rate",
                "524288",
                "-rounds",
                "200000",
                "-wait",
                "-hold",
                "-memprofile",
            ],
            &[],
        );
        fixture.expect("ready");
        let out = dir.path(&format!("attach-{n}.json"));
        let pid = fixture.pid().to_string();
        let target: Vec<&str> = match mode {
            "-p" => vec!["-p", &pid],
            "--comm" => vec!["--comm", "^goalloc"],
            _ => vec!["--all"],
        };
        // Six recordings, six bounds each: at 99.99 % a true count falls outside one of
        // them by chance in about 0.4 % of runs (at 99.9 %, 3.5 %: seen once in CI). That
        // a miss is chance, not the reader, is checked below: its samples are the
        // runtime's own.
        let mut args = vec![
            "record",
            "--confidence",
            "0.9999",
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend(target);
        let (recorder, stderr) = start_recording(&args);
        let said = tests::drain(stderr);
        fixture.go();
        let counts = counts_until_done(&mut fixture);
        interrupt(recorder);
        let said = said.join().unwrap();
        let profile = typed(&read_profile(&out));
        let truth = Truth::parse(&counts);
        let said = format!("{mode} ({}):\n{said}", program.display());
        check(&profile, fixture.pid(), &truth, &said);
        // Its runtime's totals from attach to detach: from the loop on (the program
        // allocates nothing while it waits), its own samples and counts' text included.
        let process = tests::record::process_of(&profile, fixture.pid());
        let source = process.exact_source.as_deref();
        assert_eq!(source, Some("runtime.memstats, read at the end"), "{mode}");
        // By pid, its runtime's heap profile is read (no probe in it: its stacks are the
        // runtime's own tracebacks); found by name or among all, it is probed.
        let read = mode == "-p";
        let unwound = format!(
            "{:?}",
            site_of(&profile, fixture.pid(), "main.churn")[0].unwound
        );
        // Read, the samples are the runtime's records themselves; probed, give or take
        // the one or two the runtime may keep no record of (see above).
        samples_match(
            &profile,
            fixture.pid(),
            &truth,
            if read { 0 } else { 2 },
            mode,
        );
        let expected = if read { "GoRuntime" } else { "FramePointers" };
        assert_eq!(unwound, format!("Some({expected})"), "{mode}");
        assert_eq!(
            process.allocators[0].ends_with(READ),
            read,
            "{mode}: {:?}",
            process.allocators
        );
        assert_near(
            process.exact.bytes,
            truth.since_wait,
            "TotalAlloc since the wait",
            &said,
        );
    }
}

/// A running Go program read, not probed (`-p`), that exits while recorded: its samples
/// until the last reading are in, and its process says what its last moments took with
/// them rather than show them as nothing.
#[test]
fn a_go_program_read_until_it_exits_says_what_its_exit_took() {
    tests::require_bpf!();
    let program = go_fixture("goalloc");
    let mut fixture = Fixture::start_binary(
        &program,
        &["-rate", "524288", "-rounds", "3000000", "-wait"],
        &[],
    );
    fixture.expect("ready");
    let dir = TempDir::new("go-read-exit");
    let out = dir.path("exit.json");
    let pid = fixture.pid().to_string();
    let (mut recorder, stderr) =
        start_recording(&["record", "-o", out.to_str().unwrap(), "-p", &pid]);
    let said = tests::drain(stderr);
    fixture.go();
    let counts = counts_until_done(&mut fixture);
    let truth = Truth::parse(&counts);
    // Its only target gone, the recording ends by itself.
    let status = recorder.wait().unwrap();
    let said = said.join().unwrap();
    assert!(status.success(), "{status}\n{said}");
    let profile = typed(&read_profile(&out));
    let process = tests::record::process_of(&profile, fixture.pid());
    assert!(
        process.allocators[0].ends_with(READ),
        "{:?}",
        process.allocators
    );
    // Read until its last reading: most of its ~1 s loop is in, never more than it did.
    assert!(
        process.samples > 1000,
        "{} samples\n{said}",
        process.samples
    );
    let looped = truth.looped as f64;
    assert!(
        process.alloc_bytes.lower <= looped,
        "{:?} against {looped}\n{said}",
        process.alloc_bytes
    );
    assert!(
        process
            .incomplete
            .iter()
            .any(|why| why.contains("after the last reading, ended with it")),
        "{:?}\n{said}",
        process.incomplete
    );
}

/// Heap profiling off, by the linker's choice in a program that never asks for a heap
/// profile, or by the program's own `runtime.MemProfileRate = 0`: nothing sampled, and
/// the process says why.
#[test]
fn a_go_program_without_heap_profiling_is_said_to_be() {
    tests::require_bpf!();
    let off = go_fixture("gooff");
    let recorded = Record::command(&off, &[]).run();
    let process = recorded.only_process();
    assert_eq!(process.samples, 0, "{process:#?}");
    assert!(
        process
            .incomplete
            .iter()
            .any(|why| why.contains("heap profiling is off in this program")),
        "{process:#?}\n{}",
        recorded.stderr
    );
    assert!(
        process.allocators[0].contains("heap profiling off unless the program sets"),
        "{:?}",
        process.allocators
    );
    // Set to 0 by a running program that has heap profiling (it reads its own profile):
    // its variable is read.
    let program = go_fixture("goalloc");
    let mut fixture = Fixture::start_binary(
        &program,
        &[
            "-rate",
            "0",
            "-memprofile",
            "-rounds",
            "20000",
            "-wait",
            "-hold",
        ],
        &[],
    );
    fixture.expect("ready");
    let dir = TempDir::new("go-rate-zero");
    let out = dir.path("zero.json");
    let pid = fixture.pid().to_string();
    let (recorder, stderr) = start_recording(&["record", "-o", out.to_str().unwrap(), "-p", &pid]);
    let said = tests::drain(stderr);
    fixture.go();
    while fixture.line() != "done" {}
    interrupt(recorder);
    let said = said.join().unwrap();
    let profile = typed(&read_profile(&out));
    let process = tests::record::process_of(&profile, fixture.pid());
    assert_eq!(process.samples, 0, "{process:#?}");
    assert!(
        process
            .incomplete
            .iter()
            .any(|why| why.contains("the program set runtime.MemProfileRate to 0")),
        "{process:#?}\n{said}"
    );
}

/// A position-independent Go executable (as several distributions build them): its
/// variables are found at its load bias. Its exact totals equal TotalAlloc; a program that
/// turns its sampler off and exits within a moment is told from the rate its exit left
/// (read by the kernel then), its estimates unbounded above rather than wrongly bounded.
#[test]
fn a_position_independent_go_program_is_read_at_its_load_bias() {
    tests::require_bpf!();
    let program = go_fixture_pie("goalloc");
    let dir = TempDir::new("go-pie");
    let counts = dir.path("counts.txt");
    let out = counts.to_str().unwrap();
    let recorded = Record::command(&program, &["-rounds", "100000", "-out", out]).run();
    let truth = Truth::parse(&std::fs::read_to_string(&counts).unwrap());
    let process = recorded.only_process();
    assert!(process.samples > 100, "{process:#?}");
    assert_near(
        process.exact.bytes,
        truth.total,
        "TotalAlloc",
        &recorded.stderr,
    );
    // Its runtime sampled while it started, then the program set the rate to 0.
    let recorded =
        Record::command(&program, &["-rate", "0", "-rounds", "20000", "-out", out]).run();
    let process = recorded.only_process();
    let truth = Truth::parse(&std::fs::read_to_string(&counts).unwrap());
    assert_near(
        process.exact.bytes,
        truth.total,
        "TotalAlloc",
        &recorded.stderr,
    );
    let said = process.incomplete.join("\n");
    assert!(
        said.contains("the program set runtime.MemProfileRate to 0"),
        "{said}\n{}",
        recorded.stderr
    );
    assert!(
        process.alloc_bytes.upper.is_infinite(),
        "{:?}",
        process.alloc_bytes
    );
    assert!(process.alloc_bytes.lower <= truth.total as f64);
}

/// A Go program that execs itself twice (same pid, a new runtime each time, as a service
/// upgrading in place does), recorded from its start: its exact totals are read again in
/// each new program and added up, each earlier one's by the kernel as it exec'd.
#[test]
fn a_go_program_that_execs_itself_is_read_in_each_program() {
    tests::require_bpf!();
    let dir = TempDir::new("go-reexec");
    let counts = dir.path("counts.txt");
    let recorded = Record::command(go_fixture("goalloc"), &reexec_args(&counts)).run();
    let programs = reexec_truths(&counts);
    let all: u64 = programs.iter().map(|p| p.total).sum();
    let process = recorded.only_process();
    let source = process.exact_source.as_deref().unwrap_or_default();
    assert!(
        source.contains("read at its exit")
            && source.ends_with("; 3 Go programs it ran one after another, added up"),
        "{source}\n{}",
        recorded.stderr
    );
    // Each program's TotalAlloc as it wrote its counts, and the little it allocated after
    // (its exec's arguments, or its last words).
    assert_near(
        process.exact.bytes,
        all,
        "TotalAlloc of each program",
        &recorded.stderr,
    );
    assert!(
        process.exact.bytes >= all,
        "{} of {all}",
        process.exact.bytes
    );
    // Its samples too: each new program is probed again (an exec from a thread other than
    // its leader leaves a program without its process's probes), a few ms after its exec.
    assert!(
        process.alloc_bytes.upper >= 0.9 * all as f64,
        "{:?} of {all}\n{}",
        process.alloc_bytes,
        recorded.stderr
    );
}

/// A running Go program read, not probed (`-p`), that execs itself twice: its heap profile
/// and its totals are read again in each new program, from zero (its runtime began at the
/// exec, which the recording saw).
#[test]
fn a_go_program_read_while_running_is_read_again_after_its_exec() {
    tests::require_bpf!();
    let dir = TempDir::new("go-reexec-attached");
    let counts = dir.path("counts.txt");
    let args = [&["-rate", "65536", "-wait"][..], &reexec_args(&counts)].concat();
    let mut fixture = Fixture::start_binary(&go_fixture("goalloc"), &args, &[]);
    fixture.expect("ready");
    let out = dir.path("reexec.json");
    let pid = fixture.pid().to_string();
    let (mut recorder, stderr) =
        start_recording(&["record", "-o", out.to_str().unwrap(), "-p", &pid]);
    let said = tests::drain(stderr);
    // Each program waits for a line once it is running (its runtime set up, found).
    for left in ["2", "1", ""] {
        if !left.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        fixture.go();
        if !left.is_empty() {
            assert_eq!(fixture.line().split(' ').next(), Some("elapsed_ns"));
            fixture.expect("ready");
        }
    }
    let _ = counts_until_done(&mut fixture);
    let status = recorder.wait().unwrap();
    let said = said.join().unwrap();
    assert!(status.success(), "{status}\n{said}");
    let programs = reexec_truths(&counts);
    let profile = typed(&read_profile(&out));
    let process = tests::record::process_of(&profile, fixture.pid());
    // Totals: the first program's since the wait, the others' whole.
    let truth = programs[0].since_wait + programs[1].total + programs[2].total;
    assert_near(process.exact.bytes, truth, "TotalAlloc", &said);
    assert!(
        process.allocators.iter().all(|a| a.ends_with(READ)),
        "{:?}",
        process.allocators
    );
    // Samples: every program's (each loop is one third); a program's last 100 ms before
    // its exec may be unread, and is said to be.
    let looped: u64 = programs.iter().map(|p| p.looped).sum();
    let estimate = process.alloc_bytes.estimate;
    assert!(
        estimate > 0.75 * looped as f64 && process.alloc_bytes.lower <= looped as f64,
        "{:?} against {looped} looped in three programs\n{said}",
        process.alloc_bytes
    );
    assert!(
        process
            .incomplete
            .iter()
            .any(|why| why.contains("before it exec'd another were not read")),
        "{:?}\n{said}",
        process.incomplete
    );
}

/// `goalloc`'s arguments for three programs in one process (two execs of itself), each
/// writing its counts to `counts` with a suffix: `.2`, `.1`, then none.
fn reexec_args(counts: &std::path::Path) -> [&str; 8] {
    let out = counts.to_str().unwrap();
    [
        "-rounds",
        "1000000",
        "-leak-every",
        "0",
        "-reexec",
        "2",
        "-out",
        out,
    ]
}

/// What each of [`reexec_args`]'s three programs counted itself, in the order they ran.
fn reexec_truths(counts: &std::path::Path) -> [Truth; 3] {
    [".2", ".1", ""].map(|suffix| {
        let file = format!("{}{suffix}", counts.display());
        Truth::parse(&std::fs::read_to_string(file).unwrap())
    })
}
