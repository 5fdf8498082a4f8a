//! Loading the eBPF object and attaching its uprobes, scoped per process in the kernel.
//!
//! Attachment is by file and symbol with `UProbeScope::OneProcess(pid)`: the kernel installs
//! the breakpoint only in that process's address space, so no other process pays the trap.
//! Dropping [`Probes`] (or the process dying, even by SIGKILL) closes the file descriptors
//! and the kernel removes every breakpoint: the target is never left patched.

use std::{num::NonZeroU32, path::PathBuf};

use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
        UProbe,
    },
    Ebpf, EbpfLoader,
};
use sampler_common::{geometric, AllocFn, MAX_TARGETS};

use super::{allocator::Allocator, prologue::Placement, session};

/// The eBPF object built by build.rs.
static SAMPLER_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sampler"));

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
    /// Try uprobe sessions for the returns (else classic return probes on every call).
    pub sessions: bool,
}

/// One process to probe and the allocator found in it.
#[derive(Clone, Debug)]
pub struct Target {
    /// Process id.
    pub pid: u32,
    /// Its allocator.
    pub allocator: Allocator,
}

/// What a probe point observes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// An allocation function's entry.
    Entry(AllocFn),
    /// An allocation function's return.
    Return(AllocFn),
    /// `free`'s entry.
    Free,
    /// An allocation function's entry and, when asked, its return (uprobe session).
    Session(AllocFn),
}

impl std::fmt::Display for ProbeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeKind::Entry(function) => write!(f, "{}", function.symbol()),
            ProbeKind::Return(function) => write!(f, "{} (return)", function.symbol()),
            ProbeKind::Free => write!(f, "free"),
            ProbeKind::Session(function) => write!(f, "{} (session)", function.symbol()),
        }
    }
}

/// A probe point actually attached (reported with `--verbose`).
#[derive(Clone, Debug)]
pub struct AttachedPoint {
    /// Process id.
    pub pid: u32,
    /// What it observes.
    pub probe: ProbeKind,
    /// Library path.
    pub path: PathBuf,
    /// Where in the function the probe sits.
    pub placement: Placement,
}

/// Errors while loading or attaching.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The interval cannot be represented by the kernel's sampler.
    #[error("sampling interval {0} is out of range")]
    Interval(u64),
    /// More targets than the kernel side has counter slots.
    #[error("{0} target processes: at most {MAX_TARGETS} per session")]
    TooManyTargets(usize),
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
    /// Loading or attaching a program failed.
    #[error("attaching {symbol} in {path} for pid {pid}")]
    Attach {
        /// Symbol.
        symbol: &'static str,
        /// Library.
        path: PathBuf,
        /// Process.
        pid: u32,
        /// Cause.
        #[source]
        source: aya::programs::ProgramError,
    },
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

/// The loaded object with its attached links; detaches everything when dropped.
pub struct Probes {
    /// The eBPF object (maps are taken from it by the collector).
    pub ebpf: Ebpf,
    /// What was attached.
    pub points: Vec<AttachedPoint>,
    /// How allocation returns are observed.
    pub returns: ReturnProbes,
    /// The session links, when used (closed on drop).
    _sessions: Option<session::Sessions>,
}

/// Loads the sampler with `config` and attaches the entry probes for every target. Target
/// `i` gets counter slot `i` (the probes' attach cookie): `COUNTERS[i]` holds its exact counts.
pub fn attach(config: KernelConfig, targets: &[Target]) -> Result<Probes, AttachError> {
    if targets.len() > MAX_TARGETS as usize {
        return Err(AttachError::TooManyTargets(targets.len()));
    }
    let scale =
        geometric::scale_q32(config.interval).ok_or(AttachError::Interval(config.interval))?;
    let mut sizes = [0u64; AllocFn::COUNT];
    for target in targets {
        for f in &target.allocator.functions {
            sizes[f.function as usize] = sizes[f.function as usize].max(f.size);
        }
    }
    let log = u8::from(config.log);
    let track = u8::from(config.track_frees.is_some());
    let mut ebpf = EbpfLoader::new()
        .override_global("INTERVAL", &config.interval, true)
        .override_global("SCALE_Q32", &scale, true)
        .override_global("LOG_ENABLED", &log, true)
        .override_global("TRACK_FREES", &track, true)
        .override_global("FUNCTION_SIZE", &sizes, true)
        .map_max_entries("LIVE", config.track_frees.unwrap_or(1).max(1))
        .load(SAMPLER_OBJECT)?;
    let mut points = Vec::new();
    let tracking = config.track_frees.is_some();
    if tracking {
        // `free` first: a block sampled in the moments between attaching the allocation
        // probes and this one would otherwise have its free missed and stay "live" forever.
        points.extend(attach_free(&mut ebpf, targets)?);
    }
    let sessions = if tracking && config.sessions {
        match session::attach(&ebpf, SAMPLER_OBJECT, targets) {
            Ok(sessions) => Some(sessions),
            Err(why) => {
                log::info!(
                    "uprobe sessions unavailable ({why}): every allocation pays a return probe"
                );
                None
            }
        }
    } else {
        None
    };
    if sessions.is_some() {
        for target in targets {
            for f in &target.allocator.functions {
                points.push(AttachedPoint {
                    pid: target.pid,
                    probe: ProbeKind::Session(f.function),
                    path: target.allocator.path.clone(),
                    placement: f.probe.clone(),
                });
            }
        }
    }
    let entries = if sessions.is_some() {
        &[][..]
    } else {
        &AllocFn::ALL[..]
    };
    for &function in entries {
        let wanted: Vec<(u64, &Target)> = (0u64..)
            .zip(targets)
            .filter(|(_, t)| t.allocator.functions.iter().any(|f| f.function == function))
            .collect();
        if wanted.is_empty() {
            continue;
        }
        let program = loaded_uprobe(&mut ebpf, program_name(function))?;
        for (slot, target) in wanted {
            let placement = attach_one(program, function, target, slot)?;
            points.push(AttachedPoint {
                pid: target.pid,
                probe: ProbeKind::Entry(function),
                path: target.allocator.path.clone(),
                placement,
            });
        }
    }
    if tracking && sessions.is_none() {
        points.extend(attach_return_probes(&mut ebpf, targets)?);
    }
    let returns = match (tracking, &sessions) {
        (false, _) => ReturnProbes::None,
        (true, Some(_)) => ReturnProbes::Sessions,
        (true, None) => ReturnProbes::Classic,
    };
    Ok(Probes {
        ebpf,
        points,
        returns,
        _sessions: sessions,
    })
}

/// Classic return probes on every allocation function (at the same points as the entries,
/// where `[rsp]` is still the return address).
fn attach_return_probes(
    ebpf: &mut Ebpf,
    targets: &[Target],
) -> Result<Vec<AttachedPoint>, AttachError> {
    let mut points = Vec::new();
    let returns = loaded_uprobe(ebpf, "alloc_return")?;
    for (slot, target) in (0u64..).zip(targets) {
        for function in &target.allocator.functions {
            let placement = attach_one(returns, function.function, target, slot)?;
            points.push(AttachedPoint {
                pid: target.pid,
                probe: ProbeKind::Return(function.function),
                path: target.allocator.path.clone(),
                placement,
            });
        }
    }
    Ok(points)
}

/// The entry probe of `free`, at its first emulated instruction.
fn attach_free(ebpf: &mut Ebpf, targets: &[Target]) -> Result<Vec<AttachedPoint>, AttachError> {
    let mut points = Vec::new();
    let free = loaded_uprobe(ebpf, "free_enter")?;
    for target in targets {
        let Some(placement) = target.allocator.free.clone() else {
            continue;
        };
        let scope = scope_of(target);
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::SymbolOffset("free", placement.offset),
            cookie: None,
        };
        free.attach(point, &target.allocator.path, scope)
            .map_err(|source| AttachError::Attach {
                symbol: "free",
                path: target.allocator.path.clone(),
                pid: target.pid,
                source,
            })?;
        points.push(AttachedPoint {
            pid: target.pid,
            probe: ProbeKind::Free,
            path: target.allocator.path.clone(),
            placement,
        });
    }
    Ok(points)
}

fn scope_of(target: &Target) -> UProbeScope {
    NonZeroU32::new(target.pid).map_or(UProbeScope::AllProcesses, UProbeScope::OneProcess)
}

/// Attaches the benchmark's reference probe (counts calls, nothing else) to malloc.
pub fn attach_reference(target: &Target) -> Result<Probes, AttachError> {
    let mut ebpf = EbpfLoader::new().load(SAMPLER_OBJECT)?;
    let program = loaded_uprobe(&mut ebpf, "bare_count_enter")?;
    let placement = attach_one(program, AllocFn::Malloc, target, 0)?;
    let points = vec![AttachedPoint {
        pid: target.pid,
        probe: ProbeKind::Entry(AllocFn::Malloc),
        path: target.allocator.path.clone(),
        placement,
    }];
    Ok(Probes {
        ebpf,
        points,
        returns: ReturnProbes::None,
        _sessions: None,
    })
}

/// Attaches `program` at `function`'s chosen probe point in `target`; returns the point.
fn attach_one(
    program: &mut UProbe,
    function: AllocFn,
    target: &Target,
    slot: u64,
) -> Result<Placement, AttachError> {
    let scope = scope_of(target);
    let placement = target
        .allocator
        .functions
        .iter()
        .find(|f| f.function == function)
        .map(|f| f.probe.clone())
        .unwrap_or_else(Placement::entry);
    let point = UProbeAttachPoint {
        location: UProbeAttachLocation::SymbolOffset(function.symbol(), placement.offset),
        cookie: Some(slot),
    };
    program
        .attach(point, &target.allocator.path, scope)
        .map_err(|source| attach_error(function, target, source))?;
    Ok(placement)
}

/// The uprobe program `name` of the object, loaded into the kernel (verified).
fn loaded_uprobe<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, AttachError> {
    let program: &mut UProbe = ebpf
        .program_mut(name)
        .ok_or_else(|| AttachError::MissingProgram(name.to_owned()))?
        .try_into()
        .map_err(|source| AttachError::LoadProgram {
            program: name.to_owned(),
            source,
        })?;
    program.load().map_err(|source| AttachError::LoadProgram {
        program: name.to_owned(),
        source,
    })?;
    Ok(program)
}

fn attach_error(
    function: AllocFn,
    target: &Target,
    source: aya::programs::ProgramError,
) -> AttachError {
    AttachError::Attach {
        symbol: function.symbol(),
        path: target.allocator.path.clone(),
        pid: target.pid,
        source,
    }
}

/// The eBPF program probing `function`'s entry.
pub fn program_name(function: AllocFn) -> &'static str {
    match function {
        AllocFn::Malloc => "malloc_enter",
        AllocFn::Calloc => "calloc_enter",
        AllocFn::Realloc => "realloc_enter",
        AllocFn::PosixMemalign => "posix_memalign_enter",
        AllocFn::AlignedAlloc => "aligned_alloc_enter",
        AllocFn::Memalign => "memalign_enter",
        AllocFn::Valloc => "valloc_enter",
        AllocFn::Pvalloc => "pvalloc_enter",
    }
}
