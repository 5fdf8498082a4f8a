//! `allocscope agent`: record until SIGTERM/SIGINT, closing a period every `--period`; each
//! period's profiles go to the sender thread, and to `--out-dir` files. Stopping closes the
//! last, partial period and gives the sender its flush time before exiting.

use std::{
    path::PathBuf,
    time::{Instant, SystemTime},
};

use anyhow::Context as _;
use log::info;
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    agent::{
        self, config::AgentConfig, period, pyroscope::Identity, sender::Sender, sink::Sink,
        spool::Spool,
    },
    config::{BadInput, SamplingConfig},
    export::{self, Format, Value},
    output_check,
    profile::Profile,
    recording::{self, Prepared, Recording, TargetExit},
};

/// Every check that can fail on bad input (the spool and output directories too), then
/// the fork of a command. Must run before any other thread than `main` exists.
pub fn prepare(config: &AgentConfig) -> Result<Prepared, BadInput> {
    recording::prepare(
        &config.targets,
        &config.sampling,
        || {
            if let Some((dir, _, _)) = &config.out_dir {
                output_check::check_snapshot_dir(dir)?;
            }
            if let Some(dir) = &config.sender.spool_dir {
                for sink in &config.sender.sinks {
                    Spool::on_disk(&dir.join(sink.spool_name()), config.sender.spool_bytes)
                        .map_err(|e| BadInput(format!("invalid --spool-dir: {e:#}")))?;
                }
            }
            if let Some(file) = &config.sender.status_file {
                output_check::check_output_file(file)?;
            }
            Ok(())
        },
        || Ok(None),
    )
}

/// Records and sends until stopped.
pub async fn run(config: AgentConfig, prepared: Prepared) -> anyhow::Result<()> {
    let sinks = config.sender.sinks.clone();
    // Blocks of 256 KiB and more (a period's buffers and tables) get pages of their own,
    // returned when freed. Left to itself, glibc raises this threshold to the largest block
    // freed so far (up to 32 MiB), and later periods' large blocks land in the heap among
    // long-lived ones, where freeing them can leave holes RSS keeps.
    // SAFETY: mallopt sets a parameter of the allocator; any value is valid for this one.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10) };
    let mut recording = Recording::start(prepared, &config.sampling, None)?;
    let sender = Sender::start(config.sender)?;
    let out = Out {
        identity: &config.identity,
        sinks: &sinks,
        sender: &sender,
        dir: config.out_dir.as_ref(),
    };
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let started = Instant::now();
    let mut period = Period::begin();
    crate::say!(
        "allocscope: recording {} as an agent, sending every {} to {}",
        recording.describe(),
        humantime::format_duration(config.period),
        out.destinations()
    );
    let failure = loop {
        tokio::select! {
            happened = recording.next() => match happened {
                Ok(TargetExit::All) => {
                    info!("stopping: every target exited");
                    break None;
                }
                Ok(TargetExit::One(_)) => {}
                Err(e) => break Some(e),
            },
            // A period lasts at least --period from the moment the last one was cut, however
            // long building the last one took (a late tick must not cut a sliver of one).
            _ = tokio::time::sleep_until((period.at + config.period).into()) => {
                period = match period.close(&mut recording, &config.sampling, started, &out).await {
                    Ok(next) => next,
                    Err(e) => break Some(e),
                };
            }
            _ = sigint.recv() => { info!("stopping on SIGINT"); break None; }
            _ = sigterm.recv() => { info!("stopping on SIGTERM"); break None; }
        }
    };
    let _closing = recording.detach().await?;
    let (profile, _) = period
        .profile(&mut recording, &config.sampling, started)
        .await?;
    out.close(&profile, &period)?;
    sender.finish();
    match failure {
        Some(e) => Err(e.context("the agent stopped early (the last period was sent)")),
        None => Ok(()),
    }
}

/// When the current period began.
struct Period {
    at: Instant,
    unix_ns: i64,
}

impl Period {
    fn begin() -> Period {
        let unix_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        Period {
            at: Instant::now(),
            unix_ns,
        }
    }

    /// The period's own profile, and the next period, which begins where this one was cut:
    /// what happens while this one is built and sent is counted in the next, and so is
    /// its time.
    async fn profile(
        &self,
        recording: &mut Recording,
        sampling: &SamplingConfig,
        started: Instant,
    ) -> anyhow::Result<(Profile, Period)> {
        let settings = sampling.settings(started.elapsed(), None);
        let next = Period::begin();
        let seconds = next.at.duration_since(self.at).as_secs_f64();
        let profile = recording.period_profile(settings, seconds).await?;
        Ok((profile, next))
    }

    /// Cuts this period, sends and writes it, forgets the processes gone, and returns the
    /// next period (see [`Period::profile`]).
    async fn close(
        &self,
        recording: &mut Recording,
        sampling: &SamplingConfig,
        started: Instant,
        out: &Out<'_>,
    ) -> anyhow::Result<Period> {
        let cutting = Instant::now();
        let (profile, next) = self.profile(recording, sampling, started).await?;
        // A period that could not be written (a full disk under --out-dir) is said and the
        // agent goes on: the sinks still get it.
        if let Err(e) = out.close(&profile, self) {
            log::warn!("{e:#}");
        }
        // The processes gone by now were in this period's profile for the last time.
        let forgotten = recording.forget_gone();
        if forgotten > 0 {
            info!("forgot {forgotten} processes that exited");
        }
        // Building a profile parses and allocates a lot for a moment; glibc keeps freed
        // memory in its arenas unless told: give it back between periods, so the agent's
        // RSS is what it holds, not the largest period it ever built.
        // SAFETY: malloc_trim only releases free memory of the allocator's arenas.
        unsafe { libc::malloc_trim(0) };
        let heap = crate::sys::own::heap();
        info!(
            "period handled in {} ms; heap {:.1} MiB in use, {:.1} MiB kept free",
            cutting.elapsed().as_millis(),
            heap.in_use as f64 / 1048576.0,
            heap.free as f64 / 1048576.0
        );
        Ok(next)
    }
}

/// Where periods go.
struct Out<'a> {
    identity: &'a Identity,
    sinks: &'a [Sink],
    sender: &'a Sender,
    dir: Option<&'a (PathBuf, Format, Option<usize>)>,
}

impl Out<'_> {
    /// Sends one period's profiles and writes its file.
    fn close(&self, profile: &Profile, period: &Period) -> anyhow::Result<()> {
        let periods = period::split(profile, profile.duration_seconds);
        if let Ok(mut status) = self.sender.status.lock() {
            status.periods += 1;
            status.last_period_unix = Some(agent::status::unix_now());
            status.last_period_processes = periods.len();
            status.periods_empty += u64::from(periods.is_empty());
            status.samples_lost += profile.losses.ringbuf_full + profile.losses.lost_unrecorded;
        }
        // A period in which no process allocated or held anything has nothing to send; the
        // sender still gets an (empty) batch, and writes the status.
        let batch = if periods.is_empty() {
            Vec::new()
        } else {
            agent::encode(self.sinks, &periods, self.identity, period.unix_ns)
        };
        self.sender.send(batch);
        if let Some((dir, format, keep)) = self.dir {
            let value = Value::default_for(profile);
            let pinned = crate::outfile::open_directory(dir)
                .with_context(|| format!("opening {}", dir.display()))?;
            let through = crate::outfile::through(&pinned);
            export::write_snapshot(profile, *format, value, &through, SystemTime::now())
                .with_context(|| format!("writing a period into {}", dir.display()))?;
            prune(&through, *keep).with_context(|| format!("pruning {}", dir.display()))?;
        }
        info!("period closed: {} processes", periods.len());
        Ok(())
    }

    fn destinations(&self) -> String {
        let mut all: Vec<String> = self.sinks.iter().map(Sink::describe).collect();
        if let Some((dir, _, _)) = self.dir {
            all.push(dir.display().to_string());
        }
        all.join(", ")
    }
}

/// Keeps the newest `keep` snapshot files of `dir` (their names sort by time).
fn prune(dir: &std::path::Path, keep: Option<usize>) -> anyhow::Result<()> {
    let Some(keep) = keep else { return Ok(()) };
    let mut names: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("allocscope-"))
        .collect();
    names.sort();
    let excess = names.len().saturating_sub(keep);
    for name in &names[..excess] {
        std::fs::remove_file(dir.join(name))?;
    }
    Ok(())
}
