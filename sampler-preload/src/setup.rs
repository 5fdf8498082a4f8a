//! The library's set-up, once per process, on the first call of any thread: the next
//! allocator resolved (`next`), the sandbox and another producer checked (`sandbox`), the
//! probes told the library is ready (`usdt`), then the library's own set-up, before the
//! other threads may go on. Apart from `next` so that the lookup stays below everything
//! that uses it.

use core::sync::atomic::Ordering;

use crate::next;

/// What a call that found the library not ready must do.
pub enum Bootstrap {
    /// Resolved now: go on normally.
    Ready,
    /// This thread is resolving: serve the call from the arena.
    Arena,
}

fn thread_id() -> u64 {
    crate::thread::id()
}

/// Resolves the next allocator (once, on the first call of any thread), then runs
/// `after` (the library's own set-up; told whether the library is dormant) before the
/// others may go on.
#[cold]
pub fn resolve(after: impl FnOnce(bool)) -> Bootstrap {
    loop {
        match next::STATE.compare_exchange(
            next::UNRESOLVED,
            next::RESOLVING,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                next::RESOLVER.store(thread_id(), Ordering::Release);
                next::decide_opened();
                // Under a seccomp filter already, or where another producer reports the
                // process's allocations: dormant (no probe, no count). A library opened
                // into a running process was checked by allocscope before.
                let dormant = crate::sandbox::check_at_set_up()
                    || (!next::opened() && crate::sandbox::check_producer_at_set_up());
                // Opened into a running process: ready once its calls are routed here.
                if !dormant && !next::opened() {
                    // Before any call reaches the next allocator: from here on allocscope's
                    // file-wide probes on it leave this process's calls to us.
                    crate::usdt::ready();
                }
                next::lookup_all();
                // The exec family's next definitions and this library's path, now rather
                // than in an exec (which may run where the loader's lock is not to be
                // taken: a signal handler, a vfork child).
                crate::exec::resolve();
                // The sandbox's own calls (`prctl`, `syscall`) through the next definitions.
                crate::sandbox::resolve_next();
                after(dormant);
                next::STATE.store(next::READY, Ordering::Release);
                return Bootstrap::Ready;
            }
            Err(next::READY) => return Bootstrap::Ready,
            Err(_) => {
                if next::RESOLVER.load(Ordering::Acquire) == thread_id() {
                    return Bootstrap::Arena;
                }
                // Another thread resolves: a few microseconds, once per process.
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
    }
}
