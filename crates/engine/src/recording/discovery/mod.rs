//! Finding and taking in targets while recording: attaching per process (`-p`, `-- CMD`),
//! admitting new processes into the kernel's followed set and probing their allocator files
//! for every process (`--follow`, `--comm`), the /proc scans of `--comm` and `--all`, the
//! fork and exec events the kernel reports, and what each process's coverage is.

mod carriers;
mod discovered;
mod lineage;

pub(super) use carriers::Carriers;
pub(super) use discovered::Discovered;

use log::{debug, info, warn};
use sampler_common::{FOLLOWED_PENDING, FOLLOWED_TARGET, HOST_SLOT};

use super::{CoveredSince, Recording};
use crate::{
    collect::monotonic_ns,
    preflight,
    probe::{
        allocator::Allocator,
        attach::{AttachedPoint, Scope},
    },
    profile::{Coverage, CoverageStart},
    sys::maps::{self, FileId},
    targets::{self, FindError},
    text,
};

impl Recording {
    /// Maps `pid`'s in-process region if it carries the front end (see
    /// [`super::super::in_process::InProcess::map`]).
    fn map_front_end(&mut self, pid: u32, allocators: &[Allocator], forked_from: u32) {
        // File-wide probes must leave its calls to its front end. Allocscope's library says
        // so itself when it starts (`allocscope:ready`), and a fork inherits it in the
        // kernel: nothing to read then (most processes; a lookup, not two /proc reads).
        // This covers one that started before the probes were attached, and another
        // producer's.
        let serves = |found: &[Allocator]| found.iter().any(|a| a.file.reports_itself());
        let knows = |pid| self.probes.as_ref().is_some_and(|p| p.knows_front_end(pid));
        let known = knows(pid);
        // A fork of a parent the kernel knows to carry it was marked at its fork (the
        // kernel copies the mark); unmarked now, it exec'd since (the kernel forgets at
        // exec), and its exec event, next, decides. Looked at now, its maps may not show
        // the library yet (its loader has not mapped it), and a mark its library's start
        // set meanwhile would be taken back.
        let exec_pending = !known && forked_from != 0 && knows(forked_from);
        // Under a seccomp filter, a program it exec'd since `allocators` were found has a
        // dormant library (see `sampler-preload`'s `sandbox`): its maps say.
        let carries = !known
            && !exec_pending
            && serves(allocators)
            && (crate::sys::process::seccomp_mode(pid) == Some(0)
                || self.cache.of_pid(pid).is_ok_and(|found| serves(&found)));
        if carries {
            if let Some(probes) = self.probes.as_mut() {
                if let Err(e) = probes.carries_front_end(pid) {
                    warn!("pid {pid}: its front end may be counted twice: {e}");
                }
                // `allocators` may be older than an exec that dropped the library (read at
                // the fork, the kernel's exec probe has forgotten the front end since): the
                // mapping is looked at again after the kernel was told. An exec after this
                // look makes the kernel forget it itself.
                if !allocators
                    .iter()
                    .any(|a| serves(std::slice::from_ref(a)) && maps::maps_file(pid, &a.file_id))
                {
                    debug!("pid {pid}: exec'd without its front end since its maps were read");
                    probes.lacks_front_end(pid);
                }
            }
        }
        self.watch_patched(pid, allocators);
        let target = self.discovered.is_running(pid);
        self.in_process.map(
            pid,
            allocators,
            target,
            &mut self.accounting.counters,
            &mut self.aggregation.processes,
        );
    }

    /// Attaches `allocators` in process `pid` (new ones only, if it is attached already)
    /// and starts watching it; `since`: from when it is covered, if it is new. A process
    /// that vanishes meanwhile is an error for the caller to report and move on.
    pub(super) fn attach(
        &mut self,
        pid: u32,
        allocators: &[Allocator],
        since: CoveredSince,
    ) -> anyhow::Result<()> {
        let allocators = &self.as_patched(pid, allocators);
        if self.discovered.followed_only() {
            return self.admit(pid, Some(allocators), since);
        }
        // A process whose region is mapped carries the front end, even in the moment
        // after an exec when its maps show the executable and not the library yet; unless
        // it is under a seccomp filter, where the library of a new program stays dormant
        // (with the library mapped, `find` has told a dormant one from a working one).
        let mut allocators = allocators.to_vec();
        let known = self.accounting.counters.has_region(pid)
            && crate::sys::process::seccomp_mode(pid) == Some(0);
        crate::probe::allocator::behind_front_end(&mut allocators, known);
        let allocators = allocators.as_slice();
        let (slot, new) = self.discovered.slot_for(pid)?;
        let fresh = self.not_probed_yet(pid, allocators);
        // Its own counts start before the probes that sample it: a sample taken before the
        // region's baseline would count in the estimate and not in the exact count.
        self.map_front_end(pid, allocators, since.parent);
        let probed =
            self.read_or_probed(pid, allocators, new && since.start == CoverageStart::Attach);
        // The ring buffer is not read meanwhile: the time is logged, to be kept short.
        let started = std::time::Instant::now();
        let attached = self
            .probes_mut()?
            .add(Scope::Process { pid, slot }, &probed);
        // Its loader may have mapped more since it was read (attaching takes milliseconds).
        crate::sys::moment::renew();
        let points = match attached {
            Ok(points) => {
                self.accounting.counters.probes_attached(pid);
                points
            }
            Err(e) => {
                if new {
                    self.probes_mut()?.remove(pid).close_in_background();
                    self.discovered.give_back(slot);
                }
                if !crate::sys::process::exists(pid) {
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
                self.discovered.give_back(slot);
                anyhow::bail!("exited while the probes were being attached ({e})");
            }
            self.aggregation.track(pid);
            log_attached(pid, since, started, allocators);
            let coverage = Coverage {
                since: since.start,
                late: Vec::new(),
                checked: true,
            };
            self.discovered.enter(pid, slot, coverage, monotonic_ns());
        } else {
            let exec_ns = (since.start == CoverageStart::Exec).then_some(since.timestamp_ns);
            self.discovered
                .note_late_since(pid, &fresh, exec_ns, monotonic_ns());
        }
        self.add_allocators(pid, allocators);
        Ok(())
    }

    /// Of `allocators` of `pid`, the files it has not been probed (or read) in yet (a path
    /// may differ, /lib or /usr/lib: the file is the same).
    fn not_probed_yet(&self, pid: u32, allocators: &[Allocator]) -> Vec<Allocator> {
        let Some(probes) = self.probes.as_ref() else {
            return Vec::new();
        };
        allocators
            .iter()
            .filter(|a| !probes.probes_file(pid, &a.file_id))
            .filter(|a| !(a.file.is_go_runtime() && self.go_readers.reads(pid)))
            .cloned()
            .collect()
    }

    /// Of `allocators` of `pid`, those to probe: a Go runtime is read instead, not probed,
    /// if it is already, or if it can be and `may_read` (a process running before, found
    /// as it is first attached, or again after an exec; not a command's, whose exit would
    /// take its last reading's samples with it).
    fn read_or_probed(
        &mut self,
        pid: u32,
        allocators: &[Allocator],
        may_read: bool,
    ) -> Vec<Allocator> {
        allocators
            .iter()
            .filter(|a| {
                // One read in its program before an exec is read in the new one.
                let may_read = may_read || self.go_readers.restarts(pid);
                let read = a.file.is_go_runtime()
                    && (self.go_readers.reads(pid) || (may_read && self.go_readers.start(pid, a)));
                !read
            })
            .cloned()
            .collect()
    }

    /// `--follow`, `--comm`: makes `pid` a target. The kernel counts it from now on if it
    /// did not already (a new process of a followed one is counted from its fork, one that
    /// exec'd from its exec, before either ran: the file-wide probes count every process in
    /// the followed set). The allocator files it uses that are not probed yet are probed
    /// now (for every process: this recording's new processes may use them at once), and
    /// noted late in its coverage. `allocators`: `None` when it was gone before they could
    /// be read.
    pub(super) fn admit(
        &mut self,
        pid: u32,
        allocators: Option<&[Allocator]>,
        since: CoveredSince,
    ) -> anyhow::Result<()> {
        if !self.discovered.is_running(pid) {
            if !self.probeless {
                self.probes_mut()?.follow(pid)?;
            }
            let coverage = Coverage {
                since: since.start,
                late: Vec::new(),
                checked: allocators.is_some(),
            };
            self.discovered
                .enter(pid, HOST_SLOT, coverage, since.timestamp_ns);
            if !self.aggregation.processes.tracks(pid) {
                self.aggregation.track(pid);
            }
            if self.watcher.watch(pid).is_err() {
                // Gone already (its counters and samples are in): finalized at once.
                self.watcher.report(pid);
            }
            info!(
                "following pid {pid} ({}) from its {:?}",
                text::printable(&crate::sys::process::comm_of(pid).unwrap_or_default()),
                since.start
            );
        }
        let allocators = allocators.map(|a| self.as_patched(pid, a));
        let allocators = allocators.as_deref();
        self.map_front_end(pid, allocators.unwrap_or_default(), since.parent);
        if let Some(allocators) = allocators {
            self.cache.remember(pid, allocators);
            self.probe_files(allocators)?;
            self.discovered.note_late(pid, allocators, monotonic_ns());
            self.add_allocators(pid, allocators);
        }
        Ok(())
    }

    /// Probes for every process the allocator files not probed yet, noting when.
    pub(super) fn probe_files(&mut self, allocators: &[Allocator]) -> anyhow::Result<()> {
        if self.probeless {
            return Ok(());
        }
        for allocator in allocators {
            // Patched by the processes that run it (see `super::patched`): not probed.
            if self.discovered.probes_host_file(&allocator.file_id)
                || (self.carriers.is_some() && !Carriers::probes(allocator))
                || allocator.file.patched_in_process
            {
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
                    self.discovered
                        .host_file_probed(allocator.file_id.clone(), monotonic_ns());
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
    pub(super) fn probe_system_allocators(&mut self) {
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
    pub(super) fn discover(&mut self) -> anyhow::Result<()> {
        self.claim_regions(None);
        self.in_process
            .sweep(&self.accounting.counters, &self.discovered);
        self.check_patched();
        if let Some(carriers) = self.carriers.as_mut() {
            carriers.sweep();
        }
        if self.targets.all {
            self.scan_host()?;
        } else if self.targets.comm.is_some() {
            self.scan_comm();
        }
        for pid in self.discovered.running() {
            // The command released but not yet past its exec is still a copy of us: its
            // maps are ours (our C library, not its front end), not its program's.
            if self.command.is(pid) && crate::sys::own::runs_our_image(pid) {
                continue;
            }
            // As the loader leaves it: a program just past its exec is not counted as
            // lacking the in-process front end it is about to load.
            if let Ok(allocators) = self.allocators_of(pid) {
                if let Err(e) =
                    self.attach(pid, &allocators, CoveredSince::now(CoverageStart::Attach))
                {
                    debug!("pid {pid}: late allocators: {e:#}");
                }
            }
        }
        if self.discovered.followed_only() {
            self.forget_rejected()?;
        }
        Ok(())
    }

    /// `followed_only`: drops the kernel's counters of the processes it counted pending a
    /// decision and that were not taken (one may have been re-created by a probe that ran
    /// while it was being dropped), and forgets those that exited.
    fn forget_rejected(&mut self) -> anyhow::Result<()> {
        if self.probeless {
            return Ok(());
        }
        for pid in self.discovered.excluded() {
            self.probes_mut()?.forget_counters(pid);
            if !crate::sys::process::exists(pid) {
                self.discovered.forget_excluded(pid);
            }
        }
        Ok(())
    }

    /// The processes a scan has not looked at since they started or exec'd.
    fn unscanned(&mut self) -> Vec<u32> {
        let alive = crate::sys::process::all_pids()
            .into_iter()
            .map(|pid| {
                let exe = crate::sys::process::exe_metadata(pid).ok();
                (pid, exe.as_ref().map(FileId::of))
            })
            .collect();
        self.discovered.unscanned(alive)
    }

    /// `--comm`: attaches to new processes whose name matches, excluded ones and
    /// ourselves aside.
    fn scan_comm(&mut self) {
        for pid in self.unscanned() {
            self.consider_comm(pid, None, CoveredSince::now(CoverageStart::Attach));
        }
        if self.discovered.none_running() && !self.said_waiting {
            self.said_waiting = true;
            if let Some(pattern) = &self.targets.comm {
                crate::say!(
                    "allocscope: no process matches --comm {:?} yet: waiting for one to start",
                    pattern.0.as_str()
                );
            }
        } else if !self.discovered.none_running() {
            self.said_waiting = false;
        }
    }

    /// `--comm`: makes `pid` a target when `comm`, its name (`None`: read it now), matches
    /// and it is not excluded. Returns whether it is a target now.
    pub(super) fn consider_comm(
        &mut self,
        pid: u32,
        comm: Option<&str>,
        mut since: CoveredSince,
    ) -> bool {
        let standing = || self.probes.as_ref()?.standing(pid);
        if self.discovered.followed_only()
            && since.start == CoverageStart::Attach
            && standing() == Some(FOLLOWED_PENDING)
        {
            // Found by a scan before its exec event was read: counted since its exec.
            since.start = CoverageStart::Exec;
        }
        let Some(comm) = comm
            .map(str::to_owned)
            .or_else(|| crate::sys::process::comm_of(pid))
        else {
            return false;
        };
        let Some(pattern) = &self.targets.comm else {
            return false;
        };
        if !pattern.0.is_match(&comm) || self.targets.excludes(pid, &comm) {
            return false;
        }
        let taken = match self.carried(pid, &comm) {
            Ok(allocators) => self.attach(pid, &allocators, since),
            // Only carriers counted: one gone before it was looked at counted nothing.
            Err(FindError::Gone) if self.carriers.is_some() => return false,
            // Counted by the kernel from its exec: what it did is in, whatever it used.
            Err(FindError::Gone) if self.discovered.followed_only() => self.admit(pid, None, since),
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
        let target = self.discovered.is_running(pid);
        if target {
            self.aggregation.processes.name_if_unknown(pid, &comm);
        }
        target
    }

    /// The allocators of `pid` ([`Self::allocators_of`]); with only carriers counted, after
    /// loading the library into it (see [`Carriers::loaded_into`]).
    pub(super) fn carried(&mut self, pid: u32, comm: &str) -> Result<Vec<Allocator>, FindError> {
        let found = self.allocators_of(pid)?;
        match self.carriers.as_mut() {
            Some(carriers) => carriers.loaded_into(
                pid,
                comm,
                found,
                &mut self.cache,
                &mut self.aggregation.processes,
            ),
            None => Ok(found),
        }
    }

    /// The allocators of `pid`; for a program that has just exec'd and whose libraries
    /// the dynamic loader has not mapped yet, those it is about to map (the in-process
    /// front end first when it will load it: see [`super::super::in_process::InProcess::will_load`]).
    pub(super) fn allocators_of(&mut self, pid: u32) -> Result<Vec<Allocator>, FindError> {
        let (mut found, before_loader) = match self.cache.of_pid(pid) {
            Err(FindError::NoAllocator(why)) => {
                let exe = crate::sys::process::exe_path(pid);
                let mut found = preflight::allocators_for_command(&exe, &mut self.cache)
                    .map_err(|_| FindError::NoAllocator(why))?;
                // Named as its maps will name it (a note said "/proc/PID/exe" beside the
                // same file's name, once probed).
                if let Some(shown) = crate::sys::process::executable_of(pid) {
                    for allocator in found.iter_mut().filter(|a| a.in_executable) {
                        allocator.shown.clone_from(&shown);
                    }
                }
                (found, true)
            }
            found => (found?, false),
        };
        if found.iter().any(|a| a.file.is_in_process()) {
            return Ok(found);
        }
        if let Some(library) = self.in_process.will_load(pid) {
            found.push(library);
            crate::probe::allocator::behind_front_end(&mut found, true);
        } else if let Some(settled) = before_loader.then(|| self.once_loaded(pid)).flatten() {
            // Its libraries as mapped, or gone meanwhile (nothing to probe then).
            return settled;
        } else if before_loader && crate::sys::process::secure_execution(pid) == Some(false) {
            // What its LD_PRELOAD names comes first (a jemalloc put there).
            for path in crate::sys::process::preloaded(pid) {
                if let Some(allocator) = self.cache.of_file(&path, false) {
                    found.insert(0, allocator);
                }
            }
        }
        Ok(found)
    }

    /// The allocators `pid` maps once its dynamic loader has mapped its libraries (preloaded
    /// ones first, so the front end is there by then if it is to be), waiting up to ~0.1 s,
    /// or why they cannot be (it exited meanwhile); `None` if it has not by then. For a
    /// program just past its exec that [`super::super::in_process::InProcess::will_load`] did not
    /// see loading the front end: the answer is in its maps a moment later. Before, such a
    /// program (a short-lived `readlink` of pyenv's shims, gone by the time it was looked
    /// at) got the glibc its executable names probed file-wide for the whole family, every
    /// process of which then paid the trap on each call its front end already counted.
    fn once_loaded(&mut self, pid: u32) -> Option<Result<Vec<Allocator>, FindError>> {
        // Its libraries are mapped within a millisecond or two; under load (or stopped)
        // later: the ring buffer is drained on its own thread meanwhile.
        for _ in 0..100 {
            std::thread::sleep(std::time::Duration::from_millis(1));
            crate::sys::moment::renew();
            match self.cache.of_pid(pid) {
                Err(FindError::NoAllocator(_)) => continue,
                settled => return Some(settled),
            }
        }
        None
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
        if self.discovered.is_excluded(pid) {
            return Ok(true);
        }
        let Some(comm) = crate::sys::process::comm_of(pid) else {
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
    pub(super) fn first_seen(&mut self, pid: u32) {
        if self.discovered.followed_only() {
            self.first_seen_followed(pid);
            return;
        }
        match self.excludes(pid) {
            Ok(true) => {}
            Ok(false) => {
                self.aggregation.track(pid);
                self.discovered.seen(pid);
            }
            Err(e) => warn!("pid {pid}: the kernel was not told to skip it ({e:#}); its samples are dropped here"),
        }
    }

    /// `followed_only`: samples of a process not heard of (its fork or exec event was
    /// lost, the ring buffer being full): the kernel's followed set says what it is.
    fn first_seen_followed(&mut self, pid: u32) {
        if self.discovered.is_excluded(pid) {
            return;
        }
        let since = CoveredSince::now(CoverageStart::Unknown);
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
        if self.discovered.exclude(pid) {
            self.probes_mut()?.exclude(pid)?;
        }
        Ok(())
    }

    pub(super) fn consider_host(&mut self, pid: u32) -> anyhow::Result<()> {
        if self.excludes(pid)? {
            return Ok(());
        }
        let Ok(allocators) = self.cache.of_pid(pid) else {
            return Ok(());
        };
        self.add_allocators(pid, &allocators);
        // One that counts its own calls: its region mapped before its samples can come,
        // and the file-wide probes told to leave its calls to it.
        if Carriers::carried(&allocators) {
            self.map_front_end(pid, &allocators, 0);
        }
        self.probe_files(&allocators)
    }

    /// `followed_only`: `pid`, counted by the kernel pending a decision (or a new process
    /// of a target that is excluded), is not a target: the kernel forgets it, and what it
    /// sent is dropped.
    pub(super) fn reject(&mut self, pid: u32) {
        if self.discovered.is_running(pid) {
            return;
        }
        if let Some(probes) = self.probes.as_mut() {
            probes.unfollow(pid);
        }
        self.discovered.exclude(pid);
    }
}

/// Says that `pid` was attached to, in how long (the ring buffer is not read meanwhile),
/// and how late after the event that made it a target: what it allocated before was not
/// seen (its counters say how much the probes caught).
fn log_attached(
    pid: u32,
    since: CoveredSince,
    started: std::time::Instant,
    allocators: &[Allocator],
) {
    let after = monotonic_ns().saturating_sub(since.timestamp_ns);
    let late = match since.start {
        CoverageStart::Attach => String::new(),
        event => format!(", {:.1} ms after its {event:?}", after as f64 / 1e6),
    };
    info!(
        "attached to pid {pid} ({}) in {:.1} ms{late}: {}",
        text::printable(&crate::sys::process::comm_of(pid).unwrap_or_default()),
        started.elapsed().as_secs_f64() * 1e3,
        describe(allocators)
    );
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
