//! Bad input fails with a clear message and exit code 2 before anything is attached.

use std::process::{Command, Output};

use tests::{allocscope, fixture, run, TempDir};

fn assert_bad_input(output: &Output, message: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(2),
        "exit code; stderr:\n{stderr}"
    );
    assert!(
        stderr.contains(message),
        "expected {message:?} in:\n{stderr}"
    );
    assert!(
        !stderr.contains("recording pid"),
        "something was attached:\n{stderr}"
    );
}

#[test]
fn invalid_arguments_exit_2() {
    let me = std::process::id().to_string();
    assert_bad_input(
        &run(&["record", "-p", &me, "-i", "0", "-o", "/tmp/x"]),
        "between 1 byte and 4GiB",
    );
    assert_bad_input(
        &run(&["record", "-p", &me, "-i", "many", "-o", "/tmp/x"]),
        "invalid --interval",
    );
    assert_bad_input(
        &run(&["record", "-p", &me, "-d", "soon", "-o", "/tmp/x"]),
        "invalid --duration",
    );
    assert_bad_input(&run(&["record", "-o", "/tmp/x"]), "nothing to profile");
    assert_bad_input(
        &run(&["record", "-p", "abc", "-o", "/tmp/x"]),
        "invalid pid",
    );
    // clap's own usage errors also exit 2.
    assert_bad_input(&run(&["record", "-p", &me]), "--output");
}

#[test]
fn a_stack_cap_that_does_not_fit_in_memory_is_refused() {
    // --max-stacks is tied to what fits: half the memory available at start, at 16 KiB a
    // stack (#29: 418k stacks once took 10.7 GB; a full cap would have exceeded the
    // machine).
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let available: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap();
    let fits = available * 1024 / 2 / (16 << 10);
    let me = std::process::id().to_string();
    let max_stacks = |n: u64| {
        run(&[
            "record",
            "-p",
            &me,
            "--max-stacks",
            &n.to_string(),
            "-o",
            "/tmp/x.json",
        ])
    };
    // A quarter more than fits now (what is available moves a little meanwhile).
    let too_many = fits + fits / 4 + 1;
    if too_many <= 1 << 20 {
        assert_bad_input(&max_stacks(too_many), "more than half of");
    } else {
        eprintln!("more than 32 GiB available: every --max-stacks fits");
    }
    assert_bad_input(&max_stacks(2_000_000), "between 1 and 1048576");
}

#[test]
fn top_without_a_terminal_exits_2() {
    // The test harness's stdin and stdout are pipes, not a TTY.
    let me = std::process::id().to_string();
    let output = Command::new(allocscope())
        .args(["top", "-p", &me])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_bad_input(&output, "allocscope top needs a terminal");
    assert_bad_input(&output, "allocscope record");
    // Its own flags are checked too.
    assert_bad_input(
        &run(&["top", "-p", &me, "--window", "500ms"]),
        "invalid --window",
    );
    assert_bad_input(
        &run(&["top", "-p", &me, "--leaks-older-than", "never"]),
        "invalid --leaks-older-than",
    );
    // A terminal that cannot show a full-screen view (TERM=dumb), on a real pty (script(1),
    // which passes on the exit status): refused, not drawn with escapes it cannot show.
    let command = format!("{} top -p {me}", allocscope().display());
    let output = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("TERM", "dumb")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{shown}");
    assert!(shown.contains("TERM=dumb cannot show"), "{shown}");
}

#[test]
fn missing_pid_exits_2() {
    tests::require_bpf!();
    // pid_max is at most 2^22: this pid cannot exist.
    assert_bad_input(
        &run(&["record", "-p", "4194304", "-o", "/tmp/x.json"]),
        "no such process: pid 4194304",
    );
}

#[test]
fn unwritable_output_exits_2() {
    tests::require_bpf!();
    let me = std::process::id().to_string();
    assert_bad_input(
        &run(&["record", "-p", &me, "-o", "/nonexistent-dir/heap.json"]),
        "cannot write output /nonexistent-dir/heap.json",
    );
}

#[test]
fn target_without_allocator_exits_2() {
    tests::require_bpf!();
    let no_libc = fixture("no_libc", &["-static", "-nostdlib"]);
    assert_bad_input(
        &Command::new(allocscope())
            .args(["record", "-o", "/tmp/x.json", "--"])
            .arg(&no_libc)
            .output()
            .unwrap(),
        "no allocator found",
    );
    let mut child = Command::new(&no_libc).spawn().unwrap();
    let pid = child.id().to_string();
    let output = run(&["record", "-p", &pid, "-o", "/tmp/x.json"]);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_bad_input(&output, "no allocator found");
    assert_bad_input(
        &run(&[
            "record",
            "-o",
            "/tmp/x.json",
            "--",
            "no-such-command-allocscope",
        ]),
        "command not found",
    );
}

#[test]
fn unprivileged_user_exits_2() {
    tests::require_bpf!();
    // Run as nobody with no capabilities, on a copy of the binary nobody can execute.
    let dir = TempDir::new("unprivileged");
    let binary = dir.path("allocscope");
    std::fs::copy(allocscope(), &binary).unwrap();
    let mut perms = std::fs::metadata(&dir.0).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&dir.0, perms).unwrap();
    let me = std::process::id().to_string();
    let output = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&binary)
        .args(["record", "-p", &me, "-o", "/tmp/allocscope-nobody.json"])
        .output()
        .expect("setpriv (util-linux)");
    assert_bad_input(&output, "needs root (or CAP_SYS_ADMIN and CAP_SYS_PTRACE");
}

/// Runs `allocscope ARGS` as root with only `capabilities` (setpriv's list, e.g.
/// `+sys_admin,+sys_ptrace`).
fn run_with_capabilities(capabilities: &str, args: &[&str]) -> Output {
    let list = format!("-all,{capabilities}");
    Command::new("setpriv")
        .arg(format!("--inh-caps={list}"))
        .arg(format!("--bounding-set={list}"))
        .arg(allocscope())
        .args(args)
        .output()
        .expect("setpriv (util-linux)")
}

#[test]
fn the_documented_capabilities_suffice_and_fewer_are_refused_up_front() {
    tests::require_bpf!();
    let dir = TempDir::new("capabilities");
    let out = dir.path("caps.json");
    let workload = fixture("workload", &[]);
    let args = [
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        workload.to_str().unwrap(),
        "20",
    ];
    let enough = run_with_capabilities("+sys_admin,+sys_ptrace", &args);
    assert!(
        enough.status.success(),
        "{}",
        String::from_utf8_lossy(&enough.stderr)
    );
    assert!(out.exists());
    // What the README once said was enough: refused before the command starts, not
    // blamed on the target.
    let too_few = run_with_capabilities("+bpf,+perfmon,+sys_ptrace", &args);
    assert_bad_input(&too_few, "needs root (or CAP_SYS_ADMIN and CAP_SYS_PTRACE");
    assert!(!String::from_utf8_lossy(&too_few.stdout).contains("done"));
}

/// `report` reads only regular files: `/dev/zero` (which never ends) and a FIFO (whose open
/// would wait for a writer forever) are refused at once. (Issue #29, item 4.)
#[test]
fn report_refuses_devices_and_fifos_at_once() {
    let dir = TempDir::new("report-inputs");
    let fifo = dir.path("profile.json");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let started = std::time::Instant::now();
    for (input, what) in [
        ("/dev/zero", "a device"),
        (fifo.to_str().unwrap(), "a FIFO"),
    ] {
        let output = Command::new(allocscope())
            .args(["report", input])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{input}: {stderr}");
        let expected = format!("{what} is not a regular file");
        assert!(stderr.contains(&expected), "{input}: {stderr}");
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

/// An output name with an extension allocscope does not know is refused before anything is
/// attached (it used to get JSON silently). (Issue #29, item 10.)
#[test]
fn unknown_output_extensions_are_refused() {
    let dir = TempDir::new("unknown-extension");
    let out = dir.path("report.htm5");
    assert_bad_input(
        &run(&["record", "-o", out.to_str().unwrap(), "--", "true"]),
        "unknown extension .htm5",
    );
    assert!(!out.exists());
    let input = dir.path("missing.json");
    assert_bad_input(
        &run(&[
            "report",
            input.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]),
        "unknown extension .htm5",
    );
}

/// A closed stderr (`allocscope record … 2>&1 | true`) loses the messages, not the
/// recording: the profile is written and the command's exit status passed on, no panic.
/// (Issue #29, item 8.)
#[test]
fn a_closed_stderr_loses_messages_not_the_recording() {
    tests::require_bpf!();
    let dir = TempDir::new("closed-stderr");
    let out = dir.path("profile.json");
    let mut child = Command::new(allocscope())
        .args([
            "record",
            "-o",
            out.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Nobody reads stderr: every write to it fails (EPIPE).
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(3),
        "the command's status, not a panic's 101"
    );
    assert!(out.exists(), "the recording was lost");
}
