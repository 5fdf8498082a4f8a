//! allocscope's in-process front end: an `LD_PRELOAD` library that keeps the sampling
//! decision inside the process and fires a USDT probe only for sampled blocks.
//!
//! Why: with uprobes on the allocator, every `malloc` and `free` of the target pays the
//! kernel's trap (docs/performance.md, "Figures quoted from the code") to run a countdown
//! that costs nanoseconds. Here the countdown ([`sampler_common::geometric`], the code the
//! kernel program runs) and exact per-thread counters run in the process; a sampled block
//! (one call in thousands at the default interval) fires `allocscope:alloc` (and the
//! OpenTelemetry contract's `otel_memory:alloc`), and freeing a sampled block fires
//! `allocscope:free` / `otel_memory:free`. allocscope's eBPF programs attach to those
//! probes, so estimates, bounds, stacks and the live heap mean exactly what they mean with
//! uprobes.
//!
//! Every function of the malloc family is interposed and forwarded to the next allocator
//! ([`next`]), and so are C++'s `operator new` and `delete` ([`cxx`]: counted where the
//! allocator defines them itself); the others (`malloc_usable_size`, `mallinfo`…) are not defined here and
//! reach it directly. Never panics: an impossible state ends the process with a message
//! (`fatal`) rather than unwinding into C.
//!
//! Built `no_std` with `panic=abort` for allocscope (allocscope-target's build script): it needs
//! nothing of Rust's standard library but what `core` and the `libc` crate give, and std's
//! panic machinery alone (its backtrace printer: gimli, addr2line, an inflater) was four
//! fifths of the library's code, paged in by every process it is loaded into
//! (docs/performance.md). A plain `cargo build` or `cargo test` (panics unwind) links std.
#![cfg_attr(panic = "abort", no_std)]

mod cxx;
mod early_records;
mod exec;
mod frames;
mod next;
mod objects;
mod patch;
mod producer;
mod python;
mod region;
mod route;
mod sandbox;
mod setup;
mod table;
mod thread;
mod usdt;

use core::ffi::{c_int, c_void};

use next::next;
use sampler_common::{preload::ALLOC_UNTRACKED, AllocFn};
use setup::Bootstrap;

/// The sampled blocks still live.
static SAMPLED: table::Table = table::Table::new();

/// Writes `message` to standard error and aborts.
pub(crate) fn fatal(message: &[u8]) -> ! {
    // SAFETY: write and abort have no preconditions beyond a valid buffer.
    unsafe {
        libc::write(2, message.as_ptr().cast(), message.len());
        libc::abort()
    }
}

/// A panic cannot happen (the code is written not to), and if it did, it must not unwind
/// into the program's C frames: the process ends with a message, as [`fatal`].
#[cfg(all(panic = "abort", not(test)))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    fatal(b"allocscope: internal error in the in-process front end\n")
}

/// The personality routine `core`'s own code names (it is built with unwinding panics):
/// never called, since nothing unwinds through `core`'s frames here (panics abort, and no
/// C++ code runs beneath them); were it called, it would let the exception pass. Hidden: a
/// Rust program or library in the process keeps its own.
#[cfg(all(panic = "abort", not(test)))]
extern "C" fn core_personality(
    _version: core::ffi::c_int,
    _actions: core::ffi::c_int,
    _class: u64,
    _exception: *mut c_void,
    _context: *mut c_void,
) -> core::ffi::c_int {
    cxx::URC_CONTINUE_UNWIND
}

#[cfg(all(panic = "abort", not(test)))]
core::arch::global_asm!(
    ".globl rust_eh_personality",
    ".hidden rust_eh_personality",
    ".set rust_eh_personality, {personality}",
    personality = sym core_personality,
);

// Without std nothing names the C library to the linker: its functions are all this
// library calls (and it must be initialised before this library's constructor runs).
#[cfg(all(panic = "abort", not(test)))]
#[link(name = "c")]
extern "C" {}

/// CLOCK_MONOTONIC now, in nanoseconds: the clock of the kernel's samples
/// (`bpf_ktime_get_ns`), for what the library timestamps itself.
pub(crate) fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the struct we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(now.tv_nsec as u64)
}

/// The library's own set-up, once, on the first call of any thread; a dormant library
/// (see [`sandbox`]) only counts into a private region, with no system call.
fn set_up(dormant: bool) {
    if dormant {
        region::init_dormant();
        return;
    }
    region::init();
    thread::init();
    // While the process has one thread: an allocator linked into the executable, patched
    // to count here (a library opened into a running process leaves it alone).
    patch::apply(!next::opened());
    if !next::opened() {
        // (Opened into a running process: an interpreter's allocator is not swapped under
        // it, see docs/attach.md.)
        python::wrap();
    }
    frames::find();
    // SAFETY: registers a child-side fork handler (a plain function, no allocation).
    unsafe { libc::pthread_atfork(None, None, Some(after_fork)) };
}

extern "C" fn after_fork() {
    region::after_fork();
    thread::after_fork();
}

/// Runs at load, before `main`: maps allocscope's region while its descriptor is surely
/// still open (a program may close inherited descriptors first thing).
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = {
    extern "C" fn init() {
        if !next::ready() {
            thread::busy(|| setup::resolve(set_up));
        }
        if next::opened() && !sandbox::dormant() {
            // Once ready (other threads' calls go on meanwhile): the program's calls are
            // routed here, then allocscope's file-wide probes are told to leave them to us.
            thread::busy(|| {
                route::route_all();
                region::note_routes();
            });
            usdt::ready();
        }
    }
    init
};

/// Makes sure the next allocator is known; false when this call must use the arena.
#[inline(always)]
fn ensure_ready() -> bool {
    next::ready() || resolve_now()
}

#[cold]
#[inline(never)]
fn resolve_now() -> bool {
    matches!(thread::busy(|| setup::resolve(set_up)), Bootstrap::Ready)
}

/// Reports this thread's last sampled call, which returned `pointer` (null: the call
/// failed, and is sampled all the same). Out of line: the hot path stays small.
#[cold]
#[inline(never)]
fn report(pointer: *mut c_void, size: u64, function: AllocFn) {
    if sandbox::dormant() {
        // Its calls are allocscope's uprobes' to see: nothing is reported from here.
        return;
    }
    // Before the probe fires: the maps its frames are read against.
    region::maps_at_first_sample();
    let sampled = thread::last_sample();
    if next::opened() {
        thread::busy(|| {
            route::recheck();
            region::note_routes();
        });
    }
    let address = pointer as u64;
    let tracked = address != 0 && SAMPLED.insert(address);
    let region = region::current();
    region
        .samples
        .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    let mut how = function as u64;
    if !tracked {
        how |= ALLOC_UNTRACKED;
        if address != 0 {
            region
                .untracked
                .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        }
    }
    if early_records::alloc(address, size, sampled.offset, sampled.interval, how) {
        return;
    }
    usdt::alloc(
        address,
        size,
        sampled.offset,
        sampled.interval,
        how,
        weight(size, sampled.interval),
    );
}

/// The OpenTelemetry contract's weight: the bytes a sample stands for, `size / π` with
/// `π = 1 - (1 - 1/interval)^size` the block's chance of being sampled (unbiased).
fn weight(size: u64, interval: u64) -> u64 {
    if interval <= 1 || size == 0 {
        return size;
    }
    // The libm crate's functions, not f64's: those would make every process the library
    // is loaded into load the C library's libm.
    let p = -libm::expm1(size as f64 * libm::log1p(-1.0 / interval as f64));
    libm::round(size as f64 / p) as u64
}

#[cold]
#[inline(never)]
fn arena_alloc(size: usize, align: usize) -> *mut c_void {
    next::arena::alloc(size, align)
}

/// Forgets a sampled block being freed and reports it; nothing for the rest.
#[inline(always)]
fn forget(pointer: *mut c_void) {
    let address = pointer as u64;
    if SAMPLED.remove(address) {
        report_free(address);
    }
}

/// Reports sampled block `address` freed. Out of line, so the probe site is one: each
/// site is one more uprobe to attach and remove, and the kernel removes them one at a
/// time (docs/performance.md, "What a recording cost, measured").
#[cold]
#[inline(never)]
fn report_free(address: u64) {
    if !early_records::free(address) {
        usdt::free(address);
    }
}

/// # Safety
/// The C `malloc` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    if !ensure_ready() {
        return arena_alloc(size, 16);
    }
    // SAFETY: forwarding the caller's arguments to the next allocator's malloc.
    counted(size as u64, AllocFn::Malloc, || unsafe {
        next!(malloc as next::Malloc)(size)
    })
}

/// # Safety
/// The C `free` contract.
#[no_mangle]
pub unsafe extern "C" fn free(pointer: *mut c_void) {
    if pointer.is_null() || next::arena::contains(pointer) {
        return;
    }
    if !next::ready() {
        // Only arena blocks exist before the next allocator is known.
        return;
    }
    forget(pointer);
    // SAFETY: forwarding to the next allocator's free.
    unsafe { next!(free as next::Free)(pointer) }
}

/// # Safety
/// The C `calloc` contract.
#[no_mangle]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    if !ensure_ready() {
        return match count.checked_mul(size) {
            Some(bytes) => next::arena::alloc(bytes, 16),
            None => core::ptr::null_mut(),
        };
    }
    let bytes = sampler_common::geometric::saturating_product(count as u64, size as u64);
    // SAFETY: forwarding the caller's arguments.
    counted(bytes, AllocFn::Calloc, || unsafe {
        next!(calloc as next::Calloc)(count, size)
    })
}

/// # Safety
/// The C `realloc` contract.
#[no_mangle]
pub unsafe extern "C" fn realloc(pointer: *mut c_void, size: usize) -> *mut c_void {
    if !ensure_ready() || next::arena::contains(pointer) {
        // SAFETY: an arena block (or null), copied into a block of the usual kind.
        return unsafe { realloc_arena(pointer, size) };
    }
    // SAFETY: forwarding the caller's arguments.
    reallocated(pointer, size, || unsafe {
        next!(realloc as next::Realloc)(pointer, size)
    })
}

/// An allocation of `size` bytes by `function`, made by `call`: counted, and reported when
/// sampled.
#[inline(always)]
fn counted(size: u64, function: AllocFn, call: impl FnOnce() -> *mut c_void) -> *mut c_void {
    let sampled = thread::count(size);
    let pointer = call();
    if sampled {
        report(pointer, size, function);
    }
    pointer
}

/// `realloc(pointer, size)` made by `call`: an allocation of `size` bytes, and a free of
/// `pointer` when it was sampled.
#[inline(always)]
fn reallocated(
    pointer: *mut c_void,
    size: usize,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    let sampled = thread::count(size as u64);
    // A sampled old block is reported freed first: once realloc returns, another thread
    // may get its address (a free reported after that could hit the new block's sample).
    let was_sampled = !pointer.is_null() && SAMPLED.remove(pointer as u64);
    if was_sampled {
        report_free(pointer as u64);
    }
    let moved = call();
    if was_sampled && moved.is_null() && size != 0 {
        // Failed: the old block lives on, no longer tracked (reported freed above).
        region::current()
            .untracked
            .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    }
    if sampled {
        report(moved, size as u64, AllocFn::Realloc);
    }
    moved
}

/// realloc of an arena block or while resolving.
unsafe fn realloc_arena(pointer: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: malloc's contract holds for any size.
    let fresh = unsafe { malloc(size) };
    if !pointer.is_null() && !fresh.is_null() && next::arena::contains(pointer) {
        let old = next::arena::size_of(pointer);
        // SAFETY: both blocks hold at least min(old, size) bytes and do not overlap.
        unsafe {
            core::ptr::copy_nonoverlapping(pointer.cast::<u8>(), fresh.cast(), old.min(size))
        };
    }
    fresh
}

/// # Safety
/// The C `reallocarray` contract.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(
    pointer: *mut c_void,
    count: usize,
    size: usize,
) -> *mut c_void {
    match count.checked_mul(size) {
        // SAFETY: realloc's contract, with the product checked.
        Some(bytes) => unsafe { realloc(pointer, bytes) },
        None => {
            // SAFETY: errno of this thread.
            unsafe { *libc::__errno_location() = libc::ENOMEM };
            core::ptr::null_mut()
        }
    }
}

/// An aligned allocation of `size` through `call` (the next allocator's), counted.
#[inline(always)]
fn aligned(
    size: usize,
    align: usize,
    function: AllocFn,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    if !ensure_ready() {
        return next::arena::alloc(size, align);
    }
    counted(size as u64, function, call)
}

/// # Safety
/// The C `memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: forwarding the caller's arguments.
    aligned(size, align, AllocFn::Memalign, || unsafe {
        next!(memalign as next::Aligned)(align, size)
    })
}

/// # Safety
/// The C `aligned_alloc` contract.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    // SAFETY: forwarding the caller's arguments (the next allocator has aligned_alloc
    // wherever it has memalign: C11).
    aligned(size, align, AllocFn::AlignedAlloc, || unsafe {
        next!(aligned_alloc as next::Aligned)(align, size)
    })
}

/// # Safety
/// The C `valloc` contract.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    // SAFETY: forwarding the caller's argument.
    aligned(size, 4096, AllocFn::Valloc, || unsafe {
        next!(valloc as next::Malloc)(size)
    })
}

/// # Safety
/// The C `pvalloc` contract.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    // SAFETY: forwarding the caller's argument.
    aligned(size, 4096, AllocFn::Pvalloc, || unsafe {
        next!(pvalloc as next::Malloc)(size)
    })
}

/// # Safety
/// The C `posix_memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !ensure_ready() {
        let block = next::arena::alloc(size, align);
        if block.is_null() {
            return libc::ENOMEM;
        }
        // SAFETY: the caller's out pointer.
        unsafe { *out = block };
        return 0;
    }
    let sampled = thread::count(size as u64);
    // SAFETY: forwarding the caller's arguments.
    let status = unsafe { next!(posix_memalign as next::PosixMemalign)(out, align, size) };
    if sampled {
        let pointer = if status == 0 {
            // SAFETY: set by a successful posix_memalign.
            unsafe { *out }
        } else {
            core::ptr::null_mut()
        };
        report(pointer, size as u64, AllocFn::PosixMemalign);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_is_size_over_inclusion_probability() {
        assert_eq!(weight(100, 1), 100);
        // Large blocks are (almost) always sampled: weight ≈ size.
        let big = weight(64 << 20, 512 * 1024);
        assert_eq!(big, 64 << 20);
        // A 512-byte block at 512 KiB: π ≈ 512/524288, weight ≈ the interval.
        let small = weight(512, 512 * 1024) as f64;
        assert!((small / (512.0 * 1024.0) - 1.0).abs() < 0.001, "{small}");
    }
}
