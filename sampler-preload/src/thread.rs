//! Per-thread sampling state and exact counters.
//!
//! The countdown is the kernel program's ([`sampler_common::geometric`]): a thread's
//! countdown of bytes to the next sampled byte, redrawn after each sample, when the
//! interval changes ([`Region::generation`]) and when a thread starts. The exact counters
//! live in the process's [`Region`], one slot per live thread written only by that thread
//! (plain loads and stores, no lock prefix); an exiting thread moves its counts into the
//! region's retired totals under a sequence counter, so that a reader's sum never counts
//! them twice or not at all. A thread that finds no free slot counts with atomic adds in
//! the overflow totals.

use core::{
    cell::Cell,
    ptr,
    sync::atomic::{AtomicU64, Ordering},
};

use sampler_common::{
    geometric,
    preload::{Counts, Region, THREAD_SLOTS},
};

use crate::region;

/// One thread's state, in static TLS (no allocation, no destructor). All-zero is the
/// initial state: no countdown drawn (generation 0 never matches a region's), no slot.
pub struct Thread {
    countdown: Cell<u64>,
    /// The mean interval the countdown was drawn at.
    interval: Cell<u64>,
    /// The region generation the countdown was drawn in (0: never drawn).
    generation: Cell<u64>,
    random: Cell<u64>,
    slot: Cell<*const Counts>,
    /// `slot` is the shared overflow slot (atomic adds).
    shared: Cell<bool>,
    /// In code whose allocator calls are not the program's own: the library's, or an
    /// allocator call counted already (a wrapped CPython domain's, see `python`).
    busy: Cell<bool>,
    /// Where on this thread's stack a patched allocator entry's call counted already runs
    /// (0: none): calls deeper than it are made underneath (see [`within`]).
    within: Cell<usize>,
    /// The last sampled call of this thread, for [`last_sample`].
    sampled: Cell<Sampled>,
}

// This thread's `Thread`: a zero-filled block in the library's static TLS, reached with the
// initial-exec model (`fs`-relative, two instructions). `thread_local!` in a shared object
// goes through `__tls_get_addr` behind two calls, which cost more than the rest of the hot
// path; initial-exec is right for a library loaded at start-up (LD_PRELOAD), and a later
// dlopen still works while glibc's static TLS surplus has room for these few bytes.
core::arch::global_asm!(
    ".pushsection .tbss.allocscope_thread,\"awT\",@nobits",
    ".p2align 6",
    ".globl allocscope_thread",
    ".hidden allocscope_thread",
    ".type allocscope_thread, @object",
    ".size allocscope_thread, {size}",
    "allocscope_thread:",
    ".zero {size}",
    ".popsection",
    size = const core::mem::size_of::<Thread>(),
);

/// This thread's state (all-zero is its initial value: see [`Thread`]).
#[inline(always)]
fn this_thread() -> &'static Thread {
    let address: usize;
    // SAFETY: computes the address of this thread's copy of `allocscope_thread`; no memory
    // is written.
    unsafe {
        core::arch::asm!(
            "mov {0}, qword ptr [rip + allocscope_thread@GOTTPOFF]",
            "add {0}, qword ptr fs:[0]",
            out(reg) address,
            options(nostack, readonly),
        );
    }
    // SAFETY: a block of size_of::<Thread>() bytes, aligned to 64, private to this thread
    // and zero-initialised by the loader; every field is valid all-zero.
    unsafe { &*(address as *const Thread) }
}

/// An identity of this thread, without a system call: the address of its TLS block
/// (distinct among live threads, never 0).
#[inline(always)]
pub fn id() -> u64 {
    this_thread() as *const Thread as u64
}

/// Runs `f` on this thread's state.
#[inline(always)]
fn with<R>(f: impl FnOnce(&Thread) -> R) -> R {
    f(this_thread())
}

/// A sampled call: the countdown at the call (the sampled byte's offset) and the interval
/// it was drawn at.
#[derive(Clone, Copy)]
pub struct Sampled {
    pub offset: u64,
    pub interval: u64,
}

/// The pthread key whose destructor releases an exiting thread's slot.
static KEY: AtomicU64 = AtomicU64::new(u64::MAX);

/// Creates the thread-exit key (once, while resolving).
pub fn init() {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: creates a key with a destructor that takes the value we set.
    if unsafe { libc::pthread_key_create(&mut key, Some(thread_exit)) } == 0 {
        KEY.store(u64::from(key), Ordering::Release);
    }
}

/// Counts an allocation call of `size` bytes on this thread and decides whether it is
/// sampled ([`last_sample`] then says how). The hot path: one TLS access, two plain adds,
/// two compares.
#[inline(always)]
pub fn count(size: u64) -> bool {
    with(|t| {
        if t.busy.get() {
            // Made by an allocator call counted already (a wrapped CPython domain's
            // `malloc` underneath), or by the library itself.
            return false;
        }
        let within = t.within.get();
        if within != 0 {
            let here = 0u8;
            if (&raw const here as usize) < within {
                // Made underneath a patched entry's call counted already.
                return false;
            }
            // Left by a call that never returned here (a longjmp out of the allocator).
            t.within.set(0);
        }
        let slot = t.slot.get();
        if slot.is_null() {
            return first_call(t, size);
        }
        // SAFETY: a slot in the current region, owned by this thread (or the shared one).
        let counts = unsafe { &*slot };
        if t.shared.get() {
            counts.calls.fetch_add(1, Ordering::Relaxed);
            counts.bytes.fetch_add(size, Ordering::Relaxed);
        } else {
            add(&counts.calls, 1);
            add(&counts.bytes, size);
        }
        decide(t, size)
    })
}

/// A single writer's add: no lock prefix (readers see one value or the other).
#[inline(always)]
fn add(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

#[inline(always)]
fn decide(t: &Thread, size: u64) -> bool {
    let region = region::current();
    if region.generation.load(Ordering::Relaxed) != t.generation.get() {
        redraw(t, region);
    }
    let countdown = t.countdown.get();
    if countdown >= size {
        t.countdown.set(countdown - size);
        return false;
    }
    sample(t, region, countdown);
    true
}

/// Keeps what a sampled call needs to be reported and draws the next countdown.
#[cold]
#[inline(never)]
fn sample(t: &Thread, region: &Region, countdown: u64) {
    t.sampled.set(Sampled {
        offset: countdown,
        interval: t.interval.get(),
    });
    redraw(t, region);
}

/// This thread's last sampled call (after [`count`] said it was sampled).
pub fn last_sample() -> Sampled {
    with(|t| t.sampled.get())
}

/// A new countdown at the region's interval (read consistently with its generation).
#[cold]
#[inline(never)]
fn redraw(t: &Thread, region: &Region) {
    let (mut generation, mut interval, mut scale) = (0, 0, 0);
    for _ in 0..64 {
        generation = region.generation.load(Ordering::Acquire);
        interval = region.interval.load(Ordering::Acquire);
        scale = region.scale_q32.load(Ordering::Acquire);
        if region.generation.load(Ordering::Acquire) == generation {
            break;
        }
    }
    if t.random.get() == 0 {
        t.random.set(seed());
    }
    // xorshift64*: the countdown needs uniform words, not cryptographic ones.
    let mut x = t.random.get();
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t.random.set(x);
    let random = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
    t.countdown.set(geometric::draw(random, scale));
    t.interval.set(interval);
    t.generation.set(generation);
}

static SEED: AtomicU64 = AtomicU64::new(0);

/// A distinct non-zero seed per thread: a random process seed plus a Weyl sequence,
/// mixed (splitmix64).
fn seed() -> u64 {
    if SEED.load(Ordering::Relaxed) == 0 {
        let _ = SEED.compare_exchange(0, process_seed() | 1, Ordering::AcqRel, Ordering::Relaxed);
    }
    let mut z = SEED.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

/// Sixteen random bytes the kernel gave the process at exec (`AT_RANDOM`, read by the C
/// library from the auxiliary vector: no system call), mixed with the time-stamp counter
/// (a forked child, which shares them, draws other countdowns).
fn process_seed() -> u64 {
    // SAFETY: getauxval has no preconditions.
    let at_random = unsafe { libc::getauxval(libc::AT_RANDOM) } as *const u64;
    let kernel = if at_random.is_null() {
        0
    } else {
        // SAFETY: AT_RANDOM points to 16 bytes the kernel put on the initial stack, which
        // stay mapped for the process's life.
        unsafe { at_random.read_unaligned() ^ at_random.add(1).read_unaligned() }
    };
    // SAFETY: rdtsc has no preconditions.
    kernel ^ unsafe { core::arch::x86_64::_rdtsc() }.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// In a forked child: new draws, not the parent's (both would otherwise sample the same
/// bytes of their next allocations).
pub fn reseed_after_fork() {
    SEED.store(process_seed() | 1, Ordering::Relaxed);
    with(|t| t.random.set(0));
}

/// This thread's first call (or its first since its slot was released or the process
/// forked): takes a slot, then counts as usual.
#[cold]
#[inline(never)]
fn first_call(t: &Thread, size: u64) -> bool {
    // The allocation pthread_setspecific may make is the library's, not the program's.
    t.busy.set(true);
    let region = region::current();
    // No system call (a sandbox may forbid gettid): the TLS block's address is as unique.
    let tid = id();
    // Slot 0 first, on the region's first page with its header (the process's first
    // thread, most often its only one, then touches no other page of it); the others
    // spread from a hash of the thread's id, so that many starting at once do not all try
    // the same slots.
    let start = ((tid >> 6) as usize).wrapping_mul(0x9e37_79b9) % THREAD_SLOTS;
    let order = core::iter::once(0).chain((0..THREAD_SLOTS).map(|i| (start + i) % THREAD_SLOTS));
    let mut claimed = None;
    for index in order {
        let slot = &region.slots[index];
        if slot.owner.load(Ordering::Relaxed) == 0
            && slot
                .owner
                .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            claimed = Some(slot);
            break;
        }
    }
    match claimed {
        Some(slot) => {
            let key = KEY.load(Ordering::Acquire);
            if key != u64::MAX {
                // SAFETY: a key we created; the value is the slot, handed to the destructor.
                unsafe {
                    libc::pthread_setspecific(
                        key as libc::pthread_key_t,
                        (slot as *const Counts).cast(),
                    )
                };
            }
            t.slot.set(slot);
            t.shared.set(false);
        }
        None => {
            t.slot.set(&region.overflow);
            t.shared.set(true);
        }
    }
    t.busy.set(false);
    count(size)
}

/// Leaves this thread's allocation calls uncounted until [`unmark_busy`] (those a counted
/// C++ `operator new` makes underneath, see `cxx`); false, changing nothing, where they
/// are uncounted already.
pub fn mark_busy() -> bool {
    with(|t| !t.busy.replace(true))
}

/// Ends [`mark_busy`].
pub fn unmark_busy() {
    with(|t| t.busy.set(false));
}

/// Runs `f`, a patched allocator entry's own code (its call counted already), with the
/// allocation calls it makes underneath uncounted. Kept by the stack's depth, not by a
/// flag: a call deeper than this frame is underneath, and a `longjmp` out of `f` (an
/// out-of-memory handler's) leaves only a mark that the next call above it clears, where
/// a flag would leave every later call of the thread uncounted.
#[inline(always)]
pub fn within<R>(f: impl FnOnce() -> R) -> R {
    // The bottom of the caller's frame: every local of a later call at this depth lies at
    // or above it, every one of a call made underneath below it.
    let bottom: usize;
    // SAFETY: reads the stack pointer; no memory touched.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) bottom, options(nomem, nostack, preserves_flags))
    };
    let previous = with(|t| t.within.replace(bottom));
    let result = f();
    with(|t| t.within.set(previous));
    result
}

/// Runs `f` with this thread's allocation calls uncounted (the library's own, or those an
/// allocator call counted already makes underneath).
pub fn busy<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            with(|t| t.busy.set(self.0));
        }
    }
    let _restore = Restore(with(|t| t.busy.replace(true)));
    f()
}

/// The pthread key's destructor: the exiting thread's counts move into the retired totals
/// and its slot is freed for another thread.
unsafe extern "C" fn thread_exit(value: *mut libc::c_void) {
    with(|t| {
        let slot = t.slot.get();
        // A value from before a fork points into the parent's region: not ours to move.
        if slot.is_null() || t.shared.get() || slot != value as *const Counts {
            return;
        }
        let region = region::current();
        // SAFETY: our own slot in the current region.
        let counts = unsafe { &*slot };
        region.retired_sequence.fetch_add(1, Ordering::AcqRel);
        let calls = counts.calls.swap(0, Ordering::AcqRel);
        let bytes = counts.bytes.swap(0, Ordering::AcqRel);
        region.retired.calls.fetch_add(calls, Ordering::AcqRel);
        region.retired.bytes.fetch_add(bytes, Ordering::AcqRel);
        region.retired_sequence.fetch_add(1, Ordering::AcqRel);
        counts.owner.store(0, Ordering::Release);
        t.slot.set(ptr::null());
    });
}

/// In a forked child: this (only) thread takes a slot in the child's new region.
pub fn after_fork() {
    reseed_after_fork();
    with(|t| {
        t.slot.set(ptr::null());
        t.shared.set(false);
        t.busy.set(false);
        t.within.set(0);
    });
}
