//! The recording's accounting: the kernel's exact counters ([`crate::collect::Counters`]),
//! which targets are counted where, a target's last counts kept when it exits, and the
//! samples the kernel could not deliver, kept for the next tally.
//!
//! Why its own component: every number the profile prints as exact, and every loss a bound
//! must hold, is read here, at one moment per reading (`counted_ns`), so that the samples
//! taken in (up to that moment) and the counts describe the same span.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context as _;
use log::info;
use sampler_common::{ProcessCounters, HOST_SLOT};

use super::Recording;
use crate::{
    collect::{self, monotonic_ns, Counters, Losses},
    profile::LostCounts,
};

/// Exact counts and losses, as last read.
#[derive(Default)]
pub(super) struct Accounting {
    /// The kernel's exact counters, with those of targets that exited.
    pub(super) counters: Counters,
    /// The counters and losses as last read.
    pub(super) last: Option<(BTreeMap<u32, ProcessCounters>, Losses)>,
    /// The kernel's count of the samples it could not deliver, as last read (cumulative).
    pub(super) lost: LostCounts,
    /// Entries of the kernel's thread-state map when the counters were last read.
    pub(super) thread_states: Option<u64>,
    /// When the exact counters were last read (CLOCK_MONOTONIC ns).
    pub(super) counted_ns: u64,
}

impl Accounting {
    /// Every process counted or kept here: the kernel's counters as last read (under
    /// file-wide probes, every process that called an allocator, sampled or not).
    pub(super) fn known(&self) -> BTreeSet<u32> {
        let mut known: BTreeSet<u32> = self.counters.known().collect();
        known.extend(self.lost.keys());
        if let Some((counters, _)) = &self.last {
            known.extend(counters.keys());
        }
        known
    }

    /// Forgets the processes `gone` (their last counts, their lost samples).
    pub(super) fn forget(&mut self, gone: &BTreeSet<u32>) {
        for pid in gone {
            self.counters.forget(*pid);
            self.lost.remove(pid);
        }
        if let Some((counters, _)) = &mut self.last {
            counters.retain(|pid, _| !gone.contains(pid));
        }
    }
}

impl Recording {
    /// A target exited: its probes go, its exact counters are kept and its slot reused.
    pub(super) async fn finalize(&mut self, pid: u32) -> anyhow::Result<()> {
        self.duty_exit(pid);
        self.catch_up().await?;
        let (read, notes) = self.go_readers.end(pid);
        let ended = read.then(|| super::go_readers::ENDED_UNREAD.to_owned());
        for note in notes.into_iter().chain(ended) {
            self.aggregation.processes.incomplete(pid, note);
        }
        self.aggregation.mark_exited(pid);
        self.claim_regions(Some(pid));
        if let Some(comm) = self.accounting.counters.region_comm(pid) {
            self.aggregation.processes.name_from_region(pid, &comm);
        }
        self.in_process.note_patches(
            &self.accounting.counters,
            &mut self.aggregation.processes,
            Some(pid),
        );
        self.patched_process_ended(pid);
        if let Some(slot) = self.accounting.counters.release_region(pid) {
            self.in_process.release(slot);
        }
        let Some(slot) = self.discovered.leave(pid) else {
            return Ok(());
        };
        let Some(probes) = self.probes.as_mut() else {
            return Ok(());
        };
        if slot == HOST_SLOT {
            // Counted by file-wide probes: nothing to detach.
            info!("pid {pid} exited: its counters are kept");
            self.accounting.counters.keep_host(&mut probes.ebpf, pid)?;
        } else {
            info!("pid {pid} exited: its probes go, its counters are kept");
            probes.remove(pid).close_in_background();
            self.accounting
                .counters
                .keep_slot(&mut probes.ebpf, pid, slot)?;
        }
        Ok(())
    }

    /// Whether counting goes on: the probes are attached, or a probeless recording is not
    /// detached yet (its regions still count what their processes did).
    pub(super) fn counting(&self) -> bool {
        self.probes.is_some() || (self.probeless && self.intake.cutoff_ns().is_none())
    }

    /// Catches up, then reads the kernel's exact counters per process and the loss counters
    /// (after detaching: the values read last), and keeps the kernel's count of the samples
    /// it could not deliver for the next tally.
    pub async fn counters(&mut self) -> anyhow::Result<(BTreeMap<u32, ProcessCounters>, Losses)> {
        self.catch_up().await?;
        self.claim_regions(None);
        let mut lost = None;
        if self.counting() {
            self.accounting.counted_ns = monotonic_ns();
            self.aggregation.processes.read_go_totals();
        }
        if let Some((counters, losses)) = self.exact_counts()? {
            if let Some(probes) = &self.probes {
                self.accounting.thread_states = Some(collect::thread_states(&probes.ebpf)?);
                lost = Some(collect::lost(&probes.ebpf)?);
            }
            self.accounting.last = Some((counters, losses));
        }
        if let Some(mut lost) = lost {
            lost.retain(|&pid, _| !self.discovered.is_excluded(pid));
            for &pid in lost.keys() {
                if !self.aggregation.processes.tracks(pid) {
                    self.first_seen(pid);
                }
            }
            self.accounting.lost = lost;
        }
        self.accounting
            .last
            .clone()
            .context("the kernel's counters were never read")
    }

    /// The kernel's exact counters per target (running, and exited ones' kept values) and
    /// its loss counters, as they are now, without catching up on samples: what the
    /// once-a-second readers (cost windows, throttle) need. `None` once detached.
    pub(super) fn exact_counts(
        &self,
    ) -> anyhow::Result<Option<(BTreeMap<u32, ProcessCounters>, Losses)>> {
        let Some(probes) = &self.probes else {
            return Ok(self
                .counting()
                .then(|| self.accounting.counters.read_in_process()));
        };
        let slots = self.discovered.counter_slots();
        // File-wide: only targets (the kernel also counts, briefly, processes pending a
        // decision, and one we have not heard of yet).
        let target = |pid: u32| self.discovered.counts(pid);
        let file_wide = self.targets.all || self.discovered.followed_only();
        let host: Option<&dyn Fn(u32) -> bool> = if file_wide { Some(&target) } else { None };
        self.accounting
            .counters
            .read(&probes.ebpf, &slots, host)
            .map(Some)
    }
}
