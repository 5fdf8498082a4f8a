//! The allocator linked into the command's executable, patched by its processes (see
//! `probe::patch`): watched in each process that runs it, and probed with uprobes for
//! every process from the moment one runs it without the patch.
//!
//! Why: the patched file is not probed (its calls reach the library), so a process of the
//! tree that runs it without the patch would go uncounted: one whose library refused (a
//! thread at its set-up, a uprobe already there), one without the library (a raw `execve`
//! with an empty environment, an environment too large to extend) or with a dormant one
//! (seccomp). Probing the file then is safe for the patched ones: their patched pages are
//! copies no uprobe reaches. Processes that start later find the breakpoints, leave the
//! file unpatched and are counted by the uprobes.

use log::{info, warn};

use super::Recording;
use crate::{collect::monotonic_ns, probe::allocator::Allocator};

/// How long a process that runs the patched file may go without a region saying it
/// patched it before it is taken for one without the patch (its library sets up within
/// a millisecond of its exec; a process without one never does).
const GRACE_NS: u64 = 250_000_000;

impl Recording {
    /// Watches `pid` if it runs the patched file (among `allocators`).
    pub(super) fn watch_patched(&mut self, pid: u32, allocators: &[Allocator]) {
        let runs_it = allocators
            .iter()
            .any(|a| a.in_executable && a.file.patched_in_process);
        if runs_it && !self.in_process.fallen_back {
            self.in_process
                .watched
                .entry(pid)
                .or_insert_with(monotonic_ns);
        }
    }

    /// Looks at the processes watched: a patched one is left alone; one whose library
    /// refused, or that has not counted in a region in [`GRACE_NS`], makes the file probed.
    pub(super) fn check_patched(&mut self) {
        let now = monotonic_ns();
        let gone: Vec<u32> = self
            .in_process
            .watched
            .keys()
            .copied()
            .filter(|&pid| !crate::sys::process::exists(pid))
            .collect();
        for pid in gone {
            self.patched_process_ended(pid);
        }
        let mut unpatched = None;
        let counters = &self.accounting.counters;
        self.in_process
            .watched
            .retain(|&pid, since| match counters.region_patched(pid) {
                Some((n, None)) if n > 0 => false,
                Some((_, Some(refusal))) => {
                    unpatched = Some((pid, refusal.reason().to_owned()));
                    false
                }
                _ if now.saturating_sub(*since) > GRACE_NS => {
                    unpatched = Some((pid, "it does not carry the sampler".to_owned()));
                    false
                }
                _ => true,
            });
        if let Some((pid, why)) = unpatched {
            self.unpatch(pid, &why);
        }
    }

    /// `pid`, watched, has ended: if it was not seen to patch the file, which was not
    /// probed meanwhile, its calls through it went uncounted, and that is said.
    pub(super) fn patched_process_ended(&mut self, pid: u32) {
        if self.in_process.watched.remove(&pid).is_none() || self.in_process.fallen_back {
            return;
        }
        // Patched, or a refusal its region says (and `note_patches` with it).
        let said = matches!(
            self.accounting.counters.region_patched(pid),
            Some((n, refused)) if n > 0 || refused.is_some()
        );
        let Some(file) = self.in_process.patched.as_ref().filter(|_| !said) else {
            return;
        };
        self.aggregation.processes.incomplete(
            pid,
            format!(
                "it ran {} without its allocator patched and ended before the file could be \
                 probed: its calls through that allocator were not counted",
                file.shown.display()
            ),
        );
    }

    /// `allocators` of `pid`, its executable's allocator said to be patched there if its
    /// region says it patched it: by this recording's plan (probed for every process since
    /// another ran it unpatched, it is still counted in-process in this one, which no
    /// uprobe reaches), or by another recording's (a process found by `--all`, `-p`).
    pub(super) fn as_patched(&self, pid: u32, allocators: &[Allocator]) -> Vec<Allocator> {
        let patched_here =
            matches!(self.accounting.counters.region_patched(pid), Some((n, _)) if n > 0);
        allocators
            .iter()
            .map(|a| match &self.in_process.patched {
                _ if !patched_here || !a.in_executable || a.file.patched_in_process => a.clone(),
                Some(p) if a.file_id == p.file_id => p.clone(),
                _ => {
                    let mut file = (*a.file).clone();
                    file.patched_in_process = true;
                    Allocator {
                        file: std::sync::Arc::new(file),
                        ..a.clone()
                    }
                }
            })
            .collect()
    }

    /// Probes the patched file for every process from now on: `pid` runs it unpatched.
    fn unpatch(&mut self, pid: u32, why: &str) {
        let Some(mut allocator) = self.in_process.patched.clone() else {
            return;
        };
        self.in_process.fallen_back = true;
        self.in_process.watched.clear();
        self.cache.unpatched(&mut allocator);
        info!(
            "{}: probed with uprobes for every process from now on: pid {pid} runs it without \
             the patch ({why}); the processes patched already count in-process",
            allocator.describe()
        );
        if let Err(e) = self.probe_files(std::slice::from_ref(&allocator)) {
            warn!("probing {}: {e:#}", allocator.describe());
        }
        self.discovered
            .note_late(pid, std::slice::from_ref(&allocator), monotonic_ns());
    }
}
