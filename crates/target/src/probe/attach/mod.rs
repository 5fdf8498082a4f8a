//! Loading the eBPF object and attaching its probes, process by process or host-wide.
//!
//! [`Probes::load`] loads every program once; [`Probes::add`] then attaches one process's
//! allocators (or, host-wide, one allocator file for every process), at any time during a
//! recording: processes found later (`--comm`, `--follow`, a late `dlopen`) are added the
//! same way. Per process, attachment is scoped in the kernel (`UProbeScope::OneProcess`,
//! the session link's pid): the breakpoint is installed only in that address space, so no
//! other process pays the trap (docs/design.md §5). Host-wide (`--all`, and `--follow`/`--comm`
//! with `followed_only`) each allocator file is probed once for every process that maps it,
//! now or later; the processes left out (excluded, or not in the kernel's followed set) pay
//! the trap and are dropped by the program's first lookup.
//!
//! Attachments are by file offset through the process's own view of the file
//! (`/proc/PID/map_files`), so a library inside a container is the container's file.
//! Dropping [`Probes`] (or allocscope dying, even by SIGKILL) closes the file descriptors
//! and the kernel removes every breakpoint: the target is never left patched.

use sampler_common::kernel;
use std::{
    collections::{HashMap, HashSet},
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    time::Instant,
};

use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuHashMap},
    programs::{
        raw_trace_point::RawTracePointLinkId,
        trace_point::TracePointLinkId,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
        RawTracePoint, TracePoint, UProbe,
    },
    Ebpf, EbpfLoader,
};
use sampler_common::{geometric, AllocFn, FOLLOWED_TARGET, HOST_SLOT};

use super::{
    allocator::Allocator,
    prologue::Placement,
    runs::{self, ProgramRuns},
    session,
};

/// The eBPF object built by build.rs.
pub(in crate::probe) static SAMPLER_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sampler"));

/// Load-time settings of the kernel side.
#[derive(Clone, Copy, Debug)]
pub struct KernelConfig {
    /// Mean sampling interval in bytes.
    pub interval: u64,
    /// Whether the eBPF side's aya-log records are wanted (`--verbose`).
    pub log: bool,
    /// Track frees: return probes complete sampled calls, `free` is probed, and the live
    /// map holds at most this many sampled blocks (`None`: allocations only).
    pub track_frees: Option<u32>,
    /// Bytes of the sample ring buffer (a power of two, at least a page).
    pub ring_buffer: u32,
    /// Bytes of user stack copied per sample for unwinding in user space; 0: the kernel
    /// walks frame pointers.
    pub stack_bytes: u32,
    /// Try uprobe sessions for the returns (else classic return probes on every call).
    pub sessions: bool,
    /// Probe USDT sites at their 5-byte nop where the kernel optimises it (`--usdt-nop5`,
    /// the benchmark of the difference; unsafe for processes that fork, see the flag).
    pub usdt_nop5: bool,
    /// Host mode (`--all`): probes attached host-wide, excluded pids skipped in the kernel.
    pub host: bool,
    /// Follow new processes of followed ones through fork and exec (`--follow`).
    pub follow: bool,
    /// With `host`: the file-wide probes count only the processes in the kernel's followed
    /// set, which a new process of a followed one enters at its fork, and one that exec's
    /// while `watch_execs` at its exec, pending a decision (`--follow`, `--comm`).
    pub followed_only: bool,
    /// Report every exec on the host (`--comm`, `--all`: new processes found at once).
    pub watch_execs: bool,
    /// Duty cycling (`--max-overhead`): calls count only while the gate is open
    /// ([`Probes::set_gate`]); the probes come and go with [`Probes::suspend`] and
    /// [`Probes::resume`].
    pub duty_cycled: bool,
    /// Load the programs of uprobes on allocator functions (and the thread-exit tracepoint
    /// that cleans their state) only when a file is first probed with them: a command
    /// counted in-process alone usually never is, and their verification is slow
    /// (docs/performance.md, "The in-process front end").
    pub lazy_uprobes: bool,
    /// Sampled calls read CPython frames (a target may run an interpreter).
    pub python_frames: bool,
}

/// One process to probe and the allocators found in it.
#[derive(Clone, Debug)]
pub struct Target {
    /// Process id.
    pub pid: u32,
    /// Its allocators (an interposed one first, the C library last).
    pub allocators: Vec<Allocator>,
}

/// Where probes take effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// In one process, counted in counter slot `slot`.
    Process {
        /// The process.
        pid: u32,
        /// Its slot in the kernel's counter array (the attach cookie).
        slot: u32,
    },
    /// In every process mapping the file (`--all`), counted per pid.
    Host,
}

impl Scope {
    fn key(self) -> u32 {
        match self {
            Scope::Process { pid, .. } => pid,
            Scope::Host => 0,
        }
    }

    fn slot(self) -> u32 {
        match self {
            Scope::Process { slot, .. } => slot,
            Scope::Host => HOST_SLOT,
        }
    }

    fn uprobe_scope(self) -> UProbeScope {
        match self {
            Scope::Process { pid, .. } => std::num::NonZeroU32::new(pid)
                .map_or(UProbeScope::AllProcesses, UProbeScope::OneProcess),
            Scope::Host => UProbeScope::AllProcesses,
        }
    }
}

/// What a probe point observes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// An allocation function's entry.
    Entry(String),
    /// An allocation function's return.
    Return(String),
    /// A free function's entry.
    Free(String),
    /// An allocation function's entry and, when asked, its return (uprobe session).
    Session(String),
    /// A USDT probe of an in-process front end (`allocscope:alloc`).
    Usdt(String),
}

impl std::fmt::Display for ProbeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeKind::Entry(symbol) | ProbeKind::Free(symbol) => write!(f, "{symbol}"),
            ProbeKind::Return(symbol) => write!(f, "{symbol} (return)"),
            ProbeKind::Session(symbol) => write!(f, "{symbol} (session)"),
            ProbeKind::Usdt(name) => write!(f, "{name} (USDT)"),
        }
    }
}

/// A probe point actually attached (reported with `--verbose` and in JSON).
#[derive(Clone, Debug)]
pub struct AttachedPoint {
    /// Process id (0: every process).
    pub pid: u32,
    /// What it observes.
    pub probe: ProbeKind,
    /// The file, as the process maps it.
    pub path: PathBuf,
    /// File offset of the function.
    pub file_offset: u64,
    /// Where in the function the probe sits.
    pub placement: Placement,
}

/// Errors while loading or attaching.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The interval cannot be represented by the kernel's sampler.
    #[error("sampling interval {0} is out of range")]
    Interval(u64),
    /// The object failed to load (verifier, missing kernel feature, permissions).
    #[error("loading the eBPF programs failed")]
    Load(#[from] aya::EbpfError),
    /// The kernel refused a program (verifier, missing feature).
    #[error("loading eBPF program {program}")]
    LoadProgram {
        /// Program name.
        program: String,
        /// Cause.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A program is missing from the object (build mismatch).
    #[error("eBPF program {0} missing from the object")]
    MissingProgram(String),
    /// A map is missing from the object (a build mismatch).
    #[error("eBPF map {0} missing from the object")]
    MapMissing(String),
    /// A map refused an update.
    #[error("updating eBPF map {map}")]
    Map {
        /// Which map.
        map: &'static str,
        /// Cause.
        #[source]
        source: aya::maps::MapError,
    },
    /// Attaching a probe failed.
    #[error("attaching {symbol} in {path} for pid {pid}")]
    Attach {
        /// Symbol.
        symbol: String,
        /// Library.
        path: PathBuf,
        /// Process (0: every process).
        pid: u32,
        /// Cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The number of possible CPUs (the size of the per-CPU scratch map) is unknown.
    #[error("reading {path}")]
    Cpus {
        /// What was read.
        path: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Attaching a scheduler tracepoint (for `--follow`) failed.
    #[error("attaching tracepoint {0} (is tracefs mounted at /sys/kernel/tracing?)")]
    Tracepoint(String, #[source] aya::programs::ProgramError),
}

impl AttachError {
    fn map(map: &'static str, source: aya::maps::MapError) -> AttachError {
        AttachError::Map { map, source }
    }
}

/// How the returns of allocation calls are observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReturnProbes {
    /// Not at all (allocations only).
    None,
    /// A classic return probe on every call.
    Classic,
    /// Uprobe sessions: only the calls that need it (sampled, or realloc of a tracked block).
    Sessions,
}

enum Link {
    Uprobe(&'static str, UProbeLinkId),
    /// A uprobe_multi link (a session's, or free's): closing it detaches it.
    Multi(#[allow(dead_code)] OwnedFd),
}

/// Links taken from [`Probes`], still attached until dropped.
#[derive(Default)]
pub struct Detached {
    uprobes: Vec<aya::programs::uprobe::UProbeLink>,
    sessions: Vec<OwnedFd>,
}

impl Detached {
    /// Takes `link` out of `ebpf`'s keeping into this set.
    fn take(&mut self, ebpf: &mut Ebpf, link: Link) {
        match link {
            Link::Uprobe(name, id) => {
                if let Some(program) = ebpf
                    .program_mut(name)
                    .and_then(|p| <&mut UProbe>::try_from(p).ok())
                {
                    if let Ok(link) = program.take_link(id) {
                        self.uprobes.push(link);
                    }
                }
            }
            Link::Multi(fd) => self.sessions.push(fd),
        }
    }

    /// Drops every link at once, one thread each, and waits until all are closed. Closing
    /// a link waits for the kernel's grace periods (for each uprobe); closed one after
    /// another, the ~50 links of a recording with several allocator files took seconds to
    /// detach, while concurrent waits share their grace periods (docs/performance.md,
    /// "Figures quoted from the code").
    pub fn close_all(self) {
        let started = Instant::now();
        let links = self.uprobes.len() + self.sessions.len();
        let closers: Vec<_> = self
            .uprobes
            .into_iter()
            .map(|link| Box::new(link) as Box<dyn Send>)
            .chain(
                self.sessions
                    .into_iter()
                    .map(|fd| Box::new(fd) as Box<dyn Send>),
            )
            .map(|link| {
                std::thread::Builder::new()
                    .name("detach".into())
                    .spawn(move || drop(link))
                    // No thread: the link is dropped here, with the error, one at a time.
                    .map_err(|e| log::debug!("detaching on this thread: {e}"))
            })
            .collect();
        for closer in closers.into_iter().flatten() {
            let _ = closer.join();
        }
        log::debug!("closed {links} links in {:?}", started.elapsed());
    }

    /// Drops the links on a thread of their own (the kernel's detach blocks).
    pub fn close_in_background(self) {
        if self.uprobes.is_empty() && self.sessions.is_empty() {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("detach".into())
            .spawn(move || {
                let (links, started) = (self.uprobes.len() + self.sessions.len(), Instant::now());
                drop(self);
                log::debug!("closed {links} links in {:?}", started.elapsed());
            });
        if let Err(e) = spawned {
            log::debug!("detaching on this thread: {e}");
        }
    }
}

/// The loaded object with its attached links; detaches everything when dropped.
pub struct Probes {
    /// The eBPF object (maps are taken from it by the collector).
    pub ebpf: Ebpf,
    config: KernelConfig,
    /// The object relocated against the maps, for programs loaded for uprobe_multi links
    /// (`None`: the kernel or the object cannot have them; classic uprobes then).
    relocated: Option<session::Relocated>,
    /// `None` until a file is first probed with uprobes (see [`KernelConfig::lazy_uprobes`]).
    uprobes: Option<UprobePrograms>,
    /// The in-process front end's program for uprobe_multi links (else classic uprobes):
    /// one link per process for all its sites, whose removal waits for one grace period,
    /// where the kernel removes classic uprobes one after another (a grace period each,
    /// under a lock: parallel closes do not overlap; docs/performance.md, "What a recording
    /// cost, measured"), which is most of a short command's cost.
    front_end: Option<session::MultiProgram>,
    /// Other programs' samplers' program (`otel_memory`, `ddheap`, Go's runtime), loaded
    /// at the first process that has such probes.
    producers: Option<session::MultiProgram>,
    links: HashMap<u32, Vec<Link>>,
    probed: HashSet<(u32, crate::sys::maps::FileId)>,
    /// Producers' files → the index of their first argument spec in the kernel's table.
    specs: HashMap<crate::sys::maps::FileId, u32>,
    next_spec: u32,
    /// What [`Self::add`] attached (duty cycling), to attach again after
    /// [`Self::suspend`], and whether each is attached now.
    added: Vec<(Scope, Allocator, bool)>,
    sizes: [u64; AllocFn::FUNCTION_SLOTS],
    _tracepoints: Vec<TracePointLinkId>,
    raw_tracepoints: Vec<RawTracePointLinkId>,
    /// Whether the exec tracepoints Go statistics need are attached ([`Self::load`]).
    go_execs_watched: bool,
}

/// The programs of uprobes on allocator functions.
struct UprobePrograms {
    /// The session program for uprobe_multi links, else classic uprobes.
    sessions: Option<session::MultiProgram>,
    /// `free_enter` for uprobe_multi links (with sessions), else classic uprobes.
    frees: Option<session::MultiProgram>,
    /// `sched_process_exit`: a thread's sampling state goes with it.
    _exits: RawTracePointLinkId,
}

mod files;
pub mod handoff;
mod load;
mod reference;

pub use files::program_name;
use files::{load_failed, loaded_uprobe, program, uprobe};
pub use reference::{attach_reference, attach_reference_at};

impl Probes {
    /// Attaches the probes of `allocators` in `scope`, skipping files already probed
    /// there. `free` goes first: a block sampled between the allocation probes and it
    /// would have its free missed and stay "live" forever. Returns the points attached.
    pub fn add(
        &mut self,
        scope: Scope,
        allocators: &[Allocator],
    ) -> Result<Vec<AttachedPoint>, AttachError> {
        let mut points = Vec::new();
        for allocator in allocators {
            // Patched by the front end in the processes that run it: a breakpoint over a
            // patched entry would break it (and its calls are counted there).
            if allocator.file.patched_in_process {
                log::debug!("{}: patched in-process, not probed", allocator.describe());
                continue;
            }
            if !self.probed.insert((scope.key(), allocator.file_id.clone())) {
                continue;
            }
            self.note_sizes(allocator)?;
            points.extend(self.attach_file(scope, allocator)?);
            if self.config.duty_cycled {
                self.added.push((scope, allocator.clone(), true));
            }
        }
        Ok(points)
    }

    /// Duty cycling: opens (the programs count and sample) or closes the gate.
    pub fn set_gate(&mut self, open: bool) -> Result<(), AttachError> {
        let mut map: Array<&mut MapData, u32> = self.map_mut(kernel::maps::GATE)?;
        map.set(0, u32::from(open), 0)
            .map_err(|e| AttachError::map(kernel::maps::GATE, e))
    }

    /// Duty cycling: takes every allocation probe out (the targets stop paying the trap),
    /// to be put back by [`Self::resume`]. The links are handed back, to be closed in the
    /// background (see [`Self::remove`]); what is probed where is remembered. Probes added
    /// while suspended are attached at once (the gate keeps them from counting), and go at
    /// the next suspend.
    #[must_use = "the links stay attached until the Detached is dropped"]
    pub fn suspend(&mut self) -> Detached {
        let mut all = Detached::default();
        for (_, links) in self.links.drain() {
            for link in links {
                all.take(&mut self.ebpf, link);
            }
        }
        for (_, _, attached) in &mut self.added {
            *attached = false;
        }
        all
    }

    /// Duty cycling: attaches again everything [`Self::suspend`] took out.
    pub fn resume(&mut self) -> Result<(), AttachError> {
        for index in 0..self.added.len() {
            let (scope, allocator, attached) = self.added[index].clone();
            if attached {
                continue;
            }
            self.attach_file(scope, &allocator)?;
            self.added[index].2 = true;
        }
        Ok(())
    }

    /// Whether the probes of `file` are attached for `key` (a pid; 0: every process).
    pub fn probes_file(&self, key: u32, file: &crate::sys::maps::FileId) -> bool {
        self.probed.contains(&(key, file.clone()))
    }

    /// Detaches everything attached for `pid` (it exited).
    ///
    /// The links are handed back, not closed: closing one waits for the kernel to remove
    /// its breakpoints and for every program run in flight (an RCU grace period, tens of
    /// milliseconds), a second or more for a process's dozens of links, during which the
    /// caller would not read the ring buffer. [`Detached::close_in_background`] closes them
    /// on a thread of their own.
    #[must_use = "the links stay attached until the Detached is dropped"]
    pub fn remove(&mut self, pid: u32) -> Detached {
        let mut detached = Detached::default();
        for link in self.links.remove(&pid).unwrap_or_default() {
            detached.take(&mut self.ebpf, link);
        }
        self.probed.retain(|(key, _)| *key != pid);
        self.added.retain(|(scope, ..)| scope.key() != pid);
        detached
    }

    /// Detaches every probe and unloads the programs on a thread of its own, which the
    /// caller may join: the links close at once ([`Detached::close_all`]), then the
    /// programs go (closing them waits behind the links' removal in the kernel).
    /// `nobody_left`: no target runs, and nothing else pays for the probes: when they are
    /// the front end's alone, a helper holds the links until allocscope exits and releases
    /// them then ([`handoff`]), so that closing them here does not wait.
    pub fn close_in_background(mut self, nobody_left: bool) -> Option<std::thread::JoinHandle<()>> {
        let keys: Vec<u32> = self.links.keys().copied().collect();
        let mut all = Detached::default();
        for key in keys {
            let Detached { uprobes, sessions } = self.remove(key);
            all.uprobes.extend(uprobes);
            all.sessions.extend(sessions);
        }
        if nobody_left
            && self.uprobes.is_none()
            && all.uprobes.is_empty()
            && !all.sessions.is_empty()
        {
            let links: Vec<_> = all.sessions.iter().map(std::os::fd::AsFd::as_fd).collect();
            match handoff::hold_until_exit(&links) {
                Ok(pid) => log::debug!(
                    "{} links left to a helper until exit (pid {pid})",
                    links.len()
                ),
                Err(e) => log::debug!("closing the links here (no helper: {e})"),
            }
        }
        std::thread::Builder::new()
            .name("unload".into())
            .spawn(move || {
                all.close_all();
                drop(self);
            })
            // No thread: everything was dropped with the closure, here.
            .map_err(|e| log::debug!("unloading on this thread: {e}"))
            .ok()
    }

    /// How often the probe programs ran and how long they took, cumulative since load (the
    /// kernel counts only while statistics are on: see [`super::runs`]). The reference
    /// program and the scheduler tracepoints are left out.
    pub fn program_runs(&self) -> ProgramRuns {
        let mut runs = ProgramRuns::default();
        for (name, program) in self.ebpf.programs() {
            let aya::programs::Program::UProbe(uprobe) = program else {
                continue;
            };
            if name == kernel::programs::BARE {
                continue;
            }
            if let Some(counted) = uprobe.fd().ok().and_then(|fd| runs::of_fd(fd).ok()) {
                runs.add(name, counted);
            }
        }
        let uprobes = self.uprobes.as_ref();
        let multi = [
            (
                kernel::programs::SESSION,
                uprobes.and_then(|u| u.sessions.as_ref()),
            ),
            (
                kernel::programs::FREE,
                uprobes.and_then(|u| u.frees.as_ref()),
            ),
            (kernel::programs::USDT, self.front_end.as_ref()),
            (kernel::programs::PRODUCER, self.producers.as_ref()),
        ];
        for (name, program) in multi {
            if let Some(counted) = program.and_then(|p| runs::of_fd(p.fd()).ok()) {
                runs.add(name, counted);
            }
        }
        runs
    }

    /// Sets the mean sampling interval of every countdown drawn from now on.
    pub fn set_rate(&mut self, interval: u64) -> Result<(), AttachError> {
        let scale_q32 = geometric::scale_q32(interval).ok_or(AttachError::Interval(interval))?;
        let mut map: Array<&mut MapData, sampler_common::Rate> =
            self.map_mut(kernel::maps::RATE)?;
        map.set(
            0,
            sampler_common::Rate {
                interval,
                scale_q32,
            },
            0,
        )
        .map_err(|e| AttachError::map(kernel::maps::RATE, e))
    }

    /// Host mode: makes the programs ignore `pid`.
    pub fn exclude(&mut self, pid: u32) -> Result<(), AttachError> {
        let mut map: BpfHashMap<&mut MapData, u32, u8> = self.map_mut(kernel::maps::EXCLUDED)?;
        map.insert(pid, 1, 0)
            .map_err(|e| AttachError::map(kernel::maps::EXCLUDED, e))
    }

    /// Makes `pid` a target of the followed set: file-wide probes count it (with
    /// `followed_only`), and the kernel follows its new processes from their creation on.
    pub fn follow(&mut self, pid: u32) -> Result<(), AttachError> {
        let mut map: BpfHashMap<&mut MapData, u32, u8> = self.map_mut(kernel::maps::FOLLOWED)?;
        map.insert(pid, FOLLOWED_TARGET, 0)
            .map_err(|e| AttachError::map(kernel::maps::FOLLOWED, e))
    }

    /// Remembers block `address` of `pid`, sampled at `timestamp_ns` before the probes
    /// were attached (an early record), as live: its free is seen from now on. False when
    /// the live map is full.
    pub fn track_live(
        &mut self,
        pid: u32,
        address: u64,
        timestamp_ns: u64,
    ) -> Result<bool, AttachError> {
        let mut map: BpfHashMap<&mut MapData, sampler_common::LiveKey, u64> =
            self.map_mut(kernel::maps::LIVE)?;
        let key = sampler_common::LiveKey {
            pid,
            pad: 0,
            address,
        };
        Ok(map.insert(key, timestamp_ns, 0).is_ok())
    }

    /// Tells the kernel that `pid` carries an in-process front end (found by its region or
    /// its producer's probes, where its library's `ready` probe fired before ours were
    /// attached): file-wide probes of the functions it serves leave its calls to it.
    pub fn carries_front_end(&mut self, pid: u32) -> Result<(), AttachError> {
        let mut map: BpfHashMap<&mut MapData, u32, u8> = self.map_mut(kernel::maps::FRONT_END)?;
        map.insert(pid, 1, 0)
            .map_err(|e| AttachError::map(kernel::maps::FRONT_END, e))
    }

    /// Has the kernel read `pid`'s Go runtime statistics and rate (`at`) when its last
    /// thread exits, or when it execs another program, before its memory is gone.
    pub fn watch_go_stats(
        &mut self,
        pid: u32,
        mut at: sampler_common::GoStatsAt,
    ) -> Result<(), AttachError> {
        self.watch_go_execs();
        let mut map: BpfHashMap<&mut MapData, u32, sampler_common::GoStatsAt> =
            self.map_mut(kernel::maps::GO_STATS)?;
        at.len = at.len.min(sampler_common::GO_STATS_MAX as u32);
        map.insert(pid, at, 0)
            .map_err(|e| AttachError::map(kernel::maps::GO_STATS, e))
    }

    /// Whether the kernel knows that `pid` carries the front end (its library's `ready`
    /// probe fired, or its parent carried it at its fork): the kernel's exec probe keeps
    /// that true (it forgets it at an exec), so nothing needs telling.
    pub fn knows_front_end(&self, pid: u32) -> bool {
        let Some(map) = self.ebpf.map(kernel::maps::FRONT_END) else {
            return false;
        };
        BpfHashMap::<&MapData, u32, u8>::try_from(map).is_ok_and(|map| map.get(&pid, 0).is_ok())
    }

    /// Undoes [`Self::carries_front_end`]: `pid` exec'd a program without one since.
    pub fn lacks_front_end(&mut self, pid: u32) {
        if let Ok(mut map) =
            self.map_mut::<BpfHashMap<&mut MapData, u32, u8>>(kernel::maps::FRONT_END)
        {
            // Absent when the kernel's exec probe was first: nothing to remove.
            let _ = map.remove(&pid);
        }
    }

    /// `pid`'s standing in the kernel's followed set ([`FOLLOWED_TARGET`],
    /// [`sampler_common::FOLLOWED_PENDING`]), `None` when it is not in it.
    pub fn standing(&self, pid: u32) -> Option<u8> {
        let map = self.ebpf.map(kernel::maps::FOLLOWED)?;
        let map: BpfHashMap<&MapData, u32, u8> = BpfHashMap::try_from(map).ok()?;
        map.get(&pid, 0).ok()
    }

    /// Takes `pid` out of the followed set (a pending process `--comm` does not want, one
    /// that exited) and drops its per-process counters: file-wide probes ignore it now.
    pub fn unfollow(&mut self, pid: u32) {
        if let Ok(mut map) =
            self.map_mut::<BpfHashMap<&mut MapData, u32, u8>>(kernel::maps::FOLLOWED)
        {
            let _ = map.remove(&pid);
        }
        self.forget_counters(pid);
    }

    /// Removes `pid`'s entry from the per-process counters of file-wide probes.
    pub fn forget_counters(&mut self, pid: u32) {
        type Counters<'a> = PerCpuHashMap<&'a mut MapData, u32, sampler_common::ProcessCounters>;
        if let Ok(mut map) = self.map_mut::<Counters>(kernel::maps::HOST_COUNTERS) {
            let _ = map.remove(&pid);
        }
    }
}
