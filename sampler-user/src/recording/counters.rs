//! The kernel's exact counters: read for the targets that run (per process slot, or per
//! pid for file-wide probes), kept for those that exited (their slots are reused), with the
//! loss counters and the samples the kernel could not deliver.

use std::collections::BTreeMap;

use anyhow::Context as _;
use aya::maps::{PerCpuArray, PerCpuHashMap, PerCpuValues};
use log::info;
use sampler_common::{ProcessCounters, HOST_SLOT};

use super::Recording;
use crate::collect::{self, monotonic_ns, Losses};

impl Recording {
    /// A target exited: its probes go, its exact counters are kept and its slot reused.
    pub(super) async fn finalize(&mut self, pid: u32) -> anyhow::Result<()> {
        self.catch_up().await?;
        self.aggregator.mark_exited(pid);
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

    /// Catches up, then reads the kernel's exact counters per process and the loss counters
    /// (after detaching: the values read last), and hands the samples the kernel could not
    /// deliver to the aggregator.
    pub async fn counters(&mut self) -> anyhow::Result<(BTreeMap<u32, ProcessCounters>, Losses)> {
        self.catch_up().await?;
        let mut lost = None;
        if self.probes.is_some() {
            self.counted_ns = monotonic_ns();
        }
        if let Some((counters, losses)) = self.exact_counts()? {
            if let Some(probes) = &self.probes {
                if let Some(map) = probes.ebpf.map("THREADS") {
                    let threads: aya::maps::HashMap<_, u32, sampler_common::ThreadState> =
                        aya::maps::HashMap::try_from(map)?;
                    self.thread_states = Some(threads.keys().filter(Result::is_ok).count() as u64);
                }
                let map = probes.ebpf.map("LOST").context("LOST map missing")?;
                lost = Some(collect::read_lost(&PerCpuHashMap::try_from(map)?)?);
            }
            self.last_counters = Some((counters, losses));
        }
        if let Some(mut lost) = lost {
            lost.retain(|pid, _| !self.excluded.contains(pid));
            for &pid in lost.keys() {
                if !self.aggregator.tracks(pid) {
                    self.first_seen(pid);
                }
            }
            self.aggregator.set_lost(lost);
        }
        self.last_counters
            .clone()
            .context("the kernel's counters were never read")
    }
}

impl Recording {
    /// The kernel's exact counters per target (running, and exited ones' kept values) and
    /// its loss counters, as they are now, without catching up on samples: what the
    /// once-a-second readers (cost windows, throttle) need. `None` once detached.
    pub(super) fn exact_counts(
        &self,
    ) -> anyhow::Result<Option<(BTreeMap<u32, ProcessCounters>, Losses)>> {
        let Some(probes) = &self.probes else {
            return Ok(None);
        };
        let slots: Vec<(u32, u32)> = self
            .running
            .iter()
            .filter(|(_, &slot)| slot != HOST_SLOT)
            .map(|(&p, &s)| (p, s))
            .collect();
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
        Ok(Some((counters, losses)))
    }
}

fn add(a: ProcessCounters, b: ProcessCounters) -> ProcessCounters {
    ProcessCounters {
        calls: a.calls + b.calls,
        bytes: a.bytes + b.bytes,
    }
}
