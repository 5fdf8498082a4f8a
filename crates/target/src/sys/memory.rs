//! Another process's memory, through `/proc/PID/mem`: read without stopping it (a program's
//! variable, a library's copy of a header) and, for the switch into a running process
//! (`crate::inject`), written while one of its threads is stopped.
//!
//! `/proc/PID/mem` is opened per use: a descriptor kept would outlive the process it was
//! opened for and read nothing of a later process with the same pid.

use std::{fs::File, io, os::unix::fs::FileExt as _};

/// Reads `out.len()` bytes of `pid`'s memory at `address`.
pub fn read_at(pid: u32, address: u64, out: &mut [u8]) -> io::Result<()> {
    File::open(super::process::path(pid, "mem"))?.read_exact_at(out, address)
}

/// The 8 bytes at `address` in `pid`'s memory (a variable of the program's), if readable.
pub fn word_of(pid: u32, address: u64) -> Option<u64> {
    let mut bytes = [0u8; 8];
    read_at(pid, address, &mut bytes).ok()?;
    Some(u64::from_ne_bytes(bytes))
}

/// `pid`'s memory opened for reading, to be read again and again (a Go runtime's heap
/// profile): once the process is gone its reads fail, and never read a later process
/// with its pid.
pub(crate) fn open(pid: u32) -> io::Result<File> {
    File::open(super::process::path(pid, "mem"))
}

/// `pid`'s memory opened for reading and writing (ptrace access mode: the caller may trace
/// it).
pub(crate) fn open_writable(pid: u32) -> io::Result<File> {
    File::options()
        .read(true)
        .write(true)
        .open(super::process::path(pid, "mem"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_word_of_this_process_and_nothing_of_a_gone_one() {
        let word = std::hint::black_box(0x5eed_1234_u64);
        let at = std::ptr::addr_of!(word) as u64;
        assert_eq!(word_of(std::process::id(), at), Some(0x5eed_1234));
        assert_eq!(word_of(1 << 23, at), None, "no such process");
    }
}
