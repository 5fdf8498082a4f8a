//! allocscope's eBPF programs, each a thin wrapper over [`sample`]:
//!
//! * one entry uprobe per allocator function, reading its size argument(s) (where the attach
//!   cookie says the prologue before the probe moved them) and handing over
//!   to [`sample::on_alloc`];
//! * with frees tracked: `alloc_session`, entry and return of every allocator function as one
//!   uprobe session (kernel ≥ 6.13; loaded by allocscope itself), or else the classic
//!   `alloc_return` return probe; and `free_enter`;
//! * `usdt` on the in-process front end's probes (sampler-preload): the process counted and
//!   sampled the call itself; only sampled blocks and their frees arrive here;
//! * `producer` on another program's sampler's probes (`otel_memory`, `ddheap`, a Go
//!   runtime's), loaded when such a process is found;
//! * `task_newtask`, `process_exec`, `process_exit`: processes followed through fork and
//!   exec (`--follow`), and thread exits (their sampling state is dropped);
//! * `bare_count_enter`, the reference the benchmark compares against.
//!
//! Requires kernel ≥ 5.15 (ring buffer, attach cookies).
#![no_std]
#![feature(asm_experimental_arch)]
#![no_main]

mod config;
mod follow;
mod maps;
mod sample;

use aya_ebpf::{
    macros::{raw_tracepoint, tracepoint, uprobe, uretprobe},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext, TracePointContext},
};
use sampler_common::AllocFn;

/// Argument `n` (0-based) of the probed call as an unsigned integer; 0 if unreadable.
#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// Entry of `function` (classic uprobes): its arguments, where the cookie says they are.
#[inline(always)]
fn enter(ctx: &ProbeContext, function: AllocFn) -> u32 {
    let cookie = sample::cookie(ctx);
    let (size, pointer) = sample::arguments(ctx, cookie, function);
    sample::on_alloc(
        ctx,
        cookie,
        function,
        size,
        pointer,
        sample::Returns::Classic,
    );
    0
}

#[uprobe]
pub fn malloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Malloc)
}

#[uprobe]
pub fn calloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Calloc)
}

#[uprobe]
pub fn realloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Realloc)
}

#[uprobe]
pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::PosixMemalign)
}

#[uprobe]
pub fn aligned_alloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::AlignedAlloc)
}

#[uprobe]
pub fn memalign_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Memalign)
}

#[uprobe]
pub fn valloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Valloc)
}

#[uprobe]
pub fn pvalloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::Pvalloc)
}

#[uprobe]
pub fn new_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, AllocFn::New)
}

/// Entry and return of every allocator function as one uprobe session (kernel ≥ 6.13):
/// only sampled calls pay for the return. Loaded by allocscope's own loader (aya 0.14 has
/// no session links); the section is plain `uprobe` so aya's parser accepts the object.
/// Written without the `#[uprobe]` macro, whose wrapper always returns 0: here the return
/// value is the session's answer (0: run me at the return, 1: don't).
#[no_mangle]
#[link_section = "uprobe"]
pub fn alloc_session(ctx: *mut core::ffi::c_void) -> u32 {
    sample::on_session(&ProbeContext::new(ctx))
}

/// Return of any allocator function (attached only when frees are tracked).
#[uretprobe]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    sample::on_return(&ctx);
    0
}

/// The in-process front end's probes (sampler-preload), both kinds in one program so that
/// a process's front end is one link (removing a link waits for a grace period,
/// docs/performance.md, "Figures quoted from the code": one per process, not two). The
/// cookie says which kind the site is:
/// * `allocscope:alloc(ptr, size, offset, interval, how)`, fired for a block the process's
///   own countdown sampled; the registers are pinned by the probe's definition
///   (`sampler_common::preload::PROBE_ALLOC`);
/// * `allocscope:free(ptr)`: a sampled block is being freed.
#[uprobe]
pub fn usdt(ctx: ProbeContext) -> u32 {
    let cookie = sample::cookie(&ctx);
    if sampler_common::cookie::is_front_end_ready(cookie) {
        follow::carries_front_end((aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32);
    } else if sampler_common::cookie::is_front_end_free(cookie) {
        sample::on_free(arg(&ctx, 0));
    } else {
        sample::on_usdt_alloc(
            &ctx,
            arg(&ctx, 0),
            arg(&ctx, 1),
            arg(&ctx, 2),
            arg(&ctx, 3),
            arg(&ctx, 4),
        );
    }
    0
}

/// Another program's sampler's probes (`otel_memory`, `ddheap`, a Go runtime's sampled
/// blocks and frees), the cookie giving the index of their argument spec
/// ([`sampler_common::usdt`]). A program of its own, loaded when such a process is first
/// found: the verifier checks its code (a Go sample's stack walk among it,
/// docs/performance.md, "Figures quoted from the code") only
/// in recordings that need it, not at every start.
#[uprobe]
pub fn producer(ctx: ProbeContext) -> u32 {
    let cookie = sample::cookie(&ctx);
    sample::on_producer(&ctx, sampler_common::cookie::function(cookie));
    0
}

#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    sample::on_free(arg(&ctx, 0));
    0
}

/// `task:task_newtask` as a perf-event tracepoint (the child's pid at offset 8 and
/// `clone_flags` at 32 of its record, per its format file): where the kernel's BTF does not
/// say where a `task_struct` keeps its pid.
#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets from the tracepoint's format; the reads are bounds-checked helpers.
    let (pid, flags) = unsafe { (ctx.read_at::<i32>(8), ctx.read_at::<u64>(32)) };
    if let (Ok(pid), Ok(flags)) = (pid, flags) {
        follow::on_new_task(pid as u32, flags);
    }
    0
}

/// `task_newtask(task, clone_flags)` as a raw tracepoint, the child's pid read from its
/// `task_struct` at the offset BTF gave ([`config::task_pid_offset`]): its link closes at
/// once, where the perf-event one waits for the tracepoint grace periods
/// (docs/performance.md, "Figures quoted from the code").
#[raw_tracepoint(tracepoint = "task_newtask")]
pub fn task_newtask_raw(ctx: RawTracePointContext) -> u32 {
    let task = ctx.arg::<u64>(0);
    let flags = ctx.arg::<u64>(1);
    let at = task.wrapping_add(config::task_pid_offset()) as *const i32;
    // SAFETY: a checked kernel read of 4 bytes of the new task.
    if let Ok(pid) = unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(at) } {
        follow::on_new_task(pid as u32, flags);
    }
    0
}

/// `sched_process_exec` as a raw tracepoint (it needs no argument: it runs in the process
/// that exec'd), for the same reason.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn process_exec(_ctx: RawTracePointContext) -> u32 {
    follow::on_exec();
    0
}

/// `sched_prepare_exec` as a raw tracepoint (it runs in the process about to exec).
#[raw_tracepoint(tracepoint = "sched_prepare_exec")]
pub fn process_prepare_exec(_ctx: RawTracePointContext) -> u32 {
    follow::on_prepare_exec();
    0
}

/// `sched_process_exit(task, group_dead)` as a raw tracepoint: its link detaches without
/// waiting, where closing a perf-event tracepoint waits for the kernel's tracepoint grace
/// periods (docs/performance.md, "The in-process front end"), the largest part of stopping
/// a short command's recording.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit(ctx: RawTracePointContext) -> u32 {
    follow::on_exit(ctx.arg::<u64>(1) & 0xff != 0);
    0
}

/// The benchmark's reference: the least a uprobe program can do (count the call).
#[uprobe]
pub fn bare_count_enter(_ctx: ProbeContext) -> u32 {
    if let Some(calls) = maps::BARE_CALLS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot of this CPU.
        unsafe { *calls += 1 };
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
