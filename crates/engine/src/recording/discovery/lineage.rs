//! The kernel's fork and exec events while recording: a new process of a target, or a
//! program a process exec'd, taken in (its allocators found, its description started, its
//! front end mapped) or let go, each event's /proc files read once (`sys::moment`).
//!
//! Why apart from [`super::super::discovery`]: this runs once per process of a build or a script
//! (thousands), the rest once per target; its cost is what a short process pays.

use log::{debug, warn};

use super::super::{CoveredSince, Recording};
use crate::{probe::allocator::Allocator, profile::CoverageStart, targets::FindError, text};

impl Recording {
    /// A followed process forked (`parent` ≠ 0), or a process exec'd (a followed one, or
    /// any with `--comm` and `--all`); `comm`: its name then.
    pub(in crate::recording) fn on_process(
        &mut self,
        pid: u32,
        parent: u32,
        timestamp_ns: u64,
        comm: &str,
    ) {
        // Each of its /proc files read once for the event (see `sys::moment`).
        crate::sys::moment::during(pid, || {
            self.on_process_now(pid, parent, timestamp_ns, comm);
        });
    }

    fn on_process_now(&mut self, pid: u32, parent: u32, timestamp_ns: u64, comm: &str) {
        if parent == 0 {
            // Before its new files are found: what was read of the old program stands; a
            // Go runtime's totals and profile are read again in the new one.
            self.aggregation.processes.exec_seen(pid, timestamp_ns);
            self.go_readers.exec(pid);
        }
        let since = CoveredSince {
            start: if parent == 0 {
                CoverageStart::Exec
            } else {
                CoverageStart::Fork
            },
            timestamp_ns,
            parent,
        };
        if self.discovered.followed_only() {
            self.on_followed(pid, parent, comm, since);
            return;
        }
        if self.targets.exclude_pids.contains(&pid) {
            return;
        }
        if parent == 0 && !self.discovered.is_running(pid) {
            // Not a target (yet): a new program for `--all` to look at now.
            if let Err(e) = self.consider_host(pid) {
                warn!("looking at new process {pid}: {e:#}");
            }
            return;
        }
        match self.allocators_of(pid) {
            Ok(allocators) => {
                if parent == 0 && self.aggregation.processes.ran_go(pid) {
                    // Its probes are tied to the thread that was its leader when they were
                    // attached: a Go program execs from any of its threads, and a new
                    // program exec'd from another has none. Attached anew.
                    if let Some(probes) = self.probes.as_mut() {
                        probes.remove(pid).close_in_background();
                    }
                }
                if let Err(e) = self.attach(pid, &allocators, since) {
                    debug!("followed pid {pid}: {e:#}");
                } else if parent == 0 {
                    // An exec: a new name and executable, maybe new allocators.
                    self.aggregation.track(pid);
                }
            }
            Err(FindError::Gone | FindError::KernelThread) => {}
            Err(e) => warn!("followed pid {pid}: {e}"),
        }
    }

    /// `followed_only`: a process the kernel already counts (a new process of a target,
    /// as a target; one that exec'd, as a target still or pending) is made a target or
    /// dropped. A new process of a target is one (unless excluded), and so is a target that
    /// exec'd; another that exec'd is one if `--comm` matches its new name.
    fn on_followed(&mut self, pid: u32, parent: u32, comm: &str, since: CoveredSince) {
        let target = if parent != 0 {
            self.discovered.is_running(parent)
        } else {
            self.discovered.is_running(pid)
        };
        if target && !self.targets.excludes(pid, comm) {
            if let Some(carriers) = self.carriers.as_mut().filter(|_| parent == 0) {
                carriers.forget(pid);
            }
            let mut gone = false; // Its maps unreadable: gone (see `note_unseen_exec`).
            let mut allocators = match self.carriers {
                Some(_) if parent == 0 => self.carried_after_exec(pid, comm),
                // A fork's maps are a copy of its parent's: its allocators are not read again.
                _ => match (parent != 0)
                    .then(|| self.cache.inherited(parent))
                    .flatten()
                {
                    Some(inherited) => Some(inherited),
                    None => self
                        .allocators_of(pid)
                        .map_err(|e| {
                            gone = matches!(e, FindError::Gone | FindError::Zombie);
                        })
                        .ok(),
                },
            };
            if parent != 0 {
                if self.aggregation.track_fork(pid, parent)
                    && self.maps_read_while_exiting(pid, parent, allocators.as_deref())
                {
                    allocators = None;
                }
            } else {
                if gone {
                    self.note_unseen_exec(pid, comm, since.timestamp_ns);
                }
                // A new name (as the kernel told it) and executable: tracked afresh, its
                // new files noted from now.
                self.aggregation.track_named(pid, comm);
                self.discovered.covered_from(pid, since.timestamp_ns);
            }
            if let Err(e) = self.admit(pid, allocators.as_deref(), since) {
                warn!("followed pid {pid}: {e:#}");
            }
            self.aggregation.processes.name_if_unknown(pid, comm);
        } else if !self.consider_comm(pid, Some(comm), since) {
            self.reject(pid);
        }
    }

    /// Only carriers counted: the allocators of target `pid` after an exec (the library
    /// loaded again if the new program does not carry it); one it cannot be loaded into
    /// is said to be counted only until then.
    fn carried_after_exec(&mut self, pid: u32, comm: &str) -> Option<Vec<Allocator>> {
        match self.carried(pid, comm) {
            Ok(allocators) => Some(allocators),
            Err(_) => {
                self.aggregation.processes.incomplete(
                    pid,
                    format!(
                        "counted until it exec'd {}, which the in-process sampler could not be loaded into",
                        text::printable(comm)
                    ),
                );
                None
            }
        }
    }
}
