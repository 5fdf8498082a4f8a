//! The sampling decision: count the call, advance the thread's countdown, emit on success.
//!
//! Per call (the hot path, every allocation of a probed process): one pid/tid read, one LRU
//! lookup (thread state), one per-CPU array slot (exact counters, indexed by the attach
//! cookie) and a compare. Only a
//! sampled call draws a new countdown, reads the caller's return address and the user stack,
//! and writes to the ring buffer.

use aya_ebpf::{
    bindings::{pt_regs, BPF_F_USER_STACK},
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_get_stack,
        bpf_ktime_get_ns, bpf_probe_read_user,
    },
    programs::ProbeContext,
};
use aya_log_ebpf::warn;
use sampler_common::{geometric, AllocEvent, AllocFn, LossCounter, ThreadState};

use crate::{
    config,
    maps::{count_loss, COUNTERS, SAMPLES, THREADS},
};

/// Entry of an allocator function asking for `size` bytes.
#[inline(always)]
pub fn on_alloc(ctx: &ProbeContext, function: AllocFn, size: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let Some(state) = thread_state(tid) else {
        count_loss(LossCounter::ThreadStateFull);
        if config::log_enabled() {
            warn!(ctx, "thread map refused tid {}: call not counted", tid);
        }
        return;
    };
    // SAFETY: the map value stays valid for the program's run; only this thread (running
    // this program now) touches its own entry.
    let state = unsafe { &mut *state };
    let regs = ctx.regs;
    // SAFETY: reading the saved registers of the probed task from the context.
    let (sp, ip) = unsafe { ((*regs).rsp, (*regs).rip) };
    let mut caller = 0;
    if function == AllocFn::Malloc {
        if state.marker_sp != 0 {
            caller = return_address(sp);
            let nested = is_nested(state, sp, caller);
            state.marker_sp = 0;
            if nested {
                return;
            }
        }
    } else if function.may_nest_malloc() {
        caller = return_address(sp);
        state.marker_sp = sp;
        state.marker_ret = caller;
        state.marker_ip = ip;
        state.marker_fn = function as u64;
    }
    count_call(ctx, size);
    if state.countdown >= size {
        state.countdown -= size;
        return;
    }
    let offset = state.countdown;
    state.countdown = draw();
    if caller == 0 {
        caller = return_address(sp);
    }
    emit(ctx, regs, pid, tid, function, size, offset, caller);
}

/// A malloc entered from inside a hooked function that already counted this allocation:
/// either a tail call (same stack pointer and return address as that function's entry) or
/// a call whose return address lies inside that function's code.
#[inline(always)]
fn is_nested(state: &ThreadState, sp: u64, caller: u64) -> bool {
    (sp == state.marker_sp && caller == state.marker_ret)
        || (sp < state.marker_sp
            && caller.wrapping_sub(state.marker_ip) < config::function_size(state.marker_fn))
}

#[inline(always)]
fn thread_state(tid: u32) -> Option<*mut ThreadState> {
    if let Some(state) = THREADS.get_ptr_mut(tid) {
        return Some(state);
    }
    // A new (or evicted) thread starts a fresh countdown: legal, the choice to redraw does
    // not depend on the discarded value.
    let fresh = ThreadState {
        countdown: draw(),
        ..ThreadState::default()
    };
    THREADS.insert(tid, fresh, 0).ok()?;
    THREADS.get_ptr_mut(tid)
}

/// Adds the call to its target's exact counters. User space attaches each target's probes
/// with that target's slot as the cookie.
#[inline(always)]
fn count_call(ctx: &ProbeContext, size: u64) {
    // SAFETY: the helper only reads the cookie of the running program's attachment.
    let slot = unsafe { bpf_get_attach_cookie(ctx.regs.cast()) } as u32;
    if let Some(counters) = COUNTERS.get_ptr_mut(slot) {
        // SAFETY: per-CPU value of this CPU; nothing else writes it during this run.
        let counters = unsafe { &mut *counters };
        counters.calls += 1;
        counters.bytes += size;
    } else {
        count_loss(LossCounter::CountersFull);
    }
}

#[inline(always)]
fn draw() -> u64 {
    // SAFETY: helper without arguments or preconditions.
    let random = unsafe { (bpf_get_prandom_u32() as u64) << 32 | bpf_get_prandom_u32() as u64 };
    geometric::draw(random, config::scale_q32())
}

#[inline(always)]
fn return_address(sp: u64) -> u64 {
    // SAFETY: bpf_probe_read_user checks the user address; a fault yields an error, not UB.
    unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0)
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn emit(
    ctx: &ProbeContext,
    regs: *mut pt_regs,
    pid: u32,
    tid: u32,
    function: AllocFn,
    size: u64,
    offset: u64,
    caller: u64,
) {
    let Some(mut entry) = SAMPLES.reserve::<AllocEvent>(0) else {
        count_loss(LossCounter::RingBufFull);
        if config::log_enabled() {
            warn!(
                ctx,
                "ring buffer full: sample of {} bytes in pid {} lost", size, pid
            );
        }
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points to a reserved, exclusively owned ring-buffer record of the
    // right size; every field is written before submit.
    unsafe {
        (*event).timestamp_ns = bpf_ktime_get_ns();
        (*event).size = size;
        (*event).offset = offset;
        (*event).interval = config::interval();
        (*event).return_address = caller;
        (*event).pid = pid;
        (*event).tid = tid;
        (*event).function = function as u32;
        let stack = core::ptr::addr_of_mut!((*event).stack);
        let bytes = bpf_get_stack(
            regs.cast(),
            stack.cast(),
            core::mem::size_of::<[u64; sampler_common::MAX_STACK_DEPTH]>() as u32,
            BPF_F_USER_STACK as u64,
        );
        if bytes < 0 {
            (*event).stack_len = 0;
            count_loss(LossCounter::StackMissing);
            if config::log_enabled() {
                warn!(ctx, "no user stack for pid {} (error {})", pid, bytes);
            }
        } else {
            (*event).stack_len = (bytes as u32) / 8;
        }
    }
    entry.submit(0);
}
