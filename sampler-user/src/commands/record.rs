//! `allocscope record`: preflight → attach → collect until stopped → export.
//!
//! Stopping (duration, SIGINT, SIGTERM, SIGHUP, every target gone) always goes through the same
//! path: drain the ring buffer, read the exact counters, detach, symbolize, write the file
//! atomically, print the summary. Nothing recorded is dropped on the way out. With
//! `--every`, a snapshot is written each period while recording, and the last, partial
//! period when it stops.

use std::{
    collections::VecDeque,
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use log::info;
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    config::{BadInput, Output, RecordConfig},
    export::{self, Value},
    output_check,
    profile::Profile,
    recording::{self, CommandExit, Prepared, Recording, TargetExit},
    summary,
};

/// Runs every check that can fail on bad input, then (for `-- CMD`) forks the paused
/// child. Must run before any other thread than `main` exists.
pub fn prepare(config: &RecordConfig) -> Result<Prepared, BadInput> {
    recording::prepare(
        &config.targets,
        &config.sampling,
        || output_check::check_output(&config.output),
        || Ok(None),
    )
}

/// Why recording stopped.
#[derive(Debug)]
enum Stop {
    Duration,
    Signal(&'static str),
    TargetsExited,
    /// Something failed after attaching (reading the ring buffer, a snapshot's write, a
    /// target's finalizing): the profile of what was gathered is still written, then the
    /// error said.
    Failed(anyhow::Error),
}

impl Stop {
    /// Says why the recording stopped; returns the error if something failed.
    fn said(self) -> Option<anyhow::Error> {
        match self {
            Stop::Signal(name) => info!("stopping on {name}"),
            Stop::Duration => info!("stopping: duration reached"),
            Stop::TargetsExited => info!("stopping: every target exited"),
            Stop::Failed(e) => {
                log::error!("stopping early: {e:#}; writing what was recorded until now");
                return Some(e);
            }
        }
        None
    }
}

/// Attaches, records and writes the profile. Returns the exit code to pass on: that of a
/// command (`-- CMD`) that ended on its own, as `time` and `perf record` do; else 0.
pub async fn run(config: RecordConfig, prepared: Prepared) -> anyhow::Result<u8> {
    let mut recording = Recording::start(prepared, &config.sampling, None)?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let started = recording.began();
    let deadline = tokio::time::sleep(config.duration.unwrap_or(Duration::MAX / 4));
    tokio::pin!(deadline);
    let every = match config.output {
        Output::Snapshots { every, .. } => Some(every),
        Output::File(_) => None,
    };
    let mut snapshot_timer = ticks(every);
    let mut period_started = Instant::now();
    let mut writer = Writer {
        config: &config,
        written: VecDeque::new(),
    };
    crate::say!(
        "allocscope: recording {} (Ctrl-C to stop)",
        recording.describe()
    );
    let stop = loop {
        // Received while the probes were attached, before tokio's handlers were set.
        if let Some(name) = crate::interrupted::received() {
            break Stop::Signal(name);
        }
        tokio::select! {
            happened = recording.next() => match happened {
                Ok(TargetExit::All) => break Stop::TargetsExited,
                Ok(TargetExit::One(_)) => {}
                Err(e) => break Stop::Failed(e),
            },
            _ = snapshot_timer.tick(), if every.is_some() => {
                if let Err(e) = writer.snapshot(&mut recording, started, period_started).await {
                    break Stop::Failed(e.context("writing a snapshot"));
                }
                period_started = Instant::now();
            }
            _ = sigint.recv() => break Stop::Signal("SIGINT"),
            _ = sigterm.recv() => break Stop::Signal("SIGTERM"),
            _ = sighup.recv() => break Stop::Signal("SIGHUP"),
            _ = &mut deadline, if config.duration.is_some() => break Stop::Duration,
        }
    };
    // The recording ends now (or ended when its command exited, if that was while the
    // probes were being attached); detaching below takes a while (the kernel removes each
    // breakpoint) and is not part of it.
    let stopped = match stop {
        Stop::TargetsExited => recording.ended_early().unwrap_or_else(Instant::now),
        _ => Instant::now(),
    };
    // A command that ran to its end, every process of it from its start: one run's counts.
    let ended_on_its_own = matches!(stop, Stop::TargetsExited);
    let failure = stop.said();
    // Detach before the slow part: the targets stop paying for probes now. A command
    // started for this recording stops with it.
    let _closing = recording.detach().await?;
    let period = every.map(|_| (stopped - period_started).as_secs_f64());
    let settings = config
        .sampling
        .settings(stopped - started, config.leaks_older_than);
    log::debug!("detached in {:?}", stopped.elapsed());
    let mut profile = recording.profile(settings, period).await?;
    profile.whole_run = ended_on_its_own && recording.command_ended_on_its_own();
    log::debug!("profile built and symbolized in {:?}", stopped.elapsed());
    let written = writer.write(&profile)?;
    log::debug!("profile written in {:?}", stopped.elapsed());
    crate::say_raw!("{}", summary::render(&profile, 10, config.sampling.verbose));
    crate::say!("wrote {} ({})", written.display(), config.format.name());
    if let Some(e) = failure {
        return Err(e.context(
            "the recording stopped early (the profile written holds what was gathered until then)",
        ));
    }
    Ok(match recording.command_exit() {
        Some(CommandExit::OnItsOwn(exit)) => exit.shell_code(),
        _ => 0,
    })
}

/// Ticks every `every` from a tick's time from now (without it, never).
fn ticks(every: Option<Duration>) -> tokio::time::Interval {
    let every = every.unwrap_or(Duration::MAX / 4);
    tokio::time::interval_at(tokio::time::Instant::now() + every, every)
}

/// Where the profile goes: one file, or snapshots of which the newest `keep` are kept.
struct Writer<'a> {
    config: &'a RecordConfig,
    /// Snapshots this recording wrote (their names in the directory), oldest first: `--keep`
    /// deletes only these.
    written: VecDeque<PathBuf>,
}

impl Writer<'_> {
    /// Writes a snapshot of the recording (values since `started`, and over the period
    /// since `period_started`), then starts a new period.
    async fn snapshot(
        &mut self,
        recording: &mut Recording,
        started: Instant,
        period_started: Instant,
    ) -> anyhow::Result<()> {
        let now = Instant::now();
        let config = self.config;
        let settings = config
            .sampling
            .settings(now - started, config.leaks_older_than);
        let period = Some((now - period_started).as_secs_f64());
        let profile = recording.profile(settings, period).await?;
        self.write(&profile)?;
        recording.start_period();
        Ok(())
    }

    /// Writes the profile where the configuration says; returns the file written.
    fn write(&mut self, profile: &Profile) -> anyhow::Result<PathBuf> {
        let config = self.config;
        let value = config.value.unwrap_or_else(|| Value::default_for(profile));
        let path = match &config.output {
            Output::File(path) => {
                if let Some(empty) = value.empty_in(profile, config.format) {
                    log::warn!("{empty}");
                }
                export::write_file(profile, config.format, value, path)
                    .with_context(|| format!("writing {}", path.display()))?;
                path.clone()
            }
            Output::Snapshots { dir, keep, .. } => {
                // Opened again for every snapshot, a component at a time (a symlink another
                // user planted on the way is refused), and written through its descriptor.
                let pinned = crate::outfile::open_directory(dir)
                    .with_context(|| format!("opening the snapshot directory {}", dir.display()))?;
                let through = crate::outfile::through(&pinned);
                let written = export::write_snapshot(
                    profile,
                    config.format,
                    value,
                    &through,
                    SystemTime::now(),
                )
                .with_context(|| format!("writing a snapshot into {}", dir.display()))?;
                let name = written.file_name().unwrap_or_default().to_owned();
                self.written.push_back(name.clone().into());
                while keep.is_some_and(|keep| self.written.len() > keep) {
                    if let Some(old) = self.written.pop_front() {
                        std::fs::remove_file(through.join(&old)).with_context(|| {
                            format!("removing old snapshot {}", dir.join(&old).display())
                        })?;
                    }
                }
                dir.join(name)
            }
        };
        info!("wrote {}", path.display());
        Ok(path)
    }
}
