//! Starting `-- CMD ARGS` so that its first allocation is already probed.
//!
//! The child is forked before the tokio runtime exists (a single-threaded fork is safe) and
//! waits on a pipe before `execvp`; the parent attaches the probes to the child's pid, then
//! releases it. uprobes attached to a pid follow it through exec: the kernel installs the
//! breakpoints when the new program maps the allocator library. A second, close-on-exec pipe
//! tells the parent that exec happened (EOF) or why it failed (errno).

use std::{
    ffi::{CString, OsString},
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
};

/// A forked child waiting for [`PausedChild::release`] before it execs the command.
#[derive(Debug)]
pub struct PausedChild {
    /// The child's pid (stays the same through exec).
    pub pid: u32,
    go: OwnedFd,
    exec_status: OwnedFd,
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Where a spawned command's standard streams go instead of ours.
#[derive(Debug)]
pub struct Redirect {
    /// Standard input (e.g. /dev/null).
    pub stdin: OwnedFd,
    /// Standard output and error.
    pub output: OwnedFd,
}

/// Forks a child that will exec `argv` once released, with its standard streams redirected
/// when `redirect` is given. Call before any thread is started.
pub fn spawn_paused(argv: &[OsString], redirect: Option<Redirect>) -> io::Result<PausedChild> {
    let args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).map_err(|_| io::Error::other("argument contains NUL")))
        .collect::<Result<_, _>>()?;
    let mut pointers: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    pointers.push(std::ptr::null());
    let (go_read, go_write) = pipe()?;
    let (status_read, status_write) = pipe()?;
    // SAFETY: the process is single-threaded here (no runtime yet); the child only calls
    // async-signal-safe functions (read, write, execvp, _exit) on memory prepared before.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: child side, see above.
        unsafe {
            if let Some(redirect) = &redirect {
                libc::dup2(redirect.stdin.as_raw_fd(), 0);
                libc::dup2(redirect.output.as_raw_fd(), 1);
                libc::dup2(redirect.output.as_raw_fd(), 2);
            }
            let mut byte = 0u8;
            if libc::read(go_read.as_raw_fd(), (&raw mut byte).cast(), 1) == 1 {
                libc::execvp(pointers[0], pointers.as_ptr());
                let errno = *libc::__errno_location();
                libc::write(status_write.as_raw_fd(), (&raw const errno).cast(), 4);
            }
            libc::_exit(127);
        }
    }
    drop((go_read, status_write, redirect));
    Ok(PausedChild {
        pid: pid as u32,
        go: go_write,
        exec_status: status_read,
    })
}

impl PausedChild {
    /// Lets the child exec and waits until it has (`Ok`) or failed to (`Err` with the
    /// reason; the child then exits with status 127).
    pub fn release(self) -> io::Result<()> {
        let byte = 1u8;
        // SAFETY: writing one byte from a live local to a pipe we own.
        if unsafe { libc::write(self.go.as_raw_fd(), (&raw const byte).cast(), 1) } != 1 {
            return Err(io::Error::last_os_error());
        }
        let mut errno = 0i32;
        // SAFETY: reading at most 4 bytes into a live local.
        let n = unsafe { libc::read(self.exec_status.as_raw_fd(), (&raw mut errno).cast(), 4) };
        if n == 4 {
            Err(io::Error::from_raw_os_error(errno))
        } else {
            Ok(())
        }
    }
}
