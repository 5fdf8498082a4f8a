//! Where the in-process library and a recording's family table live: files in a
//! root-owned directory, named in `LD_PRELOAD` by an absolute path that no program can
//! redirect.
//!
//! Why not a descriptor: `LD_PRELOAD=/proc/self/fd/3` made every child's loader open
//! whatever its program had put on fd 3 (a pipe it then ate, a library whose constructor
//! ran, nothing at all after a `closefrom`), and the inherited descriptors were there for
//! every descendant to see. A path needs no descriptor and no variable beyond `LD_PRELOAD`.
//!
//! The layout (every directory from `/` down must be a real directory owned by root and
//! writable by nobody else, or sticky):
//!
//! ```text
//! /run/allocscope/                                   0755
//!   libsampler_preload-<content hash>.so             0444, its bytes compared before use
//!   .swept                                           0600, empty but a byte: its time is
//!                                                    the last sweep's
//!   rec-<allocscope pid>-<random>/                   0755, one per recording
//!     libsampler_preload.so                          a hard link to the file above
//!     family                                         0600, the family table (removed at the end)
//! ```
//!
//! The library finds `family` beside the path it was loaded from, so the directory names
//! the recording; the link outlives the recording (a daemon the command left behind may
//! exec a program long after, and its loader must still find the file named in its
//! `LD_PRELOAD`). Directories of recordings whose allocscope is gone are removed after a
//! day ([`STALE_AFTER`]), by a sweep at most once an hour ([`SWEEP_EVERY`]).

use std::{
    ffi::{CStr, CString, OsStr},
    fs::File,
    io::{self, Read as _, Write as _},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use anyhow::{bail, Context as _};

/// The directory everything is placed under.
pub const ROOT: &str = "/run/allocscope";

/// The library's name in a recording's directory.
pub const LIBRARY_NAME: &str = "libsampler_preload.so";

/// How long a gone recording's directory is kept for the processes it left running.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

/// How often gone recordings' directories are looked for: a day's recordings leave
/// thousands (a test suite's, a build's), and reading them all slowed every recording's
/// start for 7,600 of them (docs/performance.md, "Many short processes: builds and scripts").
const SWEEP_EVERY: Duration = Duration::from_secs(3600);

/// The file whose modification time says when the root was last swept.
const SWEPT: &CStr = c".swept";

/// A recording's directory, with the library linked into it.
#[derive(Debug)]
pub(crate) struct RecordingDir {
    /// Its path.
    pub path: PathBuf,
    dir: OwnedFd,
}

impl RecordingDir {
    /// The library's path in it (what `LD_PRELOAD` names).
    pub(crate) fn library(&self) -> PathBuf {
        self.path.join(LIBRARY_NAME)
    }

    /// Creates the family table's file in it: new, mode 0600, never through a link.
    pub(crate) fn create_family(&self) -> io::Result<(File, PathBuf)> {
        let name = sampler_common::preload::FAMILY_FILE;
        let file = open_at(
            &self.dir,
            name,
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o600,
        )?;
        Ok((file, self.path.join(OsStr::from_bytes(name.to_bytes()))))
    }
}

/// Places `library` (its bytes) under `root`: the content-addressed file checked or
/// written, old recordings' directories removed, and a new recording directory made with
/// the library linked into it.
pub(crate) fn place(root: &Path, library: &[u8]) -> anyhow::Result<RecordingDir> {
    let root_dir = trusted_directory(root, true)?;
    let name = format!("libsampler_preload-{:016x}.so", fnv1a(library));
    content_file(&root_dir, &name, library)
        .with_context(|| format!("placing {}", root.join(&name).display()))?;
    sweep_now_and_then(&root_dir);
    let own = format!("rec-{}-{:016x}", std::process::id(), random_word());
    let own_c = c_string(own.as_bytes())?;
    // SAFETY: mkdirat with a live descriptor and a NUL-terminated name.
    if unsafe { libc::mkdirat(root_dir.as_raw_fd(), own_c.as_ptr(), 0o755) } != 0 {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("creating {}", root.join(&own).display()));
    }
    let dir = open_dir_at(&root_dir, &own_c)?;
    let (from, to) = (
        c_string(name.as_bytes())?,
        c_string(LIBRARY_NAME.as_bytes())?,
    );
    // SAFETY: linkat between live directory descriptors with NUL-terminated names; without
    // AT_SYMLINK_FOLLOW a link is never followed.
    if unsafe {
        libc::linkat(
            root_dir.as_raw_fd(),
            from.as_ptr(),
            dir.as_raw_fd(),
            to.as_ptr(),
            0,
        )
    } != 0
    {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("linking the library into {}", root.join(&own).display()));
    }
    Ok(RecordingDir {
        path: root.join(own),
        dir,
    })
}

/// Opens directory `path`, creating the components that are missing (0755) if `create`.
/// Every component must be a directory (not a symlink) owned by root or by us,
/// not writable by group or others unless sticky; the last one by us, writable by nobody
/// else at all.
pub fn trusted_directory(path: &Path, create: bool) -> anyhow::Result<OwnedFd> {
    if !path.is_absolute() {
        bail!("{} is not an absolute path", path.display());
    }
    // SAFETY: geteuid has no preconditions.
    let us = unsafe { libc::geteuid() };
    let mut current = open_dir_at_cwd(c"/")?;
    let components: Vec<&OsStr> = path.iter().skip(1).collect();
    for (i, component) in components.iter().enumerate() {
        let last = i + 1 == components.len();
        let name = c_string(component.as_bytes())?;
        if create {
            // SAFETY: mkdirat with a live descriptor and a NUL-terminated name; an existing
            // one is checked below like any other.
            unsafe { libc::mkdirat(current.as_raw_fd(), name.as_ptr(), 0o755) };
        }
        let next = open_dir_at(&current, &name)
            .with_context(|| format!("{}: not a directory to trust", path.display()))?;
        let st = fstat(&next)?;
        let shown = components[..=i]
            .iter()
            .fold(PathBuf::from("/"), |p, c| p.join(c));
        let sticky = st.st_mode & libc::S_ISVTX != 0;
        if st.st_uid != 0 && st.st_uid != us {
            bail!(
                "{} is owned by uid {}, not root",
                shown.display(),
                st.st_uid
            );
        }
        if last && (st.st_uid != us || st.st_mode & 0o022 != 0) {
            bail!(
                "{} must be owned by uid {us} and writable by nobody else (mode {:o}, uid {})",
                shown.display(),
                st.st_mode & 0o7777,
                st.st_uid
            );
        }
        if !last && st.st_mode & 0o022 != 0 && !sticky {
            bail!(
                "{} is writable by others (mode {:o})",
                shown.display(),
                st.st_mode & 0o7777
            );
        }
        current = next;
    }
    Ok(current)
}

/// Makes sure `dir/name` is a regular file of ours, read-only, holding exactly `bytes`;
/// (re)writes it otherwise, through a new file renamed over it.
fn content_file(dir: &OwnedFd, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let c_name = c_string(name.as_bytes())?;
    if let Ok(mut file) = open_at(dir, &c_name, libc::O_RDONLY | libc::O_NOFOLLOW, 0) {
        let st = fstat(&file)?;
        // SAFETY: geteuid has no preconditions.
        let ours = st.st_uid == unsafe { libc::geteuid() };
        let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
        if ours && regular && st.st_mode & 0o222 == 0 && st.st_size as usize == bytes.len() {
            let mut found = Vec::with_capacity(bytes.len());
            file.read_to_end(&mut found)?;
            if found == bytes {
                return Ok(());
            }
        }
    }
    let temporary = format!(".new-{:016x}", random_word());
    let c_temporary = c_string(temporary.as_bytes())?;
    let mut file = open_at(
        dir,
        &c_temporary,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o444,
    )?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    let renamed = written.and_then(|()| {
        // SAFETY: renameat within one live directory, NUL-terminated names.
        let rc = unsafe {
            libc::renameat(
                dir.as_raw_fd(),
                c_temporary.as_ptr(),
                dir.as_raw_fd(),
                c_name.as_ptr(),
            )
        };
        match rc {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    });
    if renamed.is_err() {
        // SAFETY: unlinkat of our own temporary name.
        unsafe { libc::unlinkat(dir.as_raw_fd(), c_temporary.as_ptr(), 0) };
    }
    Ok(renamed?)
}

/// Removes gone recordings' directories ([`remove_stale`]) on a thread of its own, at most
/// once per [`SWEEP_EVERY`] (marked by [`SWEPT`]'s time): never on a recording's path to
/// its command's start. Best effort: a sweep cut short by allocscope's exit is finished by
/// the next one.
fn sweep_now_and_then(root: &OwnedFd) {
    if !sweep_due(root, SystemTime::now()) {
        return;
    }
    let Ok(root) = root.try_clone() else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("sweep".into())
        .spawn(move || remove_stale(&root, STALE_AFTER));
}

/// Whether `root` was last swept over [`SWEEP_EVERY`] before `now` (or never): if so, the
/// mark is set to `now`, so that one recording of several starting together sweeps.
fn sweep_due(root: &OwnedFd, now: SystemTime) -> bool {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    let Ok(mark) = open_at(root, SWEPT, flags, 0o600) else {
        return false;
    };
    let Ok(st) = fstat(&mark) else {
        return false;
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return false;
    }
    let last = SystemTime::UNIX_EPOCH + Duration::new(st.st_mtime.max(0) as u64, 0);
    // A new mark (size 0, never stamped) has now's time: its first byte says it was.
    let stamped = st.st_size > 0;
    if stamped && now.duration_since(last).is_ok_and(|age| age < SWEEP_EVERY) {
        return false;
    }
    let at = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let times = [libc::timespec {
        tv_sec: at.as_secs() as libc::time_t,
        tv_nsec: at.subsec_nanos() as libc::c_long,
    }; 2];
    // SAFETY: a live descriptor and two valid timespecs; one byte from a valid buffer.
    unsafe {
        if !stamped {
            libc::pwrite(mark.as_raw_fd(), b"s".as_ptr().cast(), 1, 0);
        }
        libc::futimens(mark.as_raw_fd(), times.as_ptr());
    }
    true
}

/// Removes the directories of recordings whose allocscope is gone and that are older than
/// `age` (their files first). Best effort: what cannot be read or removed stays.
fn remove_stale(root: &OwnedFd, age: Duration) {
    let Ok(entries) = std::fs::read_dir(crate::outfile::through(root)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = recording_pid(&name.to_string_lossy()) else {
            continue;
        };
        let old = entry
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|elapsed| elapsed > age);
        let alive = crate::sys::process::exists(pid);
        if !old || alive {
            continue;
        }
        let Ok(c_name) = c_string(name.as_bytes()) else {
            continue;
        };
        if let Ok(dir) = open_dir_at(root, &c_name) {
            for file in [c"family", c"libsampler_preload.so"] {
                // SAFETY: unlinkat of a name in a live directory descriptor.
                unsafe { libc::unlinkat(dir.as_raw_fd(), file.as_ptr(), 0) };
            }
        }
        // SAFETY: as above, the (now empty) directory.
        unsafe { libc::unlinkat(root.as_raw_fd(), c_name.as_ptr(), libc::AT_REMOVEDIR) };
    }
}

/// The allocscope pid in a recording directory's name (`rec-PID-RANDOM`).
fn recording_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("rec-")?;
    let (pid, random) = rest.split_once('-')?;
    (random.len() == 16 && random.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| pid.parse().ok())
        .flatten()
}

/// FNV-1a, 64 bits: a name for the library's content (the content itself is compared).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn random_word() -> u64 {
    let mut word = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into the local.
    unsafe { libc::getrandom((&raw mut word).cast(), 8, 0) };
    word
}

fn c_string(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
}

fn open_at(dir: &OwnedFd, name: &CStr, flags: libc::c_int, mode: libc::c_uint) -> io::Result<File> {
    // SAFETY: openat with a live descriptor and a NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn open_dir_at(dir: &OwnedFd, name: &CStr) -> io::Result<OwnedFd> {
    open_at(
        dir,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )
    .map(OwnedFd::from)
}

fn open_dir_at_cwd(path: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: open with a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: &impl std::os::fd::AsRawFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat with a live descriptor and a stat to fill.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    use super::*;

    fn root_in(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("allocscope")
    }

    #[test]
    fn the_library_is_placed_once_by_content_and_linked_per_recording() {
        let tmp = tempfile::tempdir().unwrap();
        let root = root_in(&tmp);
        let first = place(&root, b"library one").unwrap();
        let second = place(&root, b"library one").unwrap();
        assert_ne!(first.path, second.path);
        let (a, b) = (
            std::fs::metadata(first.library()).unwrap(),
            std::fs::metadata(second.library()).unwrap(),
        );
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()), "one file, linked");
        assert_eq!(a.mode() & 0o7777, 0o444);
        assert_eq!(std::fs::read(first.library()).unwrap(), b"library one");
        assert_eq!(
            std::fs::metadata(&root).unwrap().permissions().mode() & 0o777,
            0o755
        );
        let (_, family) = first.create_family().unwrap();
        assert_eq!(std::fs::metadata(&family).unwrap().mode() & 0o777, 0o600);
        assert!(
            first.create_family().is_err(),
            "never over an existing file"
        );
    }

    #[test]
    fn a_changed_library_file_is_replaced_before_use() {
        let tmp = tempfile::tempdir().unwrap();
        let root = root_in(&tmp);
        let placed = place(&root, b"the real bytes").unwrap();
        let name = format!("libsampler_preload-{:016x}.so", fnv1a(b"the real bytes"));
        let content = root.join(&name);
        std::fs::set_permissions(&content, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&content, b"the evil bytes").unwrap();
        drop(placed);
        let again = place(&root, b"the real bytes").unwrap();
        assert_eq!(std::fs::read(again.library()).unwrap(), b"the real bytes");
        std::fs::remove_file(&content).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &content).unwrap();
        let third = place(&root, b"the real bytes").unwrap();
        assert_eq!(std::fs::read(third.library()).unwrap(), b"the real bytes");
        assert!(!std::fs::symlink_metadata(&content).unwrap().is_symlink());
    }

    #[test]
    fn an_untrusted_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = place(&open.join("allocscope"), b"x").unwrap_err();
        assert!(
            format!("{error:#}").contains("writable by others"),
            "{error:#}"
        );
        let root = root_in(&tmp);
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o775)).unwrap();
        assert!(place(&root, b"x").is_err(), "group-writable");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
        assert!(place(&link.join("allocscope2"), b"x").is_err(), "a symlink");
    }

    #[test]
    fn stale_recordings_of_gone_processes_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = root_in(&tmp);
        let ours = place(&root, b"lib").unwrap();
        // A recording of a pid that cannot exist (above pid_max).
        let gone = root.join("rec-4999999-00000000000000ab");
        std::fs::create_dir(&gone).unwrap();
        std::fs::write(gone.join("family"), b"").unwrap();
        let dir = trusted_directory(&root, false).unwrap();
        remove_stale(&dir, Duration::from_secs(3600));
        assert!(gone.exists(), "young: kept");
        remove_stale(&dir, Duration::ZERO);
        assert!(!gone.exists(), "old and gone: removed");
        assert!(ours.path.exists(), "a live allocscope's: kept");
        assert_eq!(recording_pid("rec-12-00000000000000ab"), Some(12));
        assert_eq!(recording_pid("rec-12-x"), None);
        assert_eq!(recording_pid("libsampler_preload-00.so"), None);
    }

    #[test]
    fn the_root_is_swept_once_an_hour_by_one_recording() {
        let tmp = tempfile::tempdir().unwrap();
        let root = root_in(&tmp);
        place(&root, b"lib").unwrap();
        let dir = trusted_directory(&root, false).unwrap();
        let now = SystemTime::now() + Duration::from_secs(10);
        assert!(!sweep_due(&dir, now), "placing swept it");
        let later = now + SWEEP_EVERY;
        assert!(sweep_due(&dir, later), "an hour on");
        assert!(!sweep_due(&dir, later), "just swept");
        assert!(!sweep_due(&dir, later + Duration::from_secs(3000)));
        let mark = root.join(".swept");
        std::fs::remove_file(&mark).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &mark).unwrap();
        assert!(!sweep_due(&dir, now), "a link is not followed");
        assert_eq!(
            std::fs::read(&mark).unwrap(),
            std::fs::read("/etc/passwd").unwrap()
        );
    }
}
