//! A Go runtime's own exact totals: what `runtime.ReadMemStats` reports as `TotalAlloc` and
//! `Mallocs`, read from the program's memory without stopping it.
//!
//! Since go1.17 the runtime keeps its allocation counts in `runtime.memstats.heapStats`, a
//! ring of three `runtime.heapStatsDelta` that its Ps add to; `ReadMemStats` stops the world
//! and sums the three (`consistentHeapStats.unsafeRead`): `TotalAlloc` is `largeAlloc` plus
//! each size class's `smallAllocCount` times the class's size (`runtime.class_to_size`,
//! `internal/runtime/gc.SizeClassToSize` since go1.26), `Mallocs` the counts plus
//! `tinyAllocCount`. The same sum over the same bytes, read from outside, is that total as
//! the runtime last published it: a P publishes a span's allocations when it gives the span
//! back (or `ReadMemStats` flushes every P's), so the reading is behind by at most what the
//! Ps' cached spans served since (a span is 8 KiB for most classes).
//!
//! The fields' places change between releases (go1.27 dropped one ahead of the counts); they
//! are read from the executable's DWARF, so a release is read as it is laid out rather than
//! by a table. A file without DWARF (`-ldflags=-w`) or without these types is said to have
//! no exact totals. Pure: the file's bytes in, a [`Layout`] out; a reading's bytes in,
//! [`Totals`] out.

/// Where a Go runtime's allocation counts are and how to sum them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The virtual address of `runtime.memstats.heapStats.stats` (three deltas in a row;
    /// the file's, plus a position-independent executable's load bias in a process).
    pub address: u64,
    /// One `heapStatsDelta`'s size in bytes.
    pub delta_size: u32,
    /// Offsets in a delta of `tinyAllocCount`, `largeAlloc`, `largeAllocCount` and
    /// `smallAllocCount` (an array of one `u64` per size class).
    pub tiny_count: u32,
    /// See [`Layout::tiny_count`].
    pub large_bytes: u32,
    /// See [`Layout::tiny_count`].
    pub large_count: u32,
    /// See [`Layout::tiny_count`].
    pub small_counts: u32,
    /// Each size class's object size (class 0 is unused: 0).
    pub class_sizes: Vec<u32>,
}

/// Where a Go process's exact counts come from, as its profile says.
pub const SOURCE: &str = "runtime.memstats";

/// How many deltas the ring holds.
const RING: u32 = 3;

/// The structures [`layout`] asks the DWARF about.
pub(crate) const STRUCTURES: [&str; 3] = [
    "runtime.mstats",
    "runtime.consistentHeapStats",
    "runtime.heapStatsDelta",
];

/// The sums `ReadMemStats` would report, as published when read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// `TotalAlloc`: bytes allocated for heap objects since the program started.
    pub bytes: u64,
    /// `Mallocs`: heap objects allocated (tiny ones counted each).
    pub objects: u64,
}

impl Layout {
    /// How many bytes one reading takes: the whole ring.
    pub fn reading_len(&self) -> usize {
        (self.delta_size * RING) as usize
    }

    /// The totals in `ring`, the bytes of the three deltas as read (`None`: short).
    pub fn totals(&self, ring: &[u8]) -> Option<Totals> {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(ring.get(at..at + 8)?.try_into().ok()?))
        };
        let mut totals = Totals::default();
        for delta in 0..RING as usize {
            let base = delta * self.delta_size as usize;
            let field = |offset: u32| word(base + offset as usize);
            totals.bytes = totals.bytes.wrapping_add(field(self.large_bytes)?);
            let large = field(self.large_count)?;
            let tiny = field(self.tiny_count)?;
            totals.objects = totals.objects.wrapping_add(large).wrapping_add(tiny);
            for (class, &size) in self.class_sizes.iter().enumerate() {
                let count = field(self.small_counts + 8 * class as u32)?;
                totals.objects = totals.objects.wrapping_add(count);
                totals.bytes = totals
                    .bytes
                    .wrapping_add(count.wrapping_mul(u64::from(size)));
            }
        }
        Some(totals)
    }
}

impl Totals {
    /// What was allocated between `earlier` and this reading.
    pub fn since(self, earlier: Totals) -> Totals {
        Totals {
            bytes: self.bytes.saturating_sub(earlier.bytes),
            objects: self.objects.saturating_sub(earlier.objects),
        }
    }

    /// Both counts added up (one program's and another's).
    pub fn plus(self, other: Totals) -> Totals {
        Totals {
            bytes: self.bytes.saturating_add(other.bytes),
            objects: self.objects.saturating_add(other.objects),
        }
    }
}

/// Where `file`'s runtime keeps its counts, or why they cannot be read.
pub(crate) fn layout(file: &object::File, types: &super::dwarf::Types) -> Result<Layout, String> {
    let symbol = |names: &[&str]| crate::probe::elf::symbol_in(file, names);
    let (memstats, memstats_size) =
        symbol(&["runtime.memstats"]).ok_or("no runtime.memstats symbol")?;
    let (classes, classes_size) = symbol(&[
        "runtime.class_to_size",
        "internal/runtime/gc.SizeClassToSize",
    ])
    .ok_or("no size class table")?;
    let class_sizes: Vec<u32> = crate::probe::elf::code_at(file, classes, classes_size)
        .ok_or("its size class table is not in the file")?
        .chunks_exact(2)
        .map(|pair| u32::from(u16::from_le_bytes([pair[0], pair[1]])))
        .collect();
    let member = |structure: &str, name: &str| {
        types
            .member(structure, name)
            .ok_or_else(|| format!("no {structure}.{name} in its DWARF"))
    };
    let heap_stats = member("runtime.mstats", "heapStats")?;
    let stats = member("runtime.consistentHeapStats", "stats")?;
    let delta = "runtime.heapStatsDelta";
    let layout = Layout {
        address: memstats + heap_stats + stats,
        delta_size: types
            .size(delta)
            .ok_or_else(|| format!("no {delta} in its DWARF"))? as u32,
        tiny_count: member(delta, "tinyAllocCount")? as u32,
        large_bytes: member(delta, "largeAlloc")? as u32,
        large_count: member(delta, "largeAllocCount")? as u32,
        small_counts: member(delta, "smallAllocCount")? as u32,
        class_sizes,
    };
    let end = layout.small_counts as usize + 8 * layout.class_sizes.len();
    if end > layout.delta_size as usize || memstats_size < u64::from(layout.delta_size * RING) {
        return Err(format!(
            "{delta} does not hold its {} size classes' counts",
            layout.class_sizes.len()
        ));
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// go1.27's layout: `tinyAllocCount` at 40, `largeAlloc` 48, `largeAllocCount` 56,
    /// `smallAllocCount` 64, a delta 1,168 bytes.
    fn layout() -> Layout {
        Layout {
            address: 0x5b41c0,
            delta_size: 1168,
            tiny_count: 40,
            large_bytes: 48,
            large_count: 56,
            small_counts: 64,
            class_sizes: vec![0, 8, 16, 24, 32],
        }
    }

    fn put(ring: &mut [u8], at: usize, value: u64) {
        ring[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }

    #[test]
    fn sums_the_three_deltas_as_read_mem_stats_does() {
        let layout = layout();
        let mut ring = vec![0u8; layout.reading_len()];
        assert_eq!(ring.len(), 3504);
        // Delta 0: 10 objects of 8 bytes, 2 of 32, one large of 40,000, 5 tiny.
        put(&mut ring, 64 + 8, 10);
        put(&mut ring, 64 + 4 * 8, 2);
        put(&mut ring, 48, 40_000);
        put(&mut ring, 56, 1);
        put(&mut ring, 40, 5);
        // Delta 2 (the writers' current one): 3 of 16 bytes.
        put(&mut ring, 2 * 1168 + 64 + 2 * 8, 3);
        let totals = layout.totals(&ring).unwrap();
        assert_eq!(totals.bytes, 10 * 8 + 2 * 32 + 40_000 + 3 * 16);
        assert_eq!(totals.objects, 10 + 2 + 1 + 5 + 3);
        assert_eq!(layout.totals(&ring[..2 * 1168 + 64]), None, "a short read");
        let earlier = Totals {
            bytes: 100,
            objects: 3,
        };
        assert_eq!(
            totals.since(earlier),
            Totals {
                bytes: totals.bytes - 100,
                objects: totals.objects - 3
            }
        );
        assert_eq!(earlier.since(totals), Totals::default(), "never negative");
    }

    #[test]
    fn other_files_have_no_layout() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let file = object::File::parse(&*exe).unwrap();
        let refused = super::layout(&file, &Default::default()).unwrap_err();
        assert_eq!(refused, "no runtime.memstats symbol");
    }
}
