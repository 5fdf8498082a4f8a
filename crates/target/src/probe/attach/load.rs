//! Loading the eBPF object: its load-time globals and map sizes set, every program
//! verified, the scheduler tracepoints attached; the uprobe programs loaded at their first
//! use.

use super::*;

/// Loads `name` from the relocated object for uprobe_multi links, or says why not.
pub(super) fn load_multi(
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

/// The object loaded with `config`'s load-time globals and map sizes; `task_pid_offset`:
/// where `pid` is in `task_struct` (from the kernel's BTF), for the raw fork tracepoint.
fn load_object(config: &KernelConfig, task_pid_offset: Option<u32>) -> Result<Ebpf, AttachError> {
    let scale =
        geometric::scale_q32(config.interval).ok_or(AttachError::Interval(config.interval))?;
    let log = u8::from(config.log);
    let track = u8::from(config.track_frees.is_some());
    let host = u8::from(config.host);
    let followed_only = u8::from(config.host && config.followed_only);
    let watch_execs = u8::from(config.watch_execs);
    let stack_bytes = u64::from(config.stack_bytes);
    let duty_cycled = u8::from(config.duty_cycled);
    let python_frames = u8::from(config.python_frames);
    let possible_cpus =
        aya::util::nr_cpus().map_err(|(path, source)| AttachError::Cpus { path, source })? as u32;
    let task_pid_offset = u64::from(task_pid_offset.unwrap_or(0));
    Ok(EbpfLoader::new()
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
        .override_global(kernel::globals::PYTHON_FRAMES, &python_frames, true)
        .override_global(kernel::globals::TASK_PID_OFFSET, &task_pid_offset, true)
        .map_max_entries(kernel::maps::SCRATCH, possible_cpus)
        .map_max_entries(kernel::maps::LIVE, config.track_frees.unwrap_or(1).max(1))
        .map_max_entries(kernel::maps::SAMPLES, config.ring_buffer)
        .load(SAMPLER_OBJECT)?)
}

/// The fork tracepoint (following; raw where the kernel's BTF gives `pid`'s offset) and
/// the exec one (following, or watching for new processes).
#[allow(clippy::type_complexity)]
fn attach_scheduler_tracepoints(
    ebpf: &mut Ebpf,
    config: &KernelConfig,
    raw_fork: bool,
) -> Result<(Vec<TracePointLinkId>, Vec<RawTracePointLinkId>), AttachError> {
    let mut tracepoints = Vec::new();
    let mut raw_tracepoints = Vec::new();
    if config.follow || config.followed_only {
        if raw_fork {
            raw_tracepoints.push(attach_raw_tracepoint(
                ebpf,
                kernel::programs::NEW_TASK_RAW,
                kernel::programs::NEW_TASK,
            )?);
        } else {
            tracepoints.push(attach_tracepoint(
                ebpf,
                kernel::programs::NEW_TASK,
                "task",
                kernel::programs::NEW_TASK,
            )?);
        }
    }
    if execs_followed(config) {
        raw_tracepoints.push(attach_raw_tracepoint(
            ebpf,
            kernel::programs::EXEC,
            "sched_process_exec",
        )?);
    }
    Ok((tracepoints, raw_tracepoints))
}

impl Probes {
    /// The exec tracepoints a Go process's statistics need, once one is watched: its old
    /// program's are read at `sched_prepare_exec` (a kernel without it: as last read),
    /// and user space hears of the exec to read the new program's. Only execs pay, and
    /// only in the kernel's lookup of the pid.
    pub(super) fn watch_go_execs(&mut self) {
        if self.go_execs_watched {
            return;
        }
        self.go_execs_watched = true;
        let programs = [
            (kernel::programs::PREPARE_EXEC, "sched_prepare_exec"),
            (kernel::programs::EXEC, "sched_process_exec"),
        ];
        let exec_attached = execs_followed(&self.config);
        for (name, event) in programs {
            if name == kernel::programs::EXEC && exec_attached {
                continue;
            }
            match attach_raw_tracepoint(&mut self.ebpf, name, event) {
                Ok(link) => self.raw_tracepoints.push(link),
                Err(e) => log::info!(
                    "{event}: {e}: a Go program's totals before an exec are as last read"
                ),
            }
        }
    }

    /// Loads the sampler with `config` (every program verified now, nothing attached yet but
    /// the scheduler tracepoints).
    pub fn load(config: KernelConfig) -> Result<Probes, AttachError> {
        let started = std::time::Instant::now();
        let task_pid_offset = if config.follow || config.followed_only {
            crate::probe::btf::task_pid_offset()
        } else {
            None
        };
        let mut ebpf = load_object(&config, task_pid_offset)?;
        log::debug!("eBPF object loaded in {:?}", started.elapsed());
        // The session program serves allocation entries through uprobe_multi links also
        // without return probes (`--alloc-only`): they detach in one grace period per file,
        // where classic uprobes take one each, 50 of them in a row (docs/performance.md,
        // "Figures quoted from the code").
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
        let (tracepoints, raw_tracepoints) =
            attach_scheduler_tracepoints(&mut ebpf, &config, task_pid_offset.is_some())?;
        let mut probes = Probes {
            ebpf,
            config,
            relocated,
            uprobes: None,
            front_end,
            producers: None,
            links: HashMap::new(),
            probed: HashSet::new(),
            specs: HashMap::new(),
            next_spec: 0,
            added: Vec::new(),
            sizes: [0; AllocFn::FUNCTION_SLOTS],
            _tracepoints: tracepoints,
            raw_tracepoints,
            go_execs_watched: false,
        };
        if !probes.config.lazy_uprobes {
            probes.uprobe_programs()?;
        }
        log::debug!("eBPF programs loaded in {:?}", started.elapsed());
        Ok(probes)
    }

    /// The programs of uprobes on allocator functions, loaded at the first call.
    pub(super) fn uprobe_programs(&mut self) -> Result<&UprobePrograms, AttachError> {
        if self.uprobes.is_none() {
            let started = std::time::Instant::now();
            let tracking = self.config.track_frees.is_some();
            // Without return probes the same program goes on plain uprobe_multi links: a
            // session link still arms a return probe for every call its program filters
            // out (another process hitting the same breakpoint for another tracer: a cost
            // per call, measured: docs/performance.md, "Figures quoted from the code"). The
            // session program serves allocation entries through
            // uprobe_multi links also without return probes (`--alloc-only`): they detach
            // in one grace period per file, where classic uprobes take one each, 50 of
            // them in a row (docs/performance.md, "Figures quoted from the code").
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
}

/// Whether `sched_process_exec` is attached from the start (`--follow`, `--comm`, `--all`).
fn execs_followed(config: &KernelConfig) -> bool {
    config.follow || config.followed_only || config.watch_execs
}

/// Loads tracepoint program `name` and attaches it to `category`/`event`, mounting tracefs
/// first if nothing has (a fresh machine often has it unmounted).
pub(super) fn attach_tracepoint(
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
pub(super) fn attach_raw_tracepoint(
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
pub(super) fn ensure_tracefs() {
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
