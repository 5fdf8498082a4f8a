//! Shared helpers of allocscope's integration tests.
//!
//! The tests run the real `allocscope` binary (built by `cargo xtask test` before the tests,
//! or named by `ALLOCSCOPE_BIN`) against fixture programs compiled from C sources in
//! `tests/fixtures/` with the system's gcc. They need root and a kernel with BPF and
//! uprobes; without them they print why and skip, except under `CI=true`, where a skip is a
//! failure.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use serde_json::Value;

pub mod awaited;
pub mod browser;
pub mod pythons;
pub mod receivers;
pub mod record;

use record::{assert_holds, frame_is, process_of, site_of, Profile};
pub use record::{typed, Record, Recorded};

/// Workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Path of the allocscope binary under test.
pub fn allocscope() -> PathBuf {
    let path = std::env::var_os("ALLOCSCOPE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/release/allocscope"));
    assert!(
        path.exists(),
        "{} does not exist: run `cargo xtask test` (it builds the binary first) or set ALLOCSCOPE_BIN",
        path.display()
    );
    path
}

/// Returns false (after saying why, loudly) when this machine cannot run BPF tests; under
/// `CI=true` panics instead, so a CI run never passes by skipping.
pub fn bpf_available(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let why = if unsafe { libc::geteuid() } != 0 {
        Some("not running as root")
    } else if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        Some("kernel without BTF (/sys/kernel/btf/vmlinux missing)")
    } else if !Path::new("/sys/bus/event_source/devices/uprobe").exists() {
        Some("kernel without the uprobe PMU")
    } else {
        None
    };
    match why {
        None => true,
        Some(why) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{test}: cannot run BPF integration test under CI: {why}");
            }
            eprintln!("\n*** SKIPPING {test}: {why} (run as root on a BPF-capable kernel) ***\n");
            false
        }
    }
}

/// The BPF-availability rule of every integration test that needs BPF, in one line at the
/// top of the test: returns from it (saying why, loudly) where BPF cannot run, and fails it
/// under `CI=true` (see [`bpf_available`]). The test's name comes from its thread, which
/// the test harness names after it.
#[macro_export]
macro_rules! require_bpf {
    () => {
        if !$crate::bpf_available(&$crate::current_test()) {
            return;
        }
    };
}

/// The name of the running test (the harness names each test's thread after it).
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("an integration test")
        .to_owned()
}

static BUILD_LOCK: Mutex<()> = Mutex::new(());

/// Compiles `tests/fixtures/NAME.c` with gcc and the flags in `tests/fixtures/cflags` (once
/// per source change) and returns the binary. Frame pointers keep stacks whole; no sibling
/// calls keeps each site function the direct caller of the allocator (`return malloc(n)`
/// would otherwise be a jump).
pub fn fixture(name: &str, extra_flags: &[&str]) -> PathBuf {
    fixture_as(name, name, extra_flags)
}

/// [`fixture`] built as `binary_name` (the same source with other flags, e.g. `-static`).
pub fn fixture_as(name: &str, binary_name: &str, extra_flags: &[&str]) -> PathBuf {
    let _guard = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // C++ sources are built by g++ (libstdc++ linked), C by gcc.
    let cxx = workspace()
        .join("tests/fixtures")
        .join(format!("{name}.cpp"));
    let (source, compiler) = if cxx.exists() {
        (cxx, "g++")
    } else {
        (
            workspace().join("tests/fixtures").join(format!("{name}.c")),
            "gcc",
        )
    };
    let out_dir = workspace().join("target/fixtures");
    std::fs::create_dir_all(&out_dir).unwrap();
    let binary = out_dir.join(binary_name);
    let this_file = Path::new(file!());
    let cflags_file = workspace().join("tests/fixtures/cflags");
    let newest_input = [
        source.clone(),
        workspace().join(this_file),
        cflags_file.clone(),
    ]
    .iter()
    .filter_map(|p| p.metadata().ok()?.modified().ok())
    .max();
    if !is_fresh(&binary, newest_input) {
        let status = Command::new(compiler)
            .args(
                std::fs::read_to_string(&cflags_file)
                    .unwrap()
                    .split_whitespace(),
            )
            .arg("-o")
            .arg(&binary)
            .arg(&source)
            .args(extra_flags)
            .status()
            .unwrap_or_else(|e| panic!("running {compiler} (cargo xtask setup installs it): {e}"));
        assert!(
            status.success(),
            "{compiler} failed on {}",
            source.display()
        );
    }
    binary
}

/// The current Go release `cargo xtask setup` unpacks beside Debian's (see xtask's setup).
pub const CURRENT_GO: &str = "1.27.3";

/// The Go toolchains the Go tests build with: Debian's (`go`, 1.19) and the current
/// release's, as (name, go program). Without the current one (not set up) the tests say so
/// loudly and use Debian's alone, except under `CI=true`, where that is a failure.
pub fn go_toolchains() -> Vec<(String, PathBuf)> {
    let mut toolchains = vec![("debian".to_owned(), PathBuf::from("go"))];
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let current = PathBuf::from(home).join(format!(".cache/allocscope-go-{CURRENT_GO}/go/bin/go"));
    if current.exists() {
        toolchains.push((format!("go{CURRENT_GO}"), current));
    } else if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{} missing: run `cargo xtask setup`", current.display());
    } else {
        eprintln!(
            "\n*** go{CURRENT_GO} not set up ({}): Debian's Go only ***\n",
            current.display()
        );
    }
    toolchains
}

/// Builds the Go program `tests/fixtures/go/NAME/` with the system's Go toolchain (once per
/// source change; `cargo xtask setup` installs golang-go) into `target/fixtures/NAME`.
pub fn go_fixture(name: &str) -> PathBuf {
    go_fixture_with(name, ("debian", Path::new("go")))
}

/// Builds the Go program `tests/fixtures/go/NAME/` with toolchain `(tag, go)` (once per
/// source change) into `target/fixtures/NAME` (Debian's) or `NAME-TAG`: without cgo (a
/// static executable, like most Go services), offline, its build cache under `target/`.
pub fn go_fixture_with(name: &str, (tag, go): (&str, &Path)) -> PathBuf {
    let file = if tag == "debian" {
        name.to_owned()
    } else {
        format!("{name}-{tag}")
    };
    build_go(name, (tag, go), &file, &[])
}

/// [`go_fixture`] built as a position-independent executable (`-buildmode=pie`, as several
/// distributions build their Go packages): `target/fixtures/NAME-pie`.
pub fn go_fixture_pie(name: &str) -> PathBuf {
    let file = format!("{name}-pie");
    build_go(
        name,
        ("debian", Path::new("go")),
        &file,
        &["-buildmode=pie"],
    )
}

/// Builds `tests/fixtures/go/NAME/` with `(tag, go)` and `flags` into `target/fixtures/FILE`.
fn build_go(name: &str, (tag, go): (&str, &Path), file: &str, flags: &[&str]) -> PathBuf {
    let _guard = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let source = workspace().join("tests/fixtures/go").join(name);
    let target = workspace().join("target");
    let binary = target.join("fixtures").join(file);
    std::fs::create_dir_all(binary.parent().unwrap()).unwrap();
    let newest_input = std::fs::read_dir(&source)
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok()?.modified().ok())
        .max();
    if !is_fresh(&binary, newest_input) {
        let status = Command::new(go)
            .arg("build")
            .args(flags)
            .arg("-o")
            .arg(&binary)
            .arg(".")
            .current_dir(&source)
            .env("CGO_ENABLED", "0")
            .env("GOFLAGS", "-mod=mod")
            .env("GOPROXY", "off")
            .env("GOTOOLCHAIN", "local")
            .env("GOCACHE", target.join(format!("go-cache-{tag}")))
            .env("GOPATH", target.join("go-path"))
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "running {} (cargo xtask setup installs it): {e}",
                    go.display()
                )
            });
        assert!(status.success(), "go build failed in {}", source.display());
    }
    binary
}

/// Builds the Rust program `tests/fixtures/rust/` with its global allocator `allocator`
/// (`jemalloc`: tikv-jemallocator, `mimalloc`: mimalloc, `system`: glibc's) linked in, with
/// cargo (its own project and lock file; its crates from crates.io, built once under
/// `target/fixtures/rust-ALLOCATOR`); the executable.
pub fn rust_fixture(allocator: &str) -> PathBuf {
    let _guard = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let project = workspace().join("tests/fixtures/rust");
    let target_dir = workspace()
        .join("target/fixtures")
        .join(format!("rust-{allocator}"));
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo
        .args([
            "build",
            "--release",
            "--locked",
            "--quiet",
            "--manifest-path",
        ])
        .arg(project.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        // The workspace's own flags and target are not this program's.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_TARGET_DIR");
    if allocator != "system" {
        cargo.args(["--features", allocator]);
    }
    let status = cargo
        .status()
        .unwrap_or_else(|e| panic!("running cargo for {}: {e}", project.display()));
    assert!(
        status.success(),
        "cargo failed on {} ({allocator})",
        project.display()
    );
    target_dir.join("release/rustalloc")
}

/// Whether `binary` was built after its newest input changed.
fn is_fresh(binary: &Path, newest_input: Option<std::time::SystemTime>) -> bool {
    match (binary.metadata(), newest_input) {
        (Ok(b), Some(input)) => b.modified().is_ok_and(|built| built >= input),
        _ => false,
    }
}

/// The workload fixture (tests/fixtures/workload.c) started with `--wait`: a [`Fixture`]
/// that said where its malloc is, ready to be let go.
pub struct Workload {
    /// The process, driven line by line.
    pub fixture: Fixture,
    /// Address of libc's malloc in it (printed by the workload).
    pub malloc: u64,
}

impl Workload {
    /// Starts `workload ROUNDS --wait [extra]` and waits for it to be ready.
    pub fn start(rounds: u64, extra: &[&str]) -> Workload {
        Workload::start_with(Command::new(fixture("workload", &[])), rounds, extra)
    }

    /// Starts `command ROUNDS --wait [extra]` (a workload binary, perhaps under another
    /// name, environment or root) and waits for it to be ready.
    pub fn start_with(mut command: Command, rounds: u64, extra: &[&str]) -> Workload {
        command.arg(rounds.to_string()).arg("--wait").args(extra);
        let mut fixture = Fixture::spawn(command);
        let line = fixture.line();
        let address = line
            .strip_prefix("malloc 0x")
            .unwrap_or_else(|| panic!("malloc address line expected, got {line:?}"));
        let malloc = u64::from_str_radix(address.trim(), 16).unwrap();
        fixture.expect("ready");
        Workload { fixture, malloc }
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.fixture.pid()
    }

    /// Lets the workload start allocating.
    pub fn go(&mut self) {
        self.fixture.go();
    }

    /// Next line of its stdout (panics at EOF).
    pub fn line(&mut self) -> String {
        self.fixture.line()
    }

    /// The first byte of malloc as the process sees it: 0xCC while a uprobe is installed.
    pub fn malloc_first_byte(&self) -> u8 {
        first_byte(self.pid(), self.malloc)
    }
}

/// A fixture process driven line by line: it says something on stdout, we answer on stdin.
pub struct Fixture {
    /// The process.
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Fixture {
    /// Starts `tests/fixtures/NAME` (built with gcc) with `args` and `env`.
    pub fn start(name: &str, args: &[&str], env: &[(&str, &str)]) -> Fixture {
        Fixture::start_binary(&fixture(name, &[]), args, env)
    }

    /// Starts a fixture already built (e.g. by [`fixture_as`], with other flags).
    pub fn start_binary(binary: &Path, args: &[&str], env: &[(&str, &str)]) -> Fixture {
        let mut command = Command::new(binary);
        command.args(args).envs(env.iter().copied());
        Fixture::spawn(command)
    }

    /// Starts `command` (any program, with its arguments, environment, name or root) with
    /// its stdin and stdout piped to the test.
    pub fn spawn(mut command: Command) -> Fixture {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Fixture {
            child,
            stdin,
            stdout,
        }
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the fixture to say `expected` (panics on anything else or EOF).
    pub fn expect(&mut self, expected: &str) {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert!(
            line.starts_with(expected),
            "fixture said {line:?}, expected {expected:?}"
        );
    }

    /// The next line the fixture prints, without its newline (panics on EOF).
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        assert!(
            self.stdout.read_line(&mut line).unwrap() > 0,
            "fixture closed its stdout"
        );
        line.trim_end().to_owned()
    }

    /// Lets the fixture go on.
    pub fn go(&mut self) {
        self.stdin.write_all(b"go\n").unwrap();
        self.stdin.flush().unwrap();
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The byte at `address` in process `pid` (via /proc/PID/mem).
pub fn first_byte(pid: u32, address: u64) -> u8 {
    use std::os::unix::fs::FileExt as _;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut byte = [0u8];
    mem.read_exact_at(&mut byte, address).unwrap();
    byte[0]
}

/// The x86 breakpoint instruction uprobes install.
pub const INT3: u8 = 0xcc;

/// Waits until `predicate` holds, polling, for at most `timeout`.
pub fn wait_until(timeout: Duration, mut predicate: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if predicate() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    predicate()
}

/// Starts `allocscope ARGS` with stderr piped and returns once it printed "recording".
pub fn start_recording(args: &[&str]) -> (Child, BufReader<std::process::ChildStderr>) {
    let (child, stderr, _said) = start_recording_said(args);
    (child, stderr)
}

/// [`start_recording`], with what allocscope said up to its "recording" line.
#[expect(
    clippy::zombie_processes,
    reason = "the child is returned; the caller waits for it"
)]
pub fn start_recording_said(
    args: &[&str],
) -> (Child, BufReader<std::process::ChildStderr>, String) {
    let mut child = Command::new(allocscope())
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            let status = child.wait().unwrap();
            panic!("allocscope exited ({status}) before recording:\n{seen}");
        }
        seen.push_str(&line);
        if line.starts_with("allocscope: recording ") {
            return (child, stderr, seen);
        }
    }
}

/// Stops the recorder with SIGINT (as Ctrl-C) and checks it wrote its file.
pub fn interrupt(mut recorder: Child) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(recorder.id() as libc::pid_t, libc::SIGINT) };
    let status = recorder.wait().unwrap();
    assert!(status.success(), "allocscope exited with {status}");
}

/// Reads the rest of allocscope's stderr on a thread (so it never blocks on a full pipe);
/// the text is returned by `join`.
pub fn drain(mut stderr: BufReader<std::process::ChildStderr>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
        rest
    })
}

/// Runs `allocscope ARGS` to completion.
pub fn run(args: &[&str]) -> Output {
    Command::new(allocscope()).args(args).output().unwrap()
}

/// A temporary directory under target/, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates `target/test-tmp/NAME-PID`.
    pub fn new(name: &str) -> TempDir {
        let dir = workspace()
            .join("target/test-tmp")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// A path inside.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every file under `dir`, recursively (none if it is missing).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// Starts `command` with stdout piped (stderr discarded) and returns it with the first line
/// it prints (a server saying where it listens).
pub fn spawn_with_first_line(command: &mut Command) -> (Child, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

/// Reads a JSON profile.
pub fn read_profile(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Reads a JSON profile into allocscope's own types.
pub fn read_typed(path: &Path) -> record::Profile {
    typed(&read_profile(path))
}

/// Known per-round allocations of the workload fixture: (site, calls, bytes per call).
pub const WORKLOAD_SITES: [(&str, u64, u64); 7] = [
    ("site_small", 200, 48),
    ("site_calloc", 50, 1024),
    ("site_realloc_null", 20, 4096),
    ("site_posix_memalign", 20, 2048),
    ("site_aligned_alloc", 20, 512),
    ("site_periodic_big", 1, 61440),
    ("site_periodic_tiny", 64, 64),
];

/// Calls and bytes of one workload round.
pub fn workload_round() -> (u64, u64) {
    WORKLOAD_SITES
        .iter()
        .fold((0, 0), |(c, b), (_, calls, size)| {
            (c + calls, b + calls * size)
        })
}

/// Checks a recording of `rounds` workload rounds of process `pid`: every site found with
/// the allocator's direct caller as leaf, its true bytes and objects within the reported
/// bounds, exact counters equal to the known calls (nested mallocs counted once), and the
/// process total estimate bounding the exact bytes.
pub fn check_workload_profile(profile: &Profile, pid: u32, rounds: u64) {
    // Besides the rounds, the workload allocates only its stdio buffers and, statically
    // linked, what its libc's start-up allocates (a handful of calls, 15 seen).
    check_workload_profile_beside(profile, pid, rounds, (32, 65536));
}

/// [`check_workload_profile`] for a process that made up to `beside` (calls, bytes) more
/// than the rounds (a program that exec'd the workload in the same process, a library
/// that allocates at its load).
pub fn check_workload_profile_beside(
    profile: &Profile,
    pid: u32,
    rounds: u64,
    (extra_calls, extra_bytes): (u64, u64),
) {
    assert_eq!(profile.schema, "allocscope/v1");
    // Shown with any failure below: what was lost, and every stack's leaf and size.
    let stacks: Vec<String> = profile
        .stacks
        .iter()
        .map(|s| {
            let frames: Vec<&str> = s
                .frames
                .iter()
                .map(|f| f.function.as_deref().unwrap_or("?"))
                .collect();
            format!("{} ({} samples)", frames.join("<"), s.samples)
        })
        .collect();
    let context = format!(
        "losses {:?}; stacks: {}",
        profile.losses,
        stacks.join(" | ")
    );
    for (function, calls, size) in WORKLOAD_SITES {
        let stacks = site_of(profile, pid, function);
        assert_eq!(
            stacks.len(),
            1,
            "{function}: expected one stack, got {stacks:#?}\n{context}"
        );
        let stack = stacks[0];
        assert!(frame_is(stack, 1, "one_round"), "{function}: {stack:#?}");
        let truth = (rounds * calls * size) as f64;
        assert_holds(
            &stack.alloc_bytes,
            truth,
            &format!("{function} bytes"),
            &context,
        );
        let true_objects = (rounds * calls) as f64;
        let what = format!("{function} objects");
        assert_holds(&stack.alloc_objects, true_objects, &what, &context);
    }
    let process = process_of(profile, pid);
    let (calls, bytes) = workload_round();
    let (exact_calls, exact_bytes) = (process.exact.calls, process.exact.bytes);
    assert!(
        (rounds * calls..rounds * calls + extra_calls).contains(&exact_calls),
        "exact calls {exact_calls}, expected {} (+ stdio): nested mallocs counted twice?",
        rounds * calls
    );
    assert!(
        (rounds * bytes..rounds * bytes + extra_bytes).contains(&exact_bytes),
        "exact bytes {exact_bytes}, expected {}",
        rounds * bytes
    );
    let total = &process.alloc_bytes;
    assert!(
        total.lower <= exact_bytes as f64 && exact_bytes as f64 <= total.upper,
        "sum of estimates {total:?} does not bound the exact {exact_bytes} bytes"
    );
    // Every allocation counted: nothing said of memory the counts do not explain.
    let uncounted = allocscope_model::schema::UNCOUNTED_MEMORY;
    assert!(
        !process.incomplete.iter().any(|why| why.contains(uncounted)),
        "{:?}",
        process.incomplete
    );
    assert_eq!(profile.losses.ringbuf_full, 0);
    assert_eq!(profile.losses.stack_missing, 0);
}

/// Checks that a process's estimated allocated bytes bound its exact (counted) bytes.
pub fn assert_bounds_exact(process: &record::ProcessProfile) {
    let exact = process.exact.bytes as f64;
    let total = &process.alloc_bytes;
    assert!(
        total.lower <= exact && exact <= total.upper,
        "pid {}: estimate {total:?} does not bound the exact {exact} bytes",
        process.pid
    );
}
