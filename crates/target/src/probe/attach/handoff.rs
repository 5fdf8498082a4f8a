//! The last links of a finished recording, handed to a helper process that holds them
//! until allocscope exits.
//!
//! Why: closing the in-process front end's uprobe_multi link waits for the kernel's grace
//! periods (docs/performance.md, "The in-process front end"), and whoever holds its last
//! reference waits: allocscope's own exit would, and with it the shell that ran `record --
//! CMD`. When every target has exited, nobody pays for the probes any more (they are on the
//! library's memfd, which only the command's tree maps), so the wait need not be the
//! user's: a helper inherits the links, allocscope closes its own references at once, and
//! the helper, killed when allocscope exits (`PR_SET_PDEATHSIG`, and the end of its
//! standard input, whose other end only allocscope holds, if allocscope was gone before the
//! helper set that), releases them in its own exit. It is allocscope's binary,
//! run as the hidden `hold-links` command, and touches nothing else.

use std::{
    io,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    process::{Command, Stdio},
};

/// Name of the hidden command the helper runs.
pub const HOLD_LINKS: &str = "hold-links";

/// Starts the helper with a copy of each of `links` (the caller may drop its own then);
/// returns its pid.
pub fn hold_until_exit(links: &[BorrowedFd<'_>]) -> io::Result<u32> {
    let inherited: Vec<OwnedFd> = links
        .iter()
        .map(|fd| inheritable(*fd))
        .collect::<io::Result<_>>()?;
    let mut command = Command::new(crate::sys::own::EXE);
    std::os::unix::process::CommandExt::arg0(&mut command, "allocscope");
    command
        .arg(HOLD_LINKS)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // No `pre_exec`: the standard library then spawns with vfork semantics, not a copy of
    // this (large) process's page tables. The helper sets its parent-death signal itself.
    let mut child = command.spawn()?;
    let pid = child.id();
    drop(inherited);
    // Its standard input stays open until we exit (then it reads the end); the helper is
    // never waited for (the init process reaps it once we are gone).
    std::mem::forget(child.stdin.take());
    std::mem::forget(child);
    Ok(pid)
}

/// A duplicate of `fd` without close-on-exec.
fn inheritable(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: dup of a live descriptor; the new one is ours.
    let dup = unsafe { libc::dup(fd.as_fd().as_raw_fd()) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else (dup leaves close-on-exec clear).
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// The helper's side: holds what it inherited until its parent exits (the parent-death
/// signal, or the end of its standard input, whose other end only the parent holds).
pub fn hold() {
    // SAFETY: prctl with a signal number, then with a NUL-terminated name (its name would
    // otherwise be `exe`, from /proc/self/exe).
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        libc::prctl(libc::PR_SET_NAME, c"allocscope".as_ptr());
    }
    let mut byte = [0u8; 64];
    loop {
        // SAFETY: reads into a live local buffer.
        let n = unsafe { libc::read(0, byte.as_mut_ptr().cast(), byte.len()) };
        if n == 0 || (n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted) {
            return;
        }
    }
}
