//! `cargo xtask soak --agent 30m`: the agent over a long run beside a host that never stops
//! starting processes, to show that its memory and CPU are bounded by what is live rather
//! than by what ever ran, and that each period's file holds that period alone.
//!
//! It starts `allocscope agent --all --out-dir D --period P --status F`, then a shell loop
//! that runs a short allocating program and `ls` over and over (~150 processes a second
//! here), another that runs real programs one after another (python3, perl, sqlite3 and
//! g++ on small inputs), and one long-lived program allocating the whole time. Every sample interval (a minute, or a
//! tenth of a shorter run) it reads the agent's CPU time and resident size from /proc and
//! the newest period file. At the end: the slope of RSS over the last third of the run
//! (the last ten minutes of a 30-minute one), fitted to each minute's median reading,
//! against its noise, and CPU per second in the
//! last third against the first. A benchmark, not a test: it reports, and fails only when
//! the agent dies or writes no period. Every reading is kept in target/soak/readings.csv.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::run::{cargo, fixture, is_root, status, workspace};

#[derive(clap::Args)]
pub struct SoakArgs {
    /// How long to run the agent (`30m`, `2m`, `90s`).
    #[arg(long, value_parser = humantime::parse_duration)]
    agent: Duration,
    /// The agent's period.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    period: Duration,
}

/// One reading of the agent.
#[derive(Clone, Copy, Debug)]
struct Reading {
    /// Seconds since the agent started.
    at: f64,
    /// Its CPU time (user + system), seconds.
    cpu: f64,
    /// Its resident set, MB.
    rss_mb: f64,
    /// Of which anonymous memory (its heap; the rest is files it maps), MB.
    anon_mb: f64,
    /// Of that, the blocks its allocator has given it (its status file's, as of its
    /// last period; NaN before the first), MB.
    heap_mb: f64,
}

pub fn run(args: SoakArgs) -> anyhow::Result<()> {
    if !is_root() {
        bail!("the soak runs the agent with --all: run it as root");
    }
    status(cargo().args(["build", "--release"]))?;
    let workload = fixture("workload")?;
    let out = workspace().join("target/soak");
    let _ = std::fs::remove_dir_all(&out);
    let periods = out.join("periods");
    std::fs::create_dir_all(&out)?;
    let log = std::fs::File::create(out.join("agent.log"))?;
    let status_file = out.join("status.json");
    let mut agent = Guard::spawn(
        Command::new(workspace().join("target/release/allocscope"))
            .args(["agent", "--all", "--spool-in-memory", "--keep", "12"])
            .arg("--period")
            .arg(format!("{}s", args.period.as_secs()))
            .arg("--out-dir")
            .arg(&periods)
            .arg("--status")
            .arg(&status_file)
            .stderr(log),
    )
    .context("starting the agent")?;
    let _load = load(&workload, &out)?;
    let started = Instant::now();
    let forks_before = forks_since_boot()?;
    // A row every minute; readings every 5 s between (the RSS of one moment depends on
    // whether a period is being built then: the verdict fits all of them).
    let every = Duration::from_secs(60).min(args.agent / 10);
    let sample = Duration::from_secs(5).min(every);
    let mut readings = vec![read(agent.0.id(), 0.0, &status_file)?];
    let mut row_from = 0;
    println!(
        "{:>7} {:>7} {:>8} {:>8} {:>8} {:>9} {:>7} {:>8} {:>9}",
        "minute", "cpu %", "rss MB", "anon MB", "heap MB", "forks/s", "period", "stacks", "file MB"
    );
    while started.elapsed() < args.agent {
        std::thread::sleep(sample);
        if let Some(exit) = agent.0.try_wait()? {
            bail!(
                "the agent exited: {exit}; see {}",
                out.join("agent.log").display()
            );
        }
        readings.push(read(
            agent.0.id(),
            started.elapsed().as_secs_f64(),
            &status_file,
        )?);
        let (first, now) = (readings[row_from], readings[readings.len() - 1]);
        if now.at - first.at >= every.as_secs_f64() - 0.5 {
            let forks_per_second = (forks_since_boot()? - forks_before) as f64 / now.at;
            let row = &readings[row_from + 1..];
            print_row(row, &first, forks_per_second, newest_period(&periods));
            row_from = readings.len() - 1;
        }
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let exit = agent.0.wait()?;
    Verdict::of(&readings).print();
    std::fs::write(out.join("readings.csv"), csv(&readings))?;
    println!(
        "{} processes started, agent exit: {exit}; files under {}",
        forks_since_boot()? - forks_before,
        out.display()
    );
    print_status(&status_file)?;
    if newest_period(&periods).is_none() {
        bail!("no period file was written");
    }
    Ok(())
}

/// The agent's own account of its periods and losses (its status file).
fn print_status(status_file: &Path) -> anyhow::Result<()> {
    let status: serde_json::Value = serde_json::from_slice(&std::fs::read(status_file)?)?;
    println!(
        "periods {}, empty {}, dropped {}; samples lost {}",
        status["periods"],
        status["periods_empty"],
        status["periods_dropped"],
        status["samples_lost"]
    );
    Ok(())
}

/// Every reading, one line each.
fn csv(readings: &[Reading]) -> String {
    let mut csv = String::from("seconds,cpu_seconds,rss_mb,anon_mb,heap_mb\n");
    for r in readings {
        csv.push_str(&format!(
            "{:.1},{:.2},{:.2},{:.2},{:.2}\n",
            r.at, r.cpu, r.rss_mb, r.anon_mb, r.heap_mb
        ));
    }
    csv
}

/// One line of the table: the readings of a minute (`row`, not empty) against the one
/// before them, their mean RSS.
fn print_row(row: &[Reading], last: &Reading, forks_per_second: f64, newest: Option<PeriodFile>) {
    let newest = newest.as_ref();
    let reading = row[row.len() - 1];
    let mean = |f: fn(&Reading) -> f64| row.iter().map(f).sum::<f64>() / row.len() as f64;
    println!(
        "{:>7.1} {:>7.1} {:>8.1} {:>8.1} {:>8.1} {:>9.0} {:>7} {:>8} {:>9}",
        reading.at / 60.0,
        100.0 * (reading.cpu - last.cpu) / (reading.at - last.at),
        mean(|r| r.rss_mb),
        mean(|r| r.anon_mb),
        mean(|r| r.heap_mb),
        forks_per_second,
        newest.map_or("-".into(), |p| format!("{:.1}s", p.seconds)),
        newest.map_or("-".into(), |p| p.stacks.to_string()),
        newest.map_or("-".into(), |p| format!("{:.2}", p.mb)),
    );
}

/// What the host does meanwhile: a shell starting short programs without pause, one
/// running real programs one after another, one program allocating the whole time.
fn load(workload: &Path, out: &Path) -> anyhow::Result<[Guard; 3]> {
    let loop_script = format!(
        "while :; do {w} 20 >/dev/null; ls /usr >/dev/null; done",
        w = workload.display()
    );
    let spawner = Guard::spawn(Command::new("sh").args(["-c", &loop_script]))?;
    let programs = Guard::spawn(
        Command::new("sh")
            .args(["-c", &real_programs(out)?])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?;
    let steady = Guard::spawn(
        Command::new(workload)
            .args(["2000", "--forever"])
            .stdout(Stdio::null()),
    )?;
    Ok([spawner, programs, steady])
}

impl Verdict {
    fn print(&self) {
        let verdict = self;
        println!(
            "RSS slope over the last third: {:+.3} MB/min (noise ±{:.3}): {}",
            verdict.rss_slope,
            verdict.rss_noise,
            if verdict.rss_flat() { "flat" } else { "RISING" }
        );
        println!(
            "  of which anonymous memory: {:+.3} MB/min (noise ±{:.3})",
            verdict.anon_slope, verdict.anon_noise
        );
        println!(
            "  of which its allocator's blocks in use: {:+.3} MB/min (noise ±{:.3})",
            verdict.heap_slope, verdict.heap_noise
        );
        println!(
            "CPU in the last third / the first: {:.2}x ({:.1}% → {:.1}% of a core): {}",
            verdict.cpu_ratio(),
            verdict.cpu_first * 100.0,
            verdict.cpu_last * 100.0,
            if verdict.cpu_ratio() <= 1.2 {
                "within 1.2x"
            } else {
                "ABOVE 1.2x"
            }
        );
    }
}

/// A shell loop running real programs on small inputs, one after another (files in `dir`).
fn real_programs(dir: &Path) -> anyhow::Result<String> {
    let mut sql = String::from("CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT);\nBEGIN;\n");
    for i in 0..20_000 {
        sql.push_str(&format!("INSERT INTO t(b) VALUES('row{i}');\n"));
    }
    sql.push_str("COMMIT;\nCREATE INDEX tb ON t(b);\n");
    let batch = dir.join("batch.sql");
    std::fs::write(&batch, sql)?;
    let source = dir.join("unit.cpp");
    std::fs::write(
        &source,
        "#include <map>\n#include <string>\nstd::map<int, std::string> m;\n",
    )?;
    let e2e = workspace().join("xtask/e2e");
    let db = dir.join("db.sqlite");
    Ok(format!(
        "while :; do python3 {py}; perl {pl}; sqlite3 {db} < {batch}; rm -f {db}; \
         g++ -O0 -c -o /dev/null {cpp}; sleep 0.5; done",
        py = e2e.join("script.py").display(),
        pl = e2e.join("script.pl").display(),
        db = db.display(),
        batch = batch.display(),
        cpp = source.display(),
    ))
}

/// The verdict over a run's readings.
#[derive(Debug)]
struct Verdict {
    /// Least-squares slope of RSS over the last third (per-minute medians), MB per minute.
    rss_slope: f64,
    /// Two standard errors of that slope.
    rss_noise: f64,
    /// The same of its anonymous memory alone.
    anon_slope: f64,
    anon_noise: f64,
    /// The same of the blocks its allocator gave it.
    heap_slope: f64,
    heap_noise: f64,
    /// CPU share of a core over the first and the last third.
    cpu_first: f64,
    cpu_last: f64,
}

impl Verdict {
    fn of(readings: &[Reading]) -> Verdict {
        let end = readings.last().map_or(0.0, |r| r.at);
        let third = end / 3.0;
        let last: Vec<&Reading> = readings.iter().filter(|r| r.at >= end - third).collect();
        let (rss_slope, rss_noise) = slope(&per_minute(&last, |r| r.rss_mb));
        let (anon_slope, anon_noise) = slope(&per_minute(&last, |r| r.anon_mb));
        let (heap_slope, heap_noise) = slope(&per_minute(&last, |r| r.heap_mb));
        let cpu_over = |from: f64, to: f64| {
            let inside: Vec<&Reading> = readings
                .iter()
                .filter(|r| r.at >= from && r.at <= to)
                .collect();
            match (inside.first(), inside.last()) {
                (Some(a), Some(b)) if b.at > a.at => (b.cpu - a.cpu) / (b.at - a.at),
                _ => f64::NAN,
            }
        };
        Verdict {
            rss_slope,
            rss_noise,
            anon_slope,
            anon_noise,
            heap_slope,
            heap_noise,
            cpu_first: cpu_over(0.0, third),
            cpu_last: cpu_over(end - third, end),
        }
    }

    fn rss_flat(&self) -> bool {
        self.rss_slope.abs() <= self.rss_noise.max(0.01)
    }

    fn cpu_ratio(&self) -> f64 {
        self.cpu_last / self.cpu_first
    }
}

/// The median of `value` in each minute of `readings` (minutes since the start, each at
/// its middle). Building a period lifts RSS for a few seconds; fitted to every 5-s reading,
/// one such moment in the last minute of a run tilted the slope by more than its noise.
/// A minute's median is what the agent held that minute, and minutes are far less
/// correlated with each other than readings 5 s apart, so their noise is nearer the truth.
fn per_minute(readings: &[&Reading], value: fn(&Reading) -> f64) -> Vec<(f64, f64)> {
    let mut minutes: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for reading in readings {
        let v = value(reading);
        if v.is_finite() {
            minutes
                .entry((reading.at / 60.0) as u64)
                .or_default()
                .push(v);
        }
    }
    // A minute read only in part (the run's last, cut short) says less than the others.
    let most = minutes.values().map(Vec::len).max().unwrap_or(0);
    minutes
        .into_iter()
        .filter(|(_, values)| 2 * values.len() >= most)
        .map(|(minute, mut values)| {
            values.sort_by(f64::total_cmp);
            let n = values.len();
            let median = if n % 2 == 1 {
                values[n / 2]
            } else {
                (values[n / 2 - 1] + values[n / 2]) / 2.0
            };
            (minute as f64 + 0.5, median)
        })
        .collect()
}

/// Least-squares slope of `(minute, MB)` points (MB per minute) and two standard errors.
fn slope(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    if points.len() < 3 {
        return (f64::NAN, f64::NAN);
    }
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let b = sxy / sxx;
    let residual: f64 = points
        .iter()
        .map(|(x, y)| (y - my - b * (x - mx)).powi(2))
        .sum();
    let se = (residual / (n - 2.0) / sxx).sqrt();
    (b, 2.0 * se)
}

fn read(pid: u32, at: f64, status_file: &Path) -> anyhow::Result<Reading> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("no ) in stat")?
        .1
        .split_whitespace()
        .collect();
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (fields[11].parse::<f64>()? + fields[12].parse::<f64>()?) / tick;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = |field: &str| -> anyhow::Result<f64> {
        let value = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .with_context(|| format!("no {field}"))?;
        Ok(value.trim().trim_end_matches(" kB").parse()?)
    };
    Ok(Reading {
        at,
        cpu,
        rss_mb: kb("VmRSS:")? / 1024.0,
        anon_mb: kb("RssAnon:")? / 1024.0,
        heap_mb: heap_mb(status_file),
    })
}

/// The agent's heap in use as of its last period (NaN before its first).
fn heap_mb(status_file: &Path) -> f64 {
    std::fs::read(status_file)
        .ok()
        .and_then(|text| serde_json::from_slice::<serde_json::Value>(&text).ok())
        .and_then(|status| status["heap_in_use_bytes"].as_f64())
        .map_or(f64::NAN, |bytes| bytes / 1048576.0)
}

/// Processes started since boot (`/proc/stat`'s `processes`).
fn forks_since_boot() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    stat.lines()
        .find_map(|l| l.strip_prefix("processes "))
        .context("no processes line in /proc/stat")?
        .trim()
        .parse()
        .context("parsing /proc/stat")
}

/// What the newest period file says of itself.
struct PeriodFile {
    seconds: f64,
    stacks: usize,
    mb: f64,
}

fn newest_period(dir: &Path) -> Option<PeriodFile> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    // The newest may be pruned between listing and reading: fall back to the one before.
    files.iter().rev().find_map(|file| {
        let text = std::fs::read(file).ok()?;
        let profile: serde_json::Value = serde_json::from_slice(&text).ok()?;
        Some(PeriodFile {
            seconds: profile["duration_seconds"].as_f64()?,
            stacks: profile["stacks"].as_array()?.len(),
            mb: text.len() as f64 / 1e6,
        })
    })
}

/// A child killed when dropped.
/// A child of the soak, in a process group of its own, that dies with it however it ends:
/// dropped (its whole group killed), or the soak killed or interrupted (the kernel sends it
/// SIGTERM, so the agent still closes its last period).
struct Guard(Child);

impl Guard {
    fn spawn(command: &mut Command) -> std::io::Result<Guard> {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl and getppid are async-signal-safe; nothing else runs between fork
        // and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The soak may have died before the prctl: then nobody will send it.
                if libc::getppid() == 1 {
                    libc::raise(libc::SIGTERM);
                }
                Ok(())
            });
        }
        // Ctrl-C reaches the soak alone; its children hear of it through the above.
        command.process_group(0).spawn().map(Guard)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // The group: a shell loop's current program goes with the shell. (Not once the
        // child was reaped: its pid may be another's by now.)
        if let (Ok(None), Ok(pid)) = (self.0.try_wait(), i32::try_from(self.0.id())) {
            // SAFETY: kill has no memory effects; the group is the child's own.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readings(rss: impl Fn(f64) -> f64, cpu_rate: impl Fn(f64) -> f64) -> Vec<Reading> {
        let mut cpu = 0.0;
        (0..=30)
            .map(|minute| {
                let at = minute as f64 * 60.0;
                cpu += 60.0 * cpu_rate(at);
                Reading {
                    at,
                    cpu,
                    rss_mb: rss(at),
                    anon_mb: rss(at) / 2.0,
                    heap_mb: rss(at) / 3.0,
                }
            })
            .collect()
    }

    #[test]
    fn a_flat_agent_is_flat_and_a_leaking_one_is_not() {
        let wobble = |at: f64| {
            if ((at / 60.0) as u64).is_multiple_of(2) {
                0.3
            } else {
                -0.3
            }
        };
        let flat = Verdict::of(&readings(|at| 80.0 + wobble(at), |_| 0.15));
        assert!(flat.rss_flat(), "{flat:?}");
        assert!((flat.cpu_ratio() - 1.0).abs() < 0.05, "{flat:?}");
        let leaking = Verdict::of(&readings(
            |at| 80.0 + at / 60.0 + wobble(at),
            |at| 0.1 + at / 1e4,
        ));
        assert!(!leaking.rss_flat(), "{leaking:?}");
        assert!((leaking.rss_slope - 1.0).abs() < 0.1, "{leaking:?}");
        assert!(leaking.cpu_ratio() > 1.2, "{leaking:?}");
    }

    #[test]
    fn a_moment_of_building_at_the_end_does_not_tilt_the_slope() {
        // Every 5 s for 30 minutes, flat but for a wobble, and 10 MB more for the two
        // readings of one period built in the last minute.
        let readings: Vec<Reading> = (0..=360)
            .map(|i| {
                let at = i as f64 * 5.0;
                let wobble = if i % 3 == 0 { 0.5 } else { -0.25 };
                let built = if (355..357).contains(&i) { 10.0 } else { 0.0 };
                Reading {
                    at,
                    cpu: at * 0.1,
                    rss_mb: 130.0 + wobble + built,
                    anon_mb: 48.0 + built,
                    heap_mb: 61.0,
                }
            })
            .collect();
        let verdict = Verdict::of(&readings);
        assert!(verdict.rss_flat(), "{verdict:?}");
        assert!(verdict.rss_slope.abs() < 0.05, "{verdict:?}");
    }
}
