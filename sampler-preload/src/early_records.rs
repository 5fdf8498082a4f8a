//! Early records: sampled blocks kept in the family table while allocscope attaches.
//!
//! Why: loading and verifying the eBPF programs and attaching them takes allocscope a while
//! (docs/performance.md, "The in-process front end"), which a command would otherwise wait
//! for before it runs. `record -- CMD` lets the command run at once; until its probes are
//! attached, a sampled block is written into the family table with what the eBPF program
//! would have taken at the probe (the thread, the time, the registers and a copy of the
//! stack's top, read with `process_vm_readv` so that a short stack cannot fault), and the
//! free of a sampled block likewise; in a Python process the thread's Python frames too
//! ([`crate::frames`]). allocscope reads them once attached, while the
//! writers are held ([`EARLY_HOLD`]), and from then on the probes fire as usual. The
//! per-call path is unchanged: only a sampled call looks at the state.

use core::{
    ptr,
    sync::atomic::{AtomicBool, Ordering},
};

use sampler_common::{
    preload::{
        early_record_bytes, family_early_offset, EarlyHead, EarlyRecord, FamilyHeader, EARLY_ALLOC,
        EARLY_FREE, EARLY_KEEP, EARLY_OFF, EARLY_PY_OFFSET, EARLY_SLOTS, EARLY_STACK_OFFSET,
        MAX_PY_FRAMES,
    },
    python::PyFrameEntry,
    MAX_STACK_COPY,
};

use crate::region;

/// Longest wait for allocscope to finish reading (or to make room): then the probes fire
/// (and a sample no probe catches is lost).
const WAIT_ROUNDS: u32 = 20_000;
/// One round of that wait.
const WAIT_NS: i64 = 100_000;

/// The family table while it keeps early records.
#[inline(always)]
fn keeping() -> Option<&'static FamilyHeader> {
    region::family_table().filter(|f| f.early_state.load(Ordering::Acquire) != EARLY_OFF)
}

/// A sampled block: kept as an early record (true), or left to the probes (false).
#[inline(never)]
pub fn alloc(address: u64, size: u64, offset: u64, interval: u64, how: u64) -> bool {
    let Some(family) = keeping() else {
        return false;
    };
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers; `lea` of the next instruction gives an address in this
    // function at which the stack pointer is the one read (no push in between), so the
    // unwinder's CFI for `ip` applies to the copy that starts at `sp`.
    unsafe {
        core::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    keep(family, |record, rest| {
        let (python, stack) = rest.split_at_mut(EARLY_STACK_OFFSET - EARLY_PY_OFFSET);
        record.kind = EARLY_ALLOC;
        record.address = address;
        record.size = size;
        record.offset = offset;
        record.interval = interval;
        record.how = how;
        record.ip = ip;
        record.sp = sp;
        record.bp = bp;
        let wanted = (family.early_stack_bytes.load(Ordering::Relaxed) as usize)
            .min(MAX_STACK_COPY)
            .min(stack.len());
        record.stack_len = copy_own_stack(sp, &mut stack[..wanted]) as u64;
        // SAFETY: the frames' room: MAX_PY_FRAMES entries at an 8-byte aligned offset of
        // a page-aligned record, plain integers, this writer's alone.
        let frames = unsafe {
            core::slice::from_raw_parts_mut(
                python.as_mut_ptr().cast::<PyFrameEntry>(),
                MAX_PY_FRAMES,
            )
        };
        let (head, count, flags) = crate::frames::read(frames);
        record.py_head = head;
        record.py_count = count as u32;
        record.py_flags = flags;
    })
}

/// A sampled block's free: kept as an early record (true), or left to the probes (false).
#[inline(never)]
pub fn free(address: u64) -> bool {
    let Some(family) = keeping() else {
        return false;
    };
    keep(family, |record, _| {
        record.kind = EARLY_FREE;
        record.address = address;
    })
}

/// Writes a record with `fill` while the table keeps them; waits while allocscope reads
/// them (or while they are all taken). False: the probes are to fire.
fn keep(family: &FamilyHeader, fill: impl Fn(&mut EarlyHead, &mut [u8])) -> bool {
    if crate::sandbox::quiet() {
        // A record takes system calls (a mapping, the stack's copy) a sandbox may forbid:
        // wait for the probes instead, spinning (a sleep is a system call too).
        spin_until_off(family);
        return false;
    }
    if !region::in_family_namespace() {
        // Its pids are not allocscope's: no record, the probes once they are attached.
        wait_until_off(family);
        return false;
    }
    loop {
        // Announced before the state is read, and allocscope sets the state before it
        // counts writers (both sequentially consistent): either this writer sees it
        // holding, or allocscope sees this writer and waits for it.
        family.early_writers.fetch_add(1, Ordering::SeqCst);
        let state = family.early_state.load(Ordering::SeqCst);
        if state == EARLY_KEEP {
            let index = family.early_next.fetch_add(1, Ordering::AcqRel) as usize;
            if index < EARLY_SLOTS {
                let kept = match MappedRecord::at(index) {
                    Some(mut mapped) => {
                        let (record, rest) = mapped.parts();
                        write(record, rest, &fill);
                        true
                    }
                    None => false,
                };
                family.early_writers.fetch_sub(1, Ordering::SeqCst);
                if !kept {
                    // No room for it (the table's file system full, or no mapping): said
                    // so (allocscope does not count it lost), and the probes take it once
                    // attached, as when every record is taken.
                    family.early_unbacked.fetch_add(1, Ordering::Release);
                    wait_until_off(family);
                }
                return kept;
            }
        }
        family.early_writers.fetch_sub(1, Ordering::SeqCst);
        if state == EARLY_OFF || !wait_until_off(family) {
            return false;
        }
    }
}

fn write(record: &mut EarlyRecord, rest: &mut [u8], fill: &impl Fn(&mut EarlyHead, &mut [u8])) {
    let complete = &record.complete;
    let record = &mut record.head;
    // SAFETY: getpid/gettid have no preconditions; PR_GET_NAME writes at most 16 bytes
    // into the record's 16-byte name.
    unsafe {
        record.pid = libc::getpid() as u64;
        record.tid = libc::gettid() as u64;
        libc::prctl(libc::PR_GET_NAME, record.comm.as_mut_ptr());
    }
    record.timestamp_ns = crate::monotonic_ns();
    fill(record, rest);
    complete.store(1, Ordering::Release);
}

/// One early record mapped while it is written (a few dozen pages of address space for a
/// moment, not the 64 MiB of all of them for the process's lifetime: a program under a
/// tight `RLIMIT_AS` would run out sooner).
struct MappedRecord {
    at: *mut u8,
}

impl MappedRecord {
    /// Record `index` (< [`EARLY_SLOTS`]) of the family table, mapped.
    #[cold]
    fn at(index: usize) -> Option<MappedRecord> {
        let fd = region::open_family()?;
        let offset = family_early_offset() + index * early_record_bytes();
        if !region::back(fd, offset, early_record_bytes()) {
            // SAFETY: closing what open_family opened.
            unsafe { libc::close(fd) };
            return None;
        }
        // SAFETY: a shared mapping of one record of the family table (within its size,
        // checked by open_family).
        let mapped = unsafe {
            libc::mmap(
                ptr::null_mut(),
                early_record_bytes(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                offset as libc::off_t,
            )
        };
        // SAFETY: closing what open_family opened (the mapping stays).
        unsafe { libc::close(fd) };
        (mapped != libc::MAP_FAILED).then(|| MappedRecord { at: mapped.cast() })
    }

    /// The record and the room after its head (Python frames, then stack).
    fn parts(&mut self) -> (&mut EarlyRecord, &mut [u8]) {
        // SAFETY: a mapping of one record, this writer's alone (it claimed the index
        // through early_next), page-aligned; the head and the rest do not overlap.
        unsafe {
            let record = &mut *self.at.cast::<EarlyRecord>();
            let rest = core::slice::from_raw_parts_mut(
                self.at.add(EARLY_PY_OFFSET),
                early_record_bytes() - EARLY_PY_OFFSET,
            );
            (record, rest)
        }
    }
}

impl Drop for MappedRecord {
    fn drop(&mut self) {
        // SAFETY: our own mapping of one record, no longer referenced.
        unsafe { libc::munmap(self.at.cast(), early_record_bytes()) };
    }
}

/// Copies this thread's stack from `sp` into `out`, as far as it is mapped: page by page
/// through `process_vm_readv` (on this process), which stops at the first unmapped page
/// instead of faulting. Returns the bytes copied.
fn copy_own_stack(sp: u64, out: &mut [u8]) -> usize {
    const PAGE: u64 = 4096;
    const PIECES: usize = MAX_STACK_COPY / 4096 + 1;
    let mut remote = [libc::iovec {
        iov_base: ptr::null_mut(),
        iov_len: 0,
    }; PIECES];
    let (mut at, end, mut count) = (sp, sp + out.len() as u64, 0);
    while at < end && count < PIECES {
        let piece_end = ((at / PAGE) + 1) * PAGE;
        let piece_end = piece_end.min(end);
        remote[count] = libc::iovec {
            iov_base: at as *mut libc::c_void,
            iov_len: (piece_end - at) as usize,
        };
        count += 1;
        at = piece_end;
    }
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: out.len(),
    };
    // SAFETY: reads our own memory into `out` (its length given); the kernel checks the
    // source pages and stops at the first one that is not mapped.
    let copied = unsafe {
        libc::process_vm_readv(libc::getpid(), &local, 1, remote.as_ptr(), count as u64, 0)
    };
    copied.max(0) as usize
}

/// A wait for allocscope timed out once (it died while attaching, or is stuck): no call
/// waits again, each would cost the program its whole timeout.
static GAVE_UP: AtomicBool = AtomicBool::new(false);

/// Spins until allocscope turns early records off (its probes are attached then), for
/// about as long as [`wait_until_off`] waits at most, with no system call.
#[cold]
fn spin_until_off(family: &FamilyHeader) {
    if GAVE_UP.load(Ordering::Relaxed) {
        return;
    }
    // ~2 s of `pause` at ~40-140 cycles each on current x86 cores.
    for _ in 0..50_000_000u64 {
        if family.early_state.load(Ordering::Acquire) == EARLY_OFF {
            return;
        }
        core::hint::spin_loop();
    }
    GAVE_UP.store(true, Ordering::Relaxed);
}

/// Waits until allocscope turns early records off; false after [`WAIT_ROUNDS`] (and at
/// once after one such wait timed out).
#[cold]
fn wait_until_off(family: &FamilyHeader) -> bool {
    if GAVE_UP.load(Ordering::Relaxed) {
        return false;
    }
    let waited = wait_rounds(family);
    if !waited {
        GAVE_UP.store(true, Ordering::Relaxed);
    }
    waited
}

/// Up to [`WAIT_ROUNDS`] sleeps of [`WAIT_NS`] until early records are off.
fn wait_rounds(family: &FamilyHeader) -> bool {
    for _ in 0..WAIT_ROUNDS {
        if family.early_state.load(Ordering::Acquire) == EARLY_OFF {
            return true;
        }
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: WAIT_NS,
        };
        // SAFETY: nanosleep with a valid request and no remainder wanted.
        unsafe { libc::nanosleep(&pause, ptr::null_mut()) };
    }
    false
}
