//! Finding target processes' allocators: the allocator analysis, cached per file identity so
//! a host-wide recording reads each distinct library once however many processes map it.

use std::{
    collections::HashMap,
    ffi::OsStr,
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::probe::allocator::{self, Allocator, AllocatorError, AllocatorFile};
use crate::sys::maps::{self, FileId, Vma};
use crate::sys::process::{is_kernel_thread, state_of};

/// Why a process's allocators could not be found.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    /// The process does not exist (any more).
    #[error("no such process")]
    Gone,
    /// A kernel thread: no user-space memory, no allocator.
    #[error("a kernel thread: it has no user-space memory to profile")]
    KernelThread,
    /// A zombie: it has exited, and its parent has not collected its status yet.
    #[error("a zombie: it has exited (its parent has not reaped it), nothing is left to profile")]
    Zombie,
    /// Its main thread has exited (`pthread_exit`) while others live on: the kernel gives
    /// the process's maps, executable and probes through its main thread, so none is had.
    #[error(
        "its main thread has exited while {0} other thread(s) live on: allocscope cannot \
         read or probe such a process (its maps, executable and probes are reached through \
         the main thread)"
    )]
    MainThreadExited(usize),
    /// Its memory map is unreadable.
    #[error("cannot read its memory map: {0}")]
    Maps(std::io::Error),
    /// It maps no allocator.
    #[error(transparent)]
    NoAllocator(#[from] AllocatorError),
}

/// Allocator analyses by file identity (device, inode); `None` for a file that is not one.
/// And the libraries each executable loads, by the executable's identity and version: the
/// dynamic loader is asked once per program file, not once per process (a shell loop
/// exec'ing `sed` 300 times ran `ld.so --list` 300 times: docs/performance.md, "Many short
/// processes: builds and scripts").
#[derive(Default)]
pub struct AllocatorCache {
    files: HashMap<FileId, Option<Arc<AllocatorFile>>>,
    libraries: HashMap<ProgramVersion, Vec<PathBuf>>,
    /// The allocators last found for each process: what a fork of it starts with.
    processes: HashMap<u32, Vec<Allocator>>,
}

/// An executable file as it is now: its identity, and its size and modification time
/// (a file rewritten in place keeps its inode, not its libraries).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ProgramVersion {
    file: FileId,
    len: u64,
    modified_ns: i128,
}

impl ProgramVersion {
    fn of(metadata: &std::fs::Metadata) -> ProgramVersion {
        use std::os::unix::fs::MetadataExt as _;
        ProgramVersion {
            file: FileId::of(metadata),
            len: metadata.len(),
            modified_ns: i128::from(metadata.mtime()) * 1_000_000_000
                + i128::from(metadata.mtime_nsec()),
        }
    }
}

/// Programs whose libraries are remembered at most (then forgotten all at once: a host
/// runs far fewer distinct programs).
const PROGRAMS_REMEMBERED: usize = 4096;

/// Processes whose allocators are remembered at most (then forgotten all at once: their
/// forks read their own maps again).
const PROCESSES_REMEMBERED: usize = 4096;

impl AllocatorCache {
    /// The allocators `pid` maps now.
    pub fn of_pid(&mut self, pid: u32) -> Result<Vec<Allocator>, FindError> {
        let vmas = maps::read(pid).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FindError::Gone,
            _ => FindError::Maps(e),
        })?;
        if vmas.is_empty() {
            // Nothing mapped: a kernel thread, or a zombie (gone in all but name).
            let zombie = state_of(pid) == Some('Z');
            let live = crate::sys::process::live_threads(pid);
            return Err(if is_kernel_thread(pid) {
                FindError::KernelThread
            } else if zombie && live > 0 {
                FindError::MainThreadExited(live)
            } else if zombie {
                FindError::Zombie
            } else {
                FindError::Gone
            });
        }
        // Looked at after the maps: the exit clears the link first, and a maps read the exit
        // overtook ends short, without the mappings at the top (a preloaded library, mapped
        // before the C library and so above it): taken as read, a carrier of the front end
        // looked like a program probed through its C library alone. (Refused otherwise, the
        // executable is not named.)
        let exe = match crate::sys::process::exe_metadata(pid) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(FindError::Gone),
            exe => exe.ok(),
        };
        let executable = exe.and_then(|exe| executable_of(&exe, &vmas));
        Ok(allocator::find(
            pid,
            &vmas,
            executable.as_deref(),
            |vma, path, in_executable| self.analysed(vma, path, in_executable),
            |library, producer| dormant_front_end(pid, &vmas, &library.path, producer),
        )?)
    }

    fn analysed(
        &mut self,
        vma: &Vma,
        path: &Path,
        in_executable: bool,
    ) -> Option<Arc<AllocatorFile>> {
        let shown = vma.path.clone().unwrap_or_default();
        self.files
            .entry(vma.file_id.clone())
            .or_insert_with(|| allocator::analyse_file(path, in_executable, &shown).map(Arc::new))
            .clone()
    }

    /// Remembers the allocators found for `pid` (see [`Self::inherited`]).
    pub fn remember(&mut self, pid: u32, allocators: &[Allocator]) {
        if self.processes.len() >= PROCESSES_REMEMBERED {
            self.processes.clear();
        }
        self.processes.insert(pid, allocators.to_vec());
    }

    /// The allocators of a new process of `parent` (forked, not exec'd): its parent's, as
    /// last found, without reading its maps (they are a copy of its parent's; a child
    /// that exec'd meanwhile is read again at its exec). `None` if they are not known.
    pub fn inherited(&self, parent: u32) -> Option<Vec<Allocator>> {
        self.processes.get(&parent).cloned()
    }

    /// The libraries `program` (with dynamic loader `interpreter`) will load: see
    /// [`libraries_of`], asked once per version of the file.
    pub fn libraries_of(&mut self, program: &Path, interpreter: &Path) -> Vec<PathBuf> {
        let Ok(metadata) = std::fs::metadata(program) else {
            return libraries_of(program, interpreter);
        };
        let version = ProgramVersion::of(&metadata);
        if let Some(known) = self.libraries.get(&version) {
            return known.clone();
        }
        if self.libraries.len() >= PROGRAMS_REMEMBERED {
            self.libraries.clear();
        }
        let found = libraries_of(program, interpreter);
        self.libraries.insert(version, found.clone());
        found
    }

    /// Marks `allocator`'s file as patched by this recording's in-process front end (see
    /// [`crate::probe::patch`]): it and every allocator found in the file from now on.
    pub fn patched_in_process(&mut self, allocator: &mut Allocator) {
        let mut file = (*allocator.file).clone();
        file.patched_in_process = true;
        let file = Arc::new(file);
        self.files
            .insert(allocator.file_id.clone(), Some(file.clone()));
        allocator.file = file;
    }

    /// Undoes [`Self::patched_in_process`]: the file is probed like any other from now on.
    pub fn unpatched(&mut self, allocator: &mut Allocator) {
        let mut file = (*allocator.file).clone();
        file.patched_in_process = false;
        let file = Arc::new(file);
        self.files
            .insert(allocator.file_id.clone(), Some(file.clone()));
        allocator.file = file;
    }

    /// The allocators of a file on this host's file system (the command to start, its
    /// libraries), outside any process.
    pub fn of_file(&mut self, path: &Path, in_executable: bool) -> Option<Allocator> {
        let metadata = std::fs::metadata(path).ok()?;
        let file_id = FileId::of(&metadata);
        let file = self
            .files
            .entry(file_id.clone())
            .or_insert_with(|| allocator::analyse_file(path, in_executable, path).map(Arc::new))
            .clone()?;
        // Shown as the process's maps will show it (a command given by a relative path or
        // through a link was noted late twice: once by each name).
        let shown = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        Some(Allocator {
            path: path.to_owned(),
            shown,
            file_id,
            in_executable,
            file,
        })
    }
}

/// The mapped path of the executable `exe` (`/proc/PID/exe`) among a process's mappings.
fn executable_of(exe: &std::fs::Metadata, vmas: &[Vma]) -> Option<PathBuf> {
    let id = FileId::of(exe);
    vmas.iter()
        .find(|vma| vma.file_id == id)
        .and_then(|vma| vma.path.clone())
}

/// Directories the dynamic loader searches by default on this platform (and their
/// `/usr/local` sibling), where the allocator libraries a program may load live.
const LIBRARY_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/local/lib",
    "/lib64",
    "/usr/lib64",
    "/usr/lib",
];

/// Names of the allocator libraries probed ahead for `--follow` and `--comm` (their sonames
/// start so): those a program is given with LD_PRELOAD. Not libpython: every Python
/// process on the host would pay the trap on each small object while the recording runs;
/// a followed Python process has its object allocator probed at its exec instead, and its
/// coverage says how late.
const ALLOCATOR_LIBRARIES: &[&str] = &[
    "libjemalloc.so",
    "libtcmalloc.so",
    "libtcmalloc_minimal.so",
    "libmimalloc.so",
];

/// The allocator libraries installed on this system (each file once, however many links
/// name it): what a new process may load besides the C library.
pub fn system_allocator_libraries() -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    let mut found = Vec::new();
    for dir in LIBRARY_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut names: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|path| is_allocator_library(path))
            .collect();
        names.sort();
        for path in names {
            let Ok(metadata) = std::fs::metadata(&path) else {
                continue;
            };
            if metadata.is_file() && seen.insert(FileId::of(&metadata)) {
                found.push(path);
            }
        }
    }
    found
}

/// Whether `path` names a shared library of a known allocator (`libjemalloc.so.2`, not
/// `libjemalloc.a`). Pure.
pub fn is_allocator_library(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(OsStr::to_str) else {
        return false;
    };
    ALLOCATOR_LIBRARIES
        .iter()
        .any(|prefix| name.starts_with(prefix))
        && name.contains(".so")
}

/// The libraries a dynamically linked `program` will load (LD_PRELOAD included), as the
/// system's dynamic loader resolves them in `--list` mode, which loads nothing and runs
/// nothing of the program. `interpreter` is the program's PT_INTERP.
pub fn libraries_of(program: &Path, interpreter: &Path) -> Vec<PathBuf> {
    let Ok(output) = std::process::Command::new(interpreter)
        .arg("--list")
        .arg(program)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    loader_list(&String::from_utf8_lossy(&output.stdout))
}

/// The resolved paths in the dynamic loader's `--list` output. Pure.
pub fn loader_list(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.trim(),
                None => line,
            };
            let path = path.split(" (").next()?.trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// The PT_INTERP of an ELF file (its dynamic loader), `None` when statically linked.
pub fn interpreter_of(elf: &[u8]) -> Option<PathBuf> {
    use object::{Object as _, ObjectSection as _};
    let file = object::File::parse(elf).ok()?;
    let data = file.section_by_name(".interp")?.data().ok()?;
    let path = data.split(|&b| b == 0).next()?;
    Some(PathBuf::from(
        <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path),
    ))
}

/// Whether allocscope's library, mapped by `pid` from `library`, is dormant there (it
/// found the process under a seccomp filter, see `sampler-preload`'s `sandbox`, or
/// another `producer` among its files, see its `producer`). Only such a process is asked
/// (its exported flag read from its memory).
fn dormant_front_end(pid: u32, vmas: &[Vma], library: &Path, producer: bool) -> bool {
    let filtered = crate::sys::process::seccomp_mode(pid).is_some_and(|mode| mode != 0);
    let dormant = (filtered || producer) && crate::preload::dormant(pid, vmas, library);
    if dormant {
        let why = if producer {
            "another producer reports its allocations: recorded through its probes"
        } else {
            "under a seccomp filter: probed with uprobes"
        };
        log::debug!("pid {pid}: its in-process sampler is dormant ({why})");
    }
    dormant
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zombie is said to be one, not "no such process": a real
    /// zombie, our own unreaped child.
    #[test]
    fn a_zombie_is_named_as_one() {
        assert_eq!(
            crate::sys::process::stat_state("42 (a) b) Z 1 42 42 0 -1 4194564"),
            Some('Z')
        );
        assert_eq!(crate::sys::process::stat_state("7 (sh) S 1"), Some('S'));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let exited = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            state_of(pid) == Some('Z')
        });
        assert!(exited, "the child never became a zombie");
        let found = AllocatorCache::default().of_pid(pid);
        assert!(matches!(found, Err(FindError::Zombie)), "{found:?}");
        child.wait().unwrap();
    }

    #[test]
    fn knows_allocator_libraries_by_name() {
        for yes in [
            "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
            "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
            "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2.0",
        ] {
            assert!(is_allocator_library(Path::new(yes)), "{yes}");
        }
        for no in [
            "/usr/lib/x86_64-linux-gnu/libjemalloc.a",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
            "/usr/lib/python3.11",
            "/usr/lib/x86_64-linux-gnu/libjemalloc_pic.a",
        ] {
            assert!(!is_allocator_library(Path::new(no)), "{no}");
        }
    }

    /// The loader is asked once per version of a program: the remembered answer is the
    /// loader's, and a file rewritten in place (same inode) is a new version.
    #[test]
    fn remembers_a_programs_libraries_per_version() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("true");
        std::fs::copy("/bin/true", &program).unwrap();
        let interpreter = interpreter_of(&std::fs::read(&program).unwrap()).unwrap();
        let mut cache = AllocatorCache::default();
        let first = cache.libraries_of(&program, &interpreter);
        assert!(
            first
                .iter()
                .any(|p| p.to_string_lossy().contains("libc.so")),
            "{first:?}"
        );
        assert_eq!(cache.libraries_of(&program, &interpreter), first);
        assert_eq!(cache.libraries.len(), 1);
        let before = ProgramVersion::of(&std::fs::metadata(&program).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let bytes = std::fs::read("/bin/true").unwrap();
        std::fs::write(&program, &bytes).unwrap();
        let after = ProgramVersion::of(&std::fs::metadata(&program).unwrap());
        assert_eq!(before.file, after.file, "rewritten in place");
        assert_ne!(before, after);
        cache.libraries_of(&program, &interpreter);
        assert_eq!(cache.libraries.len(), 2);
    }

    #[test]
    fn parses_the_loader_list() {
        let text = "\tlinux-vdso.so.1 (0x00007ffc)\n\
                    \t/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 (0x00007f01)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f02)\n\
                    \tlibmissing.so => not found\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f03)\n";
        assert_eq!(
            loader_list(text),
            vec![
                PathBuf::from("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn finds_this_process_allocator() {
        let mut cache = AllocatorCache::default();
        let found = cache.of_pid(std::process::id()).unwrap();
        assert!(
            found
                .iter()
                .any(|a| a.file.kind == allocator::AllocatorKind::Glibc),
            "{found:?}"
        );
        assert!(matches!(cache.of_pid(u32::MAX - 1), Err(FindError::Gone)));
        assert!(
            matches!(cache.of_pid(2), Err(FindError::KernelThread)),
            "kthreadd"
        );
        assert!(is_kernel_thread(2) && !is_kernel_thread(std::process::id()));
    }
}
