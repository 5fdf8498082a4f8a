//! Loading the eBPF object and attaching its probes, process by process or host-wide.
//!
//! [`Probes::load`] loads every program once; [`Probes::add`] then attaches one process's
//! allocators (or, host-wide, one allocator file for every process), at any time during a
//! recording: processes found later (`--comm`, `--follow`, a late `dlopen`) are added the
//! same way. Per process, attachment is scoped in the kernel (`UProbeScope::OneProcess`,
//! the session link's pid): the breakpoint is installed only in that address space, so no
//! other process pays the trap (DESIGN.md §5). Host-wide (`--all`, and `--follow`/`--comm`
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
pub(super) static SAMPLER_OBJECT: &[u8] =
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
    /// counted in-process alone usually never is, and their verification is ~20 ms.
    pub lazy_uprobes: bool,
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
    /// a link waits for the kernel's grace periods (about 0.1 s here for each uprobe);
    /// closed one after another, the ~50 links of a recording with several allocator
    /// files took 7 s to detach, while concurrent waits share their grace periods.
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
    /// where the kernel removes classic uprobes one after another (~0.1 s each here, under
    /// a lock: parallel closes do not overlap), which is most of a short command's cost.
    front_end: Option<session::MultiProgram>,
    links: HashMap<u32, Vec<Link>>,
    probed: HashSet<(u32, super::maps::FileId)>,
    /// Producers' files → the index of their first argument spec in the kernel's table.
    specs: HashMap<super::maps::FileId, u32>,
    next_spec: u32,
    /// What [`Self::add`] attached (duty cycling), to attach again after
    /// [`Self::suspend`], and whether each is attached now.
    added: Vec<(Scope, Allocator, bool)>,
    sizes: [u64; AllocFn::FUNCTION_SLOTS],
    _tracepoints: Vec<TracePointLinkId>,
    _raw_tracepoints: Vec<RawTracePointLinkId>,
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

/// Loads `name` from the relocated object for uprobe_multi links, or says why not.
fn load_multi(
    relocated: &Option<session::Relocated>,
    name: &str,
    attach_type: u32,
) -> Option<session::MultiProgram> {
    relocated
        .as_ref()?
        .load(name, attach_type)
        .map_err(|why| log::info!("uprobe_multi links unavailable for {name}: {why}"))
        .ok()
}

impl Probes {
    /// Loads the sampler with `config` (every program verified now, nothing attached yet but
    /// the scheduler tracepoints).
    pub fn load(config: KernelConfig) -> Result<Probes, AttachError> {
        let scale =
            geometric::scale_q32(config.interval).ok_or(AttachError::Interval(config.interval))?;
        let log = u8::from(config.log);
        let track = u8::from(config.track_frees.is_some());
        let host = u8::from(config.host);
        let followed_only = u8::from(config.host && config.followed_only);
        let watch_execs = u8::from(config.watch_execs);
        let stack_bytes = u64::from(config.stack_bytes);
        let duty_cycled = u8::from(config.duty_cycled);
        let possible_cpus = aya::util::nr_cpus()
            .map_err(|(path, source)| AttachError::Cpus { path, source })?
            as u32;
        let started = std::time::Instant::now();
        let task_pid_offset = if config.follow || config.followed_only {
            super::btf::task_pid_offset()
        } else {
            None
        };
        let task_pid_offset_value = u64::from(task_pid_offset.unwrap_or(0));
        let mut ebpf = EbpfLoader::new()
            .btf(None)
            .override_global(kernel::globals::INTERVAL, &config.interval, true)
            .override_global(kernel::globals::SCALE_Q32, &scale, true)
            .override_global(kernel::globals::LOG_ENABLED, &log, true)
            .override_global(kernel::globals::TRACK_FREES, &track, true)
            .override_global(kernel::globals::HOST_MODE, &host, true)
            .override_global(kernel::globals::FOLLOWED_ONLY, &followed_only, true)
            .override_global(kernel::globals::WATCH_EXECS, &watch_execs, true)
            .override_global(kernel::globals::STACK_BYTES, &stack_bytes, true)
            .override_global(kernel::globals::DUTY_CYCLED, &duty_cycled, true)
            .override_global(
                kernel::globals::TASK_PID_OFFSET,
                &task_pid_offset_value,
                true,
            )
            .map_max_entries(kernel::maps::SCRATCH, possible_cpus)
            .map_max_entries(kernel::maps::LIVE, config.track_frees.unwrap_or(1).max(1))
            .map_max_entries(kernel::maps::SAMPLES, config.ring_buffer)
            .load(SAMPLER_OBJECT)?;
        log::debug!("eBPF object loaded in {:?}", started.elapsed());
        // The session program serves allocation entries through uprobe_multi links also
        // without return probes (`--alloc-only`): they detach in one grace period per file,
        // where classic uprobes take one each (50 of them: 5 s).
        let relocated = session::Relocated::new(&ebpf, SAMPLER_OBJECT)
            .map_err(|why| log::info!("uprobe_multi links unavailable: {why}"))
            .ok();
        // The in-process front end's probes: cheap to load, attached only where a process
        // carries the library.
        let front_end = load_multi(
            &relocated,
            kernel::programs::USDT,
            session::BPF_TRACE_UPROBE_MULTI,
        );
        if front_end.is_none() {
            loaded_uprobe(&mut ebpf, kernel::programs::USDT)?;
        }
        let mut tracepoints = Vec::new();
        let mut raw_tracepoints = Vec::new();
        if config.follow || config.followed_only {
            if task_pid_offset.is_some() {
                raw_tracepoints.push(attach_raw_tracepoint(
                    &mut ebpf,
                    kernel::programs::NEW_TASK_RAW,
                    kernel::programs::NEW_TASK,
                )?);
            } else {
                tracepoints.push(attach_tracepoint(
                    &mut ebpf,
                    kernel::programs::NEW_TASK,
                    "task",
                    kernel::programs::NEW_TASK,
                )?);
            }
        }
        if config.follow || config.followed_only || config.watch_execs {
            raw_tracepoints.push(attach_raw_tracepoint(
                &mut ebpf,
                kernel::programs::EXEC,
                "sched_process_exec",
            )?);
        }
        let mut probes = Probes {
            ebpf,
            config,
            relocated,
            uprobes: None,
            front_end,
            links: HashMap::new(),
            probed: HashSet::new(),
            specs: HashMap::new(),
            next_spec: 0,
            added: Vec::new(),
            sizes: [0; AllocFn::FUNCTION_SLOTS],
            _tracepoints: tracepoints,
            _raw_tracepoints: raw_tracepoints,
        };
        if !probes.config.lazy_uprobes {
            probes.uprobe_programs()?;
        }
        log::debug!("eBPF programs loaded in {:?}", started.elapsed());
        Ok(probes)
    }

    /// The programs of uprobes on allocator functions, loaded at the first call.
    fn uprobe_programs(&mut self) -> Result<&UprobePrograms, AttachError> {
        if self.uprobes.is_none() {
            let started = std::time::Instant::now();
            let tracking = self.config.track_frees.is_some();
            // Without return probes the same program goes on plain uprobe_multi links: a
            // session link still arms a return probe for every call its program filters
            // out (another process hitting the same breakpoint for another tracer: +300 ns
            // a call, measured). The session program serves allocation entries through
            // uprobe_multi links also without return probes (`--alloc-only`): they detach
            // in one grace period per file, where classic uprobes take one each (50 of
            // them: 5 s).
            let attach_type = if tracking {
                session::BPF_TRACE_UPROBE_SESSION
            } else {
                session::BPF_TRACE_UPROBE_MULTI
            };
            let sessions = if self.config.sessions {
                load_multi(&self.relocated, kernel::programs::SESSION, attach_type)
            } else {
                None
            };
            let frees = if tracking && sessions.is_some() {
                load_multi(
                    &self.relocated,
                    kernel::programs::FREE,
                    session::BPF_TRACE_UPROBE_MULTI,
                )
            } else {
                None
            };
            let mut programs: Vec<&'static str> = Vec::new();
            if tracking && frees.is_none() {
                programs.push(kernel::programs::FREE);
            }
            if sessions.is_none() {
                programs.extend(AllocFn::ALL.iter().map(|&f| program_name(f)));
                if tracking {
                    programs.push(kernel::programs::RETURN);
                }
            }
            for name in programs {
                loaded_uprobe(&mut self.ebpf, name)?;
            }
            // Thread exits drop the countdown state these programs keep per thread.
            let exits = attach_raw_tracepoint(
                &mut self.ebpf,
                kernel::programs::EXIT,
                "sched_process_exit",
            )?;
            let returns = match (tracking, &sessions) {
                (false, _) => ReturnProbes::None,
                (true, Some(_)) => ReturnProbes::Sessions,
                (true, None) => ReturnProbes::Classic,
            };
            log::debug!(
                "uprobe programs loaded in {:?}; allocation returns observed by: {returns:?}",
                started.elapsed()
            );
            self.uprobes = Some(UprobePrograms {
                sessions,
                frees,
                _exits: exits,
            });
        }
        Ok(self.uprobes.as_ref().expect("loaded above"))
    }

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
    pub fn probes_file(&self, key: u32, file: &super::maps::FileId) -> bool {
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
    pub fn close_in_background(mut self) -> Option<std::thread::JoinHandle<()>> {
        let keys: Vec<u32> = self.links.keys().copied().collect();
        let mut all = Detached::default();
        for key in keys {
            let Detached { uprobes, sessions } = self.remove(key);
            all.uprobes.extend(uprobes);
            all.sessions.extend(sessions);
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
        ];
        for (name, program) in multi {
            if let Some(counted) = program.and_then(|p| runs::of_fd(p.fd()).ok()) {
                runs.add(name, counted);
            }
        }
        runs
    }

    /// Attaches the reference program (it counts, nothing else) at `offset` of the file at
    /// `path`, in our own process only: the trap calibration's probe.
    pub fn attach_bare(&mut self, path: &Path, offset: u64) -> Result<Detached, AttachError> {
        let pid = std::process::id();
        let id = attach_reference_program(&mut self.ebpf, path, path, offset, pid, "trap_target")?;
        let mut detached = Detached::default();
        detached.uprobes.extend(
            uprobe(&mut self.ebpf, kernel::programs::BARE)?
                .take_link(id)
                .ok(),
        );
        Ok(detached)
    }

    /// Runs of the reference program so far (`None`: not loaded, or no statistics).
    pub fn bare_runs(&self) -> Option<runs::Runs> {
        let program = self.ebpf.program(kernel::programs::BARE)?;
        runs::of_fd(program.fd().ok()?).ok()
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

    fn map_mut<'a, T: TryFrom<&'a mut aya::maps::Map>>(
        &'a mut self,
        name: &str,
    ) -> Result<T, AttachError> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| AttachError::MapMissing(name.to_owned()))?;
        T::try_from(map).map_err(|_| AttachError::MapMissing(format!("{name} of the right type")))
    }

    /// Raises the kernel's per-function code sizes to cover `allocator`'s functions.
    fn note_sizes(&mut self, allocator: &Allocator) -> Result<(), AttachError> {
        let mut changed = Vec::new();
        for f in &allocator.file.functions {
            let index = f.function as usize;
            if f.size > self.sizes[index] {
                self.sizes[index] = f.size;
                changed.push((index as u32, f.size));
            }
        }
        if changed.is_empty() {
            return Ok(());
        }
        let mut map: Array<&mut MapData, u64> = self.map_mut(kernel::maps::FUNCTION_SIZES)?;
        for (index, size) in changed {
            map.set(index, size, 0)
                .map_err(|e| AttachError::map(kernel::maps::FUNCTION_SIZES, e))?;
        }
        Ok(())
    }

    /// Attaches the probes of one allocator file in `scope`: the front end's USDT sites, or
    /// the frees then the allocation functions.
    fn attach_file(
        &mut self,
        scope: Scope,
        allocator: &Allocator,
    ) -> Result<Vec<AttachedPoint>, AttachError> {
        if let Some(front_end) = &allocator.file.front_end {
            return self.attach_front_end(scope, allocator, front_end);
        }
        if let Some(producer) = &allocator.file.producer {
            return self.attach_producer(scope, allocator, producer);
        }
        self.uprobe_programs()?;
        let mut points = Vec::new();
        if self.config.track_frees.is_some() {
            points.extend(self.attach_frees(scope, allocator)?);
        }
        points.extend(self.attach_allocations(scope, allocator)?);
        Ok(points)
    }

    /// Another program's allocation probes (`otel_memory`, `ddheap`): each site's argument
    /// spec goes into the kernel's table (once per file), then every site is attached as
    /// one link, `free` sites first (frees tracked), semaphores raised while attached.
    fn attach_producer(
        &mut self,
        scope: Scope,
        allocator: &Allocator,
        producer: &super::usdt::Producer,
    ) -> Result<Vec<AttachedPoint>, AttachError> {
        use sampler_common::usdt::KIND_FREE;
        if self.front_end.is_none() {
            return Err(AttachError::MissingProgram(format!(
                "{} probes need uprobe_multi links (kernel ≥ 6.6)",
                producer.provider
            )));
        }
        let tracking = self.config.track_frees.is_some();
        let mut sites: Vec<&(super::usdt::Site, sampler_common::usdt::UsdtSpec)> = producer
            .sites
            .iter()
            .filter(|(_, spec)| tracking || spec.kind != KIND_FREE)
            .collect();
        sites.sort_by_key(|(_, spec)| spec.kind != KIND_FREE);
        let base = match self.specs.get(&allocator.file_id) {
            Some(&base) => base,
            None => {
                let base = self.next_spec;
                let count = producer.sites.len() as u32;
                if base + count > sampler_common::usdt::MAX_SPECS {
                    return Err(AttachError::MissingProgram(format!(
                        "room for {} probe specs ({} in use)",
                        count, base
                    )));
                }
                let mut table: Array<&mut MapData, sampler_common::usdt::UsdtSpec> =
                    self.map_mut(kernel::maps::USDT_SPECS)?;
                for (index, (_, spec)) in producer.sites.iter().enumerate() {
                    table
                        .set(base + index as u32, spec, 0)
                        .map_err(|e| AttachError::map(kernel::maps::USDT_SPECS, e))?;
                }
                self.next_spec += count;
                self.specs.insert(allocator.file_id.clone(), base);
                base
            }
        };
        let index_of = |site: &super::usdt::Site| {
            producer
                .sites
                .iter()
                .position(|(s, _)| s == site)
                .unwrap_or(0) as u32
        };
        let offsets: Vec<u64> = sites.iter().map(|(site, _)| site.file_offset).collect();
        let cookies: Vec<u64> = sites
            .iter()
            .map(|(site, _)| sampler_common::cookie::producer(base + index_of(site), scope.slot()))
            .collect();
        let semaphores: Vec<u64> = sites
            .iter()
            .map(|(site, _)| site.semaphore.unwrap_or(0))
            .collect();
        let any_semaphore = semaphores.iter().any(|&s| s != 0);
        let names: Vec<String> = sites
            .iter()
            .map(|(site, _)| format!("{}:{}", site.provider, site.name))
            .collect();
        if offsets.is_empty() {
            return Ok(Vec::new());
        }
        let program = self.front_end.as_ref().expect("checked above");
        let link = program
            .link_with_semaphores(
                &allocator.path,
                scope.key(),
                &offsets,
                &cookies,
                any_semaphore.then_some(semaphores.as_slice()),
            )
            .map_err(|source| AttachError::Attach {
                symbol: names[0].clone(),
                path: allocator.shown.clone(),
                pid: scope.key(),
                source: Box::new(source),
            })?;
        self.links
            .entry(scope.key())
            .or_default()
            .push(Link::Multi(link));
        let points = sites
            .iter()
            .zip(names)
            .map(|((site, _), name)| AttachedPoint {
                pid: scope.key(),
                probe: ProbeKind::Usdt(name),
                path: allocator.shown.clone(),
                file_offset: site.file_offset,
                placement: Placement {
                    offset: 0,
                    instruction: "nop".to_owned(),
                    emulated: true,
                    moved: Vec::new(),
                },
            });
        Ok(points.collect())
    }

    /// The in-process front end's `free` sites (frees tracked) then its `alloc` sites, on
    /// the 5-byte nop where the kernel optimises such probes, as one link (one program,
    /// the cookie telling a `free` site from an `alloc` one).
    fn attach_front_end(
        &mut self,
        scope: Scope,
        allocator: &Allocator,
        front_end: &super::usdt::FrontEnd,
    ) -> Result<Vec<AttachedPoint>, AttachError> {
        let slot = u64::from(scope.slot());
        let mut sites: Vec<(&super::usdt::Site, u64)> = Vec::new();
        if self.config.track_frees.is_some() {
            let free = sampler_common::cookie::with_front_end_free(slot);
            sites.extend(front_end.frees.iter().map(|site| (site, free)));
        }
        sites.extend(front_end.allocs.iter().map(|site| (site, slot)));
        // At the 1-byte nop (an int3 trap) unless asked: an optimised site's code calls a
        // trampoline mapping that a fork does not copy (Linux 6.18), so a child forked
        // without exec would crash at the site.
        let optimized = super::usdt_optimized() && self.config.usdt_nop5;
        let nop5 = |site: &super::usdt::Site| site.optimizable && optimized;
        let offsets: Vec<u64> = sites
            .iter()
            .map(|(site, _)| site.file_offset + u64::from(nop5(site)))
            .collect();
        let cookies: Vec<u64> = sites.iter().map(|&(_, cookie)| cookie).collect();
        let names: Vec<String> = sites
            .iter()
            .map(|(site, _)| format!("{}:{}", site.provider, site.name))
            .collect();
        if offsets.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(multi) = &self.front_end {
            let link = multi_link(multi, scope, allocator, &offsets, &cookies, &names[0])?;
            self.links
                .entry(scope.key())
                .or_default()
                .push(Link::Multi(link));
        } else {
            for ((name, &offset), &cookie) in names.iter().zip(&offsets).zip(&cookies) {
                let id = self.attach_uprobe(
                    kernel::programs::USDT,
                    scope,
                    allocator,
                    offset,
                    cookie,
                    name,
                )?;
                self.links
                    .entry(scope.key())
                    .or_default()
                    .push(Link::Uprobe(kernel::programs::USDT, id));
            }
        }
        let points = sites
            .iter()
            .zip(names)
            .map(|(&(site, _), name)| AttachedPoint {
                pid: scope.key(),
                probe: ProbeKind::Usdt(name),
                path: allocator.shown.clone(),
                file_offset: site.file_offset,
                placement: Placement {
                    offset: u64::from(nop5(site)),
                    instruction: if nop5(site) {
                        "nop5 (optimised)"
                    } else {
                        "nop"
                    }
                    .to_owned(),
                    emulated: true,
                    moved: Vec::new(),
                },
            });
        Ok(points.collect())
    }

    fn attach_frees(
        &mut self,
        scope: Scope,
        allocator: &Allocator,
    ) -> Result<Vec<AttachedPoint>, AttachError> {
        let frees = &allocator.file.frees;
        let points = frees
            .iter()
            .map(|free| AttachedPoint {
                pid: scope.key(),
                probe: ProbeKind::Free(free.symbol.clone()),
                path: allocator.shown.clone(),
                file_offset: free.file_offset,
                placement: free.probe.clone(),
            })
            .collect();
        let offsets: Vec<u64> = frees
            .iter()
            .map(|free| free.file_offset + free.probe.offset)
            .collect();
        let cookie = u64::from(scope.slot());
        let program = self.uprobes.as_ref().and_then(|u| u.frees.as_ref());
        if let Some(program) = program.filter(|_| !offsets.is_empty()) {
            let cookies = vec![cookie; offsets.len()];
            let link = multi_link(
                program,
                scope,
                allocator,
                &offsets,
                &cookies,
                "free functions",
            )?;
            self.links
                .entry(scope.key())
                .or_default()
                .push(Link::Multi(link));
            return Ok(points);
        }
        for (free, offset) in frees.iter().zip(offsets) {
            let id = self.attach_uprobe(
                kernel::programs::FREE,
                scope,
                allocator,
                offset,
                cookie,
                &free.symbol,
            )?;
            self.links
                .entry(scope.key())
                .or_default()
                .push(Link::Uprobe(kernel::programs::FREE, id));
        }
        Ok(points)
    }

    fn attach_allocations(
        &mut self,
        scope: Scope,
        allocator: &Allocator,
    ) -> Result<Vec<AttachedPoint>, AttachError> {
        let functions = &allocator.file.functions;
        // glibc's malloc is the innermost; another's may wrap it (or reach another).
        let outer = allocator.file.family != super::allocator::Family::Glibc;
        let point = |probe: ProbeKind, f: &super::allocator::Function| AttachedPoint {
            pid: scope.key(),
            probe,
            path: allocator.shown.clone(),
            file_offset: f.file_offset,
            placement: f.probe.clone(),
        };
        let mut points = Vec::new();
        if let Some(sessions) = self.uprobes.as_ref().and_then(|u| u.sessions.as_ref()) {
            let offsets: Vec<u64> = functions
                .iter()
                .map(|f| f.file_offset + f.probe.offset)
                .collect();
            let cookies: Vec<u64> = functions
                .iter()
                .map(|f| f.cookie(scope.slot(), outer))
                .collect();
            let what = "allocation functions (session)";
            let link = multi_link(sessions, scope, allocator, &offsets, &cookies, what)?;
            self.links
                .entry(scope.key())
                .or_default()
                .push(Link::Multi(link));
            // Without frees tracked the link is a plain uprobe_multi one: entries only.
            let kind = |symbol: String| match self.config.track_frees {
                Some(_) => ProbeKind::Session(symbol),
                None => ProbeKind::Entry(symbol),
            };
            points.extend(functions.iter().map(|f| point(kind(f.symbol.clone()), f)));
            return Ok(points);
        }
        for f in functions {
            let offset = f.file_offset + f.probe.offset;
            let mut programs = vec![(program_name(f.function), ProbeKind::Entry(f.symbol.clone()))];
            if self.config.track_frees.is_some() {
                // At the same point as the entry, where `[rsp]` is still the return address.
                programs.push((
                    kernel::programs::RETURN,
                    ProbeKind::Return(f.symbol.clone()),
                ));
            }
            for (name, kind) in programs {
                let cookie = f.cookie(scope.slot(), outer);
                let id = self.attach_uprobe(name, scope, allocator, offset, cookie, &f.symbol)?;
                self.links
                    .entry(scope.key())
                    .or_default()
                    .push(Link::Uprobe(name, id));
                points.push(point(kind, f));
            }
        }
        Ok(points)
    }

    fn attach_uprobe(
        &mut self,
        name: &'static str,
        scope: Scope,
        allocator: &Allocator,
        offset: u64,
        cookie: u64,
        symbol: &str,
    ) -> Result<UProbeLinkId, AttachError> {
        let program = uprobe(&mut self.ebpf, name)?;
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: Some(cookie),
        };
        program
            .attach(point, &allocator.path, scope.uprobe_scope())
            .map_err(|source| AttachError::Attach {
                symbol: symbol.to_owned(),
                path: allocator.shown.clone(),
                pid: scope.key(),
                source: Box::new(source),
            })
    }
}

/// Attaches the benchmark's reference probe (counts calls, nothing else) to malloc of the
/// target's first allocator.
pub fn attach_reference(target: &Target) -> Result<Probes, AttachError> {
    let config = KernelConfig {
        interval: 512 * 1024,
        log: false,
        track_frees: None,
        ring_buffer: 4 << 20,
        stack_bytes: 0,
        sessions: false,
        usdt_nop5: false,
        host: false,
        follow: false,
        followed_only: false,
        watch_execs: false,
        duty_cycled: false,
        lazy_uprobes: true,
    };
    let mut ebpf = EbpfLoader::new().load(SAMPLER_OBJECT)?;
    let allocator = target
        .allocators
        .first()
        .ok_or_else(|| AttachError::MissingProgram("no allocator".into()))?;
    let malloc = allocator
        .file
        .functions
        .iter()
        .find(|f| f.function == AllocFn::Malloc)
        .ok_or_else(|| AttachError::MissingProgram("malloc".into()))?;
    attach_reference_program(
        &mut ebpf,
        &allocator.path,
        &allocator.shown,
        malloc.file_offset + malloc.probe.offset,
        target.pid,
        "malloc",
    )?;
    Ok(Probes {
        ebpf,
        config,
        relocated: None,
        uprobes: None,
        front_end: None,
        links: HashMap::new(),
        probed: HashSet::new(),
        specs: HashMap::new(),
        next_spec: 0,
        added: Vec::new(),
        sizes: [0; AllocFn::FUNCTION_SLOTS],
        _tracepoints: Vec::new(),
        _raw_tracepoints: Vec::new(),
    })
}

/// Attaches the reference program (it counts, nothing else) at `offset` of the file at
/// `path` (`shown` in errors), in process `pid` only.
fn attach_reference_program(
    ebpf: &mut Ebpf,
    path: &Path,
    shown: &Path,
    offset: u64,
    pid: u32,
    symbol: &str,
) -> Result<UProbeLinkId, AttachError> {
    let point = UProbeAttachPoint {
        location: UProbeAttachLocation::AbsoluteOffset(offset),
        cookie: None,
    };
    let scope = Scope::Process { pid, slot: 0 };
    loaded_uprobe(ebpf, kernel::programs::BARE)?
        .attach(point, path, scope.uprobe_scope())
        .map_err(|source| AttachError::Attach {
            symbol: symbol.to_owned(),
            path: shown.to_owned(),
            pid,
            source: Box::new(source),
        })
}

/// Links `program` at `offsets` of `allocator`'s file in `scope`, one cookie each;
/// `what` names the functions in an error.
fn multi_link(
    program: &session::MultiProgram,
    scope: Scope,
    allocator: &Allocator,
    offsets: &[u64],
    cookies: &[u64],
    what: &str,
) -> Result<OwnedFd, AttachError> {
    program
        .link(&allocator.path, scope.key(), offsets, cookies)
        .map_err(|source| AttachError::Attach {
            symbol: what.to_owned(),
            path: allocator.shown.clone(),
            pid: scope.key(),
            source: Box::new(source),
        })
}

/// The uprobe program `name` of the object (loaded by [`Probes::load`]).
fn uprobe<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, AttachError> {
    program(ebpf, name)
}

/// Program `name` of the object, as its type `T` (`UProbe`, `TracePoint`…).
fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, AttachError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| AttachError::MissingProgram(name.to_owned()))?
        .try_into()
        .map_err(load_failed(name))
}

/// The error of loading (or finding) program `name`.
fn load_failed(name: &str) -> impl FnOnce(aya::programs::ProgramError) -> AttachError + '_ {
    move |source| AttachError::LoadProgram {
        program: name.to_owned(),
        source,
    }
}

/// The uprobe program `name` of the object, loaded into the kernel (verified).
fn loaded_uprobe<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, AttachError> {
    let program = uprobe(ebpf, name)?;
    program.load().map_err(load_failed(name))?;
    Ok(program)
}

/// Loads tracepoint program `name` and attaches it to `category`/`event`, mounting tracefs
/// first if nothing has (a fresh machine often has it unmounted).
fn attach_tracepoint(
    ebpf: &mut Ebpf,
    name: &str,
    category: &str,
    event: &str,
) -> Result<TracePointLinkId, AttachError> {
    ensure_tracefs();
    let program: &mut TracePoint = program(ebpf, name)?;
    program.load().map_err(load_failed(name))?;
    program
        .attach(category, event)
        .map_err(|e| AttachError::Tracepoint(format!("{category}/{event}"), e))
}

/// Loads raw tracepoint program `name` and attaches it to `event` (no tracefs needed).
fn attach_raw_tracepoint(
    ebpf: &mut Ebpf,
    name: &str,
    event: &str,
) -> Result<RawTracePointLinkId, AttachError> {
    let program: &mut RawTracePoint = program(ebpf, name)?;
    program.load().map_err(load_failed(name))?;
    program
        .attach(event)
        .map_err(|e| AttachError::Tracepoint(event.to_owned(), e))
}

/// Mounts tracefs at /sys/kernel/tracing unless it (or debugfs's tracing) is there.
fn ensure_tracefs() {
    let mounted = |dir: &str| std::path::Path::new(dir).join("events").is_dir();
    if mounted("/sys/kernel/tracing") || mounted("/sys/kernel/debug/tracing") {
        return;
    }
    let status = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .status();
    if !status.is_ok_and(|s| s.success()) {
        log::warn!("tracefs is not mounted and mounting it at /sys/kernel/tracing failed");
    }
}

/// The eBPF program probing `function`'s entry.
pub fn program_name(function: AllocFn) -> &'static str {
    match function {
        AllocFn::Malloc => kernel::programs::MALLOC,
        AllocFn::Calloc => kernel::programs::CALLOC,
        AllocFn::Realloc => kernel::programs::REALLOC,
        AllocFn::PosixMemalign => kernel::programs::POSIX_MEMALIGN,
        AllocFn::AlignedAlloc => kernel::programs::ALIGNED_ALLOC,
        AllocFn::Memalign => kernel::programs::MEMALIGN,
        AllocFn::Valloc => kernel::programs::VALLOC,
        AllocFn::Pvalloc => kernel::programs::PVALLOC,
        AllocFn::New => kernel::programs::NEW,
    }
}
