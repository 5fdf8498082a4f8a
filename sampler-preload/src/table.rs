//! The sampled blocks still live, so that `free` fires a probe for those only.
//!
//! Every `free` asks whether its pointer was sampled. A filter of saturating 8-bit counters
//! (16 KiB, indexed by a hash of the pointer) answers "no" for almost all of them with one
//! load; only a pointer whose counter is non-zero looks in the table: open addressing
//! over a fixed array, at most [`PROBES`] slots from its hash, lock-free (compare-and-swap
//! on each slot). Both live in static memory: the table never allocates, and it is
//! bounded; a sampled block that finds no room is reported untracked (its free will not
//! be seen, and allocscope says the live numbers are incomplete).

use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Table slots (a power of two): 512 KiB of address space, touched only where used.
const SLOTS: usize = 1 << 16;
/// Filter counters (a power of two).
const FILTER: usize = 1 << 14;
/// Slots looked at from a pointer's hash before giving up.
pub const PROBES: usize = 64;
/// A slot whose pointer was removed (a search goes on past it; an insert may reuse it).
const TOMBSTONE: u64 = 1;
/// An empty slot (a search stops there).
const EMPTY: u64 = 0;

/// A set of addresses.
pub struct Table {
    slots: [AtomicU64; SLOTS],
    filter: [AtomicU8; FILTER],
}

#[inline(always)]
fn hash(pointer: u64) -> u64 {
    (pointer >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Table {
    /// An empty table.
    pub const fn new() -> Table {
        Table {
            slots: [const { AtomicU64::new(EMPTY) }; SLOTS],
            filter: [const { AtomicU8::new(0) }; FILTER],
        }
    }

    #[inline(always)]
    fn counter(&self, pointer: u64) -> &AtomicU8 {
        &self.filter[(hash(pointer) >> 50) as usize & (FILTER - 1)]
    }

    /// Remembers `pointer` (not 0 or 1); false when its neighbourhood is full.
    pub fn insert(&self, pointer: u64) -> bool {
        if pointer <= TOMBSTONE {
            return false;
        }
        let counter = self.counter(pointer);
        // Saturating increment: a counter at 255 stays there (it only ever costs lookups).
        let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
            (c < u8::MAX).then_some(c + 1)
        });
        let start = (hash(pointer) >> 48) as usize;
        for i in 0..PROBES {
            let slot = &self.slots[(start + i) & (SLOTS - 1)];
            let seen = slot.load(Ordering::Acquire);
            if (seen == EMPTY || seen == TOMBSTONE)
                && slot
                    .compare_exchange(seen, pointer, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return true;
            }
        }
        self.release(counter);
        false
    }

    /// Forgets `pointer`; whether it was there. One load for almost every pointer.
    #[inline(always)]
    pub fn remove(&self, pointer: u64) -> bool {
        let counter = self.counter(pointer);
        if counter.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.remove_slow(pointer, counter)
    }

    #[cold]
    fn remove_slow(&self, pointer: u64, counter: &AtomicU8) -> bool {
        let start = (hash(pointer) >> 48) as usize;
        for i in 0..PROBES {
            let slot = &self.slots[(start + i) & (SLOTS - 1)];
            let seen = slot.load(Ordering::Acquire);
            if seen == EMPTY {
                return false;
            }
            if seen == pointer
                && slot
                    .compare_exchange(pointer, TOMBSTONE, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                self.release(counter);
                return true;
            }
        }
        false
    }

    /// Saturating decrement (a saturated counter is never decremented: it may count more).
    fn release(&self, counter: &AtomicU8) {
        let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
            (c != 0 && c != u8::MAX).then(|| c - 1)
        });
    }

    /// Empties the table (a test's fresh start).
    #[cfg(test)]
    fn clear(&self) {
        self.slots
            .iter()
            .for_each(|s| s.store(EMPTY, Ordering::Relaxed));
        self.filter
            .iter()
            .for_each(|c| c.store(0, Ordering::Relaxed));
    }
}

impl Default for Table {
    fn default() -> Self {
        Table::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserted_pointers_are_removed_once_and_others_never() {
        let table = Box::new(Table::new());
        table.clear();
        let pointers: Vec<u64> = (1..5000u64).map(|i| 0x5555_0000_0000 + i * 48).collect();
        for &p in &pointers {
            assert!(table.insert(p));
        }
        for &p in &pointers {
            assert!(!table.remove(p + 16), "never inserted");
        }
        for &p in &pointers {
            assert!(table.remove(p), "inserted");
            assert!(!table.remove(p), "removed already");
        }
        assert!(table.filter.iter().all(|c| c.load(Ordering::Relaxed) == 0));
    }

    #[test]
    fn a_full_neighbourhood_refuses_and_leaves_no_trace() {
        let table = Box::new(Table::new());
        // Pointers that share one hash start: the same value, shifted past the hash bits,
        // cannot be built cheaply; fill every slot instead.
        for slot in &table.slots {
            slot.store(0x1000, Ordering::Relaxed);
        }
        assert!(!table.insert(0x7777_0000));
        assert!(!table.remove(0x7777_0000));
        assert!(table.filter.iter().all(|c| c.load(Ordering::Relaxed) == 0));
    }

    #[test]
    fn concurrent_inserts_and_removes_agree() {
        let table = std::sync::Arc::new(Table::new());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let table = table.clone();
                std::thread::spawn(move || {
                    for round in 0..200u64 {
                        let base = 0x7000_0000_0000 + (t << 32) + round * 4096;
                        for i in 0..50 {
                            assert!(table.insert(base + i * 64));
                        }
                        for i in 0..50 {
                            assert!(table.remove(base + i * 64));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(table.filter.iter().all(|c| c.load(Ordering::Relaxed) == 0));
    }
}
