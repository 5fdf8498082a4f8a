//! Finding and taking in targets while recording: attaching per process (`-p`, `-- CMD`),
//! admitting new processes into the kernel's followed set and probing their allocator files
//! for every process (`--follow`, `--comm`), the /proc scans of `--comm` and `--all`, the
//! fork and exec events the kernel reports, and what each process's coverage is.

use std::collections::HashSet;

use log::{debug, info, warn};
use sampler_common::{FOLLOWED_PENDING, FOLLOWED_TARGET, HOST_SLOT, MAX_TARGETS};

use super::{Recording, Since};
use crate::{
    collect::monotonic_ns,
    preflight,
    probe::{
        allocator::Allocator,
        attach::{AttachedPoint, Scope},
        maps::FileId,
    },
    profile::{Coverage, CoverageStart, LateAllocator},
    targets::{self, FindError},
    text,
};

impl Recording {
    /// A process that carries the in-process front end counts its own calls: its region is
    /// mapped (once) and set to the interval in force; in the command's family table when
    /// it claimed a slot there, else found through the library among `allocators`. Without
    /// it the process's counts would be missing, which the summary would show as zero
    /// calls: said loudly instead.
    fn map_front_end(&mut self, pid: u32, allocators: &[Allocator]) {
        if self.counters.has_region(pid) {
            return;
        }
        let carries = allocators.iter().find(|a| a.file.is_in_process());
        let found = match self.family.as_ref().and_then(|f| f.region_of(pid)) {
            Some(found) => found,
            // A process of the command's tree claims its slot when its library starts: one
            // just forked (through vfork, no fork handler runs) or exec'd has not yet. Looked
            // for again at each reading and when it exits.
            None if self.family.is_some() && self.family_full() == 0 => {
                if carries.is_some() || self.running.contains_key(&pid) {
                    self.awaiting_region.insert(pid);
                }
                return;
            }
            None => match carries {
                Some(library) => crate::preload::MappedRegion::of_process(pid, &library.path),
                None => return,
            },
        };
        self.awaiting_region.remove(&pid);
        self.take_region(pid, found);
    }

    /// Counts `pid`'s calls from its region (set to the interval in force), and notes that
    /// the front end measures it; `found`'s error is said loudly.
    fn take_region(&mut self, pid: u32, found: anyhow::Result<crate::preload::MappedRegion>) {
        match found {
            Ok(region) => {
                if let Err(e) = region.set_interval(self.interval) {
                    warn!("pid {pid}: setting its in-process sampler's interval: {e:#}");
                }
                self.counters.add_region(pid, region);
                if let Some((_, library)) = &self.library {
                    let library = library.clone();
                    self.aggregator.add_allocators(pid, std::slice::from_ref(&library));
                }
            }
            Err(e) => warn!(
                "pid {pid}: its in-process sampler's counters cannot be read ({e:#}): its exact counts are missing"
            ),
        }
    }

    fn family_full(&self) -> u64 {
        self.family.as_ref().map_or(0, crate::preload::Family::full)
    }

    /// Maps the regions of the processes that had not claimed theirs when last looked for
    /// (see [`Self::map_front_end`]); `gone`: `pid` has exited, and is looked for one last
    /// time.
    pub(super) fn claim_regions(&mut self, gone: Option<u32>) {
        let pids: Vec<u32> = match gone {
            Some(pid) if self.awaiting_region.contains(&pid) => vec![pid],
            Some(_) => return,
            None => self.awaiting_region.iter().copied().collect(),
        };
        for pid in pids {
            let Some(found) = self.family.as_ref().and_then(|f| f.region_of(pid)) else {
                continue;
            };
            self.awaiting_region.remove(&pid);
            self.take_region(pid, found);
        }
        if let Some(pid) = gone {
            if self.awaiting_region.remove(&pid) {
                // It never counted in the table: its program did not load the library after
                // all (its calls went to its allocator's probes, if any), or it exited
                // before it ran.
                debug!("pid {pid}: exited without an in-process region");
            }
        }
    }

    /// Gives back the family table's slots of processes that are gone and that no target
    /// holds (a target's goes when it is finalized): those found at the previous look,
    /// whose events have been read since, then notes today's.
    pub(super) fn sweep_family(&mut self) {
        let Some(family) = self.family.as_ref() else {
            return;
        };
        let regions = &self.counters;
        for &(slot, word) in &self.family_gone {
            let pid = sampler_common::preload::claim_pid(word);
            if family.holds(slot, word) && !regions.has_region(pid) {
                family.release(slot);
            }
        }
        let running = &self.running;
        let gone = |pid: u32| {
            !regions.has_region(pid)
                && !running.contains_key(&pid)
                && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        };
        self.family_gone = family.claims_of_gone(gone);
        let full = family.full();
        if full > 0 && !self.said_family_full {
            self.said_family_full = true;
            warn!(
                "{full} processes found the in-process sampler's table full ({} at once): \
                 each counts on its own, read while it lives",
                sampler_common::preload::FAMILY_SLOTS
            );
        }
    }

    /// Attaches `allocators` in process `pid` (new ones only, if it is attached already)
    /// and starts watching it; `since`: from when it is covered, if it is new. A process
    /// that vanishes meanwhile is an error for the caller to report and move on.
    pub(super) fn attach(
        &mut self,
        pid: u32,
        allocators: &[Allocator],
        since: Since,
    ) -> anyhow::Result<()> {
        if self.followed_only {
            return self.admit(pid, Some(allocators), since);
        }
        // A process whose region is mapped carries the front end, even in the moment
        // after an exec when its maps show the executable and not the library yet.
        let mut allocators = allocators.to_vec();
        crate::probe::allocator::behind_front_end(&mut allocators, self.counters.has_region(pid));
        let allocators = allocators.as_slice();
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
        // Files it has not been probed in yet (a path may differ, /lib or /usr/lib: the file
        // is the same).
        let fresh: Vec<Allocator> = match self.probes.as_ref() {
            Some(probes) => allocators
                .iter()
                .filter(|a| !probes.probes_file(pid, &a.file_id))
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        // Its own counts start before the probes that sample it: a sample taken before the
        // region's baseline would count in the estimate and not in the exact count.
        self.map_front_end(pid, allocators);
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
            self.aggregator.track(pid);
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
            self.note_late(pid, &fresh);
        }
        self.aggregator.add_allocators(pid, allocators);
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
            if !self.aggregator.tracks(pid) {
                self.aggregator.track(pid);
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
        self.map_front_end(pid, allocators.unwrap_or_default());
        if let Some(allocators) = allocators {
            self.probe_files(allocators)?;
            self.note_late(pid, allocators);
            self.aggregator.add_allocators(pid, allocators);
        }
        Ok(())
    }

    /// Notes in `pid`'s coverage the allocator files it uses that were probed after it was
    /// covered from (file-wide), or, per process, `allocators` it gained after being
    /// attached (a library loaded later, found by the next look, probed just now).
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
    pub(super) fn probe_files(&mut self, allocators: &[Allocator]) -> anyhow::Result<()> {
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
        self.sweep_family();
        if self.targets.all {
            self.scan_host()?;
        } else if self.targets.comm.is_some() {
            self.scan_comm();
        }
        let running: Vec<u32> = self.running.keys().copied().collect();
        for pid in running {
            // As the loader leaves it: a program just past its exec is not counted as
            // lacking the in-process front end it is about to load.
            if let Ok(allocators) = self.allocators_of(pid) {
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
                crate::say!(
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
            self.aggregator.name_if_unknown(pid, &comm);
        }
        target
    }

    /// The allocators of `pid`; for a program that has just exec'd and whose libraries
    /// the dynamic loader has not mapped yet, those it is about to map (the in-process
    /// front end first when it will load it: see [`Self::will_load_front_end`]).
    fn allocators_of(&mut self, pid: u32) -> Result<Vec<Allocator>, FindError> {
        let (mut found, before_loader) = match self.cache.of_pid(pid) {
            Err(FindError::NoAllocator(why)) => {
                let exe = std::path::PathBuf::from(format!("/proc/{pid}/exe"));
                let found = preflight::allocators_for_command(&exe, &mut self.cache)
                    .map_err(|_| FindError::NoAllocator(why))?;
                (found, true)
            }
            found => (found?, false),
        };
        if found.iter().any(|a| a.file.is_in_process()) {
            return Ok(found);
        }
        if let Some(library) = self.will_load_front_end(pid) {
            found.push(library);
            crate::probe::allocator::behind_front_end(&mut found, true);
        } else if before_loader && crate::targets::secure_execution(pid) == Some(false) {
            // What its LD_PRELOAD names comes first (a jemalloc put there).
            for path in preloaded(pid) {
                if let Some(allocator) = self.cache.of_file(&path, false) {
                    found.insert(0, allocator);
                }
            }
        }
        Ok(found)
    }

    /// For `pid`, just past an exec (its loader not run yet, its maps not showing the
    /// library), the library it will load: the command's, named in its `LD_PRELOAD` by a
    /// descriptor it holds, where the loader honours it (a dynamically linked program: the
    /// kernel mapped a dynamic loader; not set-user-ID: no secure-execution auxv flag).
    fn will_load_front_end(&self, pid: u32) -> Option<Allocator> {
        let (library, allocator) = self.library.as_ref()?;
        if !crate::targets::has_dynamic_loader(pid)
            || crate::targets::secure_execution(pid) != Some(false)
        {
            return None;
        }
        let environ = crate::targets::environ_of(pid)?;
        let own = library.preload_path();
        if !crate::targets::ld_preload_entries(&environ).contains(&own.as_bytes()) {
            return None;
        }
        // The descriptor it names must be the library's, in that process.
        let through = format!("/proc/{pid}/fd/{}", own.rsplit('/').next()?);
        let held = std::fs::metadata(&through).ok()?;
        let id = crate::probe::maps::FileId::of(&held);
        (library.file_id().ok()? == id).then(|| allocator.clone())
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
    pub(super) fn first_seen(&mut self, pid: u32) {
        if self.followed_only {
            self.first_seen_followed(pid);
            return;
        }
        match self.excludes(pid) {
            Ok(true) => {}
            Ok(false) => {
                self.aggregator.track(pid);
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
        self.aggregator.add_allocators(pid, &allocators);
        self.probe_files(&allocators)
    }

    /// A followed process forked (`parent` ≠ 0), or a process exec'd (a followed one, or
    /// any with `--comm` and `--all`); `comm`: its name then.
    pub(super) fn on_process(&mut self, pid: u32, parent: u32, timestamp_ns: u64, comm: &str) {
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
                    self.aggregator.track(pid);
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
                self.aggregator.track_fork(pid, parent);
            } else {
                // A new name and executable: tracked afresh, its new files noted from now.
                self.aggregator.track(pid);
                if let Some((_, from_ns)) = self.coverage.get_mut(&pid) {
                    *from_ns = since.timestamp_ns;
                }
            }
            if let Err(e) = self.admit(pid, allocators.as_deref(), since) {
                warn!("followed pid {pid}: {e:#}");
            }
            self.aggregator.name_if_unknown(pid, comm);
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
}

/// The files `pid`'s `LD_PRELOAD` names, through its own root (absolute paths only).
fn preloaded(pid: u32) -> Vec<std::path::PathBuf> {
    let Some(environ) = crate::targets::environ_of(pid) else {
        return Vec::new();
    };
    crate::targets::ld_preload_entries(&environ)
        .into_iter()
        .filter(|path| path.starts_with(b"/"))
        .map(|path| {
            let mut through = std::ffi::OsString::from(format!("/proc/{pid}/root"));
            through.push(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path));
            std::path::PathBuf::from(through)
        })
        .collect()
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
