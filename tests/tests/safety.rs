//! Running as root safely: outputs never replace devices, FIFOs or other users' files,
//! children never outlive us, the command's exit status is passed on, SIGHUP saves the
//! recording, `--keep` deletes only our own snapshots, and names from targets cannot drive
//! the user's terminal; a FIFO planted at a debug link cannot hang symbolization.

use std::{
    io::{BufReader, Read as _},
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    process::{Command, Stdio},
    time::Duration,
};

use tests::{
    allocscope, drain, files_under, fixture, read_profile, run, start_recording, wait_until,
    TempDir,
};

fn stderr_of(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn devices_and_fifos_are_refused_before_attaching() {
    tests::require_bpf!();
    let dir = TempDir::new("safety-devices");
    // Devices of our own (the same as /dev/null and /dev/full): a binary with this bug
    // replaces these, not the machine's.
    let (null, full) = (dir.path("null"), dir.path("full"));
    for (node, minor) in [(&null, "3"), (&full, "7")] {
        let made = Command::new("mknod")
            .arg(node)
            .args(["c", "1", minor])
            .status();
        assert!(made.unwrap().success(), "mknod {}", node.display());
    }
    let fifo = dir.path("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let null_link = dir.path("null.json");
    std::os::unix::fs::symlink(&null, &null_link).unwrap();
    let outputs = [&null, &full, &fifo, &null_link];
    for output in outputs.map(|path| path.to_str().unwrap()) {
        let result = run(&["record", "-o", output, "--", "true"]);
        let stderr = stderr_of(&result);
        assert_eq!(result.status.code(), Some(2), "{output}: {stderr}");
        assert!(stderr.contains("not a regular file"), "{output}: {stderr}");
        assert!(
            !stderr.contains("recording"),
            "{output}: attached:\n{stderr}"
        );
    }
    for device in [&null, &full] {
        let kind = std::fs::symlink_metadata(device).unwrap().file_type();
        assert!(
            kind.is_char_device(),
            "{} is still a device",
            device.display()
        );
    }
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    // `report` converts into the same kind of file, and refuses the same way.
    let result = run(&["report", "/nonexistent.json", "-o", null.to_str().unwrap()]);
    assert_eq!(result.status.code(), Some(2), "{}", stderr_of(&result));
    assert!(stderr_of(&result).contains("not a regular file"));
}

#[test]
fn profiles_are_private_and_replace_links_not_their_targets() {
    tests::require_bpf!();
    let dir = TempDir::new("safety-links");
    // A shared directory, as /tmp is: anyone may plant names in it.
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = dir.path("victim");
    std::fs::write(&victim, "precious").unwrap();
    let output = dir.path("heap.json");
    std::os::unix::fs::symlink(&victim, &output).unwrap();
    // The names the writer used to pick (`.NAME.allocscope-PID`) for the next pids.
    // SAFETY: getpid has no preconditions.
    let next = unsafe { libc::getpid() } as u32;
    for pid in next..next + 200 {
        let planted = dir.path(&format!(".heap.json.allocscope-{pid}"));
        std::os::unix::fs::symlink(&victim, planted).unwrap();
    }
    let workload = fixture("workload", &[]);
    let result = Command::new(allocscope())
        .args(["record", "-i", "4KiB", "-o"])
        .arg(&output)
        .arg("--")
        .arg(&workload)
        .arg("20")
        .output()
        .unwrap();
    assert!(result.status.success(), "{}", stderr_of(&result));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let written = std::fs::symlink_metadata(&output).unwrap();
    assert!(
        written.file_type().is_file(),
        "the link itself was replaced"
    );
    assert_eq!(written.permissions().mode() & 0o777, 0o600);
    read_profile(&output);
    let leftovers: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.contains("allocscope-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// Reads `stdout` to its end on a thread; true if that happened within `timeout` (no
/// process holds the pipe any more).
fn closes_within(mut stdout: std::process::ChildStdout, timeout: Duration) -> bool {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = stdout.read_to_end(&mut sink);
        let _ = done.send(());
    });
    finished.recv_timeout(timeout).is_ok()
}

#[test]
fn a_command_never_outlives_a_killed_start() {
    tests::require_bpf!();
    let dir = TempDir::new("safety-orphans");
    // Killed while the child waits to be released, while the probes attach, and after.
    for delay_ms in [0u64, 5, 20, 50, 120, 400] {
        let mut allocscope = Command::new(allocscope())
            .args(["record", "-o"])
            .arg(dir.path("x.json"))
            .args(["--", "sleep", "30"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = allocscope.stdout.take().unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        allocscope.kill().unwrap();
        allocscope.wait().unwrap();
        assert!(
            closes_within(stdout, Duration::from_secs(5)),
            "killed after {delay_ms} ms: a child still holds allocscope's stdout"
        );
    }
}

#[test]
fn the_command_exit_status_is_passed_on() {
    tests::require_bpf!();
    let dir = TempDir::new("safety-status");
    let out = dir.path("x.json");
    let out = out.to_str().unwrap();
    for (command, code) in [("exit 0", 0), ("exit 3", 3), ("kill -USR1 $$", 128 + 10)] {
        let result = run(&["record", "-o", out, "--", "sh", "-c", command]);
        assert_eq!(
            result.status.code(),
            Some(code),
            "{command}: {}",
            stderr_of(&result)
        );
        read_profile(std::path::Path::new(out));
    }
    let result = run(&["record", "-o", out, "--", "false"]);
    assert_eq!(result.status.code(), Some(1), "{}", stderr_of(&result));
}

#[test]
fn sighup_stops_and_saves_the_recording() {
    tests::require_bpf!();
    let dir = TempDir::new("safety-sighup");
    let out = dir.path("x.json");
    let workload = fixture("workload", &[]);
    let (mut child, _stderr) = start_recording(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        workload.to_str().unwrap(),
        "1000000",
    ]);
    // The command ran (some of its calls counted) before the hang-up.
    let ran = tests::wait_until(Duration::from_secs(30), || {
        tests::awaited::children(child.id())
            .into_iter()
            .any(|command| tests::awaited::cpu_time(command) >= Duration::from_millis(30))
    });
    assert!(ran, "the command did not run");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGHUP) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let profile = read_profile(&out);
    assert!(profile["processes"][0]["exact"]["calls"].as_u64().unwrap() > 0);
}

#[test]
fn keep_deletes_only_our_own_snapshots() {
    tests::require_bpf!();
    let dir = TempDir::new("safety-keep");
    let foreign = [
        "allocscope-2000-01-01T00-00-00.000Z.json",
        "allocscope-notes.json",
    ];
    for name in foreign {
        std::fs::write(dir.path(name), "the user's").unwrap();
    }
    let workload = fixture("workload", &[]);
    let result = Command::new(allocscope())
        .args([
            "record", "--every", "200ms", "--keep", "2", "-d", "1500ms", "-o",
        ])
        .arg(&dir.0)
        .arg("--")
        .arg(&workload)
        .args(["1000000", "--forever"])
        .output()
        .unwrap();
    assert!(result.status.success(), "{}", stderr_of(&result));
    for name in foreign {
        assert_eq!(
            std::fs::read_to_string(dir.path(name)).unwrap(),
            "the user's",
            "{name} was touched"
        );
    }
    let ours = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("allocscope-20") && !foreign.contains(&name.as_str()))
        .count();
    assert_eq!(ours, 2, "--keep 2 keeps two of ours");
}

/// `--every -o DIR` where another user planted DIR as a symlink in a sticky
/// world-writable directory (`/tmp` with `fs.protected_symlinks` off), directly or as a
/// middle component: refused before anything is attached, and nothing is written where the
/// link points. (Issue #29, item 2.)
#[test]
fn snapshots_never_follow_a_symlink_another_user_planted() {
    tests::require_bpf!();
    let dir = TempDir::new("safety-planted");
    let shared = dir.path("tmp");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = dir.path("victim");
    std::fs::create_dir_all(victim.join("inner")).unwrap();
    let planted = shared.join("snaps");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let c = std::ffi::CString::new(planted.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: lchown with a NUL-terminated path: the link now belongs to "nobody".
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), 65534, 65534) }, 0);
    for target in [planted.clone(), planted.join("inner"), planted.join("new")] {
        let result = Command::new(allocscope())
            .args(["record", "--every", "200ms", "-d", "1s", "-o"])
            .arg(&target)
            .args(["--", "true"])
            .output()
            .unwrap();
        let stderr = stderr_of(&result);
        assert_eq!(
            result.status.code(),
            Some(2),
            "{}: {stderr}",
            target.display()
        );
        assert!(
            stderr.contains("a symlink another user (uid 65534) made"),
            "{}: {stderr}",
            target.display()
        );
    }
    let written = files_under(&victim);
    assert!(
        written.is_empty(),
        "written through the planted link: {written:?}"
    );
    assert!(
        !victim.join("new").exists(),
        "a directory was made through the planted link"
    );
}

#[test]
fn escape_sequences_in_names_never_reach_the_terminal() {
    tests::require_bpf!();
    let dir = TempDir::new("safety-escapes");
    // The process name (comm) is the name it was exec'd under: an escape sequence that
    // would clear the screen and set the terminal's title.
    let hostile = dir.path("\x1b[2J\x1b]0;x\x07w");
    std::os::unix::fs::symlink(fixture("workload", &[]), &hostile).unwrap();
    let out = dir.path("x.json");
    let result = Command::new(allocscope())
        .args(["record", "-i", "4KiB", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&hostile)
        .arg("50")
        .output()
        .unwrap();
    let stderr = stderr_of(&result);
    assert!(result.status.success(), "{stderr}");
    assert!(
        !stderr.contains('\x1b') && !stderr.contains('\x07'),
        "raw: {stderr:?}"
    );
    assert!(stderr.contains("\\x1b[2J"), "escaped name shown: {stderr}");
    let report = run(&["report", out.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success());
    assert!(
        !shown.contains('\x1b') && shown.contains("\\x1b[2J"),
        "{shown:?}"
    );
    // The JSON keeps the true name (JSON escapes it).
    let profile = read_profile(&out);
    assert_eq!(
        profile["processes"][0]["command"].as_str().unwrap(),
        "\x1b[2J\x1b]0;x\x07w"
    );
}

/// A target's owner plants a FIFO where the binary's `.gnu_debuglink` points (next to the
/// binary). The symbolizer must not open it (a blocking open would wait for a writer
/// forever, and stopping would wait on the symbolizer): the recording ends on its own,
/// says why that module's separate debug info was not read, and still names the functions
/// from the binary's own symbol table. (Issue #29, item 1.)
#[test]
fn a_fifo_at_a_debug_link_does_not_hang_symbolization() {
    tests::require_bpf!();
    let dir = TempDir::new("debuglink-fifo");
    let program = dir.path("p");
    std::fs::copy(fixture("workload", &[]), &program).unwrap();
    let tool = |name: &str, args: &[&std::ffi::OsStr]| {
        let status = Command::new(name).args(args).status().unwrap();
        assert!(status.success(), "{name} {args:?} failed");
    };
    let debug = dir.path("p.dbg");
    tool(
        "objcopy",
        &[
            "--only-keep-debug".as_ref(),
            program.as_os_str(),
            debug.as_os_str(),
        ],
    );
    tool("strip", &["--strip-debug".as_ref(), program.as_os_str()]);
    // objcopy reads the file for its checksum and records its base name.
    let link = format!("--add-gnu-debuglink={}", debug.display());
    tool("objcopy", &[link.as_ref(), program.as_os_str()]);
    std::fs::remove_file(&debug).unwrap();
    let c = std::ffi::CString::new(debug.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let out = dir.path("profile.json");
    let mut recorder = Command::new(allocscope())
        .args(["record", "--interval", "64KiB", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&program)
        .arg("200")
        .current_dir(&dir.0)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = drain(BufReader::new(recorder.stderr.take().unwrap()));
    let finished = wait_until(Duration::from_secs(60), || {
        recorder.try_wait().unwrap().is_some()
    });
    if !finished {
        let _ = recorder.kill();
        let _ = recorder.wait();
        panic!(
            "allocscope hung on the FIFO at the debug link:\n{}",
            stderr.join().unwrap()
        );
    }
    let status = recorder.wait().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("p.dbg is a FIFO"),
        "the skipped debug info is not explained:\n{stderr}"
    );
    let profile = read_profile(&out);
    let named = profile["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["frames"][0]["function"] == "site_calloc");
    assert!(
        named,
        "the binary's own symbols must still name its functions:\n{stderr}"
    );
}
