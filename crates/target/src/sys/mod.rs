//! The operating system's view of processes, read in one place: everything allocscope learns
//! from /proc (a process's maps, executable, name, cgroup, status, liveness, CPU time and
//! resident size, the process list, its memory through `/proc/PID/mem`) and the kernel's
//! process events.
//!
//! Why one layer: a target may exit, exec or be replaced by another process of the same pid
//! at any moment, and each reader here answers that the same way (`None`, empty, or an
//! `io::Error` the caller can name) instead of each module deciding again; a path that names
//! a process through /proc is built here only, so that what "through the target's root" or
//! "the file behind this mapping" means is written once. `cargo xtask check` fails on a
//! string starting with `/proc` anywhere else on the user side (every crate above).
//!
//! - [`process`]: per-process facts (`stat`, `status`, `comm`, `cgroup`, `environ`, `auxv`,
//!   the executable), the process list and liveness.
//! - [`maps`]: `/proc/PID/maps`, parsed, and the files behind its mappings.
//! - [`moment`]: one event's readings of a process's /proc files, each read once.
//! - [`memory`]: another process's memory (`/proc/PID/mem`), its threads, its root.
//! - [`own`]: allocscope's own process (its executable, descriptors, namespace, CPU, RSS).
//! - [`host`]: the machine (memory, host name).
//! - [`clock`]: the monotonic clock and processes' CPU clocks.
//! - [`proc_events`]: the netlink proc connector's forks, execs and exits.

pub mod clock;
pub mod host;
pub mod maps;
pub mod memory;
pub mod moment;
pub mod own;
pub mod proc_events;
pub mod process;
