//! Whole stacks in code built the way distributions build it (-O2, no frame pointers): C
//! fixtures whose `rbp` holds data, C++ allocations through Debian's libstdc++, and Debian's
//! own python3. Each allocation site must be found under its true callers up to `main`,
//! with its bytes inside its bounds, and no stack may show a frame that is not a return
//! address.

use std::process::Command;

use allocscope_model::schema::{FrameInfo, StackEnd, Unwinding};
use tests::{
    allocscope, files_under, fixture, read_profile,
    record::{Profile, StackProfile},
    spawn_with_first_line, typed, Record, TempDir,
};

const CONFIDENCE: &str = "0.9999";

/// Records `command` (program and arguments) with `flags`; returns the profile and the
/// program's pid.
fn record(flags: &[&str], command: &[&str]) -> (Profile, u32) {
    let recorded = Record::command(command[0], &command[1..])
        .flags(flags)
        .flags(&["--confidence", CONFIDENCE])
        .run();
    let pid = recorded.profile.processes[0].pid;
    (recorded.profile, pid)
}

fn function(frame: &FrameInfo) -> &str {
    frame.function.as_deref().unwrap_or("?")
}

fn names(stack: &StackProfile) -> Vec<&str> {
    stack.frames.iter().map(function).collect()
}

/// The stacks of `pid` whose frames hold `chain` (prefixes of demangled names), in this
/// order, one right after the other, starting at the first frame that matches `chain[0]`.
fn stacks_through<'p>(profile: &'p Profile, pid: u32, chain: &[&str]) -> Vec<&'p StackProfile> {
    profile
        .stacks
        .iter()
        .filter(|stack| stack.pid == pid)
        .filter(|stack| {
            let names = names(stack);
            names
                .iter()
                .position(|name| name.starts_with(chain[0]))
                .is_some_and(|at| {
                    chain.iter().enumerate().all(|(i, link)| {
                        names.get(at + i).is_some_and(|name| name.starts_with(link))
                    })
                })
        })
        .collect()
}

fn all_stacks(profile: &Profile) -> String {
    profile
        .stacks
        .iter()
        .map(|s| format!("{} samples, end {:?}: {:?}", s.samples, s.end, names(s)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asserts the summed bounds of `stacks` hold `truth` bytes (a conservative check: the sum
/// of the lower bounds is below any sum of estimates the truth could produce, the sum of the
/// upper bounds above).
fn assert_bytes_within(stacks: &[&StackProfile], truth: u64, what: &str, profile: &Profile) {
    let lower: f64 = stacks.iter().map(|s| s.alloc_bytes.lower).sum();
    let upper: f64 = stacks.iter().map(|s| s.alloc_bytes.upper).sum();
    assert!(
        lower <= truth as f64 && truth as f64 <= upper,
        "{what}: truth {truth} outside [{lower}, {upper}]\n{}",
        all_stacks(profile)
    );
}

/// `deep`'s sites: (leaf frame, its caller chain up to main, bytes per call).
const DEEP_SITES: [(&str, [&str; 4], u64); 3] = [
    (
        "site_table",
        ["site_table", "load_table", "phase_load", "main"],
        4000,
    ),
    (
        "site_index",
        ["site_index", "load_index", "phase_load", "main"],
        3000,
    ),
    (
        "site_query",
        ["site_query", "run_query", "phase_query", "main"],
        1500 + 2500,
    ),
];

#[test]
fn c_without_frame_pointers_every_site_reaches_main() {
    tests::require_bpf!();
    let deep = fixture("deep", &["-fomit-frame-pointer"]);
    let calls: u64 = 20_000;
    let command = [deep.to_str().unwrap(), &calls.to_string()];
    // At the allocator's return (frees tracked) and at its entry (alloc-only): the stack
    // is copied from different places, and both must unwind whole.
    for flags in [&["-i", "64KiB"][..], &["-i", "64KiB", "--alloc-only"]] {
        let (profile, pid) = record(flags, &command);
        for (site, chain, bytes) in DEEP_SITES {
            let stacks = stacks_through(&profile, pid, &chain);
            assert!(
                !stacks.is_empty(),
                "{flags:?}: no stack of {site} through {chain:?}\n{}",
                all_stacks(&profile)
            );
            let all_of_site: Vec<&StackProfile> = profile
                .stacks
                .iter()
                .filter(|s| s.pid == pid && names(s)[0] == site)
                .collect();
            assert_eq!(
                stacks.len(),
                all_of_site.len(),
                "{flags:?}: {site} has stacks that do not reach main\n{}",
                all_stacks(&profile)
            );
            assert_bytes_within(&stacks, calls * bytes, site, &profile);
            for stack in stacks {
                assert_eq!(stack.unwound, Some(Unwinding::Dwarf));
                assert!(
                    matches!(stack.end, Some(StackEnd::Root | StackEnd::UnwindFailed)),
                    "{site}: {:?}",
                    stack.end
                );
            }
        }
    }
}

#[test]
fn frame_pointer_walks_through_data_show_no_false_frames() {
    tests::require_bpf!();
    // site_table points rbp at a fake frame whose return address is the text "ion Sele"
    // while it calls malloc: the kernel's frame-pointer walk reads it as a caller. Every
    // frame shown must still be a real one.
    let deep = fixture("deep", &["-fomit-frame-pointer"]);
    let (profile, pid) = record(
        &["-i", "64KiB", "--unwind", "fp"],
        &[deep.to_str().unwrap(), "20000"],
    );
    let stacks = &profile.stacks;
    for stack in stacks.iter().filter(|s| s.pid == pid) {
        assert_eq!(stack.unwound, Some(Unwinding::FramePointers));
        // Every frame is code in a mapped file (a stale return address left on the stack
        // by an earlier call may still pass: it is one, just not of this call).
        for frame in &stack.frames {
            assert!(
                frame.module.is_some(),
                "{frame:?}\n{}",
                all_stacks(&profile)
            );
        }
    }
    // The kernel's walk reads "ion Sele" as site_table's caller: it is in no mapping, so the
    // stack ends there, without it, and says so.
    let table: Vec<&StackProfile> = stacks
        .iter()
        .filter(|s| s.pid == pid && names(s)[0] == "site_table")
        .collect();
    assert!(!table.is_empty(), "{}", all_stacks(&profile));
    for stack in table {
        assert_eq!(names(stack), ["site_table"], "{}", all_stacks(&profile));
        assert_eq!(
            stack.end,
            Some(StackEnd::Unmapped),
            "{}",
            all_stacks(&profile)
        );
    }
}

/// `deep_cpp`'s sites: (our function that allocates, its callers, bytes per call).
const CPP_SITES: [(&str, [&str; 3], u64); 4] = [
    (
        "grow_vectors",
        ["grow_vectors", "phase_build", "main"],
        4000,
    ),
    (
        "make_buffers",
        ["make_buffers", "phase_build", "main"],
        3000,
    ),
    (
        "build_strings",
        ["build_strings", "phase_text", "main"],
        2001,
    ),
    ("make_objects", ["make_objects", "phase_text", "main"], 1024),
];

#[test]
fn cpp_callers_of_operator_new_are_found_through_libstdcxx() {
    tests::require_bpf!();
    let deep = fixture("deep_cpp", &["-fomit-frame-pointer"]);
    let calls: u64 = 20_000;
    let (profile, pid) = record(
        &["-i", "64KiB"],
        &[deep.to_str().unwrap(), &calls.to_string()],
    );
    let mut through_new = 0;
    for (site, chain, bytes) in CPP_SITES {
        let stacks = stacks_through(&profile, pid, &chain);
        assert!(
            !stacks.is_empty(),
            "no stack of {site} through {chain:?}\n{}",
            all_stacks(&profile)
        );
        for stack in &stacks {
            // The leaf is libstdc++'s operator new (Debian builds it without frame
            // pointers): its callers are found by CFI alone.
            if names(stack)[0].starts_with("operator new") {
                through_new += 1;
            }
        }
        assert_bytes_within(&stacks, calls * bytes, site, &profile);
    }
    assert!(
        through_new >= CPP_SITES.len(),
        "operator new as leaf\n{}",
        all_stacks(&profile)
    );
}

#[test]
fn python_stacks_reach_the_interpreter_entry() {
    tests::require_bpf!();
    // Debian's own python3 (built -O2 without frame pointers), not a fixture of ours.
    let python = tests::pythons::DEBIAN;
    assert!(
        std::path::Path::new(python).exists(),
        "Debian's python3 is missing (cargo xtask setup installs python3-minimal)"
    );
    let dir = TempDir::new("python-script");
    let script = dir.path("script.py");
    std::fs::write(
        &script,
        "def grow(n):\n    return [bytearray(3000) for _ in range(n)]\n\
         def main():\n    for _ in range(40):\n        grow(2000)\nmain()\n",
    )
    .unwrap();
    let (profile, pid) = record(&["-i", "64KiB"], &[python, script.to_str().unwrap()]);
    let stacks: Vec<&StackProfile> = profile
        .stacks
        .iter()
        .filter(|s| s.pid == pid && !s.lost)
        .collect();
    let samples = |stacks: &[&StackProfile]| -> u64 { stacks.iter().map(|s| s.samples).sum() };
    let whole: Vec<&StackProfile> = stacks
        .iter()
        .copied()
        .filter(|s| names(s).contains(&"Py_BytesMain") && s.end == Some(StackEnd::Root))
        .collect();
    // bytearray(3000) × 80,000 = 240 MB, nearly all of the script's allocation. Debian's
    // main tail-calls Py_BytesMain: no frame of main's own remains on the stack.
    assert!(
        samples(&whole) * 10 >= samples(&stacks) * 9,
        "{} of {} samples reach Py_BytesMain and the root\n{}",
        samples(&whole),
        samples(&stacks),
        all_stacks(&profile)
    );
}

/// The GNU build id of `binary`, in hex (from `readelf -n`).
fn build_id(binary: &std::path::Path) -> String {
    let output = Command::new("readelf")
        .arg("-n")
        .arg(binary)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find_map(|line| line.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id in {}:\n{text}", binary.display()))
        .to_owned()
}

fn objcopy(args: &[&std::ffi::OsStr]) {
    let status = Command::new("objcopy").args(args).status().unwrap();
    assert!(status.success(), "objcopy {args:?}");
}

/// As distributions ship programs: `deep` stripped, with its symbols and DWARF in a
/// separate file under `DIR/debug/.build-id/xx/rest.debug`. Returns the stripped program,
/// the debug directory and the build id.
fn stripped_deep(dir: &TempDir) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let built = fixture("deep", &["-fomit-frame-pointer"]);
    let stripped = dir.path("deep-stripped");
    let id = build_id(&built);
    let debug_dir = dir.path("debug");
    let debug_file = debug_dir
        .join(".build-id")
        .join(&id[..2])
        .join(format!("{}.debug", &id[2..]));
    std::fs::create_dir_all(debug_file.parent().unwrap()).unwrap();
    objcopy(&[
        "--only-keep-debug".as_ref(),
        built.as_os_str(),
        debug_file.as_os_str(),
    ]);
    let link = format!("--add-gnu-debuglink={}", debug_file.display());
    objcopy(&[
        "--strip-all".as_ref(),
        link.as_ref(),
        built.as_os_str(),
        stripped.as_os_str(),
    ]);
    (stripped, debug_dir, id)
}

#[test]
fn a_stripped_program_is_named_from_its_debug_file_by_build_id() {
    tests::require_bpf!();
    let dir = TempDir::new("debug-dir");
    let (stripped, debug_dir, id) = stripped_deep(&dir);
    let command = [stripped.to_str().unwrap(), "5000"];
    let chain = ["site_table", "load_table", "phase_load", "main"];
    // Without the debug directory the program's own functions have no names.
    let (bare, pid) = record(&["-i", "64KiB"], &command);
    assert!(
        stacks_through(&bare, pid, &chain[..1]).is_empty(),
        "{}",
        all_stacks(&bare)
    );
    let (profile, pid) = record(
        &["-i", "64KiB", "--debug-dir", debug_dir.to_str().unwrap()],
        &command,
    );
    assert!(
        !stacks_through(&profile, pid, &chain).is_empty(),
        "{}",
        all_stacks(&profile)
    );
    // A frame that stays unresolved still names its module, whose build id the profile
    // lists, so `go tool pprof` can symbolize it later.
    let modules = &bare.modules;
    assert!(
        modules
            .iter()
            .any(|m| m.build_id.as_deref() == Some(id.as_str())),
        "{modules:#?}"
    );
}

/// Records a script that calls `PyObject_Malloc(200)` and `PyObject_Malloc(2000)`
/// (`CALLS` times each, freeing each block) through ctypes, from Debian's python3, with
/// `flags`; returns the profile, the pid and the stacks through ctypes' call.
fn record_pymalloc_calls(name: &str, flags: &[&str]) -> (Profile, u32) {
    let dir = TempDir::new(&format!("{name}-script"));
    let script = dir.path("script.py");
    std::fs::write(
        &script,
        format!(
            "import ctypes\n\
             m = ctypes.pythonapi.PyObject_Malloc\n\
             m.restype = ctypes.c_void_p\n\
             m.argtypes = [ctypes.c_size_t]\n\
             f = ctypes.pythonapi.PyObject_Free\n\
             f.argtypes = [ctypes.c_void_p]\n\
             def run(n, size):\n    for _ in range(n):\n        f(m(size))\n\
             run({PYMALLOC_CALLS}, 200)\nrun({PYMALLOC_CALLS}, 2000)\n"
        ),
    )
    .unwrap();
    let flags = [&["-i", "64KiB"], flags].concat();
    record(&flags, &[tests::pythons::DEBIAN, script.to_str().unwrap()])
}

/// Calls of each size in [`record_pymalloc_calls`]'s script.
const PYMALLOC_CALLS: u64 = 100_000;

#[test]
fn pythons_object_allocator_is_counted_once() {
    tests::require_bpf!();
    // PyObject_Malloc serves requests up to 512 bytes from pymalloc's arenas (malloc never
    // sees them) and passes larger ones to malloc: with uprobes, the first must be counted
    // at PyObject_Malloc, the second once, at malloc.
    let (profile, pid) = record_pymalloc_calls("pymalloc-recording", &["--no-preload"]);
    let allocators = profile.processes[0].allocators.join(", ");
    assert!(
        allocators.contains("pymalloc") && allocators.contains("glibc"),
        "{allocators}"
    );
    // Debian's python3 links pymalloc into the executable: with uprobes the profile says
    // the interpreter's own calls are missed (issue #29, item 5), here and in the summary.
    let incomplete = profile.processes[0].incomplete.join("\n");
    assert!(
        incomplete.contains("pymalloc is linked into /usr/bin/python3"),
        "{incomplete}"
    );
    let through_ctypes = stacks_through(&profile, pid, &["ffi_call"]);
    let (large, small): (Vec<&StackProfile>, Vec<&StackProfile>) = through_ctypes
        .iter()
        .partition(|s| names(s)[0] == "PyObject_Malloc");
    // Small: the caller of PyObject_Malloc (libffi) is the leaf.
    assert_bytes_within(
        &small,
        PYMALLOC_CALLS * 200,
        "PyObject_Malloc(200)",
        &profile,
    );
    // Large: malloc called from inside PyObject_Malloc, counted once.
    assert_bytes_within(
        &large,
        PYMALLOC_CALLS * 2000,
        "PyObject_Malloc(2000)",
        &profile,
    );
}

#[test]
fn pythons_object_allocator_is_counted_once_in_process() {
    tests::require_bpf!();
    // The in-process front end wraps CPython's object domain (PyMem_SetAllocator): each
    // call is counted there at its own size, small or large, and the malloc pymalloc makes
    // for a large one is not counted again (twice would put the estimate at 2x).
    let (profile, pid) = record_pymalloc_calls("pymalloc-in-process", &[]);
    let process = &profile.processes[0];
    assert_eq!(process.front_end, "in-process", "{process:#?}");
    assert!(process.incomplete.is_empty(), "counted whole: {process:#?}");
    assert!(process.exact.calls >= 2 * PYMALLOC_CALLS, "{process:#?}");
    let through_ctypes = stacks_through(&profile, pid, &["ffi_call"]);
    assert_bytes_within(
        &through_ctypes,
        PYMALLOC_CALLS * 2200,
        "PyObject_Malloc(200) and (2000), in-process",
        &profile,
    );
}

#[test]
fn debug_files_come_from_debuginfod_when_asked() {
    tests::require_bpf!();
    // A real HTTP server speaking the debuginfod protocol's one request we make
    // (GET /buildid/ID/debuginfo), on loopback.
    let dir = TempDir::new("debuginfod");
    let (stripped, debug_dir, id) = stripped_deep(&dir);
    let served = dir.path("server").join("buildid").join(&id);
    std::fs::create_dir_all(&served).unwrap();
    let debug_file = debug_dir
        .join(".build-id")
        .join(&id[..2])
        .join(format!("{}.debug", &id[2..]));
    std::fs::copy(&debug_file, served.join("debuginfo")).unwrap();
    let (mut server, line) = spawn_with_first_line(
        Command::new(tests::pythons::DEBIAN)
            .args([
                "-u",
                "-m",
                "http.server",
                "0",
                "--bind",
                "127.0.0.1",
                "--directory",
            ])
            .arg(dir.path("server")),
    );
    // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
    let port: u16 = line
        .split_whitespace()
        .skip_while(|word| *word != "port")
        .nth(1)
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    let cache = dir.path("cache");
    let out = dir.path("profile.json");
    let output = Command::new(allocscope())
        .args(["record", "-i", "64KiB", "-o"])
        .arg(&out)
        .env("DEBUGINFOD_URLS", format!("http://127.0.0.1:{port}"))
        .env("DEBUGINFOD_CACHE_PATH", &cache)
        .arg("--")
        .arg(&stripped)
        .arg("5000")
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let profile = typed(&read_profile(&out));
    let pid = profile.processes[0].pid;
    let chain = ["site_table", "load_table", "phase_load", "main"];
    assert!(
        !stacks_through(&profile, pid, &chain).is_empty(),
        "{stderr}\n{}",
        all_stacks(&profile)
    );
    assert!(cache.join(&id).join("debuginfo").exists(), "cached");
}

/// Servers that misbehave, as `DEBUGINFOD_URLS` may name them (issue #29, item 3): one that
/// accepts and never answers, one whose body never ends, one that sends what is not the
/// debug file. The recording still ends soon after its command (each request is bounded,
/// a misbehaving server is not asked again), nothing they sent is kept in the cache, the
/// log says what each did, and no temporary directory is left behind.
#[test]
fn misbehaving_debuginfod_servers_are_bounded() {
    tests::require_bpf!();
    let dir = TempDir::new("debuginfod-hostile");
    let (stripped, _, id) = stripped_deep(&dir);
    let server = dir.path("server.py");
    std::fs::write(
        &server,
        r#"import socket, sys, threading
mode = sys.argv[1]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
held = []
def serve(c):
    c.recv(65536)
    if mode == "silent":
        held.append(c)
        return
    if mode == "endless":
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n")
        chunk = b"\0" * 65536
        try:
            while True:
                c.sendall(chunk)
        except OSError:
            return
    body = b"<html>not a debug file</html>"
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#,
    )
    .unwrap();
    let mut servers = Vec::new();
    let mut urls = Vec::new();
    for mode in ["silent", "endless", "garbage"] {
        let (child, line) =
            spawn_with_first_line(Command::new(tests::pythons::DEBIAN).arg(&server).arg(mode));
        urls.push(format!("http://127.0.0.1:{}", line.trim()));
        servers.push(child);
    }
    let cache = dir.path("cache");
    let tmp = dir.path("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out = dir.path("profile.json");
    let started = std::time::Instant::now();
    let output = Command::new(allocscope())
        .args(["record", "-i", "64KiB", "-o"])
        .arg(&out)
        .env("DEBUGINFOD_URLS", urls.join(" "))
        .env("DEBUGINFOD_CACHE_PATH", &cache)
        .env("TMPDIR", &tmp)
        .arg("--")
        .arg(&stripped)
        .arg("5000")
        .output()
        .unwrap();
    let took = started.elapsed();
    for mut child in servers {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // Three build ids (the program, libc, the loader), each asked of every server still
    // trusted: the silent one costs one request's limit (10 s), then is dropped.
    assert!(
        took < std::time::Duration::from_secs(45),
        "took {took:?}:\n{stderr}"
    );
    for (url, what) in [
        (&urls[0], "no answer"),
        (&urls[1], "sent more than"),
        (&urls[2], "not the debug file"),
    ] {
        assert!(
            stderr.contains(url.as_str()) && stderr.contains(what),
            "{url}: expected {what:?} in:\n{stderr}"
        );
    }
    let kept: Vec<_> = files_under(&cache)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "debuginfo"))
        .collect();
    assert!(kept.is_empty(), "cached what they sent: {kept:?}");
    assert!(
        !cache.join(&id).join("debuginfo").exists(),
        "the build id asked for was never served"
    );
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert!(left.is_empty(), "left behind in TMPDIR: {left:?}");
    // The recording itself is whole: the stack still has its module and offsets.
    let profile = read_profile(&out);
    assert!(!profile["stacks"].as_array().unwrap().is_empty());
}
