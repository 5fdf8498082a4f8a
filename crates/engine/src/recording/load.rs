//! `-p`: allocscope's in-process sampler loaded into the running targets (see
//! [`crate::inject`]), before anything is attached, so that each counts its own calls and
//! traps only on sampled blocks, as a command started with it does. A process it cannot be
//! loaded into is probed with uprobes and said to be (`--front-end in-process`: an error).

use log::{info, warn};

use super::front_end::{library_and_family, FrontEnd};
use crate::{
    probe::{allocator::Allocator, attach::Target},
    settings::{BadInput, LoadIntoRunning, SamplingConfig},
    targets::AllocatorCache,
};

/// What loading into the running targets gave: the front end (`None` when it was loaded
/// into none), and notes on the targets.
pub(super) type Loaded = (Option<FrontEnd>, Vec<(u32, Note)>);

/// What is said of a running target.
pub(super) enum Note {
    /// The sampler could not be loaded into it, for this reason: probed with uprobes.
    NotLoaded(String),
    /// Its counts leave this out.
    Incomplete(String),
}

/// What the counts of a process with `allocators` leave out once the sampler is loaded into
/// it running: a Python interpreter's small objects, if it is one.
pub(super) fn left_out_when_loaded(allocators: &[Allocator]) -> Option<&'static str> {
    allocators
        .iter()
        .any(|a| a.file.kind == crate::probe::allocator::AllocatorKind::Pymalloc)
        .then_some(PYMALLOC_LEFT_OUT)
}

/// What a Python process's counts leave out when the sampler is loaded into it running.
const PYMALLOC_LEFT_OUT: &str = "pymalloc's small objects (512 bytes or less) are not \
    counted: the sampler loaded into a running interpreter leaves its object allocator \
    alone (record it from its start, `-- CMD`, to count them)";

/// `-p` alone (no command, nor `--comm` or `--all`, whose processes come and go): loads
/// the sampler into the running targets ([`into_running`]).
pub(super) fn into_targets(
    targets: &crate::settings::Targets,
    initial: &mut [Target],
    sampling: &SamplingConfig,
    cache: &mut AllocatorCache,
) -> Result<Loaded, BadInput> {
    if targets.command.is_empty() && targets.comm.is_none() && !targets.all {
        into_running(initial, sampling, cache)
    } else {
        Ok((None, Vec::new()))
    }
}

/// Loads the sampler into the targets of `initial` that do not count their calls already,
/// and updates their allocators (the library in front).
fn into_running(
    initial: &mut [Target],
    sampling: &SamplingConfig,
    cache: &mut AllocatorCache,
) -> Result<Loaded, BadInput> {
    let choice = sampling.load_into_running;
    let wanted: Vec<usize> = (0..initial.len())
        .filter(|&i| choice != LoadIntoRunning::Never && !counts_itself(&initial[i].allocators))
        .collect();
    if wanted.is_empty() {
        return Ok((None, Vec::new()));
    }
    let (library, family, allocator) = library_and_family(sampling.interval)?;
    let path = library.path();
    let mut regions = Vec::new();
    let mut notes = Vec::new();
    for i in wanted {
        let target = &mut initial[i];
        let pid = target.pid;
        let region = family.claim_for(pid).map_err(|e| {
            BadInput(format!(
                "cannot prepare the in-process sampler for pid {pid}: {e:#}"
            ))
        })?;
        match crate::inject::load(pid, &path) {
            Ok(loaded) => {
                info!("pid {pid}: in-process sampler loaded ({loaded})");
                if let Some(what) = left_out_when_loaded(&target.allocators) {
                    notes.push((pid, Note::Incomplete(what.into())));
                }
                match cache.of_pid(pid) {
                    Ok(mut allocators) => {
                        crate::probe::allocator::behind_front_end(&mut allocators, true);
                        target.allocators = allocators;
                        regions.push((pid, region));
                    }
                    Err(e) => warn!("pid {pid}: after loading the sampler: {e}"),
                }
            }
            Err(refused) if choice == LoadIntoRunning::Always => {
                return Err(BadInput(format!(
                    "pid {pid}: cannot load the in-process sampler: {refused} (--front-end uprobes probes it instead)"
                )));
            }
            Err(refused) => {
                warn!("pid {pid}: in-process sampler not loaded ({refused}): probing its allocator with uprobes");
                notes.push((pid, Note::NotLoaded(refused.to_string())));
            }
        }
    }
    let front_end = (!regions.is_empty()).then_some(FrontEnd {
        library,
        family,
        regions,
        allocator,
        running: true,
        patched: None,
    });
    Ok((front_end, notes))
}

/// Whether a process counts its own calls already (allocscope's library loaded by an
/// earlier recording, or another producer).
fn counts_itself(allocators: &[Allocator]) -> bool {
    allocators.iter().any(|a| a.file.reports_itself())
}
