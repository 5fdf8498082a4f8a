//! The process's shared counter region ([`sampler_common::preload::Region`]).
//!
//! Started by allocscope (`-- CMD`), a process finds the family table allocscope created
//! ([`sampler_common::preload::FamilyHeader`]) in the file beside the library's own path
//! ([`sampler_common::preload::FAMILY_FILE`], in a root-owned directory: see
//! allocscope-target's `preload::place`), opened only for as long as it takes to map a part of
//! it (no descriptor stays, none is inherited): the command's own slot is claimed by
//! allocscope before it runs, a process it forks claims a slot of its own at once (in the
//! fork handler, before its first call), and a program a process execs (the same pid)
//! finds its process's claim and counts on in it. allocscope maps the whole table, so a
//! process's counts and maps are there however soon it exits. Otherwise (a process started
//! by hand with `LD_PRELOAD`, a table that is full or gone, a file it may not open) the
//! library creates a region of its own from a memfd, which allocscope maps later through
//! `/proc/PID/map_files`. The address is exported as [`allocscope_preload_region`] for
//! allocscope to find.

use core::{
    ptr,
    sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering},
};

use sampler_common::{
    geometric,
    patch::PatchPlan,
    preload::{
        claim, family_bytes, family_header_bytes, family_patches_bytes, family_patches_offset,
        family_region_offset, find_claim, region_bytes, set_up_region, take_slot, FamilyHeader,
        Region, CLAIM_READY, FAMILY_FILE, FAMILY_MAGIC, FAMILY_VERSION, REGION_MAGIC,
    },
};

/// Where this process's region is (read by allocscope from outside).
#[no_mangle]
#[used]
pub static allocscope_preload_region: AtomicPtr<Region> = AtomicPtr::new(ptr::null_mut());

/// Slots rewritten to reach this library (by `route`, in a process it was opened into;
/// reported with the region's counts).
pub static ROUTED: AtomicU64 = AtomicU64::new(0);
/// Slots of a routed function bound to something else than the process's definition.
pub static LEFT: AtomicU64 = AtomicU64::new(0);

/// The region this process counts in: the exported one, or a private one nobody reads
/// (dormant, or a sandboxed process's child: see [`crate::sandbox`]).
static CURRENT: AtomicPtr<Region> = AtomicPtr::new(ptr::null_mut());

/// Makes `region` the one counted in, and the one allocscope finds when `published`.
fn make_current(region: *mut Region, published: bool) {
    CURRENT.store(region, Ordering::Release);
    allocscope_preload_region.store(
        if published { region } else { ptr::null_mut() },
        Ordering::Release,
    );
}

/// The family table's header, when the process found one (kept across fork: the mapping
/// is shared, so a child claims in the same table).
static FAMILY: AtomicPtr<FamilyHeader> = AtomicPtr::new(ptr::null_mut());

/// The family table's path, NUL-terminated (empty: none), written once at set-up.
static FAMILY_PATH: FamilyPath = FamilyPath(core::cell::UnsafeCell::new([0; FAMILY_PATH_BYTES]));
/// Whether [`FAMILY_PATH`] holds a path.
static FAMILY_PATH_SET: AtomicBool = AtomicBool::new(false);
const FAMILY_PATH_BYTES: usize = 4096;

struct FamilyPath(core::cell::UnsafeCell<[u8; FAMILY_PATH_BYTES]>);
// SAFETY: written once by the resolving thread before FAMILY_PATH_SET, read-only after.
unsafe impl Sync for FamilyPath {}

/// The process is in another pid namespace than allocscope: it claims no slot and writes
/// no early record (both are keyed by pids as allocscope sees them).
static FOREIGN: AtomicBool = AtomicBool::new(false);

/// Whether this process may claim slots and write early records in its family table.
pub fn in_family_namespace() -> bool {
    !FOREIGN.load(Ordering::Acquire)
}

/// Whether this process is in the pid namespace the family table was made in (the inode
/// of `/proc/self/ns/pid`; not when it cannot be read). Read as the link's text
/// (`pid:[INODE]`): following the link to `stat` it made the kernel set up the namespace's
/// file, slower in a new process's start than reading the link (docs/performance.md, "Many
/// short processes: builds and scripts").
fn same_pid_namespace(family: *mut FamilyHeader) -> bool {
    let mut link = [0u8; 64];
    // SAFETY: readlink with a NUL-terminated path into a buffer we own, within its length.
    let len = unsafe {
        libc::readlink(
            c"/proc/self/ns/pid".as_ptr(),
            link.as_mut_ptr().cast(),
            link.len(),
        )
    };
    let inode = usize::try_from(len)
        .ok()
        .and_then(|len| namespace_inode(&link[..len.min(link.len())]));
    // SAFETY: a checked header mapping; the field is written before any process runs.
    inode.is_some_and(|inode| unsafe { (*family).pid_namespace } == inode)
}

/// The inode in a namespace link's text (`pid:[4026531836]`).
fn namespace_inode(link: &[u8]) -> Option<u64> {
    parse_u64(link.strip_prefix(b"pid:[")?.strip_suffix(b"]")?)
}

/// The family table's header, if this process counts in one.
pub fn family_table() -> Option<&'static FamilyHeader> {
    // SAFETY: set once to a checked header mapping that is never unmapped.
    unsafe { FAMILY.load(Ordering::Acquire).as_ref() }
}

/// Default mean interval when nobody set one (allocscope's and OpenTelemetry's default).
const DEFAULT_INTERVAL: u64 = 512 * 1024;

/// The region (set up before any call is counted).
#[inline(always)]
pub fn current() -> &'static Region {
    // SAFETY: set by `init` (to a mapping never unmapped while current) before `ready()`,
    // and the counting paths run only after it.
    unsafe { &*CURRENT.load(Ordering::Relaxed) }
}

fn pid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// Maps a region: this process's in the family table it inherited (found, or claimed),
/// else a new one. Runs once, while resolving (no allocation happens here).
pub fn init() {
    find_family_path();
    let region = match family() {
        Some((family, fd)) if !same_pid_namespace(family) => {
            // Pids in the table are allocscope's: this process's are not. Only the early
            // state is looked at (to wait for the probes); it counts in a region of its own.
            FAMILY.store(family, Ordering::Release);
            FOREIGN.store(true, Ordering::Release);
            // SAFETY: closing the descriptor opened by family() (the mapping stays).
            unsafe { libc::close(fd) };
            None
        }
        Some((family, fd)) => {
            FAMILY.store(family, Ordering::Release);
            // SAFETY: a checked header mapping, never unmapped.
            let claims = unsafe { &(*family).claims };
            let region = match find_claim(claims, pid()) {
                Some(slot) => map_slot(fd, slot).filter(|&r| {
                    // SAFETY: a region-sized mapping.
                    unsafe { (*r).magic == REGION_MAGIC && (*r).pid == u64::from(pid()) }
                }),
                None => claim_slot(family, fd, 0),
            };
            map_patch_plan(family, fd);
            // SAFETY: closing the descriptor opened by family() (the mappings stay).
            unsafe { libc::close(fd) };
            region
        }
        None => None,
    };
    let region = region.unwrap_or_else(|| create(DEFAULT_INTERVAL, interval_from_env()));
    make_current(region, true);
    note_set_up();
}

/// The family table's patch plan, mapped read-only by [`init`] (null: none), until
/// [`take_patch_plan`].
static PATCH_PLAN: AtomicPtr<PatchPlan> = AtomicPtr::new(ptr::null_mut());
/// The table has a plan, whose pages could not be mapped.
static PATCH_PLAN_UNREADABLE: AtomicBool = AtomicBool::new(false);

/// Maps the plan of a family table (open as `fd`) whose header says it has one.
fn map_patch_plan(header: *const FamilyHeader, fd: i32) {
    // SAFETY: a checked header mapping; `patches` is written before the command starts.
    if unsafe { ptr::read_volatile(&raw const (*header).patches) } == 0 {
        return;
    }
    // SAFETY: a new read-only mapping of the table's plan pages.
    let mapped = unsafe {
        libc::mmap(
            ptr::null_mut(),
            family_patches_bytes(),
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            family_patches_offset() as libc::off_t,
        )
    };
    if mapped == libc::MAP_FAILED {
        PATCH_PLAN_UNREADABLE.store(true, Ordering::Release);
    } else {
        PATCH_PLAN.store(mapped.cast(), Ordering::Release);
    }
}

/// The patch plan of the family table this process counts in (see `patch`), for the
/// caller to unmap: `None` without one, `Some(None)` when it could not be mapped.
pub fn take_patch_plan() -> Option<Option<*const PatchPlan>> {
    let plan = PATCH_PLAN.swap(ptr::null_mut(), Ordering::AcqRel);
    if !plan.is_null() {
        return Some(Some(plan));
    }
    PATCH_PLAN_UNREADABLE
        .swap(false, Ordering::AcqRel)
        .then_some(None)
}

/// Publishes how many slots the routing rewrote and left (see [`crate::route`]).
pub fn note_routes() {
    let region = current();
    region
        .routed
        .store(ROUTED.load(Ordering::Relaxed), Ordering::Relaxed);
    region
        .left
        .store(LEFT.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// A dormant library's region (see [`crate::sandbox`]): private, unpublished, set up with
/// no system call.
pub fn init_dormant() {
    let region = private_region();
    // SAFETY: a zeroed region no other thread sees yet.
    unsafe { set_up_region(region, 0, DEFAULT_INTERVAL, 1) };
    make_current(region, false);
}

/// The library's static region (its own memory, private to the process), zeroed.
fn private_region() -> *mut Region {
    static PRIVATE: StaticRegion =
        StaticRegion(core::cell::UnsafeCell::new(core::mem::MaybeUninit::zeroed()));
    let region = PRIVATE.0.get();
    // SAFETY: the static's bytes, zeroed (a forked child's copy is its own); no other
    // thread counts in it while it is being (re)set (set-up, or a child's fork handler).
    unsafe { core::ptr::write_bytes(region, 0, 1) };
    region.cast()
}

/// The set-up (after an exec, or in a forked child), in the region: its time, this
/// process's name, and no maps yet (they are read at its first sampled call, see
/// [`maps_at_first_sample`]).
fn note_set_up() {
    let region = current();
    region.clear_maps();
    MAPS_TAKEN.store(false, Ordering::Release);
    note_comm();
    region
        .set_up_ns
        .store(crate::monotonic_ns(), Ordering::Release);
}

/// Whether this process's maps were read since its set-up.
static MAPS_TAKEN: AtomicBool = AtomicBool::new(false);

/// At a sampled call: reads the maps into the region if no call has since the set-up
/// (one thread does; a sample of another meanwhile goes without, as before the set-up's
/// copy existed), unless the process must make no system call of ours.
pub fn maps_at_first_sample() {
    if MAPS_TAKEN.load(Ordering::Relaxed) || crate::sandbox::quiet() {
        return;
    }
    if MAPS_TAKEN
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        snapshot_maps();
    }
}

/// Writes this process's name into the region (the name after its exec: a process gone
/// before allocscope read it is named by it, not by its parent's).
fn note_comm() {
    let mut comm = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into the array.
    unsafe { libc::prctl(libc::PR_GET_NAME, comm.as_mut_ptr()) };
    current().set_comm(&comm);
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

/// Finds where the family table would be: [`FAMILY_FILE`] beside the path this library
/// was loaded from (`dladdr` of one of its symbols: the name the loader opened, from
/// `LD_PRELOAD`). Runs once, while resolving.
fn find_family_path() {
    // SAFETY: all-zero is a valid Dl_info.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    let address = (&raw const allocscope_preload_region).cast::<libc::c_void>();
    // SAFETY: dladdr fills the struct we own; the name it points to lives as long as the
    // library is loaded.
    if unsafe { libc::dladdr(address, &mut info) } == 0 || info.dli_fname.is_null() {
        return;
    }
    // SAFETY: a NUL-terminated string owned by the loader.
    let own = unsafe { core::ffi::CStr::from_ptr(info.dli_fname) }.to_bytes();
    let Some(slash) = own.iter().rposition(|&b| b == b'/') else {
        return;
    };
    let name = FAMILY_FILE.to_bytes_with_nul();
    let len = slash + 1 + name.len();
    if own[0] != b'/' || len > FAMILY_PATH_BYTES {
        return;
    }
    // SAFETY: the one writer, before FAMILY_PATH_SET.
    let path = unsafe { &mut *FAMILY_PATH.0.get() };
    path[..=slash].copy_from_slice(&own[..=slash]);
    path[slash + 1..len].copy_from_slice(name);
    FAMILY_PATH_SET.store(true, Ordering::Release);
}

/// Opens the family table for as long as it takes to map a part of it: only a regular
/// file of the table's size, owned by root and open to nobody else, is taken (reading past
/// the end of a shorter one would raise SIGBUS; another user's file is not ours to count
/// in). The caller closes the descriptor.
pub fn open_family() -> Option<i32> {
    if !FAMILY_PATH_SET.load(Ordering::Acquire) {
        return None;
    }
    // SAFETY: set once before the flag, never written again; NUL-terminated.
    let path = unsafe { &*FAMILY_PATH.0.get() };
    // SAFETY: open with a NUL-terminated path; never through a symlink at the end.
    let fd = unsafe {
        libc::open(
            path.as_ptr().cast(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: all-zero is a valid `stat`.
    let mut stat: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fstat fills the struct we own.
    let statted = unsafe { libc::fstat(fd, &mut stat) } == 0;
    let trusted = statted
        && stat.st_mode & libc::S_IFMT == libc::S_IFREG
        && stat.st_uid == 0
        && stat.st_mode & 0o077 == 0
        && stat.st_size == family_bytes() as libc::off_t;
    if !trusted {
        // SAFETY: closing what we opened.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

/// The family table beside the library, its header mapped, and its descriptor (for the
/// caller to map a slot, then close).
fn family() -> Option<(*mut FamilyHeader, i32)> {
    let fd = open_family()?;
    let mapped = map_shared(fd, 0, family_header_bytes());
    let family = mapped.cast::<FamilyHeader>();
    // SAFETY: a mapping of the header's bytes (checked before it is read).
    let ok = mapped != libc::MAP_FAILED
        && unsafe { (*family).magic == FAMILY_MAGIC && (*family).version == FAMILY_VERSION };
    if !ok {
        if mapped != libc::MAP_FAILED {
            // SAFETY: unmapping what we just mapped.
            unsafe { libc::munmap(mapped, family_header_bytes()) };
        }
        // SAFETY: closing what we opened.
        unsafe { libc::close(fd) };
        return None;
    }
    Some((family, fd))
}

/// Maps slot `slot`'s region of the family table `fd`.
fn map_slot(fd: i32, slot: usize) -> Option<*mut Region> {
    let mapped = map_shared(fd, family_region_offset(slot), region_bytes());
    (mapped != libc::MAP_FAILED).then(|| mapped.cast())
}

/// Gives the family table's bytes `offset..offset + len` storage before they are written
/// through a mapping: the table is a sparse file, and a write into a hole of a file system
/// that is full (a small `/run`, a disk) raised SIGBUS in the program, where a refused
/// `fallocate` only leaves those bytes unused. Bytes that have it already keep it.
pub fn back(fd: i32, offset: usize, len: usize) -> bool {
    // SAFETY: fallocate on our own descriptor, in the file's size. KEEP_SIZE: the size
    // never changes, so the program's `RLIMIT_FSIZE` is never checked (exceeding it would
    // raise SIGXFSZ in the program).
    unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        ) == 0
    }
}

/// Claims a free slot of `family` for this process, maps its region (all zeros: never
/// used, or given back zeroed) and sets it up at the table's interval (or `interval`, when
/// not 0). `None` when the table is full or its file system has no room for the region
/// (counted), or the region cannot be mapped (the slot is given back).
fn claim_slot(family: *mut FamilyHeader, fd: i32, interval: u64) -> Option<*mut Region> {
    // SAFETY: a checked header mapping, never unmapped; its fields are atomics.
    let family = unsafe { &*family };
    let sequence = family.sequence.fetch_add(1, Ordering::AcqRel) + 1;
    let pid = pid();
    let Some(slot) = take_slot(&family.claims, sequence, pid) else {
        family.full.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    if !back(fd, family_region_offset(slot), region_bytes()) {
        family.claims[slot].store(0, Ordering::Release);
        family.full.fetch_add(1, Ordering::Relaxed);
        return None;
    }
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
    let region = map_new().unwrap_or_else(private_region);
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
/// Read at random: where the table is a file on a disk (`/run` is not a tmpfs on every
/// machine), the first touch of a page not in memory would otherwise have the kernel read
/// around it, zero-filling up to the disk's read-ahead window (8 MiB here;
/// docs/performance.md, "Many short processes: builds and scripts") of the
/// table's holes in this process.
fn map_shared(fd: i32, offset: usize, len: usize) -> *mut libc::c_void {
    // SAFETY: a new mapping of the descriptor's pages; nothing existing is replaced.
    let mapped = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            offset as libc::off_t,
        )
    };
    if mapped != libc::MAP_FAILED {
        // SAFETY: advice on the mapping just made; a refusal changes nothing.
        unsafe { libc::madvise(mapped, len, libc::MADV_RANDOM) };
    }
    mapped
}

/// In a forked child: a region of its own, with the parent's interval: a slot of the
/// family table when the process has one, else a new memfd.
pub fn after_fork() {
    if crate::sandbox::quiet() {
        // No system call may be made: a private region, counted in but not published (its
        // samples still reach the probes; its exact counts are not read).
        let interval = current().interval.load(Ordering::Relaxed);
        let region = private_region();
        // SAFETY: a zeroed region no other thread sees.
        unsafe { set_up_region(region, 0, interval.max(1), 1) };
        make_current(region, false);
        crate::sandbox::mark_private_child();
        return;
    }
    let parent = current();
    let interval = parent.interval.load(Ordering::Relaxed);
    let generation = parent.generation.load(Ordering::Relaxed).max(1);
    // The patched code is the child's too (see `patch`): said in its region as in its
    // parent's.
    let patched = parent.patched.load(Ordering::Relaxed);
    let family = FAMILY.load(Ordering::Acquire);
    if !family.is_null() && in_family_namespace() && !same_pid_namespace(family) {
        // Forked into a new pid namespace (`unshare --pid --fork`): its pid is not ours.
        FOREIGN.store(true, Ordering::Release);
    }
    let claimed = if family.is_null() || !in_family_namespace() {
        None
    } else {
        open_family().and_then(|fd| {
            let claimed = claim_slot(family, fd, interval);
            // SAFETY: closing what open_family opened (the mapping stays).
            unsafe { libc::close(fd) };
            claimed
        })
    };
    let region = claimed.unwrap_or_else(|| create(DEFAULT_INTERVAL, interval));
    // SAFETY: the new region, not yet visible to anyone but allocscope (which only reads
    // the generation).
    unsafe {
        (*region).generation.store(generation, Ordering::Release);
        (*region).patched.store(patched, Ordering::Relaxed);
    };
    make_current(region, true);
    note_set_up();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_links_inode_is_read_or_refused() {
        assert_eq!(namespace_inode(b"pid:[4026531836]"), Some(4026531836));
        assert_eq!(namespace_inode(b"pid:[]"), None);
        assert_eq!(namespace_inode(b"net:[4026531836]"), None);
        assert_eq!(namespace_inode(b"pid:[4026531836"), None);
        // What the kernel says here is what allocscope compares with (the link's inode).
        let link = std::fs::read_link("/proc/self/ns/pid").unwrap();
        let inode =
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata("/proc/self/ns/pid").unwrap());
        assert_eq!(
            namespace_inode(link.as_os_str().as_encoded_bytes()),
            Some(inode)
        );
    }

    #[test]
    fn numbers_parse_or_are_refused() {
        assert_eq!(parse_u64(b"524288"), Some(524288));
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"12k"), None);
        assert_eq!(parse_u64(b"99999999999999999999999"), None);
    }
}
