//! The in-process front end from allocscope's side (see `sampler-preload` and
//! [`sampler_common::preload`]): the library embedded in this binary and handed to the
//! commands allocscope starts, and the processes' shared counter regions, mapped here to
//! read the exact counts and to set the interval.
//!
//! The library reaches a command by a path in a root-owned directory ([`place`]:
//! `LD_PRELOAD=/run/allocscope/rec-…/libsampler_preload.so`, no descriptor, no other
//! variable), its bytes compared with these before use. The command's tree counts in a
//! family table ([`FamilyTable`]) in a file beside it, created and mapped here before the
//! command runs, so every process's counts and maps are read whole however soon it exits;
//! a slot goes back once its process is gone and read. A process that carries the library
//! otherwise (one started by hand, or that found the table full) has a region of its own,
//! found through the exported [`REGION_SYMBOL`] and mapped through `/proc/PID/map_files`.

use std::{
    fs::File,
    io::{self, Read as _},
    path::Path,
    sync::atomic::Ordering,
};

use anyhow::{bail, Context as _};
use object::{Object as _, ObjectSymbol as _};
use sampler_common::{
    geometric,
    preload::{
        claim, family_bytes, family_header_bytes, family_region_offset, find_claim, region_bytes,
        set_up_region, take_slot, FamilyHeader as Header, Region, DORMANT_PRODUCER,
        DORMANT_SANDBOXED, DORMANT_SYMBOL, FAMILY_MAGIC, FAMILY_SLOTS, FAMILY_VERSION,
        REGION_MAGIC, REGION_SYMBOL, REGION_VERSION,
    },
};

use crate::sys::maps;

mod early_read;
pub mod place;
pub(crate) use early_read::{EarlyCopy, EarlyRecords};

/// The library, built by build.rs.
static LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libsampler_preload.so"));

/// The library's bytes (what [`Library::create`] places).
pub fn library_bytes() -> &'static [u8] {
    LIBRARY
}

/// The library, placed for one recording (see [`place`]).
#[derive(Debug)]
pub struct Library {
    dir: place::RecordingDir,
}

impl Library {
    /// Places the library under [`place::ROOT`] for a new recording.
    pub fn create() -> anyhow::Result<Library> {
        Ok(Library {
            dir: place::place(Path::new(place::ROOT), LIBRARY)?,
        })
    }

    /// The path the command's `LD_PRELOAD` names, and allocscope opens it by.
    pub fn path(&self) -> std::path::PathBuf {
        self.dir.library()
    }

    /// The file's identity, as the processes that map it show it.
    pub fn file_id(&self) -> io::Result<maps::FileId> {
        Ok(maps::FileId::of(&std::fs::metadata(self.path())?))
    }

    /// A new family table beside the library, at `interval`.
    pub fn create_family(&self, interval: u64) -> anyhow::Result<FamilyTable> {
        FamilyTable::create(&self.dir, interval)
    }
}

/// `LD_PRELOAD` for a child: the library first (it must come before any allocator
/// preloaded after it, which it then forwards to), then what the user had.
pub fn ld_preload(library: &Library, existing: Option<&std::ffi::OsStr>) -> std::ffi::OsString {
    let mut value = std::ffi::OsString::from(library.path());
    if let Some(existing) = existing.filter(|e| !e.is_empty()) {
        value.push(" ");
        value.push(existing);
    }
    value
}

/// The family table of a command's tree (see [`sampler_common::preload::FamilyHeader`]): its
/// memfd, its header mapped here, and the slots whose regions were handed out.
pub struct FamilyTable {
    file: File,
    header: memmap2::MmapMut,
    /// Its regions, mapped whole once (sparse): a region is a view of it, not a mapping
    /// of its own (a short process cost an `mmap` and a `munmap`, whose TLB shootdown
    /// reaches every CPU, and as many again to give its slot back).
    regions: std::sync::Arc<memmap2::MmapRaw>,
    /// Its path (removed when the recording ends: processes that map it keep it).
    path: std::path::PathBuf,
}

/// Gives `file`'s bytes `offset..offset + len` storage before anyone writes them through a
/// mapping. The family table is a sparse file; a write into one of its holes on a file
/// system that is full (a small `/run` tmpfs, a disk) raises SIGBUS in the writer: every
/// process of the command died of it, where a refused `fallocate` only leaves a slot
/// unused (the library backs the slots it claims itself the same way).
fn back(file: &File, offset: usize, len: usize) -> io::Result<()> {
    let (offset, len) = (offset as libc::off_t, len as libc::off_t);
    // SAFETY: fallocate on our own open file, its size kept (no RLIMIT_FSIZE check).
    match unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(file),
            libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

impl Drop for FamilyTable {
    /// The file goes when the recording ends: a program exec'd later counts in a region
    /// of its own (the processes still mapping the table keep it).
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl std::fmt::Debug for FamilyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FamilyTable").finish_non_exhaustive()
    }
}

impl FamilyTable {
    /// A new table at `interval` in `dir`. Sparse: a region's pages exist once its
    /// process counts.
    fn create(dir: &place::RecordingDir, interval: u64) -> anyhow::Result<FamilyTable> {
        let (file, path) = dir.create_family().context("creating the family table")?;
        file.set_len(family_bytes() as u64)?;
        back(&file, 0, family_header_bytes())
            .context("giving the family table's header storage")?;
        // SAFETY: a shared mapping of our own file's header, sized above.
        let mut header = unsafe {
            memmap2::MmapOptions::new()
                .len(family_header_bytes())
                .map_mut(&file)
        }?;
        // Touched at random (see `sampler-preload`'s `map_shared`): where /run is on a disk,
        // the first write below had the kernel zero-fill 8 MiB of the table's holes around
        // it, at every recording's start (docs/performance.md, "Many short processes:
        // builds and scripts").
        header.advise(memmap2::Advice::Random)?;
        let namespace = std::os::unix::fs::MetadataExt::ino(
            &crate::sys::own::pid_namespace().context("reading our pid namespace")?,
        );
        let fresh = header.as_mut_ptr().cast::<Header>();
        // SAFETY: a new, zeroed, page-aligned mapping of family_header_bytes(), no other
        // process maps it yet: its fixed fields are written once, through the type.
        unsafe {
            (&raw mut (*fresh).magic).write(FAMILY_MAGIC);
            (&raw mut (*fresh).version).write(FAMILY_VERSION);
            (&raw mut (*fresh).pid_namespace).write(namespace);
        }
        let regions = memmap2::MmapOptions::new()
            .offset(family_region_offset(0) as u64)
            .len(FAMILY_SLOTS * region_bytes())
            .map_raw(&file)?;
        regions.advise(memmap2::Advice::Random)?;
        let regions = std::sync::Arc::new(regions);
        let family = FamilyTable {
            file,
            header,
            regions,
            path,
        };
        family.set_interval(interval)?;
        Ok(family)
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is family_header_bytes() long and page-aligned, and holds a
        // header (written at creation); its changing fields are atomics.
        unsafe { &*self.header.as_ptr().cast::<Header>() }
    }

    /// Sets the interval regions claimed from now on start with.
    pub fn set_interval(&self, interval: u64) -> anyhow::Result<()> {
        let scale = geometric::scale_q32(interval)
            .with_context(|| format!("sampling interval {interval} is out of range"))?;
        self.header().scale_q32.store(scale, Ordering::Release);
        self.header().interval.store(interval, Ordering::Release);
        Ok(())
    }

    /// Writes the patch plan for the command's executable (see [`crate::probe::patch`]),
    /// before the command starts: its processes that run that executable patch it.
    pub fn write_patches(&mut self, plan: &sampler_common::patch::PatchPlan) -> anyhow::Result<()> {
        use std::os::unix::fs::FileExt as _;
        let offset = sampler_common::preload::family_patches_offset();
        // SAFETY: PatchPlan is plain data (integers and byte arrays, repr(C), no padding
        // read by anyone as anything but bytes): its bytes are what the library maps.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (plan as *const sampler_common::patch::PatchPlan).cast::<u8>(),
                std::mem::size_of_val(plan),
            )
        };
        self.file
            .write_all_at(bytes, offset as u64)
            .context("writing the patch plan into the family table")?;
        let header = self.header.as_mut_ptr().cast::<Header>();
        // SAFETY: the header mapping; no process maps the table before the command starts,
        // and the library reads `patches` once, after its exec.
        unsafe { (&raw mut (*header).patches).write_volatile(plan.count) };
        Ok(())
    }

    /// Processes that found the table full (each counts in a region of its own).
    pub fn full(&self) -> u64 {
        self.header().full.load(Ordering::Relaxed)
    }

    fn map_slot(&self, slot: usize) -> anyhow::Result<Backing> {
        anyhow::ensure!(
            slot < FAMILY_SLOTS,
            "slot {slot} is not in the family table"
        );
        Ok(Backing::Slot(self.regions.clone(), slot * region_bytes()))
    }

    /// Claims a slot for the command about to run as `pid` (paused before its exec), at
    /// the table's interval: the library finds it by its pid.
    pub fn claim_for(&self, pid: u32) -> anyhow::Result<MappedRegion> {
        let header = self.header();
        let sequence = header.sequence.fetch_add(1, Ordering::AcqRel) + 1;
        let slot = take_slot(&header.claims, sequence, pid).context("the family table is full")?;
        if let Err(e) = back(&self.file, family_region_offset(slot), region_bytes()) {
            header.claims[slot].store(0, Ordering::Release);
            return Err(e).context(format!("giving the family table's slot {slot} storage"));
        }
        let map = self.map_slot(slot)?;
        let interval = header.interval.load(Ordering::Acquire);
        // SAFETY: the slot's region, zero and unused (just claimed, its process not started),
        // and as long as a Region (the view is region_bytes() long).
        unsafe { set_up_region(map.as_ptr().cast_mut().cast(), pid, interval, 1) };
        let mut mapped = MappedRegion::check(map)?;
        mapped.slot = Some(slot);
        header.claims[slot].store(claim(sequence, pid, true), Ordering::Release);
        Ok(mapped)
    }

    /// The region process `pid` counts in, if it claimed one: mapped, counting from its
    /// fork (or its start).
    pub fn region_of(&self, pid: u32) -> Option<anyhow::Result<MappedRegion>> {
        let slot = find_claim(&self.header().claims, pid)?;
        Some(self.map_slot(slot).and_then(|map| {
            let mut mapped = MappedRegion::check(map)?;
            if mapped.region().pid != u64::from(pid) {
                bail!("slot {slot} of the family table is not pid {pid}'s");
            }
            mapped.slot = Some(slot);
            Ok(mapped)
        }))
    }

    /// Gives slot `slot` back: its region is zeroed (reading as zeros for the next
    /// process) but for its maps' bytes, which the next process's [`Region::maps_len`]
    /// (zeroed) says are not there; then the slot is free. Only once its process is gone
    /// and its counts read.
    ///
    /// Zeroed, not dropped (a hole punched): where the table is not in memory (`/run` on
    /// a disk, as in many containers) the next process's first write to a dropped page
    /// allocated it on the disk again, at its start (docs/performance.md, "Many short
    /// processes: builds and scripts"); a zeroed page stays. Only the
    /// pages written are zeroed (allocscope has read them all already, for the counts).
    ///
    /// [`Region::maps_len`]: sampler_common::preload::Region::maps_len
    pub fn release(&self, slot: usize) {
        use sampler_common::preload::{Region, MAPS_BYTES};
        let maps = std::mem::offset_of!(Region, maps);
        match self.map_slot(slot) {
            Ok(map) => {
                // SAFETY: the slot's region_bytes(), whose process is gone and whose claim
                // is still held: nothing else writes it meanwhile.
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(map.as_ptr().cast_mut(), region_bytes())
                };
                let (counts, rest) = bytes.split_at_mut(maps);
                zero_written(counts);
                zero_written(&mut rest[MAPS_BYTES..]);
                self.header().claims[slot].store(0, Ordering::Release);
            }
            // Not zeroed: never handed out again (the table has one slot fewer).
            Err(e) => log::debug!("family table slot {slot}: not given back ({e:#})"),
        }
    }

    /// The slots claimed by processes for which `gone` says yes, with their claim words
    /// (a claim not ready yet is a process that died while claiming).
    pub fn claims_of_gone(&self, gone: impl Fn(u32) -> bool) -> Vec<(usize, u64)> {
        (0..FAMILY_SLOTS)
            .filter_map(|slot| {
                let word = self.header().claims[slot].load(Ordering::Acquire);
                let pid = sampler_common::preload::claim_pid(word);
                (word != 0 && gone(pid)).then_some((slot, word))
            })
            .collect()
    }

    /// Whether slot `slot` still holds claim `word` (only allocscope frees a slot, so a
    /// claim seen twice is the same process's).
    pub fn holds(&self, slot: usize, word: u64) -> bool {
        self.header().claims[slot].load(Ordering::Acquire) == word
    }
}

/// Zeroes the pages of `bytes` that hold anything: a page the process never wrote (most of
/// its thread slots) stays untouched, not allocated on a disk by a write of zeros.
fn zero_written(bytes: &mut [u8]) {
    for page in bytes.chunks_mut(4096) {
        if !all_zero(page) {
            page.fill(0);
        }
    }
}

/// Whether every byte of `bytes` is 0, read a word at a time: a byte-wise `any` (which
/// stops at the first non-zero byte, so is not vectorized) was slow on each of a shell
/// loop's ~1,200 slots given back (docs/performance.md, "Many short processes: builds and
/// scripts").
fn all_zero(bytes: &[u8]) -> bool {
    // SAFETY: any bytes are valid u64s; align_to splits off what is not aligned.
    let (head, words, tail) = unsafe { bytes.align_to::<u64>() };
    head.iter().chain(tail).all(|&byte| byte == 0) && words.iter().fold(0, |or, &w| or | w) == 0
}

/// Where a region is mapped here: its slot of the family table, or a mapping of its own
/// (a process's own region, found in its maps).
enum Backing {
    Slot(std::sync::Arc<memmap2::MmapRaw>, usize),
    Own(memmap2::MmapMut),
}

impl Backing {
    /// Its first byte (region_bytes() follow).
    fn as_ptr(&self) -> *const u8 {
        match self {
            // SAFETY: the offset of a slot within the table's mapping (map_slot checks).
            Backing::Slot(table, offset) => unsafe { table.as_ptr().add(*offset) },
            Backing::Own(map) => map.as_ptr(),
        }
    }
}

/// A process's counter region, mapped here (it stays readable after the process exits).
pub struct MappedRegion {
    map: Backing,
    /// Its slot in the family table, if it is one (given back once its process is gone).
    slot: Option<usize>,
    /// Counts at attach (zero for a command we started): what came before is not ours.
    baseline: (u64, u64),
    /// What [`Self::counts`] last read (kept where the region was zeroed since).
    last: std::sync::Mutex<(u64, u64)>,
    /// When the maps last handed out by [`Self::new_maps`] were read (0: none yet).
    maps_offered_ns: u64,
}

impl std::fmt::Debug for MappedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedRegion")
            .field("baseline", &self.baseline)
            .finish_non_exhaustive()
    }
}

impl MappedRegion {
    fn region(&self) -> &Region {
        // SAFETY: the mapping is region_bytes() long, page-aligned, and holds a Region
        // (checked at creation); its fields are atomics or written once before we map it.
        unsafe { &*self.map.as_ptr().cast::<Region>() }
    }

    /// How many entry points of an allocator linked into its executable the library
    /// patched, and why it patched none (or not all) if it did not.
    pub fn patched(&self) -> (u64, Option<sampler_common::preload::PatchRefusal>) {
        let region = self.region();
        (
            region.patched.load(Ordering::Acquire),
            sampler_common::preload::PatchRefusal::from_u64(
                region.patch_refused.load(Ordering::Acquire),
            ),
        )
    }

    fn check(map: Backing) -> anyhow::Result<MappedRegion> {
        let mapped = MappedRegion {
            map,
            slot: None,
            baseline: (0, 0),
            last: std::sync::Mutex::new((0, 0)),
            maps_offered_ns: 0,
        };
        let region = mapped.region();
        if region.magic != REGION_MAGIC || region.version != REGION_VERSION {
            bail!(
                "not an allocscope counter region of version {REGION_VERSION} (magic {:#x}, version {})",
                region.magic,
                region.version
            );
        }
        Ok(mapped)
    }

    /// The process's maps as its library read them at set-up (see
    /// [`sampler_common::preload::Region::maps`]) and when, once per reading (an exec
    /// writes them again): for a process gone before its maps could be read from /proc.
    pub(crate) fn new_maps(&mut self) -> Option<(String, u64)> {
        let written_ns = self.region().maps_ns.load(Ordering::Acquire);
        if written_ns <= self.maps_offered_ns {
            return None;
        }
        let mut bytes = vec![0u8; sampler_common::preload::MAPS_BYTES];
        let (len, read_ns) = self.region().maps_into(&mut bytes)?;
        self.maps_offered_ns = read_ns.max(written_ns);
        bytes.truncate(len);
        Some((String::from_utf8_lossy(&bytes).into_owned(), read_ns))
    }

    /// Maps the region of running process `pid`, whose mapped file `library` (at `path`,
    /// through the process's view) is the front end; counts from now on.
    pub fn of_process(pid: u32, library: &Path) -> anyhow::Result<MappedRegion> {
        let vmas = maps::read(pid).with_context(|| format!("reading the maps of pid {pid}"))?;
        let [pointer_at] = symbol_addresses(pid, &vmas, library, [REGION_SYMBOL])?;
        let mut word = [0u8; 8];
        crate::sys::memory::read_at(pid, pointer_at, &mut word)
            .with_context(|| format!("reading {REGION_SYMBOL} in pid {pid}"))?;
        let address = u64::from_ne_bytes(word);
        if address == 0 {
            bail!("pid {pid}: the preload library has not set up its region yet");
        }
        let vma = vmas
            .iter()
            .find(|v| (v.start..v.end).contains(&address))
            .with_context(|| {
                format!("pid {pid}: its counter region at {address:#x} is not mapped")
            })?;
        let path = vma.file_in(pid);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let offset = vma.offset + (address - vma.start);
        // SAFETY: a shared mapping of the region's file at the region's offset; the
        // library writes only atomics there.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(region_bytes())
                .map_mut(&file)
        }
        .with_context(|| format!("mapping {}", path.display()))?;
        let mut mapped = MappedRegion::check(Backing::Own(map))?;
        // The library wrote its pid as its own pid namespace numbers it.
        let own = crate::sys::process::namespace_pid(pid).unwrap_or(pid);
        if mapped.region().pid != u64::from(own) {
            bail!(
                "pid {pid}: its counter region belongs to pid {}",
                mapped.region().pid
            );
        }
        mapped.baseline = mapped.region().totals();
        Ok(mapped)
    }

    /// The process's name as its library wrote it at set-up (after its latest exec).
    pub(crate) fn comm(&self) -> Option<String> {
        let bytes = self.region().comm_bytes();
        let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        (len > 0).then(|| String::from_utf8_lossy(&bytes[..len]).into_owned())
    }

    /// When the library last set up in the process (after its latest exec that carried
    /// it, or its fork), CLOCK_MONOTONIC ns (0: not yet).
    pub fn set_up_ns(&self) -> u64 {
        self.region().set_up_ns.load(Ordering::Acquire)
    }

    /// Counts from now on: for a process the library was loaded into while it ran, whose
    /// calls before its probes are attached would have no samples.
    pub(crate) fn count_from_now(&mut self) {
        self.baseline = self.region().totals();
    }

    /// Its slot in the family table, if it is one.
    pub(crate) fn slot(&self) -> Option<usize> {
        self.slot
    }

    /// Calls and bytes counted since this mapping was made (for a command: since its start).
    /// A region another recording gave back (its process gone, the slot zeroed) while this
    /// one still maps it keeps what was read last: it never counts backwards.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let (calls, bytes) = self.region().totals();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(calls), Some(bytes)) = (
            calls.checked_sub(self.baseline.0),
            bytes.checked_sub(self.baseline.1),
        ) {
            *last = (calls, bytes);
        } else {
            log::debug!(
                "a counter region reads {calls} calls, {bytes} bytes, below its baseline {:?}: \
                 its last reading kept",
                self.baseline
            );
        }
        *last
    }

    /// Sets the mean interval of countdowns drawn from now on (each thread redraws at its
    /// next call: legal, the choice does not depend on the countdown).
    pub fn set_interval(&self, interval: u64) -> anyhow::Result<()> {
        let scale = geometric::scale_q32(interval)
            .with_context(|| format!("sampling interval {interval} is out of range"))?;
        let region = self.region();
        if region.interval.load(Ordering::Acquire) == interval
            && region.generation.load(Ordering::Acquire) != 0
        {
            return Ok(());
        }
        region.interval.store(interval, Ordering::Release);
        region.scale_q32.store(scale, Ordering::Release);
        region.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

/// Whether the library mapped in `pid` from `library` is or will be dormant there: it
/// says so ([`DORMANT_SANDBOXED`], [`DORMANT_PRODUCER`]), or it has not set up yet (no
/// region published, and not a sandboxed process's child), which under a seccomp filter
/// or beside another producer's file (the caller's to check) means it will be. False when its memory cannot be read.
pub(crate) fn dormant(pid: u32, vmas: &[maps::Vma], library: &Path) -> bool {
    let Ok([flag_at, region_at]) =
        symbol_addresses(pid, vmas, library, [DORMANT_SYMBOL, REGION_SYMBOL])
    else {
        return false;
    };
    let (mut flag, mut region) = ([0u8; 4], [0u8; 8]);
    if crate::sys::memory::read_at(pid, flag_at, &mut flag).is_err()
        || crate::sys::memory::read_at(pid, region_at, &mut region).is_err()
    {
        return false;
    }
    match u32::from_ne_bytes(flag) {
        DORMANT_SANDBOXED | DORMANT_PRODUCER => true,
        0 => u64::from_ne_bytes(region) == 0,
        _ => false,
    }
}

/// The process addresses of `names`, defined by the file mapped at `library` in `pid`
/// (the file read and parsed once).
pub(crate) fn symbol_addresses<const N: usize>(
    pid: u32,
    vmas: &[maps::Vma],
    library: &Path,
    names: [&str; N],
) -> anyhow::Result<[u64; N]> {
    let mut data = Vec::new();
    File::open(library)
        .and_then(|mut f| f.read_to_end(&mut data))
        .with_context(|| format!("reading {}", library.display()))?;
    let file =
        object::File::parse(&*data).with_context(|| format!("parsing {}", library.display()))?;
    let segments = maps::loadable_segments(&file);
    let id = maps::FileId::of(&std::fs::metadata(library)?);
    let bias = vmas
        .iter()
        .filter(|v| v.file_id == id)
        .find_map(|v| maps::load_bias(&segments, v.start, v.offset))
        .with_context(|| format!("pid {pid} does not map {}", library.display()))?;
    let mut addresses = [0; N];
    for (address, name) in addresses.iter_mut().zip(names) {
        let value = file
            .dynamic_symbols()
            .find(|s| s.name() == Ok(name))
            .map(|s| s.address())
            .with_context(|| format!("{name} missing from {}", library.display()))?;
        *address = bias.wrapping_add(value);
    }
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_pages_that_hold_a_byte_are_zeroed_wherever_the_byte_is() {
        // Unaligned on purpose: a byte in the part before the first whole word counts too.
        let mut buffer = vec![0u8; 3 * 4096 + 9];
        for at in [1, 4096 + 2048, 2 * 4096 + 4095, 3 * 4096 + 8] {
            let bytes = &mut buffer[1..];
            bytes[at - 1] = 7;
            assert!(!super::all_zero(bytes));
            super::zero_written(bytes);
            assert!(super::all_zero(bytes), "a byte at {} left", at - 1);
        }
        assert!(super::all_zero(&[]));
    }

    use object::{
        elf::{FileHeader64, DT_NEEDED},
        read::elf::{Dyn as _, FileHeader as _},
        Endianness,
    };

    /// The shared libraries the embedded library makes every process load.
    fn needed() -> Vec<String> {
        // A copy: the parser wants the headers aligned, `include_bytes!` does not align.
        let data = super::LIBRARY.to_vec();
        let header = FileHeader64::<Endianness>::parse(&*data).unwrap();
        let endian = header.endian().unwrap();
        let sections = header.sections(endian, &*data).unwrap();
        let (dynamic, index) = sections.dynamic(endian, &*data).unwrap().unwrap();
        let strings = sections.strings(endian, &*data, index).unwrap();
        dynamic
            .iter()
            .filter(|d| d.d_tag(endian) == u64::from(DT_NEEDED))
            .map(|d| {
                let name = strings.get(d.d_val(endian) as u32).unwrap();
                String::from_utf8_lossy(name).into_owned()
            })
            .collect()
    }

    /// The names the embedded library leaves for other files to define.
    fn undefined() -> Vec<String> {
        use object::{Object as _, ObjectSymbol as _};
        let data = super::LIBRARY.to_vec();
        let file = object::File::parse(&*data).unwrap();
        file.dynamic_symbols()
            .filter(|s| s.is_undefined())
            .filter_map(|s| s.name().ok().map(str::to_owned))
            .collect()
    }

    #[test]
    fn the_library_is_built_without_the_standard_library() {
        // std's panic machinery was four fifths of its code (build.rs): paged in by every
        // process it is loaded into. Without std nothing needs an unwinder, and the
        // personality routine `core` names is the library's own, hidden.
        assert!(
            super::LIBRARY.len() < 160 * 1024,
            "{} bytes",
            super::LIBRARY.len()
        );
        let undefined = undefined();
        assert!(undefined
            .iter()
            .any(|n| n == "malloc_usable_size" || n == "dlsym"));
        assert!(
            !undefined
                .iter()
                .any(|n| n.starts_with("_Unwind_") || n.starts_with("rust_")),
            "{undefined:?}"
        );
    }

    #[test]
    fn the_library_loads_nothing_beyond_the_c_library() {
        // No libgcc_s.so.1 (no unwinder needed): it would cost every short process its
        // loading and its constructor.
        let needed = needed();
        assert!(needed.iter().any(|n| n == "libc.so.6"), "{needed:?}");
        assert!(
            needed
                .iter()
                .all(|n| n == "libc.so.6" || n.starts_with("ld-linux")),
            "{needed:?}"
        );
    }
}
