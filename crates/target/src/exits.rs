//! Noticing that target processes exit, through pidfds (Linux ≥ 5.3): a pidfd becomes
//! readable when its process terminates, so tokio can await it like a socket.

use std::os::fd::{FromRawFd as _, OwnedFd};

use tokio::{io::unix::AsyncFd, sync::mpsc};

/// Opens a pidfd for `pid`.
pub fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Watches processes and reports each one's exit on a channel.
pub struct Watcher {
    sender: mpsc::UnboundedSender<u32>,
    /// The pids of processes that exited, in order.
    pub exited: mpsc::UnboundedReceiver<u32>,
}

impl Watcher {
    /// A watcher with nothing watched yet.
    pub fn new() -> Watcher {
        let (sender, exited) = mpsc::unbounded_channel();
        Watcher { sender, exited }
    }

    /// Reports `pid`'s exit once it happens. Fails with ESRCH if it is already gone. Must
    /// run inside the tokio runtime.
    pub fn watch(&self, pid: u32) -> std::io::Result<()> {
        // SAFETY: the OwnedFd keeps the pidfd open and unchanged for the AsyncFd's lifetime.
        let fd = unsafe { AsyncFd::register(pidfd_open(pid)?) }.map_err(std::io::Error::from)?;
        let sender = self.sender.clone();
        tokio::spawn(async move {
            let _ = fd.readable().await;
            let _ = sender.send(pid);
        });
        Ok(())
    }

    /// Reports `pid` as exited now (it was gone before it could be watched).
    pub fn report(&self, pid: u32) {
        let _ = self.sender.send(pid);
    }
}

impl Default for Watcher {
    fn default() -> Self {
        Watcher::new()
    }
}

/// How a child process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildExit {
    /// `exit(code)`.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl ChildExit {
    /// The exit code a shell would report for it (`128 + N` for signal N), as `time` and
    /// `perf record -- CMD` pass it on.
    pub fn shell_code(self) -> u8 {
        match self {
            ChildExit::Code(code) => code as u8,
            ChildExit::Signal(signal) => 128u8.wrapping_add(signal as u8),
        }
    }
}

impl std::fmt::Display for ChildExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChildExit::Code(code) => write!(f, "exited with status {code}"),
            ChildExit::Signal(signal) => write!(f, "killed by signal {signal}"),
        }
    }
}

/// Reaps our child `pid` if it has ended.
pub fn reap(pid: u32) -> Option<ChildExit> {
    let mut status = 0;
    // SAFETY: waitpid on our own child with a valid pointer to a local.
    let reaped = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
    if reaped != pid as libc::pid_t {
        return None;
    }
    if libc::WIFEXITED(status) {
        Some(ChildExit::Code(libc::WEXITSTATUS(status)))
    } else if libc::WIFSIGNALED(status) {
        Some(ChildExit::Signal(libc::WTERMSIG(status)))
    } else {
        None
    }
}

/// Reaps our child `pid`, waiting up to `timeout` for it to end.
pub fn reap_within(pid: u32, timeout: std::time::Duration) -> Option<ChildExit> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(exit) = reap(pid) {
            return Some(exit);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_as_a_shell_reports_them() {
        assert_eq!(ChildExit::Code(3).shell_code(), 3);
        assert_eq!(ChildExit::Signal(libc::SIGTERM).shell_code(), 143);
        assert_eq!(ChildExit::Code(1).to_string(), "exited with status 1");
    }
}
