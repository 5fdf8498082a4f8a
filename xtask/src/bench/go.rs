//! The Go benchmark (`cargo xtask bench --go`, #43): what recording a Go program through its
//! runtime's own sampler costs it, built by Debian's Go and by the current release. The program (tests/fixtures/go/goalloc, built here with
//! the system's Go) allocates ~10 GB in 1, 2, 4 and 8 KiB blocks at the runtime's
//! default rate (512 KiB) and times its own allocating; per round it runs natively and
//! attached (`allocscope record -p`, its "go" sent once allocscope is recording), in an
//! order rotated every round. heaptrack is not compared: it probes `malloc`, which a Go
//! program's heap never calls (it would record nothing).

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

/// `rounds` rounds (after a warm-up) natively and attached, of `program` built by `name`.
fn one_toolchain(
    args: &BenchArgs,
    allocscope: &Path,
    out_dir: &Path,
    program: &Path,
    name: &str,
) -> anyhow::Result<()> {
    let profile = out_dir.join("go.json");
    let mut seconds: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    eprintln!("{name}\nround  mode       allocating (s)");
    for round in 0..=args.rounds {
        for mode in [round % 2, (round + 1) % 2] {
            let elapsed = run(program, (mode == 1).then_some((allocscope, &profile)))?;
            let shown = if round == 0 {
                "warm".into()
            } else {
                round.to_string()
            };
            eprintln!(
                "{shown:>5}  {:<10} {elapsed:>8.3}",
                ["native", "attached"][mode]
            );
            if round > 0 {
                seconds[mode].push(elapsed);
            }
        }
    }
    let text = std::fs::read_to_string(&profile)?;
    let recorded: serde_json::Value = serde_json::from_str(&text)?;
    let samples = recorded["processes"][0]["samples"].as_f64().unwrap_or(0.0);
    let ratios: Vec<f64> = seconds[1]
        .iter()
        .zip(&seconds[0])
        .map(|(attached, native)| attached / native)
        .collect();
    let (native, attached) = (median(seconds[0].clone()), median(seconds[1].clone()));
    let ratio = median(ratios);
    println!(
        "{name}: a Go program allocating ~10 GB at MemProfileRate 512 KiB: native median \
         {native:.3} s ({:.1} GB/s), attached median {attached:.3} s, median ratio {:.3}× \
         (target ≤ 1.02×); {samples} samples in the last run ({:.0}/s): {:.1} µs of the \
         program's time per sample",
        10.1 / native,
        ratio,
        samples / native,
        (ratio - 1.0) * native * 1e6 / samples.max(1.0)
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

/// One run of the program, attached by `recorder` (allocscope and its output) or not: the
/// seconds it says its allocating took.
fn run(program: &Path, recorder: Option<(&Path, &PathBuf)>) -> anyhow::Result<f64> {
    let mut child = Command::new(program)
        .args(["-rate", "524288", "-rounds", ROUNDS_OF_ALLOCATION, "-wait"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    anyhow::ensure!(line.starts_with("ready"), "the program said {line:?}");
    let mut allocscope = None;
    if let Some((allocscope_path, profile)) = recorder {
        let mut spawned = Command::new(allocscope_path)
            .args(["record", "-o"])
            .arg(profile)
            .args(["-p", &child.id().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut stderr = BufReader::new(spawned.stderr.take().context("stderr")?);
        loop {
            let mut said = String::new();
            anyhow::ensure!(stderr.read_line(&mut said)? > 0, "allocscope ended early");
            if said.starts_with("allocscope: recording ") {
                break;
            }
        }
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        allocscope = Some(spawned);
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
    if let Some(mut allocscope) = allocscope {
        allocscope.wait()?;
    }
    elapsed.context("the program did not say how long it took")
}
