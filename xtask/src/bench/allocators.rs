//! The allocators benchmark (`cargo xtask bench --allocators`, #63): what `record -- CMD`
//! costs a program whose allocator is linked into its executable, against the program
//! natively and under heaptrack, in the same rounds.
//!
//! Programs: tests/fixtures/rust (a Rust program whose rounds allocate at four known sites,
//! behind a counter of its own) built with tikv-jemallocator, with mimalloc, and with the
//! system allocator (glibc through the dynamic linker: the front end's usual case, for
//! comparison). Each times its own rounds and prints it on standard error; per round each
//! program runs natively, under `allocscope record --` and under heaptrack, in an order
//! rotated every round. Reported: the median of each mode's rounds time, the median of
//! the per-round ratios to native, and, from allocscope's last recording of each, its
//! front end and whether its exact calls equal the program's own count.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The program's rounds: ~0.8 s natively here.
const ROUNDS: &str = "200000";

/// The benchmark.
pub(super) fn allocators(
    args: &BenchArgs,
    allocscope: &Path,
    out_dir: &Path,
) -> anyhow::Result<()> {
    let programs = ["jemalloc", "mimalloc", "system"]
        .into_iter()
        .map(|allocator| Ok((allocator, build(allocator)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let record = out_dir.join("allocators.json");
    let heaptrack = out_dir.join("allocators.heaptrack");
    let modes: [(&str, Vec<String>); 3] = [
        ("native", Vec::new()),
        (
            "allocscope",
            vec![
                allocscope.display().to_string(),
                "record".into(),
                "-o".into(),
                record.display().to_string(),
                "--".into(),
            ],
        ),
        (
            "heaptrack",
            vec![
                "heaptrack".into(),
                "-o".into(),
                heaptrack.display().to_string(),
            ],
        ),
    ];
    let mut times = vec![vec![Vec::new(); modes.len()]; programs.len()];
    let mut checks = vec![String::new(); programs.len()];
    eprintln!("round  program                       mode        rounds ms");
    for round in 0..=args.rounds.min(5) {
        for (p, (name, program)) in programs.iter().enumerate() {
            for m in (0..modes.len()).map(|i| (i + round) % modes.len()) {
                let mut argv = modes[m].1.clone();
                argv.push(program.display().to_string());
                argv.push(ROUNDS.into());
                let (ms, own_calls) = run(&argv)?;
                eprintln!(
                    "{:>5}  rust + {name:<22} {:<10} {ms:>9.0}",
                    if round == 0 {
                        "warm".into()
                    } else {
                        round.to_string()
                    },
                    modes[m].0,
                );
                if modes[m].0 == "allocscope" {
                    checks[p] = check(&record, own_calls)?;
                }
                if round > 0 {
                    times[p][m].push(ms);
                }
            }
        }
    }
    println!("\nprogram            mode         median ms   × native (median of rounds)");
    for (p, (name, _)) in programs.iter().enumerate() {
        for (m, (mode, _)) in modes.iter().enumerate() {
            let ratios: Vec<f64> = times[p][m]
                .iter()
                .zip(&times[p][0])
                .map(|(t, native)| t / native)
                .collect();
            println!(
                "rust + {name:<11} {mode:<12} {:>9.0}   {:>6.2}×",
                median(times[p][m].clone()),
                median(ratios)
            );
        }
        println!("  allocscope's last recording: {}", checks[p]);
    }
    Ok(())
}

/// The fixture built with `allocator` (a cargo feature, or `system`), once per change.
fn build(allocator: &str) -> anyhow::Result<PathBuf> {
    let project = workspace().join("tests/fixtures/rust");
    let target_dir = workspace()
        .join("target/fixtures")
        .join(format!("rust-{allocator}"));
    let mut cargo = cargo();
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
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_TARGET_DIR");
    if allocator != "system" {
        cargo.args(["--features", allocator]);
    }
    status(&mut cargo)?;
    Ok(target_dir.join("release/rustalloc"))
}

/// Runs `argv` (ending with the program and its rounds): the rounds' milliseconds the
/// program printed, and the calls it counted itself.
fn run(argv: &[String]) -> anyhow::Result<(f64, u64)> {
    let output = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {}", argv[0]))?;
    if !output.status.success() {
        bail!("{argv:?} exited with {}", output.status);
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let ms = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("rounds took ")?
                .strip_suffix(" ms")?
                .parse()
                .ok()
        })
        .with_context(|| format!("{argv:?} did not say how long its rounds took: {stderr}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let calls = stdout
        .split_whitespace()
        .skip_while(|w| *w != "calls")
        .nth(1)
        .and_then(|w| w.parse().ok())
        .unwrap_or(0);
    Ok((ms, calls))
}

/// What allocscope's recording at `path` says of the program: its front end, and its exact
/// calls against the program's own `own_calls`.
fn check(path: &Path, own_calls: u64) -> anyhow::Result<String> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path)?)?;
    let process = json["processes"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["command"] == "rustalloc"))
        .context("no rustalloc process in the recording")?;
    let calls = process["exact"]["calls"].as_u64().unwrap_or(0);
    Ok(format!(
        "front end {}, exact calls {calls} (the program's own {own_calls}, {:+})",
        process["front_end"],
        calls as i64 - own_calls as i64
    ))
}
