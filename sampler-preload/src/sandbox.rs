//! Seccomp: the library makes no system call a sandbox may forbid.
//!
//! Why: a program that forbids, say, `gettid` or `process_vm_readv` with
//! `SECCOMP_RET_KILL` runs natively and was killed by SIGSYS under allocscope, because the
//! library made those calls on the program's behalf. So:
//!
//! - The counting and sampling paths make no system call at all after set-up (a thread's
//!   slot is keyed by its TLS block, the countdown's seed comes from the kernel's
//!   `AT_RANDOM` bytes, a sampled block's probe is a breakpoint, not a call).
//! - A process already under a filter when the library sets up (inherited from a parent,
//!   or set by a launcher before `exec`) is **dormant**: the library forwards every call
//!   untouched, counts nothing, fires no probe (not even `allocscope:ready`), wraps no
//!   CPython domain, and says so in [`allocscope_preload_dormant`], which allocscope reads
//!   to probe that process's allocator with uprobes instead. Set-up's own reading of
//!   `/proc/self/status` uses `openat`, `read` and `close`, which the loader had just used
//!   to load the library.
//! - A process that installs a filter later, through `prctl(PR_SET_SECCOMP)` or
//!   `syscall(SYS_seccomp)` (libseccomp's way), passes through the library's versions of
//!   those two functions first: from then on it is **sandboxed**, and the cold paths that
//!   make system calls (early records' stack copies, a forked child's new region) make
//!   none. A filter installed by a raw `syscall` instruction is not seen (docs/preload.md).

use core::{
    ffi::{c_int, c_long, c_ulong},
    sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering},
};

use sampler_common::preload::{DORMANT_PRODUCER, DORMANT_SANDBOXED, PRIVATE_CHILD};

/// [`DORMANT_SANDBOXED`] when the library is dormant in this process (under a seccomp
/// filter at set-up), [`DORMANT_PRODUCER`] when it leaves the process to another producer
/// (see [`crate::producer`]); [`PRIVATE_CHILD`] in the child of a sandboxed process (it
/// counts in a private region it cannot publish, and its samples reach the probes); read
/// by allocscope through `/proc/PID/mem`.
#[no_mangle]
#[used]
pub static allocscope_preload_dormant: AtomicU32 = AtomicU32::new(0);

/// A filter was installed (or is being) after set-up: no more system calls of ours.
static SANDBOXED: AtomicBool = AtomicBool::new(false);

/// Whether the library is dormant here.
#[inline(always)]
pub fn dormant() -> bool {
    matches!(
        allocscope_preload_dormant.load(Ordering::Relaxed),
        DORMANT_SANDBOXED | DORMANT_PRODUCER
    )
}

/// In a sandboxed process's child: says it counts privately (see
/// [`allocscope_preload_dormant`]).
pub fn mark_private_child() {
    allocscope_preload_dormant.store(PRIVATE_CHILD, Ordering::Relaxed);
}

/// At set-up, where another producer reports the process's allocations (see
/// [`crate::producer`]): dormant. Only where not dormant already (a sandboxed process's
/// files are not read).
pub fn check_producer_at_set_up() -> bool {
    let producer = crate::producer::in_process();
    if producer {
        allocscope_preload_dormant.store(DORMANT_PRODUCER, Ordering::Relaxed);
    }
    producer
}

/// Whether the library may make no system call but those the program makes itself.
#[inline(always)]
pub fn quiet() -> bool {
    SANDBOXED.load(Ordering::Relaxed) || allocscope_preload_dormant.load(Ordering::Relaxed) != 0
}

/// At set-up: whether a seccomp filter (or strict mode) is in force, from the `Seccomp:`
/// line of `/proc/self/status`; not when it cannot be read (as from outside, where
/// allocscope reads the same line). Marks the library dormant if so.
pub fn check_at_set_up() -> bool {
    let mut buffer = [0u8; 4096];
    // SAFETY: open with a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/status".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    let mut len = 0;
    while len < buffer.len() {
        // SAFETY: reads into the unused rest of our buffer.
        let n = unsafe { libc::read(fd, buffer[len..].as_mut_ptr().cast(), buffer.len() - len) };
        if n <= 0 {
            break;
        }
        len += n as usize;
    }
    // SAFETY: closing what we opened.
    unsafe { libc::close(fd) };
    let filtered = seccomp_mode(&buffer[..len]).is_some_and(|mode| mode != 0);
    if filtered {
        allocscope_preload_dormant.store(DORMANT_SANDBOXED, Ordering::Relaxed);
    }
    filtered
}

/// The number on the `Seccomp:` line of a `/proc/PID/status` text.
fn seccomp_mode(status: &[u8]) -> Option<u32> {
    let line = status
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"Seccomp:"))?;
    let digits = line.iter().skip_while(|b| b.is_ascii_whitespace());
    let mut mode = None;
    for &b in digits {
        if !b.is_ascii_digit() {
            break;
        }
        mode = Some(mode.unwrap_or(0u32).saturating_mul(10) + u32::from(b - b'0'));
    }
    mode
}

/// The next definitions (0: not looked up yet).
pub(crate) static NEXT_PRCTL: AtomicUsize = AtomicUsize::new(0);
pub(crate) static NEXT_SYSCALL: AtomicUsize = AtomicUsize::new(0);

/// Looks up the next `prctl` and `syscall` at set-up, so that a first call made from a
/// signal handler does not run `dlsym` (not async-signal-safe).
pub fn resolve_next() {
    next(&NEXT_PRCTL, c"prctl");
    next(&NEXT_SYSCALL, c"syscall");
}

fn next(cache: &AtomicUsize, name: &core::ffi::CStr) -> usize {
    let mut address = cache.load(Ordering::Acquire);
    if address == 0 {
        address = crate::next::lookup(name);
        cache.store(address, Ordering::Release);
    }
    address
}

/// The C library's `prctl`, seen first: `PR_SET_SECCOMP` makes the library quiet before the
/// filter exists. The arguments are forwarded as they came (the variadic ones are plain
/// integer registers on x86-64).
///
/// # Safety
/// The C `prctl` contract.
#[no_mangle]
pub unsafe extern "C" fn prctl(
    option: c_int,
    a2: c_ulong,
    a3: c_ulong,
    a4: c_ulong,
    a5: c_ulong,
) -> c_int {
    if option == libc::PR_SET_SECCOMP {
        SANDBOXED.store(true, Ordering::SeqCst);
    }
    type Prctl = unsafe extern "C" fn(c_int, c_ulong, c_ulong, c_ulong, c_ulong) -> c_int;
    match next(&NEXT_PRCTL, c"prctl") {
        0 => {
            // SAFETY: errno of this thread.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            -1
        }
        // SAFETY: the next definition of prctl, a function of this type.
        f => unsafe { core::mem::transmute::<usize, Prctl>(f)(option, a2, a3, a4, a5) },
    }
}

/// The C library's `syscall`, seen first: `seccomp` (and `prctl(PR_SET_SECCOMP)`) make the
/// library quiet before the filter exists. Six arguments are forwarded whatever the caller
/// passed (unused ones are whatever the registers held, as for the C library's own).
///
/// # Safety
/// The C `syscall` contract.
#[no_mangle]
pub unsafe extern "C" fn syscall(
    number: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    if number == libc::SYS_seccomp
        || (number == libc::SYS_prctl && a1 == c_long::from(libc::PR_SET_SECCOMP))
    {
        SANDBOXED.store(true, Ordering::SeqCst);
    }
    type Syscall =
        unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long;
    match next(&NEXT_SYSCALL, c"syscall") {
        0 => {
            // SAFETY: errno of this thread.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            -1
        }
        // SAFETY: the next definition of syscall, a function of this type.
        f => unsafe { core::mem::transmute::<usize, Syscall>(f)(number, a1, a2, a3, a4, a5, a6) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seccomp_line_is_read() {
        let status = b"Name:\tx\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n";
        assert_eq!(seccomp_mode(status), Some(2));
        assert_eq!(seccomp_mode(b"Seccomp:\t0\n"), Some(0));
        assert_eq!(seccomp_mode(b"Name:\tx\n"), None);
        assert_eq!(seccomp_mode(b"Seccomp_filters:\t3\n"), None);
    }
}
