//! Who the recording's targets are, as bookkeeping apart from the kernel: the processes
//! running as targets and their counter slots, every process ever a target, how each is
//! covered and from when, the processes left out (host mode's exclusions, the followed
//! set's rejections), the files probed for every process and when, and what the /proc
//! scans have looked at. Pure state: discovery decides, the kernel is told elsewhere, and
//! every rule here (slot reuse, the bound on slots, which allocator came late) is unit
//! tested without BPF.

use std::collections::{BTreeMap, HashMap, HashSet};

use sampler_common::{HOST_SLOT, MAX_TARGETS};

use crate::{
    probe::allocator::Allocator,
    profile::{Coverage, LateAllocator},
    sys::maps::FileId,
};

/// What discovery found: the targets of a recording (their counter slots and coverage),
/// the processes left alone, the files probed host-wide and the processes scanned.
#[derive(Debug, Default)]
pub(in crate::recording) struct Discovered {
    /// `--follow`, `--comm`: targets are counted by file-wide probes in the kernel's
    /// followed set (slot [`HOST_SLOT`]), not attached per process.
    followed_only: bool,
    /// Targets still running → their counter slot.
    running: BTreeMap<u32, u32>,
    /// Every process ever a target (host-wide: every one seen allocating), in order.
    pids: Vec<u32>,
    free_slots: Vec<u32>,
    next_slot: u32,
    /// How each target is covered, and from when (CLOCK_MONOTONIC ns).
    coverage: HashMap<u32, (Coverage, u64)>,
    /// Host mode: processes left alone (allocscope, `--exclude-*`); `followed_only`:
    /// processes the kernel counted pending a decision and that are not targets. What
    /// they send is dropped.
    excluded: HashSet<u32>,
    /// Allocator files probed for every process, and when (CLOCK_MONOTONIC ns).
    host_files: HashMap<FileId, u64>,
    /// Processes looked at by a scan, with the executable they had then (an exec makes
    /// them new again).
    scanned: HashMap<u32, FileId>,
}

impl Discovered {
    pub(in crate::recording) fn new(followed_only: bool) -> Discovered {
        Discovered {
            followed_only,
            ..Discovered::default()
        }
    }

    /// Whether targets are counted in the kernel's followed set.
    pub(in crate::recording) fn followed_only(&self) -> bool {
        self.followed_only
    }

    /// Whether `pid` is a running target.
    pub(in crate::recording) fn is_running(&self, pid: u32) -> bool {
        self.running.contains_key(&pid)
    }

    /// Whether no target is running.
    pub(in crate::recording) fn none_running(&self) -> bool {
        self.running.is_empty()
    }

    /// The running targets, in pid order.
    pub(in crate::recording) fn running(&self) -> Vec<u32> {
        self.running.keys().copied().collect()
    }

    /// Every process ever a target, in order.
    pub(in crate::recording) fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// Notes a process seen host-wide (not attached, not counted per slot).
    pub(in crate::recording) fn seen(&mut self, pid: u32) {
        if !self.pids.contains(&pid) {
            self.pids.push(pid);
        }
    }

    /// `pid`'s counter slot, and whether it is new: its own if it runs as a target, else a
    /// free one. Fails when [`MAX_TARGETS`] are taken; [`Self::enter`] makes it `pid`'s,
    /// [`Self::give_back`] returns it unused.
    pub(in crate::recording) fn slot_for(&mut self, pid: u32) -> anyhow::Result<(u32, bool)> {
        if let Some(&slot) = self.running.get(&pid) {
            return Ok((slot, false));
        }
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None if self.next_slot < MAX_TARGETS => {
                self.next_slot += 1;
                self.next_slot - 1
            }
            None => anyhow::bail!("{MAX_TARGETS} processes attached at once: no counter slot left"),
        };
        Ok((slot, true))
    }

    /// Returns a slot from [`Self::slot_for`] that was not used.
    pub(in crate::recording) fn give_back(&mut self, slot: u32) {
        if slot != HOST_SLOT {
            self.free_slots.push(slot);
        }
    }

    /// Makes `pid` a running target counted in `slot`, covered as `coverage` from
    /// `from_ns`.
    pub(in crate::recording) fn enter(
        &mut self,
        pid: u32,
        slot: u32,
        coverage: Coverage,
        from_ns: u64,
    ) {
        self.running.insert(pid, slot);
        self.seen(pid);
        self.excluded.remove(&pid);
        self.coverage.insert(pid, (coverage, from_ns));
    }

    /// Forgets every target that is gone (their last period sent: the agent): not running
    /// as a target, and (a process only seen host-wide, which nothing watches) not
    /// `alive`; returns them.
    pub(in crate::recording) fn forget_gone(
        &mut self,
        alive: impl Fn(u32) -> bool,
    ) -> std::collections::BTreeSet<u32> {
        let gone: std::collections::BTreeSet<u32> = self
            .pids
            .iter()
            .copied()
            .filter(|&pid| !self.running.contains_key(&pid) && !alive(pid))
            .collect();
        self.pids.retain(|pid| !gone.contains(pid));
        self.coverage.retain(|pid, _| !gone.contains(pid));
        gone
    }

    /// How many targets are running.
    pub(in crate::recording) fn running_count(&self) -> usize {
        self.running.len()
    }

    /// `pid` exited: no longer running; returns its slot, which is free again (unless it
    /// was [`HOST_SLOT`]).
    pub(in crate::recording) fn leave(&mut self, pid: u32) -> Option<u32> {
        let slot = self.running.remove(&pid)?;
        self.give_back(slot);
        Some(slot)
    }

    /// The running targets counted in slots of their own, as (pid, slot).
    pub(in crate::recording) fn counter_slots(&self) -> Vec<(u32, u32)> {
        self.running
            .iter()
            .filter(|(_, &slot)| slot != HOST_SLOT)
            .map(|(&pid, &slot)| (pid, slot))
            .collect()
    }

    /// Whether a process the kernel counts file-wide is a target: not left out and, in the
    /// followed set, taken (the kernel also counts, briefly, processes pending a decision).
    pub(in crate::recording) fn counts(&self, pid: u32) -> bool {
        !self.excluded.contains(&pid) && (!self.followed_only || self.running.contains_key(&pid))
    }

    /// Whether `pid` is left out.
    pub(in crate::recording) fn is_excluded(&self, pid: u32) -> bool {
        self.excluded.contains(&pid)
    }

    /// Leaves `pid` out; whether it was not already.
    pub(in crate::recording) fn exclude(&mut self, pid: u32) -> bool {
        self.excluded.insert(pid)
    }

    /// The processes left out.
    pub(in crate::recording) fn excluded(&self) -> Vec<u32> {
        self.excluded.iter().copied().collect()
    }

    /// Forgets that `pid` was left out (it exited: its pid may come back as another).
    pub(in crate::recording) fn forget_excluded(&mut self, pid: u32) {
        self.excluded.remove(&pid);
    }

    /// How `pid` is covered, if it is a target.
    pub(in crate::recording) fn coverage(&self, pid: u32) -> Option<&Coverage> {
        self.coverage.get(&pid).map(|(c, _)| c)
    }

    /// `pid` exec'd: the files it uses are late if probed after `ns`.
    pub(in crate::recording) fn covered_from(&mut self, pid: u32, ns: u64) {
        if let Some((_, from_ns)) = self.coverage.get_mut(&pid) {
            *from_ns = ns;
        }
    }

    /// Whether `file` is probed for every process.
    pub(in crate::recording) fn probes_host_file(&self, file: &FileId) -> bool {
        self.host_files.contains_key(file)
    }

    /// `file` is probed for every process since `ns`.
    pub(in crate::recording) fn host_file_probed(&mut self, file: FileId, ns: u64) {
        self.host_files.insert(file, ns);
    }

    /// Notes in `pid`'s coverage, at `now_ns`, the allocator files it uses that were probed
    /// after it was covered from: `followed_only`, files probed for every process later
    /// (or not at all); per process, `allocators` it gained after being attached (a
    /// library loaded later, found by the next look, probed just now).
    pub(in crate::recording) fn note_late(
        &mut self,
        pid: u32,
        allocators: &[Allocator],
        now_ns: u64,
    ) {
        self.note_late_since(pid, allocators, None, now_ns);
    }

    /// [`Self::note_late`], counted from `pid`'s exec at `exec_ns` when given (its probes
    /// attached anew for its new program).
    pub(in crate::recording) fn note_late_since(
        &mut self,
        pid: u32,
        allocators: &[Allocator],
        exec_ns: Option<u64>,
        now_ns: u64,
    ) {
        let Some((coverage, since_ns)) = self.coverage.get_mut(&pid) else {
            return;
        };
        let from_ns = &exec_ns.unwrap_or(*since_ns);
        // Counted by the library in the processes that patched it (one that did not makes
        // it probed, then noted: `super::super::patched`).
        for allocator in allocators.iter().filter(|a| !a.file.patched_in_process) {
            let name = allocator.describe();
            if coverage.late.iter().any(|late| late.allocator == name) {
                continue;
            }
            let probed_ns = if self.followed_only {
                let probed = self.host_files.get(&allocator.file_id).copied();
                match probed.unwrap_or(now_ns) {
                    ns if ns > *from_ns => ns,
                    _ => continue,
                }
            } else {
                now_ns
            };
            coverage.late.push(LateAllocator {
                allocator: name,
                after_ms: probed_ns.saturating_sub(*from_ns) as f64 / 1e6,
                after_exec: exec_ns.is_some(),
            });
        }
    }

    /// Of the processes `alive` (with their executables, `None`: a kernel thread or gone),
    /// those a scan has not looked at since they started or exec'd; forgets the others.
    pub(in crate::recording) fn unscanned(
        &mut self,
        alive: Vec<(u32, Option<FileId>)>,
    ) -> Vec<u32> {
        let pids: HashSet<u32> = alive.iter().map(|(pid, _)| *pid).collect();
        self.scanned.retain(|pid, _| pids.contains(pid));
        alive
            .into_iter()
            .filter_map(|(pid, exe)| {
                let exe = exe?;
                (self.scanned.insert(pid, exe.clone()) != Some(exe)).then_some(pid)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::profile::CoverageStart;

    fn coverage() -> Coverage {
        Coverage {
            since: CoverageStart::Attach,
            late: Vec::new(),
            checked: true,
        }
    }

    fn file(inode: u64) -> FileId {
        FileId {
            device: "08:01".into(),
            inode,
        }
    }

    fn allocator(name: &str, inode: u64) -> Allocator {
        let path = std::path::PathBuf::from(name);
        Allocator {
            shown: path.clone(),
            path,
            file_id: file(inode),
            in_executable: false,
            file: Arc::new(crate::probe::allocator::AllocatorFile {
                kind: crate::probe::allocator::AllocatorKind::Glibc,
                functions: Vec::new(),
                frees: Vec::new(),
                front_end: None,
                producer: None,
                go: None,
                patched_in_process: false,
            }),
        }
    }

    #[test]
    fn gone_targets_are_forgotten_and_live_ones_kept() {
        let mut discovered = Discovered::new(false);
        discovered.enter(10, 0, coverage(), 0);
        discovered.enter(11, 1, coverage(), 0);
        discovered.seen(20);
        discovered.seen(21);
        discovered.leave(11);
        // 20 is alive (seen host-wide, not watched), 21 is not; 10 runs as a target.
        let gone = discovered.forget_gone(|pid| pid == 20);
        assert_eq!(gone.into_iter().collect::<Vec<_>>(), [11, 21]);
        assert_eq!(discovered.pids(), [10, 20]);
        assert!(discovered.coverage(11).is_none() && discovered.coverage(10).is_some());
    }

    #[test]
    fn slots_are_reused_and_bounded() {
        let mut discovered = Discovered::new(false);
        let (a, new) = discovered.slot_for(10).unwrap();
        assert!(new);
        discovered.enter(10, a, coverage(), 0);
        assert_eq!(discovered.slot_for(10).unwrap(), (a, false));
        let (b, _) = discovered.slot_for(11).unwrap();
        assert_ne!(a, b);
        discovered.give_back(b);
        assert_eq!(
            discovered.slot_for(12).unwrap().0,
            b,
            "a slot given back is reused"
        );
        assert_eq!(discovered.leave(10), Some(a));
        assert_eq!(discovered.leave(10), None);
        assert!(discovered.none_running());
        assert_eq!(
            discovered.pids(),
            [10],
            "an exited target stays in the list"
        );
        let mut full = Discovered::new(false);
        for pid in 0..MAX_TARGETS {
            let (slot, _) = full.slot_for(pid).unwrap();
            full.enter(pid, slot, coverage(), 0);
        }
        let error = full.slot_for(MAX_TARGETS).unwrap_err().to_string();
        assert!(error.contains("no counter slot left"), "{error}");
        assert_eq!(full.counter_slots().len(), MAX_TARGETS as usize);
    }

    #[test]
    fn host_slot_targets_count_file_wide_and_free_no_slot() {
        let mut discovered = Discovered::new(true);
        discovered.enter(7, HOST_SLOT, coverage(), 0);
        assert!(discovered.counter_slots().is_empty());
        assert!(discovered.counts(7));
        assert!(!discovered.counts(8), "followed set: only targets count");
        discovered.exclude(9);
        assert!(!discovered.counts(9));
        assert_eq!(discovered.leave(7), Some(HOST_SLOT));
        assert_eq!(
            discovered.slot_for(1).unwrap().0,
            0,
            "HOST_SLOT never enters the free list"
        );
        let host = Discovered::new(false);
        assert!(
            host.counts(8),
            "host mode: every process not left out counts"
        );
    }

    #[test]
    fn late_allocators_are_noted_once_with_their_delay() {
        let mut discovered = Discovered::new(true);
        discovered.enter(5, HOST_SLOT, coverage(), 1_000_000);
        discovered.host_file_probed(file(1), 500_000); // before it was covered: not late
        discovered.host_file_probed(file(2), 3_000_000); // 2 ms after
        let both = [allocator("early", 1), allocator("late", 2)];
        discovered.note_late(5, &both, 9_000_000);
        discovered.note_late(5, &both, 9_000_000);
        let late = &discovered.coverage(5).unwrap().late;
        assert_eq!(late.len(), 1, "{late:?}");
        assert_eq!(late[0].after_ms, 2.0);
        // An exec moves where lateness counts from.
        discovered.covered_from(5, 4_000_000);
        discovered.note_late(5, &[allocator("unprobed", 3)], 6_000_000);
        assert_eq!(discovered.coverage(5).unwrap().late[1].after_ms, 2.0);
        // Per process: a file found after attaching is late by now.
        let mut per_process = Discovered::new(false);
        per_process.enter(6, 0, coverage(), 1_000_000);
        per_process.note_late(6, &[allocator("loaded later", 4)], 11_000_000);
        assert_eq!(per_process.coverage(6).unwrap().late[0].after_ms, 10.0);
    }

    #[test]
    fn a_scan_looks_at_new_processes_and_execs_once() {
        let mut discovered = Discovered::new(false);
        let first = discovered.unscanned(vec![(1, Some(file(1))), (2, None), (3, Some(file(3)))]);
        assert_eq!(first, [1, 3]);
        assert!(discovered
            .unscanned(vec![(1, Some(file(1))), (3, Some(file(3)))])
            .is_empty());
        // 3 exec'd another program; 1 exited and its pid came back.
        let again = discovered.unscanned(vec![(3, Some(file(4)))]);
        assert_eq!(again, [3]);
        assert_eq!(discovered.unscanned(vec![(1, Some(file(1)))]), [1]);
    }
}
