//! Checks run before anything is attached, each failing with a message a user can act on.

use std::{
    ffi::OsStr,
    fs::File,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use crate::{
    config::BadInput,
    probe::allocator::{self, Allocator},
    probe::maps,
};

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Whether a `CapEff:` mask allows loading tracing BPF programs and attaching uprobes.
pub fn capabilities_suffice(cap_eff: u64) -> bool {
    let has = |cap: u32| cap_eff & (1 << cap) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// Fails unless this process may load BPF programs and attach uprobes.
pub fn check_privileges() -> Result<(), BadInput> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    if capabilities_suffice(cap_eff) {
        Ok(())
    } else {
        Err(BadInput(
            "permission denied: loading eBPF programs needs root (or CAP_BPF and CAP_PERFMON); \
             run with sudo"
                .into(),
        ))
    }
}

/// Finds the allocator of a running process.
pub fn allocator_of_pid(pid: u32) -> Result<Allocator, BadInput> {
    if !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(BadInput(format!("no such process: pid {pid}")));
    }
    let vmas = maps::read(pid)
        .map_err(|e| BadInput(format!("cannot read the memory map of pid {pid}: {e}")))?;
    allocator::find(&vmas).map_err(|e| BadInput(format!("pid {pid}: {e}")))
}

/// Resolves `program` like execvp would (a path, or a name searched in PATH).
pub fn resolve_command(program: &OsStr) -> Result<PathBuf, BadInput> {
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

/// The allocator a command will use: the C library this process uses, which a dynamically
/// linked command maps too. A statically linked command has none to probe.
pub fn allocator_for_command(program: &Path) -> Result<Allocator, BadInput> {
    let data = std::fs::read(program)
        .map_err(|e| BadInput(format!("cannot read {}: {e}", program.display())))?;
    if data.starts_with(b"\x7fELF") && !is_dynamically_linked(&data) {
        return Err(BadInput(format!(
            "{}: no allocator found: statically linked, no libc.so to probe",
            program.display()
        )));
    }
    let own = maps::read(std::process::id())
        .map_err(|e| BadInput(format!("cannot read own memory map: {e}")))?;
    allocator::find(&own).map_err(|e| BadInput(e.to_string()))
}

fn is_dynamically_linked(elf: &[u8]) -> bool {
    use object::Object as _;
    object::File::parse(elf)
        .ok()
        .and_then(|file| file.section_by_name(".interp").map(|_| ()))
        .is_some()
}

/// Opens a temporary file beside `output`, proving it writable before anything is
/// attached; the profile is later written there and renamed over `output` (atomic).
pub fn open_output(output: &Path) -> Result<(File, PathBuf), BadInput> {
    let dir = match output.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    if output.is_dir() {
        return Err(BadInput(format!(
            "output {} is a directory",
            output.display()
        )));
    }
    let name = output.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(".{name}.allocscope-{}", std::process::id()));
    let file = File::create(&temp)
        .map_err(|e| BadInput(format!("cannot write output {}: {e}", output.display())))?;
    Ok((file, temp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_masks() {
        assert!(capabilities_suffice(0x1ff_feff_ffff));
        assert!(capabilities_suffice(1 << CAP_SYS_ADMIN));
        assert!(capabilities_suffice((1 << CAP_BPF) | (1 << CAP_PERFMON)));
        assert!(!capabilities_suffice(1 << CAP_BPF));
        assert!(!capabilities_suffice(0));
    }

    #[test]
    fn commands_resolve_like_execvp() {
        assert!(resolve_command(OsStr::new("sh")).is_ok());
        assert!(resolve_command(OsStr::new("/bin/sh")).is_ok());
        let err = resolve_command(OsStr::new("no-such-command-allocscope")).unwrap_err();
        assert!(err.to_string().contains("command not found"));
    }

    #[test]
    fn unwritable_output_is_refused() {
        let err = open_output(Path::new("/nonexistent-dir/x.json")).unwrap_err();
        assert!(err.to_string().contains("cannot write output"), "{err}");
        assert!(open_output(Path::new("/")).is_err());
    }
}
