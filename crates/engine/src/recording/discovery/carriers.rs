//! `--front-end in-process` with `--comm` or `--all`: the fleet's mode. Only processes that
//! count their own calls are targets: a service started with allocscope's library preloaded
//! (a systemd drop-in or a container's environment, docs/agent.md), a process an earlier
//! `-p` loaded it into, a producer of the `otel_memory` probes; and with `--comm`, each
//! match that does not carry it gets it loaded (see [`crate::inject`]) when it is found.
//!
//! Why a mode of its own: `--comm` and `--all` otherwise probe every allocator file for
//! every process, so each `malloc` of every process on the host traps, a carrier's
//! included (its library forwards to that same `malloc`). Here nothing is probed but the
//! library's own USDT sites, which a process reaches only with a sampled block: no process
//! pays a trap per call. What it leaves out is said: a match the library cannot be loaded
//! into (a static program, a seccomp filter, ptrace refused) is not counted, with its
//! reason, once.

use std::collections::HashSet;

use log::{info, warn};

use crate::{
    preload::Library,
    probe::allocator::Allocator,
    profile::ProcessBook,
    settings::{BadInput, LoadIntoRunning, SamplingConfig, Targets},
    targets::{AllocatorCache, FindError},
    text,
};

/// The fleet's mode while recording.
pub(in crate::recording) struct Carriers {
    /// `--comm`: the library loaded into the matches that do not carry one, as an
    /// allocator (`None` under `--all`, which loads nothing into anything).
    library: Option<(Library, Allocator)>,
    /// Live matches it could not be loaded into, each said once (pruned of the gone at
    /// each look: bounded by the host's processes).
    refused: HashSet<u32>,
}

impl Carriers {
    /// The mode, if `targets` and `sampling` ask for it: `--front-end in-process` with
    /// `--comm` or `--all`.
    pub(in crate::recording) fn for_targets(
        targets: &Targets,
        sampling: &SamplingConfig,
    ) -> Result<Option<Carriers>, BadInput> {
        let host_wide = targets.all || targets.comm.is_some();
        if sampling.load_into_running != LoadIntoRunning::Always
            || !host_wide
            || !targets.command.is_empty()
        {
            return Ok(None);
        }
        let library = match targets.comm {
            Some(_) => Some(super::super::front_end::library()?),
            None => None,
        };
        Ok(Some(Carriers {
            library,
            refused: HashSet::new(),
        }))
    }

    /// Whether `allocator`'s file is probed in this mode: allocscope's library, other
    /// producers and Go runtimes (sites reached only by sampled blocks), no allocator. A Go
    /// process is taken as it is: its heap is its runtime's (a cgo program's `malloc` is
    /// not counted in this mode).
    pub(in crate::recording) fn probes(allocator: &Allocator) -> bool {
        allocator.file.reports_itself() || allocator.file.is_go_runtime()
    }

    /// Whether a process with `allocators` counts its own calls.
    pub(in crate::recording) fn carried(allocators: &[Allocator]) -> bool {
        allocators.iter().any(Self::probes)
    }

    /// The library loaded into `--comm`'s matches, as an allocator.
    pub(in crate::recording) fn allocator(&self) -> Option<&Allocator> {
        self.library.as_ref().map(|(_, allocator)| allocator)
    }

    /// The allocators of `pid` (named `comm`, `found` its allocators now), the library
    /// loaded into it first if it does not carry it; one it cannot be loaded into has none
    /// ([`FindError::Gone`], said once). A Python process is said to leave pymalloc out.
    pub(in crate::recording) fn loaded_into(
        &mut self,
        pid: u32,
        comm: &str,
        found: Vec<Allocator>,
        cache: &mut AllocatorCache,
        processes: &mut ProcessBook,
    ) -> Result<Vec<Allocator>, FindError> {
        if Self::carried(&found) {
            return Ok(found);
        }
        if !self.load(pid, comm) {
            return Err(FindError::Gone);
        }
        // Read again: the library is mapped now.
        crate::sys::moment::renew();
        let found = cache.of_pid(pid)?;
        if let Some(what) = super::super::load::left_out_when_loaded(&found) {
            processes.incomplete(pid, what.into());
        }
        Ok(found)
    }

    /// Loads the library into `pid` (named `comm`), a match that does not carry it;
    /// returns whether it is loaded. One it cannot be loaded into is said once.
    fn load(&mut self, pid: u32, comm: &str) -> bool {
        let Some((library, _)) = &self.library else {
            return false;
        };
        if self.refused.contains(&pid) {
            return false;
        }
        let comm = text::printable(comm);
        match crate::inject::load(pid, &library.path()) {
            Ok(loaded) => {
                info!("pid {pid} ({comm}): in-process sampler loaded ({loaded})");
                true
            }
            Err(refused) => {
                warn!(
                    "pid {pid} ({comm}) matches --comm but is not counted: the in-process \
                     sampler cannot be loaded into it ({refused}); --front-end auto probes \
                     it with uprobes"
                );
                self.refused.insert(pid);
                false
            }
        }
    }

    /// `pid` exec'd: a new program, looked at afresh.
    pub(in crate::recording) fn forget(&mut self, pid: u32) {
        self.refused.remove(&pid);
    }

    /// Forgets the refused processes that are gone (their pids may come back as others).
    pub(in crate::recording) fn sweep(&mut self) {
        self.refused.retain(|&pid| crate::sys::process::exists(pid));
    }
}
