//! The Go benchmark (`cargo xtask bench --go`, #43): what recording a Go program through its
//! runtime's own sampler costs it, built by Debian's Go and by the current release. The
//! program (tests/fixtures/go/goalloc, built here with the system's Go) allocates ~10 GB in
//! 1, 2, 4 and 8 KiB blocks at the runtime's default rate (512 KiB) and times its own
//! allocating; per round it runs natively, under the bare probe (`allocscope
//! reference-probe --producer -p`: a program that only counts, where `record` probes the
//! runtime, so the traps' own cost) and attached (`allocscope record -p`), its "go" sent
//! once the probes are in, in an order rotated every round. Attached by pid, the runtime is
//! read, not probed (its heap profile from its memory every 100 ms): the bare probe says
//! what probing it would cost. heaptrack is not compared: it
//! probes `malloc`, which a Go program's heap never calls (it would record nothing).

use std::io::{BufRead as _, BufReader, Write as _};

#[allow(clippy::wildcard_imports)]
use super::*;

const ROUNDS_OF_ALLOCATION: &str = "3000000";

/// The benchmark, with Debian's Go and the current release `cargo xtask setup` unpacked.
pub(super) fn go(args: &BenchArgs, allocscope: &Path, out_dir: &Path) -> anyhow::Result<()> {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let current = PathBuf::from(home).join(format!(
        ".cache/allocscope-go-{}/go/bin/go",
        crate::setup::CURRENT_GO
    ));
    let toolchains = [
        ("go1.19 (Debian)".to_owned(), PathBuf::from("go")),
        (format!("go{}", crate::setup::CURRENT_GO), current),
    ];
    for (n, (name, go)) in toolchains.iter().enumerate() {
        let program = build(out_dir, go, n)?;
        one_toolchain(args, allocscope, out_dir, &program, name)?;
    }
    Ok(())
}

/// How a round's run is probed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Native,
    /// The reference program (it counts, nothing else) where `record` probes the runtime:
    /// what the traps alone cost.
    Bare,
    Attached,
}

const MODES: [Mode; 3] = [Mode::Native, Mode::Bare, Mode::Attached];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Native => "native",
            Mode::Bare => "bare probe",
            Mode::Attached => "attached",
        }
    }
}

/// `rounds` rounds (after a warm-up) natively, under the bare probe and attached, of
/// `program` built by `name`, in an order rotated every round.
fn one_toolchain(
    args: &BenchArgs,
    allocscope: &Path,
    out_dir: &Path,
    program: &Path,
    name: &str,
) -> anyhow::Result<()> {
    let profile = out_dir.join("go.json");
    let mut seconds: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    eprintln!("{name}\nround  mode        allocating (s)");
    for round in 0..=args.rounds {
        for turn in 0..MODES.len() {
            let index = (round + turn) % MODES.len();
            let mode = MODES[index];
            let elapsed = run(program, mode, allocscope, &profile)?;
            let shown = if round == 0 {
                "warm".into()
            } else {
                round.to_string()
            };
            eprintln!("{shown:>5}  {:<11} {elapsed:>8.3}", mode.name());
            if round > 0 {
                seconds[index].push(elapsed);
            }
        }
    }
    let text = std::fs::read_to_string(&profile)?;
    let recorded: serde_json::Value = serde_json::from_str(&text)?;
    let samples = recorded["processes"][0]["samples"].as_f64().unwrap_or(0.0);
    // The median of the rounds' ratios of mode `of` to mode `to` (indices into MODES).
    let ratio = |of: usize, to: usize| {
        median(
            seconds[of]
                .iter()
                .zip(&seconds[to])
                .map(|(a, b)| a / b)
                .collect(),
        )
    };
    let native = median(seconds[0].clone());
    let (bare, attached, over_bare) = (ratio(1, 0), ratio(2, 0), ratio(2, 1));
    let said = recorded["overhead"]["share"]
        .as_f64()
        .map_or_else(|| "n/a".to_owned(), |s| format!("+{:.1}%", s * 100.0));
    println!(
        "{name}: a Go program allocating ~10 GB at MemProfileRate 512 KiB: native median \
         {native:.3} s ({:.1} GB/s); median ratios to native: bare probe {bare:.3}×, \
         attached {attached:.3}× (target ≤ 1.02×), attached to bare {over_bare:.3}×; \
         {samples} samples in the last run ({:.0}/s): {:.1} µs of the program's time per \
         sample attached, {:.1} µs under the bare probe; the last run's overhead line: \
         {said} CPU",
        10.1 / native,
        samples / native,
        (attached - 1.0) * native * 1e6 / samples.max(1.0),
        (bare - 1.0) * native * 1e6 / samples.max(1.0),
    );
    Ok(())
}

/// Builds the program into `out_dir` (offline, without cgo).
fn build(out_dir: &Path, go: &Path, n: usize) -> anyhow::Result<PathBuf> {
    let binary = out_dir.join(format!("goalloc-{n}"));
    let target = workspace().join("target");
    status(
        Command::new(go)
            .args(["build", "-o"])
            .arg(&binary)
            .arg(".")
            .current_dir(workspace().join("tests/fixtures/go/goalloc"))
            .env("CGO_ENABLED", "0")
            .env("GOFLAGS", "-mod=mod")
            .env("GOPROXY", "off")
            .env("GOTOOLCHAIN", "local")
            .env("GOCACHE", target.join(format!("go-cache-bench-{n}")))
            .env("GOPATH", target.join("go-path")),
    )?;
    Ok(binary)
}

/// One run of the program in `mode` (`allocscope`, writing `profile` when attached): the
/// seconds it says its allocating took.
fn run(program: &Path, mode: Mode, allocscope: &Path, profile: &Path) -> anyhow::Result<f64> {
    let mut child = Command::new(program)
        .args(["-rate", "524288", "-rounds", ROUNDS_OF_ALLOCATION, "-wait"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    anyhow::ensure!(line.starts_with("ready"), "the program said {line:?}");
    let pid = child.id().to_string();
    let mut command = Command::new(allocscope);
    let ready = match mode {
        Mode::Native => None,
        Mode::Bare => {
            command.args(["reference-probe", "--producer", "-p", &pid]);
            Some("allocscope: reference probe recording ")
        }
        Mode::Attached => {
            command
                .args(["record", "-o"])
                .arg(profile)
                .args(["-p", &pid]);
            Some("allocscope: recording ")
        }
    };
    let mut probe = None;
    if let Some(ready) = ready {
        let mut spawned = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut stderr = BufReader::new(spawned.stderr.take().context("stderr")?);
        loop {
            let mut said = String::new();
            anyhow::ensure!(stderr.read_line(&mut said)? > 0, "allocscope ended early");
            if said.starts_with(ready) {
                break;
            }
        }
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        probe = Some(spawned);
    }
    child.stdin.as_mut().context("stdin")?.write_all(b"go\n")?;
    let mut elapsed = None;
    for line in stdout.lines() {
        let line = line?;
        if let Some(ns) = line.strip_prefix("elapsed_ns ") {
            elapsed = Some(ns.trim().parse::<f64>()? / 1e9);
        }
    }
    child.wait()?;
    if let Some(mut probe) = probe {
        if mode == Mode::Bare {
            // It counts until told to stop.
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(probe.id() as libc::pid_t, libc::SIGTERM) };
        }
        probe.wait()?;
    }
    elapsed.context("the program did not say how long it took")
}
