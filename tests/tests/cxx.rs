//! C++'s `operator new` and `delete` under the in-process front end. tcmalloc, jemalloc and
//! mimalloc define them beside `malloc`, and a C++ program's `new` never reaches `malloc`:
//! such a program was counted at 2 calls out of 400,000, silently, both by `record -- CMD`
//! and by `record -p` (its library loaded into the running process). A real C++ program
//! (tests/fixtures/cxx_new.cpp, linked against each allocator as a service would be) is
//! recorded both ways: every call counted, the estimate's bounds holding the exact bytes,
//! and its output (a `std::bad_alloc` thrown through the library and caught, by `new[]` and
//! by the aligned `new[]`) as natively;
//! the throw comes first, so the counts also show the library counting on after it.

use std::{path::PathBuf, process::Command};

use tests::{
    allocscope, assert_bounds_exact, fixture_as, read_typed,
    record::{process_of, Profile},
    start_recording, Fixture, TempDir,
};

const ROUNDS: u64 = 20_000;
/// Per round: four `new`s (and their `delete`s) of 648 bytes in all.
const CALLS: u64 = 4;
const BYTES: u64 = 648;
/// The block the fixture's last `new` asks for, which fails.
const HUGE: u64 = 1 << 62;

/// The fixture's arguments for `allocator`: a `new` that throws too, but under mimalloc
/// (which aborts there, natively too).
fn arguments(allocator: &str, wait: bool) -> Vec<String> {
    let mut args = vec![ROUNDS.to_string()];
    if wait {
        args.push("--wait".into());
    }
    if allocator != "mimalloc" {
        args.push("--throw".into());
    }
    args
}

/// The fixture linked against each allocator (glibc: libstdc++'s `new`, which calls
/// `malloc`). `--no-as-needed`: kept even where libc could have served `malloc`.
fn builds() -> Vec<(&'static str, PathBuf)> {
    [
        ("glibc", None),
        ("tcmalloc", Some("-l:libtcmalloc.so.4")),
        ("jemalloc", Some("-l:libjemalloc.so.2")),
        ("mimalloc", Some("-l:libmimalloc.so.2")),
    ]
    .into_iter()
    .map(|(allocator, library)| {
        let flags: Vec<&str> = library
            .map(|l| vec!["-Wl,--no-as-needed", l])
            .unwrap_or_default();
        let name = format!("cxx_new_{allocator}");
        (allocator, fixture_as("cxx_new", &name, &flags))
    })
    .collect()
}

/// The exact counts of the one process of `profile`, checked against the rounds it ran
/// while counted: every `new` counted once (a few more calls from the C++ runtime's own
/// start), and the estimate's bounds around the exact bytes.
fn check_counts(profile: &Profile, pid: u32, allocator: &str) {
    let me = process_of(profile, pid);
    assert_eq!(me.front_end, "in-process", "{allocator}: {me:#?}");
    let calls = me.exact.calls;
    let mut bytes = me.exact.bytes;
    // libstdc++'s `new` asks `malloc` (and its aligned `new`, `aligned_alloc`) for the
    // blocks too large to succeed: failed calls, counted as `malloc`'s are (an allocator's
    // own `new` throws before it is counted).
    if allocator == "glibc" {
        bytes = bytes
            .checked_sub(2 * HUGE)
            .expect("the failed malloc and aligned_alloc counted");
    }
    assert!(
        (ROUNDS * CALLS..ROUNDS * CALLS + 2_000).contains(&calls),
        "{allocator}: {calls} calls counted for {} new",
        ROUNDS * CALLS
    );
    assert!(
        (ROUNDS * BYTES..ROUNDS * BYTES + (1 << 20)).contains(&bytes),
        "{allocator}: {bytes} bytes counted for {}",
        ROUNDS * BYTES
    );
    assert_bounds_exact(me);
}

#[test]
fn a_cpp_program_is_counted_by_record_under_each_allocator() {
    tests::require_bpf!();
    let dir = TempDir::new("cxx-record");
    for (allocator, binary) in builds() {
        let native = Command::new(&binary)
            .args(arguments(allocator, false))
            .output()
            .unwrap();
        assert!(native.status.success());
        let out = dir.path(&format!("{allocator}.json"));
        let recorded = Command::new(allocscope())
            .args([
                "record",
                "--interval",
                "32KiB",
                "--confidence",
                "0.9999",
                "-o",
            ])
            .arg(&out)
            .arg("--")
            .arg(&binary)
            .args(arguments(allocator, false))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&recorded.stderr);
        assert!(recorded.status.success(), "{allocator}: {said}");
        // The same output: `std::bad_alloc` thrown through the library's `new` and caught.
        assert_eq!(
            String::from_utf8_lossy(&recorded.stdout),
            String::from_utf8_lossy(&native.stdout),
            "{allocator}"
        );
        assert_eq!(
            String::from_utf8_lossy(&native.stdout).contains("aligned bad_alloc caught"),
            allocator != "mimalloc"
        );
        let profile = read_typed(&out);
        check_counts(&profile, profile.processes[0].pid, allocator);
    }
}

#[test]
fn a_running_cpp_program_is_counted_once_loaded_into() {
    tests::require_bpf!();
    let dir = TempDir::new("cxx-attach");
    for (allocator, binary) in builds() {
        let args = arguments(allocator, true);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut program = Fixture::start_binary(&binary, &args, &[]);
        program.expect("ready");
        let out = dir.path(&format!("{allocator}.json"));
        let (recorder, stderr) = start_recording(&[
            "record",
            "-p",
            &program.pid().to_string(),
            "--interval",
            "32KiB",
            "--confidence",
            "0.9999",
            "-o",
            out.to_str().unwrap(),
        ]);
        let said = tests::drain(stderr);
        program.go();
        if allocator != "mimalloc" {
            assert_eq!(program.line(), "bad_alloc caught", "{allocator}");
            assert_eq!(program.line(), "aligned bad_alloc caught", "{allocator}");
        }
        assert!(program.line().starts_with("done "), "{allocator}");
        assert!(program.child.wait().unwrap().success(), "{allocator}");
        // The program exited: the recording ends with it.
        assert!(recorder.wait_with_output().unwrap().status.success());
        let said = said.join().unwrap();
        let profile = read_typed(&out);
        assert!(!profile.processes.is_empty(), "{said}");
        check_counts(&profile, program.pid(), allocator);
    }
}
