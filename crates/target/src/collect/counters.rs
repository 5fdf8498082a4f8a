//! The kernel's exact counters and loss counters, read from its maps.
//!
//! Every call of a target is counted in the kernel, sampled or not: per process slot
//! (`COUNTERS`, probes attached to one process) or per pid (`HOST_COUNTERS`, file-wide
//! probes of `--all`, `--follow`, `--comm`). A slot is reused when its process exits and a
//! pid's entry goes, so [`Counters`] keeps what exited processes counted last; a read adds
//! those to what the running ones count now. The loss counters (`LOSSES`) and the samples
//! the kernel could not deliver (`LOST`) are read here too.

pub use crate::schema::Losses;

use sampler_common::kernel;
use std::collections::BTreeMap;

use anyhow::Context as _;
use aya::{
    maps::{MapData, PerCpuArray, PerCpuHashMap, PerCpuValues},
    Ebpf,
};
use sampler_common::{LossCounter, LostKey, LostSamples, ProcessCounters};

/// The exact counters of every target so far: read from the kernel for those running, kept
/// here for those that exited.
#[derive(Debug, Default)]
pub struct Counters {
    /// Last counts of processes that exited (their slot or entry is gone).
    finished: BTreeMap<u32, ProcessCounters>,
    /// Processes that count their calls themselves (the in-process front end): their
    /// regions, mapped here, readable after they exit.
    regions: BTreeMap<u32, crate::preload::MappedRegion>,
    /// Regions of running processes the front end was loaded into, whose counts start once
    /// their probes are attached ([`Counters::probes_attached`]).
    counting_from_attach: std::collections::BTreeSet<u32>,
}

impl Counters {
    /// Forgets the kept counts and region of `pid` (gone, its last period sent).
    pub fn forget(&mut self, pid: u32) {
        self.finished.remove(&pid);
        self.regions.remove(&pid);
        self.counting_from_attach.remove(&pid);
    }

    /// Every process whose counts or region are kept here.
    pub fn known(&self) -> impl Iterator<Item = u32> + '_ {
        let regions = self.regions.keys().chain(&self.counting_from_attach);
        self.finished.keys().chain(regions).copied()
    }

    /// Every target's exact counters now (running and exited), and the loss counters.
    /// `slots` are the (pid, slot) of processes with a counter slot of their own; `host`,
    /// for file-wide probes, says which pids of `HOST_COUNTERS` are targets.
    pub fn read(
        &self,
        ebpf: &Ebpf,
        slots: &[(u32, u32)],
        host: Option<&dyn Fn(u32) -> bool>,
    ) -> anyhow::Result<(BTreeMap<u32, ProcessCounters>, Losses)> {
        let slotted = read_counters(
            &PerCpuArray::try_from(map(ebpf, kernel::maps::COUNTERS)?)?,
            slots,
        )?;
        let host = match host {
            Some(target) => {
                let mut all = read_host_counters(&PerCpuHashMap::try_from(map(
                    ebpf,
                    kernel::maps::HOST_COUNTERS,
                )?)?)?;
                all.retain(|&pid, _| target(pid));
                all
            }
            None => BTreeMap::new(),
        };
        let losses = read_losses(&PerCpuArray::try_from(map(ebpf, kernel::maps::LOSSES)?)?)?;
        let in_process = self.in_process();
        Ok((
            combine([&slotted, &host, &self.finished, &in_process]),
            losses,
        ))
    }

    /// What the regions count, and the kept counts of processes gone, with no kernel
    /// counters at all (a recording that never attached: nothing was lost in a kernel).
    pub fn read_in_process(&self) -> (BTreeMap<u32, ProcessCounters>, Losses) {
        (
            combine([&self.finished, &self.in_process()]),
            Losses::default(),
        )
    }

    /// Process `pid` counts its own calls in `region` (from now on): its counts are added
    /// to whatever the kernel counts for it (a small-object layer's probes).
    pub fn add_region(&mut self, pid: u32, region: crate::preload::MappedRegion) {
        self.regions.insert(pid, region);
    }

    /// Like [`Counters::add_region`], for a running process the front end was just loaded
    /// into: its counts start when its probes are attached (what it counted before that
    /// has no samples).
    pub fn add_region_from_attach(&mut self, pid: u32, region: crate::preload::MappedRegion) {
        self.regions.insert(pid, region);
        self.counting_from_attach.insert(pid);
    }

    /// `pid`'s probes are attached: a region waiting for that counts from now.
    pub fn probes_attached(&mut self, pid: u32) {
        if self.counting_from_attach.remove(&pid) {
            if let Some(region) = self.regions.get_mut(&pid) {
                region.count_from_now();
            }
        }
    }

    /// `pid` is gone: the counts of its region are kept, and the region's slot in the family
    /// table returned, to be given back.
    pub fn release_region(&mut self, pid: u32) -> Option<usize> {
        let slot = self.regions.get(&pid)?.slot()?;
        let region = self.regions.remove(&pid)?;
        let (calls, bytes) = region.counts();
        self.keep(pid, ProcessCounters { calls, bytes });
        Some(slot)
    }

    /// The name `pid`'s library wrote into its region after its latest exec, if any.
    pub fn region_comm(&self, pid: u32) -> Option<String> {
        self.regions.get(&pid)?.comm()
    }

    /// When `pid`'s library last set up (see [`crate::preload::MappedRegion::set_up_ns`]).
    pub fn region_set_up_ns(&self, pid: u32) -> Option<u64> {
        Some(self.regions.get(&pid)?.set_up_ns())
    }

    /// What `pid`'s library did with the patch plan (see
    /// [`crate::preload::MappedRegion::patched`]), if it counts in a region.
    pub fn region_patched(
        &self,
        pid: u32,
    ) -> Option<(u64, Option<sampler_common::preload::PatchRefusal>)> {
        Some(self.regions.get(&pid)?.patched())
    }

    /// Whether `pid` counts its own calls.
    pub fn has_region(&self, pid: u32) -> bool {
        self.regions.contains_key(&pid)
    }

    /// `pid`'s maps as its in-process front end read them, when newly written (see
    /// [`crate::preload::MappedRegion::new_maps`]).
    pub fn new_maps(&mut self, pid: u32) -> Option<(String, u64)> {
        self.regions.get_mut(&pid)?.new_maps()
    }

    /// The regions, to set their interval.
    pub fn regions(&self) -> impl Iterator<Item = (u32, &crate::preload::MappedRegion)> {
        self.regions.iter().map(|(&pid, region)| (pid, region))
    }

    /// The counts of the processes that count their own calls.
    fn in_process(&self) -> BTreeMap<u32, ProcessCounters> {
        self.regions
            .iter()
            .map(|(&pid, region)| {
                let (calls, bytes) = region.counts();
                (pid, ProcessCounters { calls, bytes })
            })
            .collect()
    }

    /// A process counted per pid (`HOST_COUNTERS`) exited: its last counts are kept and its
    /// entry goes, so that a later process given the same pid starts from zero.
    pub fn keep_host(&mut self, ebpf: &mut Ebpf, pid: u32) -> anyhow::Result<()> {
        let last = read_host_counter(
            &PerCpuHashMap::try_from(map(ebpf, kernel::maps::HOST_COUNTERS)?)?,
            pid,
        )?;
        let mut entries: PerCpuHashMap<_, u32, ProcessCounters> =
            PerCpuHashMap::try_from(map_mut(ebpf, sampler_common::kernel::maps::HOST_COUNTERS)?)?;
        // Absent when the process never called: nothing to remove.
        let _ = entries.remove(&pid);
        self.keep(pid, last);
        Ok(())
    }

    /// A process with a counter slot exited: its last counts are kept, and the slot is
    /// zeroed for another process.
    pub fn keep_slot(&mut self, ebpf: &mut Ebpf, pid: u32, slot: u32) -> anyhow::Result<()> {
        let last = read_counters(
            &PerCpuArray::try_from(map(ebpf, kernel::maps::COUNTERS)?)?,
            &[(pid, slot)],
        )?;
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        let zeros = PerCpuValues::try_from(vec![ProcessCounters::default(); cpus])?;
        let mut counters: PerCpuArray<_, ProcessCounters> =
            PerCpuArray::try_from(map_mut(ebpf, sampler_common::kernel::maps::COUNTERS)?)?;
        counters.set(slot, zeros, 0)?;
        self.keep(pid, last.get(&pid).copied().unwrap_or_default());
        Ok(())
    }

    fn keep(&mut self, pid: u32, last: ProcessCounters) {
        let before = self.finished.get(&pid).copied().unwrap_or_default();
        self.finished.insert(pid, add(before, last));
    }
}

/// Entries of the kernel's thread-state map (threads that called since they were last
/// forgotten).
pub fn thread_states(ebpf: &Ebpf) -> anyhow::Result<u64> {
    let threads: aya::maps::HashMap<_, u32, sampler_common::ThreadState> =
        aya::maps::HashMap::try_from(map(ebpf, kernel::maps::THREADS)?)?;
    Ok(threads.keys().filter(Result::is_ok).count() as u64)
}

/// Every process's samples the kernel could not deliver (`LOST`).
pub fn lost(ebpf: &Ebpf) -> anyhow::Result<BTreeMap<u32, Vec<LostBatch>>> {
    read_lost(&PerCpuHashMap::try_from(map(ebpf, kernel::maps::LOST)?)?)
}

fn map<'a>(ebpf: &'a Ebpf, name: &str) -> anyhow::Result<&'a aya::maps::Map> {
    ebpf.map(name)
        .with_context(|| format!("{name} map missing"))
}

pub(super) fn map_mut<'a>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> anyhow::Result<&'a mut aya::maps::Map> {
    ebpf.map_mut(name)
        .with_context(|| format!("{name} map missing"))
}

/// The sum, per pid, of counts from several places (a pid can be in more than one: an
/// exited process's pid reused, or counted in a slot and file-wide).
fn combine<'a>(
    parts: impl IntoIterator<Item = &'a BTreeMap<u32, ProcessCounters>>,
) -> BTreeMap<u32, ProcessCounters> {
    let mut total: BTreeMap<u32, ProcessCounters> = BTreeMap::new();
    for part in parts {
        for (&pid, &c) in part {
            let entry = total.entry(pid).or_default();
            *entry = add(*entry, c);
        }
    }
    total
}

fn add(a: ProcessCounters, b: ProcessCounters) -> ProcessCounters {
    ProcessCounters {
        calls: a.calls + b.calls,
        bytes: a.bytes + b.bytes,
    }
}

/// Reads the `LOSSES` per-CPU array.
fn read_losses(map: &PerCpuArray<&MapData, u64>) -> anyhow::Result<Losses> {
    let sum = |counter: LossCounter| -> anyhow::Result<u64> {
        Ok(map.get(&(counter as u32), 0)?.iter().sum())
    };
    Ok(Losses {
        ringbuf_full: sum(LossCounter::RingBufFull)?,
        stack_missing: sum(LossCounter::StackMissing)?,
        counters_full: sum(LossCounter::CountersFull)?,
        thread_state_full: sum(LossCounter::ThreadStateFull)?,
        live_map_full: sum(LossCounter::LiveMapFull)?,
        free_event_lost: sum(LossCounter::FreeEventLost)?,
        process_event_lost: sum(LossCounter::ProcessEventLost)?,
        lost_unrecorded: sum(LossCounter::LostUnrecorded)?,
        followed_full: sum(LossCounter::FollowedFull)?,
        front_end_full: sum(LossCounter::FrontEndFull)?,
        stacks_cut_to_leaf: 0,
    })
}

/// Samples of one size and interval that the kernel could not deliver (see
/// [`sampler_common::LostKey`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LostBatch {
    /// Allocation size.
    pub size: u64,
    /// Mean interval they were drawn under.
    pub interval: u64,
    /// How many.
    pub samples: u64,
    /// Sum of their remainders `size - offset`.
    pub unseen: u64,
}

/// Reads the `LOST` per-CPU hash: every process's undelivered samples, summed over CPUs.
fn read_lost(
    map: &PerCpuHashMap<&MapData, LostKey, LostSamples>,
) -> anyhow::Result<BTreeMap<u32, Vec<LostBatch>>> {
    let mut lost: BTreeMap<u32, Vec<LostBatch>> = BTreeMap::new();
    for entry in map.iter() {
        let (key, values) = entry?;
        let batch = LostBatch {
            size: key.size,
            interval: key.interval,
            samples: values.iter().map(|v| v.samples).sum(),
            unseen: values.iter().map(|v| v.unseen).sum(),
        };
        if batch.samples > 0 && batch.size > 0 && batch.interval > 0 {
            lost.entry(key.pid).or_default().push(batch);
        }
    }
    Ok(lost)
}

fn sum(values: &[ProcessCounters]) -> ProcessCounters {
    values
        .iter()
        .fold(ProcessCounters::default(), |acc, c| ProcessCounters {
            calls: acc.calls + c.calls,
            bytes: acc.bytes + c.bytes,
        })
}

/// Reads the `COUNTERS` per-CPU array: exact calls and bytes of each (pid, slot), summed
/// over CPUs.
fn read_counters(
    map: &PerCpuArray<&MapData, ProcessCounters>,
    slots: &[(u32, u32)],
) -> anyhow::Result<BTreeMap<u32, ProcessCounters>> {
    let mut totals = BTreeMap::new();
    for &(pid, slot) in slots {
        totals.insert(pid, sum(&map.get(&slot, 0)?));
    }
    Ok(totals)
}

/// Reads the `HOST_COUNTERS` per-CPU hash (`--all`): exact calls and bytes per pid.
fn read_host_counters(
    map: &PerCpuHashMap<&MapData, u32, ProcessCounters>,
) -> anyhow::Result<BTreeMap<u32, ProcessCounters>> {
    let mut totals = BTreeMap::new();
    for entry in map.iter() {
        let (pid, values) = entry?;
        totals.insert(pid, sum(&values));
    }
    Ok(totals)
}

/// One process's counters in the `HOST_COUNTERS` per-CPU hash (zero if it has none).
fn read_host_counter(
    map: &PerCpuHashMap<&MapData, u32, ProcessCounters>,
    pid: u32,
) -> anyhow::Result<ProcessCounters> {
    match map.get(&pid, 0) {
        Ok(values) => Ok(sum(&values)),
        Err(aya::maps::MapError::KeyNotFound) => Ok(ProcessCounters::default()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(calls: u64, bytes: u64) -> ProcessCounters {
        ProcessCounters { calls, bytes }
    }

    #[test]
    fn a_pid_counted_in_several_places_is_summed_and_others_kept_apart() {
        let slotted = BTreeMap::from([(10, counts(5, 500)), (11, counts(1, 8))]);
        let host = BTreeMap::from([(12, counts(2, 64))]);
        // pid 10 exited once already (its pid reused by the process in a slot now).
        let finished = BTreeMap::from([(10, counts(3, 30)), (13, counts(7, 70))]);
        let total = combine([&slotted, &host, &finished]);
        assert_eq!(
            total,
            BTreeMap::from([
                (10, counts(8, 530)),
                (11, counts(1, 8)),
                (12, counts(2, 64)),
                (13, counts(7, 70)),
            ])
        );
    }

    #[test]
    fn kept_counts_of_a_pid_accumulate() {
        let mut counters = Counters::default();
        counters.keep(7, counts(1, 10));
        counters.keep(7, counts(2, 20));
        assert_eq!(counters.finished, BTreeMap::from([(7, counts(3, 30))]));
    }
}
