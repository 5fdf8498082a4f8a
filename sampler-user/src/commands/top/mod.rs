//! `allocscope top`: a live, top-style view of a recording.
//!
//! Three parts kept apart: [`model`] turns the recording's sample sets into rows (pure),
//! [`app`] holds the view's state and handles keys (pure), [`ui`] draws it (pure over a
//! ratatui frame). This module wires them: the tokio thread takes samples and, once a
//! second, builds a [`model::Picture`] it hands to the [`screen`] thread, which owns the
//! terminal. Quitting, SIGTERM and SIGINT restore the terminal and detach every probe;
//! a target that exits leaves its last picture on screen.

pub mod app;
pub mod columns;
mod config;
pub mod model;
pub mod screen;
pub mod ui;
pub mod values;

pub use config::TopConfig;

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    io::IsTerminal as _,
    sync::{mpsc::TrySendError, Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use sampler_common::ProcessCounters;
use tokio::signal::unix::{signal, SignalKind};

use self::{
    model::{CounterHistory, HistoryPoint, Picture, ProbeCost, TargetState, Totals, ViewSettings},
    screen::{FromScreen, ToScreen},
};
use crate::{
    config::BadInput,
    cost,
    export::{self, Value},
    outfile, output_check,
    profile::Tally,
    recording::{self, Prepared, Recording, TargetExit},
    spawn,
};

/// Seconds of history the sparklines show.
const HISTORY_SECONDS: usize = 60;

/// Refuses without a terminal, then runs the checks every recording runs (and, for
/// `-- CMD`, forks the paused child). Must run before any other thread than `main` exists.
pub fn prepare(config: &TopConfig) -> Result<Prepared, BadInput> {
    if !(std::io::stdout().is_terminal() && std::io::stdin().is_terminal()) {
        return Err(BadInput(
            "allocscope top needs a terminal (stdin and stdout must be a TTY); to profile \
             without one, use `allocscope record ... -o FILE` (or `--every` for snapshots)"
                .into(),
        ));
    }
    if std::env::var("TERM").is_ok_and(|term| term == "dumb") {
        return Err(BadInput(
            "allocscope top draws a full-screen view, which TERM=dumb cannot show; use \
             `allocscope record ... -o FILE` (or set TERM to your terminal's type)"
                .into(),
        ));
    }
    recording::prepare(
        &config.targets,
        &config.sampling,
        || {
            output_check::check_snapshot_dir(&config.snapshot_dir)?;
            config
                .output
                .as_deref()
                .map_or(Ok(()), output_check::check_output_file)
        },
        || command_output(config).map(Some),
    )
}

/// A command started under the view must neither draw on the screen nor read the keys: its
/// stdin is /dev/null and its output goes to [`COMMAND_LOG`] in the snapshot directory.
fn command_output(config: &TopConfig) -> Result<spawn::Redirect, BadInput> {
    let path = config.snapshot_dir.join(COMMAND_LOG);
    let output = outfile::open_log(&path)
        .map_err(|e| BadInput(format!("cannot create {}: {e}", path.display())))?;
    let stdin = std::fs::File::open("/dev/null")
        .map_err(|e| BadInput(format!("cannot open /dev/null: {e}")))?;
    Ok(spawn::Redirect {
        stdin: stdin.into(),
        output: output.into(),
    })
}

/// Where the output of `top -- CMD` goes (in the `-o` directory).
pub const COMMAND_LOG: &str = "allocscope-command.log";

/// Log records while the screen is up: kept in memory, the latest shown in the status line,
/// all of them printed once the terminal is restored.
#[derive(Clone, Debug, Default)]
pub struct LogBuffer(Arc<Mutex<LogState>>);

#[derive(Debug, Default)]
struct LogState {
    partial: Vec<u8>,
    lines: Vec<String>,
    unseen: Option<String>,
}

impl LogBuffer {
    /// The latest line not shown yet.
    pub fn unseen(&self) -> Option<String> {
        self.0.lock().ok()?.unseen.take()
    }

    /// Every line so far, newline-terminated, emptying the buffer.
    pub fn take_all(&self) -> String {
        let Ok(mut state) = self.0.lock() else {
            return String::new();
        };
        let mut text: String = state.lines.drain(..).map(|l| l + "\n").collect();
        if !state.partial.is_empty() {
            text.push_str(&String::from_utf8_lossy(&state.partial));
            text.push('\n');
            state.partial.clear();
        }
        text
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let Ok(mut state) = self.0.lock() else {
            return Ok(buf.len());
        };
        state.partial.extend_from_slice(buf);
        while let Some(end) = state.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = state.partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line).trim_end().to_owned();
            state.unseen = Some(line.clone());
            state.lines.push(line);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the loop keeps between pictures.
struct Watch {
    config: TopConfig,
    started: Instant,
    counters: CounterHistory,
    history: VecDeque<HistoryPoint>,
    exited: BTreeSet<u32>,
    finished: bool,
    /// The last picture's readings: the probes' cost is measured between pictures.
    last_cost: Option<CostReading>,
}

/// What the probes' cost between two pictures is measured from: the time (seconds since
/// start), and per target its calls and CPU seconds.
type CostReading = (f64, BTreeMap<u32, (u64, Option<f64>)>);

/// The screen thread's result, once it has given the terminal back; `None` if it has not
/// within a second. Its terminal gone (a killed tmux pane, a dropped ssh session: SIGHUP),
/// crossterm's reader gets end-of-file forever and never returns, and waiting for the
/// thread kept `top` spinning on a core, attached, long after (seen: an hour).
async fn screen_ended(
    screen: std::thread::JoinHandle<std::io::Result<()>>,
) -> Option<std::thread::Result<std::io::Result<()>>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while !screen.is_finished() {
        if std::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Some(screen.join())
}

/// Attaches, shows the view until the user quits (or SIGTERM/SIGINT), detaches.
pub async fn run(config: TopConfig, prepared: Prepared, log: LogBuffer) -> anyhow::Result<()> {
    let mut recording = Recording::start(prepared, &config.sampling, Some(config.window))?;
    let mut watch = Watch::new(config);
    let (to_screen, incoming) = std::sync::mpsc::sync_channel::<ToScreen>(4);
    let (outgoing, mut from_screen) = tokio::sync::mpsc::unbounded_channel();
    let screen = screen::spawn(incoming, outgoing, log).context("starting the screen thread")?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    // The terminal went away: nobody sees the view any more.
    let mut sighup = signal(SignalKind::hangup())?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let send = |message: ToScreen| match to_screen.try_send(message) {
        // A busy screen skips a picture; the next one carries everything.
        Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
    };
    if let Some(status) = watch.command_output() {
        send(ToScreen::Status(status));
    }
    let outcome: anyhow::Result<()> = loop {
        tokio::select! {
            happened = recording.next(), if !watch.finished => {
                match happened {
                    Ok(TargetExit::One(pid)) => {
                        watch.exited.insert(pid);
                    }
                    Ok(TargetExit::All) => match watch.all_exited(&mut recording).await {
                        Ok(picture) => {
                            send(ToScreen::Picture(Box::new(picture)));
                            send(ToScreen::Status(
                                "every target exited: the last numbers stay on screen; q quits"
                                    .into(),
                            ));
                        }
                        Err(e) => break Err(e),
                    },
                    Err(e) => break Err(e),
                }
            }
            _ = tick.tick(), if !watch.finished => {
                match watch.picture(&mut recording).await {
                    Ok(picture) => send(ToScreen::Picture(Box::new(picture))),
                    Err(e) => break Err(e),
                }
            }
            command = from_screen.recv() => match command {
                Some(FromScreen::WriteSnapshot) => {
                    let message = match watch.write_snapshot(&mut recording).await {
                        Ok(path) => format!("wrote {}", path.display()),
                        Err(e) => format!("snapshot failed: {e:#}"),
                    };
                    send(ToScreen::Status(message));
                }
                Some(FromScreen::Quit) | None => break Ok(()),
            },
            _ = sigint.recv() => break Ok(()),
            _ = sigterm.recv() => break Ok(()),
            _ = sighup.recv() => break Ok(()),
        }
    };
    // Give the terminal back first (the screen thread sees the channel close within
    // 100 ms).
    drop(to_screen);
    finish(recording, &mut watch, outcome, screen).await
}

/// After the view: writes the recording (`-o FILE`), then detaches (a command started for
/// the view stops with it) and says so; `outcome` is the view's own, reported first.
async fn finish(
    mut recording: Recording,
    watch: &mut Watch,
    outcome: anyhow::Result<()>,
    screen: std::thread::JoinHandle<std::io::Result<()>>,
) -> anyhow::Result<()> {
    let screen = screen_ended(screen).await;
    // Written whatever ended the view: what was recorded is not lost to a failure.
    let written = watch.write_output(&mut recording).await;
    let detached = recording.detach().await;
    crate::say!(
        "allocscope top: detached from {} after {}",
        crate::text::pid_list(recording.pids()),
        humantime::format_duration(Duration::from_secs(watch.started.elapsed().as_secs()))
    );
    match screen {
        Some(Ok(Ok(()))) => {}
        Some(Ok(Err(e))) => return Err(anyhow::Error::from(e).context("terminal")),
        Some(Err(_)) => anyhow::bail!("the screen thread panicked"),
        // Left behind; it ends with the process.
        None => log::debug!("the screen thread did not end: its terminal is gone"),
    }
    outcome?;
    written?;
    detached.map(drop)
}

impl Watch {
    fn new(config: TopConfig) -> Watch {
        Watch {
            last_cost: None,
            config,
            started: Instant::now(),
            counters: CounterHistory::default(),
            history: VecDeque::new(),
            exited: BTreeSet::new(),
            finished: false,
        }
    }

    /// Where a command's output goes (`top -- CMD`), said on the status line.
    fn command_output(&self) -> Option<String> {
        let program = self.config.targets.command.first()?;
        Some(format!(
            "{}'s output goes to {}",
            program.to_string_lossy(),
            self.config.snapshot_dir.join(COMMAND_LOG).display()
        ))
    }

    /// Every target exited: the probes go, and the last picture is taken.
    async fn all_exited(&mut self, recording: &mut Recording) -> anyhow::Result<Picture> {
        self.exited.extend(recording.pids().iter().copied());
        drop(recording.detach().await?);
        self.finished = true;
        self.picture(recording).await
    }

    /// The recording now.
    async fn picture(&mut self, recording: &mut Recording) -> anyhow::Result<Picture> {
        let (counters, losses) = recording.counters().await?;
        let elapsed = self.started.elapsed().as_secs_f64();
        let tally = recording.tally(Some(self.config.leaks_older_than)).await;
        // A Go runtime's own totals (read with the counters) are its exact counts: its
        // allocations are not calls the counters see (a cgo program's malloc calls are).
        let go = tally.processes.iter().filter_map(|p| p.go_totals.as_ref());
        let (go_calls, go_bytes) = go.fold((0, 0), |(c, b), (t, _)| (c + t.calls, b + t.bytes));
        let calls: u64 = counters.values().map(|c| c.calls).sum::<u64>() + go_calls;
        let bytes: u64 = counters.values().map(|c| c.bytes).sum::<u64>() + go_bytes;
        let samples: u64 = tally.stacks.iter().map(|s| s.all.samples()).sum();
        let window = self.config.window.as_secs_f64();
        self.counters
            .push(elapsed, calls, bytes, samples, window.max(2.0) + 2.0);
        let (calls_per_second, bytes_per_second, samples_per_second) = self.counters.rates(window);
        let settings = ViewSettings {
            interval: recording
                .largest_interval()
                .max(self.config.sampling.interval),
            confidence: self.config.sampling.confidence,
            alloc_only: self.config.sampling.alloc_only,
            leak_age_seconds: self.config.leaks_older_than.as_secs_f64(),
            window_seconds: window,
            from_start: self.config.targets.pids.is_empty()
                && !self.config.targets.command.is_empty(),
        };
        let targets = tally
            .processes
            .iter()
            .map(|p| TargetState {
                pid: p.pid,
                command: crate::text::printable(&p.command).into_owned(),
                exited: self.exited.contains(&p.pid),
            })
            .collect();
        let mut picture = Picture {
            elapsed_seconds: elapsed,
            settings,
            targets,
            totals: Totals {
                calls_per_second,
                bytes_per_second,
                samples_per_second,
                lost: losses.total(),
                cost: self.cost(recording, elapsed, &counters, &tally),
            },
            tally,
            history: Vec::new(),
            finished: self.finished,
        };
        if !self.finished {
            self.history.push_back(HistoryPoint {
                bytes_per_second: self.counters.last_bytes_per_second(),
                live_bytes: model::live_heap(&picture).map_or(0.0, |e| e.estimate),
            });
            while self.history.len() > HISTORY_SECONDS {
                self.history.pop_front();
            }
        }
        picture.history = self.history.iter().copied().collect();
        Ok(picture)
    }

    /// The probes' cost since the last picture: the calls the targets made times the cost
    /// per call the statistics windows measured, against the CPU time they used.
    fn cost(
        &mut self,
        recording: &Recording,
        elapsed: f64,
        counters: &BTreeMap<u32, ProcessCounters>,
        tally: &Tally,
    ) -> ProbeCost {
        let now: BTreeMap<u32, (u64, Option<f64>)> = tally
            .processes
            .iter()
            .map(|p| {
                let calls = counters.get(&p.pid).map_or(0, |c| c.calls);
                (p.pid, (calls, p.cpu_seconds))
            })
            .collect();
        let last = self.last_cost.replace((elapsed, now.clone()));
        let ns_per_call = recording.ns_per_call();
        let Some((then, before)) = last else {
            return ProbeCost {
                ns_per_call,
                ..ProbeCost::default()
            };
        };
        let (mut added, mut cpu, mut added_where_known) = (0.0, 0.0, 0.0);
        for (pid, &(calls, cpu_now)) in &now {
            let (calls_then, cpu_then) = before.get(pid).copied().unwrap_or((0, None));
            let this = calls.saturating_sub(calls_then) as f64 * ns_per_call / 1e9;
            added += this;
            if let Some(cpu_now) = cpu_now {
                cpu += cpu_now - cpu_then.unwrap_or(0.0);
                added_where_known += this;
            }
        }
        let seconds = (elapsed - then).max(1e-3);
        ProbeCost {
            cores: added / seconds,
            share: cost::share(added_where_known, cpu),
            ns_per_call,
        }
    }

    /// Writes the recording to `-o FILE`, if given, and says so.
    async fn write_output(&mut self, recording: &mut Recording) -> anyhow::Result<()> {
        let Some(file) = self.config.output.clone() else {
            return Ok(());
        };
        let settings = self
            .config
            .sampling
            .settings(self.started.elapsed(), Some(self.config.leaks_older_than));
        let profile = recording.profile(settings, None).await?;
        let value = Value::default_for(&profile);
        export::write_file(&profile, self.config.format, value, &file)
            .with_context(|| format!("writing {}", file.display()))?;
        crate::say!(
            "allocscope top: wrote {} ({})",
            file.display(),
            self.config.format.name()
        );
        Ok(())
    }

    /// Writes the recording so far into the snapshot directory.
    async fn write_snapshot(
        &mut self,
        recording: &mut Recording,
    ) -> anyhow::Result<std::path::PathBuf> {
        let settings = self
            .config
            .sampling
            .settings(self.started.elapsed(), Some(self.config.leaks_older_than));
        let profile = recording.profile(settings, None).await?;
        let dir = &self.config.snapshot_dir;
        export::write_snapshot(
            &profile,
            self.config.format,
            Value::default_for(&profile),
            dir,
            SystemTime::now(),
        )
        .with_context(|| format!("writing a snapshot into {}", dir.display()))
    }
}
