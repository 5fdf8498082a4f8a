//! ② From a Go process's own heap profile: its runtime's buckets read every
//! [`READ_EVERY`] ([`super::buckets`]) and turned into the samples and frees a
//! probe on the runtime would have sent, so that everything downstream (stacks, estimates,
//! exports) is the same. No probe is in the program: it pays nothing.
//!
//! What a reading cannot say, and how it is stood in for:
//! * when a block was allocated or freed: the reading's time (samples of one interval
//!   share it; a reading's frees carry no lifetime);
//! * which block a free was: each bucket's blocks are one stack and one size, so a free
//!   ends the bucket's oldest block still live — first those allocated before the
//!   recording began (not in its samples), then its own; a block allocated and freed
//!   between two readings is freed right after its allocation (such blocks are never
//!   counted live together: a peak is not made of them);
//! * the thread: the process's main thread's name is given.
//!
//! A process that exits takes its last interval's samples with it (its memory is gone
//! before it can be read): said in its notes.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fs::File,
    io,
    os::unix::fs::FileExt as _,
    time::Duration,
};

use sampler_common::AllocFn;

use super::buckets::{Counts, Header, Layout};
use crate::collect::{Event, Freed, Sample};

/// How often a Go process's buckets are read.
pub const READ_EVERY: Duration = Duration::from_millis(100);

/// The most buckets kept per process; buckets beyond (a program with more distinct
/// allocation stacks) are counted, their samples not read.
pub const MAX_BUCKETS: usize = 1 << 16;

/// The most blocks per process remembered as live (a free pairs with one); beyond, a
/// sample is sent untracked (its free unknown), as the kernel's live map does when full.
pub const MAX_LIVE: usize = 1 << 20;

/// Records read in one system call: those within this many bytes of each other. Less
/// than a page: the bytes between two records are then on a page one of them is on, so a
/// read never spans a page the process has not mapped.
const GAP: u64 = 2048;

/// The largest single read.
const MAX_READ: u64 = 1 << 20;

/// One bucket: its stack, size and counts as last taken in, and its blocks live.
#[derive(Debug)]
struct Bucket {
    size: u64,
    stack: Vec<u64>,
    /// Where its record is (the process's address).
    record: u64,
    counts: Counts,
    /// Its blocks live when the recording began (their frees come first).
    before: u64,
    /// Its sampled blocks live, oldest first (the addresses given them).
    live: VecDeque<u64>,
}

/// A Go process's heap profile, read from outside.
#[derive(Debug)]
pub struct GoProfile {
    pid: u32,
    /// The layout, its addresses the process's.
    layout: Layout,
    /// `runtime.MemProfileRate`'s address in the process.
    rate_at: u64,
    /// The rate last read non-zero.
    rate: u64,
    /// `/proc/PID/mem`, opened once: reads fail once the process is gone, and never read a
    /// later process that reuses its pid.
    memory: File,
    comm: [u8; 16],
    buckets: HashMap<u64, Bucket>,
    /// Whether the first reading (the baseline) was taken.
    started: bool,
    /// Addresses given to sampled blocks (a reading does not say theirs).
    next_address: u64,
    live: usize,
    /// Buckets beyond [`MAX_BUCKETS`] or unreadable, their samples not read.
    unreadable: HashSet<u64>,
    /// Samples sent untracked (more than [`MAX_LIVE`] live).
    untracked: u64,
    /// Readings that failed since the last that did not.
    failed: u32,
}

impl GoProfile {
    /// Starts reading `pid`'s profile: `layout` and `rate_at` already placed in it (its
    /// load bias added).
    pub fn open(pid: u32, layout: Layout, rate_at: u64) -> io::Result<GoProfile> {
        let memory = crate::sys::memory::open(pid)?;
        let name = crate::sys::process::comm_of(pid).unwrap_or_default();
        let mut comm = [0u8; 16];
        let bytes = name.as_bytes();
        let n = bytes.len().min(15);
        comm[..n].copy_from_slice(&bytes[..n]);
        Ok(GoProfile {
            pid,
            layout,
            rate_at,
            rate: 0,
            memory,
            comm,
            buckets: HashMap::new(),
            started: false,
            next_address: 1 << 62,
            live: 0,
            unreadable: HashSet::new(),
            untracked: 0,
            failed: 0,
        })
    }

    /// A profile begun by the program's exec, which the recording saw: it has no
    /// baseline, everything in its first reading was allocated while recorded.
    pub fn begun_at_exec(mut self) -> GoProfile {
        self.started = true;
        self
    }

    /// The buckets left unread and the samples sent untracked.
    pub fn losses(&self) -> (u64, u64) {
        (self.unreadable.len() as u64, self.untracked)
    }

    /// Reads the profile now: the samples and frees since the last reading (none at the
    /// first: what came before the recording is its baseline). An error: the process is
    /// gone (or its memory unreadable).
    pub fn read(&mut self, now_ns: u64) -> io::Result<Vec<Event>> {
        self.failed += 1;
        let events = self.read_once(now_ns)?;
        self.failed = 0;
        Ok(events)
    }

    /// Readings that failed in a row, up to now.
    pub fn failed(&self) -> u32 {
        self.failed
    }

    fn read_once(&mut self, now_ns: u64) -> io::Result<Vec<Event>> {
        let mut word = [0u8; 8];
        self.memory.read_exact_at(&mut word, self.rate_at)?;
        let rate = i64::from_le_bytes(word);
        if rate > 0 {
            self.rate = rate as u64;
        }
        self.memory.read_exact_at(&mut word, self.layout.head)?;
        self.discover(u64::from_le_bytes(word))?;
        // The records by address (bucket's), read twice in a row.
        let mut records: Vec<(u64, u64)> =
            self.buckets.iter().map(|(&a, b)| (b.record, a)).collect();
        records.sort_unstable();
        let first = self.counts(&records)?;
        let second = self.counts(&records)?;
        let mut events = Vec::new();
        for ((address, a), (_, b)) in first.into_iter().zip(second) {
            let counts = a.least(b);
            self.take(address, counts, now_ns, &mut events);
        }
        self.started = true;
        Ok(events)
    }

    /// Adds the buckets the runtime made since the last reading: the list from `head`
    /// until one already known (or one that could not be read: the list is not followed
    /// past it).
    fn discover(&mut self, head: u64) -> io::Result<()> {
        let mut at = head;
        let mut new = Vec::new();
        while at != 0 && !self.buckets.contains_key(&at) && !self.unreadable.contains(&at) {
            if self.buckets.len() + new.len() >= MAX_BUCKETS {
                self.unreadable(at);
                break;
            }
            let mut bytes = vec![0u8; self.layout.header as usize];
            self.memory.read_exact_at(&mut bytes, at)?;
            let Some(header) = self.layout.header_of(&bytes) else {
                // Not a bucket (not one at all: the runtime links a bucket in once it is
                // whole); its samples are not read.
                self.unreadable(at);
                break;
            };
            new.push((at, header));
            at = header.allnext;
        }
        for (at, header) in new {
            match self.bucket(at, &header) {
                Ok(bucket) => {
                    self.buckets.insert(at, bucket);
                }
                Err(_) => self.unreadable(at),
            }
        }
        Ok(())
    }

    /// Notes the bucket at `at` as not read (each once; at most [`MAX_BUCKETS`] noted,
    /// the count then a floor).
    fn unreadable(&mut self, at: u64) {
        if self.unreadable.len() < MAX_BUCKETS {
            self.unreadable.insert(at);
        }
    }

    /// A new bucket at `at`: its stack read, its counts zero (or, at the baseline, what
    /// is live then).
    fn bucket(&mut self, at: u64, header: &Header) -> io::Result<Bucket> {
        let mut stack = vec![0u8; 8 * header.nstk as usize];
        self.memory
            .read_exact_at(&mut stack, at + u64::from(self.layout.header))?;
        let stack = stack
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect();
        let record = at + self.layout.record_at(header);
        let mut counts = Counts::default();
        if !self.started {
            let mut bytes = vec![0u8; self.layout.record as usize];
            self.memory.read_exact_at(&mut bytes, record)?;
            counts = self.layout.counts_of(&bytes).unwrap_or_default();
        }
        Ok(Bucket {
            size: header.size,
            stack,
            record,
            counts,
            before: counts.allocs.saturating_sub(counts.frees),
            live: VecDeque::new(),
        })
    }

    /// The counts now of the buckets whose `records` are given (record, bucket; sorted), by
    /// bucket, in their order.
    fn counts(&self, records: &[(u64, u64)]) -> io::Result<Vec<(u64, Counts)>> {
        let len = u64::from(self.layout.record);
        let mut out = Vec::with_capacity(records.len());
        let mut buffer = Vec::new();
        for run in runs(records, len) {
            let start = run[0].0;
            let end = run[run.len() - 1].0 + len;
            buffer.resize((end - start) as usize, 0);
            self.memory.read_exact_at(&mut buffer, start)?;
            for &(record, bucket) in run {
                let at = (record - start) as usize;
                let counts = self
                    .layout
                    .counts_of(&buffer[at..at + len as usize])
                    .unwrap_or_default();
                out.push((bucket, counts));
            }
        }
        Ok(out)
    }

    /// Takes in bucket `address`'s `counts`: a sample per new allocation, a free per new
    /// free (of the bucket's oldest block live).
    fn take(&mut self, address: u64, counts: Counts, now_ns: u64, events: &mut Vec<Event>) {
        let Some(bucket) = self.buckets.get_mut(&address) else {
            return;
        };
        let allocs = counts.allocs.saturating_sub(bucket.counts.allocs);
        let frees = counts.frees.saturating_sub(bucket.counts.frees);
        bucket.counts.allocs = bucket.counts.allocs.max(counts.allocs);
        bucket.counts.frees = bucket.counts.frees.max(counts.frees);
        // Sampled while the rate was never seen non-zero: nothing to weigh them by.
        let allocs = if self.rate == 0 { 0 } else { allocs };
        // Frees first end the blocks live before this reading; those left end blocks of
        // this reading's, each right after its allocation: blocks that lived and died
        // between two readings are never counted live together (the peak is not made up
        // of them), and live at the reading is what the counts say.
        let mut frees = frees;
        while frees > 0 && bucket.before + bucket.live.len() as u64 > 0 {
            frees -= 1;
            if bucket.before > 0 {
                bucket.before -= 1;
            } else if let Some(block) = bucket.live.pop_front() {
                self.live -= 1;
                events.push(free(self.pid, now_ns, block));
            }
        }
        for _ in 0..allocs {
            let address = self.next_address;
            self.next_address += 16;
            let dies = frees > 0;
            let tracked = dies || self.live < MAX_LIVE;
            events.push(Event::Alloc(Sample {
                pid: self.pid,
                tid: self.pid,
                thread_comm: self.comm,
                timestamp_ns: now_ns,
                function: AllocFn::Malloc,
                size: bucket.size,
                offset: 0,
                interval: self.rate,
                return_address: 0,
                stack: bucket.stack.clone(),
                stack_at_return: true,
                copied: None,
                address,
                tracked,
                weight: Some(crate::stats::runtime::runtime_weight(
                    bucket.size,
                    self.rate,
                )),
                python_sent: false,
                python: None,
                runtime_traceback: true,
            }));
            if dies {
                frees -= 1;
                events.push(free(self.pid, now_ns, address));
            } else if tracked {
                bucket.live.push_back(address);
                self.live += 1;
            } else {
                self.untracked += 1;
            }
        }
    }
}

/// A reading's free of `address`.
fn free(pid: u32, timestamp_ns: u64, address: u64) -> Event {
    Event::Free(Freed {
        pid,
        timestamp_ns,
        address,
        read: true,
    })
}

/// `records` (address, bucket; sorted) in runs read at once: each within [`GAP`] bytes
/// of the last, at most [`MAX_READ`] bytes in all.
fn runs(records: &[(u64, u64)], len: u64) -> Vec<&[(u64, u64)]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=records.len() {
        let ends = i == records.len()
            || records[i].0 > records[i - 1].0 + len + GAP
            || records[i].0 + len - records[start].0 > MAX_READ;
        if ends {
            out.push(&records[start..i]);
            start = i;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_near_each_other_are_read_at_once() {
        let records = [(0x1000, 1), (0x1100, 2), (0x4000, 3), (0x40_0000, 4)];
        let runs = runs(&records, 64);
        let starts: Vec<Vec<u64>> = runs
            .iter()
            .map(|run| run.iter().map(|r| r.1).collect())
            .collect();
        assert_eq!(starts, vec![vec![1, 2], vec![3], vec![4]]);
        let near: Vec<(u64, u64)> = (0..3000).map(|i| (i * 1000, i)).collect();
        let runs_of_near = super::runs(&near, 64);
        assert_eq!(runs_of_near.len(), 3, "1 MiB at most per read");
        assert_eq!(runs_of_near.iter().map(|r| r.len()).sum::<usize>(), 3000);
        assert!(super::runs(&[], 64).is_empty());
    }

    /// A profile of one bucket (blocks of 2 KiB, 3 live before the recording), read at
    /// rate 512 KiB, its memory never read.
    fn profile() -> GoProfile {
        let layout = crate::probe::go::buckets::Layout {
            head: 0,
            header: 48,
            allnext: 8,
            typ: 16,
            size: 32,
            nstk: 40,
            record: 64,
            cycle: 16,
            allocs: 0,
            frees: 8,
        };
        let mut profile = GoProfile {
            pid: 7,
            layout,
            rate_at: 0,
            rate: 512 << 10,
            memory: File::open("/dev/null").unwrap(),
            comm: [0; 16],
            buckets: HashMap::new(),
            started: true,
            next_address: 1 << 62,
            live: 0,
            unreadable: HashSet::new(),
            untracked: 0,
            failed: 0,
        };
        let counts = Counts {
            allocs: 10,
            frees: 7,
        };
        profile.buckets.insert(
            0x1000,
            Bucket {
                size: 2048,
                stack: vec![0x40_1000, 0x40_2000],
                record: 0x1058,
                counts,
                before: 3,
                live: VecDeque::new(),
            },
        );
        profile
    }

    fn kinds(events: &[Event]) -> String {
        events
            .iter()
            .map(|e| match e {
                Event::Alloc(_) => 'A',
                Event::Free(_) => 'F',
                _ => '?',
            })
            .collect()
    }

    #[test]
    fn frees_end_the_blocks_live_before_then_those_of_the_same_reading() {
        let mut profile = profile();
        let mut events = Vec::new();
        // 4 allocated, 5 freed since: 3 of the blocks live before, then 2 of the new ones,
        // each right after its allocation; the last new one stays live.
        profile.take(
            0x1000,
            Counts {
                allocs: 14,
                frees: 12,
            },
            100,
            &mut events,
        );
        assert_eq!(kinds(&events), "AFAFAA");
        let Event::Alloc(sample) = &events[0] else {
            unreachable!()
        };
        assert!(sample.runtime_traceback && sample.tracked);
        assert_eq!(sample.size, 2048);
        assert_eq!(sample.stack, vec![0x40_1000, 0x40_2000]);
        let expected = crate::stats::runtime::runtime_weight(2048, 512 << 10);
        assert_eq!(sample.weight, Some(expected));
        assert!(events
            .iter()
            .all(|e| !matches!(e, Event::Free(f) if !f.read)));
        assert_eq!(profile.live, 2);
        // A reading caught publishing a cycle twice (fewer than before) takes nothing; then
        // one more free ends the oldest live block.
        let mut events = Vec::new();
        profile.take(
            0x1000,
            Counts {
                allocs: 13,
                frees: 11,
            },
            200,
            &mut events,
        );
        assert!(events.is_empty());
        profile.take(
            0x1000,
            Counts {
                allocs: 14,
                frees: 13,
            },
            300,
            &mut events,
        );
        let Event::Free(freed) = &events[0] else {
            unreachable!()
        };
        assert_eq!((events.len(), freed.timestamp_ns), (1, 300));
        assert_eq!(freed.address, 1 << 62 | 0x20, "the oldest live block");
    }
}
