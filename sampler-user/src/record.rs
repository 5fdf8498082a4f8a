//! `allocscope record`: preflight → attach → collect until stopped → export.
//!
//! Stopping (duration, SIGINT, SIGTERM, every target gone) always goes through the same
//! path: drain the ring buffer, read the exact counters, detach, symbolize, write the file
//! atomically, print the summary. Nothing recorded is dropped on the way out. With
//! `--every`, a snapshot is written each period while recording, and the last, partial
//! period when it stops.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use log::info;
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    config::{BadInput, Output, RecordConfig},
    export::{self, Value},
    preflight,
    profile::Profile,
    recording::{self, monotonic_ns, Happening, Prepared, Recording},
    summary,
};

/// Runs every check that can fail on bad input, then (for `-- CMD`) forks the paused
/// child. Must run before any thread exists.
pub fn prepare(config: &RecordConfig) -> Result<Prepared, BadInput> {
    recording::prepare(
        &config.targets,
        || preflight::check_output(&config.output),
        || Ok(None),
    )
}

/// Why recording stopped.
#[derive(Debug)]
enum Stop {
    Duration,
    Signal(&'static str),
    TargetsExited,
}

/// Attaches, records and writes the profile.
pub async fn run(config: RecordConfig, prepared: Prepared) -> anyhow::Result<()> {
    let mut recording = Recording::start(prepared, &config.sampling, None)?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let started = Instant::now();
    let deadline = tokio::time::sleep(config.duration.unwrap_or(Duration::MAX / 4));
    tokio::pin!(deadline);
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
        "allocscope: recording {} (Ctrl-C to stop)",
        recording.describe()
    );
    let stop = loop {
        tokio::select! {
            happened = recording.next() => {
                if happened? == Happening::AllExited {
                    break Stop::TargetsExited;
                }
            }
            _ = snapshot_timer.tick(), if every.is_some() => {
                let (counters, losses) = recording.counters()?;
                let now = Instant::now();
                let settings = config.sampling.settings(now - started, config.leaks_older_than);
                let period = Some((now - period_started).as_secs_f64());
                let mut profile = recording
                    .recorder
                    .profile(&recording.symbolizer, settings, &counters, losses, period, monotonic_ns())
                    .await;
                profile.probes = recording.probe_points();
                profile.thread_states = recording.thread_states();
                write_output(&config, &profile)?;
                recording.recorder.start_period();
                period_started = Instant::now();
            }
            _ = sigint.recv() => break Stop::Signal("SIGINT"),
            _ = sigterm.recv() => break Stop::Signal("SIGTERM"),
            _ = &mut deadline, if config.duration.is_some() => break Stop::Duration,
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
    // Detach before the slow part: the targets stop paying for probes now. A command
    // started for this recording stops with it when the user stopped it.
    recording.detach(matches!(stop, Stop::Signal(_)))?;
    let (counters, losses) = recording.counters()?;
    let period = every.map(|_| (stopped - period_started).as_secs_f64());
    let mut profile = recording
        .recorder
        .profile(
            &recording.symbolizer,
            config
                .sampling
                .settings(stopped - started, config.leaks_older_than),
            &counters,
            losses,
            period,
            stopped_ns,
        )
        .await;
    profile.probes = recording.probe_points();
    profile.thread_states = recording.thread_states();
    let written = write_output(&config, &profile)?;
    eprint!("{}", summary::render(&profile, 10));
    eprintln!("wrote {} ({})", written.display(), config.format.name());
    Ok(())
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
