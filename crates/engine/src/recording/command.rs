//! The command a recording started (`record -- CMD`), if any: its pid, when counting began
//! and ended for it, and how it ended. A command still running when the recording stops is
//! stopped with SIGTERM, as it would be if allocscope died (see [`crate::spawn`]).

use std::time::{Duration, Instant};

use log::{info, warn};

use super::CommandExit;
use crate::exits;

/// The command's lifecycle.
pub(super) struct Command {
    /// Its pid, if the recording started one.
    pub(super) pid: Option<u32>,
    /// How it ended (known once detached).
    pub(super) exit: Option<CommandExit>,
    /// When counting began: at the start, or when a command that ran while its probes
    /// loaded was let go (see [`super::early`]).
    pub(super) began: Instant,
    /// When the recording's targets were all gone, if that was before
    /// [`super::Recording::start`] returned (see [`super::early`]).
    pub(super) ended: Option<Instant>,
}

impl Command {
    pub(super) fn new(pid: Option<u32>) -> Command {
        Command {
            pid,
            exit: None,
            began: Instant::now(),
            ended: None,
        }
    }

    /// Whether `pid` is the command itself.
    pub(super) fn is(&self, pid: u32) -> bool {
        self.pid == Some(pid)
    }

    /// Detaching: reaps the command if it exited, else stops it (SIGTERM, reaped within 2
    /// s); keeps how it ended.
    pub(super) fn reap_or_stop(&mut self) {
        let Some(pid) = self.pid else {
            return;
        };
        self.exit = match exits::reap(pid) {
            Some(exit) => Some(CommandExit::OnItsOwn(exit)),
            None => {
                // SAFETY: kill(2) with our own child's pid, not reaped yet.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
                exits::reap_within(pid, Duration::from_secs(2)).map(CommandExit::Stopped)
            }
        };
        match self.exit {
            Some(CommandExit::OnItsOwn(exit)) => info!("command {exit}"),
            Some(CommandExit::Stopped(exit)) => info!("command stopped: {exit}"),
            None => warn!("command (pid {pid}) still running 2 s after SIGTERM"),
        }
    }
}
