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
//! Targets change while recording: `--follow` and `--comm` probe allocator files for every
//! process and let the kernel count its followed set, which a new process enters before it
//! runs (this module decides on each fork and exec it hears of, see [`Recording::admit`]);
//! `--comm` and `--all` also scan /proc every second for processes running before; every
//! target's maps are re-read for allocators loaded late. A process that exits is finalized:
//! its probes detach, its exact counters are read and its counter slot is reused; its frames
//! still resolve (the files stay open, see [`crate::stacks`]).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Duration,
};

use anyhow::Context as _;
use aya::maps::{PerCpuArray, PerCpuHashMap, PerCpuValues, RingBuf};
use log::{debug, info, warn};
use sampler_common::{ProcessCounters, FOLLOWED_PENDING, FOLLOWED_TARGET, HOST_SLOT, MAX_TARGETS};

use crate::{
    collect::{self, monotonic_ns, Event, Losses, SampleReader},
    config::{BadInput, SamplingConfig, Targets},
    exits, preflight,
    probe::{
        allocator::Allocator,
        attach::{AttachedPoint, KernelConfig, Probes, ReturnProbes, Scope, Target},
        maps::FileId,
    },
    profile::{Coverage, CoverageStart, LateAllocator, ProbePoint, Profile, Recorder, Settings},
    spawn::{self, PausedChild},
    stacks::symbolize::Symbolizer,
    targets::{self, AllocatorCache, FindError},
    text,
};

/// Everything prepared before the runtime starts: validated targets and, for `-- CMD`, the
/// paused child.
pub struct Prepared {
    targets: Targets,
    initial: Vec<Target>,
    child: Option<PausedChild>,
    command: String,
    cache: AllocatorCache,
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
    if !targets.command.is_empty() {
        let program = preflight::resolve_command(&targets.command[0])?;
        let allocators = preflight::allocators_for_command(&program, &mut cache)?;
        initial.push(Target { pid: 0, allocators });
    }
    check()?;
    let mut child = None;
    let mut command = String::new();
    if let Some(program) = targets.command.first() {
        command = program.to_string_lossy().into_owned();
        let paused = spawn::spawn_paused(&targets.command, redirect()?)
            .map_err(|e| BadInput(format!("cannot start {command}: {e}")))?;
        if let Some(target) = initial.last_mut() {
            target.pid = paused.pid;
        }
        child = Some(paused);
    }
    Ok(Prepared {
        targets: targets.clone(),
        initial,
        child,
        command,
        cache,
    })
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

/// Probes attached to the targets, samples flowing into a [`Recorder`].
pub struct Recording {
    probes: Option<Probes>,
    reader: SampleReader,
    batch: Vec<Event>,
    /// The samples so far.
    pub recorder: Recorder,
    /// Resolves frames for [`Recorder::profile`].
    pub symbolizer: Symbolizer,
    targets: Targets,
    cache: AllocatorCache,
    watcher: exits::Watcher,
    /// Attached processes still running → their counter slot.
    running: BTreeMap<u32, u32>,
    /// Every process ever attached (or seen host-wide), in order.
    pids: Vec<u32>,
    free_slots: Vec<u32>,
    next_slot: u32,
    /// Final counters of processes that exited (their slots were reused).
    finished: BTreeMap<u32, ProcessCounters>,
    /// `--follow`, `--comm`: allocator files are probed for every process, and the kernel
    /// counts those in its followed set (see [`Self::admit`]).
    followed_only: bool,
    /// Host mode and `followed_only`: allocator files probed for every process, and when
    /// (CLOCK_MONOTONIC ns).
    host_files: HashMap<FileId, u64>,
    /// Host mode: processes left alone (allocscope, `--exclude-*`); `followed_only`:
    /// processes the kernel counted pending a decision and that are not targets. What
    /// they sent is dropped here.
    excluded: HashSet<u32>,
    /// How each target is covered, and from when (CLOCK_MONOTONIC ns).
    coverage: HashMap<u32, (Coverage, u64)>,
    /// Processes looked at by a scan, with the executable they had then (an exec makes
    /// them new again).
    scanned: HashMap<u32, FileId>,
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
    /// Once detaching: samples and frees after this moment are dropped, so the profile
    /// covers exactly what the final counters cover (removing a breakpoint takes the kernel
    /// milliseconds, and the probes still fire meanwhile).
    cutoff_ns: Option<u64>,
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
        } = prepared;
        let followed_only = !targets.all && (targets.follow || targets.comm.is_some());
        let kernel = KernelConfig {
            interval: sampling.interval,
            log: sampling.verbose,
            track_frees: (!sampling.alloc_only).then_some(sampling.max_tracked),
            ring_buffer: sampling.ring_buffer,
            stack_bytes: sampling.unwind.stack_bytes(),
            sessions: sampling.sessions,
            host: targets.all || followed_only,
            follow: targets.follow,
            followed_only,
            watch_execs: targets.waits_for_new(),
        };
        let mut probes = Probes::load(kernel).context("loading the eBPF programs")?;
        debug!("allocation returns observed by: {:?}", probes.returns);
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
                .take_map("SAMPLES")
                .context("SAMPLES map missing")?,
        )?;
        let reader = SampleReader::new(ring, sampling.ring_buffer as usize)?;
        let mut recorder = match recent {
            Some(window) => Recorder::with_recent(window),
            None => Recorder::default(),
        };
        recorder.limit_stacks(sampling.max_stacks);
        let mut recording = Recording {
            probes: Some(probes),
            reader,
            batch: Vec::new(),
            recorder,
            symbolizer: Symbolizer::spawn(&sampling.debug_dirs)
                .context("starting the symbolizer thread")?,
            targets,
            cache,
            watcher: exits::Watcher::new(),
            running: BTreeMap::new(),
            pids: Vec::new(),
            free_slots: Vec::new(),
            next_slot: 0,
            finished: BTreeMap::new(),
            followed_only,
            host_files: HashMap::new(),
            excluded: HashSet::new(),
            coverage: HashMap::new(),
            scanned: HashMap::new(),
            points: Vec::new(),
            logger,
            refresh: tokio::time::interval(Duration::from_millis(250)),
            scan: tokio::time::interval(Duration::from_secs(1)),
            spawned: child.as_ref().map(|c| c.pid),
            command_exit: None,
            said_waiting: false,
            last_counters: None,
            counted_ns: 0,
            thread_states: None,
            cutoff_ns: None,
        };
        if followed_only {
            recording.probe_system_allocators();
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
            recording.recorder.track(pid);
        }
        recording.discover()?;
        if recording.running.is_empty() && !recording.targets.waits_for_new() {
            anyhow::bail!("every target exited while the probes were being attached");
        }
        Ok(recording)
    }

    fn probes_mut(&mut self) -> anyhow::Result<&mut Probes> {
        self.probes.as_mut().context("the probes are detached")
    }

    /// How allocation returns are observed (`None` once detached).
    pub fn returns(&self) -> Option<ReturnProbes> {
        self.probes.as_ref().map(|p| p.returns)
    }

    /// Every process attached so far (host-wide: every one seen allocating).
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// What is being recorded, for people: "pid 12, 13 and the processes they start".
    pub fn describe(&self) -> String {
        let pids = || {
            self.running
                .keys()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let what = if self.targets.all {
            "every process".to_owned()
        } else if let Some(pattern) = &self.targets.comm {
            format!("processes named like {:?}", pattern.0.as_str())
        } else {
            format!("pid {}", pids())
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
        let (counters, losses) = self.counters().await?;
        let now_ns = self.cutoff_ns.unwrap_or_else(monotonic_ns);
        let mut profile = self
            .recorder
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
        profile.thread_states = self.thread_states();
        for process in &mut profile.processes {
            process.coverage = self.coverage.get(&process.pid).map(|(c, _)| c.clone());
        }
        Ok(profile)
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

    /// Attaches `allocators` in process `pid` (new ones only, if it is attached already)
    /// and starts watching it; `since`: from when it is covered, if it is new. A process
    /// that vanishes meanwhile is an error for the caller to report and move on.
    fn attach(&mut self, pid: u32, allocators: &[Allocator], since: Since) -> anyhow::Result<()> {
        if self.followed_only {
            return self.admit(pid, Some(allocators), since);
        }
        let new = !self.running.contains_key(&pid);
        let slot = match self.running.get(&pid) {
            Some(&slot) => slot,
            None => match self.free_slots.pop() {
                Some(slot) => slot,
                None if self.next_slot < MAX_TARGETS => {
                    self.next_slot += 1;
                    self.next_slot - 1
                }
                None => {
                    anyhow::bail!("{MAX_TARGETS} processes attached at once: no counter slot left")
                }
            },
        };
        // The ring buffer is not read meanwhile: the time is logged, to be kept short.
        let started = std::time::Instant::now();
        let attached = self
            .probes_mut()?
            .add(Scope::Process { pid, slot }, allocators);
        let points = match attached {
            Ok(points) => points,
            Err(e) => {
                if new {
                    self.probes_mut()?.remove(pid).close_in_background();
                    self.free_slots.push(slot);
                }
                if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                    anyhow::bail!("exited while the probes were being attached");
                }
                return Err(e.into());
            }
        };
        for point in &points {
            log_point(point);
        }
        self.points.extend(points);
        if new {
            if let Err(e) = self.watcher.watch(pid) {
                self.probes_mut()?.remove(pid).close_in_background();
                self.free_slots.push(slot);
                anyhow::bail!("exited while the probes were being attached ({e})");
            }
            self.running.insert(pid, slot);
            if !self.pids.contains(&pid) {
                self.pids.push(pid);
            }
            self.recorder.track(pid);
            // What it allocated before this moment was not seen (its counters say how much
            // the probes caught): how late they came is worth knowing.
            let after = monotonic_ns().saturating_sub(since.timestamp_ns);
            let late = match since.start {
                CoverageStart::Attach => String::new(),
                event => format!(", {:.1} ms after its {event:?}", after as f64 / 1e6),
            };
            info!(
                "attached to pid {pid} ({}) in {:.1} ms{late}: {}",
                text::printable(&targets::comm_of(pid).unwrap_or_default()),
                started.elapsed().as_secs_f64() * 1e3,
                describe(allocators)
            );
            let coverage = Coverage {
                since: since.start,
                late: Vec::new(),
                checked: true,
            };
            self.coverage.insert(pid, (coverage, monotonic_ns()));
        } else {
            self.note_late(pid, allocators);
        }
        self.recorder.add_allocators(pid, allocators);
        Ok(())
    }

    /// `--follow`, `--comm`: makes `pid` a target. The kernel counts it from now on if it
    /// did not already (a new process of a followed one is counted from its fork, one that
    /// exec'd from its exec, before either ran: the file-wide probes count every process in
    /// the followed set). The allocator files it uses that are not probed yet are probed
    /// now (for every process: this recording's new processes may use them at once), and
    /// noted late in its coverage. `allocators`: `None` when it was gone before they could
    /// be read.
    fn admit(
        &mut self,
        pid: u32,
        allocators: Option<&[Allocator]>,
        since: Since,
    ) -> anyhow::Result<()> {
        if !self.running.contains_key(&pid) {
            self.probes_mut()?.follow(pid)?;
            self.excluded.remove(&pid);
            self.running.insert(pid, HOST_SLOT);
            if !self.pids.contains(&pid) {
                self.pids.push(pid);
            }
            let coverage = Coverage {
                since: since.start,
                late: Vec::new(),
                checked: allocators.is_some(),
            };
            self.coverage.insert(pid, (coverage, since.timestamp_ns));
            if !self.recorder.tracks(pid) {
                self.recorder.track(pid);
            }
            if self.watcher.watch(pid).is_err() {
                // Gone already (its counters and samples are in): finalized at once.
                self.watcher.report(pid);
            }
            info!(
                "following pid {pid} ({}) from its {:?}",
                text::printable(&targets::comm_of(pid).unwrap_or_default()),
                since.start
            );
        }
        if let Some(allocators) = allocators {
            self.probe_files(allocators)?;
            self.note_late(pid, allocators);
            self.recorder.add_allocators(pid, allocators);
        }
        Ok(())
    }

    /// Notes in `pid`'s coverage the allocator files it uses that were probed after it was
    /// covered from (file-wide), or that it gained after being attached (per process: a
    /// library loaded later, found by the next look).
    fn note_late(&mut self, pid: u32, allocators: &[Allocator]) {
        let Some((coverage, from_ns)) = self.coverage.get_mut(&pid) else {
            return;
        };
        let now = monotonic_ns();
        for allocator in allocators {
            let name = allocator.describe();
            if coverage.late.iter().any(|late| late.allocator == name) {
                continue;
            }
            let probed_ns = if self.followed_only {
                // Late if probed after the kernel began counting the process (or not at all).
                let probed = self.host_files.get(&allocator.file_id).copied();
                match probed.unwrap_or(now) {
                    ns if ns > *from_ns => ns,
                    _ => continue,
                }
            } else if self.recorder.has_allocator(pid, &name) {
                continue;
            } else {
                // Per process: a file it did not have when attached, probed just now.
                now
            };
            coverage.late.push(LateAllocator {
                allocator: name,
                after_ms: probed_ns.saturating_sub(*from_ns) as f64 / 1e6,
            });
        }
    }

    /// Probes for every process the allocator files not probed yet, noting when.
    fn probe_files(&mut self, allocators: &[Allocator]) -> anyhow::Result<()> {
        for allocator in allocators {
            if self.host_files.contains_key(&allocator.file_id) {
                continue;
            }
            match self
                .probes_mut()?
                .add(Scope::Host, std::slice::from_ref(allocator))
            {
                Ok(points) => {
                    info!("probing {} for every process", allocator.describe());
                    points.iter().for_each(log_point);
                    self.points.extend(points);
                    self.host_files
                        .insert(allocator.file_id.clone(), monotonic_ns());
                }
                Err(e) => debug!("{}: {e:#}", allocator.describe()),
            }
        }
        Ok(())
    }

    /// `--follow`, `--comm`: probes, before any target runs, this system's C library (ours)
    /// and the other allocator libraries installed in the usual library directories, so
    /// that a new process that loads one is covered from its first call too. Each costs
    /// the trap only to the processes that use it.
    fn probe_system_allocators(&mut self) {
        let mut found = self.cache.of_pid(std::process::id()).unwrap_or_default();
        for path in targets::system_allocator_libraries() {
            if let Some(allocator) = self.cache.of_file(&path, false) {
                found.push(allocator);
            }
        }
        if let Err(e) = self.probe_files(&found) {
            warn!("probing this system's allocators: {e:#}");
        }
    }

    /// Looks for new targets (`--comm`, `--all`) and for allocators the current targets
    /// loaded since they were attached.
    fn discover(&mut self) -> anyhow::Result<()> {
        if self.targets.all {
            self.scan_host()?;
        } else if self.targets.comm.is_some() {
            self.scan_comm();
        }
        let running: Vec<u32> = self.running.keys().copied().collect();
        for pid in running {
            if let Ok(allocators) = self.cache.of_pid(pid) {
                if let Err(e) = self.attach(pid, &allocators, Since::now(CoverageStart::Attach)) {
                    debug!("pid {pid}: late allocators: {e:#}");
                }
            }
        }
        if self.followed_only {
            self.forget_rejected()?;
        }
        Ok(())
    }

    /// `followed_only`: drops the kernel's counters of the processes it counted pending a
    /// decision and that were not taken (one may have been re-created by a probe that ran
    /// while it was being dropped), and forgets those that exited.
    fn forget_rejected(&mut self) -> anyhow::Result<()> {
        let rejected: Vec<u32> = self.excluded.iter().copied().collect();
        for pid in rejected {
            self.probes_mut()?.forget_counters(pid);
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                self.excluded.remove(&pid);
            }
        }
        Ok(())
    }

    /// The processes a scan has not looked at since they started or exec'd.
    fn unscanned(&mut self) -> Vec<u32> {
        let pids = targets::all_pids();
        let alive: HashSet<u32> = pids.iter().copied().collect();
        self.scanned.retain(|pid, _| alive.contains(pid));
        pids.into_iter()
            .filter(|&pid| {
                let Ok(exe) = std::fs::metadata(format!("/proc/{pid}/exe")) else {
                    return false; // a kernel thread, or gone
                };
                let id = FileId::of(&exe);
                self.scanned.insert(pid, id.clone()) != Some(id)
            })
            .collect()
    }

    /// `--comm`: attaches to new processes whose name matches, excluded ones and
    /// ourselves aside.
    fn scan_comm(&mut self) {
        for pid in self.unscanned() {
            self.consider_comm(pid, None, Since::now(CoverageStart::Attach));
        }
        if self.running.is_empty() && !self.said_waiting {
            self.said_waiting = true;
            if let Some(pattern) = &self.targets.comm {
                eprintln!(
                    "allocscope: no process matches --comm {:?} yet: waiting for one to start",
                    pattern.0.as_str()
                );
            }
        } else if !self.running.is_empty() {
            self.said_waiting = false;
        }
    }

    /// `--comm`: makes `pid` a target when `comm`, its name (`None`: read it now), matches
    /// and it is not excluded. Returns whether it is a target now.
    fn consider_comm(&mut self, pid: u32, comm: Option<&str>, mut since: Since) -> bool {
        let standing = || self.probes.as_ref()?.standing(pid);
        if self.followed_only
            && since.start == CoverageStart::Attach
            && standing() == Some(FOLLOWED_PENDING)
        {
            // Found by a scan before its exec event was read: counted since its exec.
            since.start = CoverageStart::Exec;
        }
        let Some(comm) = comm.map(str::to_owned).or_else(|| targets::comm_of(pid)) else {
            return false;
        };
        let Some(pattern) = &self.targets.comm else {
            return false;
        };
        if !pattern.0.is_match(&comm) || self.targets.excludes(pid, &comm) {
            return false;
        }
        let taken = match self.allocators_of(pid) {
            Ok(allocators) => self.attach(pid, &allocators, since),
            // Counted by the kernel from its exec: what it did is in, whatever it used.
            Err(FindError::Gone) if self.followed_only => self.admit(pid, None, since),
            Err(FindError::Gone | FindError::KernelThread) => return false,
            Err(e) => {
                warn!(
                    "pid {pid} ({}) matches --comm but: {e}",
                    text::printable(&comm)
                );
                return false;
            }
        };
        if let Err(e) = taken {
            warn!("pid {pid} ({}): {e:#}", text::printable(&comm));
        }
        let target = self.running.contains_key(&pid);
        if target {
            self.recorder.name_if_unknown(pid, &comm);
        }
        target
    }

    /// The allocators of `pid`; for a program that has just exec'd and whose libraries
    /// the dynamic loader has not mapped yet, those it is about to map.
    fn allocators_of(&mut self, pid: u32) -> Result<Vec<Allocator>, FindError> {
        match self.cache.of_pid(pid) {
            Err(FindError::NoAllocator(why)) => {
                let exe = std::path::PathBuf::from(format!("/proc/{pid}/exe"));
                preflight::allocators_for_command(&exe, &mut self.cache)
                    .map_err(|_| FindError::NoAllocator(why))
            }
            found => found,
        }
    }

    /// `--all`: probes each allocator file of each new process once, for every process;
    /// excluded processes (and allocscope) are told to the kernel, which skips them.
    fn scan_host(&mut self) -> anyhow::Result<()> {
        self.exclude(std::process::id())?;
        let pids = self.unscanned();
        // Every excluded process first, so none is sampled once the first file is probed.
        for &pid in &pids {
            self.excludes(pid)?;
        }
        for pid in pids {
            self.consider_host(pid)?;
        }
        Ok(())
    }

    /// Host mode: whether `pid` is to be left alone; if so, the kernel is told.
    fn excludes(&mut self, pid: u32) -> anyhow::Result<bool> {
        if self.excluded.contains(&pid) {
            return Ok(true);
        }
        let Some(comm) = targets::comm_of(pid) else {
            return Ok(false);
        };
        if !self.targets.excludes(pid, &comm) {
            return Ok(false);
        }
        self.exclude(pid)?;
        Ok(true)
    }

    /// Host-wide: a process sampled for the first time is tracked, unless it is to be left
    /// alone (an excluded name it exec'd into since the last scan is caught here).
    fn first_seen(&mut self, pid: u32) {
        if self.followed_only {
            self.first_seen_followed(pid);
            return;
        }
        match self.excludes(pid) {
            Ok(true) => {}
            Ok(false) => {
                self.recorder.track(pid);
                self.pids.push(pid);
            }
            Err(e) => warn!("pid {pid}: the kernel was not told to skip it ({e:#}); its samples are dropped here"),
        }
    }

    /// `followed_only`: samples of a process not heard of (its fork or exec event was
    /// lost, the ring buffer being full): the kernel's followed set says what it is.
    fn first_seen_followed(&mut self, pid: u32) {
        if self.excluded.contains(&pid) {
            return;
        }
        let since = Since::now(CoverageStart::Unknown);
        match self.probes.as_ref().and_then(|p| p.standing(pid)) {
            Some(FOLLOWED_TARGET) => {
                let allocators = self.allocators_of(pid).ok();
                if let Err(e) = self.admit(pid, allocators.as_deref(), since) {
                    warn!("followed pid {pid}: {e:#}");
                }
            }
            Some(FOLLOWED_PENDING) if self.consider_comm(pid, None, since) => {}
            _ => self.reject(pid),
        }
    }

    fn exclude(&mut self, pid: u32) -> anyhow::Result<()> {
        if self.excluded.insert(pid) {
            self.probes_mut()?.exclude(pid)?;
        }
        Ok(())
    }

    fn consider_host(&mut self, pid: u32) -> anyhow::Result<()> {
        if self.excludes(pid)? {
            return Ok(());
        }
        let Ok(allocators) = self.cache.of_pid(pid) else {
            return Ok(());
        };
        self.recorder.add_allocators(pid, &allocators);
        self.probe_files(&allocators)
    }

    /// A followed process forked (`parent` ≠ 0), or a process exec'd (a followed one, or
    /// any with `--comm` and `--all`); `comm`: its name then.
    fn on_process(&mut self, pid: u32, parent: u32, timestamp_ns: u64, comm: &str) {
        let since = Since {
            start: if parent == 0 {
                CoverageStart::Exec
            } else {
                CoverageStart::Fork
            },
            timestamp_ns,
        };
        if self.followed_only {
            self.on_followed(pid, parent, comm, since);
            return;
        }
        if self.targets.exclude_pids.contains(&pid) {
            return;
        }
        if parent == 0 && !self.running.contains_key(&pid) {
            // Not a target (yet): a new program for `--all` to look at now.
            if let Err(e) = self.consider_host(pid) {
                warn!("looking at new process {pid}: {e:#}");
            }
            return;
        }
        match self.allocators_of(pid) {
            Ok(allocators) => {
                if let Err(e) = self.attach(pid, &allocators, since) {
                    debug!("followed pid {pid}: {e:#}");
                } else if parent == 0 {
                    // An exec: a new name and executable, maybe new allocators.
                    self.recorder.track(pid);
                }
            }
            Err(FindError::Gone | FindError::KernelThread) => {}
            Err(e) => warn!("followed pid {pid}: {e}"),
        }
    }

    /// `followed_only`: a process the kernel already counts (a new process of a target,
    /// as a target; one that exec'd, as a target still or pending) is made a target or
    /// dropped. A new process of a target is one (unless excluded), and so is a target that
    /// exec'd; another that exec'd is one if `--comm` matches its new name.
    fn on_followed(&mut self, pid: u32, parent: u32, comm: &str, since: Since) {
        let target = if parent != 0 {
            self.running.contains_key(&parent)
        } else {
            self.running.contains_key(&pid)
        };
        if target && !self.targets.excludes(pid, comm) {
            let allocators = self.allocators_of(pid).ok();
            if parent != 0 {
                self.recorder.track_fork(pid, parent);
            } else {
                // A new name and executable: tracked afresh, its new files noted from now.
                self.recorder.track(pid);
                if let Some((_, from_ns)) = self.coverage.get_mut(&pid) {
                    *from_ns = since.timestamp_ns;
                }
            }
            if let Err(e) = self.admit(pid, allocators.as_deref(), since) {
                warn!("followed pid {pid}: {e:#}");
            }
            self.recorder.name_if_unknown(pid, comm);
        } else if !self.consider_comm(pid, Some(comm), since) {
            self.reject(pid);
        }
    }

    /// `followed_only`: `pid`, counted by the kernel pending a decision (or a new process
    /// of a target that is excluded), is not a target: the kernel forgets it, and what it
    /// sent is dropped.
    fn reject(&mut self, pid: u32) {
        if self.running.contains_key(&pid) {
            return;
        }
        if let Some(probes) = self.probes.as_mut() {
            probes.unfollow(pid);
        }
        self.excluded.insert(pid);
    }

    /// Takes samples until a target exits. Cancel-safe: every record read is in the
    /// recorder before the next await.
    pub async fn next(&mut self) -> anyhow::Result<Happening> {
        loop {
            tokio::select! {
                read = self.reader.read(&mut self.batch) => {
                    read?;
                    self.take_batch();
                }
                _ = self.refresh.tick() => {
                    // Keep the maps snapshot current while targets live (libraries loaded
                    // late, a spawned command just past exec), and flush eBPF log records.
                    self.recorder.refresh();
                    if let Some(logger) = self.logger.as_mut() {
                        logger.flush();
                    }
                }
                _ = self.scan.tick() => self.discover()?,
                Some(pid) = self.watcher.exited.recv() => {
                    self.finalize(pid).await?;
                    let waits = self.targets.waits_for_new();
                    return Ok(if self.running.is_empty() && !waits {
                        Happening::AllExited
                    } else {
                        Happening::Exited(pid)
                    });
                }
            }
        }
    }

    /// Moves the batch into the recorder, acting on process events first.
    fn take_batch(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        if let Some(cutoff) = self.cutoff_ns {
            batch.retain(|event| match event {
                Event::Alloc(sample) => sample.timestamp_ns <= cutoff,
                Event::Free(freed) => freed.timestamp_ns <= cutoff,
                Event::Process { .. } | Event::Maps { .. } => true,
            });
        }
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
                } => self.recorder.offer_maps(pid, read_ns, text),
                Event::Alloc(ref sample) if !self.recorder.tracks(sample.pid) => {
                    self.first_seen(sample.pid)
                }
                _ => {}
            }
        }
        if !self.excluded.is_empty() {
            batch.retain(|event| match event {
                Event::Alloc(sample) => !self.excluded.contains(&sample.pid),
                Event::Free(freed) => !self.excluded.contains(&freed.pid),
                Event::Process { .. } | Event::Maps { .. } => true,
            });
        }
        self.recorder.add_all(batch);
    }

    /// A target exited: its probes go, its exact counters are kept and its slot reused.
    async fn finalize(&mut self, pid: u32) -> anyhow::Result<()> {
        self.catch_up().await?;
        self.recorder.mark_exited(pid);
        let Some(slot) = self.running.remove(&pid) else {
            return Ok(());
        };
        let Some(probes) = self.probes.as_mut() else {
            return Ok(());
        };
        let last = if slot == HOST_SLOT {
            // Counted by file-wide probes: nothing to detach. Its entry goes, so that a
            // later process given the same pid starts from zero.
            info!("pid {pid} exited: its counters are kept");
            let map = probes
                .ebpf
                .map("HOST_COUNTERS")
                .context("HOST_COUNTERS map missing")?;
            let last = collect::read_host_counter(&PerCpuHashMap::try_from(map)?, pid)?;
            probes.forget_counters(pid);
            last
        } else {
            info!("pid {pid} exited: its probes go, its counters are kept");
            probes.remove(pid).close_in_background();
            self.reset_slot(pid, slot)?
        };
        let before = self.finished.get(&pid).copied().unwrap_or_default();
        self.finished.insert(pid, add(before, last));
        Ok(())
    }

    /// Reads the last counts of `pid` from its counter slot, then zeroes the slot and
    /// makes it free for another process.
    fn reset_slot(&mut self, pid: u32, slot: u32) -> anyhow::Result<ProcessCounters> {
        let probes = self.probes_mut()?;
        let last = {
            let map = probes
                .ebpf
                .map("COUNTERS")
                .context("COUNTERS map missing")?;
            collect::read_counters(&PerCpuArray::try_from(map)?, &[(pid, slot)])?
        };
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        let zeros = PerCpuValues::try_from(vec![ProcessCounters::default(); cpus])?;
        let map = probes
            .ebpf
            .map_mut("COUNTERS")
            .context("COUNTERS map missing")?;
        let mut counters: PerCpuArray<_, ProcessCounters> = PerCpuArray::try_from(map)?;
        counters.set(slot, zeros, 0)?;
        self.free_slots.push(slot);
        Ok(last.get(&pid).copied().unwrap_or_default())
    }

    /// Moves every sample waiting in the ring buffer into the recorder.
    pub async fn catch_up(&mut self) -> anyhow::Result<()> {
        self.reader.catch_up(&mut self.batch).await?;
        self.take_batch();
        Ok(())
    }

    /// Catches up, then reads the kernel's exact counters per process and the loss counters
    /// (after detaching: the values read last), and hands the samples the kernel could not
    /// deliver to the recorder.
    pub async fn counters(&mut self) -> anyhow::Result<(BTreeMap<u32, ProcessCounters>, Losses)> {
        self.catch_up().await?;
        let mut lost = None;
        if let Some(probes) = &self.probes {
            let slots: Vec<(u32, u32)> = self
                .running
                .iter()
                .filter(|(_, &slot)| slot != HOST_SLOT)
                .map(|(&p, &s)| (p, s))
                .collect();
            self.counted_ns = monotonic_ns();
            let mut counters = {
                let map = probes
                    .ebpf
                    .map("COUNTERS")
                    .context("COUNTERS map missing")?;
                collect::read_counters(&PerCpuArray::try_from(map)?, &slots)?
            };
            if self.targets.all || self.followed_only {
                let map = probes
                    .ebpf
                    .map("HOST_COUNTERS")
                    .context("HOST_COUNTERS map missing")?;
                let host = collect::read_host_counters(&PerCpuHashMap::try_from(map)?)?;
                for (pid, c) in host {
                    // Followed: only targets (the kernel also counts, briefly, processes
                    // pending a decision, and one we have not heard of yet).
                    let target = !self.followed_only || self.running.contains_key(&pid);
                    if self.excluded.contains(&pid) || !target {
                        continue;
                    }
                    let total = add(counters.get(&pid).copied().unwrap_or_default(), c);
                    counters.insert(pid, total);
                }
            }
            for (&pid, &c) in &self.finished {
                let total = add(counters.get(&pid).copied().unwrap_or_default(), c);
                counters.insert(pid, total);
            }
            let losses = {
                let map = probes.ebpf.map("LOSSES").context("LOSSES map missing")?;
                collect::read_losses(&PerCpuArray::try_from(map)?)?
            };
            if let Some(map) = probes.ebpf.map("THREADS") {
                let threads: aya::maps::HashMap<_, u32, sampler_common::ThreadState> =
                    aya::maps::HashMap::try_from(map)?;
                self.thread_states = Some(threads.keys().filter(Result::is_ok).count() as u64);
            }
            lost = {
                let map = probes.ebpf.map("LOST").context("LOST map missing")?;
                Some(collect::read_lost(&PerCpuHashMap::try_from(map)?)?)
            };
            self.last_counters = Some((counters, losses));
        }
        if let Some(mut lost) = lost {
            lost.retain(|pid, _| !self.excluded.contains(pid));
            for &pid in lost.keys() {
                if !self.recorder.tracks(pid) {
                    self.first_seen(pid);
                }
            }
            self.recorder.set_lost(lost);
        }
        self.last_counters
            .clone()
            .context("the kernel's counters were never read")
    }

    /// Detaches every probe (the targets stop paying for them now). A command started for
    /// this recording and still running is stopped with SIGTERM (it stops with the
    /// recording, as it would if we died: see [`spawn`]); its exit is kept for
    /// [`Self::command_exit`]. Reads the counters one last time first; later calls return
    /// those values.
    pub async fn detach(&mut self) -> anyhow::Result<()> {
        if self.probes.is_none() {
            return Ok(());
        }
        self.counters().await?;
        self.cutoff_ns = Some(self.counted_ns);
        if let Some(logger) = self.logger.as_mut() {
            logger.flush();
        }
        self.logger = None;
        if let Some(probes) = self.probes.as_mut() {
            probes.detach_all();
        }
        self.probes = None;
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
        let (samples, mean_ns, mean_copy) = self.recorder.stack_cost();
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
        Ok(())
    }
}

fn add(a: ProcessCounters, b: ProcessCounters) -> ProcessCounters {
    ProcessCounters {
        calls: a.calls + b.calls,
        bytes: a.bytes + b.bytes,
    }
}

fn describe(allocators: &[Allocator]) -> String {
    allocators
        .iter()
        .map(Allocator::describe)
        .collect::<Vec<_>>()
        .join(", ")
}

fn log_point(point: &AttachedPoint) {
    let how = if point.placement.emulated {
        "emulated"
    } else {
        "single-stepped"
    };
    debug!(
        "probe: pid {} {}+{:#x} at {:#x} in {}: `{}` ({how})",
        point.pid,
        point.probe,
        point.placement.offset,
        point.file_offset,
        point.path.display(),
        point.placement.instruction,
    );
}
