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
//! [`accounting`]: its probes detach, its exact counters are read and its counter slot is
//! reused; its frames still resolve (the files stay open, see [`crate::stacks`]).
//!
//! The loop's components own their state and their `impl`: [`intake`] (events until the
//! cutoff), [`aggregation`] (samples per stack, processes, symbols), [`accounting`] (exact
//! counts and losses), [`cost_control`] (the trap, the statistics windows, the throttle,
//! duty cycling) and [`command`] (the command started). Discovery's state (what it found, its cache,
//! probe points, the in-process tree, carriers) is `Recording`'s own: each of its steps
//! attaches probes, tracks in the aggregation and moves counter slots at once (design.md
//! §0 and §12).

mod accounting;
mod aggregation;
mod command;
mod cost_control;
mod discovery;
mod duty_cycling;
mod early_intake;
mod front_end;
mod go_readers;
mod in_process;
mod intake;
mod load;
mod patched;
mod prepare;
mod start;

use front_end::FrontEnd;
pub use prepare::{prepare, Prepared};

use std::{collections::BTreeSet, time::Duration};

use anyhow::Context as _;
use log::warn;

use crate::{
    collect::{monotonic_ns, Event},
    cost::windows::CostStep,
    exits,
    probe::attach::{AttachedPoint, Probes},
    profile::{CoverageStart, PeriodStart, ProbePoint, Profile, Settings, Snapshot},
    settings::Targets,
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

/// A target's exit, which the caller acts on (what [`Recording::next`] returns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetExit {
    /// A target exited (its samples so far stay; its frames resolve with its last maps).
    One(u32),
    /// The last target exited, and no new one can come (`-p`, `-- CMD`).
    All,
}

/// From when a process is covered: the event that made it a target (a fork, an exec, the
/// start of our command, or our attaching), and when (CLOCK_MONOTONIC ns).
#[derive(Clone, Copy, Debug)]
struct CoveredSince {
    start: CoverageStart,
    timestamp_ns: u64,
    /// A fork's parent (0: not a fork).
    parent: u32,
}

impl CoveredSince {
    fn now(start: CoverageStart) -> CoveredSince {
        CoveredSince {
            start,
            timestamp_ns: monotonic_ns(),
            parent: 0,
        }
    }
}

/// Probes attached to the targets, samples flowing into an [`crate::profile::Aggregator`].
pub struct Recording {
    probes: Option<Probes>,
    /// Never attached: the command's tree exited while the probes loaded, and every event
    /// is an early record, every count a region's (see [`early_intake::load_unless_gone`]).
    probeless: bool,
    /// The ring buffer's events, until the cutoff.
    intake: intake::Intake,
    /// Samples per stack, processes' descriptions, frames resolved.
    aggregation: aggregation::Aggregation,
    targets: Targets,
    cache: AllocatorCache,
    watcher: exits::Watcher,
    /// The targets, their slots and coverage, the processes left out.
    discovered: discovery::Discovered,
    /// Exact counts and losses, as last read.
    accounting: accounting::Accounting,
    /// Every probe point attached.
    points: Vec<AttachedPoint>,
    clocks: Clocks,
    /// The command the recording started, if any, and how it ended.
    command: command::Command,
    said_waiting: bool,
    /// What the probes cost, the throttle and duty cycling.
    cost: cost_control::CostControl,
    /// The command's tree counted in-process.
    in_process: in_process::InProcess,
    /// `--front-end in-process` with `--comm` or `--all`: only carriers are counted.
    carriers: Option<discovery::Carriers>,
    /// Go processes read, not probed.
    go_readers: go_readers::GoReaders,
    /// Where the current period started (the agent's periods).
    period: crate::profile::PeriodStart,
    /// The processes gone when the last period's counts were read: forgotten once it is
    /// sent ([`Self::forget_gone`]).
    gone_at_period: BTreeSet<u32>,
}

impl Recording {
    fn probes_mut(&mut self) -> anyhow::Result<&mut Probes> {
        self.probes.as_mut().context("the probes are detached")
    }

    /// Every process attached so far (host-wide: every one seen allocating).
    pub fn pids(&self) -> &[u32] {
        self.discovered.pids()
    }

    /// What is being recorded, for people: "pid 12, 13 and the processes they start".
    pub fn describe(&self) -> String {
        let pids = || crate::text::pid_list(&self.discovered.running());
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
        settings: Settings,
        period_seconds: Option<f64>,
    ) -> anyhow::Result<Profile> {
        Ok(self
            .snapshot(settings, period_seconds)
            .await?
            .into_profile())
    }

    /// The profile of the current period alone, `seconds` long (the agent's periods):
    /// allocations, counts and losses since the last call, what is held at its end; a new
    /// period starts with the call.
    pub async fn period_profile(
        &mut self,
        settings: Settings,
        seconds: f64,
    ) -> anyhow::Result<Profile> {
        self.gone_at_period = self.gone_now();
        let whole = self.snapshot(settings, None).await?;
        let start = std::mem::replace(&mut self.period, PeriodStart::of(&whole));
        self.start_period();
        let mut profile = whole.period_only(&start, seconds).into_profile();
        profile.period = true;
        Ok(profile)
    }

    /// Everything a profile of the recording so far is built from (see [`Self::profile`]).
    async fn snapshot(
        &mut self,
        mut settings: Settings,
        period_seconds: Option<f64>,
    ) -> anyhow::Result<Snapshot> {
        settings.largest_interval = settings.largest_interval.max(self.largest_interval());
        let (counters, losses) = self.counters().await?;
        self.in_process.note_patches(
            &self.accounting.counters,
            &mut self.aggregation.processes,
            None,
        );
        let now_ns = self.intake.cutoff_ns().unwrap_or_else(monotonic_ns);
        let open_stratum = self.open_stratum();
        let leak_age = settings.leaks_older_than.filter(|_| !settings.alloc_only);
        let tally = self
            .aggregation
            .tally(
                &self.accounting.lost,
                open_stratum.as_ref(),
                now_ns,
                leak_age,
            )
            .await;
        let targets = crate::profile::target_uses(&tally, &counters);
        let calls = targets.iter().map(|t| t.calls).sum();
        let overhead =
            self.cost
                .overhead(self.file_wide(), calls, settings.duration_seconds, &targets);
        let coverage = targets
            .iter()
            .filter_map(|t| Some((t.pid, self.discovered.coverage(t.pid)?.clone())))
            .collect();
        Ok(Snapshot {
            tally,
            settings,
            counters,
            losses,
            period_seconds,
            probes: self.probe_points(),
            throttle: self.cost.throttle_record(),
            duty: self.cost.duty_record(now_ns),
            thread_states: self.thread_states(),
            coverage,
            overhead: Some(overhead),
        })
    }

    /// When counting began (a command that ran while its probes loaded: when it was let
    /// go, before [`Recording::start`] returned).
    pub fn began(&self) -> std::time::Instant {
        self.command.began
    }

    /// When every target was gone, if they all exited while the probes were being
    /// attached (the recording's duration ends there, not when the loop noticed).
    pub fn ended_early(&self) -> Option<std::time::Instant> {
        self.command.ended
    }

    /// Every process anything is kept for that is gone now. Looked for before a period's
    /// counts are read, so that all these did is in that period.
    fn gone_now(&self) -> BTreeSet<u32> {
        let mut known = self.aggregation.known();
        known.extend(self.accounting.known());
        known.extend(self.discovered.pids());
        known.extend(self.discovered.excluded());
        let own = std::process::id();
        known
            .into_iter()
            .filter(|&pid| pid != own && !crate::sys::process::exists(pid))
            .collect()
    }

    /// Forgets every process that was gone when the last period's counts were read (the
    /// agent, once that period is sent): a recording that runs for days keeps only what
    /// its running processes need. One that exited since is forgotten after the next.
    pub fn forget_gone(&mut self) -> usize {
        let dead = std::mem::take(&mut self.gone_at_period);
        // Duty cycling's strata sum over the whole recording (and is not the agent's).
        if self.cost.duty_cycled() {
            return 0;
        }
        let listed: BTreeSet<u32> = self.discovered.pids().iter().copied().collect();
        let mut gone = self.discovered.forget_gone(|pid| !dead.contains(&pid));
        // Host-wide, most processes are never targets (never sampled, or left alone):
        // what is kept of them (their kernel counters, allocators, maps) goes when they
        // do, or it would grow with every process that ever ran.
        gone.extend(dead.iter().filter(|pid| !listed.contains(pid)));
        // Processes left alone (host mode) that exited: their exclusion goes too.
        let mut in_kernel = gone.clone();
        for pid in self.discovered.excluded() {
            if dead.contains(&pid) {
                self.discovered.forget_excluded(pid);
                in_kernel.insert(pid);
            }
        }
        if let Some(probes) = self.probes.as_mut().filter(|_| !in_kernel.is_empty()) {
            match crate::collect::forget::forget_in_kernel(&mut probes.ebpf, &in_kernel) {
                Ok(entries) => log::debug!("forgot {entries} kernel entries of gone processes"),
                Err(e) => log::warn!("forgetting gone processes in the kernel's tables: {e:#}"),
            }
        }
        self.period.forget(&in_kernel);
        self.intake.reader().forget(in_kernel.iter().copied());
        if gone.is_empty() {
            return 0;
        }
        self.aggregation.forget(&gone);
        self.accounting.forget(&gone);
        self.points.retain(|point| !gone.contains(&point.pid));
        let (stacks, live) = self.aggregation.sizes();
        log::debug!(
            "kept after forgetting: {} processes known, {} listed, {} running, {stacks} stacks, {live} live blocks",
            self.aggregation.known().len(),
            self.discovered.pids().len(),
            self.discovered.running_count(),
        );
        gone.len()
    }

    /// Starts a new period for per-period values (`--every` snapshots).
    pub fn start_period(&mut self) {
        self.aggregation.start_period(&self.accounting.lost);
    }

    /// The samples so far, per stack and process, frames resolved (`top`'s picture);
    /// `leak_age`: blocks older than this count as leak suspects.
    pub async fn tally(&mut self, leak_age: Option<Duration>) -> crate::profile::Tally {
        let open_stratum = self.open_stratum();
        self.aggregation
            .tally(
                &self.accounting.lost,
                open_stratum.as_ref(),
                monotonic_ns(),
                leak_age,
            )
            .await
    }

    /// The largest sampling interval in force so far (the throttle may have raised it).
    pub fn largest_interval(&self) -> u64 {
        self.cost.largest_interval()
    }

    /// Whether processes that are not targets hit the probes too (file-wide probes).
    fn file_wide(&self) -> bool {
        self.targets.all || self.discovered.followed_only()
    }

    /// The probes' cost per allocation call of the targets, as the statistics windows so
    /// far measured it (the trap alone before the first window closes).
    pub fn ns_per_call(&self) -> f64 {
        self.cost.ns_per_call(self.file_wide())
    }

    /// How the command started for this recording ended (known once detached).
    pub fn command_exit(&self) -> Option<CommandExit> {
        self.command.exit
    }

    /// Whether the command started for the recording exited before the recording stopped.
    pub fn command_ended_on_its_own(&self) -> bool {
        matches!(self.command.exit, Some(CommandExit::OnItsOwn(_)))
    }

    /// Entries of the kernel's per-thread state map at the last counter read.
    pub(crate) fn thread_states(&self) -> Option<u64> {
        self.accounting.thread_states
    }

    /// Every probe point attached so far, as profiles report them.
    pub(crate) fn probe_points(&self) -> Vec<ProbePoint> {
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
    pub async fn next(&mut self) -> anyhow::Result<TargetExit> {
        loop {
            tokio::select! {
                read = self.intake.read() => {
                    read?;
                    self.take_batch_in_steps()?;
                }
                _ = self.clocks.go.tick(), if self.go_readers.any() => self.read_go_profiles()?,
                _ = self.clocks.refresh.tick() => {
                    self.aggregation.refresh();
                    self.intake.flush_log();
                }
                _ = self.clocks.scan.tick() => self.discover()?,
                _ = self.clocks.second.tick() => self.every_second()?,
                _ = self.clocks.duty.tick(), if self.cost.duty_cycled() => self.duty_slot().await?,
                Some(pid) = self.watcher.exited.recv() => {
                    self.finalize(pid).await?;
                    let waits = self.targets.waits_for_new();
                    return Ok(if self.discovered.none_running() && !waits {
                        TargetExit::All
                    } else {
                        TargetExit::One(pid)
                    });
                }
            }
        }
    }

    /// Takes the batch a few thousand events at a time, doing the once-a-second work
    /// between steps when it is due: a ring buffer's worth of samples takes the aggregator
    /// seconds to unwind in a storm (32k samples), and the throttle must answer the storm
    /// within a second, not after it (#29: its first change came seconds late;
    /// docs/performance.md, "Figures quoted from the code").
    fn take_batch_in_steps(&mut self) -> anyhow::Result<()> {
        const STEP: usize = 2048;
        let batch = self.intake.take();
        if batch.len() <= STEP {
            self.route(batch);
            return Ok(());
        }
        let mut events = batch.into_iter();
        loop {
            let step: Vec<Event> = events.by_ref().take(STEP).collect();
            if step.is_empty() {
                return Ok(());
            }
            self.route(step);
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
        self.aggregation.advance(crate::collect::monotonic_ns());
        let Some(step) = self.cost.tick() else {
            return Ok(());
        };
        let Some((counters, losses)) = self.exact_counts()? else {
            return Ok(());
        };
        let calls = counters.values().map(|c| c.calls).sum();
        match step {
            CostStep::Open => {
                if let Some(probes) = &self.probes {
                    self.cost.open_window(|| probes.program_runs(), calls);
                }
            }
            CostStep::Check if self.cost.window_done(calls) => self.close_cost_window(calls),
            _ => {}
        }
        let bytes = counters.values().map(|c| c.bytes).sum();
        let samples = self.intake.samples() + losses.ringbuf_full;
        let now = monotonic_ns();
        if let Some(interval) = self
            .cost
            .throttle_tick(now, bytes, samples, losses.ringbuf_full)
        {
            self.set_interval(interval);
        }
        Ok(())
    }

    /// Sets the mean sampling interval the throttle chose: the kernel's, and the in-process
    /// regions'. A failure keeps the interval in force: the recording goes on (and is saved).
    fn set_interval(&mut self, interval: u64) {
        if let Some(probes) = self.probes.as_mut() {
            if let Err(e) = probes.set_rate(interval) {
                warn!("the sampling interval stays as it was: {e}");
                return;
            }
        }
        self.in_process
            .set_interval(interval, &self.accounting.counters);
    }

    /// Closes the open statistics window with the programs' runs now.
    fn close_cost_window(&mut self, calls: u64) {
        if let Some(probes) = &self.probes {
            self.cost.close_window(probes.program_runs(), calls);
        }
    }

    /// Describes `pid`'s allocators; a Go runtime whose totals can be read has the kernel
    /// read them at its exit too (its memory is gone by the time user space looks).
    fn add_allocators(&mut self, pid: u32, allocators: &[crate::probe::allocator::Allocator]) {
        use crate::schema::CoverageStart;
        // Recorded from its exec with nothing probed late: its runtime's counts are ours.
        let from_start = self.discovered.coverage(pid).is_some_and(|c| {
            matches!(c.since, CoverageStart::Start | CoverageStart::Exec) && c.late.is_empty()
        });
        let watch = self
            .aggregation
            .processes
            .add_allocators(pid, allocators, from_start);
        if self.go_readers.reads(pid) {
            for allocator in allocators.iter().filter(|a| a.file.is_go_runtime()) {
                let processes = &mut self.aggregation.processes;
                processes.read_not_probed(pid, &allocator.file_id);
            }
        }
        if let (Some(at), Some(probes)) = (watch, self.probes.as_mut()) {
            if let Err(e) = probes.watch_go_stats(pid, at) {
                warn!("pid {pid}: its Go runtime's totals will not be read at its exit: {e}");
            }
        }
    }

    /// Takes the intake's batch in at once (see [`Self::route`]).
    fn take_batch(&mut self) {
        let batch = self.intake.take();
        self.route(batch);
    }

    /// Routes `batch`: control events (a process forked or exec'd, a process's maps) to
    /// discovery and the stack table, first; then data events (samples, frees) to the
    /// aggregator.
    fn route(&mut self, mut batch: Vec<Event>) {
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
                } => self.aggregation.offer_maps(pid, read_ns, text),
                Event::GoStats {
                    pid,
                    ref bytes,
                    rate,
                    at_exec,
                    timestamp_ns,
                } => {
                    let processes = &mut self.aggregation.processes;
                    if at_exec {
                        processes.go_stats_at_exec(pid, bytes, timestamp_ns);
                    } else {
                        processes.go_stats_at_exit(pid, bytes, rate);
                    }
                }
                Event::Alloc(ref sample) => {
                    // A process counted in-process may be gone before its maps are read
                    // from /proc: its library's own copy stands in (the newer one wins).
                    self.region_for_sample(sample.pid);
                    if let Some((text, read_ns)) = self.accounting.counters.new_maps(sample.pid) {
                        self.aggregation.offer_maps(sample.pid, read_ns, &text);
                    }
                    if !self.aggregation.processes.tracks(sample.pid) {
                        self.first_seen(sample.pid);
                    }
                }
                _ => {}
            }
        }
        // Data events go on to the aggregator (those of processes left out dropped); the
        // control events were discovery's and the stack table's, above.
        let discovered = &self.discovered;
        batch.retain(|event| match event {
            Event::Alloc(sample) => !discovered.is_excluded(sample.pid),
            Event::Free(freed) => !discovered.is_excluded(freed.pid),
            Event::Process { .. }
            | Event::Maps { .. }
            | Event::PythonFrames(_)
            | Event::GoStats { .. } => false,
        });
        self.aggregation.add_all(batch);
    }

    /// Reads the Go processes that are read, not probed, and takes their events in.
    fn read_go_profiles(&mut self) -> anyhow::Result<()> {
        let events = self.go_readers.read_all();
        if !events.is_empty() {
            self.intake.extend(events);
            self.take_batch_in_steps()?;
        }
        Ok(())
    }

    /// Moves every sample waiting in the ring buffer into the aggregator.
    pub(crate) async fn catch_up(&mut self) -> anyhow::Result<()> {
        self.intake.catch_up().await?;
        self.take_batch();
        Ok(())
    }

    /// Detaches every probe (the targets stop paying for them now). A command started for
    /// this recording and still running is stopped with SIGTERM (it stops with the
    /// recording, as it would if we died: see [`crate::spawn`]); its exit is kept for
    /// [`Self::command_exit`]. Reads the counters one last time first; later calls return
    /// those values.
    pub async fn detach(&mut self) -> anyhow::Result<Closing> {
        if !self.counting() {
            return Ok(Closing(None));
        }
        // The Go processes read, a last time: what they did until now is in.
        self.read_go_profiles()?;
        for (pid, note) in self.go_readers.all_losses() {
            self.aggregation.processes.incomplete(pid, note);
        }
        let (counters, _) = self.counters().await?;
        self.end_duty(&counters);
        self.close_cost_window(counters.values().map(|c| c.calls).sum());
        self.intake.cut_off(self.accounting.counted_ns);
        let nobody_left = self.discovered.none_running();
        let closing = self
            .probes
            .take()
            .and_then(|probes| probes.close_in_background(nobody_left));
        self.command.reap_or_stop();
        self.aggregation.report();
        self.intake.report();
        Ok(Closing(closing))
    }
}

/// The eBPF programs' log (`-v`).
type Logger = aya_log::EbpfLogger<&'static dyn log::Log>;

/// The recording loop's clocks.
struct Clocks {
    /// Maps snapshots refreshed, eBPF log flushed.
    refresh: tokio::time::Interval,
    /// Go processes' heap profiles read.
    go: tokio::time::Interval,
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
            crate::duty::SLOT
        } else {
            Duration::from_secs(3600)
        };
        let mut duty = tokio::time::interval_at(tokio::time::Instant::now() + slot, slot);
        // A boundary missed while the loop was busy is taken late, not as a burst of empty
        // slots.
        duty.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Clocks {
            refresh: tokio::time::interval(Duration::from_millis(250)),
            go: tokio::time::interval(go_readers::READ_EVERY),
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

/// The probes' links being closed after [`Recording::detach`]: closing each waits for the
/// kernel's grace periods (docs/performance.md, "What a recording cost, measured"), so they
/// close while the profile is built and written; dropping this waits for
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
