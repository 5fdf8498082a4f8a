//! The family table's early records from allocscope's side: asked for before the command
//! runs, read once the probes are attached (see `sampler-preload`'s `early` module for why
//! and [`sampler_common::preload::EarlyRecord`] for the layout).

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use sampler_common::preload::{
    early_record_bytes, family_early_bytes, family_early_offset, EarlyRecord, EARLY_HOLD,
    EARLY_KEEP, EARLY_OFF, EARLY_SLOTS,
};

use super::Family;

/// Longest wait for the writers of early records to finish (a writer killed half-way never
/// does: its record is left out, incomplete).
const WRITERS_WAIT: Duration = Duration::from_millis(100);

/// One early record as read from the family table: an owned copy of [`EarlyRecord`]
/// (whose first word is an atomic, and whose stack follows it in the table) with its stack.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EarlyCopy {
    /// [`EARLY_ALLOC`] or [`EARLY_FREE`].
    pub kind: u64,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The thread's name (NUL-padded).
    pub comm: [u8; 16],
    /// CLOCK_MONOTONIC ns.
    pub timestamp_ns: u64,
    /// The block.
    pub address: u64,
    /// The `allocscope:alloc` arguments.
    pub size: u64,
    /// See [`Self::size`].
    pub offset: u64,
    /// See [`Self::size`].
    pub interval: u64,
    /// See [`Self::size`].
    pub how: u64,
    /// Registers where the stack was copied.
    pub ip: u64,
    /// See [`Self::ip`].
    pub sp: u64,
    /// See [`Self::ip`].
    pub bp: u64,
    /// The stack's top from `sp`.
    pub stack: Vec<u8>,
}

/// What was read: the complete records in claim order, and how many samples found no
/// record free or none complete.
#[derive(Debug, Default)]
pub struct EarlyRead {
    /// Complete records, in the order they were claimed.
    pub records: Vec<EarlyCopy>,
    /// Samples and frees that came when every record was taken: they waited for
    /// allocscope and went to the probes.
    pub waited: u64,
    /// Records claimed but never completed (their writer died).
    pub incomplete: u64,
}

impl Family {
    /// Asks the command's tree to keep early records, each sample with `stack_bytes` of
    /// stack, until [`Self::end_early`]: before the command runs.
    pub fn keep_early(&self, stack_bytes: u32) {
        let header = self.header();
        header
            .early_stack_bytes
            .store(u64::from(stack_bytes), Ordering::Release);
        header.early_state.store(EARLY_KEEP, Ordering::SeqCst);
    }

    /// Whether early records are being kept.
    pub fn keeps_early(&self) -> bool {
        self.header().early_state.load(Ordering::Acquire) != EARLY_OFF
    }

    /// Holds the writers (a thread about to write a record waits) and reads every record
    /// written; the caller then makes the probes ready for what the records leave open (the
    /// live blocks) and calls [`Self::end_early`].
    pub fn hold_early(&self) -> anyhow::Result<EarlyRead> {
        let header = self.header();
        header.early_state.store(EARLY_HOLD, Ordering::SeqCst);
        let deadline = Instant::now() + WRITERS_WAIT;
        while header.early_writers.load(Ordering::SeqCst) != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(50));
        }
        let claimed = header.early_next.load(Ordering::Acquire) as usize;
        let mut read = EarlyRead {
            waited: claimed.saturating_sub(EARLY_SLOTS) as u64,
            ..EarlyRead::default()
        };
        let count = claimed.min(EARLY_SLOTS);
        if count == 0 {
            return Ok(read);
        }
        // SAFETY: a shared read-only mapping of our own memfd's early records (within its
        // size); the writers are held, and a record is read only once complete.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(family_early_offset() as u64)
                .len(family_early_bytes())
                .map(&self.file)
        }
        .context("mapping the early records")?;
        for index in 0..count {
            let at = index * early_record_bytes();
            match copy_record(&map[at..at + early_record_bytes()]) {
                Some(record) => read.records.push(record),
                None => read.incomplete += 1,
            }
        }
        Ok(read)
    }

    /// The processes with a claim in the table (the command's tree, as far as it loaded
    /// the library).
    pub fn members(&self) -> Vec<u32> {
        self.header()
            .claims
            .iter()
            .map(|word| word.load(Ordering::Acquire))
            .filter(|&word| sampler_common::preload::claim_ready(word))
            .map(sampler_common::preload::claim_pid)
            .collect()
    }

    /// Ends early records: the command's tree fires the probes from now on.
    pub fn end_early(&self) {
        self.header().early_state.store(EARLY_OFF, Ordering::SeqCst);
    }
}

/// The record at the start of `bytes` (one record's room), if complete.
fn copy_record(bytes: &[u8]) -> Option<EarlyCopy> {
    let head = std::mem::size_of::<EarlyRecord>();
    // SAFETY: `bytes` is a record's room in a page-aligned mapping (records start at
    // multiples of whole pages), at least `head` long; its first word is an atomic.
    let complete = unsafe { &*bytes.as_ptr().cast::<AtomicU64>() };
    if complete.load(Ordering::Acquire) != 1 {
        return None;
    }
    // SAFETY: as above; the rest is plain integers, read by value.
    let record: EarlyRecord = unsafe { std::ptr::read(bytes.as_ptr().cast()) };
    let stack_len = (record.stack_len as usize).min(bytes.len() - head);
    Some(EarlyCopy {
        kind: record.kind,
        pid: record.pid as u32,
        tid: record.tid as u32,
        comm: record.comm,
        timestamp_ns: record.timestamp_ns,
        address: record.address,
        size: record.size,
        offset: record.offset,
        interval: record.interval,
        how: record.how,
        ip: record.ip,
        sp: record.sp,
        bp: record.bp,
        stack: bytes[head..head + stack_len].to_vec(),
    })
}
