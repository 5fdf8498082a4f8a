//! Load-time configuration (read-only globals set with `EbpfLoader::override_global`). The
//! verifier sees their final values, so a disabled feature's code is pruned, not skipped.

/// Mean sampling interval in bytes (1/p); sent with each sample.
#[no_mangle]
static INTERVAL: u64 = 512 * 1024;

/// `1 / -ln(1 - 1/INTERVAL)` in Q32.32 (sampler_common::geometric::scale_q32).
#[no_mangle]
static SCALE_Q32: u64 = 2_251_799_813_685_248;

/// Non-zero when frees are tracked: sampled calls are emitted at their return, with the
/// address, which goes into the live map.
#[no_mangle]
static TRACK_FREES: u8 = 0;

/// Non-zero when user space reads aya-log records (`--verbose`).
#[no_mangle]
static LOG_ENABLED: u8 = 0;

/// Non-zero when user space wants to hear of every exec on the host (`--comm`, `--all`):
/// new processes are found as they start, not at the next /proc scan.
#[no_mangle]
static WATCH_EXECS: u8 = 0;

/// Non-zero in host mode (`--all`): probes see every process, the excluded ones are
/// skipped in the program.
#[no_mangle]
static HOST_MODE: u8 = 0;

/// Non-zero with `HOST_MODE` for `--follow` and `--comm`: the file-wide probes count only
/// the processes in `FOLLOWED` (targets and those pending a decision), which the kernel
/// adds at fork and exec, before they run: covered from their first allocation.
#[no_mangle]
static FOLLOWED_ONLY: u8 = 0;

/// Non-zero under `--max-overhead`: the probes are attached in on slots only, and the
/// allocation programs count and sample only while `GATE` is open, so the slot's edges are
/// where user space says, not where attaching and detaching happened to finish.
#[no_mangle]
static DUTY_CYCLED: u8 = 0;

/// Bytes of user stack copied per sample for unwinding in user space (`--unwind dwarf`,
/// `--stack-bytes`); 0: the kernel walks frame pointers instead (`--unwind fp`).
#[no_mangle]
static STACK_BYTES: u64 = 0;

/// Byte offset of `pid` in the kernel's `struct task_struct` (from its BTF), for
/// `task_newtask_raw`; 0 when unknown (the perf-event `task_newtask` is used then).
#[no_mangle]
static TASK_PID_OFFSET: u64 = 0;

#[inline(always)]
pub fn task_pid_offset() -> u64 {
    // SAFETY: as below.
    unsafe { core::ptr::read_volatile(&TASK_PID_OFFSET) }
}

#[inline(always)]
pub fn stack_bytes() -> u64 {
    // SAFETY: as below.
    unsafe { core::ptr::read_volatile(&STACK_BYTES) }
}

/// Non-zero when a target may run CPython (`--python-frames`): sampled calls read the
/// interpreter's frames. Zero prunes that code, and its verification (a few ms a program
/// since its loops are `may_goto` ones; far more with counted loops: docs/performance.md,
/// "Figures quoted from the code").
#[no_mangle]
static PYTHON_FRAMES: u8 = 0;

#[inline(always)]
pub fn python_frames() -> bool {
    // SAFETY: as below.
    unsafe { core::ptr::read_volatile(&PYTHON_FRAMES) != 0 }
}

#[inline(always)]
pub fn interval() -> u64 {
    // SAFETY: reading a global; volatile so the compiler keeps the load the loader patches.
    unsafe { core::ptr::read_volatile(&INTERVAL) }
}

#[inline(always)]
pub fn scale_q32() -> u64 {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&SCALE_Q32) }
}

#[inline(always)]
pub fn track_frees() -> bool {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&TRACK_FREES) != 0 }
}

#[inline(always)]
pub fn log_enabled() -> bool {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&LOG_ENABLED) != 0 }
}

#[inline(always)]
pub fn host_mode() -> bool {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&HOST_MODE) != 0 }
}

#[inline(always)]
pub fn followed_only() -> bool {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&FOLLOWED_ONLY) != 0 }
}

#[inline(always)]
pub fn function_size(function: u64) -> u64 {
    let index = (function as u32) & (sampler_common::AllocFn::FUNCTION_SLOTS as u32 - 1);
    crate::maps::FUNCTION_SIZES.get(index).copied().unwrap_or(0)
}

#[inline(always)]
pub fn watch_execs() -> bool {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&WATCH_EXECS) != 0 }
}

#[inline(always)]
pub fn duty_cycled() -> bool {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&DUTY_CYCLED) != 0 }
}
