//! Process events for `--follow` and `--comm`, and thread clean-up, from four scheduler
//! tracepoints.
//!
//! The followed set is kept in the kernel, and a process enters it before it runs: a new
//! process of a followed one at `task_newtask` (in its parent, before the child's first
//! instruction), a process that exec's while `--comm` looks for new targets at
//! `sched_process_exec` (as pending, until user space has run the name pattern). The
//! file-wide probes count exactly that set (`FOLLOWED_ONLY`), so nothing a followed
//! process allocates goes unseen while user space catches up. User space hears of each fork
//! and exec to decide, and to note how each process is covered. A thread's exit drops its
//! sampling state (its countdown), so threads created and destroyed by the thousand do not
//! fill the map. A Go process's exit, or its exec of another program, leaves its runtime's
//! final statistics to user space.

use aya_ebpf::helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns};
use sampler_common::{
    EventKind, ProcessEvent, FOLLOWED_PENDING, FOLLOWED_TARGET, PROCESS_EXEC, PROCESS_FORK,
};

use crate::maps::{count_loss, FOLLOWED, FRONT_END, SAMPLES, THREADS};

/// `clone(2)` flag: the new task is a thread of the caller's process.
const CLONE_THREAD: u64 = 0x0001_0000;

/// task:task_newtask — new task `pid` created with `flags`. Runs in the parent; the child
/// inherits its parent's standing (target, or pending a decision).
#[inline(always)]
pub fn on_new_task(pid: u32, flags: u64) {
    if flags & CLONE_THREAD != 0 {
        return;
    }
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: a lookup whose value is not read.
    if unsafe { FRONT_END.get(parent) }.is_some() {
        carries_front_end(pid);
    }
    // SAFETY: the value is copied out at once.
    let Some(standing) = (unsafe { FOLLOWED.get(parent) }).copied() else {
        return;
    };
    let child = pid;
    if FOLLOWED.insert(child, standing, 0).is_err() {
        count_loss(sampler_common::LossCounter::FollowedFull);
    }
    emit(PROCESS_FORK, child, parent);
}

/// sched:sched_process_exec — runs in the process that exec'd (its new name already set),
/// before its new program's first instruction. While `--comm` looks for new targets, a
/// process that is not a target yet is counted from here on as pending.
#[inline(always)]
pub fn on_exec() {
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // The new program loads the front end afresh, or not at all: its `ready` says.
    forget_front_end(pid);
    // And runs an interpreter or not, whatever the old one did: unknown until user space
    // reads its maps (its first sample wakes the reader for that).
    if crate::config::python_frames() {
        // SAFETY: a lookup whose value is not read.
        if unsafe { crate::maps::PY_PROCESSES.get(pid) }.is_some() {
            let _ = crate::maps::PY_PROCESSES.remove(pid);
        }
    }
    // A Go runtime's statistics are the old program's (read at `sched_prepare_exec`): not
    // read at the new one's exit. User space hears of the exec to find the new program's.
    // SAFETY: a lookup whose value is not read.
    let go = unsafe { crate::maps::GO_STATS.get(pid) }.is_some();
    if go {
        let _ = crate::maps::GO_STATS.remove(pid);
    }
    // SAFETY: the value is copied out at once.
    let standing = unsafe { FOLLOWED.get(pid) }.copied();
    let watch = crate::config::watch_execs();
    let pending = watch && crate::config::followed_only() && standing != Some(FOLLOWED_TARGET);
    if pending && FOLLOWED.insert(pid, FOLLOWED_PENDING, 0).is_err() {
        count_loss(sampler_common::LossCounter::FollowedFull);
    }
    if watch || standing.is_some() || go {
        emit(PROCESS_EXEC, pid, 0);
    }
}

/// sched:sched_prepare_exec — runs in a process about to replace its program, past the
/// point of no return, its old memory still mapped: a Go runtime's final statistics in
/// that program, which its exec is about to take away.
#[inline(always)]
pub fn on_prepare_exec() {
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: the value is copied out at once.
    if let Some(at) = (unsafe { crate::maps::GO_STATS.get(pid) }).copied() {
        send_go_stats(pid, &at, sampler_common::GO_STATS_AT_EXEC);
    }
}

/// sched:sched_process_exit — runs in each exiting thread; `group_dead` says the whole
/// process is gone.
#[inline(always)]
pub fn on_exit(group_dead: bool) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // SAFETY: lookups whose values are not read.
    if unsafe { THREADS.get(tid) }.is_some() {
        let _ = THREADS.remove(tid);
    }
    let pid = (pid_tgid >> 32) as u32;
    // SAFETY: a lookup whose value is not read.
    if group_dead && unsafe { FOLLOWED.get(pid) }.is_some() {
        let _ = FOLLOWED.remove(pid);
    }
    if group_dead {
        forget_front_end(pid);
        go_stats_at_exit(pid);
    }
}

/// A Go process's runtime statistics, read as its last thread exits (the tracepoint runs
/// before the thread lets go of the process's memory): its final totals, which user space
/// can no longer read once the process is gone. One read per Go process.
#[inline(always)]
fn go_stats_at_exit(pid: u32) {
    // SAFETY: the value is copied out at once.
    let Some(at) = (unsafe { crate::maps::GO_STATS.get(pid) }).copied() else {
        return;
    };
    let _ = crate::maps::GO_STATS.remove(pid);
    send_go_stats(pid, &at, sampler_common::GO_STATS_AT_EXIT);
}

/// Reads the Go runtime statistics at `at` of the current process, `pid`, into an event
/// for user space (its `moment`: exit or exec).
#[inline(always)]
fn send_go_stats(pid: u32, at: &sampler_common::GoStatsAt, moment: u32) {
    use sampler_common::{GoStatsEvent, GO_STATS_MAX};
    let Some(mut entry) = SAMPLES.reserve::<GoStatsEvent>(0) else {
        count_loss(sampler_common::LossCounter::ProcessEventLost);
        return;
    };
    let event = entry.as_mut_ptr();
    let len = (at.len as usize).min(GO_STATS_MAX);
    // SAFETY: `event` is the reserved record, written field by field before it is sent;
    // the read is a bounds-checked helper into its byte array of GO_STATS_MAX bytes.
    let read = unsafe {
        (*event).kind = EventKind::GoStats as u32;
        (*event).pid = pid;
        (*event).moment = moment;
        (*event).timestamp_ns = bpf_ktime_get_ns();
        (*event).rate = match at.rate_address {
            0 => u64::MAX,
            rate => aya_ebpf::helpers::bpf_probe_read_user(rate as *const u64).unwrap_or(u64::MAX),
        };
        let bytes = core::ptr::addr_of_mut!((*event).bytes).cast::<core::ffi::c_void>();
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            bytes,
            len as u32,
            at.address as *const core::ffi::c_void,
        )
    };
    // SAFETY: as above.
    unsafe { (*event).len = if read == 0 { len as u32 } else { 0 } };
    entry.submit(0);
}

/// `allocscope:ready` fired in the current process, or its parent carried the front end.
#[inline(always)]
pub fn carries_front_end(pid: u32) {
    if FRONT_END.insert(pid, 1, 0).is_err() {
        count_loss(sampler_common::LossCounter::FrontEndFull);
    }
}

#[inline(always)]
fn forget_front_end(pid: u32) {
    // SAFETY: a lookup whose value is not read.
    if unsafe { FRONT_END.get(pid) }.is_some() {
        let _ = FRONT_END.remove(pid);
    }
}

fn emit(what: u32, pid: u32, parent: u32) {
    let Some(mut entry) = SAMPLES.reserve::<ProcessEvent>(0) else {
        count_loss(sampler_common::LossCounter::ProcessEventLost);
        return;
    };
    entry.write(ProcessEvent {
        kind: EventKind::Process as u32,
        what,
        pid,
        parent,
        // SAFETY: helper without preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        comm: bpf_get_current_comm().unwrap_or_default(),
    });
    // Not a forced wake-up: the reader polls every few ms anyway (`collect::POLL_MS`), and
    // a forced one cost the forking and the exec'ing process time each (an interrupt that
    // traps in a VM; docs/performance.md, "Figures quoted from the code"): a shell loop of
    // 1,500 processes took longer (docs/performance.md, "Many short processes: builds and
    // scripts"). A process is counted meanwhile (the followed set is the kernel's); what
    // waits is user space's look at it (maps, allocators of a program that does not carry the
    // front end), which a process gone by then is looked at through its region.
    entry.submit(crate::maps::wake_flags());
}
