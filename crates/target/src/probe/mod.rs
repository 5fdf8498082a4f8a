//! ① Finding what to probe and attaching to it.
//!
//! `allocator` finds the allocator library in a process's memory map (`crate::sys::maps`) and
//! the functions to probe, `prologue` chooses where in each function the probe goes, `attach`
//! loads the eBPF object with its load-time globals and attaches the probes of each allocator
//! file: per target process, scoped in the kernel to it (other processes never hit the
//! breakpoint), or for every process (`--all`, `--follow`, `--comm`); `session` makes the
//! uprobe_multi links (one per file) that aya has no wrapper for.

pub mod allocator;
pub mod attach;
pub(crate) mod btf;
#[cfg(test)]
mod contract;
pub(crate) mod elf;
pub mod entry_names;
pub mod go;
pub mod patch;
pub mod prologue;
pub mod runs;
pub(crate) mod session;
pub mod usdt;

/// Whether this kernel optimises a uprobe on a 5-byte nop into a call to a user trampoline
/// and a syscall (Linux ≥ 6.18 on x86-64): the `uprobe` syscall exists. Called outside a
/// trampoline it only fails with ENXIO (ENOSYS where it does not exist). Asked once.
pub fn usdt_optimized() -> bool {
    static ANSWER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| {
        /// `__NR_uprobe` on x86-64.
        const SYS_UPROBE: libc::c_long = 336;
        // SAFETY: a syscall without arguments; outside a uprobe trampoline it returns an
        // error and does nothing.
        let result = unsafe { libc::syscall(SYS_UPROBE) };
        result == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO)
    })
}
