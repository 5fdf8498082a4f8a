//! The sampling decision: count the call, advance the thread's countdown, emit on success;
//! with frees tracked, complete a sampled call at its return and forget freed blocks.
//!
//! Per call (the hot path, every allocation of a probed process): one pid/tid read, one LRU
//! lookup (thread state), one per-CPU array slot (exact counters, indexed by the attach
//! cookie) and a compare. Only a sampled call draws a new countdown, reads the caller's
//! return address and the user stack, and writes to the ring buffer. Per `free`: one
//! lockless lookup in the live map.

use aya_ebpf::{
    bindings::{pt_regs, BPF_F_USER_STACK},
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_func_ip,
        bpf_get_prandom_u32, bpf_get_smp_processor_id, bpf_get_stack, bpf_ktime_get_ns,
        bpf_probe_read_user, generated,
    },
    programs::ProbeContext,
    EbpfContext,
};
use aya_log_ebpf::warn;
use sampler_common::{
    cookie, geometric, preload, AllocFn, EventKind, FreeEvent, LiveKey, LossCounter, LostKey,
    LostSamples, ProcessCounters, ReturnSlots, SampleRecord, StackCopy, ThreadState,
    FLAG_RUNTIME_RATE, FLAG_STACK_AT_RETURN, FLAG_STACK_COPY, FLAG_TRACKED, FLAG_WEIGHTED,
    HOST_SLOT, MAX_STACK_COPY, MAX_STACK_DEPTH, RETURN_SLOTS, STACK_PAGE,
};

use crate::{
    config,
    maps::{
        count_loss, COUNTERS, EXCLUDED, FOLLOWED, FRONT_END, GATE, HOST_COUNTERS, LIVE, LOST, RATE,
        SAMPLES, SCRATCH, THREADS, USDT_SPECS,
    },
};

mod arguments;
mod emit;
mod in_process;
mod live;
mod python;

use arguments::usdt_argument;
pub use arguments::{arguments, cookie};
use emit::{emit, emit_walking_frames, Sample};
pub use in_process::{on_producer, on_usdt_alloc};
pub use live::on_free;
use live::{free_tracked, is_live, track_live};

/// How the return of an allocation call is observed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Returns {
    /// Classic return probes fire on every call (or none are attached: alloc-only).
    Classic,
    /// A uprobe session: the return runs only when the entry asks (returns 0).
    OnRequest,
}

/// A call that counts: its process and thread, the thread's state, and whether a
/// small-object allocator passes it on to malloc (which counts it).
struct Call<'a> {
    pid: u32,
    tid: u32,
    state: &'a mut ThreadState,
    small_objects: bool,
    passed_on: bool,
}

/// The gates before a call counts: the duty cycle's, a small-object allocator passing the
/// call on (only seen with frees tracked, for its return slot), an excluded process, a
/// thread whose state the map refused (counted as a loss).
#[inline(always)]
fn enter<'a, C: EbpfContext>(ctx: &C, cookie: u64, size: u64) -> Option<Call<'a>> {
    if config::duty_cycled() && !gate_open() {
        // Between on slots: attached (about to detach, or just attached), not counted.
        return None;
    }
    // A small-object allocator (CPython's) counts only what it serves itself; the rest it
    // passes to malloc, which counts it. It leaves no marker, so that malloc does.
    let small_objects = cookie::is_small_objects(cookie);
    let passed_on = small_objects && (size == 0 || size > cookie::SMALL_OBJECT_LIMIT);
    if passed_on && !config::track_frees() {
        return None;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if excluded(pid) || left_to_front_end(pid, cookie) {
        return None;
    }
    let Some(state) = thread_state(tid) else {
        count_loss(LossCounter::ThreadStateFull);
        if config::log_enabled() {
            warn!(ctx, "thread map refused tid {}: call not counted", tid);
        }
        return None;
    };
    // SAFETY: the map value stays valid for the program's run; only this thread (running
    // this program now) touches its own entry.
    let state = unsafe { &mut *state };
    Some(Call {
        pid,
        tid,
        state,
        small_objects,
        passed_on,
    })
}

/// The probed task's stack pointer and instruction pointer.
#[inline(always)]
fn registers<C: EbpfContext>(ctx: &C) -> (u64, u64) {
    let regs = ctx.as_ptr() as *mut pt_regs;
    // SAFETY: reading the saved registers of the probed task from the context.
    unsafe { ((*regs).rsp, (*regs).rip) }
}

/// Returns are probed: the kernel may put its trampoline in this call's return slot, even
/// of a call not counted here; its slot and value go into the ring. Returns the caller.
#[inline(always)]
fn note_return_slot(state: &mut ThreadState, sp: u64) -> u64 {
    let caller = return_address(sp);
    let returns = &mut state.returns;
    let at = (returns.next as usize) & (RETURN_SLOTS - 1);
    returns.slots[at] = sp;
    returns.values[at] = caller;
    returns.next = returns.next.wrapping_add(1);
    caller
}

/// Whether this call of `function` is nested in a marked one (and so counted by it); a
/// malloc consumes the marker. `caller` is read when needed.
#[inline(always)]
fn nested_in_marked(
    state: &mut ThreadState,
    function: AllocFn,
    sp: u64,
    ip: u64,
    caller: &mut u64,
) -> bool {
    if state.marker.sp == 0 || (function != AllocFn::Malloc && sp >= state.marker.sp) {
        return false;
    }
    if *caller == 0 {
        *caller = return_address(sp);
    }
    if function == AllocFn::Malloc {
        // A marker this very function left (a stale one of an outer malloc that did not
        // call another, then called again from the same frame) is not an outer call.
        let nested = is_nested(state, sp, *caller) && state.marker.ip != ip;
        state.marker.sp = 0;
        return nested;
    }
    // Another probed function called (not tail-called) from inside the marked one
    // (tcmalloc's posix_memalign calls its memalign): counted by the outer call. Only the
    // call form is sound here: a stale marker's (sp, return address) pair can repeat for a
    // non-malloc function, but a return address inside the marked function means that
    // function is running now.
    caller.wrapping_sub(state.marker.ip) < config::function_size(state.marker.function)
}

/// Marks this call of `function` as one a nested probed call is recognised by.
#[inline(always)]
fn leave_marker(state: &mut ThreadState, function: AllocFn, sp: u64, ip: u64, caller: u64) {
    state.marker.sp = sp;
    state.marker.ret = caller;
    state.marker.ip = ip;
    state.marker.function = function as u64;
    // Set by `arm` once this call knows whether its return is observed.
    state.marker.armed = 0;
}

/// Entry of an allocator function asking for `size` bytes. `pointer` is realloc's old
/// pointer or posix_memalign's `memptr` (0 otherwise). Returns whether this call's return
/// must be observed (a pending sample or a tracked realloc'd pointer).
#[inline(always)]
pub fn on_alloc<C: EbpfContext>(
    ctx: &C,
    cookie: u64,
    function: AllocFn,
    size: u64,
    pointer: u64,
    returns: Returns,
) -> bool {
    let Some(Call {
        pid,
        tid,
        state,
        small_objects,
        passed_on,
    }) = enter(ctx, cookie, size)
    else {
        return false;
    };
    let (sp, ip) = registers(ctx);
    let tracking = config::track_frees();
    let mut caller = if tracking {
        note_return_slot(state, sp)
    } else {
        0
    };
    if passed_on || nested_in_marked(state, function, sp, ip, &mut caller) {
        return false;
    }
    // An outer malloc (an interposer's) marks its call like the functions that may nest
    // one, so that the malloc it calls is not counted again.
    let outer = function == AllocFn::Malloc && cookie::is_outer(cookie);
    let leaves_marker = (function.may_nest_malloc() || outer) && !small_objects;
    if leaves_marker {
        if caller == 0 {
            caller = return_address(sp);
        }
        leave_marker(state, function, sp, ip, caller);
    }
    count_call(cookie::slot(cookie), pid, size);
    let wants_return =
        tracking && function == AllocFn::Realloc && pend_free(state, pid, pointer, size, sp);
    if state.countdown >= size {
        state.countdown -= size;
        return arm(state, leaves_marker, returns, wants_return);
    }
    let offset = state.countdown;
    let interval = state.interval;
    (state.countdown, state.interval) = draw();
    if tracking {
        // The address is known at the return, where the stack starts at the caller.
        let pending = &mut state.pending;
        (pending.size, pending.offset, pending.interval) = (size, offset, interval);
        pending.function = function as u64;
        let memptr = function == AllocFn::PosixMemalign;
        pending.memptr = if memptr { pointer } else { 0 };
        pending.sp = sp;
        return arm(state, leaves_marker, returns, true);
    }
    if caller == 0 {
        caller = return_address(sp);
    }
    let sample = Sample {
        pid,
        tid,
        function,
        size,
        offset,
        interval,
        caller,
        address: 0,
        flags: 0,
        returns: ReturnSlots::default(),
    };
    emit(ctx, &sample);
    false
}

/// A realloc of live sampled block `pointer` frees it only if it succeeds: decided at the
/// return, which must then be observed.
#[inline(always)]
fn pend_free(state: &mut ThreadState, pid: u32, pointer: u64, size: u64, sp: u64) -> bool {
    if pointer == 0 || !is_live(pid, pointer) {
        return false;
    }
    state.pending.free = pointer;
    state.pending.realloc_size = size;
    state.pending.sp = sp;
    true
}

/// Notes, for a marker this call left, whether its return will be observed (classic
/// return probes observe every call; a session only the calls that ask); passes
/// `wants_return` through. Without free tracking no return is observed at all.
#[inline(always)]
fn arm(state: &mut ThreadState, left_marker: bool, returns: Returns, wants_return: bool) -> bool {
    if left_marker {
        let observed = returns == Returns::Classic || wants_return;
        state.marker.armed = u64::from(config::track_frees() && observed);
    }
    wants_return
}

/// Return of an allocator function (frees tracked): completes the pending sample of this
/// very call with its address, and settles a realloc's old pointer.
#[inline(always)]
pub fn on_return<C: EbpfContext>(ctx: &C) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let Some(state) = THREADS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: as in on_alloc.
    let state = unsafe { &mut *state };
    let regs = ctx.as_ptr() as *mut pt_regs;
    // SAFETY: reading the saved registers of the probed task from the context.
    let (sp, returned) = unsafe { ((*regs).rsp, (*regs).rax) };
    if sp == state.marker.sp.wrapping_add(8) {
        // The function that left the nesting marker returned: it cannot nest any more.
        state.marker.sp = 0;
    }
    if state.pending.size == 0 && state.pending.free == 0 {
        return;
    }
    // Only the return of the call that left the pending state: `ret` popped the return
    // address pushed below the entry's stack pointer. (A malloc called from inside
    // posix_memalign returns deeper in the stack; a tail-called one returns here, with the
    // very value the caller gets.)
    if sp != state.pending.sp.wrapping_add(8) {
        return;
    }
    if state.pending.free != 0 {
        // realloc: a new block, or size 0 (glibc frees and returns NULL), frees the old one.
        if returned != 0 || state.pending.realloc_size == 0 {
            free_tracked(pid, state.pending.free);
        }
        state.pending.free = 0;
    }
    if state.pending.size == 0 {
        return;
    }
    let function = AllocFn::from_u32(state.pending.function as u32).unwrap_or(AllocFn::Malloc);
    let address = if function == AllocFn::PosixMemalign {
        // Returns 0 on success, having stored the block at *memptr.
        if returned == 0 {
            // SAFETY: bpf_probe_read_user checks the user address.
            unsafe { bpf_probe_read_user(state.pending.memptr as *const u64) }.unwrap_or(0)
        } else {
            0
        }
    } else {
        returned
    };
    let mut flags = FLAG_STACK_AT_RETURN;
    if address != 0 {
        flags |= track_live(pid, address);
    }
    let sample = Sample {
        pid,
        tid,
        function,
        size: state.pending.size,
        offset: state.pending.offset,
        interval: state.pending.interval,
        caller: 0,
        address,
        flags,
        returns: state.returns,
    };
    state.pending.size = 0;
    emit(ctx, &sample);
}

/// Duty cycling: whether user space has the gate open (an on slot).
#[inline(always)]
fn gate_open() -> bool {
    GATE.get(0).is_some_and(|&open| open != 0)
}

/// Whether file-wide probes must ignore `pid`: with a followed set (`--follow`, `--comm`)
/// every process outside it, else (`--all`) the ones the user excluded (and allocscope
/// itself). Pruned by the verifier for scoped probes, which only ever fire in their own
/// process.
#[inline(always)]
fn excluded(pid: u32) -> bool {
    if !config::host_mode() {
        return false;
    }
    if config::followed_only() {
        // SAFETY: a lockless lookup; the value is not read.
        unsafe { FOLLOWED.get(pid) }.is_none()
    } else {
        // SAFETY: as above.
        unsafe { EXCLUDED.get(pid) }.is_some()
    }
}

/// Whether a file-wide probe of a function an in-process front end serves fired in a
/// process that carries one, which counts (and samples) the call itself. Pruned by the
/// verifier for scoped probes, which are never attached behind a front end.
#[inline(always)]
fn left_to_front_end(pid: u32, cookie: u64) -> bool {
    // SAFETY: a lockless lookup; the value is not read.
    config::host_mode()
        && cookie::is_served_by_front_end(cookie)
        && unsafe { FRONT_END.get(pid) }.is_some()
}

/// A malloc entered from inside a hooked function that already counted this allocation:
/// either a tail call (same stack pointer and return address as that function's entry) or
/// a call whose return address lies inside that function's code.
///
/// When the outer function's return is probed (`marker.armed`), the kernel has replaced its
/// return address by a trampoline after our entry program read it, so a tail-called malloc
/// sees the trampoline there: the stack pointer alone identifies the tail call, which is
/// exact because that same return clears the marker (no stale marker can match a later
/// call from the same frame). Someone else's return probe on the outer function (another
/// tracer, or a session of another allocscope that filtered this process out — the kernel
/// still arms its return) puts the trampoline there too: recognized by its address.
#[inline(always)]
fn is_nested(state: &ThreadState, sp: u64, caller: u64) -> bool {
    let hijacked = caller.wrapping_sub(sampler_common::UPROBE_TRAMPOLINE) < 4096;
    let tail_call = sp == state.marker.sp
        && (caller == state.marker.ret || state.marker.armed != 0 || hijacked);
    tail_call
        || (sp < state.marker.sp
            && caller.wrapping_sub(state.marker.ip) < config::function_size(state.marker.function))
}

#[inline(always)]
fn thread_state(tid: u32) -> Option<*mut ThreadState> {
    if let Some(state) = THREADS.get_ptr_mut(tid) {
        return Some(state);
    }
    // A new (or evicted) thread starts a fresh countdown: legal, the choice to redraw does
    // not depend on the discarded value.
    let (countdown, interval) = draw();
    let fresh = ThreadState {
        countdown,
        interval,
        ..ThreadState::default()
    };
    THREADS.insert(tid, fresh, 0).ok()?;
    THREADS.get_ptr_mut(tid)
}

/// Adds the call to the exact counters of target `slot` (from the attach cookie).
#[inline(always)]
fn count_call(slot: u32, pid: u32, size: u64) {
    if slot == HOST_SLOT {
        count_host_call(pid, size);
    } else if let Some(counters) = COUNTERS.get_ptr_mut(slot) {
        // SAFETY: per-CPU value of this CPU; nothing else writes it during this run.
        let counters = unsafe { &mut *counters };
        counters.calls += 1;
        counters.bytes += size;
    } else {
        count_loss(LossCounter::CountersFull);
    }
}

/// A call seen by a host-wide probe: counted in the process's own entry, created on its
/// first call (each CPU has its own copy, so no other writer races this one).
#[inline(always)]
fn count_host_call(pid: u32, size: u64) {
    if let Some(counters) = HOST_COUNTERS.get_ptr_mut(pid) {
        // SAFETY: per-CPU value of this CPU; nothing else writes it during this run.
        let counters = unsafe { &mut *counters };
        counters.calls += 1;
        counters.bytes += size;
        return;
    }
    let first = ProcessCounters {
        calls: 1,
        bytes: size,
    };
    if HOST_COUNTERS.insert(pid, first, 0).is_err() {
        count_loss(LossCounter::CountersFull);
    }
}

/// A new countdown at the rate in force (the throttle's, else the load-time one), and the
/// interval it was drawn at.
#[inline(always)]
fn draw() -> (u64, u64) {
    // SAFETY: helper without arguments or preconditions.
    let random = unsafe { (bpf_get_prandom_u32() as u64) << 32 | bpf_get_prandom_u32() as u64 };
    let (interval, scale) = match RATE.get(0) {
        Some(rate) if rate.interval != 0 => (rate.interval, rate.scale_q32),
        _ => (config::interval(), config::scale_q32()),
    };
    (geometric::draw(random, scale), interval)
}

#[inline(always)]
fn return_address(sp: u64) -> u64 {
    // SAFETY: bpf_probe_read_user checks the user address; a fault yields an error, not UB.
    unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0)
}

/// The uprobe-session program (kernel ≥ 6.13): the same program runs at the entry and, when
/// the entry returned 0, at the return. One program serves every allocation function: the
/// attach cookie carries the function besides the target slot ([`sampler_common::cookie`]).
/// At the entry the instruction pointer is the probed address itself.
#[inline(always)]
pub fn on_session(ctx: &ProbeContext) -> u32 {
    // SAFETY: helpers reading the running program's attachment and context.
    let (cookie, probed) = unsafe {
        (
            bpf_get_attach_cookie(ctx.as_ptr()),
            bpf_get_func_ip(ctx.as_ptr()),
        )
    };
    // SAFETY: reading the saved registers of the probed task from the context.
    let ip = unsafe { (*ctx.regs).rip };
    if ip != probed {
        on_return(ctx);
        return 0;
    }
    let Some(function) = AllocFn::from_u32(cookie::function(cookie)) else {
        return 1;
    };
    let (size, pointer) = arguments(ctx, cookie, function);
    if on_alloc(ctx, cookie, function, size, pointer, Returns::OnRequest) {
        0
    } else {
        1
    }
}
