//! `--front-end in-process` with `--comm` and `--all`, the fleet's mode: only processes that
//! carry allocscope's sampler are counted, and nothing else is probed, so no process pays a
//! trap per allocator call. A service started with the library preloaded (as a systemd
//! drop-in does, docs/agent.md) is picked up by `allocscope agent --all` without being
//! touched; `record --comm` loads the sampler into the matches running when it starts and
//! into those that start later, leaves the others alone, and says which match it could
//! not load into. Each counted process is checked site by site against the workload's
//! known allocations; so is a carrier under `--all` with uprobes, once counted twice.

use std::{
    io::BufRead as _,
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::Duration,
};

use tests::{
    allocscope, check_workload_profile, fixture, fixture_as, read_typed,
    record::{process_of, Profile},
    start_recording, wait_until, TempDir, Workload,
};

const ROUNDS: u64 = 2000;

/// The two tests share processes' regions if run together (each sets the interval of
/// every carrier it finds): one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The library as a user installs it for a service: `allocscope generate library DIR`
/// (what the .deb installs as /usr/lib/allocscope/libsampler_preload.so).
fn installed_library(dir: &TempDir) -> PathBuf {
    let into = dir.path("lib");
    let output = Command::new(allocscope())
        .args(["generate", "library"])
        .arg(&into)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let path = into.join("libsampler_preload.so");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        path.display().to_string()
    );
    path
}

/// The workload fixture copied as `name` into `dir` (a name no other test's process has).
fn workload_named(dir: &TempDir, name: &str, binary: &Path) -> PathBuf {
    let path = dir.path(name);
    std::fs::copy(binary, &path).unwrap();
    path
}

/// Whether `pid` maps allocscope's library.
fn maps_library(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|maps| maps.contains("libsampler_preload"))
}

/// allocscope's stderr, read as it comes.
struct Log(Arc<Mutex<String>>);

impl Log {
    fn read(stderr: std::io::BufReader<std::process::ChildStderr>) -> Log {
        let text = Arc::new(Mutex::new(String::new()));
        let shared = text.clone();
        std::thread::spawn(move || {
            for line in stderr.lines() {
                let Ok(line) = line else { break };
                let mut text = shared.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        Log(text)
    }

    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }

    /// Waits up to 20 s for `needle`.
    fn wait_for(&self, needle: &str) {
        assert!(
            wait_until(Duration::from_secs(20), || self.text().contains(needle)),
            "{needle:?} never said:\n{}",
            self.text()
        );
    }
}

/// The sampling every recording here uses: a coarse interval and frame-pointer stacks keep
/// the samples of workloads running at full speed within what the ring buffer takes, and
/// bounds at 99.99% suit checks of every site.
const SAMPLING: [&str; 6] = [
    "--interval",
    "256KiB",
    "--unwind",
    "fp",
    "--confidence",
    "0.9999",
];

/// Starts `allocscope ARGS` with [`SAMPLING`]; its stderr read as it comes.
fn start(args: &[&str]) -> (std::process::Child, Log) {
    let args: Vec<&str> = args.iter().chain(&SAMPLING).copied().collect();
    let (child, stderr) = start_recording(&args);
    (child, Log::read(stderr))
}

/// Only the library's own probes (sampled blocks) were attached: no allocator's entry.
fn only_library_probed(profile: &Profile) {
    let probes = &profile.probes;
    assert!(!probes.is_empty());
    for probe in probes {
        assert!(
            probe.file.contains("libsampler_preload") && probe.function.contains("(USDT)"),
            "an allocator was probed: {probe:#?}"
        );
    }
}

#[test]
fn record_comm_loads_the_sampler_into_each_match_and_probes_nothing_else() {
    tests::require_bpf!();
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("fleet-comm");
    let plain = fixture("workload", &[]);
    let named = workload_named(&dir, "fleetcomm", &plain);
    let other = workload_named(&dir, "fleetother", &plain);
    let static_dir = TempDir::new("fleet-comm-static");
    let static_named = workload_named(
        &static_dir,
        "fleetcomm",
        &fixture_as("workload", "workload_static", &["-static"]),
    );
    // Running before the recording: one plain, one started with the library preloaded,
    // one that does not match.
    let mut before = Workload::start_with(Command::new(&named), ROUNDS, &[]);
    let mut preloaded = Command::new(&named);
    preloaded.env("LD_PRELOAD", installed_library(&dir));
    let mut carrier = Workload::start_with(preloaded, ROUNDS, &[]);
    let mut unmatched = Workload::start_with(Command::new(&other), ROUNDS, &[]);
    let out = dir.path("comm.json");
    let (recorder, log) = start(&[
        "record",
        "-v",
        "--comm",
        "^fleetcomm$",
        "--front-end",
        "in-process",
        "-o",
        out.to_str().unwrap(),
    ]);
    // Started while it records: loaded into when found at its exec.
    let mut after = Workload::start_with(Command::new(&named), ROUNDS, &[]);
    log.wait_for(&format!("following pid {} ", after.pid()));
    // A static match: nothing to load into, said, and left alone.
    let mut static_match = Workload::start_with(Command::new(&static_named), 10, &[]);
    log.wait_for(&format!(
        "pid {} (fleetcomm) matches --comm but is not counted",
        static_match.pid()
    ));
    for workload in [
        &mut before,
        &mut carrier,
        &mut after,
        &mut unmatched,
        &mut static_match,
    ] {
        workload.go();
    }
    for workload in [
        &mut before,
        &mut carrier,
        &mut after,
        &mut unmatched,
        &mut static_match,
    ] {
        assert_eq!(workload.line(), "done");
    }
    assert!(
        !maps_library(unmatched.pid()),
        "loaded into a process --comm does not match"
    );
    tests::interrupt(recorder);
    let said = log.text();
    let profile = read_typed(&out);
    for workload in [&before, &carrier, &after] {
        let pid = workload.pid();
        assert_eq!(process_of(&profile, pid).front_end, "in-process", "{said}");
        check_workload_profile(&profile, pid, ROUNDS);
    }
    // The preloaded one was counted as it was, not loaded into a second time.
    assert!(
        !said.contains(&format!(
            "pid {} (fleetcomm): in-process sampler loaded",
            carrier.pid()
        )),
        "{said}"
    );
    let listed = |pid: u32| profile.processes.iter().any(|p| p.pid == pid);
    assert!(
        !listed(unmatched.pid()) && !listed(static_match.pid()),
        "{:#?}",
        profile.processes
    );
    only_library_probed(&profile);
}

#[test]
fn the_agent_picks_up_a_service_started_with_the_library_preloaded() {
    tests::require_bpf!();
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("fleet-agent");
    let named = workload_named(&dir, "fleetsvc", &fixture("workload", &[]));
    // What a systemd drop-in's `Environment=LD_PRELOAD=…` gives the service.
    let mut command = Command::new(&named);
    command.env("LD_PRELOAD", installed_library(&dir));
    let mut service = Workload::start_with(command, ROUNDS, &[]);
    let mut plain = Workload::start_with(Command::new(&named), ROUNDS, &[]);
    let out = dir.path("periods");
    let (agent, log) = start(&[
        "agent",
        "--all",
        "--front-end",
        "in-process",
        "--period",
        "1s",
        "--spool-in-memory",
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    service.go();
    plain.go();
    assert_eq!(service.line(), "done");
    assert_eq!(plain.line(), "done");
    // `--all` loads nothing into anything.
    assert!(!maps_library(plain.pid()));
    // SAFETY: kill(2) on our own child; SIGTERM flushes the last period.
    unsafe { libc::kill(agent.id() as libc::pid_t, libc::SIGTERM) };
    let mut agent = agent;
    assert!(agent.wait().unwrap().success(), "{}", log.text());
    let mut files = tests::files_under(&out);
    files.sort();
    let last = read_typed(files.last().expect("no period written"));
    let me = process_of(&last, service.pid());
    assert_eq!(me.front_end, "in-process", "{me:#?}");
    check_workload_profile(&last, service.pid(), ROUNDS);
    for file in &files {
        let profile = read_typed(file);
        assert!(
            profile.processes.iter().all(|p| p.pid != plain.pid()),
            "a process without the sampler was counted: {}",
            file.display()
        );
        only_library_probed(&profile);
    }
}

#[test]
fn under_all_with_uprobes_a_carrier_is_counted_once() {
    tests::require_bpf!();
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("fleet-all");
    let named = workload_named(&dir, "fleetall", &fixture("workload", &[]));
    let mut command = Command::new(&named);
    command.env("LD_PRELOAD", installed_library(&dir));
    let mut carrier = Workload::start_with(command, ROUNDS, &[]);
    // `--all` as it was (uprobes on every allocator file): the carrier's library forwards
    // to a probed malloc, whose probes must leave its calls to it. They did not: its bytes
    // were estimated twice over (3.13 GB [3.06, 3.19] for 1.56 GB counted).
    let out = dir.path("all.json");
    let (recorder, log) = start(&["record", "--all", "-o", out.to_str().unwrap()]);
    carrier.go();
    assert_eq!(carrier.line(), "done");
    tests::interrupt(recorder);
    let profile = read_typed(&out);
    let me = process_of(&profile, carrier.pid());
    assert_eq!(me.front_end, "in-process", "{}", log.text());
    check_workload_profile(&profile, carrier.pid(), ROUNDS);
}
