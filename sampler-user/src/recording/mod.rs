//! A running recording, shared by `record` and `top`: prepare (checks, paused child) →
//! attach → take samples and watch the targets come and go → read the kernel's counters →
//! detach.
//!
//! What each command does with the samples (write files, draw a screen) stays in its own
//! module; this one owns everything whose order matters for correctness: the child runs only
//! once the probes are attached, a followed process is followed in the kernel before it
//! runs, the ring buffer is drained before counters are read, and the probes are detached
//! before the slow work (symbolizing, writing) at the end.
//!
//! This file holds the recording loop (start, take samples, detach). Targets change while
//! recording, which [`discovery`] handles: `--follow` and `--comm` probe allocator files for
//! every process and let the kernel count its followed set, which a new process enters
//! before it runs (user space decides on each fork and exec it hears of); `--comm` and
//! `--all` also scan /proc every second for processes running before; every target's maps
//! are re-read for allocators loaded late. A process that exits is finalized by
//! [`counters`]: its probes detach, its exact counters are read and its counter slot is
//! reused; its frames still resolve (the files stay open, see [`crate::stacks`]).

use sampler_common::kernel;
mod counters;
mod discovery;
mod duty_cycling;
mod in_process;
mod roster;
mod throttling;

use std::{collections::BTreeMap, time::Duration};

use std::os::fd::AsRawFd as _;

use anyhow::Context as _;
use aya::maps::RingBuf;
use log::{info, warn};
use sampler_common::ProcessCounters;

use crate::{
    collect::{monotonic_ns, Counters, Event, Losses, SampleReader},
    config::{BadInput, SamplingConfig, Targets},
    cost::{
        self,
        windows::{CostStep, CostWindows},
        Overhead, TargetUse, Trap,
    },
    exits, preflight, preload,
    probe::{
        attach::{AttachedPoint, KernelConfig, Probes, Target},
        runs::ProgramRuns,
    },
    profile::{Aggregator, CoverageStart, ProbePoint, Profile, Settings},
    spawn::{self, PausedChild},
    stacks::symbolize::Symbolizer,
    targets::{AllocatorCache, FindError},
};

/// Everything prepared before the runtime starts: validated targets and, for `-- CMD`, the
/// paused child.
pub struct Prepared {
    targets: Targets,
    initial: Vec<Target>,
    child: Option<PausedChild>,
    command: String,
    cache: AllocatorCache,
    /// The in-process front end loaded into the command.
    front_end: Option<FrontEnd>,
}

/// The in-process front end of a command: the library, the family table its tree counts
/// in, the command's own slot there, and the library as an allocator to probe.
struct FrontEnd {
    library: preload::Library,
    family: preload::Family,
    region: preload::MappedRegion,
    allocator: crate::probe::allocator::Allocator,
}

/// Runs every check that can fail on bad input (privileges, targets, then the caller's own
/// `check`), then for `-- CMD` forks the paused child, its stdin and output redirected when
/// `redirect` is given. Must run before any thread exists.
pub fn prepare(
    targets: &Targets,
    sampling: &SamplingConfig,
    check: impl FnOnce() -> Result<(), BadInput>,
    redirect: impl FnOnce() -> Result<Option<spawn::Redirect>, BadInput>,
) -> Result<Prepared, BadInput> {
    preflight::check_privileges()?;
    let mut cache = AllocatorCache::default();
    let mut initial = Vec::new();
    let mut problems = Vec::new();
    for &pid in &targets.pids {
        match cache.of_pid(pid) {
            Ok(allocators) => initial.push(Target { pid, allocators }),
            Err(FindError::Gone) => problems.push(format!("no such process: pid {pid}")),
            Err(e) => problems.push(format!("pid {pid}: {e}")),
        }
    }
    let others = !initial.is_empty() || targets.waits_for_new();
    if !problems.is_empty() && !others {
        return Err(BadInput(problems.join("; ")));
    }
    for problem in problems {
        warn!("{problem}: left out");
    }
    let mut front_end = None;
    let mut environment = Vec::new();
    if !targets.command.is_empty() {
        let program = preflight::resolve_command(&targets.command[0])?;
        let mut allocators = preflight::allocators_for_command(&program, &mut cache)?;
        // A followed command's tree carries the library too (through the environment): the
        // library's probes, file-wide, reach every process that maps it, and no other.
        // `--comm` and `--all` look at processes that do not.
        let host_wide = targets.comm.is_some() || targets.all;
        if sampling.preload && !host_wide {
            if let Some((library, family, own)) = front_end_for(&program, sampling.interval)? {
                environment = vec![
                    (
                        "LD_PRELOAD".into(),
                        preload::ld_preload(&library, std::env::var_os("LD_PRELOAD").as_deref()),
                    ),
                    (
                        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(
                            sampler_common::preload::FAMILY_FD_VARIABLE.to_bytes(),
                        )
                        .into(),
                        family.1.as_raw_fd().to_string().into(),
                    ),
                ];
                allocators.push(own.clone());
                crate::probe::allocator::behind_front_end(&mut allocators, false);
                front_end = Some((library, family, own));
            }
        }
        initial.push(Target { pid: 0, allocators });
    }
    check()?;
    let mut child = None;
    let mut command = String::new();
    if let Some(program) = targets.command.first() {
        command = program.to_string_lossy().into_owned();
        let paused = spawn::spawn_paused(&targets.command, redirect()?, &environment)
            .map_err(|e| BadInput(format!("cannot start {command}: {e}")))?;
        if let Some(target) = initial.last_mut() {
            target.pid = paused.pid;
        }
        child = Some(paused);
    }
    let front_end = match (front_end, &child) {
        (Some((library, (family, fd), allocator)), Some(child)) => {
            drop(fd);
            let region = family.claim_for(child.pid).map_err(|e| {
                BadInput(format!(
                    "cannot prepare the in-process sampler (family table): {e:#}"
                ))
            })?;
            Some(FrontEnd {
                library,
                family,
                region,
                allocator,
            })
        }
        _ => None,
    };
    let mut targets = targets.clone();
    if front_end.is_some() && targets.children {
        targets.follow = true;
    } else if targets.children && !targets.follow {
        info!(
            "the processes {command} starts are not followed: with uprobes that would trap \
             every process using their allocator (--follow does it anyway)"
        );
    }
    Ok(Prepared {
        targets,
        initial,
        child,
        command,
        cache,
        front_end,
    })
}

/// The in-process front end for command `program`: the library in a memfd, a family table
/// at `interval` with the descriptor the command inherits, and the library as an
/// allocator to attach to. `None` (uprobes then) where the dynamic loader would not load
/// it, said once: a statically linked program, or a set-user/group-ID one (the loader
/// ignores `LD_PRELOAD` from a path outside the system's for those).
#[allow(clippy::type_complexity)]
fn front_end_for(
    program: &std::path::Path,
    interval: u64,
) -> Result<
    Option<(
        preload::Library,
        (preload::Family, std::os::fd::OwnedFd),
        crate::probe::allocator::Allocator,
    )>,
    BadInput,
> {
    use std::os::unix::fs::PermissionsExt as _;
    let shown = program.display();
    let data = std::fs::read(program).map_err(|e| BadInput(format!("cannot read {shown}: {e}")))?;
    if data.starts_with(b"\x7fELF") && crate::targets::interpreter_of(&data).is_none() {
        warn!("{shown} is statically linked: the in-process sampler cannot load; probing its allocator with uprobes");
        return Ok(None);
    }
    let mode = std::fs::metadata(program)
        .map(|m| m.permissions().mode())
        .unwrap_or(0);
    if mode & 0o6000 != 0 {
        warn!("{shown} is set-user/group-ID: the loader ignores LD_PRELOAD for it; probing its allocator with uprobes");
        return Ok(None);
    }
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        BadInput(format!(
            "cannot prepare the in-process sampler ({what}): {e} (--no-preload probes its allocator with uprobes instead)"
        ))
    };
    let library = preload::Library::create().map_err(|e| failed("library", &e))?;
    let family = preload::Family::create(interval).map_err(|e| failed("family table", &e))?;
    let path = library.own_path();
    let file_id = library.file_id().map_err(|e| failed("library", &e))?;
    let file = crate::probe::allocator::analyse_file(
        &path,
        false,
        std::path::Path::new("allocscope-preload"),
    )
    .filter(|f| f.is_in_process())
    .ok_or_else(|| failed("library", &"its probes were not found"))?;
    let own = crate::probe::allocator::Allocator {
        path: path.clone(),
        shown: "/memfd:allocscope-preload".into(),
        file_id,
        in_executable: false,
        file: std::sync::Arc::new(file),
    };
    Ok(Some((library, family, own)))
}

/// How the command started for a recording (`-- CMD`) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandExit {
    /// Before the recording stopped: its status is the recording's exit code.
    OnItsOwn(exits::ChildExit),
    /// Stopped (SIGTERM) because the recording stopped first.
    Stopped(exits::ChildExit),
}

/// Something the caller must act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Happening {
    /// A target exited (its samples so far stay; its frames resolve with its last maps).
    Exited(u32),
    /// The last target exited, and no new one can come (`-p`, `-- CMD`).
    AllExited,
}

/// From when a process is covered: the event that made it a target (a fork, an exec, the
/// start of our command, or our attaching), and when (CLOCK_MONOTONIC ns).
#[derive(Clone, Copy, Debug)]
struct Since {
    start: CoverageStart,
    timestamp_ns: u64,
}

impl Since {
    fn now(start: CoverageStart) -> Since {
        Since {
            start,
            timestamp_ns: monotonic_ns(),
        }
    }
}

/// How this recording's cost is measured (see [`overhead`]).
#[derive(Clone, Copy, Debug)]
pub struct Meter {
    /// The trap per probe hit.
    pub trap: Trap,
    /// Whether the kernel measures the programs' run times.
    pub stats: bool,
    /// Whether processes that are not targets hit the probes too.
    pub file_wide: bool,
}

impl Meter {
    /// The cost of `runs` to `targets` over `seconds` (see [`cost::measure`]).
    pub fn measure(&self, runs: ProgramRuns, seconds: f64, targets: &[TargetUse]) -> Overhead {
        cost::measure(
            self.trap,
            runs,
            self.stats,
            self.file_wide,
            seconds,
            targets,
        )
    }
}

/// Probes attached to the targets, samples flowing into an [`Aggregator`].
pub struct Recording {
    probes: Option<Probes>,
    reader: SampleReader,
    batch: Vec<Event>,
    /// The samples so far.
    pub aggregator: Aggregator,
    /// Resolves frames for [`Aggregator::profile`].
    pub symbolizer: Symbolizer,
    targets: Targets,
    cache: AllocatorCache,
    watcher: exits::Watcher,
    /// The targets, their slots and coverage, the processes left out.
    roster: roster::Roster,
    /// The kernel's exact counters, with those of targets that exited.
    counters: Counters,
    /// Every probe point attached.
    points: Vec<AttachedPoint>,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    refresh: tokio::time::Interval,
    scan: tokio::time::Interval,
    spawned: Option<u32>,
    command_exit: Option<CommandExit>,
    said_waiting: bool,
    last_counters: Option<(BTreeMap<u32, ProcessCounters>, Losses)>,
    /// Entries of the kernel's thread-state map when the counters were last read.
    thread_states: Option<u64>,
    /// When the exact counters were last read (CLOCK_MONOTONIC ns).
    counted_ns: u64,
    /// The uprobe trap's cost, calibrated at start.
    trap: Trap,
    /// The windows the programs' cost is measured in.
    cost: CostWindows,
    cost_clock: tokio::time::Interval,
    /// When [`Self::every_second`] last ran.
    last_second: std::time::Instant,
    /// The sampling-rate throttle (`None`: `--max-samples-per-sec 0`).
    throttling: Option<throttling::Throttling>,
    /// Duty cycling (`None`: no `--max-overhead`, the probes stay attached).
    duty: Option<duty_cycling::DutyCycling>,
    /// Its slot boundaries (idle without duty cycling).
    duty_clock: tokio::time::Interval,
    /// Samples received so far.
    samples_taken: u64,
    /// Once detaching: samples and frees after this moment are dropped, so the profile
    /// covers exactly what the final counters cover (removing a breakpoint takes the kernel
    /// milliseconds, and the probes still fire meanwhile).
    cutoff_ns: Option<u64>,
    /// The command's tree counted in-process.
    in_process: in_process::InProcess,
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
            initial,
            child,
            command,
            cache,
            front_end,
        } = prepared;
        let followed_only = !targets.all && (targets.follow || targets.comm.is_some());
        // A command counted in-process, alone, traps only on its samples (rare), and needs
        // no uprobe on its allocator unless one is linked into its executable.
        let in_process_only = front_end.is_some() && initial.len() == 1 && !targets.waits_for_new();
        let kernel = KernelConfig {
            interval: sampling.interval,
            log: sampling.verbose,
            track_frees: (!sampling.alloc_only).then_some(sampling.max_tracked),
            ring_buffer: sampling.ring_buffer,
            stack_bytes: sampling.unwind.stack_bytes(),
            sessions: sampling.sessions,
            usdt_nop5: sampling.usdt_nop5,
            host: targets.all || followed_only,
            follow: targets.follow,
            followed_only,
            watch_execs: targets.waits_for_new(),
            duty_cycled: sampling.max_overhead.is_some(),
            lazy_uprobes: in_process_only,
        };
        let mut probes = Probes::load(kernel).context("loading the eBPF programs")?;
        // The trap calibration's ~0.15 s (timing, then a link the kernel takes ~0.1 s to
        // remove, which holds up the attach behind it) would be the largest part of such a
        // command's cost.
        let trap = if in_process_only {
            Trap::MODELLED
        } else {
            cost::trap::calibrate(&mut probes)
        };
        let duty = sampling.max_overhead.map(duty_cycling::DutyCycling::new);
        if duty.is_some() {
            // The first slot is on from the start: open before any target can run.
            probes
                .set_gate(true)
                .context("opening the duty cycle's gate")?;
        }
        let slot = if duty.is_some() {
            duty_cycling::SLOT
        } else {
            Duration::from_secs(3600)
        };
        let mut duty_clock = tokio::time::interval_at(tokio::time::Instant::now() + slot, slot);
        // A boundary missed while the loop was busy is taken late, not as a burst of empty
        // slots.
        duty_clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let logger = if sampling.verbose {
            aya_log::EbpfLogger::init(&mut probes.ebpf)
                .map_err(|e| warn!("eBPF log unavailable: {e}"))
                .ok()
        } else {
            None
        };
        let ring = RingBuf::try_from(
            probes
                .ebpf
                .take_map(kernel::maps::SAMPLES)
                .context("SAMPLES map missing")?,
        )?;
        let reader = SampleReader::new(ring, sampling.ring_buffer as usize)?;
        let mut aggregator = match recent {
            Some(window) => Aggregator::with_recent(window),
            None => Aggregator::default(),
        };
        aggregator.limit_stacks(sampling.max_stacks);
        if duty.is_some() {
            aggregator.duty_cycle();
        }
        let mut recording = Recording {
            probes: Some(probes),
            reader,
            batch: Vec::new(),
            aggregator,
            symbolizer: Symbolizer::spawn(&sampling.debug_dirs)
                .context("starting the symbolizer thread")?,
            targets,
            cache,
            watcher: exits::Watcher::new(),
            roster: roster::Roster::new(followed_only),
            counters: Counters::default(),
            points: Vec::new(),
            logger,
            refresh: tokio::time::interval(Duration::from_millis(250)),
            scan: tokio::time::interval(Duration::from_secs(1)),
            spawned: child.as_ref().map(|c| c.pid),
            command_exit: None,
            said_waiting: false,
            last_counters: None,
            counted_ns: 0,
            trap,
            cost: CostWindows::default(),
            cost_clock: tokio::time::interval(Duration::from_secs(1)),
            // The clock's first tick is at once: a second ago, so that it runs then.
            last_second: std::time::Instant::now()
                .checked_sub(Duration::from_secs(1))
                .unwrap_or_else(std::time::Instant::now),
            throttling: throttling::Throttling::new(
                sampling.max_samples_per_sec,
                sampling.interval,
            ),
            duty,
            duty_clock,
            samples_taken: 0,
            thread_states: None,
            cutoff_ns: None,
            in_process: in_process::InProcess::none(sampling.interval),
        };
        // A followed command that carries the front end has its tree carry it too: nothing
        // else is probed unless a process turns out not to (a static or set-user-ID
        // program, a cleared environment), and then only its own files.
        match &front_end {
            None if followed_only => recording.probe_system_allocators(),
            // Before the command is followed: it is covered from its start.
            Some(front_end) if followed_only => {
                if let Err(e) = recording.probe_files(std::slice::from_ref(&front_end.allocator)) {
                    warn!("probing the in-process sampler for every process: {e:#}");
                }
            }
            _ => {}
        }
        if let (Some(child), Some(front_end)) = (&child, front_end) {
            let FrontEnd {
                library,
                family,
                region,
                allocator,
            } = front_end;
            recording.counters.add_region(child.pid, region);
            // Its frames lead every sample's stack; a short-lived command is gone before
            // its own view of the library could be opened.
            if let Ok(file_id) = library.file_id() {
                recording.aggregator.hold_file(file_id, library.own_path());
            }
            recording.in_process =
                in_process::InProcess::of_command(library, allocator, family, sampling.interval);
        }
        for target in initial {
            let since = Since::now(if Some(target.pid) == recording.spawned {
                CoverageStart::Start
            } else {
                CoverageStart::Attach
            });
            if let Err(e) = recording.attach(target.pid, &target.allocators, since) {
                if Some(target.pid) == recording.spawned {
                    return Err(e.context(format!("attaching to {command}")));
                }
                warn!("pid {}: {e:#}: left out", target.pid);
            }
        }
        if let Some(child) = child {
            let pid = child.pid;
            child
                .release()
                .map_err(|e| BadInput(format!("cannot run {command}: {e}")))?;
            // Past exec now: its own name, executable and maps.
            recording.aggregator.track(pid);
        }
        recording.discover()?;
        if recording.roster.none_running() && !recording.targets.waits_for_new() {
            anyhow::bail!("every target exited while the probes were being attached");
        }
        Ok(recording)
    }

    fn probes_mut(&mut self) -> anyhow::Result<&mut Probes> {
        self.probes.as_mut().context("the probes are detached")
    }

    /// Every process attached so far (host-wide: every one seen allocating).
    pub fn pids(&self) -> &[u32] {
        self.roster.pids()
    }

    /// What is being recorded, for people: "pid 12, 13 and the processes they start".
    pub fn describe(&self) -> String {
        let pids = || crate::text::pid_list(&self.roster.running());
        let what = if self.targets.all {
            "every process".to_owned()
        } else if let Some(pattern) = &self.targets.comm {
            format!("processes named like {:?}", pattern.0.as_str())
        } else {
            pids()
        };
        if self.targets.follow {
            format!("{what} and the processes they start")
        } else {
            what
        }
    }

    /// The profile of the recording so far, as every output writes it (record's final file
    /// and snapshots, top's snapshots): counters read, frames resolved, probe points and
    /// thread states included; with `period_seconds`, values over the current period too.
    /// Once detached, it covers exactly what the final counters cover.
    pub async fn profile(
        &mut self,
        mut settings: Settings,
        period_seconds: Option<f64>,
    ) -> anyhow::Result<Profile> {
        settings.largest_interval = settings.largest_interval.max(self.largest_interval());
        let (counters, losses) = self.counters().await?;
        let now_ns = self.cutoff_ns.unwrap_or_else(monotonic_ns);
        self.note_open_stratum();
        let mut profile = self
            .aggregator
            .profile(
                &self.symbolizer,
                settings,
                &counters,
                losses,
                period_seconds,
                now_ns,
            )
            .await;
        profile.probes = self.probe_points();
        profile.sampling.throttle = self.throttling.as_ref().and_then(|t| t.record());
        profile.sampling.duty = self.duty.as_ref().map(|d| d.record(now_ns));
        profile.thread_states = self.thread_states();
        for process in &mut profile.processes {
            process.coverage = self.roster.coverage(process.pid).cloned();
        }
        let targets: Vec<TargetUse> = profile
            .processes
            .iter()
            .map(|p| TargetUse {
                pid: p.pid,
                calls: p.exact.calls,
                cpu_seconds: p.cpu_seconds,
            })
            .collect();
        let calls = targets.iter().map(|t| t.calls).sum();
        let mut overhead = self.meter().measure(
            self.cost.runs_for(calls),
            profile.duration_seconds,
            &targets,
        );
        overhead.statistics_seconds = self.cost.seconds;
        profile.overhead = Some(overhead);
        Ok(profile)
    }

    /// The largest sampling interval in force so far (the throttle may have raised it).
    pub fn largest_interval(&self) -> u64 {
        self.throttling.as_ref().map_or(0, |t| t.largest())
    }

    /// What the cost of the probes is measured with.
    pub fn meter(&self) -> Meter {
        Meter {
            trap: self.trap,
            stats: self.cost.measured(),
            file_wide: self.targets.all || self.roster.followed_only(),
        }
    }

    /// The probes' cost per allocation call of the targets, as the statistics windows so
    /// far measured it (the trap alone before the first window closes).
    pub fn ns_per_call(&self) -> f64 {
        if !self.cost.measured() {
            return self.trap.ns;
        }
        let (runs, calls) = self.cost.totals();
        let meter = self.meter();
        cost::ns_per_call(meter.trap, runs, meter.stats, meter.file_wide, calls)
    }

    /// How the command started for this recording ended (known once detached).
    pub fn command_exit(&self) -> Option<CommandExit> {
        self.command_exit
    }

    /// Entries of the kernel's per-thread state map at the last counter read.
    pub fn thread_states(&self) -> Option<u64> {
        self.thread_states
    }

    /// Every probe point attached so far, as profiles report them.
    pub fn probe_points(&self) -> Vec<ProbePoint> {
        self.points
            .iter()
            .map(|point| ProbePoint {
                pid: point.pid,
                file: point.path.display().to_string(),
                function: point.probe.to_string(),
                offset: point.file_offset + point.placement.offset,
                instruction: point.placement.instruction.clone(),
                emulated: point.placement.emulated,
            })
            .collect()
    }

    /// Takes samples until a target exits. Cancel-safe: every record read is in the
    /// aggregator before the next await.
    pub async fn next(&mut self) -> anyhow::Result<Happening> {
        loop {
            tokio::select! {
                read = self.reader.read(&mut self.batch) => {
                    read?;
                    self.take_batch_in_steps()?;
                }
                _ = self.refresh.tick() => {
                    // Keep the maps snapshot current while targets live (libraries loaded
                    // late, a spawned command just past exec), and flush eBPF log records.
                    self.aggregator.refresh();
                    if let Some(logger) = self.logger.as_mut() {
                        logger.flush();
                    }
                }
                _ = self.scan.tick() => self.discover()?,
                _ = self.cost_clock.tick() => self.every_second()?,
                _ = self.duty_clock.tick(), if self.duty.is_some() => self.duty_slot().await?,
                Some(pid) = self.watcher.exited.recv() => {
                    self.finalize(pid).await?;
                    let waits = self.targets.waits_for_new();
                    return Ok(if self.roster.none_running() && !waits {
                        Happening::AllExited
                    } else {
                        Happening::Exited(pid)
                    });
                }
            }
        }
    }

    /// Takes the batch a few thousand events at a time, doing the once-a-second work
    /// between steps when it is due: a ring buffer's worth of samples takes the aggregator
    /// seconds to unwind in a storm (32k samples at ~55 µs), and the throttle must answer
    /// the storm within a second, not after it (#29: first change at 3.4–4.0 s).
    fn take_batch_in_steps(&mut self) -> anyhow::Result<()> {
        const STEP: usize = 2048;
        if self.batch.len() <= STEP {
            self.take_batch();
            return Ok(());
        }
        let mut events = std::mem::take(&mut self.batch).into_iter();
        loop {
            self.batch.extend(events.by_ref().take(STEP));
            if self.batch.is_empty() {
                return Ok(());
            }
            self.take_batch();
            if self.last_second.elapsed() >= Duration::from_secs(1) {
                self.every_second()?;
            }
        }
    }

    /// Once a second: one reading of the exact counters for the cost windows and the
    /// throttle, when either needs it (from the clock, or between steps of a long batch:
    /// whichever comes first).
    fn every_second(&mut self) -> anyhow::Result<()> {
        if self.last_second.elapsed() < Duration::from_millis(500) {
            return Ok(());
        }
        self.last_second = std::time::Instant::now();
        let step = self.cost.tick();
        if step == CostStep::Idle && self.throttling.is_none() {
            return Ok(());
        }
        let Some((counters, losses)) = self.exact_counts()? else {
            return Ok(());
        };
        let calls = counters.values().map(|c| c.calls).sum();
        match step {
            CostStep::Open => {
                if let Some(probes) = &self.probes {
                    self.cost.open(|| probes.program_runs(), calls);
                }
            }
            CostStep::Check if self.cost.done(calls) => self.close_cost_window(calls),
            _ => {}
        }
        let bytes = counters.values().map(|c| c.bytes).sum();
        self.throttle_tick(bytes, losses.ringbuf_full)
    }

    /// Closes the open statistics window with the programs' runs now.
    fn close_cost_window(&mut self, calls: u64) {
        if let Some(probes) = &self.probes {
            self.cost.close(probes.program_runs(), calls);
        }
    }

    /// Moves the batch into the aggregator, acting on process events first.
    fn take_batch(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        if let Some(cutoff) = self.cutoff_ns {
            batch.retain(|event| match event {
                Event::Alloc(sample) => sample.timestamp_ns <= cutoff,
                Event::Free(freed) => freed.timestamp_ns <= cutoff,
                Event::Process { .. } | Event::Maps { .. } => true,
            });
        }
        self.samples_taken += batch
            .iter()
            .filter(|event| matches!(event, Event::Alloc(_)))
            .count() as u64;
        for event in &batch {
            match *event {
                Event::Process {
                    pid,
                    parent,
                    timestamp_ns,
                    ref comm,
                } => self.on_process(pid, parent, timestamp_ns, comm),
                Event::Maps {
                    pid,
                    read_ns,
                    ref text,
                } => self.aggregator.offer_maps(pid, read_ns, text),
                Event::Alloc(ref sample) => {
                    // A process counted in-process may be gone before its maps are read
                    // from /proc: its library's own copy stands in (the newer one wins).
                    if let Some((text, read_ns)) = self.counters.new_maps(sample.pid) {
                        self.aggregator.offer_maps(sample.pid, read_ns, &text);
                    }
                    if !self.aggregator.tracks(sample.pid) {
                        self.first_seen(sample.pid);
                    }
                }
                _ => {}
            }
        }
        if self.roster.excludes_any() {
            batch.retain(|event| match event {
                Event::Alloc(sample) => !self.roster.is_excluded(sample.pid),
                Event::Free(freed) => !self.roster.is_excluded(freed.pid),
                Event::Process { .. } | Event::Maps { .. } => true,
            });
        }
        self.aggregator.add_all(batch);
    }

    /// Moves every sample waiting in the ring buffer into the aggregator.
    pub async fn catch_up(&mut self) -> anyhow::Result<()> {
        self.reader.catch_up(&mut self.batch).await?;
        self.take_batch();
        Ok(())
    }

    /// Detaches every probe (the targets stop paying for them now). A command started for
    /// this recording and still running is stopped with SIGTERM (it stops with the
    /// recording, as it would if we died: see [`spawn`]); its exit is kept for
    /// [`Self::command_exit`]. Reads the counters one last time first; later calls return
    /// those values.
    pub async fn detach(&mut self) -> anyhow::Result<Closing> {
        if self.probes.is_none() {
            return Ok(Closing(None));
        }
        let (counters, _) = self.counters().await?;
        self.end_duty(&counters);
        self.close_cost_window(counters.values().map(|c| c.calls).sum());
        self.cutoff_ns = Some(self.counted_ns);
        if let Some(logger) = self.logger.as_mut() {
            logger.flush();
        }
        self.logger = None;
        let closing = self.probes.take().and_then(Probes::close_in_background);
        if let Some(pid) = self.spawned {
            let exit = exits::reap(pid);
            self.command_exit = match exit {
                Some(exit) => Some(CommandExit::OnItsOwn(exit)),
                None => {
                    // SAFETY: kill(2) with our own child's pid, not reaped yet.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
                    exits::reap_within(pid, Duration::from_secs(2)).map(CommandExit::Stopped)
                }
            };
            match self.command_exit {
                Some(CommandExit::OnItsOwn(exit)) => info!("command {exit}"),
                Some(CommandExit::Stopped(exit)) => info!("command stopped: {exit}"),
                None => warn!("command (pid {pid}) still running 2 s after SIGTERM"),
            }
        }
        let (samples, mean_ns, mean_copy) = self.aggregator.stack_cost();
        if samples > 0 {
            info!(
                "stacks: {samples} samples unwound, checked and interned, {:.1} µs each \
                 ({:.0} samples/s on one core); {mean_copy:.0} bytes of stack copied per \
                 sample",
                mean_ns / 1e3,
                1e9 / mean_ns.max(1.0)
            );
        }
        if self.reader.malformed() > 0 {
            warn!(
                "{} malformed ring-buffer records ignored",
                self.reader.malformed()
            );
        }
        Ok(Closing(closing))
    }
}

/// The probes' links being closed after [`Recording::detach`]: the kernel takes ~0.1 s a
/// link, so they close while the profile is built and written; dropping this waits for
/// them (a process exiting first would wait as long, in the kernel).
#[must_use = "dropping it waits for the links to close"]
pub struct Closing(Option<std::thread::JoinHandle<()>>);

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            let _ = handle.join();
        }
    }
}
