//! The process's shared counter region ([`sampler_common::preload::Region`]).
//!
//! Started by allocscope (`-- CMD`), the process finds a region allocscope created and
//! already maps, by its descriptor in `ALLOCSCOPE_REGION_FD`, named for its pid: the
//! programs it execs (the same pid) count on in it, the processes it forks make their
//! own. Otherwise
//! (a process started by one of ours, or by hand with `LD_PRELOAD`) the library creates
//! one from a memfd, which allocscope maps later through `/proc/PID/map_files`. A forked
//! child gets a new one (the parent's is shared memory: the child must not count in it).
//! The address is exported as [`allocscope_preload_region`] for allocscope to find.

use core::{
    ptr,
    sync::atomic::{AtomicPtr, Ordering},
};

use sampler_common::{
    geometric,
    preload::{Region, REGION_MAGIC, REGION_VERSION},
};

/// Where this process's region is (read by allocscope from outside).
#[no_mangle]
#[used]
pub static allocscope_preload_region: AtomicPtr<Region> = AtomicPtr::new(ptr::null_mut());

/// Default mean interval when nobody set one (allocscope's and OpenTelemetry's default).
const DEFAULT_INTERVAL: u64 = 512 * 1024;

/// The region (set up before any call is counted).
#[inline(always)]
pub fn current() -> &'static Region {
    // SAFETY: set by `init` (to a mapping never unmapped while current) before `ready()`,
    // and the counting paths run only after it.
    unsafe { &*allocscope_preload_region.load(Ordering::Relaxed) }
}

const fn region_bytes() -> usize {
    (core::mem::size_of::<Region>() + 4095) & !4095
}

fn pid() -> u64 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u64 }
}

/// Maps a region: from allocscope's descriptor if it left one for this very process, else
/// a new one. Runs once, while resolving (no allocation happens here).
pub fn init() {
    let region = inherited().unwrap_or_else(|| create(DEFAULT_INTERVAL, interval_from_env()));
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
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime fills the struct we own.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let read_ns = (now.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(now.tv_nsec as u64);
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

/// The region allocscope created for this process, if `ALLOCSCOPE_REGION_FD` names one.
///
/// The descriptor stays open and the variable set: a program this process execs is the
/// same process (a wrapper script's `exec`, pyenv's shims, `env`, `nice`), and keeps
/// counting in the same region; a process it forks has another pid and is refused here
/// (it creates its own). Only a memfd-backed regular file of the region's size is mapped:
/// the number may name another file by now, and reading past the end of a shorter one
/// would raise SIGBUS.
fn inherited() -> Option<*mut Region> {
    let name = c"ALLOCSCOPE_REGION_FD";
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
        || stat.st_size != region_bytes() as libc::off_t
    {
        return None;
    }
    let mapped = map_shared(fd);
    if mapped == libc::MAP_FAILED {
        return None;
    }
    let region = mapped.cast::<Region>();
    // SAFETY: a mapping of region_bytes() bytes.
    let ok = unsafe {
        (*region).magic == REGION_MAGIC
            && (*region).version == REGION_VERSION
            && (*region).pid == pid()
    };
    if !ok {
        // SAFETY: unmapping what we just mapped.
        unsafe { libc::munmap(mapped, region_bytes()) };
        return None;
    }
    Some(region)
}

/// A new region from a memfd (a static one if that fails: still counted, readable through
/// /proc/PID/mem), with `interval` (or `fallback` when 0).
fn create(fallback: u64, interval: u64) -> *mut Region {
    let interval = if interval == 0 || interval > geometric::MAX_INTERVAL {
        fallback
    } else {
        interval
    };
    let region = map_new().unwrap_or_else(|| {
        static FALLBACK: StaticRegion =
            StaticRegion(core::cell::UnsafeCell::new(core::mem::MaybeUninit::zeroed()));
        FALLBACK.0.get().cast::<Region>()
    });
    // SAFETY: a zeroed region no other thread sees yet; the atomics are written through
    // their own API.
    unsafe {
        (*region).magic = REGION_MAGIC;
        (*region).version = REGION_VERSION;
        (*region).pid = pid();
        (*region).interval.store(interval, Ordering::Relaxed);
        (*region).scale_q32.store(
            geometric::scale_q32(interval).unwrap_or(0),
            Ordering::Relaxed,
        );
        (*region).generation.store(1, Ordering::Release);
    }
    region
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
        map_shared(fd)
    } else {
        libc::MAP_FAILED
    };
    // SAFETY: closing our own descriptor (the mapping stays).
    unsafe { libc::close(fd) };
    (mapped != libc::MAP_FAILED).then(|| mapped.cast())
}

/// Maps a region's worth of `fd` from its start, shared and writable (`MAP_FAILED` on
/// error).
fn map_shared(fd: i32) -> *mut libc::c_void {
    // SAFETY: a new mapping of the descriptor's first pages; nothing existing is replaced.
    unsafe {
        libc::mmap(
            ptr::null_mut(),
            region_bytes(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    }
}

/// In a forked child: a region of its own, with the parent's interval.
pub fn after_fork() {
    let parent = current();
    let interval = parent.interval.load(Ordering::Relaxed);
    let generation = parent.generation.load(Ordering::Relaxed);
    let region = create(DEFAULT_INTERVAL, interval);
    // SAFETY: the new region, not yet visible to anyone.
    unsafe {
        (*region)
            .generation
            .store(generation.max(1), Ordering::Release)
    };
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
