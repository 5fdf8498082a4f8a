//! What a sink has not delivered yet: a first-in, first-out queue of encoded requests,
//! bounded in bytes, kept on disk so a restart or a long outage of the store loses nothing
//! that fits.
//!
//! Each request is a file of its own (`<sequence>.req`, created `O_EXCL`, mode 0600, in a
//! directory only root may enter: profiles name processes and paths), written before the
//! first try and deleted once delivered. When a new request would pass the bound, the
//! oldest go first, each counted as a drop: the newest data is what an operator looks at
//! after an outage. A spool found at start (the agent was restarted during an outage) is
//! sent first. With `--spool-in-memory` requests wait in memory under the same bound
//! (lost if the agent stops before they are delivered).

use std::{
    collections::VecDeque,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
};

use anyhow::Context as _;

/// One queued request.
#[derive(Debug)]
struct Entry {
    sequence: u64,
    size: u64,
    /// The request itself when the spool has no directory.
    data: Option<Vec<u8>>,
}

/// A sink's queue of undelivered requests.
#[derive(Debug)]
pub(crate) struct Spool {
    /// The directory (pinned descriptor) and its name for messages.
    dir: Option<(OwnedFd, PathBuf)>,
    bound: u64,
    entries: VecDeque<Entry>,
    bytes: u64,
    next: u64,
    /// Requests dropped to stay within the bound (or larger than it).
    pub dropped: u64,
    /// Their bytes.
    pub dropped_bytes: u64,
}

impl Spool {
    /// A spool in memory.
    pub(crate) fn in_memory(bound: u64) -> Spool {
        Spool {
            dir: None,
            bound,
            entries: VecDeque::new(),
            bytes: 0,
            next: 0,
            dropped: 0,
            dropped_bytes: 0,
        }
    }

    /// The spool in `dir` (created if absent, made 0700 through its own descriptor),
    /// refused unless every directory on the way is a real directory (no symlink) of root
    /// or ours that nobody else may write (or sticky), and `dir` itself is ours: a parent
    /// another user may write could swap `dir` for a link to a directory of their choosing
    /// (the agent made a 1777 one 0700 and posted a root-only file). What an earlier run
    /// left there is queued first.
    pub(crate) fn on_disk(dir: &Path, bound: u64) -> anyhow::Result<Spool> {
        let absolute = std::path::absolute(dir)
            .with_context(|| format!("the spool directory {}", dir.display()))?;
        let pinned = crate::preload::place::trusted_directory(&absolute, true)
            .with_context(|| format!("the spool directory {}", dir.display()))?;
        // SAFETY: fchmod on a directory descriptor we own.
        if unsafe { libc::fchmod(std::os::fd::AsRawFd::as_raw_fd(&pinned), 0o700) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("making {} private", dir.display()));
        }
        let through = crate::outfile::through(&pinned);
        let mut spool = Spool {
            dir: Some((pinned, dir.to_owned())),
            ..Spool::in_memory(bound)
        };
        let mut found: Vec<(u64, u64)> = std::fs::read_dir(&through)?
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name();
                let sequence = name.to_str()?.strip_suffix(".req")?.parse().ok()?;
                let meta = entry.metadata().ok()?;
                meta.is_file().then_some((sequence, meta.len()))
            })
            .collect();
        found.sort_unstable();
        for (sequence, size) in found {
            spool.entries.push_back(Entry {
                sequence,
                size,
                data: None,
            });
            spool.bytes += size;
            spool.next = sequence + 1;
        }
        spool.trim(0);
        Ok(spool)
    }

    /// Requests queued.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes queued.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Queues `request` last, dropping the oldest to stay within the bound.
    pub(crate) fn push(&mut self, request: &[u8]) -> anyhow::Result<()> {
        let size = request.len() as u64;
        if size > self.bound {
            self.dropped += 1;
            self.dropped_bytes += size;
            return Ok(());
        }
        self.trim(size);
        let sequence = self.next;
        self.next += 1;
        let mut unwritten = None;
        let data = match &self.dir {
            None => Some(request.to_vec()),
            Some((pinned, shown)) => {
                let through = crate::outfile::through(pinned);
                let written =
                    crate::outfile::write_new(&through, &format!("{sequence:016}"), "req", |out| {
                        out.write_all(request)
                    });
                match written {
                    Ok(_) => None,
                    Err(e) => {
                        // A full (or broken) spool file system: the request waits in memory
                        // instead, still sent, and the failure is said.
                        unwritten = Some(anyhow::Error::new(e).context(format!(
                            "spooling into {} (kept in memory instead)",
                            shown.display()
                        )));
                        Some(request.to_vec())
                    }
                }
            }
        };
        self.entries.push_back(Entry {
            sequence,
            size,
            data,
        });
        self.bytes += size;
        unwritten.map_or(Ok(()), Err)
    }

    /// Whether requests live on disk (they survive a restart) or in memory only.
    pub(crate) fn on_disk_at(&self) -> Option<&Path> {
        self.dir.as_ref().map(|(_, shown)| shown.as_path())
    }

    /// The oldest request.
    pub(crate) fn front(&self) -> anyhow::Result<Option<Vec<u8>>> {
        let Some(entry) = self.entries.front() else {
            return Ok(None);
        };
        match (&entry.data, &self.dir) {
            (Some(data), _) => Ok(Some(data.clone())),
            (None, Some((pinned, shown))) => {
                let path = self.path_of(pinned, entry.sequence);
                read_spooled(&path, entry.size)
                    .map(Some)
                    .with_context(|| format!("reading a spooled request in {}", shown.display()))
            }
            (None, None) => Ok(None),
        }
    }

    /// Removes the oldest request (delivered, or refused for good).
    pub(crate) fn pop(&mut self) {
        if let Some(entry) = self.entries.pop_front() {
            self.bytes -= entry.size;
            if let Some((pinned, _)) = &self.dir {
                let _ = std::fs::remove_file(self.path_of(pinned, entry.sequence));
            }
        }
    }

    /// Drops the oldest requests until `room` more bytes fit.
    fn trim(&mut self, room: u64) {
        while self.bytes + room > self.bound && !self.entries.is_empty() {
            let size = self.entries.front().map_or(0, |e| e.size);
            self.pop();
            self.dropped += 1;
            self.dropped_bytes += size;
        }
    }

    fn path_of(&self, pinned: &OwnedFd, sequence: u64) -> PathBuf {
        crate::outfile::through(pinned).join(format!("{sequence:016}.req"))
    }
}

/// A spooled request's bytes: a regular file (a link is not followed, a FIFO not waited
/// on), at most the `size` it had when queued.
fn read_spooled(path: &Path, size: u64) -> std::io::Result<Vec<u8>> {
    use std::{io::Read as _, os::unix::fs::OpenOptionsExt as _};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    file.take(size).read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_go_first_and_are_counted() {
        let mut spool = Spool::in_memory(10);
        for request in [b"aaaa".as_slice(), b"bbbb", b"cccc"] {
            spool.push(request).unwrap();
        }
        assert_eq!((spool.len(), spool.bytes(), spool.dropped), (2, 8, 1));
        assert_eq!(spool.front().unwrap().unwrap(), b"bbbb");
        spool.push(b"much too large").unwrap();
        assert_eq!(
            (spool.len(), spool.dropped, spool.dropped_bytes),
            (2, 2, 18)
        );
        spool.pop();
        assert_eq!(spool.front().unwrap().unwrap(), b"cccc");
    }

    #[test]
    fn a_spool_on_disk_survives_a_restart_and_stays_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sink");
        let mut spool = Spool::on_disk(&path, 100).unwrap();
        for i in 0..30u8 {
            spool.push(&[i; 10]).unwrap();
            let on_disk: u64 = std::fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum();
            assert!(on_disk <= 100, "{on_disk} bytes on disk");
        }
        assert_eq!((spool.len(), spool.dropped), (10, 20));
        let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&path).unwrap()) & 0o777;
        assert_eq!(mode, 0o700);
        drop(spool);
        let mut again = Spool::on_disk(&path, 100).unwrap();
        assert_eq!(again.len(), 10);
        assert_eq!(again.front().unwrap().unwrap(), [20u8; 10]);
        again.pop();
        again.push(&[99; 10]).unwrap();
        assert_eq!(std::fs::read_dir(&path).unwrap().count(), 10);
        // A smaller bound at restart drops the oldest at once.
        drop(again);
        let small = Spool::on_disk(&path, 30).unwrap();
        assert_eq!((small.len(), small.dropped), (3, 7));
    }

    #[test]
    fn a_spool_through_a_link_or_under_an_open_parent_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(Spool::on_disk(&open.join("sink"), 100).is_err());
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("link")).unwrap();
        assert!(Spool::on_disk(&dir.path().join("link"), 100).is_err());
    }

    #[test]
    fn a_fifo_swapped_in_for_a_request_is_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sink");
        let mut spool = Spool::on_disk(&path, 100).unwrap();
        spool.push(b"request").unwrap();
        let queued = std::fs::read_dir(&path)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        std::fs::remove_file(&queued).unwrap();
        let name = std::ffi::CString::new(queued.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert!(spool.front().is_err(), "read at once, refused");
    }
}
