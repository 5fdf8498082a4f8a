//! `allocscope agent` against real receivers: Pyroscope's push decoded with Grafana's
//! published types, OTLP profiles decoded by the OpenTelemetry project's own classes over
//! gRPC and HTTP, sinks that refuse, hang and reset, the spool's bound, SIGTERM's flush.

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use prost::Message as _;
use pyroscope::encode::gen::push::PushRequest;
use tests::{
    allocscope, bpf_available, drain, fixture,
    receivers::{Behaviour, HttpEndpoint, OtlpReceiver},
    start_recording, wait_until, workload_round, TempDir,
};

/// Stops the agent as systemd does (SIGTERM: the last period is flushed) and checks it
/// exited cleanly.
fn terminate(mut agent: std::process::Child) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(agent.id() as libc::pid_t, libc::SIGTERM) };
    assert!(agent.wait().unwrap().success());
}

/// A child killed when dropped; [`Busy::start`]: the workload allocating until dropped
/// (its output discarded: nobody reads it).
struct Busy(std::process::Child);

impl Busy {
    fn start() -> Busy {
        Busy(
            std::process::Command::new(fixture("workload", &[]))
                .args(["1", "--forever"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn labels_of(series: &pyroscope::encode::gen::push::RawProfileSeries) -> HashMap<String, String> {
    series
        .labels
        .iter()
        .map(|l| (l.name.clone(), l.value.clone()))
        .collect()
}

/// Total of sample type `kind` in a gzipped pprof payload, and per leaf function.
fn pprof_total(raw: &[u8], kind: &str) -> (i64, HashMap<String, i64>) {
    let profile = allocscope_outputs::export::pprof::read(raw).unwrap();
    let s = |i: i64| profile.string_table[i as usize].as_str();
    let column = profile
        .sample_type
        .iter()
        .position(|t| s(t.r#type) == kind)
        .unwrap_or_else(|| panic!("no {kind}"));
    let functions: HashMap<u64, &str> =
        profile.function.iter().map(|f| (f.id, s(f.name))).collect();
    let locations: HashMap<u64, &str> = profile
        .location
        .iter()
        .map(|l| (l.id, functions[&l.line[0].function_id]))
        .collect();
    let mut leaves = HashMap::new();
    let mut total = 0;
    for sample in &profile.sample {
        let value = sample.value[column];
        total += value;
        if let Some(leaf) = sample.location_id.first() {
            *leaves.entry(locations[leaf].to_owned()).or_default() += value;
        }
    }
    (total, leaves)
}

/// The status file as JSON (waits until it exists).
fn status(path: &Path) -> serde_json::Value {
    assert!(wait_until(Duration::from_secs(10), || path.exists()));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn each_period_reaches_pyroscope_and_otlp_over_grpc_and_http() {
    if !bpf_available("agent periods") {
        return;
    }
    let dir = TempDir::new("agent-sinks");
    let pyroscope = HttpEndpoint::start(&[]);
    let otlp = OtlpReceiver::start(dir.path("otlp.jsonl"));
    let headers = dir.path("headers");
    std::fs::write(
        &headers,
        "Authorization: Bearer s3cret\nX-Scope-OrgID: team-a\n",
    )
    .unwrap();
    // Secrets: readable by root alone (a 0644 file is refused).
    std::fs::set_permissions(
        &headers,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let workload = fixture("workload", &[]);
    let rounds = 40_000u64;
    let output = std::process::Command::new(allocscope())
        .args([
            "agent",
            "--period",
            "1s",
            "--interval",
            "256KiB",
            "--label",
            "env=test",
        ])
        .args(["--pyroscope", &pyroscope.url()])
        .args([
            "--otlp-grpc",
            &format!("http://127.0.0.1:{}", otlp.grpc_port),
        ])
        .args([
            "--otlp-http",
            &format!("http://127.0.0.1:{}", otlp.http_port),
        ])
        .arg("--headers-file")
        .arg(&headers)
        .arg("--spool-dir")
        .arg(dir.path("spool"))
        .arg("--status")
        .arg(dir.path("status.json"))
        .arg("--")
        .arg(&workload)
        .arg(rounds.to_string())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "agent failed:\n{stderr}");
    assert!(!stderr.contains("WARN"), "{stderr}");

    // Pyroscope: decoded with Grafana's types; one series per period of the workload.
    let pushes = pyroscope.accepted();
    assert!(!pushes.is_empty(), "nothing pushed:\n{stderr}");
    let mut alloc_space = 0;
    let mut leaves: HashMap<String, i64> = HashMap::new();
    for push in &pushes {
        assert_eq!(push.path, "/push.v1.PusherService/Push");
        let header = |name: &str| {
            push.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(header("content-type"), Some("application/proto"));
        assert_eq!(header("authorization"), Some("Bearer s3cret"));
        assert_eq!(header("x-scope-orgid"), Some("team-a"));
        let request = PushRequest::decode(push.body.as_slice()).unwrap();
        for series in &request.series {
            let labels = labels_of(series);
            assert_eq!(labels["__name__"], "memory");
            assert_eq!(labels["__delta__"], "false");
            assert_eq!(labels["service_name"], "workload");
            assert_eq!(labels["command"], "workload");
            assert_eq!(labels["env"], "test");
            assert!(!labels["hostname"].is_empty());
            assert!(labels["pid"].parse::<u32>().is_ok());
            assert_eq!(series.samples.len(), 1);
            assert_eq!(series.samples[0].id.len(), 36);
            let (total, by_leaf) = pprof_total(&series.samples[0].raw_profile, "alloc_space");
            alloc_space += total;
            for (leaf, value) in by_leaf {
                *leaves.entry(leaf).or_default() += value;
            }
        }
    }
    // The periods add up to the whole run: the workload's exact bytes within a few %.
    let exact = (rounds * workload_round().1) as f64;
    let ratio = alloc_space as f64 / exact;
    assert!(
        (0.9..1.1).contains(&ratio),
        "periods sum to {alloc_space}, exact {exact}"
    );
    for site in ["site_small", "site_calloc", "site_periodic_big"] {
        assert!(
            leaves.get(site).copied().unwrap_or(0) > 0,
            "{site} missing: {leaves:?}"
        );
    }

    // OTLP: the same periods over gRPC and HTTP, decoded by OpenTelemetry's classes.
    assert!(wait_until(Duration::from_secs(5), || otlp.requests().len()
        >= 2 * pushes.len()));
    let requests = otlp.requests();
    for transport in ["grpc", "http"] {
        let of: Vec<_> = requests
            .iter()
            .filter(|r| r["transport"] == transport)
            .collect();
        assert_eq!(
            of.len(),
            pushes.len(),
            "{transport}: one request per period"
        );
        let mut total = 0;
        for request in &of {
            assert_eq!(request["errors"], serde_json::json!([]), "{request}");
            assert_eq!(request["headers"]["authorization"], "Bearer s3cret");
            for resource in request["resources"].as_array().unwrap() {
                let attributes = &resource["attributes"];
                assert_eq!(attributes["process.executable.name"], "workload");
                assert_eq!(attributes["service.name"], "workload");
                assert_eq!(attributes["env"], "test");
                assert!(attributes["process.pid"].as_i64().unwrap() > 0);
                assert!(!attributes["host.name"].as_str().unwrap().is_empty());
                assert_eq!(resource["scope"], "allocscope");
                for profile in resource["profiles"].as_array().unwrap() {
                    assert_eq!(profile["period_type"], "space");
                    assert_eq!(profile["profile_id_len"], 16);
                    assert_eq!(profile["bounds_ok"], true, "{profile}");
                    if profile["type"] == "alloc_space" {
                        assert_eq!(profile["unit"], "bytes");
                        total += profile["total"].as_i64().unwrap();
                    }
                }
            }
        }
        assert_eq!(total, alloc_space, "{transport} carries what Pyroscope got");
    }

    let status = status(&dir.path("status.json"));
    assert_eq!(status["samples_lost"], 0);
    for sink in status["sinks"].as_array().unwrap() {
        assert_eq!(sink["pushed"].as_u64(), Some(pushes.len() as u64), "{sink}");
        assert_eq!(sink["queued"], 0);
        assert_eq!(sink["dropped"], 0);
    }
    assert!(status["rss_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn a_sink_that_refuses_hangs_or_resets_is_retried_and_loses_nothing() {
    if !bpf_available("agent retries") {
        return;
    }
    let dir = TempDir::new("agent-retries");
    let sink = HttpEndpoint::start(&[
        Behaviour::Refuse(503),
        Behaviour::Hang,
        Behaviour::Reset,
        Behaviour::Refuse(429),
    ]);
    let workload = Busy::start();
    let pid = workload.0.id().to_string();
    let (agent, stderr) = start_recording(&[
        "agent",
        "-p",
        &pid,
        "--period",
        "1s",
        "--pyroscope",
        &sink.url(),
        "--push-timeout",
        "1s",
        "--retry-max",
        "2s",
        "--spool-dir",
        dir.path("spool").to_str().unwrap(),
        "--status",
        dir.path("status.json").to_str().unwrap(),
    ]);
    let log = drain(stderr);
    // Four failures then acceptance: every period arrives, in order.
    assert!(wait_until(Duration::from_secs(40), || sink
        .accepted()
        .len()
        >= 8));
    let during = status(&dir.path("status.json"));
    terminate(agent);
    let log = log.join().unwrap();
    let seen = sink.seen.lock().unwrap().clone();
    let kinds: Vec<&str> = seen.iter().take(5).map(|r| r.behaviour.as_str()).collect();
    assert_eq!(
        kinds,
        ["Refuse", "Hang", "Reset", "Refuse", "Accept"],
        "{log}"
    );
    // The retried request is the same one each time, and the waits grew.
    assert!(seen[..5].windows(2).all(|w| w[0].body == w[1].body));
    let periods = status(&dir.path("status.json"));
    assert_eq!(
        during["samples_lost"], 0,
        "sampling lost nothing while the sink was down"
    );
    assert_eq!(periods["samples_lost"], 0);
    let sink_status = &periods["sinks"][0];
    assert_eq!(sink_status["failures"], 4, "{sink_status}");
    assert_eq!(sink_status["dropped"], 0);
    assert_eq!(
        sink_status["queued"], 0,
        "the flush at SIGTERM delivered the rest: {log}"
    );
    assert_eq!(
        sink.accepted().len() as u64,
        periods["periods"].as_u64().unwrap() - periods["periods_empty"].as_u64().unwrap(),
        "every period with something in it pushed once"
    );
    // Periods arrive in order: each push's profile starts after the one before.
    let starts: Vec<i64> = sink
        .accepted()
        .iter()
        .flat_map(|r| PushRequest::decode(r.body.as_slice()).unwrap().series)
        .map(|s| {
            allocscope_outputs::export::pprof::read(&s.samples[0].raw_profile)
                .unwrap()
                .time_nanos
        })
        .collect();
    assert!(starts.windows(2).all(|w| w[0] < w[1]), "{starts:?}");
}

#[test]
fn the_spool_stays_within_its_bound_while_the_sink_is_down() {
    if !bpf_available("agent spool") {
        return;
    }
    let dir = TempDir::new("agent-spool");
    let sink = HttpEndpoint::start(&[Behaviour::Refuse(503); 1000]);
    let workload = Busy::start();
    let pid = workload.0.id().to_string();
    let bound = 12 * 1024u64;
    let spool = dir.path("spool");
    let (agent, stderr) = start_recording(&[
        "agent",
        "-p",
        &pid,
        "--period",
        "1s",
        "--pyroscope",
        &sink.url(),
        "--retry-max",
        "1s",
        "--spool-bytes",
        &bound.to_string(),
        "--spool-dir",
        spool.to_str().unwrap(),
        "--status",
        dir.path("status.json").to_str().unwrap(),
        "--flush-timeout",
        "1s",
    ]);
    let log = drain(stderr);
    let mut largest = 0;
    // The default interval and its throttle (at most 5,000 samples a second): the ring
    // buffer keeps up even on a loaded machine, so a loss here would be the sink's doing.
    let dropped = wait_until(Duration::from_secs(40), || {
        let bytes: u64 = tests::files_under(&spool)
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum();
        largest = largest.max(bytes);
        let status = status(&dir.path("status.json"));
        status["sinks"][0]["dropped"].as_u64().unwrap_or(0) >= 3
    });
    terminate(agent);
    let log = log.join().unwrap();
    let status = status(&dir.path("status.json"));
    assert!(dropped, "the spool never dropped: {status:#}\n{log}");
    assert!(
        largest <= bound,
        "spool reached {largest} bytes (bound {bound})"
    );
    assert!(largest > 0);
    assert_eq!(status["samples_lost"], 0);
    // What waits at shutdown stays for the next start, still within the bound.
    let left = tests::files_under(&spool);
    assert!(!left.is_empty());
    assert!(
        left.iter()
            .map(|f| std::fs::metadata(f).unwrap().len())
            .sum::<u64>()
            <= bound
    );
    assert!(log.contains("kept in the spool"), "{log}");
}

#[test]
fn bad_agent_flags_are_refused_before_anything_is_attached() {
    let dir = TempDir::new("agent-bad");
    let writable = dir.path("headers");
    std::fs::write(&writable, "Authorization: Bearer x\n").unwrap();
    std::fs::set_permissions(
        &writable,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let readable = dir.path("headers-readable");
    std::fs::write(&readable, "Authorization: Bearer x\n").unwrap();
    std::fs::set_permissions(
        &readable,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let huge = dir.path("headers-huge");
    std::fs::write(&huge, "X-A: b\n".repeat(20_000)).unwrap();
    std::fs::set_permissions(&huge, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    for (args, expected) in [
        (vec!["agent", "-p", "1"], "needs somewhere to send"),
        (
            vec!["agent", "-p", "1", "--pyroscope", "pyroscope:4040"],
            "http:// or https://",
        ),
        (
            vec!["agent", "-p", "1", "--out-dir", "/tmp", "--label", "a-b=1"],
            "invalid --label",
        ),
        (
            vec!["agent", "-p", "1", "--out-dir", "/tmp", "--period", "0s"],
            "invalid --period",
        ),
        (
            vec![
                "agent",
                "-p",
                "1",
                "--pyroscope",
                "http://x",
                "--headers-file",
                writable.to_str().unwrap(),
            ],
            "writable by other users",
        ),
        (
            vec![
                "agent",
                "-p",
                "1",
                "--pyroscope",
                "http://x",
                "--headers-file",
                readable.to_str().unwrap(),
            ],
            "readable by other users",
        ),
        (
            vec![
                "agent",
                "-p",
                "1",
                "--pyroscope",
                "http://x",
                "--headers-file",
                huge.to_str().unwrap(),
            ],
            "more than the 65536",
        ),
    ] {
        let output = std::process::Command::new(allocscope())
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn a_process_that_exited_is_sent_once_more_then_forgotten() {
    if !bpf_available("agent forgets") {
        return;
    }
    let dir = TempDir::new("agent-forgets");
    let out = dir.path("periods");
    let workload = fixture("workload", &[]);
    let script = format!("{w} 8000; sleep 3; {w} 8000", w = workload.display());
    let output = std::process::Command::new(allocscope())
        .args([
            "agent",
            "--period",
            "1s",
            "--interval",
            "256KiB",
            "--spool-in-memory",
        ])
        .arg("--out-dir")
        .arg(&out)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let mut files = tests::files_under(&out);
    files.sort();
    let workloads = |file: &Path| -> Vec<u64> {
        let profile = tests::read_profile(file);
        profile["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["command"] == "workload")
            .map(|p| p["pid"].as_u64().unwrap())
            .collect()
    };
    let seen: Vec<Vec<u64>> = files.iter().map(|f| workloads(f)).collect();
    let first = seen
        .iter()
        .flatten()
        .copied()
        .min()
        .expect("no workload seen");
    let last = seen.iter().flatten().copied().max().unwrap();
    assert_ne!(first, last, "two workloads ran: {seen:?}");
    let first_at = seen.iter().position(|s| s.contains(&first)).unwrap();
    let first_until = seen.iter().rposition(|s| s.contains(&first)).unwrap();
    let second_at = seen.iter().position(|s| s.contains(&last)).unwrap();
    // The first workload is in the periods while it ran and the one it exited in, then
    // gone: the periods of the second one no longer carry it.
    assert!(first_until < second_at, "{seen:?}");
    assert!(first_until >= first_at);
    assert!(
        seen[second_at..].iter().all(|s| !s.contains(&first)),
        "{seen:?}"
    );
}

/// A cgroup v2 group of its own, removed on drop (its processes moved back to the root).
struct Group(std::path::PathBuf);

impl Group {
    fn new(name: &str) -> Group {
        let root = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.controllers").exists())
            .expect("a cgroup v2 hierarchy");
        let dir = root.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Group(dir)
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
        let root = self.0.parent().unwrap().join("cgroup.procs");
        for pid in procs.lines() {
            let _ = std::fs::write(&root, pid);
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn cgroup_selects_the_processes_of_one_group() {
    if !bpf_available("agent --cgroup") {
        return;
    }
    let dir = TempDir::new("agent-cgroup");
    let group = Group::new("allocscope-test");
    let inside = Busy::start();
    let outside = Busy::start();
    group.add(inside.0.id());
    let name = group.0.file_name().unwrap().to_str().unwrap().to_owned();
    let out = dir.path("periods");
    let (agent, stderr) = start_recording(&[
        "agent",
        "--all",
        "--cgroup",
        &format!("/{name}$"),
        "--period",
        "1s",
        "--interval",
        "64KiB",
        "--spool-in-memory",
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    let log = drain(stderr);
    assert!(wait_until(Duration::from_secs(30), || tests::files_under(
        &out
    )
    .len()
        >= 3));
    terminate(agent);
    let log = log.join().unwrap();
    let mut files = tests::files_under(&out);
    files.sort();
    let profile = tests::read_profile(files.last().unwrap());
    let processes = profile["processes"].as_array().unwrap();
    let pids: Vec<u64> = processes
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert!(pids.contains(&u64::from(inside.0.id())), "{pids:?}\n{log}");
    assert!(!pids.contains(&u64::from(outside.0.id())), "{pids:?}");
    for process in processes {
        assert_eq!(process["cgroup"], format!("/{name}"), "{process}");
    }
}

#[test]
fn cgroup_needs_all_or_comm() {
    let output = std::process::Command::new(allocscope())
        .args(["agent", "-p", "1", "--cgroup", "x", "--out-dir", "/tmp"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--cgroup selects among"));
}

#[test]
fn under_all_the_kernel_tables_forget_gone_processes() {
    if !bpf_available("agent forgets in the kernel") {
        return;
    }
    let dir = TempDir::new("agent-kernel-forget");
    let out = dir.path("periods");
    let (agent, stderr) = start_recording(&[
        "agent",
        "--all",
        "-v",
        "--period",
        "1s",
        "--interval",
        "64KiB",
        "--spool-in-memory",
        "--out-dir",
        out.to_str().unwrap(),
        "--keep",
        "3",
    ]);
    let log = tests::awaited::LogWatch::start(stderr);
    // A process counted host-wide (its own pid entry in the kernel's counters), gone.
    let status = std::process::Command::new(fixture("workload", &[]))
        .arg("2000")
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    // Its period sent, the agent forgets it (and its kernel entries) at a later one: a
    // period that closed while it still ran (a loaded machine) forgets none, so the wait
    // is for a period that forgets some.
    let forgotten = |l: &str| {
        l.split("forgot ")
            .nth(1)
            .and_then(|rest| rest.strip_suffix(" kernel entries of gone processes"))
            .and_then(|n| n.parse::<u64>().ok())
    };
    let awaited = log.wait_for(Duration::from_secs(30), |l| {
        forgotten(l).is_some_and(|n| n >= 1)
    });
    terminate(agent);
    let log = log.join();
    assert!(awaited, "no kernel entry forgotten within 30 s:\n{log}");
    assert!(log.lines().filter_map(forgotten).sum::<u64>() >= 1, "{log}");
    assert!(
        !log.contains("forgetting gone processes in the kernel's tables"),
        "{log}"
    );
}

/// A process seen in a period: the period's index, its calls and bytes in it.
type Seen = (usize, u64, u64);

/// Two minutes of a host that never stops starting processes: every period's file holds
/// that period alone (its length, a steady process's counts of those seconds, each short
/// process once, with exactly what it allocated), however long the agent has run.
#[test]
fn each_period_file_holds_its_period_alone_over_two_minutes() {
    if !bpf_available("agent periods over minutes") {
        return;
    }
    let dir = TempDir::new("agent-periods");
    let out = dir.path("periods");
    let workload = fixture("workload", &[]);
    // Batches of 200 rounds (~0.2 s): its stdout is a null device, nothing blocks it.
    let steady = Busy(
        std::process::Command::new(&workload)
            .args(["200", "--forever"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (agent, stderr) = start_recording(&[
        "agent",
        "--all",
        "-v",
        "--period",
        "5s",
        "--interval",
        "64KiB",
        "--spool-in-memory",
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    // The first period began before the agent said it was recording.
    let began = Instant::now();
    let log = drain(stderr);
    // The short processes under a name of their own (other tests run workloads too).
    let short = dir.path("short");
    std::os::unix::fs::symlink(&workload, &short).unwrap();
    const SHORT_ROUNDS: u64 = 20;
    let script = format!(
        "while :; do {} {SHORT_ROUNDS} >/dev/null; done",
        short.display()
    );
    let spawner = Busy(
        std::process::Command::new("sh")
            .args(["-c", &script])
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(120));
    drop(spawner);
    // The last period ends after SIGTERM arrives and before the agent exits.
    let stopping = began.elapsed().as_secs_f64();
    terminate(agent);
    let stopped = began.elapsed().as_secs_f64();
    let log = log.join().unwrap();
    let handled: Vec<&str> = log.lines().filter(|l| l.contains("handled in")).collect();
    let mut files = tests::files_under(&out);
    files.sort();
    // 24 periods of 5 s; fewer where handling one took longer than a period (a loaded CI).
    assert!(
        files.len() >= 12,
        "{} periods in 2 minutes:\n{log}",
        files.len()
    );
    let profiles: Vec<serde_json::Value> = files.iter().map(|f| tests::read_profile(f)).collect();
    let seconds: Vec<f64> = profiles
        .iter()
        .map(|p| p["duration_seconds"].as_f64().unwrap())
        .collect();
    // No whole period is cut short (the first and the last, partial, may be); one is longer
    // than 5 s only when handling the last took longer, which a loaded machine decides.
    for (at, &length) in seconds[1..seconds.len() - 1].iter().enumerate() {
        assert!(
            length >= 4.95,
            "period {}: {length} s in {seconds:?}\n{handled:#?}",
            at + 1
        );
    }
    // Each period begins where the last was cut: together they span the agent's run,
    // neither overlapping nor leaving a gap.
    let spanned: f64 = seconds.iter().sum();
    assert!(
        (stopping - 0.5..stopped + 0.5).contains(&spanned),
        "periods span {spanned} s of a run stopped at {stopping}..{stopped} s: \
         {seconds:?}\n{handled:#?}"
    );
    let process = |profile: &serde_json::Value, pid: u64| -> Option<serde_json::Value> {
        profile["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid)
            .cloned()
    };
    // The steady process allocates at one rate (slowed at times by the other tests'
    // agents, by half in CI): each whole period counts what it did in those seconds, not
    // all it did since the agent started.
    let steady_pid = u64::from(steady.0.id());
    let calls: Vec<u64> = profiles[1..profiles.len() - 1]
        .iter()
        .map(|p| process(p, steady_pid).map_or(0, |s| s["exact"]["calls"].as_u64().unwrap()))
        .collect();
    assert!(
        calls.iter().all(|&c| c > 0),
        "a period without it: {calls:?}"
    );
    // A cumulative count never falls; the period's falls whenever a period was slower
    // than the one before (by about half the time).
    let falls = calls.windows(2).filter(|w| w[1] < w[0]).count();
    assert!(falls >= 3, "per-period counts, not cumulative: {calls:?}");
    // Each short process is in the period it ran in (two, if it ran across a boundary)
    // and then no more; summed over those periods, its counts are exactly its calls. Pids
    // come back (pid_max is 32,768 here): appearances apart are different processes.
    let (round_calls, round_bytes) = tests::workload_round();
    let mut runs: HashMap<u64, Vec<Vec<Seen>>> = HashMap::new();
    for (at, profile) in profiles.iter().enumerate() {
        for p in profile["processes"].as_array().unwrap() {
            let pid = p["pid"].as_u64().unwrap();
            if p["command"] != "short" {
                continue;
            }
            let exact = &p["exact"];
            let seen = (
                at,
                exact["calls"].as_u64().unwrap(),
                exact["bytes"].as_u64().unwrap(),
            );
            let of_pid = runs.entry(pid).or_default();
            match of_pid.last_mut() {
                Some(run) if run.last().unwrap().0 + 1 == at => run.push(seen),
                _ => of_pid.push(vec![seen]),
            }
        }
    }
    let processes: Vec<(u64, Vec<Seen>)> = runs
        .into_iter()
        .flat_map(|(pid, runs)| runs.into_iter().map(move |run| (pid, run)))
        .collect();
    assert!(
        processes.len() > 100,
        "{} short processes seen",
        processes.len()
    );
    let mut exact = 0;
    for (pid, periods) in &processes {
        assert!(periods.len() <= 2, "pid {pid} in periods {periods:?}");
        let calls: u64 = periods.iter().map(|p| p.1).sum();
        let bytes: u64 = periods.iter().map(|p| p.2).sum();
        // Its rounds, and what its start-up (the C library's buffers) allocates.
        if calls >= SHORT_ROUNDS * round_calls {
            let startup = calls - SHORT_ROUNDS * round_calls;
            assert!(startup < 10, "pid {pid}: {calls} calls in {periods:?}");
            assert!(
                bytes >= SHORT_ROUNDS * round_bytes,
                "pid {pid}: {bytes} bytes"
            );
            exact += 1;
        }
    }
    // The agent sees a process from its exec: nearly all are counted whole (one killed
    // at the end, or started before the agent, may not be).
    assert!(
        exact + 3 >= processes.len(),
        "{exact} of {} short processes counted whole",
        processes.len()
    );
}
