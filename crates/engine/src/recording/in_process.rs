//! The command's tree counted in-process (`record -- CMD` with the front end): the library
//! its processes load, the family table they claim slots in, and which process's region is
//! mapped, awaited or given back. A process's exact counts come from its region, so each
//! one must be mapped before the probes that sample it (a sample before the region's
//! baseline would count in the estimate and not in the exact count) and read once more
//! after it exits, before its slot is given back.
//!
//! It owns its state and is handed the counters (where regions are read) and the process
//! book (which lists the library among a process's allocators) when it acts.

use std::collections::HashSet;

use log::{debug, warn};

use super::discovery::Discovered;
use crate::{
    collect::Counters,
    preload::{FamilyTable, Library, MappedRegion},
    probe::allocator::Allocator,
    profile::ProcessBook,
};

/// What a process whose in-process counters could not be read leaves out.
const UNREAD: &str = "its in-process sampler's counters could not be read (it counted on its \
     own, outside the family table, and was gone or not set up when looked at): its exact \
     counts are missing";

/// The command's in-process front end while recording (empty without one).
#[derive(Default)]
pub(super) struct InProcess {
    /// The library (kept open while the command may start programs that load it), and
    /// the library as an allocator.
    library: Option<(Library, Allocator)>,
    /// The family table the command's tree counts in.
    family: Option<FamilyTable>,
    /// Slots of the family table (and their claims) whose process was found gone at the
    /// last look and that no target holds: given back at the next (its events are read by
    /// then).
    gone: Vec<(usize, u64)>,
    /// Whether the table was said to be full.
    said_full: bool,
    /// Targets of the command's tree whose region was not claimed yet when looked for.
    awaiting: HashSet<u32>,
    /// The mean interval in force: a region found is set to it.
    interval: u64,
    /// The allocator linked into the command's executable that its processes patch.
    pub(super) patched: Option<Allocator>,
    /// Processes that run the patched file, not yet seen to have patched it, and since
    /// when (see `super::patched`).
    pub(super) watched: std::collections::HashMap<u32, u64>,
    /// The patched file is probed for every process (one ran it unpatched).
    pub(super) fallen_back: bool,
}

impl InProcess {
    /// Without a front end; regions found in processes (a library another recording's
    /// command loaded) are set to `interval`.
    pub(super) fn none(interval: u64) -> InProcess {
        InProcess {
            interval,
            ..InProcess::default()
        }
    }

    /// The command's front end: `library` as `allocator`, its tree counting in `family`.
    pub(super) fn of_command(
        library: Library,
        allocator: Allocator,
        family: FamilyTable,
        interval: u64,
    ) -> InProcess {
        InProcess {
            library: Some((library, allocator)),
            family: Some(family),
            ..InProcess::none(interval)
        }
    }

    /// The family table the command's tree counts in, if any.
    pub(super) fn family(&self) -> Option<&FamilyTable> {
        self.family.as_ref()
    }

    /// The library as an allocator, if the command carries it.
    pub(super) fn allocator(&self) -> Option<&Allocator> {
        self.library.as_ref().map(|(_, allocator)| allocator)
    }

    /// A process that carries the front end counts its own calls: its region is mapped
    /// (once) and set to the interval in force; in the family table when it claimed a slot
    /// there, else found through the library among `allocators`. Without it the process's
    /// counts would be missing, which the summary would show as zero calls: said loudly
    /// instead. `target`: `pid` is a running target.
    pub(super) fn map(
        &mut self,
        pid: u32,
        allocators: &[Allocator],
        target: bool,
        counters: &mut Counters,
        processes: &mut ProcessBook,
    ) {
        if counters.has_region(pid) {
            return;
        }
        let carries = allocators.iter().find(|a| a.file.is_in_process());
        let found = match self.family.as_ref().and_then(|f| f.region_of(pid)) {
            Some(found) => found,
            // A process of the command's tree claims its slot when its library starts: one
            // just forked (through vfork, no fork handler runs) or exec'd has not yet. Looked
            // for again at each reading and when it exits. One in another pid namespace
            // never claims (its pids are not ours): its own region is found instead. One
            // gone already (its status unreadable) is looked for once more at its exit.
            None if self.family.is_some()
                && self.full() == 0
                && crate::sys::process::namespace_pid(pid).is_none_or(|own| own == pid) =>
            {
                if carries.is_some() || target {
                    self.awaiting.insert(pid);
                }
                return;
            }
            None => match carries {
                Some(library) => MappedRegion::of_process(pid, &library.path),
                None => return,
            },
        };
        self.awaiting.remove(&pid);
        self.take(pid, found, counters, processes);
    }

    /// Counts `pid`'s calls from its region (set to the interval in force), and notes that
    /// the front end measures it; `found`'s error is said loudly.
    fn take(
        &mut self,
        pid: u32,
        found: anyhow::Result<MappedRegion>,
        counters: &mut Counters,
        processes: &mut ProcessBook,
    ) {
        match found {
            Ok(region) => {
                if let Err(e) = region.set_interval(self.interval) {
                    warn!("pid {pid}: setting its in-process sampler's interval: {e:#}");
                }
                counters.add_region(pid, region);
                // Read now, after a look that could not (its library not set up yet).
                processes.no_longer_incomplete(pid, UNREAD);
                if let Some(library) = self.allocator() {
                    processes.add_allocators(pid, std::slice::from_ref(library), false);
                }
            }
            // Said with its numbers (a short process that counted on its own is often gone
            // before it is read: one line per kind in the summary, not one per process).
            Err(e) => {
                debug!("pid {pid}: its in-process sampler's counters cannot be read ({e:#})");
                processes.incomplete(pid, UNREAD.to_owned());
            }
        }
    }

    /// Says in `processes` what the library did with the plan in `pid`'s region (every
    /// region mapped in `counters` when `None`): the allocator it patched among the
    /// process's, or why it did not patch it (its calls then go uncounted: it is never
    /// probed, see [`crate::probe::patch`]).
    pub(super) fn note_patches(
        &self,
        counters: &Counters,
        processes: &mut ProcessBook,
        pid: Option<u32>,
    ) {
        let Some(patched) = &self.patched else {
            return;
        };
        for (each, region) in counters.regions() {
            if pid.is_some_and(|pid| pid != each) {
                continue;
            }
            let (entries, refused) = region.patched();
            if entries > 0 {
                processes.add_allocators(each, std::slice::from_ref(patched), false);
            }
            // Probed for every process since one ran it unpatched: counted by uprobes.
            if let Some(refused) = refused.filter(|_| !self.fallen_back) {
                processes.incomplete(
                    each,
                    format!(
                        "its allocator linked into {} was not patched ({}): its calls are not \
                         counted",
                        patched.shown.display(),
                        refused.reason()
                    ),
                );
            }
        }
    }

    /// Whether `pid`'s region is awaited (see [`Self::map`]).
    pub(super) fn awaits(&self, pid: u32) -> bool {
        self.awaiting.contains(&pid)
    }

    fn full(&self) -> u64 {
        self.family.as_ref().map_or(0, FamilyTable::full)
    }

    /// Maps the regions of the processes that had not claimed theirs when last looked for
    /// (see [`Self::map`]); `gone`: `pid` has exited, and is looked for one last time.
    pub(super) fn claim_regions(
        &mut self,
        gone: Option<u32>,
        counters: &mut Counters,
        processes: &mut ProcessBook,
    ) {
        let pids: Vec<u32> = match gone {
            Some(pid) if self.awaiting.contains(&pid) => vec![pid],
            Some(_) => return,
            None => self.awaiting.iter().copied().collect(),
        };
        for pid in pids {
            let Some(found) = self.family.as_ref().and_then(|f| f.region_of(pid)) else {
                continue;
            };
            self.awaiting.remove(&pid);
            self.take(pid, found, counters, processes);
        }
        if let Some(pid) = gone {
            if self.awaiting.remove(&pid) {
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
    pub(super) fn sweep(&mut self, counters: &Counters, discovered: &Discovered) {
        let Some(family) = self.family.as_ref() else {
            return;
        };
        for &(slot, word) in &self.gone {
            let pid = sampler_common::preload::claim_pid(word);
            if family.holds(slot, word) && !counters.has_region(pid) {
                family.release(slot);
            }
        }
        let gone = |pid: u32| {
            !counters.has_region(pid)
                && !discovered.is_running(pid)
                && !crate::sys::process::exists(pid)
        };
        self.gone = family.claims_of_gone(gone);
        let full = family.full();
        if full > 0 && !self.said_full {
            self.said_full = true;
            let processes = if full == 1 { "process" } else { "processes" };
            warn!(
                "{full} {processes} found no room in the in-process sampler's table (its {} \
                 slots taken, or no space left on the file system of {}): each counts on \
                 its own, read while it lives",
                sampler_common::preload::FAMILY_SLOTS,
                crate::preload::place::ROOT
            );
        }
    }

    /// A target exited and its region was read one last time: its family slot is free.
    pub(super) fn release(&self, slot: usize) {
        if let Some(family) = &self.family {
            family.release(slot);
        }
    }

    /// Sets the mean interval of every region (those mapped in `counters`, and those new
    /// processes claim from now on).
    pub(super) fn set_interval(&mut self, interval: u64, counters: &Counters) {
        self.interval = interval;
        if let Some(family) = &self.family {
            if let Err(e) = family.set_interval(interval) {
                warn!("the in-process sampler's new processes keep their interval: {e:#}");
            }
        }
        for (pid, region) in counters.regions() {
            if let Err(e) = region.set_interval(interval) {
                warn!("pid {pid}: setting its in-process sampler's interval: {e:#}");
            }
        }
    }

    /// For `pid`, just past an exec (its loader not run yet, its maps not showing the
    /// library), the library it will load: the command's, named in its `LD_PRELOAD`, where
    /// the loader honours it (a dynamically linked program: the kernel mapped a dynamic
    /// loader; not set-user-ID: no secure-execution auxv flag) and the path leads to the
    /// library's file in that process's root.
    pub(super) fn will_load(&self, pid: u32) -> Option<Allocator> {
        let (library, allocator) = self.library.as_ref()?;
        if !crate::sys::maps::has_dynamic_loader(pid)
            || crate::sys::process::secure_execution(pid) != Some(false)
            // Under a seccomp filter it stays dormant (see `sampler-preload`'s `sandbox`).
            || crate::sys::process::seccomp_mode(pid) != Some(0)
        {
            return None;
        }
        let environ = crate::sys::process::environ_of(pid)?;
        let own = library.path();
        let own = std::os::unix::ffi::OsStrExt::as_bytes(own.as_os_str());
        if !crate::sys::process::ld_preload_entries(&environ).contains(&own) {
            return None;
        }
        let through = crate::sys::process::in_root(pid, library.path().as_os_str());
        let id = crate::sys::maps::FileId::of(&std::fs::metadata(through).ok()?);
        (library.file_id().ok()? == id).then(|| allocator.clone())
    }
}

impl super::Recording {
    /// Before a sample of `pid` is unwound: its region, if awaited, is looked for now (its
    /// library's copy of its maps is there; the next look may come after its last sample,
    /// unwound meanwhile against maps without its library).
    pub(super) fn region_for_sample(&mut self, pid: u32) {
        if self.in_process.awaits(pid) {
            self.claim_regions(None);
        }
    }

    /// Maps the regions awaited (see [`InProcess::claim_regions`]).
    pub(super) fn claim_regions(&mut self, gone: Option<u32>) {
        self.in_process.claim_regions(
            gone,
            &mut self.accounting.counters,
            &mut self.aggregation.processes,
        );
    }

    /// Whether `found`, read from `pid`, a copy of `parent` (no exec since its fork), was
    /// read while the child exited: a copy of a carrier maps the library as its parent
    /// does, and a read without it caught the exit tearing its mappings down (seen on 6.18,
    /// whose maps are read without the mm lock). Such a child is as good as gone: not probed.
    pub(super) fn maps_read_while_exiting(
        &self,
        pid: u32,
        parent: u32,
        found: Option<&[Allocator]>,
    ) -> bool {
        let exiting = self.aggregation.processes.carries_front_end(parent)
            && found.is_some_and(|found| !found.iter().any(|a| a.file.is_in_process()));
        if exiting {
            log::debug!("pid {pid}: its maps read while it exited (no library): left");
        }
        exiting
    }
}
