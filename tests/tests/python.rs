//! Python frames: real interpreters (Debian's python3 3.11, built with LTO and without
//! frame pointers, the interpreter linked into the executable; pyenv's 3.12 and 3.13, the
//! interpreter in libpython) run a script with known allocation sites. Each site must be
//! found under its whole Python chain (file, function, line) down to `<module>` (or the
//! thread's bootstrap), and where the script knows what a site allocated, the estimate's
//! bounds must hold it. `--python-frames off` must give native stacks only.

use allocscope_model::schema::{FrameInfo, FrameKind};
use tests::{pythons, record::StackProfile, Record, TempDir};

/// The script. `# site:NAME` marks a site's line; `@N` is replaced with the count, `@WAIT`
/// with a line that waits for one on stdin (`-p` attaches meanwhile) or does nothing.
const SCRIPT: &str = r#"import json, sys, threading
N = @N

def comprehension():
    return [bytearray(1000) for _ in range(N)]  # site:comprehension

class Node:
    def __init__(self, i):
        self.buf = bytearray(700)  # site:instance
        self.i = i

def instances():
    return [Node(i) for i in range(N)]  # site:instances

def generate():
    for _ in range(N):
        yield bytearray(1500)  # site:generator

def consume():
    return sum(len(b) for b in generate())  # site:consume

def recurse(depth):
    if depth == 0:
        return [bytearray(2000) for _ in range(N)]  # site:deepest
    return recurse(depth - 1)  # site:recurse

def dict_growth():
    d = {}
    for i in range(N * 4):
        d[i] = i  # site:dict
    return d

def json_call():
    return json.dumps(list(range(N * 2)))  # site:json

def worker(size, out):
    out.append([bytearray(size) for _ in range(N)])  # site:worker

def main():
    keep = [comprehension(), instances(), consume(), recurse(200), dict_growth(), json_call()]  # site:main
    out = []
    threads = [threading.Thread(target=worker, args=(size, out)) for size in (3000, 5000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return keep, out

@WAIT
main()  # site:module
"#;

/// Allocations per site.
const N: u64 = 20_000;

/// The line of `# site:name`.
fn line_of(name: &str) -> u32 {
    let marker = format!("# site:{name}");
    SCRIPT
        .lines()
        .position(|l| l.ends_with(&marker))
        .unwrap_or_else(|| panic!("no {marker}")) as u32
        + 1
}

fn is_python(frame: &FrameInfo, function: &str, line: u32) -> bool {
    frame.kind == Some(FrameKind::Python)
        && frame.function.as_deref() == Some(function)
        && frame.line == Some(line)
        && frame.file.as_deref().is_some_and(|f| f.ends_with("app.py"))
}

/// The Python frames of `stack`, leaf first, as `function:line`.
fn python_chain(stack: &StackProfile) -> Vec<String> {
    stack
        .frames
        .iter()
        .filter(|f| f.kind == Some(FrameKind::Python))
        .map(|f| {
            format!(
                "{}:{}",
                f.function.as_deref().unwrap_or("?"),
                f.line.unwrap_or(0)
            )
        })
        .collect()
}

fn describe(stacks: &[StackProfile]) -> String {
    stacks
        .iter()
        .take(40)
        .map(|s| {
            let names: Vec<String> = s
                .frames
                .iter()
                .map(allocscope_model::format::frame_name)
                .collect();
            format!("{:>5} {}", s.samples, names.join(" <- "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes the script into `dir` with `n` allocations a site; `wait`: it waits for a line
/// on stdin before it starts.
fn script(dir: &TempDir, n: u64, wait: bool) -> std::path::PathBuf {
    let path = dir.path("app.py");
    let wait = if wait { "sys.stdin.readline()" } else { "pass" };
    let text = SCRIPT.replace("@N", &n.to_string()).replace("@WAIT", wait);
    std::fs::write(&path, text).unwrap();
    path
}

/// Records the script under `python` with `flags`; returns the stacks.
fn record(python: &str, flags: &[&str]) -> (Vec<StackProfile>, String) {
    // One directory per test (they run in parallel).
    let dir = TempDir::new(&tests::current_test());
    let script = script(&dir, N, false);
    let recorded = Record::command(python, &[script.to_str().unwrap()])
        // 99.99%: some thirty sites are checked per run of these tests. A sample here carries
        // up to ~21 KB (its stack copy, and 200 recursion frames); with these tests running
        // side by side on two CPUs, 32 MiB filled once in a dozen runs (371 samples lost to
        // the process total, not to their sites): 128 MiB holds every sample.
        .flags(&[
            "-i",
            "16KiB",
            "--confidence",
            "0.9999",
            "--ring-buffer",
            "128MiB",
        ])
        .flags(flags)
        .run();
    (recorded.profile.stacks.clone(), recorded.stderr)
}

/// The stacks through the Python frame (`function`, `line`) whose Python chain ends at
/// `root` and that allocated a bytearray's buffer (`PyByteArray_Resize` among them); panics,
/// listing the stacks, when there is none.
fn site<'a>(
    stacks: &'a [StackProfile],
    function: &str,
    line: u32,
    root: &str,
) -> Vec<&'a StackProfile> {
    let found: Vec<&StackProfile> = stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| is_python(f, function, line)))
        .filter(|s| python_chain(s).last().is_some_and(|r| r.starts_with(root)))
        .filter(|s| {
            s.frames
                .iter()
                .any(|f| f.function.as_deref() == Some("PyByteArray_Resize"))
        })
        .collect();
    assert!(
        !found.is_empty(),
        "no {function}:{line} site under {root}\n{}",
        describe(stacks)
    );
    found
}

/// The bytes of `stacks` hold `truth` within their bounds (summed: each stack's bounds
/// hold its own share).
fn assert_holds(
    stacks: &[&StackProfile],
    truth: f64,
    what: &str,
    all: &[StackProfile],
    stderr: &str,
) {
    let (estimate, lower, upper) = stacks.iter().fold((0.0, 0.0, 0.0), |(e, l, u), s| {
        (
            e + s.alloc_bytes.estimate,
            l + s.alloc_bytes.lower,
            u + s.alloc_bytes.upper,
        )
    });
    assert!(
        lower <= truth && truth <= upper,
        "{what}: {estimate} [{lower}, {upper}] vs {truth}\n{}\nallocscope said:\n{stderr}",
        describe(all)
    );
}

fn check_interpreter(python: &str, comprehension_frame: &str) {
    let (stacks, stderr) = record(python, &[]);
    check_sites(python, &stacks, &stderr, comprehension_frame, N);
    // The summary names a stack with Python frames by the first of them (its site), not by
    // the interpreter's function that called the allocator.
    let chains: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.split_once("  pid ")?.1.split_once("  ").map(|(_, c)| c))
        .filter(|chain| chain.contains(".py:"))
        .collect();
    assert!(
        !chains.is_empty(),
        "{python}: no row with Python frames\n{stderr}"
    );
    // A Python frame reads `function (file:line)` (the file may be `<frozen …>`).
    let is_python = |name: &str| {
        name.rsplit_once(" (")
            .is_some_and(|(_, at)| at.ends_with(')') && at.contains(':'))
    };
    for chain in chains {
        let site = chain.split(" ← ").next().unwrap_or_default();
        assert!(is_python(site), "{python}: a row named {site:?}: {chain}");
    }
}

/// Every site of the script run with `n` allocations a site, in `stacks`.
fn check_sites(
    python: &str,
    stacks: &[StackProfile],
    stderr: &str,
    comprehension_frame: &str,
    n: u64,
) {
    let module = format!("<module>:{}", line_of("module"));
    let main = format!("main:{}", line_of("main"));
    // A list comprehension (3.11 runs it as a function of its own; 3.12+ inline).
    let found = site(
        stacks,
        comprehension_frame,
        line_of("comprehension"),
        "<module>",
    );
    let chain = python_chain(found[0]);
    assert!(
        chain.ends_with(&[main.clone(), module.clone()]),
        "{python}: {chain:?}\n{stderr}"
    );
    assert_holds(&found, (n * 1001) as f64, "comprehension", stacks, stderr);
    // Class instances: `Node.__init__` under `instances`.
    let found = site(stacks, "Node.__init__", line_of("instance"), "<module>");
    assert!(python_chain(found[0]).contains(&format!("instances:{}", line_of("instances"))));
    assert_holds(&found, (n * 701) as f64, "instances", stacks, stderr);
    // A generator, resumed by a generator expression.
    let found = site(stacks, "generate", line_of("generator"), "<module>");
    assert!(python_chain(found[0]).contains(&format!("consume:{}", line_of("consume"))));
    assert_holds(&found, (n * 1501) as f64, "generator", stacks, stderr);
    // Recursion 200 deep: every level, to <module>.
    let found = site(stacks, "recurse", line_of("deepest"), "<module>");
    let levels = python_chain(found[0])
        .iter()
        .filter(|f| *f == &format!("recurse:{}", line_of("recurse")))
        .count();
    assert_eq!(levels, 200, "{python}: {:?}", python_chain(found[0]));
    assert_holds(&found, (n * 2001) as f64, "recursion", stacks, stderr);
    // Dict growth and a C extension (json): found under their lines.
    for (function, name) in [("dict_growth", "dict"), ("json_call", "json")] {
        let line = line_of(name);
        assert!(
            stacks.iter().any(|s| {
                s.frames.iter().any(|f| is_python(f, function, line))
                    && python_chain(s).last() == Some(&module)
            }),
            "{python}: {function}\n{}",
            describe(stacks)
        );
    }
    // Two threads: each worker's site, under the thread's bootstrap, not <module>.
    let found = site(stacks, "worker", line_of("worker"), "Thread._bootstrap");
    assert_holds(
        &found,
        (n * (3001 + 5001)) as f64,
        "two threads",
        stacks,
        stderr,
    );
}

/// Debian's python3: its comprehension is a frame of its own.
#[test]
fn debian_python_sites_are_found_under_their_python_callers() {
    tests::require_bpf!();
    check_interpreter(tests::pythons::DEBIAN, "comprehension.<locals>.<listcomp>");
}

/// Another version, whose interpreter is in libpython (pyenv's, on this machine's image;
/// `cargo xtask setup` checks it is there): 3.12's frame layout from its headers, 3.13's
/// from its `_Py_DebugOffsets`.
#[test]
fn pyenv_pythons_sites_are_found_under_their_python_callers() {
    tests::require_bpf!();
    let mut checked = 0;
    for python in ["3.12.1", "3.13.0"].map(pythons::pyenv) {
        if python.exists() {
            // PEP 709 (3.12): comprehensions run inline in their function.
            check_interpreter(python.to_str().unwrap(), "comprehension");
            checked += 1;
        }
    }
    assert!(
        checked > 0,
        "no pyenv 3.12 or 3.13 (cargo xtask setup checks for them)"
    );
}

/// `--alloc-only`: the same sites, the same frames.
#[test]
fn python_frames_without_frees_tracked() {
    tests::require_bpf!();
    let (stacks, stderr) = record(tests::pythons::DEBIAN, &["--alloc-only"]);
    check_sites(
        tests::pythons::DEBIAN,
        &stacks,
        &stderr,
        "comprehension.<locals>.<listcomp>",
        N,
    );
}

/// `-p` on a python3 that already runs (started, then attached to, then it allocates):
/// its interpreter is found as the probes attach, so its first sites have their frames.
#[test]
fn python_frames_of_a_running_process() {
    tests::require_bpf!();
    let dir = TempDir::new("python-frames-attach");
    let script = script(&dir, N, true);
    let mut python = std::process::Command::new(tests::pythons::DEBIAN)
        .arg(&script)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = python.id().to_string();
    let out = dir.path("attached.json");
    let (recorder, stderr) = tests::start_recording(&[
        "record",
        "-p",
        &pid,
        "-i",
        "16KiB",
        "--confidence",
        "0.9999",
        "-o",
        out.to_str().unwrap(),
    ]);
    let rest = tests::drain(stderr);
    std::io::Write::write_all(python.stdin.as_mut().unwrap(), b"go\n").unwrap();
    assert!(python.wait().unwrap().success());
    let status = recorder.wait_with_output().unwrap().status;
    let stderr = rest.join().unwrap();
    assert!(status.success(), "{stderr}");
    let profile = tests::record::typed(&tests::read_profile(&out));
    check_sites(
        &format!("{} (-p)", pythons::DEBIAN),
        &profile.stacks,
        &stderr,
        "comprehension.<locals>.<listcomp>",
        N,
    );
}

/// A short-lived python child of a recorded shell (followed): its sites and frames too.
#[test]
fn python_frames_of_a_short_lived_child() {
    tests::require_bpf!();
    let dir = TempDir::new("python-frames-child");
    let n = 5000;
    let script = script(&dir, n, false);
    let command = format!("{} {}; true", pythons::DEBIAN, script.display());
    let recorded = Record::command("/bin/sh", &["-c", &command])
        .flags(&["-i", "16KiB", "--confidence", "0.9999"])
        .run();
    let python = recorded
        .profile
        .processes
        .iter()
        .find(|p| p.command.contains("python3"))
        .unwrap_or_else(|| panic!("no python3 child:\n{}", recorded.stderr));
    let stacks: Vec<StackProfile> = recorded
        .profile
        .stacks
        .iter()
        .filter(|s| s.pid == python.pid)
        .cloned()
        .collect();
    check_sites(
        "python3 child",
        &stacks,
        &recorded.stderr,
        "comprehension.<locals>.<listcomp>",
        n,
    );
}

/// `--python-frames off`: native frames only, the evaluator's among them.
#[test]
fn python_frames_can_be_left_out() {
    tests::require_bpf!();
    let (stacks, _) = record(tests::pythons::DEBIAN, &["--python-frames", "off"]);
    assert!(stacks
        .iter()
        .all(|s| s.frames.iter().all(|f| f.kind.is_none())));
    assert!(stacks.iter().any(|s| s
        .frames
        .iter()
        .any(|f| f.function.as_deref() == Some("_PyEval_EvalFrameDefault"))));
}

/// `--no-preload`: the same frames through the uprobes on pymalloc.
#[test]
fn python_frames_come_through_uprobes_too() {
    tests::require_bpf!();
    let (stacks, _) = record(tests::pythons::DEBIAN, &["--no-preload"]);
    site(
        &stacks,
        "comprehension.<locals>.<listcomp>",
        line_of("comprehension"),
        "<module>",
    );
}

/// The offsets in `layout.rs` are the interpreters' own: the fixture, built against each
/// installed interpreter's headers, prints them (3.11: Debian's and pyenv's; 3.12: pyenv's),
/// and 3.13's `_Py_DebugOffsets` read from its library must say what its headers say.
#[test]
fn frame_layouts_are_the_interpreters_own() {
    use allocscope_target::python::{detect, layout::Layout};
    let expected = |layout: &Layout| -> Vec<(String, u64)> {
        let w = &layout.walk;
        let mut fields = vec![
            ("runtime.interpreters_head", layout.interpreters_head),
            ("interp.threads_head", u64::from(w.threads_head)),
            ("tstate.next", u64::from(w.thread_next)),
            ("tstate.native_thread_id", u64::from(w.thread_native_id)),
            ("tstate.frame", u64::from(w.thread_frame)),
            ("frame.code", u64::from(w.frame_code_word) * 8),
            ("frame.instr", u64::from(w.frame_instr_word) * 8),
            ("frame.previous", u64::from(w.frame_previous_word) * 8),
            ("frame.entry", u64::from(w.frame_entry_byte)),
            ("code.filename", layout.code.filename),
            ("code.qualname", layout.code.qualname),
            ("code.linetable", layout.code.linetable),
            ("code.firstlineno", layout.code.firstlineno),
            ("code.code_adaptive", layout.code.code_adaptive),
            ("unicode.state", layout.unicode_state),
            ("unicode.ascii_size", layout.unicode_ascii_size),
            ("unicode.compact_size", layout.unicode_compact_size),
            // objects.rs reads a str's length where a bytes object's size is.
            ("unicode.length", allocscope_target::python::layout::OB_SIZE),
            (
                "tstate.interp",
                allocscope_target::python::layout::THREAD_INTERP,
            ),
            ("bytes.size", allocscope_target::python::layout::OB_SIZE),
            ("bytes.sval", allocscope_target::python::layout::BYTES_SVAL),
        ];
        if w.via_cframe != 0 {
            fields.push(("cframe.current_frame", u64::from(w.cframe_current_frame)));
        }
        fields.into_iter().map(|(n, v)| (n.to_owned(), v)).collect()
    };
    let mut checked = Vec::new();
    for (include, version, library) in [
        (pythons::DEBIAN_INCLUDE.into(), (3, 11), None),
        (pythons::pyenv_include("3.11.7"), (3, 11), None),
        (pythons::pyenv_include("3.12.1"), (3, 12), None),
        (
            pythons::pyenv_include("3.13.0"),
            (3, 13),
            Some(pythons::pyenv_libpython("3.13.0")),
        ),
    ] {
        if !include.exists() {
            continue;
        }
        let include = include.to_str().unwrap().to_owned();
        let binary = tests::fixture_as(
            "py_offsets",
            &format!("py_offsets-{}", include.replace('/', "_")),
            &[&format!("-I{include}"), &format!("-I{include}/internal")],
        );
        let output = std::process::Command::new(&binary).output().unwrap();
        let printed: std::collections::HashMap<String, u64> =
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter_map(|l| {
                    let (name, value) = l.split_once(' ')?;
                    Some((name.to_owned(), value.parse().ok()?))
                })
                .collect();
        let layout = match library {
            None => allocscope_target::python::layout::for_version(version.0, version.1).unwrap(),
            Some(library) => {
                detect::analyse(&std::fs::read(library).unwrap())
                    .unwrap()
                    .unwrap()
                    .layout
            }
        };
        for (name, value) in expected(&layout) {
            assert_eq!(printed.get(&name), Some(&value), "{include}: {name}");
        }
        checked.push(include);
    }
    assert!(
        checked.iter().any(|c| c == pythons::DEBIAN_INCLUDE),
        "Debian's headers (libpython3.11-dev, installed by cargo xtask setup): {checked:?}"
    );
}

/// pprof: Python functions with their files and lines, each frame a location of its own,
/// as `go tool pprof` shows them (a `<module>` qualified with its module: pprof strips a
/// bare `<…>` as C++ template arguments). Folded stacks name them `function (file:line)`.
#[test]
fn python_frames_in_pprof_and_folded() {
    tests::require_bpf!();
    let dir = TempDir::new(&tests::current_test());
    let script = script(&dir, 5000, false);
    for file in ["py.pb.gz", "py.folded"] {
        let out = dir.path(file);
        let status = std::process::Command::new(tests::allocscope())
            .args(["record", "-i", "16KiB", "--value", "alloc-bytes", "-o"])
            .arg(&out)
            .args(["--", tests::pythons::DEBIAN])
            .arg(&script)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
    }
    let output = std::process::Command::new("go")
        .args([
            "tool",
            "pprof",
            "-top",
            "-lines",
            "-sample_index=alloc_space",
            "-nodecount=500",
        ])
        .arg(dir.path("py.pb.gz"))
        .output()
        .expect("go tool pprof (cargo xtask setup installs golang-go)");
    let top = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{top}");
    for (function, site) in [
        ("comprehension.<locals>.<listcomp>", "comprehension"),
        ("Node.__init__", "instance"),
        ("app.<module>", "module"),
    ] {
        let expected = format!("{function} {}:{}", script.display(), line_of(site));
        assert!(top.contains(&expected), "{expected} missing:\n{top}");
    }
    let folded = std::fs::read_to_string(dir.path("py.folded")).unwrap();
    let expected = format!(
        "<module> (app.py:{});main (app.py:{});",
        line_of("module"),
        line_of("main")
    );
    assert!(folded.contains(&expected), "{expected} missing:\n{folded}");
}

/// A chain deeper than the kernel reads (256 frames) is cut at its root end, and says so.
#[test]
fn a_chain_deeper_than_256_frames_says_it_was_cut() {
    tests::require_bpf!();
    let dir = TempDir::new(&tests::current_test());
    let script = dir.path("deep.py");
    std::fs::write(
        &script,
        "def down(d):\n    if d == 0:\n        return [bytearray(4000) for _ in range(20000)]\n    \
         return down(d - 1)\ndown(300)\n",
    )
    .unwrap();
    let recorded = Record::command(tests::pythons::DEBIAN, &[script.to_str().unwrap()])
        .flags(&["-i", "64KiB"])
        .run();
    let deepest = recorded
        .profile
        .stacks
        .iter()
        .max_by_key(|s| s.samples)
        .unwrap();
    let chain = python_chain(deepest);
    assert_eq!(chain.len(), 257, "{chain:?}");
    assert!(chain[256].starts_with("[python frames cut"), "{chain:?}");
    assert!(
        chain[..256].iter().all(|f| f.starts_with("down")),
        "{chain:?}"
    );
}

/// A script that allocates its one site in its first milliseconds, while allocscope is
/// still loading its probes (the command runs at once), then pauses or not (`@PAUSE`).
const EARLY_SCRIPT: &str = "def early_site():
    return [bytearray(4000) for _ in range(4000)]  # site:early

def caller():
    return early_site()  # site:caller

keep = caller()  # site:early_module
@PAUSE
";

/// What a Python command allocates while its probes load is sampled by the library, which
/// walks the thread's Python frames itself: found under its whole Python chain, its bytes
/// within the bounds; also when the command exits before the probes are attached, and
/// with the interpreter in libpython (pyenv's 3.13, where comprehensions run inline).
#[test]
fn a_python_command_allocating_while_its_probes_load_keeps_its_python_frames() {
    tests::require_bpf!();
    let line = |name: &str| {
        let marker = format!("# site:{name}");
        EARLY_SCRIPT
            .lines()
            .position(|l| l.contains(&marker))
            .unwrap() as u32
            + 1
    };
    let cases: [(std::path::PathBuf, bool, &str); 3] = [
        (
            pythons::DEBIAN.into(),
            true,
            "early_site.<locals>.<listcomp>",
        ),
        (
            pythons::DEBIAN.into(),
            false,
            "early_site.<locals>.<listcomp>",
        ),
        (pythons::pyenv("3.13.0"), true, "early_site"),
    ];
    for (python, pause, leaf) in cases {
        let python: &str = python.to_str().unwrap();
        let dir = TempDir::new("python-early");
        let path = dir.path("early.py");
        let pause = if pause {
            "import time; time.sleep(0.3)"
        } else {
            ""
        };
        std::fs::write(&path, EARLY_SCRIPT.replace("@PAUSE", pause)).unwrap();
        let recorded = Record::command(python, &[path.to_str().unwrap()])
            .flags(&["-v", "-i", "32KiB", "--confidence", "0.9999"])
            .run();
        let what = format!("{python} (pause: {})", !pause.is_empty());
        let early: u64 = recorded
            .stderr
            .lines()
            .find_map(|l| l.split_once(" events taken while attaching"))
            .and_then(|(head, _)| head.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{what}: no early events said:\n{}", recorded.stderr));
        // 16 MB at a 32 KiB mean: ~500 samples, most of them before the probes: how many
        // depends on how long the interpreter takes to start against how long the probes
        // take to load (one CI run: 177 of 598, pyenv's 3.13 reading its site-packages
        // while the probes loaded in 145 ms). A hundred is well clear of none.
        assert!(
            early > 100,
            "{what}: {early} early events\n{}",
            recorded.stderr
        );
        let stacks = &recorded.profile.stacks;
        let found: Vec<&StackProfile> = stacks
            .iter()
            .filter(|s| {
                let chain = python_chain(s);
                s.frames
                    .iter()
                    .any(|f| f.function.as_deref() == Some("PyByteArray_Resize"))
                    && chain.first().is_some_and(|f| f.starts_with(leaf))
                    && chain.ends_with(&[
                        format!("caller:{}", line("caller")),
                        format!("<module>:{}", line("early_module")),
                    ])
            })
            .collect();
        assert!(
            !found.is_empty(),
            "{what}: no early site\n{}",
            describe(stacks)
        );
        assert_eq!(
            python_chain(found[0])[0],
            format!("{leaf}:{}", line("early")),
            "{what}"
        );
        assert_holds(
            &found,
            (4000 * 4001) as f64,
            &what,
            stacks,
            &recorded.stderr,
        );
        assert!(
            !recorded.stderr.contains("lost their Python frames"),
            "{what}:\n{}",
            recorded.stderr
        );
    }
}
