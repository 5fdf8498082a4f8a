//! Samples drawn in the process: allocscope's own front end (`allocscope:alloc`) and
//! another program's sampling allocator (`otel_memory`, `ddheap`), which count and run the
//! countdown themselves; here a block is remembered as live and sent with its stack.

#[allow(clippy::wildcard_imports)]
use super::*;

/// A block the in-process front end sampled (`allocscope:alloc`): the process counted the
/// call and ran the countdown; here it is remembered as live (unless the library could not
/// track its free) and sent with the stack at the probe, whose leading frames (the
/// library's own) user space drops.
#[inline(always)]
pub fn on_usdt_alloc<C: EbpfContext>(
    ctx: &C,
    address: u64,
    size: u64,
    offset: u64,
    interval: u64,
    how: u64,
) {
    let function = AllocFn::from_u32((how & 0xff) as u32).unwrap_or(AllocFn::Malloc);
    let untracked = how & preload::ALLOC_UNTRACKED != 0;
    in_process_sample(ctx, address, size, offset, interval, function, untracked, 0);
}

/// A block sampled in the process (by allocscope's library or another producer): the
/// duty cycle's gate and the exclusions apply, the block is remembered as live (unless the
/// process could not track its free: counted), and the sample goes out with `flags`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn in_process_sample<C: EbpfContext>(
    ctx: &C,
    address: u64,
    size: u64,
    offset: u64,
    interval: u64,
    function: AllocFn,
    untracked: bool,
    mut flags: u32,
) {
    if config::duty_cycled() && !gate_open() {
        return;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if excluded(pid) {
        return;
    }
    if config::track_frees() && address != 0 {
        if untracked {
            count_loss(LossCounter::LiveMapFull);
        } else {
            flags |= track_live(pid, address);
        }
    }
    let sample = Sample {
        pid,
        tid,
        function,
        size,
        offset,
        interval,
        caller: 0,
        address,
        flags,
        returns: ReturnSlots::default(),
    };
    emit(ctx, &sample);
}

/// A probe of another program's allocator (`otel_memory`/`ddheap` `alloc(ptr, size,
/// weight)` or `free(ptr)`), its arguments where spec `index` says.
#[inline(always)]
pub fn on_producer(ctx: &ProbeContext, index: u32) {
    let Some(spec) = USDT_SPECS.get(index) else {
        return;
    };
    let pointer = usdt_argument(ctx, &spec.arguments[0]);
    if spec.kind == sampler_common::usdt::KIND_FREE {
        on_free(pointer);
        return;
    }
    let size = usdt_argument(ctx, &spec.arguments[1]);
    let weight = usdt_argument(ctx, &spec.arguments[2]);
    on_producer_alloc(ctx, pointer, size, weight);
}

/// A block another program's allocator sampled and weighed (`weight`: the bytes it stands
/// for): remembered as live, and sent with the stack at the probe.
#[inline(always)]
pub(super) fn on_producer_alloc(ctx: &ProbeContext, address: u64, size: u64, weight: u64) {
    if size == 0 || weight == 0 {
        return;
    }
    // The weight travels as the interval; the sampled byte's offset is unknown.
    in_process_sample(
        ctx,
        address,
        size,
        0,
        weight,
        AllocFn::Malloc,
        false,
        FLAG_WEIGHTED,
    );
}
