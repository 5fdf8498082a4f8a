//! ① Finding what to probe and attaching to it.
//!
//! `maps` reads a process's memory map, `allocator` finds the allocator library in it and the
//! functions to probe, `prologue` chooses where in each function the probe goes, `attach`
//! loads the eBPF object with its load-time globals and attaches the probes of each allocator
//! file: per target process, scoped in the kernel to it (other processes never hit the
//! breakpoint), or for every process (`--all`, `--follow`, `--comm`); `session` makes the
//! uprobe_multi links (one per file) that aya has no wrapper for.

pub mod allocator;
pub mod attach;
pub mod maps;
pub mod prologue;
pub mod runs;
pub mod session;
