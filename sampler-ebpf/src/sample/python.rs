//! Python frames at a sampled call: the sampling thread's interpreter frame chain, read
//! with the layout user space set for its process, sent as a record of its own just
//! before the sample (so user space has it when the sample arrives: the ring buffer is
//! read in reservation order).
//!
//! Only a sampled call of a process in `PY_PROCESSES` pays: one hash lookup, a walk of the
//! interpreter's thread list to the thread whose `native_thread_id` is the caller's tid,
//! then per frame one read of its first words and one of its code object's identity
//! (`code_signature`).

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::maps::{PY_FRAME_SCRATCH, PY_PROCESSES, PY_SCRATCH};
use sampler_common::python::{
    code_signature, PyFrameEntry, PyLayout, CODE_IDENTITY_WORDS, FLAG_PYTHON, MAX_PY_FRAMES,
    MAX_PY_THREADS, PY_FRAME_READ_WORDS, PY_FRAME_WORDS, PY_READ_FAILED, PY_THREAD_NOT_FOUND,
    PY_TRUNCATED,
};

/// A pointer-sized word of the target's memory; `None` when it cannot be read.
#[inline(always)]
fn read_word(address: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user checks the user address and fails on a fault.
    unsafe { bpf_probe_read_user(address as *const u64) }.ok()
}

/// What [`send_python_frames`] did.
pub(super) struct Sent {
    /// The flag the sample carries ([`FLAG_PYTHON`]), or 0 when nothing was sent.
    pub flag: u32,
    /// Where Python frames are read: the process is not (yet) known to user space, which
    /// finds its interpreter at its first sample: that sample wakes the reader.
    pub unknown: bool,
}

/// Sends the Python frames of `pid`'s thread `tid` (sampled at `timestamp_ns`) when the
/// process runs an interpreter allocscope knows.
#[inline(always)]
pub(super) fn send_python_frames(pid: u32, tid: u32, timestamp_ns: u64) -> Sent {
    let nothing = |unknown| Sent { flag: 0, unknown };
    if !config::python_frames() {
        return nothing(false);
    }
    // SAFETY: a hash lookup; the value stays valid for the program's run.
    let Some(layout) = (unsafe { PY_PROCESSES.get(pid) }) else {
        return nothing(true);
    };
    if layout.interpreters_head == 0 {
        // User space found no interpreter it reads in this process.
        return nothing(false);
    }
    let Some(record) = PY_SCRATCH.get_ptr_mut(0) else {
        return nothing(false);
    };
    // SAFETY: this CPU's slot of a per-CPU array, valid for the program's run.
    let record = unsafe { &mut *record };
    record.kind = EventKind::PythonStack as u32;
    record.pid = pid;
    record.tid = tid;
    record.timestamp_ns = timestamp_ns;
    record.flags = 0;
    record.pad = 0;
    let found = current_frame(layout, tid, record);
    // `current_frame` counted thread states in `count`; the frames are counted from 0.
    record.count = 0;
    let Some(frame) = found else {
        if record.flags == 0 {
            return nothing(false);
        }
        // The thread was not found: say so, with no frames.
        return Sent {
            flag: send(record),
            unknown: false,
        };
    };
    walk(layout, frame, record);
    if record.count == 0 && record.flags == 0 {
        return nothing(false);
    }
    Sent {
        flag: send(record),
        unknown: false,
    }
}

/// Sends `record` with its used length; the flag for the sample (also when the ring
/// buffer refused it: user space then counts the frames missing).
#[inline(always)]
fn send(record: &mut sampler_common::python::PyStackRecord) -> u32 {
    let mut count = record.count as usize;
    if count > MAX_PY_FRAMES {
        count = MAX_PY_FRAMES;
    }
    let size =
        sampler_common::python::PyStackRecord::HEAD + count * core::mem::size_of::<PyFrameEntry>();
    // SAFETY: `size` is within the record (count bounded above), which lives in the map.
    let bytes = unsafe {
        core::slice::from_raw_parts(
            (record as *const sampler_common::python::PyStackRecord).cast::<u8>(),
            size,
        )
    };
    // Never a wake-up of its own: the sample sent right after it decides.
    let _ = SAMPLES.output::<[u8]>(bytes, aya_ebpf::bindings::BPF_RB_NO_WAKEUP as u64);
    FLAG_PYTHON
}

/// The thread's innermost interpreter frame (0: none running), or `None` when the
/// interpreter is not running yet, the thread is not one of its threads, or a read failed
/// (`flags` says which of the last two).
#[inline(always)]
fn current_frame(
    layout: &PyLayout,
    tid: u32,
    record: &mut sampler_common::python::PyStackRecord,
) -> Option<u64> {
    let interpreter = read_word(layout.interpreters_head)?;
    if interpreter == 0 {
        return None;
    }
    let mut thread = read_word(interpreter + layout.threads_head as u64)?;
    let mut found = 0u64;
    // The thread states looked at so far, counted in the record (reset by `walk`), as the
    // walk counts its frames: see there.
    // SAFETY: a field of the record this program owns for its run.
    unsafe { core::ptr::write_volatile(&mut record.count, 0) };
    loop {
        if thread == 0 || may_goto_stops() {
            break;
        }
        // SAFETY: as above.
        let seen = unsafe { core::ptr::read_volatile(&record.count) };
        if seen as usize >= MAX_PY_THREADS {
            break;
        }
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(&mut record.count, seen + 1) };
        let Some(native) = read_word(thread + layout.thread_native_id as u64) else {
            record.flags |= PY_READ_FAILED;
            return None;
        };
        if native == tid as u64 {
            found = thread;
            break;
        }
        thread = read_word(thread + layout.thread_next as u64).unwrap_or(0);
    }
    if found == 0 {
        if thread != 0 {
            record.flags |= PY_THREAD_NOT_FOUND;
        }
        return None;
    }
    let mut frame = read_word(found + layout.thread_frame as u64)?;
    if layout.via_cframe != 0 && frame != 0 {
        frame = read_word(frame + layout.cframe_current_frame as u64)?;
    }
    Some(frame)
}

/// Reads the chain from `frame` into `record`, leaf first. Nothing in a register depends
/// on the iteration (the count lives in the record, read and written volatile): the
/// verifier's states at the `may_goto` converge, so it checks the body and what follows
/// the loop once or twice, not once for every possible length.
#[inline(always)]
fn walk(layout: &PyLayout, mut frame: u64, record: &mut sampler_common::python::PyStackRecord) {
    let Some(words) = PY_FRAME_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot of a per-CPU array, valid for the program's run.
    let words = unsafe { &mut *words };
    let mask = PY_FRAME_WORDS as u32 - 1;
    let entry_word = (layout.frame_entry_byte / 8) & mask;
    let entry_shift = (layout.frame_entry_byte % 8) * 8;
    record.count = 0;
    loop {
        if frame == 0 || may_goto_stops() {
            break;
        }
        // Read from the record each time, never kept in a register: a count the verifier
        // knows would differ between iterations and keep their states apart.
        // SAFETY: a field of the record this program owns for its run.
        let count = unsafe { core::ptr::read_volatile(&record.count) };
        if count as usize >= MAX_PY_FRAMES {
            record.flags |= PY_TRUNCATED;
            break;
        }
        // SAFETY: reads PY_FRAME_READ_WORDS words into the scratch slot, which holds
        // PY_FRAME_WORDS; the helper checks the user address.
        let failed = unsafe {
            generated::bpf_probe_read_user(
                words.as_mut_ptr().cast(),
                (PY_FRAME_READ_WORDS * 8) as u32,
                frame as *const _,
            )
        } != 0;
        if failed {
            record.flags |= PY_READ_FAILED;
            break;
        }
        let word = |index: u32| words[(index & mask) as usize];
        let marker = (word(entry_word) >> (entry_shift & 63)) & 0xff;
        let code = word(layout.frame_code_word);
        let instr = (word(layout.frame_instr_word) & PyFrameEntry::INSTR_MASK) | (marker << 56);
        frame = word(layout.frame_previous_word);
        // The code object's identity words, read over the frame's (no longer needed).
        // SAFETY: CODE_IDENTITY_WORDS words into the scratch slot, which holds more; the
        // helper checks the user address.
        let identity = unsafe {
            generated::bpf_probe_read_user(
                words.as_mut_ptr().cast(),
                (CODE_IDENTITY_WORDS * 8) as u32,
                (code + layout.code_identity as u64) as *const _,
            )
        } == 0;
        let signature = if identity {
            code_signature([words[0], words[1], words[2], words[3]])
        } else {
            0
        };
        let at = (count as usize) & (MAX_PY_FRAMES - 1);
        record.frames[at] = PyFrameEntry {
            code,
            signature,
            instr,
        };
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(&mut record.count, count + 1) };
    }
}

/// `may_goto`: the verifier checks a loop through it without proving a bound (its states
/// converge in an iteration or two, where a counted loop is checked once per iteration:
/// slow for this walk, docs/performance.md, "Figures quoted from the code"); the kernel
/// ends the loop after 8M iterations (true here).
#[inline(always)]
fn may_goto_stops() -> bool {
    let mut stop = false;
    // SAFETY: a conditional jump the kernel decides; no register or memory is touched.
    unsafe {
        core::arch::asm!("may_goto {0}", label { stop = true; }, options(nostack));
    }
    stop
}
