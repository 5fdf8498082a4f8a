//! Checks run before anything is attached, each failing with a message a user can act on.

use std::{
    ffi::OsStr,
    fs::File,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use crate::{
    config::{BadInput, Output},
    probe::{
        allocator::{self, Allocator},
        maps,
    },
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

/// Proves that the output can be written before anything is attached: a file's directory
/// must accept a new file; a snapshot directory is created if missing.
pub fn check_output(output: &Output) -> Result<(), BadInput> {
    let (dir, shown) = match output {
        Output::File(path) => {
            if path.is_dir() {
                return Err(BadInput(format!(
                    "output {} is a directory",
                    path.display()
                )));
            }
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
                _ => PathBuf::from("."),
            };
            (dir, path.clone())
        }
        Output::Snapshots { dir, .. } => return check_snapshot_dir(dir),
    };
    check_writable(&dir, &shown)
}

/// Creates the snapshot directory `dir` if missing and proves it accepts files.
pub fn check_snapshot_dir(dir: &Path) -> Result<(), BadInput> {
    std::fs::create_dir_all(dir).map_err(|e| {
        BadInput(format!(
            "cannot create snapshot directory {}: {e}",
            dir.display()
        ))
    })?;
    check_writable(dir, dir)
}

fn check_writable(dir: &Path, shown: &Path) -> Result<(), BadInput> {
    let probe = dir.join(format!(".allocscope-write-test-{}", std::process::id()));
    File::create(&probe)
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| BadInput(format!("cannot write output {}: {e}", shown.display())))
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
        let err = check_output(&Output::File("/nonexistent-dir/x.json".into())).unwrap_err();
        assert!(err.to_string().contains("cannot write output"), "{err}");
        assert!(check_output(&Output::File("/".into())).is_err());
        let snapshots = Output::Snapshots {
            dir: "/proc/allocscope-test".into(),
            every: std::time::Duration::from_secs(1),
            keep: None,
        };
        assert!(check_output(&snapshots)
            .unwrap_err()
            .to_string()
            .contains("snapshot directory"));
    }
}
