//! The in-process front end a recording hands out: the library placed for it, the family
//! table its processes count in, and the library as an allocator to probe. Preparing a
//! command (`prepare`), loading into running targets (`load`) and the fleet's carriers
//! (`carriers`) all take theirs from here.

use log::{info, warn};

use crate::{preload, settings::BadInput};

/// The in-process front end of a command (or of running processes it was loaded into):
/// the library, the family table its processes count in, their slots there, and the
/// library as an allocator to probe.
pub(super) struct FrontEnd {
    pub(super) library: preload::Library,
    pub(super) family: preload::FamilyTable,
    pub(super) regions: Vec<(u32, preload::MappedRegion)>,
    pub(super) allocator: crate::probe::allocator::Allocator,
    /// Loaded into running processes (`-p`), not started with the command.
    pub(super) running: bool,
    /// The allocator linked into the command's executable that its processes patch.
    pub(super) patched: Option<crate::probe::allocator::Allocator>,
}

/// The library placed for this recording, a family table at `interval` beside it, and the
/// library as an allocator to attach to.
#[allow(clippy::type_complexity)]
pub(super) fn library_and_family(
    interval: u64,
) -> Result<
    (
        preload::Library,
        preload::FamilyTable,
        crate::probe::allocator::Allocator,
    ),
    BadInput,
> {
    let (library, own) = library()?;
    let family = library
        .create_family(interval)
        .map_err(|e| unprepared("family table", &format!("{e:#}")))?;
    Ok((library, family, own))
}

/// The library placed for this recording, and the library as an allocator to attach to
/// (a process it is loaded into without a family table beside it counts in a region of
/// its own).
pub(super) fn library() -> Result<(preload::Library, crate::probe::allocator::Allocator), BadInput>
{
    let library =
        preload::Library::create().map_err(|e| unprepared("library", &format!("{e:#}")))?;
    let path = library.path();
    let file_id = library.file_id().map_err(|e| unprepared("library", &e))?;
    let file = crate::probe::allocator::analyse_file(
        &path,
        false,
        std::path::Path::new("allocscope-preload"),
    )
    .filter(|f| f.is_in_process())
    .ok_or_else(|| unprepared("library", &"its probes were not found"))?;
    let own = crate::probe::allocator::Allocator {
        path: path.clone(),
        shown: path.clone(),
        file_id,
        in_executable: false,
        file: std::sync::Arc::new(file),
    };
    Ok((library, own))
}

/// Plans the patching of the allocators linked into the command's executable `program`
/// (among `allocators`; see [`crate::probe::patch`]) and writes the plan into `family`:
/// each one planned is marked patched, in `allocators` and in `cache`, and never probed.
/// One that cannot be is left to uprobes, said with why. The one planned, if any.
pub(super) fn plan_patches(
    program: &std::path::Path,
    allocators: &mut [crate::probe::allocator::Allocator],
    family: &mut preload::FamilyTable,
    cache: &mut crate::targets::AllocatorCache,
) -> Option<crate::probe::allocator::Allocator> {
    use crate::probe::allocator::AllocatorKind;
    let allocator = allocators.iter_mut().find(|a| {
        a.in_executable
            && matches!(
                a.file.kind,
                AllocatorKind::Jemalloc
                    | AllocatorKind::Tcmalloc
                    | AllocatorKind::Mimalloc
                    | AllocatorKind::Malloc
            )
    })?;
    let planned = crate::infile::map_regular(program)
        .map_err(|e| format!("cannot read {}: {e}", program.display()))
        .and_then(|data| crate::probe::patch::plan(&data, &allocator.file));
    match planned.and_then(|plan| {
        family
            .write_patches(&plan)
            .map(|()| plan.count)
            .map_err(|e| format!("{e:#}"))
    }) {
        Ok(count) => {
            info!(
                "{}: its {count} entry points are patched to count in-process",
                allocator.describe()
            );
            cache.patched_in_process(allocator);
            Some(allocator.clone())
        }
        Err(why) => {
            warn!(
                "{}: counted with uprobes (a trap per call), not patched in-process: {why}",
                allocator.describe()
            );
            None
        }
    }
}

/// The in-process sampler could not be prepared: `what` failed with `e`.
pub(super) fn unprepared(what: &str, e: &dyn std::fmt::Display) -> BadInput {
    BadInput(format!(
        "cannot prepare the in-process sampler ({what}): {e} (--no-preload probes its allocator with uprobes instead)"
    ))
}
