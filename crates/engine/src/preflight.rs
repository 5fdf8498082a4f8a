//! Checks a recording runs before anything is attached, each failing with a message a
//! user can act on: privileges, the command's path, its allocators. (The output's
//! destination is checked by the command line, which knows where it goes.)

use std::{
    ffi::OsStr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use crate::{
    probe::allocator::{self, Allocator, AllocatorKind},
    settings::BadInput,
    targets::{self, AllocatorCache},
};

const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
#[cfg(test)]
const CAP_PERFMON: u32 = 38;
#[cfg(test)]
const CAP_BPF: u32 = 39;

/// Whether a `CapEff:` mask allows what a recording does: load BPF programs, attach uprobes
/// through `perf_event_open` and open the files a target mapped through
/// /proc/PID/map_files (CAP_SYS_ADMIN: CAP_BPF, CAP_PERFMON and CAP_CHECKPOINT_RESTORE
/// without it were refused the uprobe by kernel 6.18 here), and read the maps of processes
/// whose capabilities exceed ours (CAP_SYS_PTRACE). Checked before anything else: without
/// them every target would look like one without an allocator.
pub(crate) fn capabilities_suffice(cap_eff: u64) -> bool {
    let has = |cap: u32| cap_eff & (1 << cap) != 0;
    has(CAP_SYS_ADMIN) && has(CAP_SYS_PTRACE)
}

/// Fails unless this process may load BPF programs and attach uprobes.
pub fn check_privileges() -> Result<(), BadInput> {
    let cap_eff = crate::sys::own::effective_capabilities().unwrap_or(0);
    if capabilities_suffice(cap_eff) {
        Ok(())
    } else {
        Err(BadInput(
            "permission denied: allocscope needs root (or CAP_SYS_ADMIN and CAP_SYS_PTRACE: \
             eBPF, uprobes, and reading the targets' memory maps and mapped files); run with \
             sudo"
                .into(),
        ))
    }
}

/// Resolves `program` like execvp would (a path, or a name searched in PATH).
pub(crate) fn resolve_command(program: &OsStr) -> Result<PathBuf, BadInput> {
    let is_executable = |path: &Path| {
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let as_path = Path::new(program);
    let found = if as_path.components().count() > 1 {
        is_executable(as_path).then(|| as_path.to_owned())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(program))
                .find(|candidate| is_executable(candidate))
        })
    };
    found.ok_or_else(|| {
        BadInput(format!(
            "command not found or not executable: {}",
            program.to_string_lossy()
        ))
    })
}

/// The allocators a command will use, before it starts: a statically linked one in the
/// executable itself, and those among the libraries the dynamic loader will map for it
/// (LD_PRELOAD included). A script runs an interpreter found only at exec: the C library
/// this process uses stands in until then (the targets' maps are re-read every second).
pub(crate) fn allocators_for_command(
    program: &Path,
    cache: &mut AllocatorCache,
) -> Result<Vec<Allocator>, BadInput> {
    // Mapped, not read: an interpreter's executable is megabytes, of which only the
    // headers and the symbols are looked at (a copy made a Python command wait longer:
    // docs/performance.md, "Figures quoted from the code").
    let data = crate::infile::map_regular(program)
        .map_err(|e| BadInput(format!("cannot read {}: {e}", program.display())))?;
    let mut found: Vec<Allocator> = Vec::new();
    if data.starts_with(b"\x7fELF") {
        found.extend(cache.of_file(program, true));
        if let Some(interpreter) = targets::interpreter_of(&data) {
            for library in cache.libraries_of(program, &interpreter) {
                found.extend(cache.of_file(&library, false));
            }
        }
    } else if let Ok(own) = cache.of_pid(std::process::id()) {
        found.extend(
            own.into_iter()
                .filter(|a| a.file.kind == AllocatorKind::Glibc),
        );
    }
    if found.is_empty() {
        return Err(BadInput(format!(
            "{}: no allocator found: neither it nor any library it loads defines malloc \
             (statically linked and stripped?)",
            program.display()
        )));
    }
    allocator::in_probing_order(&mut found);
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_masks() {
        assert!(capabilities_suffice(0x1ff_feff_ffff));
        assert!(capabilities_suffice(
            (1 << CAP_SYS_ADMIN) | (1 << CAP_SYS_PTRACE)
        ));
        assert!(
            !capabilities_suffice(1 << CAP_SYS_ADMIN),
            "cannot read the targets"
        );
        let tracing = (1 << CAP_BPF) | (1 << CAP_PERFMON) | (1 << CAP_SYS_PTRACE);
        assert!(!capabilities_suffice(tracing), "refused the uprobe");
        assert!(!capabilities_suffice(0));
    }

    #[test]
    fn commands_resolve_like_execvp() {
        assert!(resolve_command(OsStr::new("sh")).is_ok());
        assert!(resolve_command(OsStr::new("/bin/sh")).is_ok());
        let err = resolve_command(OsStr::new("no-such-command-allocscope")).unwrap_err();
        assert!(err.to_string().contains("command not found"));
    }
}
