//! `allocscope reference-probe -p PID` (hidden): the benchmark's yardstick. It attaches the
//! cheapest possible program (count the call) to malloc in one process, with the same loader
//! and the same kernel scoping as `record`, so "our cost / reference cost" isolates what our
//! BPF program and user side add on top of the uprobe trap itself.

use anyhow::Context as _;
use aya::maps::PerCpuArray;
use sampler_common::kernel;
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    config::BadInput,
    preflight,
    probe::attach::{self, Target},
};

/// Attaches, waits for SIGINT or SIGTERM, prints the number of calls seen.
/// With `producer`, the program goes where `record` probes the process's own sampler (a
/// Go runtime's) instead.
pub fn run(pid: u32, producer: bool) -> anyhow::Result<()> {
    preflight::check_privileges()?;
    if pid == std::process::id() {
        return Err(BadInput(format!("pid {pid} is allocscope itself")).into());
    }
    let allocators = crate::targets::AllocatorCache::default()
        .of_pid(pid)
        .map_err(|e| BadInput(format!("pid {pid}: {e}")))?;
    let target = Target { pid, allocators };
    let probes = if producer {
        let (allocator, sampler) = target
            .allocators
            .iter()
            .find_map(|a| Some((a, a.file.producer.as_ref()?)))
            .ok_or_else(|| BadInput(format!("pid {pid}: no sampler of its own to probe")))?;
        let offsets: Vec<u64> = sampler.sites.iter().map(|(s, _)| s.file_offset).collect();
        attach::attach_reference_at(pid, &allocator.path, &offsets)
    } else {
        attach::attach_reference(&target)
    }
    .context("attaching the reference probe")?;
    let what = if producer {
        "hits of its sampler's probes"
    } else {
        "malloc calls"
    };
    crate::say!("allocscope: reference probe recording pid {pid} (counting {what})");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        tokio::select! {
            _ = sigint.recv() => {}
            _ = sigterm.recv() => {}
        }
        anyhow::Ok(())
    })?;
    let calls: PerCpuArray<_, u64> = PerCpuArray::try_from(
        probes
            .ebpf
            .map(kernel::maps::BARE_CALLS)
            .context("BARE_CALLS missing")?,
    )?;
    let total: u64 = calls.get(&0, 0)?.iter().sum();
    crate::say!("allocscope: reference probe saw {total} {what}");
    Ok(())
}
