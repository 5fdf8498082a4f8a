//! The family table's early records from allocscope's side: asked for before the command
//! runs, read once the probes are attached (see `sampler-preload`'s `early` module for why
//! and [`sampler_common::preload::EarlyRecord`] for the layout).

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use sampler_common::{
    preload::{
        early_record_bytes, family_early_bytes, family_early_offset, EarlyHead, EarlyRecord,
        EARLY_HOLD, EARLY_KEEP, EARLY_OFF, EARLY_PY_OFFSET, EARLY_SLOTS, EARLY_STACK_OFFSET,
        MAX_PY_FRAMES,
    },
    python::PyFrameEntry,
};

use super::Family;

/// Longest wait for the writers of early records to finish (a writer killed half-way never
/// does: its record is left out, incomplete).
const WRITERS_WAIT: Duration = Duration::from_millis(100);

/// One early record as read from the family table: its head, its Python frames and its
/// stack, owned ([`EarlyRecord`]'s first word is an atomic, and the rest follows it in the
/// table).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct EarlyCopy {
    /// The probe's arguments, the thread, the registers.
    pub head: EarlyHead,
    /// Python frames the library read, leaf first (none unless `head.py_head` is set).
    pub python: Vec<PyFrameEntry>,
    /// The stack's top from `head.sp`.
    pub stack: Vec<u8>,
}

impl EarlyCopy {
    /// Process id.
    pub(crate) fn pid(&self) -> u32 {
        self.head.pid as u32
    }
}

/// What was read: the complete records in claim order, and how many samples found no
/// record free or none complete.
#[derive(Debug, Default)]
pub(crate) struct EarlyRead {
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
    pub(crate) fn keep_early(&self, stack_bytes: u32) {
        let header = self.header();
        header
            .early_stack_bytes
            .store(u64::from(stack_bytes), Ordering::Release);
        header.early_state.store(EARLY_KEEP, Ordering::SeqCst);
    }

    /// Whether early records are being kept.
    pub(crate) fn keeps_early(&self) -> bool {
        self.header().early_state.load(Ordering::Acquire) != EARLY_OFF
    }

    /// Holds the writers (a thread about to write a record waits) and reads every record
    /// written; the caller then makes the probes ready for what the records leave open (the
    /// live blocks) and calls [`Self::end_early`].
    pub(crate) fn hold_early(&self) -> anyhow::Result<EarlyRead> {
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
        if claimed == 0 {
            return Ok(read);
        }
        let records = self.early_records()?;
        for index in 0..claimed.min(EARLY_SLOTS) {
            match records.get(index) {
                Some(record) => read.records.push(record),
                None => read.incomplete += 1,
            }
        }
        Ok(read)
    }

    /// The early records, read-only, for a reader that looks at them while they are being
    /// written (only complete ones are read).
    pub(crate) fn early_records(&self) -> anyhow::Result<EarlyRecords> {
        // SAFETY: a shared read-only mapping of our own memfd's early records (within its
        // size); a record is read only once complete.
        let records = unsafe {
            memmap2::MmapOptions::new()
                .offset(family_early_offset() as u64)
                .len(family_early_bytes())
                .map(&self.file)
        }
        .context("mapping the early records")?;
        // SAFETY: as above, the header's page.
        let header = unsafe {
            memmap2::MmapOptions::new()
                .len(std::mem::size_of::<sampler_common::preload::Family>())
                .map(&self.file)
        }
        .context("mapping the family table's header")?;
        Ok(EarlyRecords { header, records })
    }

    /// The processes with a claim in the table (the command's tree, as far as it loaded
    /// the library).
    pub(crate) fn members(&self) -> Vec<u32> {
        self.header()
            .claims
            .iter()
            .map(|word| word.load(Ordering::Acquire))
            .filter(|&word| sampler_common::preload::claim_ready(word))
            .map(sampler_common::preload::claim_pid)
            .collect()
    }

    /// Ends early records: the command's tree fires the probes from now on.
    pub(crate) fn end_early(&self) {
        self.header().early_state.store(EARLY_OFF, Ordering::SeqCst);
    }
}

/// A family table's early records, mapped read-only: sendable to another thread.
pub(crate) struct EarlyRecords {
    header: memmap2::Mmap,
    records: memmap2::Mmap,
}

impl EarlyRecords {
    /// Records claimed so far (at most [`EARLY_SLOTS`]).
    pub(crate) fn claimed(&self) -> usize {
        // SAFETY: the header's mapping, page-aligned, as long as the header; read through
        // its atomics only.
        let header = unsafe {
            &*self
                .header
                .as_ptr()
                .cast::<sampler_common::preload::Family>()
        };
        (header.early_next.load(Ordering::Acquire) as usize).min(EARLY_SLOTS)
    }

    /// Record `index`, if complete.
    pub(crate) fn get(&self, index: usize) -> Option<EarlyCopy> {
        self.copy(index, true)
    }

    /// Record `index` without its stack (empty), if complete: for a reader of its head
    /// and Python frames only, which need not copy up to 64 KiB a record.
    pub(crate) fn get_without_stack(&self, index: usize) -> Option<EarlyCopy> {
        self.copy(index, false)
    }

    fn copy(&self, index: usize, with_stack: bool) -> Option<EarlyCopy> {
        let at = index.checked_mul(early_record_bytes())?;
        copy_record(self.records.get(at..at + early_record_bytes())?, with_stack)
    }
}

/// The record at the start of `bytes` (one record's room), if complete; its stack too if
/// `with_stack`.
fn copy_record(bytes: &[u8], with_stack: bool) -> Option<EarlyCopy> {
    if bytes.len() < EARLY_STACK_OFFSET {
        return None;
    }
    // SAFETY: `bytes` is a record's room in a page-aligned mapping (records start at
    // multiples of whole pages), longer than the record; its first word is an atomic.
    let record = unsafe { &*bytes.as_ptr().cast::<EarlyRecord>() };
    if record.complete.load(Ordering::Acquire) != 1 {
        return None;
    }
    // Plain integers, copied once the record is complete (its writer is done with it).
    let head = record.head;
    let python = if head.py_head == 0 {
        Vec::new()
    } else {
        let count = (head.py_count as usize).min(MAX_PY_FRAMES);
        // SAFETY: the frames' room, 8-byte aligned, plain integers.
        let frames = unsafe {
            std::slice::from_raw_parts(
                bytes.as_ptr().add(EARLY_PY_OFFSET).cast::<PyFrameEntry>(),
                count,
            )
        };
        frames.to_vec()
    };
    let stack_len = if with_stack {
        (head.stack_len as usize).min(bytes.len() - EARLY_STACK_OFFSET)
    } else {
        0
    };
    Some(EarlyCopy {
        head,
        python,
        stack: bytes[EARLY_STACK_OFFSET..EARLY_STACK_OFFSET + stack_len].to_vec(),
    })
}
