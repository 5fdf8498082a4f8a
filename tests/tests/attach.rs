//! `record -p` on a running process loads allocscope's in-process sampler into it
//! (`--front-end auto`, the default; see allocscope-target's `inject`). Against a real
//! multithreaded program that frees across threads, forks and dlopens meanwhile, and checks
//! every block it frees (tests/fixtures/attach.c): attached and detached many times, its
//! blocks all whole and its children's statuses right; allocscope killed with SIGKILL
//! during and after the switch, the program runs on; where the sampler cannot be loaded
//! (a static program, one traced already), uprobes count it and the profile says why, and
//! `--front-end in-process` refuses before anything is attached.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use tests::{
    allocscope, fixture, fixture_as, read_typed, record::process_of, start_recording, TempDir,
};

/// The attach fixture, started, after its "ready" line.
struct Target {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Target {
    fn start(args: &[&str]) -> Target {
        Target::of(&fixture("attach", &["-lpthread", "-ldl"]), args)
    }

    /// The switch fixture (tests/fixtures/switch.c) in `mode` (`fp`, `sleep`).
    fn switch(mode: &str) -> Target {
        Target::of(&fixture("switch", &["-lpthread"]), &[mode])
    }

    fn of(binary: &std::path::Path, args: &[&str]) -> Target {
        use std::io::BufRead as _;
        let mut child = Command::new(binary)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert!(line.starts_with("ready "), "fixture said {line:?}");
        Target {
            child,
            stdin,
            stdout,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Stops it; what it said and its exit code.
    fn stop(mut self) -> (String, Option<i32>) {
        use std::io::{Read as _, Write as _};
        self.stdin.write_all(b"stop\n").unwrap();
        self.stdin.flush().unwrap();
        let mut said = String::new();
        self.stdout.read_to_string(&mut said).unwrap();
        (said, self.child.wait().unwrap().code())
    }
}

fn record_for(pid: u32, seconds: &str, out: &std::path::Path, extra: &[&str]) -> (bool, String) {
    let output = Command::new(allocscope())
        .args(["record", "-v", "-p", &pid.to_string(), "-d", seconds, "-o"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn attached_and_detached_many_times_the_program_stays_whole() {
    tests::require_bpf!();
    let dir = TempDir::new("attach-many");
    let target = Target::start(&["4", "churn"]);
    let pid = target.pid();
    for round in 0..100 {
        let out = dir.path(&format!("r{round}.json"));
        // The first (the loading) long enough, and its bounds wide enough, to check the
        // estimate against the exact count without a flaky test.
        let (ok, err) = if round == 0 {
            record_for(pid, "0.5s", &out, &["--confidence", "0.9999"])
        } else {
            record_for(pid, "0.05s", &out, &[])
        };
        assert!(ok, "round {round}: {err}");
        let profile = read_typed(&out);
        let me = process_of(&profile, pid);
        assert_eq!(me.front_end, "in-process", "round {round}: {me:#?}");
        assert!(me.exact.calls > 0, "round {round}");
        if round == 0 {
            // Loaded now, by one thread stopped briefly (said with -v).
            assert!(err.contains("in-process sampler loaded (thread"), "{err}");
            assert!(err.contains("ms; loaded in"), "{err}");
            tests::assert_bounds_exact(me);
        } else {
            // Found loaded by an earlier recording: counted on in its region.
            assert!(
                !err.contains("in-process sampler loaded"),
                "round {round}: {err}"
            );
        }
    }
    let (said, code) = target.stop();
    assert_eq!((said.trim(), code), ("ok 1", Some(0)), "{said}");
}

#[test]
fn allocscope_killed_during_or_after_the_switch_leaves_the_program_running() {
    tests::require_bpf!();
    let dir = TempDir::new("attach-kill");
    for delay_ms in [0, 2, 5, 10, 20, 40, 80, 160, 400] {
        let mut target = Target::start(&["3", "churn"]);
        let mut recorder = Command::new(allocscope())
            .args(["record", "-p", &target.pid().to_string(), "-o"])
            .arg(dir.path(&format!("k{delay_ms}.json")))
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        recorder.kill().unwrap();
        recorder.wait().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            target.running(),
            "killed {delay_ms} ms in: the program ended"
        );
        let (said, code) = target.stop();
        assert_eq!(
            (said.trim(), code),
            ("ok 1", Some(0)),
            "killed {delay_ms} ms in"
        );
    }
}

/// The steps of the switch where `ALLOCSCOPE_INJECT_PAUSE` holds allocscope (see
/// allocscope-target's `inject::thread`), in order.
const STEPS: [&str; 5] = [
    "mmap-set",
    "mmap-entry",
    "mmap-exit",
    "restored",
    "call-set",
];

/// Its mappings both writable and executable (the switch never makes one).
fn writable_and_executable(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(1).is_some_and(|p| p.starts_with("rwx")))
        .count()
}

fn maps_the_library(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .contains("libsampler_preload")
}

#[test]
fn a_thread_taken_in_its_own_code_or_asleep_resumes_exactly_as_it_was() {
    tests::require_bpf!();
    let dir = TempDir::new("attach-exact");
    // The main thread is taken first: computing in vector registers (its own code), or
    // in a nanosleep the stop interrupts. The fixture checks every sum and every sleep.
    for mode in ["fp", "sleep"] {
        for round in 0..4 {
            let target = Target::switch(mode);
            let pid = target.pid();
            std::thread::sleep(Duration::from_millis(30));
            let out = dir.path(&format!("{mode}{round}.json"));
            let (ok, err) = record_for(pid, "0.3s", &out, &[]);
            assert!(ok, "{mode} {round}: {err}");
            assert!(
                err.contains(&format!(
                    "pid {pid}: in-process sampler loaded (thread {pid} "
                )),
                "{mode} {round}: the main thread was not the one taken: {err}"
            );
            let (said, code) = target.stop();
            assert_eq!((said.trim(), code), ("ok 1", Some(0)), "{mode} {round}");
        }
    }
}

#[test]
fn allocscope_killed_at_each_step_of_the_switch_leaves_the_program_as_it_was() {
    tests::require_bpf!();
    let dir = TempDir::new("attach-steps");
    for mode in ["fp", "sleep", "attach"] {
        for step in STEPS {
            let mut target = if mode == "attach" {
                Target::start(&["3", "churn"])
            } else {
                Target::switch(mode)
            };
            let pid = target.pid();
            std::thread::sleep(Duration::from_millis(30));
            let mut recorder = Command::new(allocscope())
                .args(["record", "-p", &pid.to_string(), "-o"])
                .arg(dir.path(&format!("{mode}-{step}.json")))
                .env("ALLOCSCOPE_INJECT_PAUSE", step)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::BufRead as _;
            let paused = std::io::BufReader::new(recorder.stderr.take().unwrap())
                .lines()
                .map_while(Result::ok)
                .any(|line| line.contains(&format!("paused at {step}")));
            assert!(paused, "{mode}: allocscope never paused at {step}");
            recorder.kill().unwrap();
            recorder.wait().unwrap();
            std::thread::sleep(Duration::from_millis(300));
            assert!(
                target.running(),
                "{mode}: killed at {step}: the program ended"
            );
            // Its mmap ran or not, the thread came back through the resume frame; no page of
            // the switch's is executable.
            assert_eq!(writable_and_executable(pid), 0, "{mode} {step}");
            if step == "call-set" {
                // Let go with the call set up: it loads the library on its own.
                assert!(tests::wait_until(Duration::from_secs(3), || {
                    maps_the_library(pid)
                }));
            } else {
                assert!(!maps_the_library(pid), "{mode} {step}");
            }
            let (said, code) = target.stop();
            assert_eq!(
                (said.trim(), code),
                ("ok 1", Some(0)),
                "{mode}: killed at {step}"
            );
        }
    }
}

#[test]
fn where_the_sampler_cannot_be_loaded_uprobes_count_and_say_why() {
    tests::require_bpf!();
    let dir = TempDir::new("attach-refused");
    // A static program: no dlopen to call.
    let static_binary = fixture_as("attach", "attach-static", &["-static", "-lpthread"]);
    let mut child = Command::new(&static_binary)
        .arg("2")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(200));
    let out = dir.path("static.json");
    let (ok, err) = record_for(pid, "0.5s", &out, &[]);
    assert!(ok, "{err}");
    let profile = read_typed(&out);
    let me = process_of(&profile, pid);
    assert!(me.front_end.starts_with("uprobes (no dlopen"), "{me:#?}");
    assert!(me.exact.calls > 0);
    assert!(err.contains("counted by uprobes (no dlopen"), "{err}");
    child.kill().unwrap();
    child.wait().unwrap();

    // A process traced already (by this test): left to its tracer, counted by uprobes.
    let target = Target::start(&["2"]);
    let pid = target.pid();
    // SAFETY: PTRACE_SEIZE of our own child; it runs on, traced.
    let seized = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    assert_eq!(seized, 0, "{}", std::io::Error::last_os_error());
    let out = dir.path("traced.json");
    let (ok, err) = record_for(pid, "0.5s", &out, &[]);
    assert!(ok, "{err}");
    let profile = read_typed(&out);
    let me = process_of(&profile, pid);
    // The tracer is this thread.
    // SAFETY: gettid has no preconditions.
    let expected = format!("uprobes (traced by pid {} already)", unsafe {
        libc::gettid()
    });
    assert_eq!(me.front_end, expected, "{me:#?}");
    assert!(me.exact.calls > 0);
    // Asked for in-process: an error before anything is attached.
    let out = dir.path("refused.json");
    let (ok, err) = record_for(pid, "0.5s", &out, &["--front-end", "in-process"]);
    assert!(
        !ok && err.contains("cannot load the in-process sampler"),
        "{err}"
    );
    assert!(!out.exists());
    let (said, code) = target.stop();
    assert_eq!((said.trim(), code), ("ok 1", Some(0)));
}

#[test]
fn top_and_record_count_the_loaded_process_in_process() {
    tests::require_bpf!();
    // Ctrl-C ends the recording of a process it was loaded into, profile written.
    let dir = TempDir::new("attach-interrupt");
    let target = Target::start(&["2"]);
    let out = dir.path("i.json");
    let (recorder, stderr) = start_recording(&[
        "record",
        "-p",
        &target.pid().to_string(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let rest = tests::drain(stderr);
    std::thread::sleep(Duration::from_millis(300));
    tests::interrupt(recorder);
    let rest = rest.join().unwrap();
    assert!(rest.contains("counted in-process"), "{rest}");
    let profile = read_typed(&out);
    assert_eq!(process_of(&profile, target.pid()).front_end, "in-process");
    let (said, code) = target.stop();
    assert_eq!((said.trim(), code), ("ok 1", Some(0)));
}

#[test]
fn a_running_interpreter_says_what_it_leaves_out() {
    tests::require_bpf!();
    let dir = TempDir::new("attach-python");
    let script = "import time\nd = {}\nwhile True:\n    for i in range(1000):\n        d[i] = [str(i)] * 3\n    d.clear()\n    time.sleep(0.001)\n";
    let mut python = Command::new(tests::pythons::DEBIAN)
        .args(["-c", script])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = dir.path("py.json");
    let (ok, err) = record_for(python.id(), "0.5s", &out, &[]);
    python.kill().unwrap();
    python.wait().unwrap();
    assert!(ok, "{err}");
    let profile = read_typed(&out);
    let me = process_of(&profile, python.id());
    assert_eq!(me.front_end, "in-process", "{me:#?}");
    assert!(me.exact.calls > 0);
    let incomplete = me.incomplete.join("\n");
    assert!(incomplete.contains("pymalloc's small objects"), "{me:#?}");
    assert!(
        err.contains("incomplete: pymalloc's small objects"),
        "{err}"
    );
}

#[test]
fn loaded_into_glibc_jemalloc_tcmalloc_and_mimalloc_processes_every_site_is_bounded() {
    tests::require_bpf!();
    const ROUNDS: u64 = 2000;
    let dir = TempDir::new("attach-allocators");
    let out = dir.path("allocators.json");
    let preloads = [
        None,
        Some("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
        Some("/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"),
        Some("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"),
    ];
    // Each waits for a line before it allocates: loaded into while it waits, then counted
    // from its first call (the same workload reach.rs probes with uprobes).
    let mut workloads: Vec<tests::Workload> = preloads
        .iter()
        .map(|preload| {
            let mut command = Command::new(fixture("workload", &[]));
            if let Some(library) = preload {
                command.env("LD_PRELOAD", library);
            }
            tests::Workload::start_with(command, ROUNDS, &[])
        })
        .collect();
    // Counted in-process, the four run at full speed: a coarser interval and frame-pointer
    // stacks keep their samples within what the ring buffer takes.
    let mut args = vec![
        "record".to_owned(),
        "--interval".into(),
        "256KiB".into(),
        "--unwind".into(),
        "fp".into(),
        "--confidence".into(),
        "0.9999".into(),
        "-o".into(),
        out.display().to_string(),
    ];
    for workload in &workloads {
        args.extend(["-p".to_owned(), workload.pid().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (recorder, stderr) = start_recording(&args);
    let drained = tests::drain(stderr);
    for workload in &mut workloads {
        workload.go();
    }
    for workload in &mut workloads {
        assert_eq!(workload.line(), "done");
    }
    tests::interrupt(recorder);
    let said = drained.join().unwrap();
    let profile = read_typed(&out);
    for workload in &workloads {
        let pid = workload.pid();
        assert_eq!(process_of(&profile, pid).front_end, "in-process", "{said}");
        tests::check_workload_profile(&profile, pid, ROUNDS);
    }
}
