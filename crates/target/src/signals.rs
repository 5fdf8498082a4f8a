//! The signal dispositions and mask allocscope was started with, for the commands it starts.
//!
//! Why: Rust's runtime ignores SIGPIPE before `main` (so a closed pipe is an error, not a
//! death), and an ignored signal stays ignored across `exec`. A command started with it
//! ignored behaves differently from a native run: `yes | head -1` prints "Broken pipe",
//! `while :; do echo y; done | head -1` never ends. So a constructor in `.init_array`, which
//! the loader runs before the Rust runtime's own set-up, keeps what the process inherited:
//! whether each signal was ignored, and the blocked mask. [`restore`] gives exactly that
//! back to a forked child before it execs (handlers are reset by `exec` anyway; an ignored
//! signal the user's shell handed us stays ignored, as it would natively).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Signals 1..=64: bit `n - 1` set when signal `n` was ignored at start.
static IGNORED: AtomicU64 = AtomicU64::new(0);
/// The blocked mask at start, signals 1..=64 as bits.
static BLOCKED: AtomicU64 = AtomicU64::new(0);
/// Whether the constructor ran (it always does in a dynamically linked binary).
static CAPTURED: AtomicBool = AtomicBool::new(false);

/// The highest signal number looked at (glibc's `SIGRTMAX` is 64 on Linux).
const SIGNALS: i32 = 64;

#[used]
#[link_section = ".init_array"]
static CAPTURE: extern "C" fn() = {
    extern "C" fn capture() {
        let (mut ignored, mut blocked) = (0u64, 0u64);
        // SAFETY: all-zero is a valid sigset_t and sigaction.
        let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: reads the current mask into a local (a null new set changes nothing).
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut mask) };
        for signal in 1..=SIGNALS {
            // SAFETY: as above.
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: a query (null new action) into a local; invalid numbers fail harmlessly.
            let queried = unsafe { libc::sigaction(signal, std::ptr::null(), &mut action) } == 0;
            if queried && action.sa_sigaction == libc::SIG_IGN {
                ignored |= 1 << (signal - 1);
            }
            // SAFETY: a membership test on a local set.
            if unsafe { libc::sigismember(&mask, signal) } == 1 {
                blocked |= 1 << (signal - 1);
            }
        }
        IGNORED.store(ignored, Ordering::Relaxed);
        BLOCKED.store(blocked, Ordering::Relaxed);
        CAPTURED.store(true, Ordering::Release);
    }
    capture
};

/// Whether signal `signal` was ignored when allocscope started.
#[cfg(test)]
fn ignored_at_start(signal: i32) -> bool {
    (1..=SIGNALS).contains(&signal) && IGNORED.load(Ordering::Relaxed) & (1 << (signal - 1)) != 0
}

/// In a forked child, before `exec`: every signal's disposition back to what allocscope
/// found (ignored, or the default), and the blocked mask likewise. Async-signal-safe (only
/// `sigaction`, `sigemptyset`, `sigaddset` and `sigprocmask` on locals).
pub(crate) fn restore() {
    if !CAPTURED.load(Ordering::Acquire) {
        return;
    }
    let (ignored, blocked) = (
        IGNORED.load(Ordering::Relaxed),
        BLOCKED.load(Ordering::Relaxed),
    );
    // SAFETY: all-zero is a valid sigset_t.
    let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: initialises the local set.
    unsafe { libc::sigemptyset(&mut mask) };
    for signal in 1..=SIGNALS {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        let bit = 1u64 << (signal - 1);
        // SAFETY: all-zero is a valid sigaction (empty mask, no flags).
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = if ignored & bit != 0 {
            libc::SIG_IGN
        } else {
            libc::SIG_DFL
        };
        // SAFETY: sets a plain disposition; numbers the kernel refuses fail harmlessly.
        unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
        if blocked & bit != 0 {
            // SAFETY: adds a signal number to the local set.
            unsafe { libc::sigaddset(&mut mask, signal) };
        }
    }
    // SAFETY: sets this (single-threaded, forked) process's mask from the local set.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigpipe_is_seen_as_it_was_before_the_runtime_ignored_it() {
        assert!(CAPTURED.load(Ordering::Acquire), "the constructor ran");
        // SAFETY: a query into a local.
        let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        unsafe { libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut now) };
        assert_eq!(now.sa_sigaction, libc::SIG_IGN, "Rust's runtime ignores it");
        // cargo starts test binaries with SIGPIPE at its default (std's Command resets it).
        assert!(!ignored_at_start(libc::SIGPIPE));
    }
}
