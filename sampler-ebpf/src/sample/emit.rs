//! Sending a sample: the record assembled in this CPU's scratch slot with the user stack
//! (the frame-pointer walk's return addresses, or a copy of the stack's top), or, when the
//! ring buffer has no room, what the estimates need of it kept per stratum.

#[allow(clippy::wildcard_imports)]
use super::*;

/// What a sample's record says, before the stack is added.
pub(super) struct Sample {
    pub(super) pid: u32,
    pub(super) tid: u32,
    pub(super) function: AllocFn,
    pub(super) size: u64,
    pub(super) offset: u64,
    /// The mean interval its countdown was drawn at.
    pub(super) interval: u64,
    pub(super) caller: u64,
    pub(super) address: u64,
    pub(super) flags: u32,
    /// The thread's return-slot ring (frees tracked), copied with a stack copy.
    pub(super) returns: ReturnSlots,
}

/// Sends a sample with the user stack of `ctx` (the entry's or the return's): the
/// frame-pointer walk's return addresses, or a copy of the stack's top for user space to
/// unwind with the modules' CFI. The record is assembled in this CPU's scratch slot and
/// sent with its used length only.
#[inline(always)]
pub(super) fn emit<C: EbpfContext>(ctx: &C, sample: &Sample) {
    send::<C, false>(ctx, sample);
}

/// [`emit`] for a Go runtime's sample: the stack is this program's own walk of the frame
/// pointers ([`walk_frame_pointers`]), chosen at compile time, so the walk is only in the
/// program that serves the runtime's probes (`producer`, loaded when one is found: its
/// walk costs the verifier time, docs/performance.md, "Figures quoted from the code").
#[inline(always)]
pub(super) fn emit_walking_frames<C: EbpfContext>(ctx: &C, sample: &Sample) {
    send::<C, true>(ctx, sample);
}

/// [`emit`], the stack walked here when `WALK`.
#[inline(always)]
fn send<C: EbpfContext, const WALK: bool>(ctx: &C, sample: &Sample) {
    // SAFETY: helper without arguments.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(record) = SCRATCH.get_ptr_mut(cpu) else {
        // Unreachable while user space sizes the map to the possible CPUs; the sample
        // still counts, like one the ring buffer refused.
        lost(ctx, sample);
        return;
    };
    // SAFETY: this CPU's slot, valid for the program's run. A uprobe program runs with
    // migration disabled, not preemption: a task preempting this one on this CPU could
    // reuse the slot before it is sent. The bytes are plain integers either way; such a
    // record's stack fails the user side's checks and ends early, under its end reason.
    let record = unsafe { &mut *record };
    // SAFETY: helper without preconditions.
    let timestamp_ns = unsafe { bpf_ktime_get_ns() };
    // Sent first, so it is read first; the sample carries FLAG_PYTHON when it was.
    let python = super::python::send_python_frames(sample.pid, sample.tid, timestamp_ns);
    let event = &mut record.event;
    event.kind = EventKind::Alloc as u32;
    event.flags = sample.flags | python.flag;
    event.timestamp_ns = timestamp_ns;
    event.size = sample.size;
    event.offset = sample.offset;
    event.interval = sample.interval;
    event.return_address = sample.caller;
    event.address = sample.address;
    event.pid = sample.pid;
    event.tid = sample.tid;
    event.function = sample.function as u32;
    // The thread's name (16 bytes, the helper NUL-terminates it); on failure zeros.
    event.comm = bpf_get_current_comm().unwrap_or_default();
    let payload = if WALK {
        add_walked_stack(ctx, record)
    } else {
        add_stack(ctx, record, sample)
    };
    let mut size = SampleRecord::HEAD + payload;
    if size > core::mem::size_of::<SampleRecord>() {
        size = core::mem::size_of::<SampleRecord>();
    }
    // SAFETY: `size` is within the record (just bounded), which lives in the map.
    let bytes =
        unsafe { core::slice::from_raw_parts((record as *const SampleRecord).cast::<u8>(), size) };
    // Where Python frames are read, a sample of a process user space does not know yet
    // wakes the reader as the default does: the reader finds a process's interpreter at
    // its first sample (the kernel reads frames only from then on); up to a poll interval
    // later, a Python command's first ~20 ms of samples kept native frames only (measured:
    // 22-113 of ~1,200 at one site). A known process's samples wait like the others.
    let wake = if python.unknown {
        0
    } else {
        crate::maps::wake_flags()
    };
    if SAMPLES.output::<[u8]>(bytes, wake).is_err() {
        lost(ctx, sample);
        return;
    }
    if config::log_enabled()
        && sample.flags & FLAG_STACK_AT_RETURN != 0
        && sample.flags & FLAG_TRACKED == 0
    {
        warn!(
            ctx,
            "pid {}: sampled block at {:x} not tracked (live map full or failed)",
            sample.pid,
            sample.address
        );
    }
}

/// Puts the user stack of `ctx` into `record` (a copy of its top for user space to unwind
/// with `--unwind dwarf`, else the frame-pointer walk's return addresses); returns the
/// payload's length in bytes.
#[inline(always)]
fn add_stack<C: EbpfContext>(ctx: &C, record: &mut SampleRecord, sample: &Sample) -> usize {
    let regs = ctx.as_ptr() as *const pt_regs;
    let window = config::stack_bytes();
    if window != 0 {
        record.event.flags |= FLAG_STACK_COPY;
        // SAFETY: the probed task's saved registers, valid for the program's run.
        let (ip, sp, bp) = unsafe { ((*regs).rip, (*regs).rsp, (*regs).rbp) };
        record.copy = StackCopy {
            ip,
            sp,
            bp,
            start: sp,
            return_slots: sample.returns.slots,
            return_values: sample.returns.values,
            return_next: sample.returns.next,
        };
        let payload = copy_stack(&mut record.payload, sp, window);
        record.event.stack_len = payload as u32;
        return payload;
    }
    record.copy = StackCopy::default();
    // SAFETY: writes at most the given size into the payload array.
    let bytes = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            record.payload.as_mut_ptr().cast(),
            (MAX_STACK_DEPTH * 8) as u32,
            BPF_F_USER_STACK as u64,
        )
    };
    let payload = if bytes < 0 {
        count_loss(LossCounter::StackMissing);
        0
    } else {
        bytes as usize & !7
    };
    record.event.stack_len = (payload / 8) as u32;
    payload
}

/// Puts the frame-pointer walk from the registers of `ctx` into `record` (Go code keeps
/// frame pointers, so the walk is whole, and far cheaper than a copy for user space to
/// unwind); returns the payload's length in bytes.
#[inline(always)]
fn add_walked_stack<C: EbpfContext>(ctx: &C, record: &mut SampleRecord) -> usize {
    let regs = ctx.as_ptr() as *const pt_regs;
    // SAFETY: the probed task's saved registers, valid for the program's run.
    let (ip, bp) = unsafe { ((*regs).rip, (*regs).rbp) };
    record.copy = StackCopy::default();
    record.event.stack_len = walk_frame_pointers(&mut record.payload, ip, bp) as u32;
    // Read back from the map's memory, where the verifier knows only its bounds: what
    // follows is then verified once, not once for each length the walk can end at (much of
    // the verifier's time at every load without it, measured: docs/performance.md, "Figures
    // quoted from the code").
    // SAFETY: a field of this CPU's slot, valid for the program's run.
    let frames = unsafe { core::ptr::read_volatile(&record.event.stack_len) } as usize;
    frames.min(MAX_STACK_DEPTH) * 8
}

/// The frame-pointer walk from `ip` and `bp` into `payload` (return addresses, `ip`
/// first), as the kernel's `bpf_get_stack` walks, except at its end: the kernel reads the
/// frame at a zero frame pointer too (a goroutine's first frame saves 0), a page fault for
/// every sample (docs/performance.md, "Figures quoted from the code"); the walk stops there
/// instead. Returns the frames written.
#[inline(always)]
fn walk_frame_pointers(payload: &mut [u8; MAX_STACK_COPY], ip: u64, bp: u64) -> usize {
    let mut written = 0;
    let mut address = ip;
    let mut frame = bp;
    for _ in 0..MAX_STACK_DEPTH {
        let at = written * 8;
        if at + 8 > payload.len() {
            break;
        }
        payload[at..at + 8].copy_from_slice(&address.to_ne_bytes());
        written += 1;
        if frame == 0 {
            break;
        }
        // The saved frame pointer and the return address above it.
        let mut pair = [0u64; 2];
        // SAFETY: writes 16 bytes into `pair`; the helper checks the user address and
        // fails (zero-filling) on a fault.
        let failed = unsafe {
            generated::bpf_probe_read_user(
                pair.as_mut_ptr().cast(),
                16,
                frame as *const core::ffi::c_void,
            )
        } != 0;
        if failed || pair[1] == 0 {
            break;
        }
        (frame, address) = (pair[0], pair[1]);
    }
    written
}

/// A sample the ring buffer had no room for.
#[inline(always)]
pub(super) fn lost<C: EbpfContext>(ctx: &C, sample: &Sample) {
    count_loss(LossCounter::RingBufFull);
    record_lost(sample);
    if config::log_enabled() {
        warn!(
            ctx,
            "ring buffer full: sample of {} bytes in pid {} lost", sample.size, sample.pid
        );
    }
}

/// Copies up to `window` bytes of user stack from `sp` into `payload`: the rest of `sp`'s
/// page, then whole pages while they fit in the window, stopping at the first page that is
/// not mapped (the top of the stack). Returns the bytes copied. Page-sized reads keep each read's size a constant the
/// verifier can check against the payload, and a stack's end is a page boundary.
#[inline(always)]
pub(super) fn copy_stack(payload: &mut [u8; MAX_STACK_COPY], sp: u64, window: u64) -> usize {
    let first = STACK_PAGE - (sp as usize & (STACK_PAGE - 1));
    // SAFETY: `first` ≤ STACK_PAGE bytes into the payload; the helper checks the user
    // address and fails (zero-filling) on a fault.
    if unsafe {
        generated::bpf_probe_read_user(payload.as_mut_ptr().cast(), first as u32, sp as *const _)
    } != 0
    {
        return 0;
    }
    let mut copied = first;
    for _ in 0..MAX_STACK_COPY / STACK_PAGE {
        if (copied + STACK_PAGE) as u64 > window || copied > MAX_STACK_COPY - STACK_PAGE {
            break;
        }
        // SAFETY: copied + STACK_PAGE ≤ MAX_STACK_COPY (checked above); the helper checks
        // the user address.
        let failed = unsafe {
            generated::bpf_probe_read_user(
                payload.as_mut_ptr().add(copied).cast(),
                STACK_PAGE as u32,
                (sp + copied as u64) as *const _,
            )
        } != 0;
        if failed {
            break;
        }
        copied += STACK_PAGE;
    }
    copied
}

/// Keeps what the estimates need of a sample that could not be sent: its size, interval
/// and remainder, added up per (pid, size, interval). A block it tracked is forgotten, so
/// its free sends nothing about a sample user space never saw.
#[inline(always)]
pub(super) fn record_lost(sample: &Sample) {
    if sample.flags & FLAG_TRACKED != 0 {
        let _ = LIVE.remove(LiveKey {
            pid: sample.pid,
            pad: 0,
            address: sample.address,
        });
    }
    let key = LostKey {
        pid: sample.pid,
        pad: 0,
        size: sample.size,
        interval: sample.interval,
    };
    let unseen = sample.size.wrapping_sub(sample.offset);
    if let Some(lost) = LOST.get_ptr_mut(key) {
        // SAFETY: per-CPU value of this CPU; nothing else writes it during this run.
        let lost = unsafe { &mut *lost };
        lost.samples += 1;
        lost.unseen += unseen;
        return;
    }
    let first = LostSamples { samples: 1, unseen };
    if LOST.insert(key, first, 0).is_err() {
        count_loss(LossCounter::LostUnrecorded);
    }
}
