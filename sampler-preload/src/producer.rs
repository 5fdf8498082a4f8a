//! Another producer in the process: the library leaves its calls to it.
//!
//! Why: a program whose own allocator samples its blocks and reports them through the
//! OpenTelemetry contract's probes (`otel_memory:alloc`, or libdatadog's `ddheap:alloc`) is
//! recorded through those probes, as allocscope's uprobes record it. When that allocator
//! takes its blocks from `malloc`, this library counted and sampled the same bytes a second
//! time: a producer exec'd by a followed shell was estimated at 468.9 MiB for 409.8 MiB
//! allocated. So at set-up the library looks at the files the loader mapped (the executable
//! and its libraries, before any constructor of theirs ran): where one defines such
//! probes, it stays **dormant** there as under a seccomp filter (forwards every call,
//! counts nothing, fires nothing) and says so in `allocscope_preload_dormant`
//! (`DORMANT_PRODUCER`), which allocscope reads to take that process's
//! numbers from the producer's probes alone.
//!
//! The probes' notes (`.note.stapsdt`) are not loaded into memory: each file's section
//! headers are read, with `open`/`pread`/`close` on the path the loader opened and a
//! stack buffer (this runs inside `malloc`: no allocation). The C and C++ runtimes'
//! own files are not read (they define no such probe), nor is this library (it defines
//! `otel_memory` probes of its own). A producer `dlopen`ed after set-up is not seen
//! (docs/preload.md).

use core::ffi::{c_char, c_int, c_void, CStr};

use sampler_common::preload::PRODUCER_PROVIDERS;

/// Whether a file mapped at set-up defines another producer's allocation probe.
pub fn in_process() -> bool {
    let mut found = false;
    // SAFETY: the callback only reads the entries it is given; `found` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut found as *mut bool).cast()) };
    found
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: the loader passes a valid entry and our `found`.
    let (info, found) = unsafe { (&*info, &mut *data.cast::<bool>()) };
    let name = if info.dlpi_name.is_null() {
        c""
    } else {
        // SAFETY: the loader's NUL-terminated name of the object.
        unsafe { CStr::from_ptr(info.dlpi_name) }
    };
    // The first entry, unnamed, is the executable.
    let path = if name.is_empty() {
        c"/proc/self/exe"
    } else {
        name
    };
    if (!name.is_empty() && !may_produce(name.to_bytes())) || is_this_library(info) {
        return 0;
    }
    *found = defines_producer(path.as_ptr());
    c_int::from(*found)
}

/// Whether `info` is this library (whatever its file is called): its loaded span holds
/// this function.
fn is_this_library(info: &libc::dl_phdr_info) -> bool {
    let here = is_this_library as fn(&libc::dl_phdr_info) -> bool as usize;
    let (low, high) = crate::objects::object_span(info);
    (low..high).contains(&here)
}

/// Whether the object at `path` (as the loader named it) may define a producer's probes:
/// not the kernel's vDSO, the loader, nor the C and C++ runtimes.
fn may_produce(path: &[u8]) -> bool {
    const RUNTIMES: [&[u8]; 9] = [
        b"linux-vdso",
        b"ld-linux",
        b"libc.so",
        b"libm.so",
        b"libpthread.so",
        b"libdl.so",
        b"librt.so",
        b"libstdc++.so",
        b"libgcc_s.so",
    ];
    let file = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    !RUNTIMES.iter().any(|runtime| file.starts_with(runtime))
}

const SHT_NOTE: u32 = 7;
const SHF_ALLOC: u64 = 2;
/// Section headers read at once; a section name table read up to this many bytes.
const CHUNK: usize = 4096;

/// Reads `path`'s section headers and its `.note.stapsdt`; false when anything is amiss.
fn defines_producer(path: *const c_char) -> bool {
    // Non-blocking: a FIFO put at that path since does not hold the program up.
    // SAFETY: a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            path,
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY,
        )
    };
    if fd < 0 {
        return false;
    }
    let found = File(fd).defines_producer().unwrap_or(false);
    // SAFETY: closing what we opened.
    unsafe { libc::close(fd) };
    found
}

struct File(c_int);

impl File {
    /// Fills `buffer` from `offset`; the bytes read.
    fn read(&self, buffer: &mut [u8], offset: u64) -> Option<usize> {
        // SAFETY: reads into a buffer we own, within its length.
        let n = unsafe {
            libc::pread(
                self.0,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                offset as libc::off_t,
            )
        };
        usize::try_from(n).ok()
    }

    fn defines_producer(&self) -> Option<bool> {
        let mut buffer = [0u8; CHUNK];
        let read = self.read(&mut buffer[..64], 0)?;
        let header = Header::parse(&buffer[..read])?;
        let names = header.section(self, &mut buffer, header.names)?;
        let mut name = [0u8; 16];
        let mut index = 0;
        while index < header.count {
            let batch = (header.count - index).min(CHUNK / 64);
            let offset = header.offset + index as u64 * 64;
            let read = self.read(&mut buffer[..batch * 64], offset)?;
            if read < batch * 64 {
                return None;
            }
            for raw in buffer[..read].chunks_exact(64) {
                let section = Section::parse(raw);
                // `.note.stapsdt` is a note that is not loaded.
                if section.kind != SHT_NOTE || section.flags & SHF_ALLOC != 0 {
                    continue;
                }
                let at = names.offset.checked_add(u64::from(section.name))?;
                let got = self.read(&mut name[..14], at)?;
                if &name[..got] != b".note.stapsdt\0" {
                    continue;
                }
                return Some(self.notes_name_producer(&section));
            }
            index += batch;
        }
        Some(false)
    }

    /// Whether the notes of `section` name a producer's `alloc` probe, read a chunk at a
    /// time (a note longer than a chunk ends the search).
    fn notes_name_producer(&self, section: &Section) -> bool {
        let mut buffer = [0u8; CHUNK];
        let mut done = 0u64;
        while done < section.size {
            let want = (section.size - done).min(CHUNK as u64) as usize;
            let Some(read) = self.read(&mut buffer[..want], section.offset + done) else {
                return false;
            };
            let (producer, used) = stapsdt_notes(&buffer[..read]);
            if producer {
                return true;
            }
            if used == 0 {
                return false;
            }
            done += used as u64;
        }
        false
    }
}

/// The ELF header's fields we use (64-bit little-endian files only).
struct Header {
    offset: u64,
    count: usize,
    names: usize,
}

impl Header {
    fn parse(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
            return None;
        }
        if u16_at(bytes, 0x3a)? != 64 {
            return None;
        }
        Some(Self {
            offset: u64_at(bytes, 0x28)?,
            count: usize::from(u16_at(bytes, 0x3c)?),
            names: usize::from(u16_at(bytes, 0x3e)?),
        })
    }

    /// Section `index`'s header.
    fn section(&self, file: &File, buffer: &mut [u8; CHUNK], index: usize) -> Option<Section> {
        if index >= self.count {
            return None;
        }
        let read = file.read(&mut buffer[..64], self.offset + index as u64 * 64)?;
        (read == 64).then(|| Section::parse(&buffer[..64]))
    }
}

/// A section header's fields we use.
struct Section {
    name: u32,
    kind: u32,
    flags: u64,
    offset: u64,
    size: u64,
}

impl Section {
    fn parse(raw: &[u8]) -> Self {
        Self {
            name: u32_at(raw, 0).unwrap_or(0),
            kind: u32_at(raw, 4).unwrap_or(0),
            flags: u64_at(raw, 8).unwrap_or(0),
            offset: u64_at(raw, 24).unwrap_or(0),
            size: u64_at(raw, 32).unwrap_or(0),
        }
    }
}

/// Walks the whole `stapsdt` notes at the start of `bytes`: whether one is a producer's
/// `alloc` probe, and how many bytes the whole notes took (a note cut by the end of
/// `bytes` is left for the next read).
fn stapsdt_notes(bytes: &[u8]) -> (bool, usize) {
    let mut at = 0;
    while let (Some(name_size), Some(desc_size), Some(kind)) = (
        u32_at(bytes, at),
        u32_at(bytes, at + 4),
        u32_at(bytes, at + 8),
    ) {
        let name_at = at + 12;
        let desc_at = name_at + align4(name_size as usize);
        let end = desc_at + align4(desc_size as usize);
        if end > bytes.len() {
            break;
        }
        let name = &bytes[name_at..name_at + name_size as usize];
        if kind == 3
            && name == b"stapsdt\0"
            && is_producer_alloc(&bytes[desc_at..][..desc_size as usize])
        {
            return (true, end);
        }
        at = end;
    }
    (false, at)
}

/// A `stapsdt` note's description: three addresses, then provider, name and arguments.
fn is_producer_alloc(desc: &[u8]) -> bool {
    let mut strings = desc.get(24..).unwrap_or_default().split(|&b| b == 0);
    let (Some(provider), Some(name)) = (strings.next(), strings.next()) else {
        return false;
    };
    name == b"alloc" && PRODUCER_PROVIDERS.iter().any(|p| provider == p.as_bytes())
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sampler_common::preload::OTEL_PROVIDER;

    fn note(provider: &str, name: &str) -> Vec<u8> {
        let mut desc = vec![0u8; 24];
        desc.extend_from_slice(format!("{provider}\0{name}\08@%rdi\0").as_bytes());
        let mut out = Vec::new();
        out.extend_from_slice(&8u32.to_le_bytes());
        out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(b"stapsdt\0");
        out.extend_from_slice(&desc);
        out.resize(align4(out.len()), 0);
        out
    }

    #[test]
    fn a_producers_alloc_probe_is_recognised_among_others() {
        let mut notes = note("libc", "memory_malloc_retry");
        notes.extend(note("otel_memory", "free"));
        assert_eq!(stapsdt_notes(&notes), (false, notes.len()));
        notes.extend(note(OTEL_PROVIDER, "alloc"));
        assert!(stapsdt_notes(&notes).0);
        assert!(stapsdt_notes(&note("ddheap", "alloc")).0);
        assert!(!stapsdt_notes(&note("allocscope", "alloc")).0);
    }

    #[test]
    fn a_note_cut_by_the_end_of_a_read_is_left_for_the_next() {
        let first = note("python", "gc__start");
        let mut notes = first.clone();
        notes.extend(note(OTEL_PROVIDER, "alloc"));
        let cut = &notes[..notes.len() - 5];
        assert_eq!(stapsdt_notes(cut), (false, first.len()));
        assert_eq!(stapsdt_notes(&[]), (false, 0));
    }

    #[test]
    fn the_runtimes_and_this_library_are_not_read() {
        assert!(!may_produce(b"/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(!may_produce(b"linux-vdso.so.1"));
        assert!(may_produce(b"/usr/lib/libdatadog_profiling.so"));
        assert!(may_produce(b"/usr/lib/x86_64-linux-gnu/libcrypto.so.3"));
    }
}
