//! A running recording, shared by `record` and `top`: prepare (checks, paused child) →
//! attach → take samples, watch the targets come and go → read the kernel's counters → detach.
//!
//! What each command does with the samples (write files, draw a screen) stays in its own
//! module; this one owns everything whose order matters for correctness: the child runs
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

mod carriers;
mod counters;
mod discovery;
mod duty_cycling;
mod early;
mod in_process;
mod load;
mod prepare;
mod roster;
mod start;
mod throttling;

use prepare::FrontEnd;
pub use prepare::{prepare, Prepared};

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context as _;
use log::{info, warn};
use sampler_common::ProcessCounters;

use crate::{
    collect::{monotonic_ns, Counters, Event, Losses, SampleReader},
    config::Targets,
    cost::{
        self,
        windows::{CostStep, CostWindows},
        Overhead, TargetUse, Trap,
    },
    exits,
    probe::{
        attach::{AttachedPoint, Probes},
        runs::ProgramRuns,
    },
    profile::{
        Aggregator, CoverageStart, OpenStratum, ProbePoint, ProcessBook, Profile, Readings,
        Settings, Snapshot,
    },
    stacks::symbolize::Symbolizer,
    targets::AllocatorCache,
};

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
    /// Never attached: the command's tree exited while the probes loaded, and every event
    /// is an early record, every count a region's (see [`early::load_unless_gone`]).
    probeless: bool,
    reader: SampleReader,
    batch: Vec<Event>,
    /// The samples so far.
    aggregator: Aggregator,
    /// What is known of each target apart from its samples.
    processes: ProcessBook,
    /// Resolves frames for [`Aggregator::profile`].
    symbolizer: Symbolizer,
    /// Stacks whose frames the symbolizer was asked to resolve ahead ([`Self::warm_symbols`]).
    warmed_stacks: usize,
    targets: Targets,
    cache: AllocatorCache,
    watcher: exits::Watcher,
    /// The targets, their slots and coverage, the processes left out.
    roster: roster::Roster,
    /// The kernel's exact counters, with those of targets that exited.
    counters: Counters,
    /// Every probe point attached.
    points: Vec<AttachedPoint>,
    logger: Option<Logger>,
    clocks: Clocks,
    spawned: Option<u32>,
    command_exit: Option<CommandExit>,
    said_waiting: bool,
    last_counters: Option<(BTreeMap<u32, ProcessCounters>, Losses)>,
    /// The kernel's count of the samples it could not deliver, as last read (cumulative).
    lost: crate::profile::LostCounts,
    /// Entries of the kernel's thread-state map when the counters were last read.
    thread_states: Option<u64>,
    /// When the exact counters were last read (CLOCK_MONOTONIC ns).
    counted_ns: u64,
    /// The uprobe trap's cost, calibrated at start.
    trap: Trap,
    /// The windows the programs' cost is measured in.
    cost: CostWindows,
    /// The sampling-rate throttle (`None`: `--max-samples-per-sec 0`).
    throttling: Option<throttling::Throttling>,
    /// Duty cycling (`None`: no `--max-overhead`, the probes stay attached).
    duty: Option<duty_cycling::DutyCycling>,
    /// Samples received so far.
    samples_taken: u64,
    /// Once detaching: samples and frees after this moment are dropped, so the profile
    /// covers exactly what the final counters cover (removing a breakpoint takes the kernel
    /// milliseconds, and the probes still fire meanwhile).
    cutoff_ns: Option<u64>,
    /// The command's tree counted in-process.
    in_process: in_process::InProcess,
    /// `--front-end in-process` with `--comm` or `--all`: only carriers are counted.
    carriers: Option<carriers::Carriers>,
    /// Times [`Recording::forget_gone`] forgot a process.
    forgets: u32,
    /// When counting began: at the start, or when a command that ran while its probes
    /// loaded was let go (see [`early`]).
    began: std::time::Instant,
    /// When the recording's targets were all gone, if that was before [`Recording::start`]
    /// returned (see [`early`]).
    ended: Option<std::time::Instant>,
}

/// Every how many [`Recording::forget_gone`] that forgot something the symbolizer drops its
/// caches (with the agent's 60 s periods: at most every 10 minutes).
const SYMBOLIZER_FORGETS_EVERY: u32 = 10;

impl Recording {
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
        let open_stratum = self.open_stratum();
        let leak_age = settings.leaks_older_than.filter(|_| !settings.alloc_only);
        let tally = self
            .aggregator
            .tally(
                &self.symbolizer,
                self.readings(open_stratum.as_ref()),
                now_ns,
                leak_age,
            )
            .await;
        let targets = crate::profile::target_uses(&tally, &counters);
        let calls = targets.iter().map(|t| t.calls).sum();
        let mut overhead = self.meter().measure(
            self.cost.runs_for(calls),
            settings.duration_seconds,
            &targets,
        );
        overhead.statistics_seconds = self.cost.seconds;
        let coverage = targets
            .iter()
            .filter_map(|t| Some((t.pid, self.roster.coverage(t.pid)?.clone())))
            .collect();
        Ok(Profile::build(Snapshot {
            tally,
            settings,
            counters,
            losses,
            period_seconds,
            probes: self.probe_points(),
            throttle: self.throttling.as_ref().and_then(|t| t.record()),
            duty: self.duty.as_ref().map(|d| d.record(now_ns)),
            thread_states: self.thread_states(),
            coverage,
            overhead: Some(overhead),
        }))
    }

    /// When counting began (a command that ran while its probes loaded: when it was let
    /// go, before [`Recording::start`] returned).
    pub fn began(&self) -> std::time::Instant {
        self.began
    }

    /// When every target was gone, if they all exited while the probes were being
    /// attached (the recording's duration ends there, not when the loop noticed).
    pub fn ended_early(&self) -> Option<std::time::Instant> {
        self.ended
    }

    /// Starts tracking `pid`: its maps, and its description (again after an exec).
    fn track(&mut self, pid: u32) {
        self.aggregator.track(pid);
        self.processes.track(pid);
    }

    /// Starts tracking `pid`, a new process of `parent` (see [`Aggregator::track_fork`]).
    /// Whether it is its parent's copy (no exec since its fork).
    fn track_fork(&mut self, pid: u32, parent: u32) -> bool {
        // Its parent's copy (no exec since its fork): its parent's maps too.
        let copy = self.processes.track_fork(pid, parent);
        self.aggregator.track_fork(pid, parent, copy);
        copy
    }

    /// Forgets every process that exited (the agent, once their last period is sent):
    /// a recording that runs for days keeps only what its running processes need.
    pub fn forget_gone(&mut self) -> usize {
        // Duty cycling's strata sum over the whole recording (and is not the agent's).
        if self.duty.is_some() {
            return 0;
        }
        let alive = crate::sys::process::exists;
        let gone = self.roster.forget_gone(alive);
        // Processes left alone (host mode) that exited: their exclusion goes too.
        let mut in_kernel = gone.clone();
        for pid in self.roster.excluded() {
            if !alive(pid) && pid != std::process::id() {
                self.roster.forget_excluded(pid);
                in_kernel.insert(pid);
            }
        }
        if let Some(probes) = self.probes.as_mut().filter(|_| !in_kernel.is_empty()) {
            match crate::collect::forget::forget_in_kernel(&mut probes.ebpf, &in_kernel) {
                Ok(entries) => log::debug!("forgot {entries} kernel entries of gone processes"),
                Err(e) => log::warn!("forgetting gone processes in the kernel's tables: {e:#}"),
            }
        }
        if gone.is_empty() {
            return 0;
        }
        self.aggregator.forget(&gone);
        for pid in &gone {
            self.processes.forget(*pid);
            self.counters.forget(*pid);
            self.lost.remove(pid);
        }
        if let Some((counters, _)) = &mut self.last_counters {
            counters.retain(|pid, _| !gone.contains(pid));
        }
        // What the symbolizer parsed for them goes too, every few times (the next profile
        // parses again what the running processes need: CPU each time, against memory that
        // would otherwise follow every program that ever ran).
        self.forgets += 1;
        if self.forgets.is_multiple_of(SYMBOLIZER_FORGETS_EVERY) {
            self.symbolizer.forget_caches();
        }
        gone.len()
    }

    /// Starts a new period for per-period values (`--every` snapshots).
    pub fn start_period(&mut self) {
        self.aggregator.start_period(&self.lost);
    }

    /// The samples so far, per stack and process, frames resolved (`top`'s picture);
    /// `leak_age`: blocks older than this count as leak suspects.
    pub async fn tally(&mut self, leak_age: Option<Duration>) -> crate::profile::Tally {
        let open_stratum = self.open_stratum();
        self.aggregator
            .tally(
                &self.symbolizer,
                self.readings(open_stratum.as_ref()),
                monotonic_ns(),
                leak_age,
            )
            .await
    }

    /// What a tally reads besides the samples, as last read.
    fn readings<'a>(&'a self, open_stratum: Option<&'a OpenStratum>) -> Readings<'a> {
        Readings {
            processes: &self.processes,
            lost: &self.lost,
            open_stratum,
        }
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
                _ = self.clocks.refresh.tick() => {
                    // Keep the maps snapshot current while targets live (libraries loaded
                    // late, a spawned command just past exec), and flush eBPF log records.
                    self.aggregator.refresh(&self.processes.pids());
                    self.processes.refresh();
                    self.warm_symbols();
                    if let Some(logger) = self.logger.as_mut() {
                        logger.flush();
                    }
                }
                _ = self.clocks.scan.tick() => self.discover()?,
                _ = self.clocks.second.tick() => self.every_second()?,
                _ = self.clocks.duty.tick(), if self.duty.is_some() => self.duty_slot().await?,
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

    /// Has the symbolizer resolve the frames of the stacks seen since last time, while
    /// the targets run (see [`Symbolizer::warm`]).
    fn warm_symbols(&mut self) {
        let (frames, stacks) = self.aggregator.file_frames_since(self.warmed_stacks);
        self.warmed_stacks = stacks;
        self.symbolizer.warm(frames);
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
            if self.clocks.last_second.elapsed() >= Duration::from_secs(1) {
                self.every_second()?;
            }
        }
    }

    /// Once a second: one reading of the exact counters for the cost windows and the
    /// throttle, when either needs it (from the clock, or between steps of a long batch:
    /// whichever comes first).
    fn every_second(&mut self) -> anyhow::Result<()> {
        if self.clocks.last_second.elapsed() < Duration::from_millis(500) {
            return Ok(());
        }
        self.clocks.last_second = std::time::Instant::now();
        self.aggregator.advance(crate::collect::monotonic_ns());
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

    /// Routes the batch: control events (a process forked or exec'd, a process's maps) to
    /// discovery and the stack table, first; then data events (samples, frees) to the
    /// aggregator.
    fn take_batch(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        if let Some(cutoff) = self.cutoff_ns {
            batch.retain(|event| match event {
                Event::Alloc(sample) => sample.timestamp_ns <= cutoff,
                Event::Free(freed) => freed.timestamp_ns <= cutoff,
                Event::Process { .. } | Event::Maps { .. } | Event::PythonFrames(_) => true,
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
                    self.region_for_sample(sample.pid);
                    if let Some((text, read_ns)) = self.counters.new_maps(sample.pid) {
                        self.aggregator.offer_maps(sample.pid, read_ns, &text);
                    }
                    if !self.processes.tracks(sample.pid) {
                        self.first_seen(sample.pid);
                    }
                }
                _ => {}
            }
        }
        // Data events go on to the aggregator (those of processes left out dropped); the
        // control events were discovery's and the stack table's, above.
        let roster = &self.roster;
        batch.retain(|event| match event {
            Event::Alloc(sample) => !roster.is_excluded(sample.pid),
            Event::Free(freed) => !roster.is_excluded(freed.pid),
            Event::Process { .. } | Event::Maps { .. } | Event::PythonFrames(_) => false,
        });
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
        if !self.counting() {
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
        let nobody_left = self.roster.none_running();
        let closing = self
            .probes
            .take()
            .and_then(|probes| probes.close_in_background(nobody_left));
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
        if self.reader.python_frames_missing() > 0 {
            warn!(
                "{} samples lost their Python frames (their record lost to a full ring \
                 buffer, or their interpreter not yet known): their stacks show the \
                 interpreter's native frames",
                self.reader.python_frames_missing()
            );
        }
        Ok(Closing(closing))
    }
}

/// The eBPF programs' log (`-v`).
type Logger = aya_log::EbpfLogger<&'static dyn log::Log>;

/// The recording loop's clocks.
struct Clocks {
    /// Maps snapshots refreshed, eBPF log flushed.
    refresh: tokio::time::Interval,
    /// Targets looked for (discovery).
    scan: tokio::time::Interval,
    /// Cost windows and the throttle.
    second: tokio::time::Interval,
    /// When [`Recording::every_second`] last ran (from the clock or between batch steps).
    last_second: std::time::Instant,
    /// Duty cycling's slot boundaries (idle without it).
    duty: tokio::time::Interval,
}

impl Clocks {
    fn new(duty_cycled: bool) -> Clocks {
        let slot = if duty_cycled {
            duty_cycling::SLOT
        } else {
            Duration::from_secs(3600)
        };
        let mut duty = tokio::time::interval_at(tokio::time::Instant::now() + slot, slot);
        // A boundary missed while the loop was busy is taken late, not as a burst of empty
        // slots.
        duty.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Clocks {
            refresh: tokio::time::interval(Duration::from_millis(250)),
            scan: tokio::time::interval(Duration::from_secs(1)),
            second: tokio::time::interval(Duration::from_secs(1)),
            // The clock's first tick is at once: a second ago, so that it runs then.
            last_second: std::time::Instant::now()
                .checked_sub(Duration::from_secs(1))
                .unwrap_or_else(std::time::Instant::now),
            duty,
        }
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
