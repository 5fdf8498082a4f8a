//! Ctrl-C or SIGTERM during the set-up (the checks, the sampler loaded into running
//! processes, the probes attached): noted rather than fatal, so that allocscope stops
//! between two steps, leaves every target as it was and says that nothing was recorded,
//! instead of dying silently in the middle (#62: 19 times in 20 on a busy 64-thread target,
//! no file and no word). Once recording, tokio's handlers take the signals too.

use std::sync::atomic::{AtomicI32, Ordering};

/// The signal received (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn note(signal: libc::c_int) {
    RECEIVED.store(signal, Ordering::Relaxed);
}

/// Notes SIGINT and SIGTERM from now on (system calls interrupted by them are restarted).
/// A command allocscope starts gets its own dispositions back (`crate::signals`).
pub fn watch() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: all-zero is a valid sigaction (empty mask).
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = note as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: installs a handler that only stores to an atomic (async-signal-safe).
        unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
    }
}

/// The name of the signal received since [`watch`], if one was.
pub fn received() -> Option<&'static str> {
    match RECEIVED.load(Ordering::Relaxed) {
        libc::SIGINT => Some("SIGINT"),
        libc::SIGTERM => Some("SIGTERM"),
        _ => None,
    }
}

/// The exit status for a stop by the signal received (128 + its number), if one was.
pub fn exit_status() -> Option<u8> {
    let signal = RECEIVED.load(Ordering::Relaxed);
    (signal != 0).then(|| 128 + signal as u8)
}
