//! The in-process front end from allocscope's side (see `sampler-preload` and
//! [`sampler_common::preload`]): the library embedded in this binary and handed to the
//! commands allocscope starts, and the processes' shared counter regions, mapped here to
//! read the exact counts and to set the interval.
//!
//! The library reaches a command as a sealed memfd (`LD_PRELOAD=/proc/self/fd/N`, the
//! descriptor inherited without close-on-exec): no file is written anywhere, and nobody can
//! change it after it is checked. Its region is created here too, mapped before the
//! command runs, so its counts are read whole even after it exits; the library finds it
//! by `ALLOCSCOPE_REGION_FD`. A process that carries the library otherwise (its own
//! children, or one started by hand) has a region of its own, found through the exported
//! [`REGION_SYMBOL`] and mapped through `/proc/PID/map_files`.

use std::{
    fs::File,
    io::{self, Read as _, Write as _},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::fs::FileExt as _,
    },
    path::Path,
    sync::atomic::Ordering,
};

use anyhow::{bail, Context as _};
use object::{Object as _, ObjectSymbol as _};
use sampler_common::{
    geometric,
    preload::{Region, REGION_MAGIC, REGION_SYMBOL, REGION_VERSION},
};

use crate::probe::maps;

/// The library, built by build.rs.
static LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libsampler_preload.so"));

/// The library in a sealed memfd, inherited by the commands started after it.
#[derive(Debug)]
pub struct Library {
    fd: OwnedFd,
}

fn memfd(name: &std::ffi::CStr, flags: libc::c_uint) -> io::Result<File> {
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor is ours.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

impl Library {
    /// Writes the library into a memfd and seals it (inherited across exec: no
    /// close-on-exec).
    pub fn create() -> io::Result<Library> {
        let mut file = memfd(c"allocscope-preload", libc::MFD_ALLOW_SEALING)?;
        file.write_all(LIBRARY)?;
        let seals =
            libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
        // SAFETY: fcntl on our own descriptor.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Library { fd: file.into() })
    }

    /// The path a child process loads it by (its own inherited descriptor).
    pub fn preload_path(&self) -> String {
        format!("/proc/self/fd/{}", self.fd.as_raw_fd())
    }

    /// Where allocscope itself opens it (to attach the probes before the command runs).
    pub fn own_path(&self) -> std::path::PathBuf {
        format!("/proc/{}/fd/{}", std::process::id(), self.fd.as_raw_fd()).into()
    }

    /// The file's identity, as the processes that map it show it.
    pub fn file_id(&self) -> io::Result<maps::FileId> {
        Ok(maps::FileId::of(&std::fs::metadata(self.own_path())?))
    }
}

/// `LD_PRELOAD` for a child: the library first (it must come before any allocator
/// preloaded after it, which it then forwards to), then what the user had.
pub fn ld_preload(library: &Library, existing: Option<&std::ffi::OsStr>) -> std::ffi::OsString {
    let mut value = std::ffi::OsString::from(library.preload_path());
    if let Some(existing) = existing.filter(|e| !e.is_empty()) {
        value.push(" ");
        value.push(existing);
    }
    value
}

/// Bytes of a region mapping (whole pages).
fn region_bytes() -> usize {
    std::mem::size_of::<Region>().next_multiple_of(maps::PAGE_SIZE as usize)
}

/// A process's counter region, mapped here (it stays readable after the process exits).
pub struct MappedRegion {
    map: memmap2::MmapMut,
    /// Counts at attach (zero for a command we started): what came before is not ours.
    baseline: (u64, u64),
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

    fn check(map: memmap2::MmapMut) -> anyhow::Result<MappedRegion> {
        let mapped = MappedRegion {
            map,
            baseline: (0, 0),
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

    /// A new region for a command about to start, at `interval`, and the descriptor the
    /// command inherits (no close-on-exec) to find it.
    pub fn for_command(interval: u64) -> anyhow::Result<(MappedRegion, OwnedFd)> {
        let file = memfd(c"allocscope-counters", 0)?;
        file.set_len(region_bytes() as u64)?;
        // SAFETY: a shared mapping of our own memfd, sized above.
        let mut map = unsafe {
            memmap2::MmapOptions::new()
                .len(region_bytes())
                .map_mut(&file)
        }?;
        map[..8].copy_from_slice(&REGION_MAGIC.to_ne_bytes());
        map[8..16].copy_from_slice(&REGION_VERSION.to_ne_bytes());
        let mapped = MappedRegion::check(map)?;
        mapped.set_interval(interval)?;
        Ok((mapped, file.into()))
    }

    /// The process's maps as its library read them at set-up (see
    /// [`sampler_common::preload::Region::maps`]) and when, once per reading (an exec
    /// writes them again): for a process gone before its maps could be read from /proc.
    pub fn new_maps(&mut self) -> Option<(String, u64)> {
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

    /// Names the process the region is for (the library refuses a region that is not its
    /// process's: a descriptor leaked to another program). Before the command runs.
    pub fn set_pid(&mut self, pid: u32) {
        self.map[16..24].copy_from_slice(&u64::from(pid).to_ne_bytes());
    }

    /// Maps the region of running process `pid`, whose mapped file `library` (at `path`,
    /// through the process's view) is the front end; counts from now on.
    pub fn of_process(pid: u32, library: &Path) -> anyhow::Result<MappedRegion> {
        let vmas = maps::read(pid).with_context(|| format!("reading the maps of pid {pid}"))?;
        let pointer_at = symbol_address(pid, &vmas, library, REGION_SYMBOL)?;
        let mut word = [0u8; 8];
        File::open(format!("/proc/{pid}/mem"))
            .and_then(|mem| mem.read_exact_at(&mut word, pointer_at))
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
        let path = format!("/proc/{pid}/map_files/{:x}-{:x}", vma.start, vma.end);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {path}"))?;
        let offset = vma.offset + (address - vma.start);
        // SAFETY: a shared mapping of the region's file at the region's offset; the
        // library writes only atomics there.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(region_bytes())
                .map_mut(&file)
        }
        .with_context(|| format!("mapping {path}"))?;
        let mut mapped = MappedRegion::check(map)?;
        if mapped.region().pid != u64::from(pid) {
            bail!(
                "pid {pid}: its counter region belongs to pid {}",
                mapped.region().pid
            );
        }
        mapped.baseline = mapped.region().totals();
        Ok(mapped)
    }

    /// Calls and bytes counted since this mapping was made (for a command: since its start).
    pub fn counts(&self) -> (u64, u64) {
        let (calls, bytes) = self.region().totals();
        (
            calls.wrapping_sub(self.baseline.0),
            bytes.wrapping_sub(self.baseline.1),
        )
    }

    /// Sampled blocks the library could not remember (their frees go unseen).
    pub fn untracked(&self) -> u64 {
        self.region().untracked.load(Ordering::Relaxed)
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

/// The process address of `name`, defined by the file mapped at `library` in `pid`.
fn symbol_address(pid: u32, vmas: &[maps::Vma], library: &Path, name: &str) -> anyhow::Result<u64> {
    let mut data = Vec::new();
    File::open(library)
        .and_then(|mut f| f.read_to_end(&mut data))
        .with_context(|| format!("reading {}", library.display()))?;
    let file = object::File::parse(&*data).context("parsing the preload library")?;
    let value = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok(name))
        .map(|s| s.address())
        .with_context(|| format!("{name} missing from the preload library"))?;
    let segments = maps::loadable_segments(&file);
    let id = maps::FileId::of(&std::fs::metadata(library)?);
    let bias = vmas
        .iter()
        .filter(|v| v.file_id == id)
        .find_map(|v| maps::load_bias(&segments, v.start, v.offset))
        .with_context(|| format!("pid {pid} does not map {}", library.display()))?;
    Ok(bias.wrapping_add(value))
}
