//! The contract between allocscope and its in-process front end (`sampler-preload`): the
//! shared counter region's layout and the USDT probes the library fires.
//!
//! The library keeps the sampling decision (the same [`crate::geometric`] countdown the
//! kernel runs) and exact per-thread counters in the process; allocscope maps the region
//! (through `/proc/PID/map_files`, the library creates it from a memfd) to read the counters
//! and to set the interval, and attaches its eBPF programs to the probes, which fire only for
//! sampled blocks. The region outlives the process in allocscope's mapping, so the counts
//! of a process that has exited are still read whole.

use core::sync::atomic::AtomicU64;

/// First word of a region ("alscope1").
pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"alscope1");

/// Layout version of [`Region`]; allocscope refuses any other.
pub const REGION_VERSION: u64 = 7;

/// Per-thread counter slots. A thread beyond them counts in [`Region::overflow`] with
/// atomic adds (exact, slower).
pub const THREAD_SLOTS: usize = 1024;

/// Bytes of [`Region::maps`].
pub const MAPS_BYTES: usize = 32 * 1024;

/// Attempts of [`Region::totals`] at a consistent reading.
pub const READ_ATTEMPTS: usize = 10_000;

/// Regions in a [`FamilyHeader`]: the processes of one command's tree counting at once (one
/// more finds the table full and makes a region of its own, counted in [`FamilyHeader::full`]).
pub const FAMILY_SLOTS: usize = 1024;

/// First word of a [`FamilyHeader`] ("alsfam01").
pub const FAMILY_MAGIC: u64 = u64::from_le_bytes(*b"alsfam01");

/// Layout version of [`FamilyHeader`].
pub const FAMILY_VERSION: u64 = 6;

/// Name of the family table's file, beside the library in a recording's directory: the
/// library finds it from the path it was loaded from (no descriptor, no variable).
pub const FAMILY_FILE: &core::ffi::CStr = c"family";

/// Name of the exported 32-bit flag that is not 0 where the library stays dormant (it
/// counts nothing, fires nothing: [`DORMANT_SANDBOXED`], [`DORMANT_PRODUCER`]) or counts
/// privately ([`PRIVATE_CHILD`]).
pub const DORMANT_SYMBOL: &str = "allocscope_preload_dormant";

/// [`DORMANT_SYMBOL`]: the process was under a seccomp filter when the library set up.
pub const DORMANT_SANDBOXED: u32 = 1;

/// [`DORMANT_SYMBOL`]: a sandboxed process's child, counting in a private region it cannot
/// publish (its samples reach the probes).
pub const PRIVATE_CHILD: u32 = 2;

/// [`DORMANT_SYMBOL`]: a file the process mapped at set-up defines another producer's
/// allocation probes ([`PRODUCER_PROVIDERS`]): its calls are left to them.
pub const DORMANT_PRODUCER: u32 = 3;

/// [`Region::patch_refused`]: why a plan's entries were left unpatched.
#[repr(u64)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchRefusal {
    /// The plan is for another executable (its program headers differ).
    OtherExecutable = 1,
    /// An entry's bytes are not the file's (changed in memory, or probed already).
    Changed = 2,
    /// Another thread ran when the library set up (the patch is made with one).
    Threads = 3,
    /// No memory near the executable for the trampolines.
    NoRoom = 4,
    /// A patched copy of the executable's page could not be put in place (`mprotect` or
    /// `mremap` refused, e.g. a sealed mapping).
    Protected = 5,
    /// A relocated instruction could not reach its target.
    OutOfReach = 6,
    /// The plan could not be read, or is malformed.
    Unreadable = 7,
}

impl PatchRefusal {
    /// The refusal `value` names, if any.
    pub fn from_u64(value: u64) -> Option<PatchRefusal> {
        use PatchRefusal::*;
        [
            OtherExecutable,
            Changed,
            Threads,
            NoRoom,
            Protected,
            OutOfReach,
            Unreadable,
        ]
        .into_iter()
        .find(|r| *r as u64 == value)
    }

    /// What it means, for a note.
    pub fn reason(self) -> &'static str {
        match self {
            PatchRefusal::OtherExecutable => "the plan was made for another executable",
            PatchRefusal::Changed => "its entry points' code differs from the file's",
            PatchRefusal::Threads => "another thread was running when the sampler set up",
            PatchRefusal::NoRoom => "no memory within 2 GiB of the executable for the trampolines",
            PatchRefusal::Protected => {
                "its pages could not be replaced by patched copies (mprotect or mremap refused)"
            }
            PatchRefusal::OutOfReach => "a relocated instruction could not reach its target",
            PatchRefusal::Unreadable => "the plan could not be read",
        }
    }
}

/// Name of the exported symbol holding the address of the process's [`Region`].
pub const REGION_SYMBOL: &str = "allocscope_preload_region";

/// USDT provider of allocscope's own probes.
pub const PROVIDER: &str = "allocscope";

/// `allocscope:alloc(ptr, size, offset, interval, function_and_flags)`: a sampled block.
/// `offset` is the countdown at the call (the sampled byte's offset, as in the kernel's
/// samples); `interval` the mean interval the countdown was drawn at; the last argument is
/// the [`crate::AllocFn`] in its low byte and [`ALLOC_UNTRACKED`] when the library could
/// not remember the block (its free will not be reported).
pub const PROBE_ALLOC: &str = "alloc";

/// `allocscope:free(ptr)`: a sampled block is being freed.
pub const PROBE_FREE: &str = "free";

/// `allocscope:ready()`: the library starts in this process (fired once per program, before
/// it forwards any call to the next allocator), so that file-wide probes of the allocators
/// it serves leave this process's calls to it from the first.
pub const PROBE_READY: &str = "ready";

/// Flag in the last argument of [`PROBE_ALLOC`]: the block's free will not be reported.
pub const ALLOC_UNTRACKED: u64 = 1 << 8;

/// USDT provider of the OpenTelemetry memory-profiling contract
/// (`otel_memory:alloc(ptr, size, weight)`, `otel_memory:free(ptr)`).
pub const OTEL_PROVIDER: &str = "otel_memory";

/// Providers of the allocation-probe contract allocscope consumes from other programs'
/// allocators (`alloc(ptr, size, weight)`, `free(ptr)`): the OpenTelemetry contract and
/// libdatadog's heap sampler. The library stays dormant in a process whose files define one.
pub const PRODUCER_PROVIDERS: [&str; 2] = [OTEL_PROVIDER, "ddheap"];

/// Counts of one thread (or of the retired and overflowing ones): allocation calls and
/// the bytes they asked for, as the kernel's exact counters count them.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Counts {
    /// Allocation calls.
    pub calls: AtomicU64,
    /// Bytes asked for.
    pub bytes: AtomicU64,
    /// The owning thread (its TLS block's address: no `gettid`, see `sampler-preload`'s
    /// `sandbox`; 0: free). Unused in the shared totals.
    pub owner: AtomicU64,
}

/// The table of regions a command started by allocscope and every process of its tree
/// count in: one file ([`FAMILY_FILE`]) in the recording's root-owned directory, beside
/// the library the tree's `LD_PRELOAD` names, created before the command runs. A process claims a slot ([`claim`]) and counts in
/// the region at [`family_region_offset`]; allocscope maps the whole table, so a child's
/// counts and maps are read whole however soon it exits, and gives a slot back once its
/// process is gone and read (the region is zeroed, but for its maps' bytes, which its
/// zeroed [`Region::maps_len`] says are not there).
///
/// File layout: this header, padded to [`family_header_bytes`], then [`FAMILY_SLOTS`]
/// regions of [`region_bytes`] each.
#[repr(C)]
#[derive(Debug)]
pub struct FamilyHeader {
    /// [`FAMILY_MAGIC`].
    pub magic: u64,
    /// [`FAMILY_VERSION`].
    pub version: u64,
    /// Mean interval a new region starts with (allocscope keeps it current).
    pub interval: AtomicU64,
    /// [`crate::geometric::scale_q32`] of [`Self::interval`].
    pub scale_q32: AtomicU64,
    /// Claims made so far (each claim's sequence number is taken from it).
    pub sequence: AtomicU64,
    /// Processes that found no free slot (they count in a region of their own).
    pub full: AtomicU64,
    /// Where sampled blocks go ([`EARLY_OFF`], [`EARLY_KEEP`], [`EARLY_HOLD`]): see
    /// [`EarlyRecord`].
    pub early_state: AtomicU64,
    /// Threads writing an early record now (allocscope waits for none before reading).
    pub early_writers: AtomicU64,
    /// Early records claimed so far (beyond [`EARLY_SLOTS`]: samples that had to wait).
    pub early_next: AtomicU64,
    /// Early records claimed but left unwritten (their bytes could not be given storage,
    /// the table's file system full, or not mapped): their samples waited for the probes.
    pub early_unbacked: AtomicU64,
    /// Bytes of stack an early sample copies (allocscope's `--stack-bytes`).
    pub early_stack_bytes: AtomicU64,
    /// The inode of allocscope's pid namespace (`/proc/self/ns/pid`), written at creation:
    /// claims and early records name processes by pid, so a process in another pid
    /// namespace (`unshare --pid`, a container) uses neither; it counts in a region of its
    /// own and waits for the probes instead of writing early records.
    pub pid_namespace: u64,
    /// Entries of the plan at [`family_patches_offset`] for the command's executable
    /// (0: none), written before the command starts.
    pub patches: u64,
    /// Per slot: 0 when free, else a [`claim`] word.
    pub claims: [AtomicU64; FAMILY_SLOTS],
}

/// [`FamilyHeader::early_state`]: sampled blocks fire the USDT probes (allocscope is attached, or
/// never asked for early records). Zero, so a table starts this way.
pub const EARLY_OFF: u64 = 0;
/// [`FamilyHeader::early_state`]: allocscope is still attaching while the command runs; a sampled
/// block (with its stack) and a sampled block's free are written as [`EarlyRecord`]s.
pub const EARLY_KEEP: u64 = 1;
/// [`FamilyHeader::early_state`]: allocscope is reading the early records; a thread about to
/// write one waits until the state is [`EARLY_OFF`], then fires the probes.
pub const EARLY_HOLD: u64 = 2;

/// Early records in a family table; a sample beyond them waits for allocscope.
pub const EARLY_SLOTS: usize = 1024;

/// [`EarlyRecord::kind`] of a sampled block.
pub const EARLY_ALLOC: u64 = 1;
/// [`EarlyRecord::kind`] of a sampled block's free.
pub const EARLY_FREE: u64 = 2;

/// What a sampled block or its free would have told the probes, written in the family
/// table while allocscope attaches (`record -- CMD` lets the command run at once rather
/// than after loading and attaching, docs/performance.md, "The in-process front end"): a
/// word that says it is complete, then an [`EarlyHead`], then room for [`MAX_PY_FRAMES`]
/// Python frames ([`EarlyHead::py_count`] of them written), then [`EarlyHead::stack_len`]
/// bytes of stack (up to [`crate::MAX_STACK_COPY`]).
#[repr(C)]
#[derive(Debug, Default)]
pub struct EarlyRecord {
    /// 1 once the rest is written (a writer that died half-way leaves 0).
    pub complete: AtomicU64,
    /// The probe's arguments and what the eBPF program would have read.
    pub head: EarlyHead,
}

/// An early record's plain part: the probe's arguments, the thread, the time, and for a
/// block the registers where the stack was copied and the Python frames' count, as the
/// eBPF program sends them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EarlyHead {
    /// [`EARLY_ALLOC`] or [`EARLY_FREE`].
    pub kind: u64,
    /// Process id (tgid).
    pub pid: u64,
    /// Thread id.
    pub tid: u64,
    /// CLOCK_MONOTONIC ns (the samples' clock).
    pub timestamp_ns: u64,
    /// The block (a free's: the block freed).
    pub address: u64,
    /// [`PROBE_ALLOC`]'s arguments: size, offset, interval and function with flags.
    pub size: u64,
    /// See [`Self::size`].
    pub offset: u64,
    /// See [`Self::size`].
    pub interval: u64,
    /// See [`Self::size`].
    pub how: u64,
    /// Instruction pointer where the stack was copied (in the library).
    pub ip: u64,
    /// Stack pointer then: the copy's first byte.
    pub sp: u64,
    /// Frame pointer register then.
    pub bp: u64,
    /// Bytes of stack copied after the Python frames' room.
    pub stack_len: u64,
    /// The thread's name.
    pub comm: [u8; 16],
    /// Address of `_PyRuntime.interpreters.head` the library walked from (0: the process
    /// runs no interpreter it knows, and no frames were read).
    pub py_head: u64,
    /// Python frames written ([`crate::python::PyFrameEntry`], leaf first).
    pub py_count: u32,
    /// [`crate::python::PY_TRUNCATED`] and the other walk flags.
    pub py_flags: u32,
}

/// Most Python frames an early record holds (as a kernel sample's).
pub const MAX_PY_FRAMES: usize = crate::python::MAX_PY_FRAMES;

/// Byte offset of an early record's Python frames from its start.
pub const EARLY_PY_OFFSET: usize = core::mem::size_of::<EarlyRecord>();

/// Byte offset of an early record's stack from its start.
pub const EARLY_STACK_OFFSET: usize =
    EARLY_PY_OFFSET + MAX_PY_FRAMES * core::mem::size_of::<crate::python::PyFrameEntry>();

/// Bytes of one early record with room for its Python frames and stack, in whole pages
/// (the family table is sparse: only the pages a record writes exist).
pub const fn early_record_bytes() -> usize {
    (EARLY_STACK_OFFSET + crate::MAX_STACK_COPY + PAGE - 1) & !(PAGE - 1)
}

/// File offset of the early records in a family table (after the regions).
pub const fn family_early_offset() -> usize {
    family_region_offset(FAMILY_SLOTS)
}

/// Bytes of the early records.
pub const fn family_early_bytes() -> usize {
    EARLY_SLOTS * early_record_bytes()
}

/// Bit of a claim word set once its region is ready to be read.
pub const CLAIM_READY: u64 = 1 << 63;

/// The claim word of process `pid` with sequence number `sequence` (31 bits kept; 0 is
/// never a valid claim).
pub const fn claim(sequence: u64, pid: u32, ready: bool) -> u64 {
    let ready = if ready { CLAIM_READY } else { 0 };
    ready | ((sequence & 0x7fff_ffff) << 32) | pid as u64
}

/// The process of claim word `word`.
pub const fn claim_pid(word: u64) -> u32 {
    word as u32
}

/// The sequence number of claim word `word` (later claims have larger ones, modulo 2^31).
pub const fn claim_sequence(word: u64) -> u64 {
    (word >> 32) & 0x7fff_ffff
}

/// Whether claim word `word` names a region ready to be read.
pub const fn claim_ready(word: u64) -> bool {
    word & CLAIM_READY != 0
}

const PAGE: usize = 4096;

/// Bytes of a region in memory and in a family table (whole pages).
pub const fn region_bytes() -> usize {
    (core::mem::size_of::<Region>() + PAGE - 1) & !(PAGE - 1)
}

/// Bytes of a family table's header (whole pages).
pub const fn family_header_bytes() -> usize {
    (core::mem::size_of::<FamilyHeader>() + PAGE - 1) & !(PAGE - 1)
}

/// File offset of slot `slot`'s region in a family table.
pub const fn family_region_offset(slot: usize) -> usize {
    family_header_bytes() + slot * region_bytes()
}

/// File offset of the patch plan in a family table (after the early records).
pub const fn family_patches_offset() -> usize {
    family_early_offset() + family_early_bytes()
}

/// Bytes of the patch plan (whole pages).
pub const fn family_patches_bytes() -> usize {
    (core::mem::size_of::<crate::patch::PatchPlan>() + PAGE - 1) & !(PAGE - 1)
}

/// Bytes of a family table file.
pub const fn family_bytes() -> usize {
    family_patches_offset() + family_patches_bytes()
}

/// Among the claim words `claims`, the slot of process `pid`'s ready region: the latest
/// claim when there are several (an earlier process of the same pid, exited and not yet
/// given back).
pub fn find_claim(claims: &[AtomicU64], pid: u32) -> Option<usize> {
    use core::sync::atomic::Ordering::Acquire;
    let mut best: Option<(usize, u64)> = None;
    for (slot, word) in claims.iter().enumerate() {
        let word = word.load(Acquire);
        if word == 0 || !claim_ready(word) || claim_pid(word) != pid {
            continue;
        }
        let sequence = claim_sequence(word);
        // Later modulo 2^31: the difference, read as signed, is positive.
        let later = |than: u64| (sequence.wrapping_sub(than) & 0x7fff_ffff) < 0x4000_0000;
        if best.is_none_or(|(_, s)| later(s)) {
            best = Some((slot, sequence));
        }
    }
    best.map(|(slot, _)| slot)
}

/// Claims a free slot among `claims` for process `pid` (not ready yet): its index, or
/// `None` when every slot is taken. (Not for the eBPF target, which has no
/// compare-and-exchange here.)
#[cfg(not(target_arch = "bpf"))]
pub fn take_slot(claims: &[AtomicU64], sequence: u64, pid: u32) -> Option<usize> {
    use core::sync::atomic::Ordering::{AcqRel, Relaxed};
    let word = claim(sequence.max(1), pid, false);
    claims.iter().position(|slot| {
        slot.load(Relaxed) == 0 && slot.compare_exchange(0, word, AcqRel, Relaxed).is_ok()
    })
}

/// Writes the header of a zeroed region for process `pid`, at `interval` (with its scale)
/// and `generation`: how the library sets up its own regions and allocscope a command's.
///
/// # Safety
/// `region` points to a writable, zeroed [`Region`] that no other thread uses yet.
#[cfg(any(test, feature = "float"))]
pub unsafe fn set_up_region(region: *mut Region, pid: u32, interval: u64, generation: u64) {
    use core::sync::atomic::Ordering::{Relaxed, Release};
    // SAFETY: the caller's; the atomics are written through their own API.
    unsafe {
        (*region).magic = REGION_MAGIC;
        (*region).version = REGION_VERSION;
        (*region).pid = u64::from(pid);
        (*region).interval.store(interval, Relaxed);
        (*region)
            .scale_q32
            .store(crate::geometric::scale_q32(interval).unwrap_or(0), Relaxed);
        (*region).generation.store(generation, Release);
    }
}

/// The shared region, one per process (a fork gets a fresh one). What the library writes
/// as it sets up (the header, the name, the maps' length, the first thread's counts) is on
/// the first page: a short process's set-up touches one page of its region, not three
/// (each first touch a page fault; on a disk, of a file's hole).
#[repr(C)]
#[derive(Debug)]
pub struct Region {
    /// [`REGION_MAGIC`].
    pub magic: u64,
    /// [`REGION_VERSION`].
    pub version: u64,
    /// The process that owns the region.
    pub pid: u64,
    /// Mean sampling interval for countdowns drawn from now on (allocscope writes it,
    /// with [`Self::scale_q32`], then bumps [`Self::generation`]).
    pub interval: AtomicU64,
    /// [`crate::geometric::scale_q32`] of the interval.
    pub scale_q32: AtomicU64,
    /// Changes when the interval does: a thread that sees a new generation draws a new
    /// countdown (legal: the choice to redraw does not depend on the countdown).
    pub generation: AtomicU64,
    /// Sampled blocks the library fired.
    pub samples: AtomicU64,
    /// Sampled blocks it could not remember (table full): their frees are not reported.
    pub untracked: AtomicU64,
    /// Odd while an exiting thread moves its counts into [`Self::retired`]: a reader
    /// retries until it reads the same even value before and after.
    pub retired_sequence: AtomicU64,
    /// Bytes of [`Self::maps`] written (0: none yet); stored after the maps are.
    pub maps_len: AtomicU64,
    /// When the maps were read (CLOCK_MONOTONIC ns, the samples' clock).
    pub maps_ns: AtomicU64,
    /// The process's name (`comm`, 16 bytes, NUL-padded) when the library set up: the name
    /// after its latest exec, for a process gone before allocscope could read it.
    pub comm: [AtomicU64; 2],
    /// Opened into a running process (`record -p`): slots of its objects rewritten to reach
    /// the library (0 when preloaded: the loader bound them there).
    pub routed: AtomicU64,
    /// Opened into a running process: slots of the malloc family bound to something else
    /// than the process's definition, left alone (their calls are not counted).
    pub left: AtomicU64,
    /// When the library last set up in the process (after its latest exec that carried
    /// it, or at its fork), CLOCK_MONOTONIC ns: an exec after it did not carry the library.
    pub set_up_ns: AtomicU64,
    /// Entry points of an allocator linked into the executable that the library patched
    /// to count their calls (see [`crate::patch`]).
    pub patched: AtomicU64,
    /// Why the library patched none of the plan's entries: a [`PatchRefusal`] (0: it did,
    /// or had no plan).
    pub patch_refused: AtomicU64,
    /// Counts of threads that exited.
    pub retired: Counts,
    /// Counts of threads that found no free slot.
    pub overflow: Counts,
    /// One slot per live thread.
    pub slots: [Counts; THREAD_SLOTS],
    /// The process's `/proc/self/maps` as the library read it at its first sampled call
    /// since its set-up (a process that takes no sample needs none: reading them cost every
    /// short process time, docs/performance.md, "Figures quoted from the code"),
    /// [`Self::maps_len`] bytes in little-endian words, cut
    /// at a line when longer: what allocscope knows of a process that exits before it
    /// could read its maps itself.
    pub maps: [AtomicU64; MAPS_BYTES / 8],
}

impl Region {
    /// Copies the maps the library wrote into `out` (at least [`MAPS_BYTES`] long) and
    /// returns their length and when they were read; `None` before they are written.
    pub fn maps_into(&self, out: &mut [u8]) -> Option<(usize, u64)> {
        use core::sync::atomic::Ordering::{Acquire, Relaxed};
        let len = (self.maps_len.load(Acquire) as usize)
            .min(MAPS_BYTES)
            .min(out.len());
        if len == 0 {
            return None;
        }
        for (chunk, word) in out[..len].chunks_mut(8).zip(&self.maps) {
            chunk.copy_from_slice(&word.load(Relaxed).to_le_bytes()[..chunk.len()]);
        }
        Some((len, self.maps_ns.load(Relaxed)))
    }

    /// Writes `bytes` (at most [`MAPS_BYTES`], cut at the last full line beyond) as the
    /// maps read at `read_ns`.
    pub fn set_maps(&self, bytes: &[u8], read_ns: u64) {
        use core::sync::atomic::Ordering::{Relaxed, Release};
        let mut len = bytes.len().min(MAPS_BYTES);
        if len < bytes.len() {
            len = bytes[..len]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |at| at + 1);
        }
        for (chunk, word) in bytes[..len].chunks(8).zip(&self.maps) {
            let mut le = [0u8; 8];
            le[..chunk.len()].copy_from_slice(chunk);
            word.store(u64::from_le_bytes(le), Relaxed);
        }
        self.maps_ns.store(read_ns, Relaxed);
        self.maps_len.store(len as u64, Release);
    }

    /// Forgets the maps written (an exec's new program has others), before its set-up.
    pub fn clear_maps(&self) {
        self.maps_len
            .store(0, core::sync::atomic::Ordering::Release);
    }

    /// Writes the process's name (its `comm`, NUL-padded).
    pub fn set_comm(&self, comm: &[u8; 16]) {
        use core::sync::atomic::Ordering::Release;
        for (chunk, word) in comm.chunks(8).zip(&self.comm) {
            let mut le = [0u8; 8];
            le.copy_from_slice(chunk);
            word.store(u64::from_le_bytes(le), Release);
        }
    }

    /// The process's name as [`Self::set_comm`] wrote it (empty: none yet).
    pub fn comm_bytes(&self) -> [u8; 16] {
        use core::sync::atomic::Ordering::Acquire;
        let mut out = [0u8; 16];
        for (chunk, word) in out.chunks_mut(8).zip(&self.comm) {
            chunk.copy_from_slice(&word.load(Acquire).to_le_bytes());
        }
        out
    }

    /// Total calls and bytes counted so far: retired, overflowing and every slot, read
    /// consistently with an exiting thread's move (a seqlock on the retired counts). A
    /// process killed in the middle of a move leaves the sequence odd forever: after
    /// [`READ_ATTEMPTS`] the last reading is returned (off by at most that thread's counts).
    pub fn totals(&self) -> (u64, u64) {
        use core::sync::atomic::Ordering::{Acquire, Relaxed};
        let mut last = (0, 0);
        for _ in 0..READ_ATTEMPTS {
            let before = self.retired_sequence.load(Acquire);
            let mut calls = self.retired.calls.load(Relaxed) + self.overflow.calls.load(Relaxed);
            let mut bytes = self.retired.bytes.load(Relaxed) + self.overflow.bytes.load(Relaxed);
            for slot in &self.slots {
                calls = calls.wrapping_add(slot.calls.load(Relaxed));
                bytes = bytes.wrapping_add(slot.bytes.load(Relaxed));
            }
            if before & 1 == 0 && self.retired_sequence.load(Acquire) == before {
                return (calls, bytes);
            }
            last = (calls, bytes);
            core::hint::spin_loop();
        }
        last
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::boxed::Box;

    use super::*;

    fn zeroed() -> Box<Region> {
        // SAFETY: every field of a region is valid all-zero (how processes create them).
        unsafe { Box::<Region>::new_zeroed().assume_init() }
    }

    #[test]
    fn claims_name_their_process_and_the_latest_wins() {
        let claims: std::vec::Vec<AtomicU64> = (0..8).map(|_| AtomicU64::new(0)).collect();
        let first = take_slot(&claims, 1, 4242).unwrap();
        assert_eq!(find_claim(&claims, 4242), None, "not ready yet");
        claims[first].store(claim(1, 4242, true), core::sync::atomic::Ordering::Release);
        assert_eq!(find_claim(&claims, 4242), Some(first));
        assert_eq!(find_claim(&claims, 4243), None);
        // The same pid again (the first process exited, not given back yet): the later.
        let second = take_slot(&claims, 2, 4242).unwrap();
        assert_ne!(first, second);
        claims[second].store(claim(2, 4242, true), core::sync::atomic::Ordering::Release);
        assert_eq!(find_claim(&claims, 4242), Some(second));
        // Sequence numbers wrap at 2^31: still the later one.
        claims[first].store(
            claim(0x7fff_ffff, 7, true),
            core::sync::atomic::Ordering::Release,
        );
        claims[second].store(claim(3, 7, true), core::sync::atomic::Ordering::Release);
        assert_eq!(find_claim(&claims, 7), Some(second));
        let word = claim(5, u32::MAX, true);
        assert_eq!(
            (claim_pid(word), claim_sequence(word), claim_ready(word)),
            (u32::MAX, 5, true)
        );
        // Full: no slot.
        for _ in 0..6 {
            assert!(take_slot(&claims, 9, 1).is_some());
        }
        assert_eq!(take_slot(&claims, 9, 1), None);
    }

    #[test]
    fn what_the_library_writes_at_set_up_is_on_a_regions_first_page() {
        use core::mem::{offset_of, size_of};
        for end in [
            offset_of!(Region, generation) + 8,
            offset_of!(Region, maps_len) + 8,
            offset_of!(Region, comm) + 16,
            offset_of!(Region, set_up_ns) + 8,
            // The first thread's slot (sampler-preload's thread.rs tries slot 0 first).
            offset_of!(Region, slots) + size_of::<Counts>(),
        ] {
            assert!(end <= PAGE, "{end}");
        }
    }

    #[test]
    fn regions_sit_on_page_boundaries_after_the_header() {
        assert_eq!(family_header_bytes() % PAGE, 0);
        assert!(family_header_bytes() >= core::mem::size_of::<FamilyHeader>());
        assert_eq!(region_bytes() % PAGE, 0);
        assert_eq!(
            family_region_offset(1) - family_region_offset(0),
            region_bytes()
        );
        // The early records follow the regions, each on whole pages with room for the
        // largest stack copy after its head.
        assert_eq!(
            family_early_offset(),
            family_header_bytes() + FAMILY_SLOTS * region_bytes()
        );
        assert_eq!(early_record_bytes() % PAGE, 0);
        assert!(early_record_bytes() >= EARLY_STACK_OFFSET + crate::MAX_STACK_COPY);
        // The frames start 8-byte aligned after the head, the stack after the frames.
        assert_eq!(EARLY_PY_OFFSET % 8, 0);
        const { assert!(EARLY_STACK_OFFSET > EARLY_PY_OFFSET) };
        // The patch plan last, on pages of its own (mapped read-only).
        assert_eq!(
            family_patches_offset(),
            family_early_offset() + EARLY_SLOTS * early_record_bytes()
        );
        assert_eq!(family_patches_offset() % PAGE, 0);
        assert!(family_patches_bytes() >= core::mem::size_of::<crate::patch::PatchPlan>());
        assert_eq!(
            family_bytes(),
            family_patches_offset() + family_patches_bytes()
        );
    }

    #[test]
    fn maps_round_trip_and_are_cut_at_a_line() {
        let region = zeroed();
        let mut out = std::vec![0u8; MAPS_BYTES];
        assert_eq!(region.maps_into(&mut out), None);
        let text = b"5581f0a01000-5581f0a02000 r-xp 00001000 fe:01 1234 /usr/bin/demo\n";
        region.set_maps(text, 42);
        let (len, read_ns) = region.maps_into(&mut out).unwrap();
        assert_eq!((&out[..len], read_ns), (&text[..], 42));
        // Longer than the buffer: whole lines only.
        let long: std::vec::Vec<u8> = text
            .iter()
            .copied()
            .cycle()
            .take(MAPS_BYTES + 100)
            .collect();
        region.set_maps(&long, 43);
        let (len, _) = region.maps_into(&mut out).unwrap();
        assert!(len <= MAPS_BYTES && len % text.len() == 0, "{len}");
        assert_eq!(out[len - 1], b'\n');
    }
}
