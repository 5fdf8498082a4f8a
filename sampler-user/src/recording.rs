//! A running recording, shared by `record` and `top`: prepare (checks, paused child) →
//! attach → take samples and watch the targets → read the kernel's counters → detach.
//!
//! What each command does with the samples (write files, draw a screen) stays in its own
//! module; this one owns everything whose order matters for correctness: the child runs only
//! once the probes are attached, the ring buffer is drained before counters are read, and the
//! probes are detached before the slow work (symbolizing, writing) at the end.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context as _;
use aya::maps::{PerCpuArray, RingBuf};
use log::debug;
use sampler_common::ProcessCounters;
use tokio::sync::mpsc;

use crate::{
    collect::{self, Event, Losses, SampleReader},
    config::{BadInput, SamplingConfig, Targets},
    exits, preflight,
    probe::attach::{self, KernelConfig, Probes, ReturnProbes, Target},
    profile::Recorder,
    spawn::{self, PausedChild},
    stacks::symbolize::Symbolizer,
};

/// Everything prepared before the runtime starts: validated targets and, for `-- CMD`, the
/// paused child.
pub struct Prepared {
    targets: Vec<Target>,
    child: Option<PausedChild>,
    command: String,
}

/// Runs every check that can fail on bad input (privileges, targets, then the caller's own
/// `check`), then for `-- CMD` forks the paused child, its stdin and output redirected when
/// `redirect` is given. Must run before any thread exists.
pub fn prepare(
    targets: &Targets,
    check: impl FnOnce() -> Result<(), BadInput>,
    redirect: impl FnOnce() -> Result<Option<spawn::Redirect>, BadInput>,
) -> Result<Prepared, BadInput> {
    preflight::check_privileges()?;
    let mut resolved = match targets {
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
    check()?;
    let mut child = None;
    let mut command = String::new();
    if let Targets::Command(argv) = targets {
        command = argv[0].to_string_lossy().into_owned();
        let paused = spawn::spawn_paused(argv, redirect()?)
            .map_err(|e| BadInput(format!("cannot start {command}: {e}")))?;
        resolved[0].pid = paused.pid;
        child = Some(paused);
    }
    Ok(Prepared {
        targets: resolved,
        child,
        command,
    })
}

/// Something the caller must act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Happening {
    /// A target exited (its samples so far stay; its frames resolve with its last maps).
    Exited(u32),
    /// The last target exited.
    AllExited,
}

/// Probes attached to the targets, samples flowing into a [`Recorder`].
pub struct Recording {
    probes: Option<Probes>,
    reader: SampleReader,
    batch: Vec<Event>,
    /// The samples so far.
    pub recorder: Recorder,
    /// Resolves frames for [`Recorder::profile`].
    pub symbolizer: Symbolizer,
    exited: mpsc::UnboundedReceiver<u32>,
    pids: Vec<u32>,
    running: usize,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    refresh: tokio::time::Interval,
    spawned: Option<u32>,
    last_counters: Option<(BTreeMap<u32, ProcessCounters>, Losses)>,
}

impl Recording {
    /// Attaches the probes, then lets a spawned command run. `recent` keeps per-stack
    /// samples for rates over that window (`top`). Must run inside the tokio runtime.
    pub fn start(
        prepared: Prepared,
        sampling: &SamplingConfig,
        recent: Option<Duration>,
    ) -> anyhow::Result<Recording> {
        let Prepared {
            targets,
            child,
            command,
        } = prepared;
        let kernel = KernelConfig {
            interval: sampling.interval,
            log: sampling.verbose,
            track_frees: (!sampling.alloc_only).then_some(sampling.max_tracked),
            sessions: sampling.sessions,
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
        let logger = if sampling.verbose {
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
        let reader = SampleReader::new(ring)?;
        let spawned = child.as_ref().map(|c| c.pid);
        if let Some(child) = child {
            child
                .release()
                .map_err(|e| BadInput(format!("cannot run {command}: {e}")))?;
        }
        let mut recorder = match recent {
            Some(window) => Recorder::with_recent(window),
            None => Recorder::default(),
        };
        let pids: Vec<u32> = targets.iter().map(|t| t.pid).collect();
        for &pid in &pids {
            recorder.track(pid);
        }
        let symbolizer = Symbolizer::spawn().context("starting the symbolizer thread")?;
        let exited = exits::watch(&pids).context("watching target processes")?;
        Ok(Recording {
            probes: Some(probes),
            reader,
            batch: Vec::new(),
            recorder,
            symbolizer,
            exited,
            running: pids.len(),
            pids,
            logger,
            refresh: tokio::time::interval(Duration::from_millis(250)),
            spawned,
            last_counters: None,
        })
    }

    /// How allocation returns are observed (`None` once detached).
    pub fn returns(&self) -> Option<ReturnProbes> {
        self.probes.as_ref().map(|p| p.returns)
    }

    /// The targets' pids.
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// Takes samples until a target exits. Cancel-safe: every record read is in the
    /// recorder before the next await.
    pub async fn next(&mut self) -> anyhow::Result<Happening> {
        loop {
            tokio::select! {
                read = self.reader.read(&mut self.batch) => {
                    read?;
                    self.recorder.add_all(self.batch.drain(..));
                }
                _ = self.refresh.tick() => {
                    // Keep the maps snapshot current while targets live (libraries loaded
                    // late, a spawned command just past exec), and flush eBPF log records.
                    self.recorder.refresh();
                    if let Some(logger) = self.logger.as_mut() {
                        logger.flush();
                    }
                }
                Some(pid) = self.exited.recv() => {
                    self.recorder.mark_exited(pid);
                    self.running = self.running.saturating_sub(1);
                    return Ok(if self.running == 0 {
                        Happening::AllExited
                    } else {
                        Happening::Exited(pid)
                    });
                }
            }
        }
    }

    /// Moves every sample waiting in the ring buffer into the recorder.
    pub fn catch_up(&mut self) {
        self.reader.drain(&mut self.batch);
        self.recorder.add_all(self.batch.drain(..));
    }

    /// Catches up, then reads the kernel's exact counters per target and the loss counters
    /// (after detaching: the values read last).
    pub fn counters(&mut self) -> anyhow::Result<(BTreeMap<u32, ProcessCounters>, Losses)> {
        self.catch_up();
        if let Some(probes) = &self.probes {
            let counters = {
                let map = probes
                    .ebpf
                    .map("COUNTERS")
                    .context("COUNTERS map missing")?;
                collect::read_counters(&PerCpuArray::try_from(map)?, &self.pids)?
            };
            let losses = {
                let map = probes.ebpf.map("LOSSES").context("LOSSES map missing")?;
                collect::read_losses(&PerCpuArray::try_from(map)?)?
            };
            self.last_counters = Some((counters.clone(), losses));
        }
        self.last_counters
            .clone()
            .context("the kernel's counters were never read")
    }

    /// Detaches every probe (the targets stop paying for them now); with `stop_command`, a
    /// command started for this recording is sent SIGTERM, as with `perf record -- CMD`.
    /// Reads the counters one last time first; later calls return those values.
    pub fn detach(&mut self, stop_command: bool) -> anyhow::Result<()> {
        if self.probes.is_none() {
            return Ok(());
        }
        self.counters()?;
        if let Some(logger) = self.logger.as_mut() {
            logger.flush();
        }
        self.logger = None;
        self.probes = None;
        if let Some(pid) = self.spawned {
            if stop_command {
                // SAFETY: kill(2) with our own child's pid.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
            }
            if let Some(status) = exits::reap(pid) {
                log::info!("command {status}");
            }
        }
        if self.reader.malformed > 0 {
            log::warn!(
                "{} malformed ring-buffer records ignored",
                self.reader.malformed
            );
        }
        Ok(())
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`, so ages of sampled
/// blocks can be computed from their kernel timestamps.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}
