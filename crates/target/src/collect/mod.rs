//! ② From the kernel: ring-buffer records and the exact and loss counters.
//!
//! The ring buffer is read on a thread of its own ([`SampleReader`]): records are copied
//! out and decoded immediately so the kernel can reuse the space, and handed to the
//! recording over a bounded channel: intake never waits on symbolization, aggregation or
//! output.

use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use sampler_common::{
    AllocEvent, AllocFn, EventKind, FreeEvent, ProcessEvent, SampleRecord, StackCopy,
    FLAG_RUNTIME_RATE, FLAG_STACK_AT_RETURN, FLAG_STACK_COPY, FLAG_TRACKED, FLAG_WEIGHTED,
    MAX_STACK_DEPTH, PROCESS_EXEC, PROCESS_FORK, RETURN_SLOTS,
};
use tokio::sync::mpsc;

mod counters;
mod maps_reader;
use maps_reader::MapsReader;
pub mod early_decode;
pub mod forget;

pub use counters::{lost, thread_states, Counters, Losses, LostBatch};

pub use crate::sys::clock::monotonic_ns;

/// A decoded sample, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The thread's name then (`comm`, NUL-padded; see [`comm_name`]).
    pub thread_comm: [u8; 16],
    /// CLOCK_MONOTONIC nanoseconds.
    pub timestamp_ns: u64,
    /// Allocator function.
    pub function: AllocFn,
    /// Allocation size.
    pub size: u64,
    /// Offset of the sampled byte.
    pub offset: u64,
    /// Mean interval in force.
    pub interval: u64,
    /// Direct caller's return address (`[rsp]` at entry; 0 when the stack was taken at the
    /// return).
    pub return_address: u64,
    /// Raw user stack: at the entry, `[0]` is the allocator and the direct caller is missing
    /// (see `return_address`); at the return, `[0]` is the direct caller.
    pub stack: Vec<u64>,
    /// Whether `stack` (or `copied`) was taken at the allocator's return.
    pub stack_at_return: bool,
    /// The top of the user stack and the registers to unwind it from (`--unwind dwarf`;
    /// `stack` is then empty).
    pub copied: Option<CopiedStack>,
    /// The block's address (0 when frees are not tracked or the allocation failed).
    pub address: u64,
    /// Whether the kernel tracks the block: its free will be reported.
    pub tracked: bool,
    /// The bytes the sample stands for, as another program's sampling allocator stated it
    /// (`otel_memory:alloc`'s weight; `interval` and `offset` then mean nothing); `None`:
    /// drawn by allocscope's own countdown.
    pub weight: Option<u64>,
    /// The kernel sent the thread's Python frames just before (resolved into `python` on
    /// the intake thread).
    pub python_sent: bool,
    /// The Python frames running at the call.
    pub python: Option<Box<crate::python::PythonStack>>,
    /// `stack` is a Go runtime's own traceback (its heap profile's,
    /// [`go_profile`]): an inlined call's caller has an entry of its own, at its inline
    /// mark, which follows no call instruction.
    pub runtime_traceback: bool,
}

/// A copy of the top of a sampled thread's user stack, with the registers it was taken with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopiedStack {
    /// Instruction pointer: the probed instruction (at an entry) or the direct caller's
    /// return address (at a return).
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
    /// `rbp`.
    pub bp: u64,
    /// User address of `bytes[0]`.
    pub start: u64,
    /// The stack's bytes from `start` upwards.
    pub bytes: Vec<u8>,
    /// Return slots of the thread's latest probed calls and the return addresses they held
    /// at entry, newest first: where the kernel's uretprobe trampoline now stands in one,
    /// the unwinder reads the original instead.
    pub returns: Vec<(u64, u64)>,
}

/// A tracked block was freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Freed {
    /// Process id.
    pub pid: u32,
    /// CLOCK_MONOTONIC nanoseconds.
    pub timestamp_ns: u64,
    /// The block's address.
    pub address: u64,
    /// Told by a reading of a Go runtime's heap profile ([`crate::probe::go::reader`]), not a probe: at
    /// the reading's time, the block's lifetime unknown (both ends rounded to readings).
    pub read: bool,
}

/// A decoded ring-buffer record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A sampled allocation.
    Alloc(Sample),
    /// A tracked block freed.
    Free(Freed),
    /// A followed process forked (`parent` set) or exec'd (`parent` 0).
    Process {
        /// The new or exec'ing process.
        pid: u32,
        /// The forking process; 0 for an exec.
        parent: u32,
        /// When (CLOCK_MONOTONIC ns).
        timestamp_ns: u64,
        /// Its name then (a new process's is its parent's).
        comm: String,
    },
    /// The text of a process's /proc/PID/maps, read by the intake thread as soon as its
    /// first sample (since its exec) arrived: a process that lives a few milliseconds may
    /// be gone by the time its samples are unwound, and its mappings with it.
    Maps {
        /// The process.
        pid: u32,
        /// When it was read (CLOCK_MONOTONIC ns).
        read_ns: u64,
        /// The file's text.
        text: String,
    },
    /// A sample's Python frames, as read (paired with the sample on the intake thread,
    /// never handed on).
    PythonFrames(crate::python::RawStack),
    /// A Go process's runtime statistics as its exit, or an exec, left them (empty:
    /// unreadable).
    GoStats {
        /// The process.
        pid: u32,
        /// The statistics' bytes.
        bytes: Vec<u8>,
        /// Its `runtime.MemProfileRate` then (`None`: not read).
        rate: Option<u64>,
        /// Read as it exec'd another program (else as it exited).
        at_exec: bool,
        /// When (the kernel's monotonic clock).
        timestamp_ns: u64,
    },
}

/// Decodes one ring-buffer record; `None` for a record of the wrong size or content.
pub(crate) fn decode(bytes: &[u8]) -> Option<Event> {
    let kind = u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?);
    if kind == EventKind::Free as u32 {
        decode_free(bytes)
    } else if kind == EventKind::Process as u32 {
        decode_process(bytes)
    } else if kind == EventKind::Alloc as u32 {
        decode_alloc(bytes)
    } else if kind == EventKind::PythonStack as u32 {
        crate::python::decode(bytes).map(Event::PythonFrames)
    } else if kind == EventKind::GoStats as u32 {
        decode_go_stats(bytes)
    } else {
        None
    }
}

fn decode_free(bytes: &[u8]) -> Option<Event> {
    if bytes.len() < std::mem::size_of::<FreeEvent>() {
        return None;
    }
    // SAFETY: the length was checked; FreeEvent is plain integers.
    let event: FreeEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    Some(Event::Free(Freed {
        pid: event.pid,
        timestamp_ns: event.timestamp_ns,
        address: event.address,
        read: false,
    }))
}

fn decode_go_stats(bytes: &[u8]) -> Option<Event> {
    use sampler_common::GoStatsEvent;
    let word = |at: usize| Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    let (pid, len) = (word(4)?, word(8)? as usize);
    let at = std::mem::offset_of!(GoStatsEvent, rate);
    let rate = u64::from_ne_bytes(bytes.get(at..at + 8)?.try_into().ok()?);
    let moment = word(std::mem::offset_of!(GoStatsEvent, moment))?;
    let at = std::mem::offset_of!(GoStatsEvent, timestamp_ns);
    let timestamp_ns = u64::from_ne_bytes(bytes.get(at..at + 8)?.try_into().ok()?);
    let head = std::mem::offset_of!(GoStatsEvent, bytes);
    Some(Event::GoStats {
        pid,
        bytes: bytes.get(head..head + len)?.to_vec(),
        rate: (rate != u64::MAX).then_some(rate),
        at_exec: moment == sampler_common::GO_STATS_AT_EXEC,
        timestamp_ns,
    })
}

fn decode_process(bytes: &[u8]) -> Option<Event> {
    if bytes.len() < std::mem::size_of::<ProcessEvent>() {
        return None;
    }
    // SAFETY: the length was checked; ProcessEvent is plain integers.
    let event: ProcessEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let parent = match event.what {
        PROCESS_FORK => event.parent,
        PROCESS_EXEC => 0,
        _ => return None,
    };
    Some(Event::Process {
        pid: event.pid,
        parent,
        timestamp_ns: event.timestamp_ns,
        comm: comm_name(&event.comm),
    })
}

/// A kernel `comm` (NUL-padded, any bytes) as text: up to its first NUL, invalid UTF-8
/// replaced (still the target's: sanitize before a terminal sees it).
pub fn comm_name(comm: &[u8; 16]) -> String {
    let name = comm.split(|&b| b == 0).next().unwrap_or_default();
    String::from_utf8_lossy(name).into_owned()
}

fn decode_alloc(bytes: &[u8]) -> Option<Event> {
    if bytes.len() < SampleRecord::HEAD {
        return None;
    }
    // SAFETY: the length was checked; AllocEvent and StackCopy are plain integers (any bit
    // pattern is valid) and read_unaligned makes no alignment assumption about the record.
    let (event, copy): (AllocEvent, StackCopy) = unsafe {
        (
            std::ptr::read_unaligned(bytes.as_ptr().cast()),
            std::ptr::read_unaligned(bytes[std::mem::size_of::<AllocEvent>()..].as_ptr().cast()),
        )
    };
    let function = AllocFn::from_u32(event.function)?;
    if event.size == 0 || event.offset >= event.size || event.interval == 0 {
        return None;
    }
    let payload = &bytes[SampleRecord::HEAD..];
    let (stack, copied) = if event.flags & FLAG_STACK_COPY != 0 {
        (Vec::new(), Some(copied_stack(&event, &copy, payload)))
    } else {
        let depth = (event.stack_len as usize)
            .min(MAX_STACK_DEPTH)
            .min(payload.len() / 8);
        let frames = payload[..depth * 8]
            .chunks_exact(8)
            .map(|word| u64::from_ne_bytes(word.try_into().unwrap_or_default()))
            .collect();
        (frames, None)
    };
    Some(Event::Alloc(Sample {
        pid: event.pid,
        tid: event.tid,
        thread_comm: event.comm,
        timestamp_ns: event.timestamp_ns,
        function,
        size: event.size,
        offset: event.offset,
        interval: event.interval,
        return_address: event.return_address,
        stack,
        stack_at_return: event.flags & FLAG_STACK_AT_RETURN != 0,
        copied,
        address: event.address,
        tracked: event.flags & FLAG_TRACKED != 0,
        weight: weight_of(&event),
        python_sent: event.flags & sampler_common::python::FLAG_PYTHON != 0,
        python: None,
        runtime_traceback: false,
    }))
}

/// The bytes a sample stands for, where its sampler said (another producer's weight) or
/// where a runtime's rate says ([`crate::stats::runtime`]); `None`: drawn by allocscope's
/// countdown, estimated from its interval and offset.
fn weight_of(event: &AllocEvent) -> Option<u64> {
    if event.flags & FLAG_RUNTIME_RATE != 0 {
        Some(crate::stats::runtime::runtime_weight(
            event.size,
            event.interval,
        ))
    } else {
        (event.flags & FLAG_WEIGHTED != 0).then_some(event.interval)
    }
}

/// The stack copy of a sample (`--unwind dwarf`): its registers, bytes and the return
/// slots the kernel's trampolines replaced, latest first.
fn copied_stack(event: &AllocEvent, copy: &StackCopy, payload: &[u8]) -> CopiedStack {
    let length = (event.stack_len as usize).min(payload.len());
    CopiedStack {
        ip: copy.ip,
        sp: copy.sp,
        bp: copy.bp,
        start: copy.start,
        bytes: payload[..length].to_vec(),
        returns: (1..=copy.return_next.min(RETURN_SLOTS as u64))
            .map(|back| {
                let at = (copy.return_next - back) as usize % RETURN_SLOTS;
                (copy.return_slots[at], copy.return_values[at])
            })
            .collect(),
    }
}

/// What the intake thread hands over, in order.
enum Delivery {
    /// Records decoded from one drain of the ring buffer.
    Events(Vec<Event>),
    /// Everything in the ring buffer when catch-up request `n` was seen has been sent.
    CaughtUp(u64),
}

/// Bytes of records in flight between the intake thread and the recording: while the
/// recording is busy (symbolizing, writing a file), the thread drains the ring buffer into
/// batches of at most a ring buffer's worth, up to this much in all (and 2 to 16 batches),
/// before it waits, and the kernel counts what it then cannot deliver. Bounds allocscope's
/// memory when samples carry stack copies.
const BYTES_IN_FLIGHT: usize = 64 << 20;

/// Batches in flight for a ring buffer of `ring_bytes`.
fn batches_in_flight(ring_bytes: usize) -> usize {
    (BYTES_IN_FLIGHT / ring_bytes.max(1)).clamp(2, 16)
}

/// The sample stream, read on a thread of its own: it waits on the ring buffer's fd,
/// copies and decodes every record at once (so the kernel can reuse the space) and sends
/// them over a bounded channel. Nothing the recording does (symbolization, exports, the
/// terminal) delays intake.
pub struct SampleReader {
    deliveries: mpsc::Receiver<Delivery>,
    shared: Arc<Shared>,
    /// Samples whose Python frames were lost (`None`: Python frames off).
    python_missing: Option<Arc<AtomicU64>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// An idle reader's sending end, kept so that its channel never closes.
    _idle: Option<mpsc::Sender<Delivery>>,
}

/// State shared with the intake thread.
struct Shared {
    /// Wakes the thread at once (catch-up requests, stop).
    wake: OwnedFd,
    /// The latest catch-up request.
    requested: AtomicU64,
    stop: AtomicBool,
    /// Records that did not decode (a build mismatch; should stay 0).
    malformed: AtomicU64,
    /// Running processes about to be probed, whose interpreter (if any) the intake thread
    /// should find now rather than at their first sample.
    examine: std::sync::Mutex<Vec<u32>>,
    /// Requests put into `examine` so far (counted under its lock).
    examine_asked: AtomicU64,
    /// Of those, how many the intake thread has done.
    examined: AtomicU64,
    /// Processes gone, their last period sent: what the intake thread keeps of them goes.
    forget: std::sync::Mutex<Vec<u32>>,
}

impl Shared {
    fn new() -> anyhow::Result<Arc<Shared>> {
        // SAFETY: eventfd with constant flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("eventfd for the intake thread");
        }
        Ok(Arc::new(Shared {
            // SAFETY: a fresh descriptor nobody else owns.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            requested: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            malformed: AtomicU64::new(0),
            examine: std::sync::Mutex::new(Vec::new()),
            examine_asked: AtomicU64::new(0),
            examined: AtomicU64::new(0),
            forget: std::sync::Mutex::new(Vec::new()),
        }))
    }

    fn wake(&self) {
        let one = 1u64;
        // SAFETY: writing 8 bytes from a live local to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&raw const one).cast(), 8) };
    }
}

impl SampleReader {
    /// Starts the intake thread on the `SAMPLES` ring buffer taken from the loaded object.
    pub fn new(
        ring: RingBuf<MapData>,
        ring_bytes: usize,
        python: Option<crate::python::Frames>,
    ) -> anyhow::Result<SampleReader> {
        let shared = Shared::new()?;
        let python_missing = python.as_ref().map(crate::python::Frames::missing);
        let (sender, deliveries) = mpsc::channel(batches_in_flight(ring_bytes));
        let thread = std::thread::Builder::new()
            .name("allocscope-intake".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || intake(ring, ring_bytes, &shared, &sender, python)
            })
            .context("starting the intake thread")?;
        Ok(SampleReader {
            deliveries,
            shared,
            python_missing,
            thread: Some(thread),
            _idle: None,
        })
    }

    /// A reader of no ring buffer: a recording whose probes were never attached (its
    /// command's tree was gone before they loaded) has every event already; `read` waits
    /// forever and catching up is immediate.
    pub fn idle() -> anyhow::Result<SampleReader> {
        let (sender, deliveries) = mpsc::channel(1);
        Ok(SampleReader {
            deliveries,
            shared: Shared::new()?,
            python_missing: None,
            thread: None,
            _idle: Some(sender),
        })
    }

    /// Waits for the next records and moves them into `out`.
    pub async fn read(&mut self, out: &mut Vec<Event>) -> anyhow::Result<()> {
        match self.deliveries.recv().await {
            Some(Delivery::Events(events)) => out.extend(events),
            Some(Delivery::CaughtUp(_)) => {}
            None => anyhow::bail!("the intake thread stopped"),
        }
        Ok(())
    }

    /// Moves every record that was in the ring buffer when called into `out`.
    pub async fn catch_up(&mut self, out: &mut Vec<Event>) -> anyhow::Result<()> {
        if self.thread.is_none() {
            return Ok(());
        }
        let request = self.shared.requested.fetch_add(1, Ordering::SeqCst) + 1;
        self.shared.wake();
        loop {
            match self.deliveries.recv().await {
                Some(Delivery::Events(events)) => out.extend(events),
                Some(Delivery::CaughtUp(done)) if done >= request => return Ok(()),
                Some(Delivery::CaughtUp(_)) => {}
                None => anyhow::bail!("the intake thread stopped"),
            }
        }
    }

    /// Has the intake thread look for an interpreter in running process `pid` now (before
    /// its probes are attached): its Python frames are then read from its first sample.
    pub fn examine(&self, pid: u32) {
        if self.python_missing.is_none() {
            return;
        }
        if let Ok(mut pids) = self.shared.examine.lock() {
            pids.push(pid);
            self.shared.examine_asked.fetch_add(1, Ordering::AcqRel);
        }
        self.shared.wake();
    }

    /// [`Self::examine`] for each of `pids`, and waits (at most `longest`) until the intake
    /// thread has: for processes running already, whose samples come through the probes
    /// next.
    pub fn examine_now(&self, pids: &[u32], longest: std::time::Duration) {
        if self.python_missing.is_none() || pids.is_empty() {
            return;
        }
        let asked = match self.shared.examine.lock() {
            Ok(mut examine) => {
                examine.extend_from_slice(pids);
                self.shared.examine_asked.fetch_add(1, Ordering::AcqRel) + 1
            }
            Err(_) => return,
        };
        self.shared.wake();
        let deadline = std::time::Instant::now() + longest;
        while self.shared.examined.load(Ordering::Acquire) < asked
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// Has the intake thread forget what it keeps of `pids` (gone, and forgotten by the
    /// recording: the agent), so that it holds what is live, not what ever ran.
    pub fn forget(&self, pids: impl IntoIterator<Item = u32>) {
        if let Ok(mut forget) = self.shared.forget.lock() {
            forget.extend(pids);
        }
        self.shared.wake();
    }

    /// Records that did not decode so far.
    pub fn malformed(&self) -> u64 {
        self.shared.malformed.load(Ordering::Relaxed)
    }

    /// Samples that arrived without the Python frames the kernel read for them (the ring
    /// buffer had no room for those): their stacks show the evaluator's native frames.
    pub fn python_frames_missing(&self) -> u64 {
        self.python_missing
            .as_ref()
            .map_or(0, |missing| missing.load(Ordering::Relaxed))
    }
}

impl Drop for SampleReader {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake();
        // Unblocks a thread waiting for room in the channel.
        self.deliveries.close();
        while self.deliveries.try_recv().is_ok() {}
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// How often the intake thread looks at the ring buffer unasked. Samples, frees and
/// process events (fork, exec) are sent without waking it (a wake-up is an interrupt in
/// the probed thread, see the eBPF side's `wake_flags`) until the buffer is an eighth
/// full: so a record waits at most this long, and the thread wakes 50 times a second when
/// idle.
const POLL_MS: libc::c_int = 20;
/// The same where Python frames are read: a sample's code objects are read from the
/// process when its record is, and some live only milliseconds (a module's body, run once
/// at its import): read 20 ms late, ~25% more of an import-heavy script's frames were
/// gone. The wake-ups cost allocscope, not the targets.
const POLL_MS_PYTHON: libc::c_int = 2;

/// The intake thread: drain, decode, send, until stopped or nobody listens.
fn intake(
    mut ring: RingBuf<MapData>,
    batch_bytes: usize,
    shared: &Shared,
    sender: &mpsc::Sender<Delivery>,
    python: Option<crate::python::Frames>,
) {
    let mut served = 0;
    let poll_ms = if python.is_some() {
        POLL_MS_PYTHON
    } else {
        POLL_MS
    };
    let mut mapped = MapsReader {
        python,
        ..MapsReader::default()
    };
    while !shared.stop.load(Ordering::SeqCst) {
        let mut fds = [
            libc::pollfd {
                fd: ring.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: shared.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll on two live descriptors with a correctly sized array.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, poll_ms) };
        if fds[1].revents & libc::POLLIN != 0 {
            let mut count = 0u64;
            // SAFETY: reading the eventfd's 8-byte counter into a live local.
            unsafe { libc::read(shared.wake.as_raw_fd(), (&raw mut count).cast(), 8) };
        }
        if let Some(python) = &mut mapped.python {
            examine(shared, python);
        }
        if let Some(gone) = shared
            .forget
            .lock()
            .ok()
            .map(|mut f| std::mem::take(&mut *f))
        {
            mapped.forget(&gone.into_iter().collect());
        }
        // A busy ring buffer is drained in batches of a ring buffer's worth, each sent as
        // soon as it is full. A catch-up request read before a batch is acknowledged after
        // it: a ring buffer never holds more than its size, so what it held when asked is
        // in that batch. (Acknowledged only once the ring buffer was empty, a catch-up
        // during a storm that keeps it full never ended, and gathered every record
        // meanwhile: 1.6 GiB.)
        loop {
            let request = shared.requested.load(Ordering::SeqCst);
            let mut events = Vec::new();
            let (malformed, more) = drain_ring(&mut ring, &mut events, batch_bytes, &mut mapped);
            if malformed > 0 {
                shared.malformed.fetch_add(malformed, Ordering::Relaxed);
            }
            if !events.is_empty() && sender.blocking_send(Delivery::Events(events)).is_err() {
                return;
            }
            if request > served {
                if sender.blocking_send(Delivery::CaughtUp(request)).is_err() {
                    return;
                }
                served = request;
            }
            if !more || shared.stop.load(Ordering::SeqCst) {
                break;
            }
        }
    }
}

/// Looks for an interpreter in the processes [`SampleReader::examine`] named.
fn examine(shared: &Shared, python: &mut crate::python::Frames) {
    let (pids, asked) = match shared.examine.lock() {
        Ok(mut pids) => (
            std::mem::take(&mut *pids),
            shared.examine_asked.load(Ordering::Acquire),
        ),
        Err(_) => return,
    };
    for pid in pids {
        if let Ok(vmas) = crate::sys::maps::read(pid) {
            python.found_maps(pid, &vmas);
        }
    }
    // Every request made before the batch was taken is done.
    shared.examined.store(asked, Ordering::Release);
}

/// Decodes available records into `out`, up to `max_bytes` of them; returns how many were
/// malformed and whether it stopped at the limit (more may be waiting).
fn drain_ring(
    ring: &mut RingBuf<MapData>,
    out: &mut Vec<Event>,
    max_bytes: usize,
    mapped: &mut MapsReader,
) -> (u64, bool) {
    let mut malformed = 0;
    let mut bytes = 0;
    while let Some(record) = ring.next() {
        bytes += record.len();
        match decode(&record) {
            Some(Event::PythonFrames(raw)) => {
                if let Some(python) = &mut mapped.python {
                    python.arrived(raw);
                }
            }
            Some(mut event) => {
                mapped.before(&event, out);
                if let (Event::Alloc(sample), Some(python)) = (&mut event, &mut mapped.python) {
                    if sample.python_sent {
                        sample.python = python
                            .of_sample(sample.pid, sample.tid, sample.timestamp_ns)
                            .map(Box::new);
                    }
                }
                out.push(event);
            }
            None => malformed += 1,
        }
        if bytes >= max_bytes {
            return (malformed, true);
        }
    }
    (malformed, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<T>(value: &T) -> Vec<u8> {
        // SAFETY: the event structs are plain old data; viewing one as bytes is sound.
        unsafe {
            std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>())
        }
        .to_vec()
    }

    /// A record as the kernel sends it: head, then `payload`.
    fn record(event: &AllocEvent, copy: &StackCopy, payload: &[u8]) -> Vec<u8> {
        let mut bytes = bytes_of(event);
        bytes.extend(bytes_of(copy));
        bytes.extend_from_slice(payload);
        bytes
    }

    fn frames(addresses: &[u64]) -> Vec<u8> {
        addresses.iter().flat_map(|a| a.to_ne_bytes()).collect()
    }

    fn event() -> AllocEvent {
        AllocEvent {
            kind: EventKind::Alloc as u32,
            flags: FLAG_STACK_AT_RETURN | FLAG_TRACKED,
            address: 0x5000,
            timestamp_ns: 5,
            size: 100,
            offset: 7,
            interval: 4096,
            return_address: 0x42,
            pid: 10,
            tid: 11,
            stack_len: 3,
            function: AllocFn::Calloc as u32,
            comm: *b"worker-7\0\0\0\0\0\0\0\0",
        }
    }

    fn encoded(event: &AllocEvent) -> Vec<u8> {
        record(event, &StackCopy::default(), &frames(&[0xa, 0xb, 0xc]))
    }

    fn alloc(bytes: &[u8]) -> Sample {
        match decode(bytes) {
            Some(Event::Alloc(sample)) => sample,
            other => panic!("not an allocation: {other:?}"),
        }
    }

    #[test]
    fn decodes_allocations_and_frees() {
        let sample = alloc(&encoded(&event()));
        assert_eq!(sample.function, AllocFn::Calloc);
        assert_eq!(sample.stack, vec![0xa, 0xb, 0xc]);
        assert_eq!(sample.copied, None);
        assert_eq!(
            (sample.pid, sample.tid, sample.size, sample.offset),
            (10, 11, 100, 7)
        );
        assert_eq!(comm_name(&sample.thread_comm), "worker-7");
        assert!(sample.stack_at_return && sample.tracked);
        assert_eq!(sample.address, 0x5000);
        let free = FreeEvent {
            kind: EventKind::Free as u32,
            pid: 3,
            timestamp_ns: 9,
            address: 0x77,
        };
        let freed = Freed {
            pid: 3,
            timestamp_ns: 9,
            address: 0x77,
            read: false,
        };
        assert_eq!(decode(&bytes_of(&free)), Some(Event::Free(freed)));
        assert_eq!(decode(&bytes_of(&free)[..8]), None);
    }

    #[test]
    fn rejects_malformed_records() {
        assert!(decode(&[0u8; 16]).is_none());
        assert!(decode(&[]).is_none());
        let mut bad = event();
        bad.function = 99;
        assert!(decode(&encoded(&bad)).is_none());
        let mut bad = event();
        bad.offset = 100;
        assert!(decode(&encoded(&bad)).is_none());
        let mut unknown = event();
        unknown.kind = 7;
        assert!(decode(&encoded(&unknown)).is_none());
        let mut deep = event();
        deep.stack_len = 10_000;
        let payload = frames(&[7; MAX_STACK_DEPTH + 5]);
        let long = record(&deep, &StackCopy::default(), &payload);
        assert_eq!(alloc(&long).stack.len(), MAX_STACK_DEPTH);
        // A length beyond the record is cut to what arrived.
        assert_eq!(alloc(&encoded(&deep)).stack.len(), 3);
    }

    #[test]
    fn decodes_stack_copies() {
        let mut copy_event = event();
        copy_event.flags |= FLAG_STACK_COPY;
        copy_event.stack_len = 5;
        let copy = StackCopy {
            ip: 1,
            sp: 0x7ff0,
            bp: 3,
            start: 0x7ff0,
            return_slots: [0x10, 0x20, 0x30, 0x40],
            return_values: [1, 2, 3, 4],
            return_next: 6,
        };
        let sample = alloc(&record(&copy_event, &copy, &[1, 2, 3, 4, 5, 6, 7, 8]));
        assert!(sample.stack.is_empty());
        let copied = sample.copied.expect("a stack copy");
        assert_eq!(
            (copied.ip, copied.sp, copied.bp, copied.start),
            (1, 0x7ff0, 3, 0x7ff0)
        );
        assert_eq!(copied.bytes, vec![1, 2, 3, 4, 5]);
        // Six recorded: the newest is at 5 % 4 = 1, then 0, 3, 2.
        assert_eq!(
            copied.returns,
            vec![(0x20, 2), (0x10, 1), (0x40, 4), (0x30, 3)]
        );
        let fewer = StackCopy {
            return_next: 1,
            ..copy
        };
        let sample = alloc(&record(&copy_event, &fewer, &[0; 5]));
        assert_eq!(sample.copied.unwrap().returns, vec![(0x10, 1)]);
    }

    #[test]
    fn maps_go_ahead_of_a_processs_first_sample_and_again_after_its_exec() {
        let pid = std::process::id();
        let ours = Sample {
            pid,
            tid: pid,
            thread_comm: [0; 16],
            timestamp_ns: 1,
            function: AllocFn::Malloc,
            size: 64,
            offset: 3,
            interval: 4096,
            return_address: 0,
            stack: Vec::new(),
            stack_at_return: false,
            copied: None,
            address: 0,
            tracked: false,
            weight: None,
            python_sent: false,
            python: None,
            runtime_traceback: false,
        };
        let sample = Event::Alloc(ours.clone());
        let maps_sent = |reader: &mut MapsReader, event: &Event| {
            let mut out = Vec::new();
            reader.before(event, &mut out);
            out.iter()
                .filter(|e| matches!(e, Event::Maps { pid: p, text, .. } if *p == pid && text.contains("[stack]")))
                .count()
        };
        let mut reader = MapsReader::default();
        assert_eq!(maps_sent(&mut reader, &sample), 1, "first sample");
        assert_eq!(maps_sent(&mut reader, &sample), 0, "second sample");
        let exec = Event::Process {
            pid,
            parent: 0,
            timestamp_ns: 2,
            comm: "x".into(),
        };
        assert_eq!(maps_sent(&mut reader, &exec), 0, "the exec itself");
        assert_eq!(
            maps_sent(&mut reader, &sample),
            1,
            "first sample after the exec"
        );
        let gone = Event::Alloc(Sample {
            pid: u32::MAX - 1,
            ..ours
        });
        let mut out = Vec::new();
        reader.before(&gone, &mut out);
        assert!(
            out.is_empty(),
            "no maps for a process that is gone: {out:?}"
        );
    }
}
