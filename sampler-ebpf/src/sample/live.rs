//! Sampled blocks still live (frees tracked): remembered at their sample, forgotten at
//! their free, which is the only free that produces an event.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Entry of `free(address)`: one lookup; only a sampled block produces an event.
#[inline(always)]
pub fn on_free(address: u64) {
    if address == 0 {
        return;
    }
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if excluded(pid) {
        return;
    }
    free_tracked(pid, address);
}

/// Remembers sampled block `address` of `pid` as live, with the time: [`FLAG_TRACKED`], or
/// 0 (counted) when the live map is full.
#[inline(always)]
pub(super) fn track_live(pid: u32, address: u64) -> u32 {
    let key = LiveKey {
        pid,
        pad: 0,
        address,
    };
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if LIVE.insert(key, now, 0).is_ok() {
        FLAG_TRACKED
    } else {
        count_loss(LossCounter::LiveMapFull);
        0
    }
}

#[inline(always)]
pub(super) fn is_live(pid: u32, address: u64) -> bool {
    let key = LiveKey {
        pid,
        pad: 0,
        address,
    };
    LIVE.get_ptr(key).is_some()
}

/// Forgets a tracked block and tells user space; nothing for an unknown address (not
/// sampled, allocated before attach, or already freed: a double free).
#[inline(always)]
pub(super) fn free_tracked(pid: u32, address: u64) {
    let key = LiveKey {
        pid,
        pad: 0,
        address,
    };
    // A lockless lookup first: the unsampled majority stops here, without taking the
    // bucket lock a delete takes even when the key is absent.
    if LIVE.get_ptr(key).is_none() || LIVE.remove(key).is_err() {
        return;
    }
    let Some(mut entry) = SAMPLES.reserve::<FreeEvent>(0) else {
        count_loss(LossCounter::FreeEventLost);
        return;
    };
    // SAFETY: helper without preconditions.
    let timestamp_ns = unsafe { bpf_ktime_get_ns() };
    entry.write(FreeEvent {
        kind: EventKind::Free as u32,
        pid,
        timestamp_ns,
        address,
    });
    entry.submit(crate::maps::wake_flags());
}
