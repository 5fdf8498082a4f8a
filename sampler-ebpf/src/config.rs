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

/// Code size of each probed function (by AllocFn), for recognizing a malloc called from
/// inside it: a return address within [entry, entry + size) means a nested call.
#[no_mangle]
static FUNCTION_SIZE: [u64; sampler_common::AllocFn::COUNT] = [0; sampler_common::AllocFn::COUNT];

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
pub fn function_size(function: u64) -> u64 {
    let index = (function as usize) & (sampler_common::AllocFn::COUNT - 1);
    // SAFETY: as above; the index is masked into range.
    unsafe { core::ptr::read_volatile(&FUNCTION_SIZE[index]) }
}
