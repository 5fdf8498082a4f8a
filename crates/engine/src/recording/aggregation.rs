//! The recording's aggregation: samples per stack ([`Aggregator`]), what is known of each
//! process apart from its samples ([`ProcessBook`]), and the symbolizer that resolves the
//! stacks' frames, warmed while the targets run.
//!
//! Why one component: the three track the same processes (a process tracked is tracked by
//! both the aggregator and the book; forgotten by both) and a tally reads all three.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use log::info;
use sampler_common::ProcessCounters;

use crate::{
    profile::{Aggregator, Forked, LostCounts, OpenStratum, ProcessBook, Readings, Tally},
    stacks::symbolize::Symbolizer,
};

/// Every how many [`Aggregation::forget`]s that forgot something the symbolizer drops its
/// caches (with the agent's 60 s periods: at most every 10 minutes).
const SYMBOLIZER_FORGETS_EVERY: u32 = 10;

/// Samples, processes and frames.
pub(super) struct Aggregation {
    /// The samples so far.
    aggregator: Aggregator,
    /// What is known of each target apart from its samples.
    pub(super) processes: ProcessBook,
    /// Resolves frames for [`Aggregator::tally`].
    symbolizer: Symbolizer,
    /// Stacks whose frames the symbolizer was asked to resolve ahead ([`Self::refresh`]).
    warmed_stacks: usize,
    /// Times [`Self::forget`] forgot a process.
    forgets: u32,
}

impl Aggregation {
    pub(super) fn new(aggregator: Aggregator, symbolizer: Symbolizer) -> Aggregation {
        Aggregation {
            aggregator,
            processes: ProcessBook::default(),
            symbolizer,
            warmed_stacks: 0,
            forgets: 0,
        }
    }

    /// Starts tracking `pid`: its maps, and its description (again after an exec).
    pub(super) fn track(&mut self, pid: u32) {
        self.aggregator.track(pid);
        self.processes.track(pid);
    }

    /// Starts tracking `pid` afresh under the name `command` (a new program after an
    /// exec, as the kernel named it): its new files noted from now.
    pub(super) fn track_named(&mut self, pid: u32, command: &str) {
        self.aggregator.track(pid);
        self.processes.track_named(pid, Some(command.to_owned()));
    }

    /// Starts tracking `pid`, a new process of `parent` (see [`Aggregator::track_fork`]).
    /// Whether it is its parent's copy (no exec since its fork).
    pub(super) fn track_fork(&mut self, pid: u32, parent: u32) -> bool {
        // Its parent's copy (no exec since its fork): its parent's maps too.
        let forked = self.processes.track_fork(pid, parent);
        self.aggregator.track_fork(pid, parent, forked);
        forked == Forked::Copy
    }

    /// Takes the data events of a batch in (samples and frees; see [`Aggregator::add_all`]).
    pub(super) fn add_all(&mut self, events: Vec<crate::collect::Event>) {
        self.aggregator.add_all(events);
    }

    /// A copy of `pid`'s maps read at `read_ns` (the newer one wins).
    pub(super) fn offer_maps(&mut self, pid: u32, read_ns: u64, text: &str) {
        self.aggregator.offer_maps(pid, read_ns, text);
    }

    /// Keeps `file_id` open for resolving frames however short its process's life.
    pub(super) fn hold_file(&mut self, file_id: crate::sys::maps::FileId, path: PathBuf) {
        self.aggregator.hold_file(file_id, path);
    }

    /// `pid` exited: its blocks stop being live from now.
    pub(super) fn mark_exited(&mut self, pid: u32) {
        self.aggregator.mark_exited(pid);
    }

    /// Moves the aggregator's clock (its timeline's buckets) to `now_ns`.
    pub(super) fn advance(&mut self, now_ns: u64) {
        self.aggregator.advance(now_ns);
    }

    /// Starts a new period for per-period values (see [`Aggregator::start_period`]).
    pub(super) fn start_period(&mut self, lost: &LostCounts) {
        self.aggregator.start_period(lost);
    }

    /// Closes duty cycling's open stratum with what it observed.
    pub(super) fn close_stratum(
        &mut self,
        observed: &crate::duty::sums::StratumObserved,
        counters: &BTreeMap<u32, ProcessCounters>,
    ) {
        self.aggregator.close_stratum(observed, counters);
    }

    /// The stacks and live blocks kept (what a long recording's memory follows).
    pub(super) fn sizes(&self) -> (usize, usize) {
        (self.aggregator.stack_count(), self.aggregator.live_count())
    }

    /// The samples so far, per stack and process, frames resolved, at `now_ns`; `lost`:
    /// the kernel's count of the samples it could not deliver, as last read.
    pub(super) async fn tally(
        &mut self,
        lost: &LostCounts,
        open_stratum: Option<&OpenStratum>,
        now_ns: u64,
        leak_age: Option<Duration>,
    ) -> Tally {
        let readings = Readings {
            processes: &self.processes,
            lost,
            open_stratum,
        };
        self.aggregator
            .tally(&self.symbolizer, readings, now_ns, leak_age)
            .await
    }

    /// While the targets live: keeps the maps snapshot current (libraries loaded late, a
    /// spawned command just past exec), the processes' descriptions too, and has the
    /// symbolizer resolve the frames of the stacks seen since last time (see
    /// [`Symbolizer::warm`]).
    pub(super) fn refresh(&mut self) {
        self.aggregator.refresh(&self.processes.pids());
        self.processes.refresh();
        let (frames, stacks) = self.aggregator.file_frames_since(self.warmed_stacks);
        self.warmed_stacks = stacks;
        self.symbolizer.warm(frames);
    }

    /// Every process anything is kept for: sampled, tracked, or only described.
    pub(super) fn known(&self) -> std::collections::BTreeSet<u32> {
        let mut known = self.aggregator.known();
        known.extend(self.processes.known());
        known
    }

    /// Forgets the processes `gone`; what the symbolizer parsed for them goes too, every
    /// few times (the next profile parses again what the running processes need: CPU each
    /// time, against memory that would otherwise follow every program that ever ran).
    pub(super) fn forget(&mut self, gone: &std::collections::BTreeSet<u32>) {
        let remap = self.aggregator.forget(gone);
        if !remap.is_empty() {
            // Stacks are renumbered, in order: those warmed are the ones kept of the first.
            let warmed = self.warmed_stacks.min(remap.len());
            self.warmed_stacks = remap[..warmed].iter().flatten().count();
        }
        for pid in gone {
            self.processes.forget(*pid);
        }
        self.forgets += 1;
        if self.forgets.is_multiple_of(SYMBOLIZER_FORGETS_EVERY) {
            self.symbolizer.forget_caches();
        }
    }

    /// Says (`-v`) what unwinding the samples cost.
    pub(super) fn report(&self) {
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
    }
}
