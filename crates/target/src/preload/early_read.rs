//! The family table's early records from allocscope's side: asked for before the command
//! runs, read once the probes are attached (see `sampler-preload`'s `early_records` module for why
//! and [`sampler_common::preload::EarlyRecord`] for the layout).

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use sampler_common::{
    preload::{
        early_record_bytes, family_early_offset, EarlyHead, EarlyRecord, EARLY_HOLD, EARLY_KEEP,
        EARLY_OFF, EARLY_PY_OFFSET, EARLY_SLOTS, EARLY_STACK_OFFSET, MAX_PY_FRAMES,
    },
    python::PyFrameEntry,
};

use super::FamilyTable;

/// Longest wait for the writers of early records to finish (a writer killed half-way never
/// does: its record is left out, incomplete).
const WRITERS_WAIT: Duration = Duration::from_millis(100);

/// One early record as read from the family table: its head, its Python frames and its
/// stack, owned ([`EarlyRecord`]'s first word is an atomic, and the rest follows it in the
/// table).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EarlyCopy {
    /// The probe's arguments, the thread, the registers.
    pub head: EarlyHead,
    /// Python frames the library read, leaf first (none unless `head.py_head` is set).
    pub python: Vec<PyFrameEntry>,
    /// The stack's top from `head.sp`.
    pub stack: Vec<u8>,
}

impl EarlyCopy {
    /// Process id.
    pub fn pid(&self) -> u32 {
        self.head.pid as u32
    }
}

/// What was read: the complete records in claim order, and how many samples found no
/// record free or none complete.
#[derive(Debug, Default)]
pub struct EarlyRead {
    /// Complete records, in the order they were claimed.
    pub records: Vec<EarlyCopy>,
    /// Samples and frees that came when every record was taken, or whose record could not
    /// be given storage: they waited for allocscope and went to the probes.
    pub waited: u64,
    /// Records claimed but never completed (their writer died).
    pub incomplete: u64,
}

impl FamilyTable {
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
        // Records left unwritten for want of storage: their samples went to the probes.
        let unbacked = header.early_unbacked.load(Ordering::Acquire);
        read.incomplete = read.incomplete.saturating_sub(unbacked);
        read.waited += unbacked;
        Ok(read)
    }

    /// The early records, read-only, for a reader that looks at them while they are being
    /// written (only complete ones are read).
    pub fn early_records(&self) -> anyhow::Result<EarlyRecords> {
        // SAFETY: as above, the header's page (given storage at creation).
        let header = unsafe {
            memmap2::MmapOptions::new()
                .len(std::mem::size_of::<sampler_common::preload::FamilyHeader>())
                .map(&self.file)
        }
        .context("mapping the family table's header")?;
        let file = self
            .file
            .try_clone()
            .context("the family table's descriptor")?;
        Ok(EarlyRecords { header, file })
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

/// A family table's early records, read through its descriptor (`pread`), never mapped:
/// a record whose writer could not give it storage is a hole, and touching a hole of a
/// full tmpfs through a mapping raised SIGBUS (in allocscope), where a read gives zeros
/// (not complete). Sendable to another thread.
pub struct EarlyRecords {
    header: memmap2::Mmap,
    file: std::fs::File,
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
                .cast::<sampler_common::preload::FamilyHeader>()
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

    /// Record `index`: its first word (complete or not), then, once complete, the rest
    /// (its writer finished it before it set that word; x86 keeps two reads in order).
    fn copy(&self, index: usize, with_stack: bool) -> Option<EarlyCopy> {
        use std::os::unix::fs::FileExt as _;
        if index >= EARLY_SLOTS {
            return None;
        }
        let at = (family_early_offset() + index * early_record_bytes()) as u64;
        let mut complete = [0u8; 8];
        let word = std::mem::offset_of!(EarlyRecord, complete) as u64;
        self.file.read_exact_at(&mut complete, at + word).ok()?;
        if u64::from_ne_bytes(complete) != 1 {
            return None;
        }
        let mut head = vec![0u8; EARLY_STACK_OFFSET];
        self.file.read_exact_at(&mut head, at).ok()?;
        let mut copy = copy_record(&head)?;
        if with_stack {
            let len = (copy.head.stack_len as usize).min(early_record_bytes() - EARLY_STACK_OFFSET);
            copy.stack = vec![0u8; len];
            let from = at + EARLY_STACK_OFFSET as u64;
            self.file.read_exact_at(&mut copy.stack, from).ok()?;
        }
        Some(copy)
    }
}

/// The record whose head and Python frames are `bytes` (its first [`EARLY_STACK_OFFSET`]
/// bytes), without its stack.
fn copy_record(bytes: &[u8]) -> Option<EarlyCopy> {
    if bytes.len() < EARLY_STACK_OFFSET {
        return None;
    }
    let at = std::mem::offset_of!(EarlyRecord, head);
    let head = bytes.get(at..at + std::mem::size_of::<EarlyHead>())?;
    // SAFETY: an EarlyHead's bytes, plain integers (any bytes are a value), unaligned.
    let head = unsafe { std::ptr::read_unaligned(head.as_ptr().cast::<EarlyHead>()) };
    let python = if head.py_head == 0 {
        Vec::new()
    } else {
        let count = (head.py_count as usize).min(MAX_PY_FRAMES);
        let frames = bytes.get(EARLY_PY_OFFSET..)?;
        (0..count)
            .map(|i| {
                let at = i * std::mem::size_of::<PyFrameEntry>();
                let entry = frames.get(at..at + std::mem::size_of::<PyFrameEntry>())?;
                // SAFETY: a PyFrameEntry's bytes, plain integers (any bytes are a value).
                Some(unsafe { std::ptr::read_unaligned(entry.as_ptr().cast::<PyFrameEntry>()) })
            })
            .collect::<Option<Vec<_>>>()?
    };
    Some(EarlyCopy {
        head,
        python,
        stack: Vec::new(),
    })
}
