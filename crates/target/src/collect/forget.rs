//! Forgetting gone processes in the kernel's tables, for a recording that runs for days (the
//! agent under `--all`): a process seen only host-wide has no exit watcher to remove its
//! entries, so its per-pid counters, lost-sample counts, exclusion (`--exclude-comm`) and
//! never-freed sampled blocks would
//! stay until the tables filled (16,384 counters: every later process uncounted, counted as
//! a loss) and every read of them, each second, grew longer.

use std::collections::BTreeSet;

use aya::{
    maps::{HashMap, PerCpuHashMap},
    Ebpf,
};
use sampler_common::{kernel, LiveKey, LostKey, LostSamples, ProcessCounters};

use super::counters::map_mut;

/// Removes the entries of the processes in `gone` from the kernel's per-pid counters,
/// lost-sample counts, exclusions and live-block table; returns how many entries went.
pub fn forget_in_kernel(ebpf: &mut Ebpf, gone: &BTreeSet<u32>) -> anyhow::Result<usize> {
    let mut removed = 0;
    {
        let mut host: PerCpuHashMap<_, u32, ProcessCounters> =
            PerCpuHashMap::try_from(map_mut(ebpf, kernel::maps::HOST_COUNTERS)?)?;
        for pid in gone {
            // Absent when the process never called, or was counted in a slot.
            removed += usize::from(host.remove(pid).is_ok());
        }
    }
    {
        let mut lost: PerCpuHashMap<_, LostKey, LostSamples> =
            PerCpuHashMap::try_from(map_mut(ebpf, kernel::maps::LOST)?)?;
        let keys: Vec<LostKey> = lost
            .keys()
            .filter_map(Result::ok)
            .filter(|key| gone.contains(&key.pid))
            .collect();
        for key in keys {
            removed += usize::from(lost.remove(&key).is_ok());
        }
    }
    {
        let mut excluded: HashMap<_, u32, u8> =
            HashMap::try_from(map_mut(ebpf, kernel::maps::EXCLUDED)?)?;
        for pid in gone {
            removed += usize::from(excluded.remove(pid).is_ok());
        }
    }
    let mut live: HashMap<_, LiveKey, u64> = HashMap::try_from(map_mut(ebpf, kernel::maps::LIVE)?)?;
    let keys: Vec<LiveKey> = live
        .keys()
        .filter_map(Result::ok)
        .filter(|key| gone.contains(&key.pid))
        .collect();
    for key in keys {
        removed += usize::from(live.remove(&key).is_ok());
    }
    Ok(removed)
}
