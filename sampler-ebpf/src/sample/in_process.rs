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
    in_process_sample::<C, false>(ctx, address, size, offset, interval, function, untracked, 0);
}

/// A block sampled in the process (by allocscope's library or another producer): the
/// duty cycle's gate and the exclusions apply, the block is remembered as live (unless the
/// process could not track its free: counted), and the sample goes out with `flags`, its
/// stack walked here when `WALK` (a Go runtime's: [`emit_walking_frames`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn in_process_sample<C: EbpfContext, const WALK: bool>(
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
    if WALK {
        emit_walking_frames(ctx, &sample);
    } else {
        emit(ctx, &sample);
    }
}

/// A probe of another program's allocator (`otel_memory`/`ddheap` `alloc(ptr, size,
/// weight)` or `free(ptr)`), its arguments where spec `index` says.
#[inline(always)]
pub fn on_producer(ctx: &ProbeContext, index: u32) {
    let Some(spec) = USDT_SPECS.get(index) else {
        return;
    };
    use sampler_common::usdt::{
        KIND_FREE, KIND_RUNTIME_ALLOC, KIND_RUNTIME_FREED, KIND_RUNTIME_FREEING,
        KIND_RUNTIME_FREE_IF,
    };
    if spec.kind == KIND_RUNTIME_FREED {
        on_runtime_freed();
        return;
    }
    let pointer = usdt_argument(ctx, &spec.arguments[0]);
    if spec.kind == KIND_FREE {
        on_free(pointer);
        return;
    }
    if spec.kind == KIND_RUNTIME_FREEING {
        on_runtime_freeing(pointer);
        return;
    }
    if spec.kind == KIND_RUNTIME_FREE_IF {
        if usdt_argument(ctx, &spec.arguments[1]) == spec.guard {
            on_free(pointer);
        }
        return;
    }
    let size = usdt_argument(ctx, &spec.arguments[1]);
    let third = usdt_argument(ctx, &spec.arguments[2]);
    if spec.kind == KIND_RUNTIME_ALLOC {
        on_runtime_alloc(ctx, pointer, size, third);
    } else {
        on_producer_alloc(ctx, pointer, size, third);
    }
}

/// A block a language runtime's own sampler drew at mean `rate` bytes (Go's
/// `runtime.mProf_Malloc`, `rate` its `MemProfileRate` now): remembered as live and sent
/// with the stack at the probe, for user space to weigh by its inclusion probability.
#[inline(always)]
fn on_runtime_alloc(ctx: &ProbeContext, address: u64, size: u64, rate: u64) {
    // A rate of 0 turns the runtime's sampler off; a negative one is not a rate.
    if size == 0 || rate == 0 || rate > i64::MAX as u64 {
        return;
    }
    // Go's prologue checks the stack first: the probed instruction is single-stepped, and
    // a signal then (Go preempts with SIGURG) or the stack's growth runs it again.
    let Some(state) = thread_state(bpf_get_current_pid_tgid() as u32) else {
        count_loss(LossCounter::ThreadStateFull);
        return;
    };
    // SAFETY: this thread's own entry, valid for the program's run.
    let last = unsafe { core::mem::replace(&mut (*state).runtime_last, address) };
    if last == address {
        return;
    }
    in_process_sample::<_, true>(
        ctx,
        address,
        size,
        0,
        rate,
        AllocFn::Malloc,
        false,
        FLAG_RUNTIME_RATE,
    );
}

/// The runtime is freeing `pointer`'s bookkeeping (Go's `runtime.freeSpecial`): kept for
/// this thread until its `mProf_Free` says the block was a sampled one.
#[inline(always)]
fn on_runtime_freeing(pointer: u64) {
    if !config::track_frees() {
        return;
    }
    if let Some(state) = thread_state(bpf_get_current_pid_tgid() as u32) {
        // SAFETY: this thread's own entry, valid for the program's run.
        unsafe { (*state).freeing = pointer };
    }
}

/// The block of this thread's last [`on_runtime_freeing`] was a sampled one, now freed.
#[inline(always)]
fn on_runtime_freed() {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(state) = THREADS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: this thread's own entry, valid for the program's run.
    let pointer = unsafe { core::mem::replace(&mut (*state).freeing, 0) };
    if pointer != 0 {
        on_free(pointer);
    }
}

/// A block another program's allocator sampled and weighed (`weight`: the bytes it stands
/// for): remembered as live, and sent with the stack at the probe.
#[inline(always)]
pub(super) fn on_producer_alloc(ctx: &ProbeContext, address: u64, size: u64, weight: u64) {
    if size == 0 || weight == 0 {
        return;
    }
    // The weight travels as the interval; the sampled byte's offset is unknown.
    in_process_sample::<_, false>(
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
