//! The benchmark's reference probe: a program that counts calls and nothing else, attached
//! to a target's malloc, the floor a real probe's cost is measured against.

use super::*;

impl Probes {
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
}

/// Attaches the benchmark's reference probe (counts calls, nothing else) to malloc of the
/// target's first allocator.
pub fn attach_reference(target: &Target) -> Result<Probes, AttachError> {
    let config = reference_config();
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
    Ok(reference_probes(ebpf, config))
}

/// Attaches the reference program at each of `offsets` of the file at `path`, in process
/// `pid` only: the yardstick for probes that are not on malloc (Go's runtime).
pub fn attach_reference_at(pid: u32, path: &Path, offsets: &[u64]) -> Result<Probes, AttachError> {
    let mut ebpf = EbpfLoader::new().load(SAMPLER_OBJECT)?;
    for offset in offsets {
        let symbol = format!("offset {offset:#x}");
        attach_reference_program(&mut ebpf, path, path, *offset, pid, &symbol)?;
    }
    Ok(reference_probes(ebpf, reference_config()))
}

/// The kernel configuration of a reference probe (nothing but the count runs).
fn reference_config() -> KernelConfig {
    KernelConfig {
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
        python_frames: false,
    }
}

/// The loaded reference program as `Probes`, the links held by `ebpf`.
fn reference_probes(ebpf: Ebpf, config: KernelConfig) -> Probes {
    Probes {
        ebpf,
        config,
        relocated: None,
        uprobes: None,
        front_end: None,
        producers: None,
        links: HashMap::new(),
        probed: HashSet::new(),
        specs: HashMap::new(),
        next_spec: 0,
        added: Vec::new(),
        sizes: [0; AllocFn::FUNCTION_SLOTS],
        _tracepoints: Vec::new(),
        raw_tracepoints: Vec::new(),
        go_execs_watched: false,
    }
}

/// Attaches the reference program (it counts, nothing else) at `offset` of the file at
/// `path` (`shown` in errors), in process `pid` only.
pub(super) fn attach_reference_program(
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
    // Loaded once, attached at as many places as asked.
    if uprobe(ebpf, kernel::programs::BARE)?.fd().is_err() {
        loaded_uprobe(ebpf, kernel::programs::BARE)?;
    }
    uprobe(ebpf, kernel::programs::BARE)?
        .attach(point, path, scope.uprobe_scope())
        .map_err(|source| AttachError::Attach {
            symbol: symbol.to_owned(),
            path: shown.to_owned(),
            pid,
            source: Box::new(source),
        })
}
