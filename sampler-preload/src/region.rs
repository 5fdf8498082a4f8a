//! The process's shared counter region ([`sampler_common::preload::Region`]).
//!
//! Started by allocscope (`-- CMD`), a process finds the family table allocscope created
//! ([`sampler_common::preload::Family`]) by its descriptor in `ALLOCSCOPE_FAMILY_FD`,
//! inherited by every process of the command's tree: the command's own slot is claimed by
//! allocscope before it runs, a process it forks claims a slot of its own at once (in the
//! fork handler, before its first call), and a program a process execs (the same pid)
//! finds its process's claim and counts on in it. allocscope maps the whole table, so a
//! process's counts and maps are there however soon it exits. Otherwise (a process started
//! by hand with `LD_PRELOAD`, a table that is full, a descriptor the program closed) the
//! library creates a region of its own from a memfd, which allocscope maps later through
//! `/proc/PID/map_files`. The address is exported as [`allocscope_preload_region`] for
//! allocscope to find.

use core::{
    ptr,
    sync::atomic::{AtomicI32, AtomicPtr, Ordering},
};

use sampler_common::{
    geometric,
    preload::{
        claim, family_bytes, family_header_bytes, family_region_offset, find_claim, region_bytes,
        set_up_region, take_slot, Family, Region, CLAIM_READY, FAMILY_MAGIC, FAMILY_VERSION,
        REGION_MAGIC,
    },
};

/// Where this process's region is (read by allocscope from outside).
#[no_mangle]
#[used]
pub static allocscope_preload_region: AtomicPtr<Region> = AtomicPtr::new(ptr::null_mut());

/// The family table's header, when the process found one (kept across fork: the mapping
/// is shared, so a child claims in the same table).
static FAMILY: AtomicPtr<Family> = AtomicPtr::new(ptr::null_mut());

/// The family table's descriptor (to map a child's region after a fork).
static FAMILY_FD: AtomicI32 = AtomicI32::new(-1);

/// The family table's header, if this process counts in one.
pub fn family_table() -> Option<&'static Family> {
    // SAFETY: set once to a checked header mapping that is never unmapped.
    unsafe { FAMILY.load(Ordering::Acquire).as_ref() }
}

/// The family table's descriptor (-1: none).
pub fn family_fd() -> i32 {
    FAMILY_FD.load(Ordering::Acquire)
}

/// Default mean interval when nobody set one (allocscope's and OpenTelemetry's default).
const DEFAULT_INTERVAL: u64 = 512 * 1024;

/// The region (set up before any call is counted).
#[inline(always)]
pub fn current() -> &'static Region {
    // SAFETY: set by `init` (to a mapping never unmapped while current) before `ready()`,
    // and the counting paths run only after it.
    unsafe { &*allocscope_preload_region.load(Ordering::Relaxed) }
}

fn pid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// Maps a region: this process's in the family table it inherited (found, or claimed),
/// else a new one. Runs once, while resolving (no allocation happens here).
pub fn init() {
    let region = match family() {
        Some((family, fd)) => {
            FAMILY.store(family, Ordering::Release);
            FAMILY_FD.store(fd, Ordering::Release);
            // SAFETY: a checked header mapping, never unmapped.
            let claims = unsafe { &(*family).claims };
            match find_claim(claims, pid()) {
                Some(slot) => map_slot(fd, slot).filter(|&r| {
                    // SAFETY: a region-sized mapping.
                    unsafe { (*r).magic == REGION_MAGIC && (*r).pid == u64::from(pid()) }
                }),
                None => claim_slot(family, fd, 0),
            }
        }
        None => None,
    };
    let region = region.unwrap_or_else(|| create(DEFAULT_INTERVAL, interval_from_env()));
    allocscope_preload_region.store(region, Ordering::Release);
    snapshot_maps();
}

/// Copies `/proc/self/maps` into the region ([`Region::set_maps`]): a process that exits
/// within milliseconds is gone before allocscope reads its maps, and its samples' frames
/// would be addresses in no known file. Read into a temporary mapping (no allocation, no
/// large stack frame: a forking thread's stack may be small); nothing on any failure.
fn snapshot_maps() {
    const BYTES: usize = sampler_common::preload::MAPS_BYTES + 4096;
    // SAFETY: a fresh private anonymous mapping, ours until unmapped below.
    let buffer = unsafe {
        libc::mmap(
            ptr::null_mut(),
            BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if buffer == libc::MAP_FAILED {
        return;
    }
    // SAFETY: opening a proc file with a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd >= 0 {
        let mut len = 0usize;
        while len < BYTES {
            // SAFETY: reads into the unused rest of our buffer.
            let n = unsafe { libc::read(fd, buffer.cast::<u8>().add(len).cast(), BYTES - len) };
            if n <= 0 {
                break;
            }
            len += n as usize;
        }
        // SAFETY: closing the descriptor opened above.
        unsafe { libc::close(fd) };
        let read_ns = crate::monotonic_ns();
        // SAFETY: the first `len` bytes of the buffer were written by read.
        let bytes = unsafe { core::slice::from_raw_parts(buffer.cast::<u8>(), len) };
        current().set_maps(bytes, read_ns);
    }
    // SAFETY: unmapping our own buffer.
    unsafe { libc::munmap(buffer, BYTES) };
}

/// `ALLOCSCOPE_INTERVAL` (bytes), for a process started by hand with the library.
fn interval_from_env() -> u64 {
    // SAFETY: getenv with a NUL-terminated name; the result is read before any setenv.
    let value = unsafe { libc::getenv(c"ALLOCSCOPE_INTERVAL".as_ptr()) };
    if value.is_null() {
        return 0;
    }
    // SAFETY: a NUL-terminated string from the environment.
    let bytes = unsafe { core::ffi::CStr::from_ptr(value) }.to_bytes();
    parse_u64(bytes).unwrap_or(0)
}

fn parse_u64(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

/// The family table named by `ALLOCSCOPE_FAMILY_FD`, its header mapped, and the
/// descriptor. Only a regular file of the table's size with the right header is taken: the
/// number may name another file by now, and reading past the end of a shorter one would
/// raise SIGBUS.
fn family() -> Option<(*mut Family, i32)> {
    let name = sampler_common::preload::FAMILY_FD_VARIABLE;
    // SAFETY: as in interval_from_env.
    let value = unsafe { libc::getenv(name.as_ptr()) };
    if value.is_null() {
        return None;
    }
    // SAFETY: as above.
    let fd = parse_u64(unsafe { core::ffi::CStr::from_ptr(value) }.to_bytes());
    let fd = i32::try_from(fd?).ok()?;
    // SAFETY: all-zero is a valid `stat`.
    let mut stat: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fstat fills the struct we own.
    let statted = unsafe { libc::fstat(fd, &mut stat) } == 0;
    if !statted
        || stat.st_mode & libc::S_IFMT != libc::S_IFREG
        || stat.st_size != family_bytes() as libc::off_t
    {
        return None;
    }
    let mapped = map_shared(fd, 0, family_header_bytes());
    if mapped == libc::MAP_FAILED {
        return None;
    }
    let family = mapped.cast::<Family>();
    // SAFETY: a mapping of the header's bytes.
    let ok = unsafe { (*family).magic == FAMILY_MAGIC && (*family).version == FAMILY_VERSION };
    if !ok {
        // SAFETY: unmapping what we just mapped.
        unsafe { libc::munmap(mapped, family_header_bytes()) };
        return None;
    }
    Some((family, fd))
}

/// Maps slot `slot`'s region of the family table `fd`.
fn map_slot(fd: i32, slot: usize) -> Option<*mut Region> {
    let mapped = map_shared(fd, family_region_offset(slot), region_bytes());
    (mapped != libc::MAP_FAILED).then(|| mapped.cast())
}

/// Claims a free slot of `family` for this process, maps its region (all zeros: never
/// used, or given back with its pages dropped) and sets it up at the table's interval (or
/// `interval`, when not 0). `None` when the table is full (counted) or the region cannot
/// be mapped (the slot is given back).
fn claim_slot(family: *mut Family, fd: i32, interval: u64) -> Option<*mut Region> {
    // SAFETY: a checked header mapping, never unmapped; its fields are atomics.
    let family = unsafe { &*family };
    let sequence = family.sequence.fetch_add(1, Ordering::AcqRel) + 1;
    let pid = pid();
    let Some(slot) = take_slot(&family.claims, sequence, pid) else {
        family.full.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    let Some(region) = map_slot(fd, slot) else {
        family.claims[slot].store(0, Ordering::Release);
        return None;
    };
    let interval = if interval == 0 {
        family.interval.load(Ordering::Acquire)
    } else {
        interval
    };
    set_up(region, interval, DEFAULT_INTERVAL, 1);
    family.claims[slot].store(claim(sequence, pid, true), Ordering::Release);
    debug_assert!(family.claims[slot].load(Ordering::Relaxed) & CLAIM_READY != 0);
    Some(region)
}

/// A new region from a memfd (a static one if that fails: still counted, readable through
/// /proc/PID/mem), with `interval` (or `fallback` when 0).
fn create(fallback: u64, interval: u64) -> *mut Region {
    let region = map_new().unwrap_or_else(|| {
        static FALLBACK: StaticRegion =
            StaticRegion(core::cell::UnsafeCell::new(core::mem::MaybeUninit::zeroed()));
        FALLBACK.0.get().cast::<Region>()
    });
    set_up(region, interval, fallback, 1);
    region
}

/// Writes a zeroed region's header: this process's, at `interval` (or `fallback` when it
/// is 0 or out of range), at `generation`.
fn set_up(region: *mut Region, interval: u64, fallback: u64, generation: u64) {
    let interval = if interval == 0 || interval > geometric::MAX_INTERVAL {
        fallback
    } else {
        interval
    };
    // SAFETY: a zeroed region no other thread sees yet.
    unsafe { set_up_region(region, pid(), interval, generation) };
}

struct StaticRegion(core::cell::UnsafeCell<core::mem::MaybeUninit<Region>>);
// SAFETY: used only as the process's region, whose fields are atomics or set once.
unsafe impl Sync for StaticRegion {}

fn map_new() -> Option<*mut Region> {
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"allocscope-counters".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: sizing our own descriptor.
    let sized = unsafe { libc::ftruncate(fd, region_bytes() as libc::off_t) } == 0;
    let mapped = if sized {
        map_shared(fd, 0, region_bytes())
    } else {
        libc::MAP_FAILED
    };
    // SAFETY: closing our own descriptor (the mapping stays).
    unsafe { libc::close(fd) };
    (mapped != libc::MAP_FAILED).then(|| mapped.cast())
}

/// Maps `len` bytes of `fd` from `offset`, shared and writable (`MAP_FAILED` on error).
fn map_shared(fd: i32, offset: usize, len: usize) -> *mut libc::c_void {
    // SAFETY: a new mapping of the descriptor's pages; nothing existing is replaced.
    unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            offset as libc::off_t,
        )
    }
}

/// In a forked child: a region of its own, with the parent's interval: a slot of the
/// family table when the process has one, else a new memfd.
pub fn after_fork() {
    let parent = current();
    let interval = parent.interval.load(Ordering::Relaxed);
    let generation = parent.generation.load(Ordering::Relaxed).max(1);
    let family = FAMILY.load(Ordering::Acquire);
    let claimed = if family.is_null() {
        None
    } else {
        claim_slot(family, FAMILY_FD.load(Ordering::Acquire), interval)
    };
    let region = claimed.unwrap_or_else(|| create(DEFAULT_INTERVAL, interval));
    // SAFETY: the new region, not yet visible to anyone but allocscope (which only reads
    // the generation).
    unsafe { (*region).generation.store(generation, Ordering::Release) };
    allocscope_preload_region.store(region, Ordering::Release);
    snapshot_maps();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse_or_are_refused() {
        assert_eq!(parse_u64(b"524288"), Some(524288));
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"12k"), None);
        assert_eq!(parse_u64(b"99999999999999999999999"), None);
    }
}
