//! Files allocscope creates, created as root can afford to.
//!
//! allocscope runs as root and writes where a user points it, often a shared directory
//! (`/tmp`, a project directory other users can write). So every file is created the way
//! an attacker who owns a name in that directory cannot exploit:
//!
//! * profiles go to a temporary file with an unpredictable name, created with
//!   `O_CREAT|O_EXCL` (which never follows a symlink) and mode 0600 (profiles reveal paths,
//!   symbols and process names), then renamed over the destination, so a reader never sees
//!   half a profile;
//! * a destination that exists and is not a regular file (a device such as `/dev/null`, a
//!   FIFO, a socket, a directory, or a symlink to one of them) is refused: a rename would
//!   replace it for the whole machine;
//! * a snapshot never replaces another file: a name already taken gets a `-N` suffix;
//! * the command log of `top -- CMD` is opened without following a symlink and reused only
//!   if it is a regular file we own with no other link to it;
//! * a snapshot directory is opened one component at a time, and a symlink on the way that
//!   another user planted in a sticky world-writable directory (`/tmp`) is refused, as the
//!   kernel's `fs.protected_symlinks` would (which is often off); snapshots are then written
//!   through the directory's descriptor, so the path cannot be swapped after the check.

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

/// Mode of every file allocscope creates (before the umask).
pub(crate) const FILE_MODE: u32 = 0o600;

/// Why a destination cannot be written.
fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("refusing to replace {}: {why}", path.display()),
    )
}

/// The directory a file at `path` is created in.
pub fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Fails unless `path` is absent or a regular file (possibly behind a symlink, which the
/// rename replaces, not its target).
pub fn check_destination(path: &Path) -> io::Result<()> {
    let link = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let target = if link.file_type().is_symlink() {
        match std::fs::metadata(path) {
            Ok(metadata) => metadata,
            // A dangling link: the rename replaces the link itself.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    } else {
        link
    };
    let kind = target.file_type();
    if kind.is_file() {
        Ok(())
    } else if kind.is_dir() {
        Err(refused(path, "it is a directory"))
    } else {
        Err(refused(
            path,
            "it is not a regular file (a device, FIFO or socket); write to a regular file",
        ))
    }
}

/// A new temporary file in `dir`: unpredictable name, `O_EXCL`, mode [`FILE_MODE`].
fn temporary_in(dir: &Path, name: &str) -> io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".allocscope-tmp")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(FILE_MODE))
        .tempfile_in(dir)
}

/// Bytes written to the file at once.
const WRITE_BUFFER: usize = 1 << 20;

/// Writes a new temporary file beside `path` with `contents`, flushed to disk.
fn write_temporary(
    path: &Path,
    contents: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
) -> io::Result<tempfile::NamedTempFile> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut temp = temporary_in(directory_of(path), &name)?;
    {
        let mut out = BufWriter::with_capacity(WRITE_BUFFER, temp.as_file_mut());
        contents(&mut out)?;
        out.flush()?;
    }
    temp.as_file().sync_all()?;
    Ok(temp)
}

/// Writes `path` atomically (temporary file, then rename), replacing a regular file there;
/// refuses anything else (see the module doc). On error nothing is left behind.
pub fn write_replacing(
    path: &Path,
    mut contents: impl FnMut(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    check_destination(path)?;
    let temp = write_temporary(path, &mut contents)?;
    // Checked again: writing took a while.
    check_destination(path)?;
    temp.persist(path).map(drop).map_err(|e| e.error)
}

/// Writes a new file named `stem.extension` in `dir` (or `stem-1.extension`, `stem-2…` if
/// that name is taken), never replacing anything; returns the path written.
pub fn write_new(
    dir: &Path,
    stem: &str,
    extension: &str,
    mut contents: impl FnMut(&mut dyn Write) -> io::Result<()>,
) -> io::Result<PathBuf> {
    let first = dir.join(format!("{stem}.{extension}"));
    let mut temp = write_temporary(&first, &mut contents)?;
    for n in 0..1000 {
        let path = if n == 0 {
            first.clone()
        } else {
            dir.join(format!("{stem}-{n}.{extension}"))
        };
        match temp.persist_noclobber(&path) {
            Ok(_) => return Ok(path),
            Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => temp = e.file,
            Err(e) => return Err(e.error),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("{}: 1000 names taken", first.display()),
    ))
}

/// Opens the directory `path` (`O_PATH`), one component at a time, refusing a symlink that
/// another user planted in a sticky world-writable directory: one owned neither by us nor
/// by the directory's owner (the kernel's `fs.protected_symlinks` rule, applied whatever
/// the sysctl says). Every component is opened relative to the one before it, so nothing
/// can be swapped between the check and the open.
pub fn open_directory(path: &Path) -> io::Result<std::os::fd::OwnedFd> {
    let start = if path.is_absolute() { "/" } else { "." };
    let base = open_at(None, Path::new(start), libc::O_PATH | libc::O_DIRECTORY)?;
    walk(base, path, 0, false)
}

/// [`open_directory`], creating the missing components (mode 0755) on the way, each in the
/// directory just opened (never through a symlink that was not checked).
pub fn create_directory(path: &Path) -> io::Result<std::os::fd::OwnedFd> {
    let start = if path.is_absolute() { "/" } else { "." };
    let base = open_at(None, Path::new(start), libc::O_PATH | libc::O_DIRECTORY)?;
    walk(base, path, 0, true)
}

/// The path through which files are created in a directory opened by [`open_directory`].
pub fn through(dir: &std::os::fd::OwnedFd) -> PathBuf {
    crate::sys::own::fd_path(dir)
}

/// Symlinks followed in one walk at most (the kernel's limit).
const MAX_SYMLINKS: usize = 40;

fn walk(
    mut current: std::os::fd::OwnedFd,
    path: &Path,
    mut followed: usize,
    create: bool,
) -> io::Result<std::os::fd::OwnedFd> {
    use std::path::Component;
    for component in path.components() {
        let name = match component {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
            Component::ParentDir => Path::new(".."),
            Component::Normal(name) => Path::new(name),
        };
        let here = stat_at(&current, Path::new("."), 0)?;
        let entry = match stat_at(&current, name, libc::AT_SYMLINK_NOFOLLOW) {
            Err(e) if create && e.kind() == io::ErrorKind::NotFound => {
                make_dir_at(&current, name)?;
                stat_at(&current, name, libc::AT_SYMLINK_NOFOLLOW)?
            }
            other => other?,
        };
        if entry.st_mode & libc::S_IFMT == libc::S_IFLNK {
            followed += 1;
            if followed > MAX_SYMLINKS {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            let sticky_shared = here.st_mode & libc::S_ISVTX != 0 && here.st_mode & 0o002 != 0;
            // SAFETY: geteuid has no preconditions.
            let us = unsafe { libc::geteuid() };
            if sticky_shared && entry.st_uid != here.st_uid && entry.st_uid != us {
                return Err(refused(
                    path,
                    &format!(
                        "{} is a symlink another user (uid {}) made in a sticky world-writable directory",
                        name.display(),
                        entry.st_uid
                    ),
                ));
            }
            let target = std::fs::read_link(through(&current).join(name))?;
            let from = if target.is_absolute() {
                open_at(None, Path::new("/"), libc::O_PATH | libc::O_DIRECTORY)?
            } else {
                current.try_clone()?
            };
            current = walk(from, &target, followed, create)?;
        } else {
            current = open_at(
                Some(&current),
                name,
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            )?;
        }
    }
    Ok(current)
}

fn make_dir_at(dir: &std::os::fd::OwnedFd, name: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let c = c_path(name)?;
    // SAFETY: mkdirat with a live descriptor and a NUL-terminated name.
    let rc = unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        // Made meanwhile by someone else: the walk checks what is there now.
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(e);
        }
    }
    Ok(())
}

fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a path"))
}

fn open_at(
    dir: Option<&std::os::fd::OwnedFd>,
    path: &Path,
    flags: libc::c_int,
) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _};
    let c = c_path(path)?;
    let dirfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: openat with a live descriptor (or AT_FDCWD) and a NUL-terminated path.
    let fd = unsafe { libc::openat(dirfd, c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

fn stat_at(dir: &std::os::fd::OwnedFd, name: &Path, flags: libc::c_int) -> io::Result<libc::stat> {
    use std::os::fd::AsRawFd as _;
    let c = c_path(name)?;
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstatat with a live descriptor, a NUL-terminated name and a stat to fill.
    let rc = unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), &mut st, flags) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Proves that `dir` accepts new files (a temporary file, removed at once). An error names
/// `dir`, not the temporary file (a name of ours the user never gave).
pub fn check_writable_dir(dir: &Path) -> io::Result<()> {
    temporary_in(dir, "write-test").map(drop).map_err(|e| {
        // tempfile appends ` at path "…"` (the temporary file's) to the system's error.
        let text = e.to_string();
        let why = text.split(" at path \"").next().unwrap_or(&text);
        io::Error::new(e.kind(), format!("directory {}: {why}", dir.display()))
    })
}

/// Opens `path` for writing from its start, creating it (mode [`FILE_MODE`]) if absent. An
/// existing file is reused only if it is a regular file owned by this user with a single
/// link; a symlink is never followed.
pub fn open_log(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                refused(path, "it is a symbolic link")
            } else {
                e
            }
        })?;
    let metadata = file.metadata()?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if !metadata.file_type().is_file() {
        return Err(refused(path, "it is not a regular file"));
    }
    if metadata.uid() != euid || metadata.nlink() != 1 {
        return Err(refused(
            path,
            "it belongs to another user or has other links",
        ));
    }
    file.set_len(0)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn write_text(text: &'static str) -> impl FnMut(&mut dyn Write) -> io::Result<()> {
        move |out| out.write_all(text.as_bytes())
    }

    #[test]
    fn replaces_regular_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        write_replacing(&path, write_text("one")).unwrap();
        write_replacing(&path, write_text("two")).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "mode {mode:o}");
        let only: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(only.len(), 1, "no temporary file left");

        let err = write_replacing(Path::new("/dev/null"), write_text("x")).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let null = std::fs::metadata("/dev/null").unwrap().file_type();
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(&null));
        let link = dir.path().join("null-link");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        assert!(write_replacing(&link, write_text("x")).is_err());
        assert!(write_replacing(dir.path(), write_text("x")).is_err());
    }

    #[test]
    fn new_files_never_replace() {
        let dir = tempfile::tempdir().unwrap();
        let first = write_new(dir.path(), "snap", "json", write_text("a")).unwrap();
        let second = write_new(dir.path(), "snap", "json", write_text("b")).unwrap();
        assert_eq!(first, dir.path().join("snap.json"));
        assert_eq!(second, dir.path().join("snap-1.json"));
        assert_eq!(std::fs::read_to_string(first).unwrap(), "a");
    }

    /// A symlink another user planted in a sticky world-writable directory is not followed
    /// (as root: the test makes such a link by `lchown`); ours, or the directory owner's, is.
    #[test]
    fn planted_symlinks_on_the_way_to_a_directory_are_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED planted_symlinks_on_the_way_to_a_directory_are_refused: needs root (lchown)");
            assert!(std::env::var("CI").is_err(), "CI runs as root");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let shared = root.path().join("tmp");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let target = root.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        let planted = shared.join("snaps");
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        let c = c_path(&planted).unwrap();
        // SAFETY: lchown with a NUL-terminated path.
        assert_eq!(unsafe { libc::lchown(c.as_ptr(), 65534, 65534) }, 0);
        let err = open_directory(&planted).unwrap_err();
        assert!(
            err.to_string().contains("another user (uid 65534)"),
            "{err}"
        );
        // Through it, as a middle component, too.
        std::fs::create_dir(target.join("inner")).unwrap();
        assert!(open_directory(&planted.join("inner")).is_err());
        // Our own link is followed, and the descriptor is the target's.
        // SAFETY: as above.
        assert_eq!(unsafe { libc::lchown(c.as_ptr(), 0, 0) }, 0);
        let dir = open_directory(&planted.join("inner")).unwrap();
        std::fs::write(through(&dir).join("x"), b"1").unwrap();
        assert!(target.join("inner/x").exists());
        // A plain relative path works.
        let here = open_directory(Path::new(".")).unwrap();
        assert!(through(&here).is_dir());
    }

    #[test]
    fn logs_refuse_symlinks_and_foreign_links() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let log = dir.path().join("log");
        std::os::unix::fs::symlink(&victim, &log).unwrap();
        let err = open_log(&log).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        std::fs::remove_file(&log).unwrap();
        std::fs::hard_link(&victim, &log).unwrap();
        assert!(open_log(&log).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        std::fs::remove_file(&log).unwrap();
        std::fs::write(&log, "old output").unwrap();
        open_log(&log).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "");
    }
}
