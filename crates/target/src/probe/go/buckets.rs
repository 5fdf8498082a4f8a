//! A Go runtime's heap profile as the runtime itself keeps it: read from outside, with no
//! probe in the program at all.
//!
//! Every block the runtime's sampler draws (`mProf_Malloc`) is counted in a `bucket` per
//! (stack, size), and its free (`mProf_Free`) in the same bucket. The buckets form a list
//! (`runtime.mbuckets`, newest first through `allnext`) that the runtime only ever
//! prepends to; each is a header, its stack (`nstk` return PCs) and a `memRecord`: the
//! published counts (`active`) and three cycles not yet published (`future`), each
//! `allocs` and `frees` (go1.19 also bytes). Summing the four gives every sampled
//! allocation and free so far, without waiting for the garbage collector to publish them.
//! Reading that list every few hundred milliseconds costs the program nothing (no trap,
//! no pause), where a probe on `mProf_Malloc` and `freeSpecial` traps twice per sample
//! (#43; docs/performance.md, "Figures quoted from the code").
//!
//! The sizes and places are read from the executable's DWARF ([`super::dwarf`]); a file
//! without them is probed instead. Pure: the file in, a [`Layout`]; a reading's bytes in,
//! [`Header`] and [`Counts`] out.

use super::dwarf::Types;

/// The DWARF structures [`layout`] asks about.
pub(crate) const STRUCTURES: [&str; 3] = [
    "runtime.bucket",
    "runtime.memRecord",
    "runtime.memRecordCycle",
];

/// `runtime.memProfile`, a memory profile bucket's `typ` (`1 + iota`, go1.18 to go1.27).
const MEM_PROFILE: u64 = 1;

/// The deepest stack a bucket may hold (`maxProfStackDepth`, go1.23 and later; 32 before):
/// a header saying more is not a bucket.
pub(crate) const MAX_STACK: u64 = 1024;

/// Where a Go runtime's memory profile buckets are and how they are laid out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The virtual address of `runtime.mbuckets` (the list's head; the file's, plus a
    /// position-independent executable's load bias in a process).
    pub head: u64,
    /// `runtime.bucket`'s size: its stack follows it.
    pub header: u32,
    /// Offsets in the header of `allnext`, `typ`, `size` and `nstk`.
    pub allnext: u32,
    /// See [`Layout::allnext`].
    pub typ: u32,
    /// See [`Layout::allnext`].
    pub size: u32,
    /// See [`Layout::allnext`].
    pub nstk: u32,
    /// `runtime.memRecord`'s size: it follows the stack.
    pub record: u32,
    /// `runtime.memRecordCycle`'s size: the record is `active` and then `future`, cycles
    /// in a row.
    pub cycle: u32,
    /// Offsets in a cycle of `allocs` and `frees`.
    pub allocs: u32,
    /// See [`Layout::allocs`].
    pub frees: u32,
}

/// A bucket's header, as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The next (older) bucket, 0 at the list's end.
    pub allnext: u64,
    /// The sampled blocks' size.
    pub size: u64,
    /// How many return PCs its stack holds.
    pub nstk: u64,
}

/// A bucket's sampled blocks so far: allocated and freed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Sampled allocations.
    pub allocs: u64,
    /// Their frees, as the sweeper found them.
    pub frees: u64,
}

impl Layout {
    /// The header of a bucket in `bytes` (its first [`Layout::header`] bytes); `None`: short,
    /// not a memory profile bucket, or a stack deeper than any runtime keeps.
    pub fn header_of(&self, bytes: &[u8]) -> Option<Header> {
        let word = |at: u32| word(bytes, at as usize);
        let header = Header {
            allnext: word(self.allnext)?,
            size: word(self.size)?,
            nstk: word(self.nstk)?,
        };
        (word(self.typ)? == MEM_PROFILE && header.nstk <= MAX_STACK && header.size > 0)
            .then_some(header)
    }

    /// Where a bucket's record is, from the bucket's start.
    pub fn record_at(&self, header: &Header) -> u64 {
        u64::from(self.header) + 8 * header.nstk
    }

    /// The counts in a record's `bytes` ([`Layout::record`] of them): its cycles summed.
    pub fn counts_of(&self, bytes: &[u8]) -> Option<Counts> {
        if bytes.len() < self.record as usize {
            return None;
        }
        let cycles = (self.record / self.cycle.max(1)) as usize;
        let mut counts = Counts::default();
        for cycle in 0..cycles {
            let base = cycle * self.cycle as usize;
            let allocs = word(bytes, base + self.allocs as usize)?;
            let frees = word(bytes, base + self.frees as usize)?;
            counts.allocs = counts.allocs.wrapping_add(allocs);
            counts.frees = counts.frees.wrapping_add(frees);
        }
        Some(counts)
    }
}

impl Counts {
    /// The lesser of two readings, field by field: the runtime publishes a cycle by adding
    /// it to `active` and then clearing it, and a reading between the two counts it twice.
    /// Of two readings in a row, at most one is caught there (the window is a few
    /// instructions); the lesser is never more than what happened.
    pub fn least(self, other: Counts) -> Counts {
        Counts {
            allocs: self.allocs.min(other.allocs),
            frees: self.frees.min(other.frees),
        }
    }
}

fn word(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// Where `file`'s runtime keeps its memory profile, or why it cannot be read.
pub(crate) fn layout(file: &object::File, types: &Types) -> Result<Layout, String> {
    let (head, _) = crate::probe::elf::symbol_in(file, &["runtime.mbuckets"])
        .ok_or("no runtime.mbuckets symbol")?;
    let member = |structure: &str, name: &str| {
        types
            .member(structure, name)
            .map(|offset| offset as u32)
            .ok_or_else(|| format!("no {structure}.{name} in its DWARF"))
    };
    let size = |structure: &str| {
        types
            .size(structure)
            .map(|size| size as u32)
            .ok_or_else(|| format!("no {structure} in its DWARF"))
    };
    let (bucket, record, cycle) = (STRUCTURES[0], STRUCTURES[1], STRUCTURES[2]);
    let layout = Layout {
        head,
        header: size(bucket)?,
        allnext: member(bucket, "allnext")?,
        typ: member(bucket, "typ")?,
        size: member(bucket, "size")?,
        nstk: member(bucket, "nstk")?,
        record: size(record)?,
        cycle: size(cycle)?,
        allocs: member(cycle, "allocs")?,
        frees: member(cycle, "frees")?,
    };
    // The record is `active` then `future`, whole cycles in a row: summed as such.
    let in_a_row = member(record, "active")? == 0
        && member(record, "future")? == layout.cycle
        && layout.cycle >= 16
        && layout.record.is_multiple_of(layout.cycle)
        && layout.allocs.max(layout.frees) + 8 <= layout.cycle;
    let fields = [layout.allnext, layout.typ, layout.size, layout.nstk];
    if !in_a_row || fields.iter().any(|&at| at + 8 > layout.header) {
        return Err(format!(
            "its {record} or {bucket} is laid out in an unknown way"
        ));
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// go1.27's layout (a cycle is `allocs, frees`); go1.19's cycle adds the bytes.
    fn layout(cycle: u32) -> Layout {
        Layout {
            head: 0x5b_4000,
            header: 48,
            allnext: 8,
            typ: 16,
            size: 32,
            nstk: 40,
            record: 4 * cycle,
            cycle,
            allocs: 0,
            frees: 8,
        }
    }

    fn put(bytes: &mut [u8], at: usize, value: u64) {
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }

    #[test]
    fn a_bucket_header_is_read_and_what_is_not_one_refused() {
        let layout = layout(16);
        let mut bytes = vec![0u8; 48];
        put(&mut bytes, 8, 0x7f00_0000_1000);
        put(&mut bytes, 16, 1);
        put(&mut bytes, 32, 2048);
        put(&mut bytes, 40, 5);
        let header = layout.header_of(&bytes).unwrap();
        assert_eq!(
            header,
            Header {
                allnext: 0x7f00_0000_1000,
                size: 2048,
                nstk: 5
            }
        );
        assert_eq!(layout.record_at(&header), 48 + 40);
        assert_eq!(layout.header_of(&bytes[..40]), None, "short");
        put(&mut bytes, 16, 2);
        assert_eq!(layout.header_of(&bytes), None, "a block profile's bucket");
        put(&mut bytes, 16, 1);
        put(&mut bytes, 40, MAX_STACK + 1);
        assert_eq!(
            layout.header_of(&bytes),
            None,
            "deeper than any runtime keeps"
        );
    }

    #[test]
    fn counts_sum_the_published_and_future_cycles() {
        for cycle in [16, 32] {
            let layout = layout(cycle);
            let mut record = vec![0u8; layout.record as usize];
            let c = cycle as usize;
            // active: 10 allocated, 7 freed; the future cycles: 2 + 1 allocated, 2 freed.
            put(&mut record, 0, 10);
            put(&mut record, 8, 7);
            put(&mut record, c, 2);
            put(&mut record, 2 * c + 8, 2);
            put(&mut record, 3 * c, 1);
            let counts = layout.counts_of(&record).unwrap();
            assert_eq!(
                counts,
                Counts {
                    allocs: 13,
                    frees: 9
                },
                "cycle of {cycle} bytes"
            );
            assert_eq!(layout.counts_of(&record[..record.len() - 1]), None);
        }
    }

    #[test]
    fn of_two_readings_the_lesser_is_kept() {
        let published_twice = Counts {
            allocs: 20,
            frees: 9,
        };
        let after = Counts {
            allocs: 13,
            frees: 10,
        };
        assert_eq!(
            published_twice.least(after),
            Counts {
                allocs: 13,
                frees: 9
            }
        );
    }

    #[test]
    fn other_files_have_no_layout() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let file = object::File::parse(&*exe).unwrap();
        assert_eq!(
            super::layout(&file, &Types::default()).unwrap_err(),
            "no runtime.mbuckets symbol"
        );
    }
}
