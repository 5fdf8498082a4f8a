//! Noticing that target processes exit, through pidfds (Linux ≥ 5.3): a pidfd becomes
//! readable when its process terminates, so tokio can await it like a socket.

use std::os::fd::{FromRawFd as _, OwnedFd};

use tokio::{io::unix::AsyncFd, sync::mpsc};

/// Opens a pidfd for `pid`.
fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
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
}

impl Default for Watcher {
    fn default() -> Self {
        Watcher::new()
    }
}

/// Reaps a child that has exited and returns its wait status description.
pub fn reap(pid: u32) -> Option<String> {
    let mut status = 0;
    // SAFETY: waitpid on our own child with a valid pointer to a local.
    let reaped = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
    if reaped != pid as libc::pid_t {
        return None;
    }
    Some(if libc::WIFEXITED(status) {
        format!("exited with status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        "stopped".to_owned()
    })
}
