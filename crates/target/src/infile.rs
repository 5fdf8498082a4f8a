//! Files allocscope reads that someone else can name or replace: a target's debug links and
//! executables, the JSON `report` is given. Running as root, a blocking `open` of a FIFO a
//! target's owner planted (or a device) would hang the symbolizer or the report forever, and
//! reading `/dev/zero` would never end. So such files are opened without blocking
//! (`O_NONBLOCK`: a FIFO's open does not wait for a writer; `O_NOCTTY`) and must be regular
//! files, checked on the open descriptor (no window to swap the path in between).

use std::{
    fs::File,
    io::{self, Read as _},
    os::unix::fs::OpenOptionsExt as _,
    path::Path,
};

/// Opens `path` for reading if it is a regular file (following symlinks), without blocking.
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", describe(kind)),
        ));
    }
    Ok(file)
}

/// Reads the whole of the regular file at `path` (see [`open_regular`]).
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = open_regular(path)?;
    let size = file.metadata()?.len();
    let mut bytes = Vec::with_capacity(size as usize);
    // Bounded by the size fstat reported: a file growing meanwhile is read as it was.
    file.by_ref().take(size).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Maps the regular file at `path` read-only (see [`open_regular`]): for the ELF files read
/// for an id or a section, which may be large, without copying them.
pub fn map_regular(path: &Path) -> io::Result<memmap2::Mmap> {
    let file = open_regular(path)?;
    // SAFETY: a private read-only mapping; a file replaced on disk is a new inode (package
    // managers rename), and a truncation under us is the one risk every ELF reader takes.
    unsafe { memmap2::Mmap::map(&file) }
}

/// Whether `path` names something that is not a regular file (following symlinks): a FIFO,
/// a device, a socket or a directory. A missing path is not.
pub(crate) fn exists_irregular(path: &Path) -> Option<&'static str> {
    let kind = std::fs::metadata(path).ok()?.file_type();
    (!kind.is_file()).then(|| describe(kind))
}

fn describe(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_and_devices_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // A blocking open would wait for a writer forever: this returns at once.
        let err = open_regular(&fifo).unwrap_err();
        assert!(err.to_string().contains("a FIFO"), "{err}");
        assert_eq!(exists_irregular(&fifo), Some("a FIFO"));
        let err = read_regular(Path::new("/dev/zero")).unwrap_err();
        assert!(err.to_string().contains("a device"), "{err}");
        assert_eq!(exists_irregular(dir.path()), Some("a directory"));
        assert_eq!(exists_irregular(&dir.path().join("missing")), None);
        let file = dir.path().join("file");
        std::fs::write(&file, b"data").unwrap();
        assert_eq!(read_regular(&file).unwrap(), b"data");
        assert_eq!(exists_irregular(&file), None);
    }
}
