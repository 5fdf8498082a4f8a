//! Whether a stopped thread is inside code that holds the C library's or the loader's locks,
//! read from its whole stack rather than its last instruction.
//!
//! A thread blocked in `futex` may be waiting for one lock while it holds another: `fork`
//! takes every arena lock of the allocator in turn and waits on the next one holding the
//! first ones (measured: a thread taken there deadlocked in `dlopen`'s first `malloc`, and
//! with it the program). So the stopped thread's stack is unwound with its modules' CFI
//! (framehop, as the `--unwind dwarf` path does) and refused if any frame is in the loader,
//! in an allocator library, in allocscope's own library, or in a C library function that
//! holds the allocator's or the loader's locks ([`HOLDING`]), or if the walk ends before it
//! leaves those (nothing then says what is held).
//!
//! [`holds`] is pure: a decision from return addresses and address ranges.

use std::{fs::File, ops::Range, os::unix::fs::FileExt as _, path::Path};

use anyhow::Context as _;

use super::lock_files::{named, ALLOCATOR_FILES, C_LIBRARY_FILES, LOADER_FILES};
use crate::{
    collect::CopiedStack,
    stacks::{
        image::Image,
        unwind::{Mapped, Unwinders},
    },
    sys::maps::Vma,
};

/// The C library's functions that hold the allocator's or the loader's locks while they
/// run (or wait), by their exported names.
const HOLDING: &[&str] = &[
    "malloc",
    "free",
    "calloc",
    "realloc",
    "reallocarray",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "malloc_trim",
    "malloc_stats",
    "malloc_info",
    "mallinfo",
    "mallinfo2",
    "mallopt",
    "fork",
    "_Fork",
    "vfork",
    "dl_iterate_phdr",
    "dlopen",
    "dlmopen",
    "dlclose",
    "dlsym",
    "dlvsym",
    "dladdr",
    "dladdr1",
    "dlinfo",
];

/// Most of a stack read to unwind it.
const STACK_WINDOW: u64 = 128 << 10;

/// What the stacks of a process's threads are read against.
pub(super) struct Runtime {
    pid: u32,
    unwinders: Unwinders,
    ranges: Ranges,
    /// The loader's own lock and its write lock (`_rtld_global._dl_load_lock`, then
    /// `_dl_load_write_lock`): where, when found.
    loader_locks: Option<u64>,
}

/// Address ranges a decision is made from.
#[derive(Debug, Default)]
pub(super) struct Ranges {
    /// The loader's and the allocator libraries' code.
    pub runtime: Vec<Range<u64>>,
    /// The C library's code.
    pub libc: Vec<Range<u64>>,
    /// The C library's functions of [`HOLDING`], with their names.
    pub holding: Vec<(Range<u64>, &'static str)>,
}

/// Why the stack says not now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Holds {
    /// A frame in the loader, an allocator library or allocscope's library.
    Runtime,
    /// A frame in this C library function.
    Function(&'static str),
    /// The walk ended inside the C library: what it holds is unknown.
    Unknown,
    /// Another thread holds the loader's lock: `dlopen` would wait for it, maybe for
    /// ever (a thread blocked inside `dl_iterate_phdr`'s callback, waiting for the very
    /// thread that would be loading).
    LoaderLock(u32),
}

impl std::fmt::Display for Holds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holds::Runtime => f.write_str("inside the loader or an allocator"),
            Holds::Function(name) => write!(f, "inside {name}, which holds the C library's locks"),
            Holds::Unknown => f.write_str("its stack could not be read past its C library"),
            Holds::LoaderLock(tid) => write!(f, "thread {tid} holds the loader's lock"),
        }
    }
}

impl Runtime {
    /// Reads `pid`'s modules (mapped as `vmas`) for unwinding, and where its loader, its
    /// allocators and the C library's lock-holding functions are.
    pub(super) fn of(pid: u32, vmas: &[Vma], mem: &File) -> anyhow::Result<Runtime> {
        let mut modules = Vec::new();
        let mut ranges = Ranges::default();
        let mut loader_locks = None;
        for vma in vmas.iter().filter(|v| v.executable) {
            let Some(path) = &vma.path else { continue };
            let file_path = vma.file_in(pid);
            let Ok(file) = File::open(&file_path) else {
                continue;
            };
            let Some(image) = Image::open(&file) else {
                continue;
            };
            let Some(bias) = image.bias(vma.start, vma.offset) else {
                continue;
            };
            if named(path, LOADER_FILES) || named(path, ALLOCATOR_FILES) {
                ranges.runtime.push(vma.start..vma.end);
            }
            if named(path, LOADER_FILES) {
                loader_locks = loader_locks.or_else(|| load_locks_in(&file_path, bias, mem));
            }
            if named(path, C_LIBRARY_FILES) {
                ranges.libc.push(vma.start..vma.end);
                ranges.holding.extend(holding_functions(&file_path, bias)?);
            }
            modules.push(Mapped {
                range: vma.start..vma.end,
                bias,
                image,
                name: path.display().to_string(),
            });
        }
        let mut unwinders = Unwinders::default();
        unwinders.rebuild(pid, 0, modules);
        if loader_locks.is_none() {
            log::debug!("pid {pid}: its loader's locks were not found: not looked at");
        }
        Ok(Runtime {
            pid,
            unwinders,
            ranges,
            loader_locks,
        })
    }

    /// A thread holding the loader's lock or its write lock, read from `mem` now.
    pub(super) fn loader_lock_owner(&self, mem: &File) -> Option<u32> {
        let at = self.loader_locks?;
        let mut bytes = [0u8; 2 * MUTEX];
        mem.read_exact_at(&mut bytes, at).ok()?;
        [0, MUTEX]
            .iter()
            .map(|m| i32::from_le_bytes(bytes[m + 8..m + 12].try_into().unwrap_or_default()))
            .find(|&owner| owner > 0)
            .map(|owner| owner as u32)
    }

    /// Whether the thread stopped with `ip`, `sp`, `bp` holds a lock `dlopen` needs, its
    /// stack read from `mem` (its mapping in `vmas`).
    pub(super) fn holds(
        &mut self,
        (ip, sp, bp): (u64, u64, u64),
        mem: &File,
        vmas: &[Vma],
    ) -> Result<(), Holds> {
        let end = vmas
            .iter()
            .find(|v| (v.start..v.end).contains(&sp))
            .map_or(sp, |v| v.end)
            .min(sp.saturating_add(STACK_WINDOW));
        let mut bytes = vec![0u8; (end - sp) as usize];
        if mem.read_exact_at(&mut bytes, sp).is_err() {
            return Err(Holds::Unknown);
        }
        let copied = CopiedStack {
            ip,
            sp,
            bp,
            start: sp,
            bytes,
            returns: Vec::new(),
        };
        let (frames, _) = self.unwinders.unwind(self.pid, &copied, true, 0);
        holds(&frames, &self.ranges)
    }
}

/// `pthread_mutex_t` (x86-64): lock, count, owner, users, kind, …
const MUTEX: usize = 40;
/// Its `kind` for a recursive mutex, as the loader's locks are.
const RECURSIVE: u32 = 1;

/// Where the loader's lock is in the loader `ld` (loaded with `bias`) of the process whose
/// memory is `mem`: in `_rtld_global`, after the namespaces' table and their count, three
/// recursive mutexes (the load lock, the write lock, the TLS lock).
fn load_locks_in(ld: &Path, bias: u64, mem: &File) -> Option<u64> {
    use object::{Object as _, ObjectSymbol as _};
    let data = std::fs::read(ld).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let global = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("_rtld_global"))?;
    let start = bias.wrapping_add(global.address());
    let mut bytes = vec![0u8; usize::try_from(global.size()).ok()?.min(64 << 10)];
    mem.read_exact_at(&mut bytes, start).ok()?;
    Some(start + find_load_lock(&bytes)? as u64)
}

/// The offset of the load lock in `_rtld_global`'s bytes: the first place where a small
/// namespace count (1–16) is followed by three recursive mutexes. Pure.
fn find_load_lock(bytes: &[u8]) -> Option<usize> {
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
    let kind =
        |at: usize| u32::from_le_bytes(bytes[at + 16..at + 20].try_into().unwrap_or_default());
    (8..bytes.len().checked_sub(3 * MUTEX)?)
        .step_by(8)
        .find(|&at| {
            (1..=16).contains(&word(at - 8)) && (0..3).all(|i| kind(at + i * MUTEX) == RECURSIVE)
        })
}

/// The address ranges of `libc`'s functions of [`HOLDING`] (loaded with `bias`).
fn holding_functions(libc: &Path, bias: u64) -> anyhow::Result<Vec<(Range<u64>, &'static str)>> {
    use object::{Object as _, ObjectSymbol as _};
    let data = std::fs::read(libc).with_context(|| format!("reading {}", libc.display()))?;
    let file = object::File::parse(&*data).context("parsing the C library")?;
    Ok(file
        .dynamic_symbols()
        .filter_map(|s| {
            let name = HOLDING.iter().find(|n| s.name() == Ok(**n))?;
            let start = bias.wrapping_add(s.address());
            Some((start..start + s.size().max(1), *name))
        })
        .collect())
}

/// Whether a thread whose return addresses are `frames` (innermost first, its instruction
/// pointer first) holds a lock `dlopen` needs, by `ranges`.
pub(super) fn holds(frames: &[u64], ranges: &Ranges) -> Result<(), Holds> {
    let inside = |set: &[Range<u64>], at: u64| set.iter().any(|r| r.contains(&at));
    let mut left_the_c_library = false;
    for &frame in frames {
        if inside(&ranges.runtime, frame) {
            return Err(Holds::Runtime);
        }
        if let Some((_, name)) = ranges.holding.iter().find(|(r, _)| r.contains(&frame)) {
            return Err(Holds::Function(name));
        }
        left_the_c_library |= !inside(&ranges.libc, frame);
    }
    if left_the_c_library {
        Ok(())
    } else {
        Err(Holds::Unknown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges() -> Ranges {
        Ranges {
            // The loader, and jemalloc.
            runtime: vec![
                0x7f00_0040_0000..0x7f00_0042_0000,
                0x7f00_0060_0000..0x7f00_0070_0000,
            ],
            libc: std::iter::once(0x7f00_0000_0000..0x7f00_0010_0000).collect(),
            holding: vec![
                (0x7f00_0000_1000..0x7f00_0000_1200, "malloc"),
                (0x7f00_0000_5000..0x7f00_0000_5100, "fork"),
            ],
        }
    }

    #[test]
    fn a_wait_called_from_the_program_holds_nothing_of_the_c_librarys() {
        // futex wait in pthread_cond_wait, called from the program, from start_thread.
        let frames = [
            0x7f00_0000_9000,
            0x7f00_0000_9400,
            0x5555_0000_1000,
            0x7f00_0000_8000,
        ];
        assert_eq!(holds(&frames, &ranges()), Ok(()));
    }

    #[test]
    fn fork_the_allocator_and_the_loader_hold_their_locks_anywhere_on_the_stack() {
        // Waiting on an arena lock inside fork (its internal helpers have no names).
        let frames = [
            0x7f00_0000_9000,
            0x7f00_0000_7000,
            0x7f00_0000_5050,
            0x5555_0000_1000,
        ];
        assert_eq!(holds(&frames, &ranges()), Err(Holds::Function("fork")));
        let frames = [0x7f00_0000_1100, 0x5555_0000_1000];
        assert_eq!(holds(&frames, &ranges()), Err(Holds::Function("malloc")));
        // A program callback called by the loader.
        let frames = [0x5555_0000_2000, 0x7f00_0041_0000, 0x5555_0000_1000];
        assert_eq!(holds(&frames, &ranges()), Err(Holds::Runtime));
    }

    #[test]
    fn the_loaders_lock_is_found_after_the_namespaces_count() {
        let mut bytes = vec![0u8; 4096];
        let put = |b: &mut Vec<u8>, at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        // A recursive mutex's kind word elsewhere, with no count before it: not it.
        put(&mut bytes, 200 + 16, &1u32.to_le_bytes());
        put(&mut bytes, 2560, &1u64.to_le_bytes());
        for i in 0..3 {
            put(&mut bytes, 2568 + i * MUTEX + 16, &RECURSIVE.to_le_bytes());
        }
        assert_eq!(find_load_lock(&bytes), Some(2568));
        assert_eq!(find_load_lock(&bytes[..2600]), None);
        assert_eq!(find_load_lock(&[0u8; 16]), None);
    }

    #[test]
    fn a_walk_that_never_leaves_the_c_library_says_nothing() {
        let frames = [0x7f00_0000_9000, 0x7f00_0000_7000];
        assert_eq!(holds(&frames, &ranges()), Err(Holds::Unknown));
        assert_eq!(holds(&[], &ranges()), Err(Holds::Unknown));
    }
}
