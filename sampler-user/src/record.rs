//! `allocscope record`: preflight → attach → collect until stopped → export.
//!
//! Stopping (duration, SIGINT, SIGTERM, every target gone) always goes through the same
//! path: drain the ring buffer, read the exact counters, detach, symbolize, write the file
//! atomically, print the summary. Nothing recorded is dropped on the way out.

use std::{
    io::Write as _,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::maps::{PerCpuArray, RingBuf};
use log::{debug, info};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    collect::{self, SampleReader},
    config::{BadInput, RecordConfig, Targets},
    exits, export, preflight,
    probe::attach::{self, KernelConfig, Target},
    profile::{Recorder, Settings},
    spawn::{self, PausedChild},
    stacks::symbolize::Symbolizer,
    summary,
};

/// Everything prepared before the runtime starts: validated targets and the output file.
pub struct Prepared {
    config: RecordConfig,
    targets: Vec<Target>,
    child: Option<PausedChild>,
    output: (std::fs::File, PathBuf),
}

/// Runs every check that can fail on bad input, then (for `-- CMD`) forks the paused
/// child. Must run before any thread exists.
pub fn prepare(config: RecordConfig) -> Result<Prepared, BadInput> {
    preflight::check_privileges()?;
    let mut child = None;
    let targets = match &config.targets {
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
    let output = preflight::open_output(&config.output)?;
    if let Targets::Command(argv) = &config.targets {
        let paused = spawn::spawn_paused(argv)
            .map_err(|e| BadInput(format!("cannot start {}: {e}", argv[0].to_string_lossy())))?;
        child = Some(paused);
    }
    let mut targets = targets;
    if let Some(child) = &child {
        targets[0].pid = child.pid;
    }
    Ok(Prepared {
        config,
        targets,
        child,
        output,
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
        output,
    } = prepared;
    let (temp_file, temp_path) = output;
    let result = record(&config, &targets, child, temp_file, &temp_path).await;
    if result.is_err() {
        let _ = std::fs::remove_file(&temp_path);
    }
    result
}

async fn record(
    config: &RecordConfig,
    targets: &[Target],
    child: Option<PausedChild>,
    mut temp_file: std::fs::File,
    temp_path: &std::path::Path,
) -> anyhow::Result<()> {
    let kernel = KernelConfig {
        interval: config.interval,
        log: config.verbose,
    };
    let mut probes = attach::attach(kernel, targets).context("attaching probes")?;
    for point in &probes.points {
        debug!(
            "probe: pid {} {} in {} (entry)",
            point.pid,
            point.function.symbol(),
            point.path.display()
        );
    }
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
            .map_err(|e| BadInput(format!("cannot run {}: {e}", config_command(config))))?;
    }
    let mut recorder = Recorder::default();
    let pids: Vec<u32> = targets.iter().map(|t| t.pid).collect();
    for &pid in &pids {
        recorder.track(pid);
    }
    let mut exited = exits::watch(&pids).context("watching target processes")?;
    let mut live = pids.len();
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let started = Instant::now();
    let deadline = tokio::time::sleep(config.duration.unwrap_or(Duration::MAX / 4));
    tokio::pin!(deadline);
    let mut refresh = tokio::time::interval(Duration::from_millis(250));
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
                for sample in batch.drain(..) {
                    recorder.add(&sample);
                }
            }
            _ = refresh.tick() => {
                // Keep the maps snapshot current while targets live (libraries loaded
                // late, a spawned command just past exec), and flush eBPF log records.
                recorder.refresh_maps();
                if let Some(logger) = ebpf_logger.as_mut() {
                    logger.flush();
                }
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
    let duration = started.elapsed();
    match stop {
        Stop::Signal(name) => info!("stopping on {name}"),
        Stop::Duration => info!("stopping: duration reached"),
        Stop::TargetsExited => info!("stopping: every target exited"),
    }
    reader.drain(&mut batch);
    for sample in batch.drain(..) {
        recorder.add(&sample);
    }
    let counters = {
        let map = probes
            .ebpf
            .map("COUNTERS")
            .context("COUNTERS map missing")?;
        collect::read_counters(&PerCpuArray::try_from(map)?, &pids)?
    };
    let losses = {
        let map = probes.ebpf.map("LOSSES").context("LOSSES map missing")?;
        collect::read_losses(&PerCpuArray::try_from(map)?)?
    };
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
    let symbolizer = Symbolizer::spawn().context("starting the symbolizer thread")?;
    let settings = Settings {
        interval: config.interval,
        confidence: config.confidence,
        duration_seconds: duration.as_secs_f64(),
        alloc_only: config.alloc_only,
    };
    let profile = recorder
        .finish(&symbolizer, settings, &counters, losses)
        .await;
    export::write(&profile, config.format, &mut temp_file)
        .and_then(|()| temp_file.flush())
        .and_then(|()| temp_file.sync_all())
        .with_context(|| format!("writing {}", temp_path.display()))?;
    std::fs::rename(temp_path, &config.output).with_context(|| {
        format!(
            "renaming {} to {}",
            temp_path.display(),
            config.output.display()
        )
    })?;
    eprint!("{}", summary::render(&profile, 10));
    eprintln!(
        "wrote {} ({})",
        config.output.display(),
        config.format.name()
    );
    Ok(())
}

fn config_command(config: &RecordConfig) -> String {
    match &config.targets {
        Targets::Command(argv) => argv[0].to_string_lossy().into_owned(),
        Targets::Pids(_) => String::new(),
    }
}
