//! Starting a recording, in the order correctness needs: load the programs (their
//! configuration fixed at load), calibrate the trap, open the duty cycle's gate before any
//! target runs, probe files for every process before a followed command starts, attach to
//! each target, and only then let the paused command run.

use anyhow::Context as _;
use aya::maps::RingBuf;
use log::warn;
use sampler_common::kernel;

use super::{
    aggregation::Aggregation, cost_control::CostControl, discovery::Discovered,
    in_process::InProcess, intake::Intake, Clocks, CoveredSince, FrontEnd, Logger, Prepared,
    Recording,
};
use crate::{
    collect::SampleReader,
    cost::{self, Trap},
    exits,
    probe::attach::{KernelConfig, Probes},
    profile::{Aggregator, CoverageStart},
    settings::{BadInput, PythonFrames, SamplingConfig, Targets},
    spawn::PausedChild,
    stacks::symbolize::Symbolizer,
};

/// The programs' load-time configuration for `targets`.
fn kernel_config(
    targets: &Targets,
    sampling: &SamplingConfig,
    followed_only: bool,
    in_process_only: bool,
) -> KernelConfig {
    KernelConfig {
        interval: sampling.interval,
        log: sampling.verbose,
        track_frees: (!sampling.alloc_only).then_some(sampling.max_tracked),
        ring_buffer: sampling.ring_buffer,
        stack_bytes: sampling.unwind.stack_bytes(),
        sessions: sampling.sessions,
        usdt_nop5: sampling.usdt_nop5,
        host: targets.all || followed_only,
        follow: targets.follow,
        followed_only,
        watch_execs: targets.waits_for_new(),
        duty_cycled: sampling.max_overhead.is_some(),
        lazy_uprobes: in_process_only,
        python_frames: match sampling.python_frames {
            PythonFrames::Off => false,
            PythonFrames::Merged | PythonFrames::MergedAll => true,
            PythonFrames::Auto => may_run_python(targets),
        },
    }
}

/// Whether only in-process front ends are probed: a command counted in-process, alone
/// (`initial`: the targets known at start), traps only on its samples (rare), and needs no
/// uprobe on its allocator unless one is linked into its executable; nor do `carriers`.
fn in_process_only(
    front_end: Option<&FrontEnd>,
    initial: &[crate::probe::attach::Target],
    targets: &Targets,
    carriers: &Option<super::discovery::Carriers>,
) -> bool {
    (front_end.is_some() && initial.len() == 1 && !targets.waits_for_new()) || carriers.is_some()
}

/// Whether `--python-frames auto` reads Python frames for `targets`: new processes may be
/// anything (`--all`, `--comm`, `-p … --follow`), a `-p` process maps an interpreter, or
/// the command is or starts one (a command's tree is followed by default, so that is what
/// decides for it).
fn may_run_python(targets: &Targets) -> bool {
    use crate::python::detect;
    targets.all
        || targets.comm.is_some()
        || (targets.follow && targets.command.is_empty())
        || targets
            .pids
            .iter()
            .any(|&pid| detect::maps_interpreter(pid))
        || detect::command_may_be_python(&targets.command, |word| {
            let program = crate::preflight::resolve_command(std::ffi::OsStr::new(word)).ok()?;
            detect::shebang_of(&program)
        })
}

/// The ring buffer's reader (with Python frames' part when the programs read them), and
/// the eBPF log's (`-v`).
fn reader_and_log(
    probes: &mut Probes,
    sampling: &SamplingConfig,
    python_frames: bool,
) -> anyhow::Result<(SampleReader, Option<Logger>)> {
    let logger = if sampling.verbose {
        aya_log::EbpfLogger::init(&mut probes.ebpf)
            .map_err(|e| warn!("eBPF log unavailable: {e}"))
            .ok()
    } else {
        None
    };
    let ring = RingBuf::try_from(
        probes
            .ebpf
            .take_map(kernel::maps::SAMPLES)
            .context("SAMPLES map missing")?,
    )?;
    let python = match python_frames {
        false => None,
        true => Some(crate::python::Frames::new(Some(
            aya::maps::HashMap::try_from(
                probes
                    .ebpf
                    .take_map(kernel::maps::PY_PROCESSES)
                    .context("PY_PROCESSES map missing")?,
            )?,
        ))),
    };
    let reader = SampleReader::new(ring, sampling.ring_buffer as usize, python)?;
    Ok((reader, logger))
}

/// The aggregator for `sampling`; `recent`: per-stack samples kept for rates over that
/// window (`top`).
fn aggregator(
    sampling: &SamplingConfig,
    recent: Option<std::time::Duration>,
    duty_cycled: bool,
) -> Aggregator {
    let mut aggregator = match recent {
        Some(window) => Aggregator::with_recent(window),
        None => Aggregator::default(),
    };
    aggregator.limit_stacks(sampling.max_stacks);
    if !sampling.alloc_only {
        aggregator.track_frees();
    }
    if sampling.python_frames == PythonFrames::MergedAll {
        aggregator.merge_python(crate::python::Merge::All);
    }
    if duty_cycled {
        // Time-sampled: no series over time (its gaps are the off slots).
        aggregator.duty_cycle();
    } else {
        aggregator.keep_timeline(crate::stats::growth::TickGrid {
            start_ns: crate::collect::monotonic_ns(),
            tick_ns: sampling.tick.as_nanos().max(1) as u64,
        });
    }
    aggregator
}

/// Loads the probes; where the kernel refuses the Python-frames walk (its loop is a
/// `may_goto` one, Linux 6.9+), loads them without it and says so. Returns whether Python
/// frames are walked.
fn load_probes(config: KernelConfig) -> anyhow::Result<(Probes, bool)> {
    match Probes::load(config) {
        Ok(probes) => Ok((probes, config.python_frames)),
        Err(e) if config.python_frames => {
            warn!(
                "Python frames left out: the kernel refused the program that walks them \
                 (its loop needs Linux 6.9+): {e}"
            );
            let config = KernelConfig {
                python_frames: false,
                ..config
            };
            let probes = Probes::load(config).context("loading the eBPF programs")?;
            Ok((probes, false))
        }
        Err(e) => Err(anyhow::Error::new(e).context("loading the eBPF programs")),
    }
}

/// Duty cycling for `--max-overhead`: the first slot is on from the start, its gate open
/// before any target can run.
fn duty_cycling(
    probes: &mut Probes,
    sampling: &SamplingConfig,
) -> anyhow::Result<Option<crate::duty::DutyCycling>> {
    let duty = sampling.max_overhead.map(crate::duty::DutyCycling::new);
    if duty.is_some() {
        probes
            .set_gate(true)
            .context("opening the duty cycle's gate")?;
    }
    Ok(duty)
}

/// Where a recording's events and costs come from: the loaded probes and their ring
/// buffer's reader, or nothing at all (a command whose tree was gone before they loaded).
struct Loaded {
    probes: Option<Probes>,
    reader: SampleReader,
    logger: Option<Logger>,
    duty: Option<crate::duty::DutyCycling>,
    trap: Trap,
}

impl Loaded {
    /// The probes loaded with `config`; where a command let run `early` is followed (the
    /// default), none if its tree is gone before they are loaded.
    fn load(
        config: KernelConfig,
        early: Option<&super::early_intake::EarlyRun>,
        followed: bool,
        sampling: &SamplingConfig,
    ) -> anyhow::Result<Loaded> {
        let loaded = match early {
            Some(run) if followed => {
                super::early_intake::load_unless_gone(run, move || load_probes(config))?
            }
            _ => Some(load_probes(config)?),
        };
        match loaded {
            Some((probes, python_frames)) => {
                Loaded::attached(probes, python_frames, sampling, config.lazy_uprobes)
            }
            None => Loaded::probeless(),
        }
    }

    /// The loaded `probes` (walking Python frames if `python_frames`), their trap timed
    /// unless `in_process_only` and their duty cycle's gate opened.
    fn attached(
        mut probes: Probes,
        python_frames: bool,
        sampling: &SamplingConfig,
        in_process_only: bool,
    ) -> anyhow::Result<Loaded> {
        // The trap calibration's time (timing, then a link the kernel takes a grace period
        // to remove, which holds up the attach behind it; docs/performance.md, "Figures
        // quoted from the code") would be the largest part of such a
        // command's cost.
        let trap = if in_process_only {
            Trap::MODELLED
        } else {
            cost::trap::calibrate(&mut probes)
        };
        let duty = duty_cycling(&mut probes, sampling)?;
        let (reader, logger) = reader_and_log(&mut probes, sampling, python_frames)?;
        Ok(Loaded {
            probes: Some(probes),
            reader,
            logger,
            duty,
            trap,
        })
    }

    /// No probes: every event is an early record.
    fn probeless() -> anyhow::Result<Loaded> {
        Ok(Loaded {
            probes: None,
            reader: SampleReader::idle()?,
            logger: None,
            duty: None,
            trap: Trap::MODELLED,
        })
    }
}

/// What a recording is made of before any target is attached.
struct Parts {
    loaded: Loaded,
    targets: Targets,
    cache: crate::targets::AllocatorCache,
    discovered: Discovered,
    /// The command allocscope started, if any.
    spawned: Option<u32>,
}

impl Recording {
    /// Attaches the probes, then lets a spawned command run (a command counted in-process
    /// alone runs at once, while they load: see [`super::early`]). `recent` keeps per-stack
    /// samples for rates over that window (`top`). Must run inside the tokio runtime.
    pub fn start(
        prepared: Prepared,
        sampling: &SamplingConfig,
        recent: Option<std::time::Duration>,
    ) -> anyhow::Result<Recording> {
        let started = std::time::Instant::now();
        let Prepared {
            targets,
            initial,
            child,
            command,
            cache,
            front_end,
            notes,
            carriers,
        } = prepared;
        let followed_only = !targets.all && (targets.follow || targets.comm.is_some());
        let in_process_only = in_process_only(front_end.as_ref(), &initial, &targets, &carriers);
        let config = kernel_config(&targets, sampling, followed_only, in_process_only);
        let (child, early) = match (child, &front_end) {
            (Some(child), Some(front_end))
                if super::early_intake::may_run_early(&config, in_process_only) =>
            {
                let family = &front_end.family;
                let run = super::early_intake::release_now(child, family, &config, &command)?;
                (None, Some(run))
            }
            (child, _) => (child, None),
        };
        let spawned = early
            .as_ref()
            .map(|run| run.pid)
            .or(child.as_ref().map(|c| c.pid));
        let loaded = Loaded::load(config, early.as_ref(), followed_only, sampling)?;
        let probeless = loaded.probes.is_none();
        let parts = Parts {
            loaded,
            targets,
            cache,
            discovered: Discovered::new(followed_only),
            spawned,
        };
        let mut recording = Recording::assemble(parts, sampling, recent)?;
        recording.probeless = probeless;
        recording.carriers = carriers;
        match front_end.as_ref() {
            // Its early records cover the tree's calls through it from the start.
            Some(front_end) if probeless => recording
                .discovered
                .host_file_probed(front_end.allocator.file_id.clone(), 0),
            _ => recording.probe_before_start(front_end.as_ref()),
        }
        recording.take_front_end(front_end, notes, sampling.interval);
        recording.attach_initial(initial, &command)?;
        if let Some(child) = child {
            recording.release(child, &command)?;
        }
        let early = match early {
            Some(run) => Some(recording.take_early(run, !sampling.alloc_only)?),
            None => None,
        };
        recording.discover()?;
        if let Some(early) = early {
            recording.end_early(early);
        }
        log::debug!("loaded, attached and released in {:?}", started.elapsed());
        if recording.discovered.none_running() && !recording.targets.waits_for_new() {
            anyhow::bail!("every target exited while the probes were being attached");
        }
        Ok(recording)
    }

    /// A recording of `parts`, before any target is attached.
    fn assemble(
        parts: Parts,
        sampling: &SamplingConfig,
        recent: Option<std::time::Duration>,
    ) -> anyhow::Result<Recording> {
        let Loaded {
            probes,
            reader,
            logger,
            duty,
            trap,
        } = parts.loaded;
        let aggregator = aggregator(sampling, recent, duty.is_some());
        Ok(Recording {
            probes,
            probeless: false,
            intake: Intake::new(reader, logger),
            aggregation: Aggregation::new(
                aggregator,
                Symbolizer::spawn(&sampling.debug_dirs)
                    .context("starting the symbolizer thread")?,
            ),
            targets: parts.targets,
            cache: parts.cache,
            watcher: exits::Watcher::new(),
            discovered: parts.discovered,
            accounting: Default::default(),
            points: Vec::new(),
            clocks: Clocks::new(duty.is_some()),
            command: super::command::Command::new(parts.spawned),
            said_waiting: false,
            cost: CostControl::new(
                trap,
                crate::throttle::Throttling::new(
                    sampling.max_samples_per_sec,
                    sampling.min_samples_per_sec,
                    sampling.interval,
                ),
                duty,
            ),
            in_process: InProcess::none(sampling.interval),
            carriers: None,
            go_readers: super::go_readers::GoReaders::default(),
            period: Default::default(),
            gone_at_period: Default::default(),
        })
    }

    /// Followed targets: the files probed for every process before any target runs. A
    /// followed command that carries the front end has its tree carry it too: nothing else
    /// is probed unless a process turns out not to (a static or set-user-ID program, a
    /// cleared environment), and then only its own files.
    fn probe_before_start(&mut self, front_end: Option<&FrontEnd>) {
        if !self.discovered.followed_only() {
            return;
        }
        // Only carriers counted: the library loaded into `--comm`'s matches, no allocator.
        let allocator = match &self.carriers {
            Some(carriers) => carriers.allocator().cloned(),
            None => front_end.map(|f| f.allocator.clone()),
        };
        match allocator {
            None if self.carriers.is_some() => {}
            None => self.probe_system_allocators(),
            // Before the command is followed: it is covered from its start.
            Some(allocator) => {
                if let Err(e) = self.probe_files(std::slice::from_ref(&allocator)) {
                    warn!("probing the in-process sampler for every process: {e:#}");
                }
            }
        }
    }

    /// The command (or the running processes it was loaded into) counts in-process: their
    /// regions are read from now on. `notes`: what is said of the running targets it was
    /// (or could not be) loaded into.
    fn take_front_end(
        &mut self,
        front_end: Option<FrontEnd>,
        notes: Vec<(u32, super::load::Note)>,
        interval: u64,
    ) {
        for (pid, note) in notes {
            match note {
                super::load::Note::NotLoaded(why) => {
                    self.aggregation.processes.not_loaded(pid, why)
                }
                super::load::Note::Incomplete(what) => {
                    self.aggregation.processes.incomplete(pid, what)
                }
            }
        }
        let Some(FrontEnd {
            library,
            family,
            regions,
            allocator,
            running,
            patched,
        }) = front_end
        else {
            return;
        };
        for (pid, region) in regions {
            if running {
                // What it counted since it was loaded, until its probes are attached, has
                // no samples.
                self.accounting.counters.add_region_from_attach(pid, region);
            } else {
                self.accounting.counters.add_region(pid, region);
            }
        }
        // Its frames lead every sample's stack; a short-lived command is gone before its
        // own view of the library could be opened.
        if let Ok(file_id) = library.file_id() {
            self.aggregation.hold_file(file_id, library.path());
        }
        self.in_process = InProcess::of_command(library, allocator, family, interval);
        self.in_process.patched = patched;
    }

    /// Attaches to the targets known at start; one that fails is left out, said, unless
    /// it is the command.
    fn attach_initial(
        &mut self,
        initial: Vec<crate::probe::attach::Target>,
        command: &str,
    ) -> anyhow::Result<()> {
        for target in initial {
            let command_itself = self.command.is(target.pid);
            if !command_itself {
                // A running process: its interpreter found before its first sample.
                self.intake.reader().examine(target.pid);
            }
            let since = CoveredSince::now(if command_itself {
                CoverageStart::Start
            } else {
                CoverageStart::Attach
            });
            if let Err(e) = self.attach(target.pid, &target.allocators, since) {
                if command_itself {
                    return Err(e.context(format!("attaching to {command}")));
                }
                warn!("pid {}: {e:#}: left out", target.pid);
            }
        }
        Ok(())
    }

    /// Lets the paused command run, its probes attached.
    fn release(&mut self, child: PausedChild, command: &str) -> anyhow::Result<()> {
        let pid = child.pid;
        child
            .release()
            .map_err(|e| BadInput(format!("cannot run {command}: {e}")))?;
        // Past exec now: its own name, executable and maps.
        self.aggregation.track(pid);
        Ok(())
    }
}
