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
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_get_func_ip, bpf_get_prandom_u32,
        bpf_get_smp_processor_id, bpf_get_stack, bpf_ktime_get_ns, bpf_probe_read_user, generated,
    },
    programs::ProbeContext,
    EbpfContext,
};
use aya_log_ebpf::warn;
use sampler_common::{
    cookie, geometric, preload, AllocFn, EventKind, FreeEvent, LiveKey, LossCounter, LostKey,
    LostSamples, ProcessCounters, SampleRecord, StackCopy, ThreadState, FLAG_STACK_AT_RETURN,
    FLAG_STACK_COPY, FLAG_TRACKED, FLAG_WEIGHTED, HOST_SLOT, MAX_STACK_COPY, MAX_STACK_DEPTH,
    RETURN_SLOTS, STACK_PAGE,
};

use crate::{
    config,
    maps::{
        count_loss, COUNTERS, EXCLUDED, FOLLOWED, GATE, HOST_COUNTERS, LIVE, LOST, RATE, SAMPLES,
        SCRATCH, THREADS, USDT_SPECS,
    },
};

/// How the return of an allocation call is observed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Returns {
    /// Classic return probes fire on every call (or none are attached: alloc-only).
    Classic,
    /// A uprobe session: the return runs only when the entry asks (returns 0).
    OnRequest,
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
    if config::duty_cycled() && !gate_open() {
        // Between on slots: attached (about to detach, or just attached), not counted.
        return false;
    }
    // A small-object allocator (CPython's) counts only what it serves itself; the rest it
    // passes to malloc, which counts it. It leaves no marker, so that malloc does.
    let small_objects = cookie::is_small_objects(cookie);
    let passed_on = small_objects && (size == 0 || size > cookie::SMALL_OBJECT_LIMIT);
    let tracking = config::track_frees();
    if passed_on && !tracking {
        return false;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if excluded(pid) {
        return false;
    }
    let Some(state) = thread_state(tid) else {
        count_loss(LossCounter::ThreadStateFull);
        if config::log_enabled() {
            warn!(ctx, "thread map refused tid {}: call not counted", tid);
        }
        return false;
    };
    // SAFETY: the map value stays valid for the program's run; only this thread (running
    // this program now) touches its own entry.
    let state = unsafe { &mut *state };
    let regs = ctx.as_ptr() as *mut pt_regs;
    // SAFETY: reading the saved registers of the probed task from the context.
    let (sp, ip) = unsafe { ((*regs).rsp, (*regs).rip) };
    let mut caller = 0;
    if tracking {
        // Returns are probed: the kernel may put its trampoline in this return slot, even
        // of a call not counted here.
        caller = return_address(sp);
        let at = (state.return_next as usize) & (RETURN_SLOTS - 1);
        state.return_slots[at] = sp;
        state.return_values[at] = caller;
        state.return_next = state.return_next.wrapping_add(1);
    }
    if passed_on {
        return false;
    }
    // An outer malloc (an interposer's) marks its call like the functions that may nest
    // one, so that the malloc it calls is not counted again.
    let outer = function == AllocFn::Malloc && cookie::is_outer(cookie);
    if function == AllocFn::Malloc {
        if state.marker_sp != 0 {
            if caller == 0 {
                caller = return_address(sp);
            }
            // A marker this very function left (a stale one of an outer malloc that did not
            // call another, then called again from the same frame) is not an outer call.
            let nested = is_nested(state, sp, caller) && state.marker_ip != ip;
            state.marker_sp = 0;
            if nested {
                return false;
            }
        }
    } else if state.marker_sp != 0 && sp < state.marker_sp {
        // Another probed function called (not tail-called) from inside the marked one
        // (tcmalloc's posix_memalign calls its memalign): counted by the outer call. Only
        // the call form is sound here: a stale marker's (sp, return address) pair can
        // repeat for a non-malloc function, but a return address inside the marked function
        // means that function is running now.
        if caller == 0 {
            caller = return_address(sp);
        }
        if caller.wrapping_sub(state.marker_ip) < config::function_size(state.marker_fn) {
            return false;
        }
    }
    let leaves_marker = (function.may_nest_malloc() || outer) && !small_objects;
    if leaves_marker {
        if caller == 0 {
            caller = return_address(sp);
        }
        state.marker_sp = sp;
        state.marker_ret = caller;
        state.marker_ip = ip;
        state.marker_fn = function as u64;
        // Set by `arm` once this call knows whether its return is observed.
        state.marker_armed = 0;
    }
    count_call(cookie::slot(cookie), pid, size);
    let mut wants_return = false;
    if tracking && function == AllocFn::Realloc && pointer != 0 && is_live(pid, pointer) {
        // Freed by the realloc only if it succeeds: decided at the return.
        state.pending_free = pointer;
        state.pending_realloc_size = size;
        state.pending_sp = sp;
        wants_return = true;
    }
    if state.countdown >= size {
        state.countdown -= size;
        return arm(state, leaves_marker, returns, wants_return);
    }
    let offset = state.countdown;
    let interval = state.interval;
    (state.countdown, state.interval) = draw();
    if tracking {
        // The address is known at the return, where the stack starts at the caller.
        state.pending_size = size;
        state.pending_offset = offset;
        state.pending_function = function as u64;
        state.pending_interval = interval;
        state.pending_memptr = if function == AllocFn::PosixMemalign {
            pointer
        } else {
            0
        };
        state.pending_sp = sp;
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
        return_slots: [0; RETURN_SLOTS],
        return_values: [0; RETURN_SLOTS],
        return_next: 0,
    };
    emit(ctx, &sample);
    false
}

/// Notes, for a marker this call left, whether its return will be observed (classic
/// return probes observe every call; a session only the calls that ask); passes
/// `wants_return` through. Without free tracking no return is observed at all.
#[inline(always)]
fn arm(state: &mut ThreadState, left_marker: bool, returns: Returns, wants_return: bool) -> bool {
    if left_marker {
        let observed = returns == Returns::Classic || wants_return;
        state.marker_armed = u64::from(config::track_frees() && observed);
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
    if sp == state.marker_sp.wrapping_add(8) {
        // The function that left the nesting marker returned: it cannot nest any more.
        state.marker_sp = 0;
    }
    if state.pending_size == 0 && state.pending_free == 0 {
        return;
    }
    // Only the return of the call that left the pending state: `ret` popped the return
    // address pushed below the entry's stack pointer. (A malloc called from inside
    // posix_memalign returns deeper in the stack; a tail-called one returns here, with the
    // very value the caller gets.)
    if sp != state.pending_sp.wrapping_add(8) {
        return;
    }
    if state.pending_free != 0 {
        // realloc: a new block, or size 0 (glibc frees and returns NULL), frees the old one.
        if returned != 0 || state.pending_realloc_size == 0 {
            free_tracked(pid, state.pending_free);
        }
        state.pending_free = 0;
    }
    if state.pending_size == 0 {
        return;
    }
    let function = AllocFn::from_u32(state.pending_function as u32).unwrap_or(AllocFn::Malloc);
    let address = if function == AllocFn::PosixMemalign {
        // Returns 0 on success, having stored the block at *memptr.
        if returned == 0 {
            // SAFETY: bpf_probe_read_user checks the user address.
            unsafe { bpf_probe_read_user(state.pending_memptr as *const u64) }.unwrap_or(0)
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
        size: state.pending_size,
        offset: state.pending_offset,
        interval: state.pending_interval,
        caller: 0,
        address,
        flags,
        return_slots: state.return_slots,
        return_values: state.return_values,
        return_next: state.return_next,
    };
    state.pending_size = 0;
    emit(ctx, &sample);
}

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
fn in_process_sample<C: EbpfContext>(
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
        return_slots: [0; RETURN_SLOTS],
        return_values: [0; RETURN_SLOTS],
        return_next: 0,
    };
    emit(ctx, &sample);
}

/// Entry of `free(address)`: one lookup; only a sampled block produces an event.
#[inline(always)]
pub fn on_free(address: u64) {
    if address == 0 {
        return;
    }
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if excluded(pid) {
        return;
    }
    free_tracked(pid, address);
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

/// Remembers sampled block `address` of `pid` as live, with the time: [`FLAG_TRACKED`], or
/// 0 (counted) when the live map is full.
#[inline(always)]
fn track_live(pid: u32, address: u64) -> u32 {
    let key = LiveKey {
        pid,
        pad: 0,
        address,
    };
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if LIVE.insert(key, now, 0).is_ok() {
        FLAG_TRACKED
    } else {
        count_loss(LossCounter::LiveMapFull);
        0
    }
}

#[inline(always)]
fn is_live(pid: u32, address: u64) -> bool {
    let key = LiveKey {
        pid,
        pad: 0,
        address,
    };
    LIVE.get_ptr(key).is_some()
}

/// Forgets a tracked block and tells user space; nothing for an unknown address (not
/// sampled, allocated before attach, or already freed: a double free).
#[inline(always)]
fn free_tracked(pid: u32, address: u64) {
    let key = LiveKey {
        pid,
        pad: 0,
        address,
    };
    // A lockless lookup first: the unsampled majority stops here, without taking the
    // bucket lock a delete takes even when the key is absent.
    if LIVE.get_ptr(key).is_none() || LIVE.remove(key).is_err() {
        return;
    }
    let Some(mut entry) = SAMPLES.reserve::<FreeEvent>(0) else {
        count_loss(LossCounter::FreeEventLost);
        return;
    };
    // SAFETY: helper without preconditions.
    let timestamp_ns = unsafe { bpf_ktime_get_ns() };
    entry.write(FreeEvent {
        kind: EventKind::Free as u32,
        pid,
        timestamp_ns,
        address,
    });
    entry.submit(0);
}

/// A malloc entered from inside a hooked function that already counted this allocation:
/// either a tail call (same stack pointer and return address as that function's entry) or
/// a call whose return address lies inside that function's code.
///
/// When the outer function's return is probed (`marker_armed`), the kernel has replaced its
/// return address by a trampoline after our entry program read it, so a tail-called malloc
/// sees the trampoline there: the stack pointer alone identifies the tail call, which is
/// exact because that same return clears the marker (no stale marker can match a later
/// call from the same frame). Someone else's return probe on the outer function (another
/// tracer, or a session of another allocscope that filtered this process out — the kernel
/// still arms its return) puts the trampoline there too: recognized by its address.
#[inline(always)]
fn is_nested(state: &ThreadState, sp: u64, caller: u64) -> bool {
    let hijacked = caller.wrapping_sub(sampler_common::UPROBE_TRAMPOLINE) < 4096;
    let tail_call = sp == state.marker_sp
        && (caller == state.marker_ret || state.marker_armed != 0 || hijacked);
    tail_call
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

/// What a sample's record says, before the stack is added.
struct Sample {
    pid: u32,
    tid: u32,
    function: AllocFn,
    size: u64,
    offset: u64,
    /// The mean interval its countdown was drawn at.
    interval: u64,
    caller: u64,
    address: u64,
    flags: u32,
    /// The thread's return-slot ring (frees tracked), copied with a stack copy.
    return_slots: [u64; RETURN_SLOTS],
    return_values: [u64; RETURN_SLOTS],
    return_next: u64,
}

/// Sends a sample with the user stack of `ctx` (the entry's or the return's): the
/// frame-pointer walk's return addresses, or a copy of the stack's top for user space to
/// unwind with the modules' CFI. The record is assembled in this CPU's scratch slot and
/// sent with its used length only.
#[inline(always)]
fn emit<C: EbpfContext>(ctx: &C, sample: &Sample) {
    // SAFETY: helper without arguments.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(record) = SCRATCH.get_ptr_mut(cpu) else {
        // Unreachable while user space sizes the map to the possible CPUs; the sample
        // still counts, like one the ring buffer refused.
        lost(ctx, sample);
        return;
    };
    // SAFETY: this CPU's slot, valid for the program's run. A uprobe program runs with
    // migration disabled, not preemption: a task preempting this one on this CPU could
    // reuse the slot before it is sent. The bytes are plain integers either way; such a
    // record's stack fails the user side's checks and ends early, under its end reason.
    let record = unsafe { &mut *record };
    let regs = ctx.as_ptr() as *const pt_regs;
    let event = &mut record.event;
    event.kind = EventKind::Alloc as u32;
    event.flags = sample.flags;
    // SAFETY: helper without preconditions.
    event.timestamp_ns = unsafe { bpf_ktime_get_ns() };
    event.size = sample.size;
    event.offset = sample.offset;
    event.interval = sample.interval;
    event.return_address = sample.caller;
    event.address = sample.address;
    event.pid = sample.pid;
    event.tid = sample.tid;
    event.function = sample.function as u32;
    let window = config::stack_bytes();
    let payload = if window != 0 {
        event.flags |= FLAG_STACK_COPY;
        // SAFETY: the probed task's saved registers, valid for the program's run.
        let (ip, sp, bp) = unsafe { ((*regs).rip, (*regs).rsp, (*regs).rbp) };
        record.copy = StackCopy {
            ip,
            sp,
            bp,
            start: sp,
            return_slots: sample.return_slots,
            return_values: sample.return_values,
            return_next: sample.return_next,
        };
        copy_stack(&mut record.payload, sp, window)
    } else {
        record.copy = StackCopy::default();
        // SAFETY: writes at most the given size into the payload array.
        let bytes = unsafe {
            bpf_get_stack(
                ctx.as_ptr(),
                record.payload.as_mut_ptr().cast(),
                (MAX_STACK_DEPTH * 8) as u32,
                BPF_F_USER_STACK as u64,
            )
        };
        if bytes < 0 {
            count_loss(LossCounter::StackMissing);
            0
        } else {
            bytes as usize & !7
        }
    };
    record.event.stack_len = if window != 0 {
        payload as u32
    } else {
        (payload / 8) as u32
    };
    let mut size = SampleRecord::HEAD + payload;
    if size > core::mem::size_of::<SampleRecord>() {
        size = core::mem::size_of::<SampleRecord>();
    }
    // SAFETY: `size` is within the record (just bounded), which lives in the map.
    let bytes =
        unsafe { core::slice::from_raw_parts((record as *const SampleRecord).cast::<u8>(), size) };
    if SAMPLES.output::<[u8]>(bytes, 0).is_err() {
        lost(ctx, sample);
        return;
    }
    if config::log_enabled()
        && sample.flags & FLAG_STACK_AT_RETURN != 0
        && sample.flags & FLAG_TRACKED == 0
    {
        warn!(
            ctx,
            "pid {}: sampled block at {:x} not tracked (live map full or failed)",
            sample.pid,
            sample.address
        );
    }
}

/// A sample the ring buffer had no room for.
#[inline(always)]
fn lost<C: EbpfContext>(ctx: &C, sample: &Sample) {
    count_loss(LossCounter::RingBufFull);
    record_lost(sample);
    if config::log_enabled() {
        warn!(
            ctx,
            "ring buffer full: sample of {} bytes in pid {} lost", sample.size, sample.pid
        );
    }
}

/// Copies up to `window` bytes of user stack from `sp` into `payload`: the rest of `sp`'s
/// page, then whole pages while they fit in the window, stopping at the first page that is
/// not mapped (the top of the stack). Returns the bytes copied. Page-sized reads keep each read's size a constant the
/// verifier can check against the payload, and a stack's end is a page boundary.
#[inline(always)]
fn copy_stack(payload: &mut [u8; MAX_STACK_COPY], sp: u64, window: u64) -> usize {
    let first = STACK_PAGE - (sp as usize & (STACK_PAGE - 1));
    // SAFETY: `first` ≤ STACK_PAGE bytes into the payload; the helper checks the user
    // address and fails (zero-filling) on a fault.
    if unsafe {
        generated::bpf_probe_read_user(payload.as_mut_ptr().cast(), first as u32, sp as *const _)
    } != 0
    {
        return 0;
    }
    let mut copied = first;
    for _ in 0..MAX_STACK_COPY / STACK_PAGE {
        if (copied + STACK_PAGE) as u64 > window || copied > MAX_STACK_COPY - STACK_PAGE {
            break;
        }
        // SAFETY: copied + STACK_PAGE ≤ MAX_STACK_COPY (checked above); the helper checks
        // the user address.
        let failed = unsafe {
            generated::bpf_probe_read_user(
                payload.as_mut_ptr().add(copied).cast(),
                STACK_PAGE as u32,
                (sp + copied as u64) as *const _,
            )
        } != 0;
        if failed {
            break;
        }
        copied += STACK_PAGE;
    }
    copied
}

/// Keeps what the estimates need of a sample that could not be sent: its size, interval
/// and remainder, added up per (pid, size, interval). A block it tracked is forgotten, so
/// its free sends nothing about a sample user space never saw.
#[inline(always)]
fn record_lost(sample: &Sample) {
    if sample.flags & FLAG_TRACKED != 0 {
        let _ = LIVE.remove(LiveKey {
            pid: sample.pid,
            pad: 0,
            address: sample.address,
        });
    }
    let key = LostKey {
        pid: sample.pid,
        pad: 0,
        size: sample.size,
        interval: sample.interval,
    };
    let unseen = sample.size.wrapping_sub(sample.offset);
    if let Some(lost) = LOST.get_ptr_mut(key) {
        // SAFETY: per-CPU value of this CPU; nothing else writes it during this run.
        let lost = unsafe { &mut *lost };
        lost.samples += 1;
        lost.unseen += unseen;
        return;
    }
    let first = LostSamples { samples: 1, unseen };
    if LOST.insert(key, first, 0).is_err() {
        count_loss(LossCounter::LostUnrecorded);
    }
}

/// The running program's attach cookie ([`sampler_common::cookie`]).
#[inline(always)]
pub fn cookie<C: EbpfContext>(ctx: &C) -> u64 {
    // SAFETY: the helper only reads the cookie of the running program's attachment.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

/// The size `function` is asked for and its pointer argument (`realloc`'s old block,
/// `posix_memalign`'s `memptr`; 0 otherwise), each read where the cookie says it is.
#[inline(always)]
pub fn arguments(ctx: &ProbeContext, cookie: u64, function: AllocFn) -> (u64, u64) {
    let arg = |n: usize| argument(ctx, cookie, n);
    match function {
        AllocFn::Malloc | AllocFn::Valloc | AllocFn::Pvalloc | AllocFn::New => (arg(0), 0),
        AllocFn::Calloc => (geometric::saturating_product(arg(0), arg(1)), 0),
        AllocFn::Realloc => (arg(1), arg(0)),
        AllocFn::PosixMemalign => (arg(2), arg(0)),
        AllocFn::AlignedAlloc | AllocFn::Memalign => (arg(1), 0),
    }
}

/// Argument `n`: in its own register, or in the one the prologue before the probed
/// instruction moved it to.
#[inline(always)]
fn argument(ctx: &ProbeContext, cookie: u64, n: usize) -> u64 {
    match cookie::moved(cookie, n) {
        0 => ctx.arg::<u64>(n).unwrap_or(0),
        code => register(ctx, code),
    }
}

/// The probed task's register of `code` ([`cookie::Register`]'s, or
/// [`sampler_common::usdt::REGISTER_RSP`]); 0 for an unknown code.
#[inline(always)]
fn register(ctx: &ProbeContext, code: u8) -> u64 {
    use cookie::Register;
    let regs = ctx.regs;
    // The verifier accepts only constant offsets into the context: one volatile load per
    // arm keeps the compiler from turning the match into a computed address.
    // SAFETY: `regs` is the probed task's saved registers, valid for the program's run.
    let read = |field: *const u64| unsafe { core::ptr::read_volatile(field) };
    if code == sampler_common::usdt::REGISTER_RSP {
        // SAFETY: as below.
        return read(unsafe { &raw const (*regs).rsp });
    }
    let Some(register) = Register::from_code(code) else {
        return 0;
    };
    // SAFETY: each arm takes the address of a field of `*regs` (nothing is dereferenced
    // but by `read`).
    unsafe {
        match register {
            Register::Rdi => read(&raw const (*regs).rdi),
            Register::Rsi => read(&raw const (*regs).rsi),
            Register::Rdx => read(&raw const (*regs).rdx),
            Register::Rcx => read(&raw const (*regs).rcx),
            Register::R8 => read(&raw const (*regs).r8),
            Register::R9 => read(&raw const (*regs).r9),
            Register::Rax => read(&raw const (*regs).rax),
            Register::Rbx => read(&raw const (*regs).rbx),
            Register::Rbp => read(&raw const (*regs).rbp),
            Register::R10 => read(&raw const (*regs).r10),
            Register::R11 => read(&raw const (*regs).r11),
            Register::R12 => read(&raw const (*regs).r12),
            Register::R13 => read(&raw const (*regs).r13),
            Register::R14 => read(&raw const (*regs).r14),
            Register::R15 => read(&raw const (*regs).r15),
        }
    }
}

/// One argument of another program's USDT probe, where its spec says it is.
#[inline(always)]
fn usdt_argument(ctx: &ProbeContext, argument: &sampler_common::usdt::UsdtArgument) -> u64 {
    if argument.register == 0 {
        return argument.extend(argument.value as u64);
    }
    let base = register(ctx, argument.register);
    if argument.deref == 0 {
        return argument.extend(base);
    }
    let at = base.wrapping_add(argument.value as u64);
    // SAFETY: bpf_probe_read_user copies from user memory, failing (not faulting) on a bad
    // address; exactly the argument's bytes are read.
    let raw = unsafe {
        match argument.size {
            1 => bpf_probe_read_user(at as *const u8).map(u64::from),
            2 => bpf_probe_read_user(at as *const u16).map(u64::from),
            4 => bpf_probe_read_user(at as *const u32).map(u64::from),
            _ => bpf_probe_read_user(at as *const u64),
        }
    };
    argument.extend(raw.unwrap_or(0))
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
fn on_producer_alloc(ctx: &ProbeContext, address: u64, size: u64, weight: u64) {
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
