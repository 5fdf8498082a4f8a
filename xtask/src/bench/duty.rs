//! The duty-cycling benchmark (`cargo xtask bench --duty`).

#[allow(clippy::wildcard_imports)]
use super::*;

/// The duty-cycling benchmark: per round, workload and budget, two pinned copies of the
/// loop doing the same work, one native and one under `record --alloc-only
/// --max-overhead`; the ratio of their whole run times, the share the profile says the
/// probes added, and whether the profile's bounds on the bytes allocated hold the truth
/// (64 bytes per iteration; the loop's own few other allocations are within the slack).
/// Two workloads: a malloc loop doing nothing else (~9 ns per iteration natively, ~100
/// times that while probed), and one doing ~1 µs of arithmetic per allocation.
pub(super) fn duty(
    args: &BenchArgs,
    looper: &Path,
    allocscope: &Path,
    out_dir: &Path,
) -> anyhow::Result<()> {
    const SLACK: f64 = 1024.0 * 1024.0;
    // (name, arithmetic steps per allocation, iterations as a share of --duty-iterations)
    let workloads: [(&str, u32, u64); 2] = [
        ("malloc loop", 0, 1),
        ("1 µs of work per allocation", 1000, 110),
    ];
    let budgets = ["1%", "2%", "5%", "10%"];
    let mut results: Vec<Vec<(f64, bool, f64, f64)>> =
        vec![Vec::new(); budgets.len() * workloads.len()];
    eprintln!(
        "round  workload                      budget  native s  ours s  ratio  added  estimate/truth  bounds"
    );
    for round in 1..=args.rounds {
        let (native_cpu, ours_cpu) = if round % 2 == 0 { (0, 1) } else { (1, 0) };
        for (w, &(workload, work, divisor)) in workloads.iter().enumerate() {
            let chunks = u32::try_from(args.duty_iterations / divisor / u64::from(DUTY_PER_CHUNK))
                .context("--duty-iterations too large")?
                .max(1);
            let truth = f64::from(chunks) * f64::from(DUTY_PER_CHUNK) * 64.0;
            for (b, budget) in budgets.iter().enumerate() {
                let profile =
                    out_dir.join(format!("duty-{w}-{}.json", budget.trim_end_matches('%')));
                let run = DutyRun {
                    cpus: (native_cpu, ours_cpu),
                    chunks,
                    work,
                    budget,
                    profile: &profile,
                };
                let (native_ns, ours_ns, json) = run.measure(args, looper, allocscope)?;
                let bytes = &json["processes"][0]["alloc_bytes"];
                let estimate = bytes["estimate"].as_f64().unwrap_or(0.0);
                let lower = bytes["lower"].as_f64().unwrap_or(0.0);
                // `null`: no upper bound.
                let upper = bytes["upper"].as_f64().unwrap_or(f64::INFINITY);
                let held = lower <= truth + SLACK && truth <= upper;
                let added = json["overhead"]["share"].as_f64().unwrap_or(f64::NAN);
                let ratio = ours_ns / native_ns;
                eprintln!(
                    "{round:>5}  {workload:<28}  {budget:>6}  {:>8.2}  {:>6.2}  {ratio:.3}  {:>5.1}%  {:>14.3}  [{:.3}, {:.3}] {}",
                    native_ns / 1e9,
                    ours_ns / 1e9,
                    added * 100.0,
                    estimate / truth,
                    lower / truth,
                    upper / truth,
                    if held { "held" } else { "MISSED" },
                );
                results[w * budgets.len() + b].push((ratio, held, added, (upper - lower) / truth));
            }
        }
    }
    for (w, (workload, ..)) in workloads.iter().enumerate() {
        for (b, budget) in budgets.iter().enumerate() {
            let runs = &results[w * budgets.len() + b];
            let held = runs.iter().filter(|r| r.1).count();
            println!(
                "{workload}, record --alloc-only --max-overhead {budget}: median over {} rounds: \
                 {:.3}× the native run time, probes added {:.1}% of its own CPU time, 95% \
                 bounds held the truth in {held} of {} runs (median width {:.0}% of it)",
                runs.len(),
                median(runs.iter().map(|r| r.0).collect()),
                median(runs.iter().map(|r| r.2).collect()) * 100.0,
                runs.len(),
                median(runs.iter().map(|r| r.3).collect()) * 100.0,
            );
        }
    }
    Ok(())
}

/// One duty-cycling run: the native copy on `cpus.0`, ours on `cpus.1` under `record
/// --alloc-only --max-overhead budget`, `chunks` chunks of the loop with `work` steps of
/// arithmetic per allocation.
struct DutyRun<'a> {
    cpus: (u32, u32),
    chunks: u32,
    work: u32,
    budget: &'a str,
    profile: &'a Path,
}

impl DutyRun<'_> {
    /// Both copies' run times (ns) and the profile written.
    fn measure(
        &self,
        args: &BenchArgs,
        looper: &Path,
        allocscope: &Path,
    ) -> anyhow::Result<(f64, f64, serde_json::Value)> {
        let start = |cpu| Loop::start_working(looper, cpu, DUTY_PER_CHUNK, self.chunks, self.work);
        let (mut native, mut ours) = (start(self.cpus.0)?, start(self.cpus.1)?);
        let probe = Probe::start(
            Command::new(allocscope)
                .args([
                    "record",
                    "--alloc-only",
                    "--max-overhead",
                    self.budget,
                    "-p",
                ])
                .arg(ours.pid())
                .arg("-o")
                .arg(self.profile)
                .args(&args.record_args),
        )?;
        native.go()?;
        ours.go()?;
        let (native_ns, ours_ns) = (native.finish_both()?.1, ours.finish_both()?.1);
        probe.stop()?;
        let text = std::fs::read_to_string(self.profile)
            .with_context(|| format!("reading {}", self.profile.display()))?;
        Ok((native_ns, ours_ns, serde_json::from_str(&text)?))
    }
}

/// Iterations per timed chunk of the duty-cycling loops.
const DUTY_PER_CHUNK: u32 = 2_000;
