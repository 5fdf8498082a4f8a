//! Whether a stopped thread may be made to call `dlopen` now.
//!
//! `dlopen` takes the loader's lock and allocates. A thread stopped while it holds the
//! allocator's lock (inside `malloc`, or in the `mmap`/`brk`/`madvise` it makes while
//! holding it, or in a `fork`) or while it is inside the loader would wait on itself
//! forever. So a thread is taken only at a point where it holds neither: blocked in a
//! system call that is not one of those (see [`super::calls`]), or running code outside
//! the C library, the loader and the allocators.
//!
//! And `dlopen` runs on the thread's own stack, below what it uses: the thread must be on
//! its own stack (not on an alternate signal stack, nor a coroutine's: its stack pointer
//! in its `[stack]`, or in the mapping that holds its C library thread block), with
//! [`STACK_NEEDED`] free below the stack pointer. Anything else: let go and tried again a
//! moment later (or another thread).
//!
//! Pure: a decision from the stop's registers and the process's maps.

use super::lock_files::holds_locks;
use crate::sys::maps::Vma;

/// Stack the load needs below the thread's stack pointer: the block (two signal frames and
/// the extended state) and `dlopen` of the library with its constructor, 10.5 KiB in all
/// as measured here (tests/fixtures/harm.c `paint`); five times that, rounded up.
pub(super) const STACK_NEEDED: u64 = 56 << 10;

/// Why a thread was not taken.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NotNow {
    /// In a system call an allocator makes while it may hold its lock, or in a `fork`.
    MemoryCall(u64),
    /// Running code of the C library, the loader or an allocator.
    InRuntime,
    /// Its stack pointer is on a stack not its own (an alternate signal stack).
    ForeignStack,
    /// Only this many bytes free below its stack pointer.
    SmallStack(u64),
    /// Its stack says it holds (or may hold) a lock `dlopen` needs.
    Holds(super::held::Holds),
}

impl std::fmt::Display for NotNow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotNow::MemoryCall(n) => {
                write!(f, "in system call {n}, which may hold its allocator's lock")
            }
            NotNow::InRuntime => {
                f.write_str("running its C library's, loader's or allocator's code")
            }
            NotNow::ForeignStack => {
                f.write_str("on a stack not its own (an alternate signal stack)")
            }
            NotNow::Holds(why) => write!(f, "{why}"),
            NotNow::SmallStack(room) => write!(
                f,
                "{} KiB free on its stack, {} KiB needed",
                room >> 10,
                STACK_NEEDED >> 10
            ),
        }
    }
}

/// Whether a thread stopped with `ip`, in system call `syscall` (`orig_rax`: negative when
/// none), may call `dlopen`, in a process mapped as `vmas`.
pub(super) fn check(ip: u64, syscall: u64, vmas: &[Vma]) -> Result<(), NotNow> {
    if (syscall as i64) >= 0 {
        return if super::calls::holds_locks(syscall) {
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

/// Bytes free below stack pointer `sp` on the thread's own stack, or why it has none:
/// `fs_base` is its thread pointer, `stack_limit` the process's `RLIMIT_STACK` (how far the
/// main thread's `[stack]` may grow; `None`: unlimited).
pub(super) fn stack_room(
    sp: u64,
    fs_base: u64,
    vmas: &[Vma],
    stack_limit: Option<u64>,
) -> Result<u64, NotNow> {
    let vma = vmas
        .iter()
        .find(|v| (v.start..v.end).contains(&sp) && v.writable)
        .ok_or(NotNow::ForeignStack)?;
    let lowest = if vma.stack {
        // It grows down to its limit.
        stack_limit.map_or(0, |limit| vma.start.min(vma.end.saturating_sub(limit)))
    } else if (vma.start..vma.end).contains(&fs_base) {
        vma.start
    } else {
        return Err(NotNow::ForeignStack);
    };
    let room = sp - lowest;
    if room < STACK_NEEDED {
        return Err(NotNow::SmallStack(room));
    }
    Ok(room)
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
7f0001000000-7f0001001000 ---p 00000000 00:00 0
7f0001001000-7f0001801000 rw-p 00000000 00:00 0
7f0002000000-7f0002003000 rw-p 00000000 00:00 0
7f0002003000-7f0002004000 ---p 00000000 00:00 0
7f0002004000-7f0002006000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
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

    #[test]
    fn the_load_runs_only_on_a_threads_own_stack_with_room() {
        let vmas = parse(MAPS);
        // A thread on its 8 MiB stack, its control block at the top.
        let tcb = 0x7f00_0180_0f00;
        assert_eq!(
            stack_room(0x7f00_017f_0000, tcb, &vmas, None),
            Ok(0x7f00_017f_0000 - 0x7f00_0100_1000)
        );
        // The same thread in a handler on an alternate stack: a mapping of its own, or its
        // heap.
        for sp in [0x7f00_0200_5f00, 0x7f00_0200_2f00] {
            assert_eq!(stack_room(sp, tcb, &vmas, None), Err(NotNow::ForeignStack));
        }
        assert_eq!(
            stack_room(0x1000, tcb, &vmas, None),
            Err(NotNow::ForeignStack)
        );
        // A 12 KiB thread stack whose control block is there, 3 KiB in use.
        let small_tcb = 0x7f00_0200_2f00;
        assert_eq!(
            stack_room(0x7f00_0200_2400, small_tcb, &vmas, None),
            Err(NotNow::SmallStack(0x2400))
        );
        // The main thread's stack grows down to its limit.
        let sp = 0x7ffd_0002_0000;
        assert_eq!(
            stack_room(sp, 0, &vmas, Some(8 << 20)),
            Ok(sp - (0x7ffd_0002_1000 - (8 << 20)))
        );
        // Already larger than its limit: what is mapped.
        assert_eq!(stack_room(sp, 0, &vmas, Some(64 << 10)), Ok(0x20000));
        assert_eq!(
            stack_room(0x7ffd_0000_4000, 0, &vmas, Some(132 << 10)),
            Err(NotNow::SmallStack(0x4000))
        );
    }
}
