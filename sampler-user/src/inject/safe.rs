//! Whether a stopped thread may be made to call `dlopen` now.
//!
//! `dlopen` takes the loader's lock and allocates. A thread stopped while it holds the
//! allocator's lock (inside `malloc`, or in the `mmap`/`brk`/`madvise` it makes while
//! holding it) or while it is inside the loader would wait on itself forever. So a thread
//! is taken only at a point where it holds neither: blocked in a system call that is not
//! one of memory management's, or running code outside the C library, the loader and the
//! allocators. Anything else: let go and tried again a moment later (or another thread).
//!
//! Pure: a decision from the stop's registers and the process's maps.

use crate::sys::maps::Vma;

/// System calls an allocator makes while it may hold its lock.
const MEMORY_CALLS: &[u64] = &[
    9,   // mmap
    10,  // mprotect
    11,  // munmap
    12,  // brk
    25,  // mremap
    28,  // madvise
    324, // membarrier (jemalloc, tcmalloc)
];

/// The files whose code may hold the allocator's or the loader's lock.
fn holds_locks(path: &std::path::Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    [
        "libc.so",
        "libc-",
        "ld-linux",
        "ld64.so",
        "libpthread",
        "libjemalloc",
        "libtcmalloc",
        "libmimalloc",
        "libsampler_preload",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
}

/// Why a thread was not taken.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NotNow {
    /// In a system call an allocator makes while it may hold its lock.
    MemoryCall(u64),
    /// Running code of the C library, the loader or an allocator.
    InRuntime,
}

/// Whether a thread stopped with `ip`, in system call `syscall` (`orig_rax`: negative when
/// none), may call `dlopen`, in a process mapped as `vmas`.
pub(super) fn check(ip: u64, syscall: u64, vmas: &[Vma]) -> Result<(), NotNow> {
    if (syscall as i64) >= 0 {
        return if MEMORY_CALLS.contains(&syscall) {
            Err(NotNow::MemoryCall(syscall))
        } else {
            Ok(())
        };
    }
    let inside = vmas
        .iter()
        .find(|v| (v.start..v.end).contains(&ip))
        .and_then(|v| v.path.as_deref())
        .is_some_and(holds_locks);
    if inside {
        Err(NotNow::InRuntime)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::maps::parse;

    const MAPS: &str = "\
55d0a0000000-55d0a0100000 r-xp 00001000 08:01 100 /usr/bin/redis-server
7f0000000000-7f0000100000 r-xp 00028000 08:01 200 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000200000-7f0000300000 r-xp 00010000 08:01 300 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2
7f0000400000-7f0000420000 r-xp 00001000 08:01 400 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
";

    #[test]
    fn blocked_outside_memory_calls_or_running_its_own_code_is_safe() {
        let vmas = parse(MAPS);
        let none = u64::MAX;
        // epoll_wait, read, futex: blocked, holding nothing of the allocator's.
        for call in [232, 0, 202] {
            assert_eq!(check(0x7f0000000100, call, &vmas), Ok(()));
        }
        assert_eq!(check(0x7f0000000100, 9, &vmas), Err(NotNow::MemoryCall(9)));
        assert_eq!(
            check(0x7f0000000100, 12, &vmas),
            Err(NotNow::MemoryCall(12))
        );
        // Running: the program's own code (or anonymous JIT code) is fine.
        assert_eq!(check(0x55d0a0000100, none, &vmas), Ok(()));
        assert_eq!(check(0x1000, none, &vmas), Ok(()));
        for ip in [0x7f0000000100, 0x7f0000200100, 0x7f0000400100] {
            assert_eq!(check(ip, none, &vmas), Err(NotNow::InRuntime));
        }
    }
}
