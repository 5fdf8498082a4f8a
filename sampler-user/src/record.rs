//! `allocscope record`: preflight → attach → collect until stopped → export.
//!
//! Stopping (duration, SIGINT, SIGTERM, every target gone) always goes through the same
//! path: drain the ring buffer, read the exact counters, detach, symbolize, write the file
//! atomically, print the summary. Nothing recorded is dropped on the way out. With
//! `--every`, a snapshot is written each period while recording, and the last, partial
//! period when it stops.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use aya::maps::{PerCpuArray, RingBuf};
use log::{debug, info};
use sampler_common::ProcessCounters;
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    collect::{self, Losses, SampleReader},
    config::{BadInput, Output, RecordConfig, Targets},
    exits,
    export::{self, Value},
    preflight,
    probe::attach::{self, KernelConfig, Probes, Target},
    profile::{Profile, Recorder, Settings},
    spawn::{self, PausedChild},
    stacks::symbolize::Symbolizer,
    summary,
};

/// Everything prepared before the runtime starts: validated targets and output.
pub struct Prepared {
    config: RecordConfig,
    targets: Vec<Target>,
    child: Option<PausedChild>,
}

/// Runs every check that can fail on bad input, then (for `-- CMD`) forks the paused
/// child. Must run before any thread exists.
pub fn prepare(config: RecordConfig) -> Result<Prepared, BadInput> {
    preflight::check_privileges()?;
    let mut targets = match &config.targets {
        Targets::Pids(pids) => pids
            .iter()
            .map(|&pid| {
                Ok(Target {
                    pid,
                    allocator: preflight::allocator_of_pid(pid)?,
                })
            })
            .collect::<Result<Vec<_>, BadInput>>()?,
        Targets::Command(argv) => {
            let program = preflight::resolve_command(&argv[0])?;
            let allocator = preflight::allocator_for_command(&program)?;
            vec![Target { pid: 0, allocator }]
        }
    };
    preflight::check_output(&config.output)?;
    let mut child = None;
    if let Targets::Command(argv) = &config.targets {
        let paused = spawn::spawn_paused(argv)
            .map_err(|e| BadInput(format!("cannot start {}: {e}", argv[0].to_string_lossy())))?;
        targets[0].pid = paused.pid;
        child = Some(paused);
    }
    Ok(Prepared {
        config,
        targets,
        child,
    })
}

/// Why recording stopped.
#[derive(Debug)]
enum Stop {
    Duration,
    Signal(&'static str),
    TargetsExited,
}

/// Attaches, records and writes the profile.
pub async fn run(prepared: Prepared) -> anyhow::Result<()> {
    let Prepared {
        config,
        targets,
        child,
    } = prepared;
    let kernel = KernelConfig {
        interval: config.interval,
        log: config.verbose,
        track_frees: (!config.alloc_only).then_some(config.max_tracked),
        sessions: config.sessions,
    };
    let mut probes = attach::attach(kernel, &targets).context("attaching probes")?;
    for point in &probes.points {
        let how = if point.placement.emulated {
            "emulated"
        } else {
            "single-stepped"
        };
        debug!(
            "probe: pid {} {}+{:#x} in {}: `{}` ({how})",
            point.pid,
            point.probe,
            point.placement.offset,
            point.path.display(),
            point.placement.instruction,
        );
    }
    debug!("allocation returns observed by: {:?}", probes.returns);
    let mut ebpf_logger = if config.verbose {
        aya_log::EbpfLogger::init(&mut probes.ebpf)
            .map_err(|e| log::warn!("eBPF log unavailable: {e}"))
            .ok()
    } else {
        None
    };
    let ring = RingBuf::try_from(
        probes
            .ebpf
            .take_map("SAMPLES")
            .context("SAMPLES map missing")?,
    )?;
    let mut reader = SampleReader::new(ring)?;
    let spawned_pid = child.as_ref().map(|c| c.pid);
    if let Some(child) = child {
        child
            .release()
            .map_err(|e| BadInput(format!("cannot run {}: {e}", config_command(&config))))?;
    }
    let mut recorder = Recorder::default();
    let pids: Vec<u32> = targets.iter().map(|t| t.pid).collect();
    for &pid in &pids {
        recorder.track(pid);
    }
    let symbolizer = Symbolizer::spawn().context("starting the symbolizer thread")?;
    let mut exited = exits::watch(&pids).context("watching target processes")?;
    let mut live = pids.len();
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let started = Instant::now();
    let deadline = tokio::time::sleep(config.duration.unwrap_or(Duration::MAX / 4));
    tokio::pin!(deadline);
    let mut refresh = tokio::time::interval(Duration::from_millis(250));
    let every = match config.output {
        Output::Snapshots { every, .. } => Some(every),
        Output::File(_) => None,
    };
    let mut snapshot_timer = tokio::time::interval_at(
        tokio::time::Instant::now() + every.unwrap_or(Duration::MAX / 4),
        every.unwrap_or(Duration::MAX / 4),
    );
    let mut period_started = Instant::now();
    eprintln!(
        "allocscope: recording pid {} (Ctrl-C to stop)",
        pids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut batch = Vec::new();
    let stop = loop {
        tokio::select! {
            read = reader.read(&mut batch) => {
                read?;
                recorder.add_all(batch.drain(..));
            }
            _ = refresh.tick() => {
                // Keep the maps snapshot current while targets live (libraries loaded
                // late, a spawned command just past exec), and flush eBPF log records.
                recorder.refresh();
                if let Some(logger) = ebpf_logger.as_mut() {
                    logger.flush();
                }
            }
            _ = snapshot_timer.tick(), if every.is_some() => {
                reader.drain(&mut batch);
                recorder.add_all(batch.drain(..));
                let (counters, losses) = read_counters(&probes, &pids)?;
                let now = Instant::now();
                let settings = settings(&config, now - started);
                let period = Some((now - period_started).as_secs_f64());
                let profile = recorder
                    .profile(&symbolizer, settings, &counters, losses, period, monotonic_ns())
                    .await;
                write_output(&config, &profile)?;
                recorder.start_period();
                period_started = Instant::now();
            }
            _ = sigint.recv() => break Stop::Signal("SIGINT"),
            _ = sigterm.recv() => break Stop::Signal("SIGTERM"),
            _ = &mut deadline, if config.duration.is_some() => break Stop::Duration,
            Some(pid) = exited.recv() => {
                recorder.mark_exited(pid);
                live -= 1;
                if live == 0 {
                    break Stop::TargetsExited;
                }
            }
        }
    };
    // The recording ends now; detaching below takes a while (the kernel removes each
    // breakpoint) and is not part of it.
    let stopped = Instant::now();
    let stopped_ns = monotonic_ns();
    match stop {
        Stop::Signal(name) => info!("stopping on {name}"),
        Stop::Duration => info!("stopping: duration reached"),
        Stop::TargetsExited => info!("stopping: every target exited"),
    }
    reader.drain(&mut batch);
    recorder.add_all(batch.drain(..));
    let (counters, losses) = read_counters(&probes, &pids)?;
    if let Some(logger) = ebpf_logger.as_mut() {
        logger.flush();
    }
    drop(ebpf_logger);
    // Detach before the slow part: the targets stop paying for probes now.
    drop(probes);
    if let Some(pid) = spawned_pid {
        if let Stop::Signal(_) = stop {
            // The command was started for this recording: stopping it stops the command,
            // as with `perf record -- CMD`.
            // SAFETY: kill(2) with our own child's pid.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        }
        if let Some(status) = exits::reap(pid) {
            info!("command {status}");
        }
    }
    if reader.malformed > 0 {
        log::warn!("{} malformed ring-buffer records ignored", reader.malformed);
    }
    let period = every.map(|_| (stopped - period_started).as_secs_f64());
    let profile = recorder
        .profile(
            &symbolizer,
            settings(&config, stopped - started),
            &counters,
            losses,
            period,
            stopped_ns,
        )
        .await;
    let written = write_output(&config, &profile)?;
    eprint!("{}", summary::render(&profile, 10));
    eprintln!("wrote {} ({})", written.display(), config.format.name());
    Ok(())
}

fn settings(config: &RecordConfig, recorded: Duration) -> Settings {
    Settings {
        interval: config.interval,
        confidence: config.confidence,
        duration_seconds: recorded.as_secs_f64(),
        alloc_only: config.alloc_only,
        leaks_older_than: config.leaks_older_than,
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`, so ages of sampled
/// blocks can be computed from their kernel timestamps.
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

fn read_counters(
    probes: &Probes,
    pids: &[u32],
) -> anyhow::Result<(BTreeMap<u32, ProcessCounters>, Losses)> {
    let counters = {
        let map = probes
            .ebpf
            .map("COUNTERS")
            .context("COUNTERS map missing")?;
        collect::read_counters(&PerCpuArray::try_from(map)?, pids)?
    };
    let losses = {
        let map = probes.ebpf.map("LOSSES").context("LOSSES map missing")?;
        collect::read_losses(&PerCpuArray::try_from(map)?)?
    };
    Ok((counters, losses))
}

/// Writes the profile where the configuration says; returns the file written.
fn write_output(config: &RecordConfig, profile: &Profile) -> anyhow::Result<PathBuf> {
    let value = config.value.unwrap_or_else(|| Value::default_for(profile));
    let path = match &config.output {
        Output::File(path) => path.clone(),
        Output::Snapshots { dir, .. } => dir.join(snapshot_name(SystemTime::now(), config.format)),
    };
    export::write_file(profile, config.format, value, &path)
        .with_context(|| format!("writing {}", path.display()))?;
    if let Output::Snapshots {
        dir,
        keep: Some(keep),
        ..
    } = &config.output
    {
        prune_snapshots(dir, config.format, *keep)
            .with_context(|| format!("removing old snapshots from {}", dir.display()))?;
    }
    info!("wrote {}", path.display());
    Ok(path)
}

const SNAPSHOT_PREFIX: &str = "allocscope-";

/// `allocscope-2026-11-22T02-41-34.123Z.json`: UTC, sortable, no `:` (awkward in shells and
/// on other file systems).
pub fn snapshot_name(time: SystemTime, format: export::Format) -> String {
    let stamp = humantime::format_rfc3339_millis(time)
        .to_string()
        .replace(':', "-");
    format!("{SNAPSHOT_PREFIX}{stamp}.{}", format.extension())
}

/// Deletes the oldest snapshot files of `format` in `dir` beyond `keep`.
fn prune_snapshots(dir: &Path, format: export::Format, keep: usize) -> std::io::Result<()> {
    let suffix = format!(".{}", format.extension());
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(SNAPSHOT_PREFIX) && name.ends_with(&suffix))
        .collect();
    names.sort();
    let excess = names.len().saturating_sub(keep);
    for name in &names[..excess] {
        std::fs::remove_file(dir.join(name))?;
    }
    Ok(())
}

fn config_command(config: &RecordConfig) -> String {
    match &config.targets {
        Targets::Command(argv) => argv[0].to_string_lossy().into_owned(),
        Targets::Pids(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_sort_by_time() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_000_000_123);
        let name = snapshot_name(t, export::Format::Pprof);
        assert_eq!(name, "allocscope-2026-11-18T11-06-40.123Z.pb.gz");
        let later = snapshot_name(t + Duration::from_millis(1), export::Format::Pprof);
        assert!(later > name);
    }
}
