//! The in-process front end's benchmark (`cargo xtask bench --front-end`).

#[allow(clippy::wildcard_imports)]
use super::*;

/// A benchmark mode: its name, the command prefix the loop runs under, its environment,
/// and whether `allocscope record -p` is run on it (and gone) before it starts.
type Mode<'a> = (&'a str, Vec<String>, Vec<(String, String)>, bool);

/// The in-process front end's benchmark. Per round, two pinned copies of the loop run at
/// once natively (each CPU's native cost), then per mode copy A natively (the drift
/// reference) and copy B under the mode; B's added cost is corrected by A's drift. CPUs
/// swap every round; medians over rounds. Modes: the library preloaded with nothing
/// attached (its countdown and counters; the USDT sites are nops); the library loaded into
/// the running loop by `record -p` for 0.2 s before it starts, allocscope gone (what stays
/// in a process after an attach: its calls routed through the library); `record -- CMD` at the
/// default interval (library and allocscope attached: what a user pays); and at `-i 4KiB`
/// (one call in 64 sampled, unthrottled) with the sites probed at the trapping 1-byte nop
/// (the default) and, `--usdt-nop5`, at the optimised 5-byte nop (unsafe for programs that
/// fork on Linux 6.18; `bench_loop` does not): their difference from the default mode,
/// times 64, is what one sample costs each way.
pub(super) fn front_end(
    args: &BenchArgs,
    looper: &Path,
    allocscope: &Path,
    out_dir: &Path,
) -> anyhow::Result<()> {
    // The library as a user installs it (the one allocscope embeds and loads).
    status(
        Command::new(allocscope)
            .args(["generate", "library"])
            .arg(out_dir)
            .stdout(Stdio::null()),
    )?;
    let library = out_dir.join("libsampler_preload.so");
    let out = out_dir.join("front-end.json");
    let record = |extra: &[&str]| record_prefix(allocscope, &out, extra);
    let sampled = ["-i", "4KiB", "--max-samples-per-sec", "0"];
    let nop5 = ["-i", "4KiB", "--max-samples-per-sec", "0", "--usdt-nop5"];
    let modes: Vec<Mode> = vec![
        (
            "library, nothing attached",
            Vec::new(),
            vec![("LD_PRELOAD".into(), library.display().to_string())],
            false,
        ),
        (
            "record -- (default interval)",
            record(&[]),
            Vec::new(),
            false,
        ),
        ("record -i 4KiB (nop5)", record(&nop5), Vec::new(), false),
        ("record -i 4KiB (int3)", record(&sampled), Vec::new(), false),
        ("left by record -p, detached", Vec::new(), Vec::new(), true),
    ];
    let mut added: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut natives = Vec::new();
    eprintln!("round  mode                           cpu  native ns  added ns");
    for round in 0..=args.rounds {
        let (a_cpu, b_cpu) = if round % 2 == 0 { (0, 1) } else { (1, 0) };
        let native = {
            let mut a = Loop::start(looper, a_cpu, args)?;
            let mut b = Loop::start(looper, b_cpu, args)?;
            a.go()?;
            b.go()?;
            (a.finish()?, b.finish()?)
        };
        for (index, mode) in modes.iter().enumerate() {
            let paths = (looper, allocscope, out.as_path());
            let cost = mode_cost(mode, (a_cpu, b_cpu), native, paths, args)?;
            eprintln!(
                "{:>5}  {:<30} {b_cpu}    {:>9.1}  {cost:>8.2}",
                if round == 0 {
                    "warm".to_owned()
                } else {
                    round.to_string()
                },
                mode.0,
                native.1,
            );
            if round > 0 {
                added[index].push(cost);
            }
        }
        if round > 0 {
            natives.push((native.0 + native.1) / 2.0);
        }
    }
    report_front_end(&modes, &added, natives);
    Ok(())
}

/// `allocscope record -o OUT EXTRA --`, the prefix a loop runs under.
fn record_prefix(allocscope: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut command = vec![
        allocscope.display().to_string(),
        "record".to_owned(),
        "-o".to_owned(),
        out.display().to_string(),
    ];
    command.extend(extra.iter().map(|s| (*s).to_owned()));
    command.push("--".to_owned());
    command
}

/// One run of `mode` on CPU `cpus.1` beside a native reference on `cpus.0`: its added ns
/// per iteration, corrected by the reference's drift from this round's `native` runs.
/// `paths`: the loop, allocscope, and where `record -p` writes.
fn mode_cost(
    (_, prefix, env, attach): &Mode,
    (a_cpu, b_cpu): (u32, u32),
    native: (f64, f64),
    (looper, allocscope, out): (&Path, &Path, &Path),
    args: &BenchArgs,
) -> anyhow::Result<f64> {
    let mut a = Loop::start(looper, a_cpu, args)?;
    let mut b = Loop::start_under(prefix, env, looper, b_cpu, args)?;
    if *attach {
        status(
            Command::new(allocscope)
                .args(["record", "-p", &b.pid(), "-d", "0.2", "-o"])
                .arg(out)
                .stderr(Stdio::null()),
        )?;
    }
    a.go()?;
    b.go()?;
    let (reference, ours) = (a.finish()?, b.finish()?);
    Ok((ours - native.1) - (reference - native.0))
}

/// Prints each front-end mode's added cost and what one sample costs through each probe.
fn report_front_end(modes: &[Mode], added: &[Vec<f64>], natives: Vec<f64>) {
    let native = median(natives);
    println!("native malloc(64)+free: {native:.1} ns (median over rounds)");
    for ((name, ..), costs) in modes.iter().zip(added) {
        println!(
            "{name}: +{:.2} ns per malloc+free (median over {} rounds)",
            median(costs.clone()),
            costs.len()
        );
    }
    let per_sample = |mode: usize| -> f64 {
        median(
            added[mode]
                .iter()
                .zip(&added[1])
                .map(|(sampled, default)| (sampled - default) * CALLS_PER_SAMPLE_4K)
                .collect(),
        )
    };
    // The trap's share, round by round (both modes ran in the same round).
    let trap_over_nop5 = median(
        added[3]
            .iter()
            .zip(&added[2])
            .map(|(int3, nop5)| (int3 - nop5) * CALLS_PER_SAMPLE_4K)
            .collect(),
    );
    println!(
        "per sample (-i 4KiB, 1 call in {CALLS_PER_SAMPLE_4K}): {:+.0} ns through the optimised \
         5-byte-nop probe, {:+.0} ns through the int3 trap (medians over rounds); the int3 \
         trap costs {trap_over_nop5:+.0} ns more per sample (median of the rounds' differences)",
        per_sample(2),
        per_sample(3)
    );
}
