//! allocscope's own process: its executable (to run a helper of itself), the paths of its
//! open descriptors (to open a file it holds by a path a library call wants), a BPF program's
//! descriptor information, its pid namespace, capabilities, CPU time, resident size and what
//! its allocator holds.

use std::{io, os::fd::AsRawFd, path::PathBuf};

/// Our own executable, whatever its path (run again as a helper: the file that runs now, even
/// if it was replaced on disk since).
pub(crate) const EXE: &str = "/proc/self/exe";

/// The path of our descriptor `fd` (`/proc/self/fd/N`): opens the file it holds.
pub(crate) fn fd_path(fd: &impl AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The kernel's description of our descriptor `fd` (`/proc/self/fdinfo/N`).
pub(crate) fn fdinfo(fd: impl std::os::fd::AsFd) -> io::Result<String> {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd()))
}

/// Our pid namespace's file (its inode names the namespace).
pub(crate) fn pid_namespace() -> io::Result<std::fs::Metadata> {
    std::fs::metadata("/proc/self/ns/pid")
}

/// Our effective capability set (`CapEff` of our status).
pub fn effective_capabilities() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    u64::from_str_radix(super::process::status_field(&status, "CapEff")?, 16).ok()
}

/// Whether process `pid` still runs allocscope's own executable (a child forked to run a
/// command, not yet past its exec: its maps are ours).
pub fn runs_our_image(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let ours = std::fs::metadata("/proc/self/exe");
    let theirs = super::process::exe_metadata(pid);
    matches!((ours, theirs), (Ok(a), Ok(b)) if a.dev() == b.dev() && a.ino() == b.ino())
}

/// Our CPU time so far (user and system, all threads), in nanoseconds.
pub fn cpu_ns() -> Option<u64> {
    super::clock::process_cpu_ns(std::process::id())
}

/// Our resident set size, in bytes.
pub fn rss_bytes() -> Option<u64> {
    super::process::rss_of(std::process::id())
}

/// What our allocator (glibc's) holds, over all its arenas.
#[derive(Clone, Copy, Debug)]
pub struct Heap {
    /// Bytes of blocks in use (our live heap).
    pub in_use: u64,
    /// Bytes it keeps free for later blocks (their pages may have been given back).
    pub free: u64,
}

/// What our allocator holds now: a resident size rising while `in_use` stays flat is memory
/// the allocator keeps, not memory we hold.
pub fn heap() -> Heap {
    // SAFETY: mallinfo2 only reads the allocator's statistics (glibc 2.33 and later).
    let info = unsafe { libc::mallinfo2() };
    Heap {
        in_use: (info.uordblks + info.hblkhd) as u64,
        free: info.fordblks as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_figures_are_read() {
        assert!(rss_bytes().unwrap() > 0);
        assert!(cpu_ns().is_some());
        assert!(effective_capabilities().is_some());
        let exe = std::fs::read_link(EXE).unwrap();
        assert!(exe.is_absolute(), "{}", exe.display());
        let file = std::fs::File::open(&exe).unwrap();
        assert_eq!(std::fs::read_link(fd_path(&file)).unwrap(), exe);
        assert!(fdinfo(&file).unwrap().contains("flags:"));
        assert!(pid_namespace().is_ok());
    }

    #[test]
    fn a_block_we_hold_is_in_the_heap_in_use() {
        // Other tests allocate and free on other threads meanwhile: a block far larger
        // than what they hold at once.
        const BLOCK: u64 = 256 << 20;
        let before = heap().in_use;
        let block = vec![0u8; BLOCK as usize];
        let holding = heap().in_use;
        drop(std::hint::black_box(block));
        let after = heap().in_use;
        assert!(holding > before + BLOCK / 2, "{before} then {holding}");
        assert!(after + BLOCK / 2 < holding, "{holding} then {after}");
    }
}
