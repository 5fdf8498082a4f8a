//! ① Finding what to probe and attaching to it.
//!
//! `maps` reads a process's memory map, `allocator` finds the allocator library in it and the
//! functions to probe, `attach` loads the eBPF object with its load-time globals and attaches
//! one uprobe per function per target process, scoped in the kernel to that process
//! (`UProbeScope::OneProcess`: other processes never hit the breakpoint).

pub mod allocator;
pub mod attach;
pub mod maps;
pub mod prologue;
pub mod session;
