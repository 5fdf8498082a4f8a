//! Types and code shared by the eBPF programs and the `allocscope` user side.
//!
//! Everything here is `no_std` and free of floating point (except behind `cfg(test)` and the
//! `float` feature, which `user` implies) because the very same code runs inside the BPF verifier's sandbox: the
//! `#[repr(C)]` structs are the wire format of maps and ring-buffer records, and
//! [`geometric::draw`] is the sampling decision's random source on both sides, so the unit
//! tests here test exactly what the kernel runs.
#![cfg_attr(not(test), no_std)]
#![deny(missing_docs)]

pub mod cookie;
pub mod event;
pub mod geometric;
pub mod kernel;
pub mod patch;
pub mod preload;
pub mod python;
pub mod usdt;

pub use event::{
    AllocEvent, AllocFn, EventKind, FreeEvent, GoStatsAt, GoStatsEvent, LiveKey, LossCounter,
    LostKey, LostSamples, NestingMarker, PendingSample, ProcessCounters, ProcessEvent, Rate,
    ReturnSlots, SampleRecord, StackCopy, ThreadState, FLAG_RUNTIME_RATE, FLAG_STACK_AT_RETURN,
    FLAG_STACK_COPY, FLAG_TRACKED, FLAG_WEIGHTED, FOLLOWED_PENDING, FOLLOWED_TARGET,
    GO_STATS_AT_EXEC, GO_STATS_AT_EXIT, GO_STATS_MAX, HOST_SLOT, MAX_STACK_COPY, MAX_STACK_DEPTH,
    MAX_TARGETS, PROCESS_EXEC, PROCESS_FORK, RETURN_SLOTS, STACK_PAGE, UPROBE_TRAMPOLINE,
};
