//! Before a recording starts, while allocscope has one thread: every check that can fail
//! on bad input, the targets' allocators found, and for `-- CMD` the in-process front end
//! prepared (library, family table, the command's slot) and the child forked, paused
//! before its exec until the probes are attached.

use log::{info, warn};

use super::front_end::{library_and_family, FrontEnd};
use crate::{
    preflight, preload,
    probe::attach::Target,
    settings::{BadInput, SamplingConfig, Targets},
    spawn::{self, PausedChild},
    targets::{AllocatorCache, FindError},
};

/// Everything prepared before the runtime starts: validated targets and, for `-- CMD`, the
/// paused child.
pub struct Prepared {
    pub(super) targets: Targets,
    pub(super) initial: Vec<Target>,
    pub(super) child: Option<PausedChild>,
    pub(super) command: String,
    pub(super) cache: AllocatorCache,
    /// The in-process front end loaded into the command (or into running targets).
    pub(super) front_end: Option<FrontEnd>,
    /// What is said of running targets it was (or could not be) loaded into.
    pub(super) notes: Vec<(u32, super::load::Note)>,
    /// `--front-end in-process` with `--comm` or `--all`: only carriers counted.
    pub(super) carriers: Option<super::discovery::Carriers>,
}

/// Runs every check that can fail on bad input (privileges, targets, then the caller's own
/// `check`), then loads the sampler into running targets (`-p`), or for `-- CMD` forks
/// the paused child, its stdin and output redirected when `redirect` is given. Must run
/// before any other thread than `main` exists.
pub fn prepare(
    targets: &Targets,
    sampling: &SamplingConfig,
    check: impl FnOnce() -> Result<(), BadInput>,
    redirect: impl FnOnce() -> Result<Option<spawn::Redirect>, BadInput>,
) -> Result<Prepared, BadInput> {
    preflight::check_privileges()?;
    let mut cache = AllocatorCache::default();
    let mut initial = processes(targets, &mut cache)?;
    let host_wide = targets.comm.is_some() || targets.all;
    // Resolved once: the file checked and probed is the file run.
    let program = match targets.command.first() {
        Some(word) => Some(preflight::resolve_command(word)?),
        None => None,
    };
    let mut front_end = None;
    if let Some(program) = &program {
        let mut allocators = preflight::allocators_for_command(program, &mut cache)?;
        // A followed command's tree carries the library too (through the environment): the
        // library's probes, file-wide, reach every process that maps it, and no other.
        // `--comm` and `--all` look at processes that do not.
        let samples_itself = samples_itself(program, &allocators, sampling.preload);
        if sampling.preload && !host_wide && !samples_itself {
            front_end = command_front_end(program, sampling.interval, &mut allocators, &mut cache)?;
        }
        initial.push(Target { pid: 0, allocators });
    }
    check()?;
    // Only once every refusal that does not need the targets has passed: nothing is
    // loaded into a process for a recording that cannot be written.
    let (loaded, notes) = super::load::into_targets(targets, &mut initial, sampling, &mut cache)?;
    let mut child = None;
    let mut command = String::new();
    if let (Some(word), Some(program)) = (targets.command.first(), &program) {
        command = word.to_string_lossy().into_owned();
        let environment = front_end
            .as_ref()
            .map(|f| f.environment.clone())
            .unwrap_or_default();
        let paused = spawn::spawn_paused(program, &targets.command, redirect()?, &environment)
            .map_err(|e| BadInput(format!("cannot start {command}: {e}")))?;
        if let Some(target) = initial.last_mut() {
            target.pid = paused.pid;
        }
        child = Some(paused);
    }
    let front_end = match (front_end, &child) {
        (Some(front_end), Some(child)) => Some(front_end.claimed_for(child.pid)?),
        _ => loaded,
    };
    Ok(Prepared {
        targets: followed(targets, front_end.is_some(), &command),
        initial,
        child,
        command,
        cache,
        front_end,
        notes,
        carriers: super::discovery::Carriers::for_targets(targets, sampling)?,
    })
}

/// The processes `-p` names, with their allocators; those gone or without one are left
/// out, said, unless nothing else would be recorded (then it is bad input).
fn processes(targets: &Targets, cache: &mut AllocatorCache) -> Result<Vec<Target>, BadInput> {
    let mut initial = Vec::new();
    let mut problems = Vec::new();
    for &pid in &targets.pids {
        match cache.of_pid(pid) {
            Ok(allocators) => initial.push(Target { pid, allocators }),
            Err(FindError::Gone) => problems.push(format!("no such process: pid {pid}")),
            Err(e) => problems.push(format!("pid {pid}: {e}")),
        }
    }
    let others = !initial.is_empty() || targets.waits_for_new();
    if !problems.is_empty() && !others {
        return Err(BadInput(problems.join("; ")));
    }
    for problem in problems {
        warn!("{problem}: left out");
    }
    Ok(initial)
}

/// The in-process front end prepared for the command, before it starts.
struct CommandFrontEnd {
    library: preload::Library,
    family: preload::FamilyTable,
    allocator: crate::probe::allocator::Allocator,
    /// The allocator linked into its executable that its processes patch.
    patched: Option<crate::probe::allocator::Allocator>,
    /// What its environment gains.
    environment: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

impl CommandFrontEnd {
    /// The front end of the command started as `pid`: its slot of the family table claimed.
    fn claimed_for(self, pid: u32) -> Result<FrontEnd, BadInput> {
        let region = self.family.claim_for(pid).map_err(|e| {
            BadInput(format!(
                "cannot prepare the in-process sampler (family table): {e:#}"
            ))
        })?;
        Ok(FrontEnd {
            library: self.library,
            family: self.family,
            regions: vec![(pid, region)],
            allocator: self.allocator,
            running: false,
            patched: self.patched,
        })
    }
}

/// The front end for command `program` (see [`front_end_for`]), the allocator linked into
/// it planned for patching; `allocators` then lose those the front end serves.
fn command_front_end(
    program: &std::path::Path,
    interval: u64,
    allocators: &mut Vec<crate::probe::allocator::Allocator>,
    cache: &mut AllocatorCache,
) -> Result<Option<CommandFrontEnd>, BadInput> {
    let Some((library, mut family, own)) = front_end_for(program, interval)? else {
        return Ok(None);
    };
    let patched = super::front_end::plan_patches(program, allocators, &mut family, cache);
    let environment = front_end_environment(&library);
    allocators.push(own.clone());
    crate::probe::allocator::behind_front_end(allocators, false);
    Ok(Some(CommandFrontEnd {
        library,
        family,
        allocator: own,
        patched,
        environment,
    }))
}

/// What the command's environment gains to load the front end: `LD_PRELOAD` with the
/// library first (the family table is found beside it: nothing else).
fn front_end_environment(
    library: &preload::Library,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    vec![(
        "LD_PRELOAD".into(),
        preload::ld_preload(library, std::env::var_os("LD_PRELOAD").as_deref()),
    )]
}

/// `targets`, following what the command starts when it carries the front end and its
/// children are wanted (with uprobes that would trap every process using their
/// allocator: said, unless `--follow` asks for it anyway).
fn followed(targets: &Targets, front_end: bool, command: &str) -> Targets {
    let mut targets = targets.clone();
    if front_end && targets.children {
        targets.follow = true;
    } else if targets.children && !targets.follow {
        info!(
            "the processes {command} starts are not followed: with uprobes that would trap \
             every process using their allocator (--follow does it anyway)"
        );
    }
    targets
}

/// The in-process front end for command `program`: the library placed for this recording,
/// a family table at `interval` beside it, and the library as an allocator to attach to. `None` (uprobes then) where the dynamic loader would not load
/// it, said once: a statically linked program, or a set-user/group-ID one (the loader
/// ignores `LD_PRELOAD` from a path outside the system's for those).
#[allow(clippy::type_complexity)]
fn front_end_for(
    program: &std::path::Path,
    interval: u64,
) -> Result<
    Option<(
        preload::Library,
        preload::FamilyTable,
        crate::probe::allocator::Allocator,
    )>,
    BadInput,
> {
    use std::os::unix::fs::PermissionsExt as _;
    let shown = program.display();
    let data = crate::infile::map_regular(program)
        .map_err(|e| BadInput(format!("cannot read {shown}: {e}")))?;
    if data.starts_with(b"\x7fELF") && crate::targets::interpreter_of(&data).is_none() {
        warn!("{shown} is statically linked: the in-process sampler cannot load; probing its allocator with uprobes");
        return Ok(None);
    }
    let mode = std::fs::metadata(program)
        .map(|m| m.permissions().mode())
        .unwrap_or(0);
    if crate::sys::process::seccomp_mode(std::process::id()).is_some_and(|m| m != 0) {
        warn!("allocscope runs under a seccomp filter, which {shown} inherits: the in-process sampler would stay dormant there; probing its allocator with uprobes");
        return Ok(None);
    }
    if mode & 0o6000 != 0 {
        warn!("{shown} is set-user/group-ID: the loader ignores LD_PRELOAD for it; probing its allocator with uprobes");
        return Ok(None);
    }
    library_and_family(interval).map(Some)
}

/// Whether `program` samples its allocations itself, said with `-v`: an allocator that
/// reports through a producer's probes is recorded through them alone (the library would
/// count the blocks it takes from malloc a second time), and a static Go program through its
/// runtime's sampler (the library could not load; a cgo one gets it, for its malloc).
fn samples_itself(
    program: &std::path::Path,
    allocators: &[crate::probe::allocator::Allocator],
    preload: bool,
) -> bool {
    let producer = allocators.iter().find(|a| a.file.is_producer());
    if let (Some(producer), true) = (producer, preload) {
        info!(
            "{} reports its own samples ({}): recorded through them, without the in-process sampler",
            program.display(),
            producer.describe()
        );
    }
    let go = allocators.iter().find(|a| a.file.is_go_runtime());
    if let Some(go) = go {
        info!(
            "{} is a Go program: its heap is recorded through its runtime's own sampler ({})",
            program.display(),
            go.describe()
        );
    }
    producer.is_some() || (go.is_some() && allocators.len() == 1)
}
