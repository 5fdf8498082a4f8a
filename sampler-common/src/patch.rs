//! The contract between allocscope and its in-process front end for allocators linked
//! into the executable (a Rust program's jemalloc or mimalloc, a C++ program's static
//! tcmalloc): the plan allocscope writes into a command's family table, and what the
//! library does with each entry.
//!
//! Why a plan and not the library's own analysis: finding the entry points needs the
//! executable's full symbol table (not mapped at run time) and moving a prologue needs an
//! x86 decoder; both run in allocscope (`iced-x86`, with std), once per recording, and the
//! library, which every process of the tree loads, stays small. The library trusts no byte
//! of the plan blindly: an entry is patched only if the executable's program headers hash
//! to the plan's [`PatchPlan::digest`] and the bytes at the entry are the plan's
//! [`PatchEntry::original`]; each relocated `rel32` is re-aimed by [`relocate`] and must
//! reach its target.
//!
//! Each entry's first [`PatchEntry::original_len`] bytes (whole instructions, at least 5)
//! become a `jmp rel32` to a stub near the executable, which jumps to the library's
//! counting wrapper; the wrapper calls the relocated prologue, which jumps back to the
//! entry's next instruction. The executable's code is never written: each page holding an
//! entry is replaced by a patched copy (checked against [`PatchPage::digest`], the file's
//! page), which no uprobe attached to the file later can reach.

/// First word of a plan ("alspatc1").
pub const PATCH_MAGIC: u64 = u64::from_le_bytes(*b"alspatc1");

/// Layout version of [`PatchPlan`].
pub const PATCH_VERSION: u64 = 1;

/// Entries a plan holds (the library has one wrapper per entry).
pub const MAX_PATCHES: usize = 32;

/// Most bytes an entry's patch replaces.
pub const ORIGINAL_BYTES: usize = 16;

/// Most bytes of an entry's relocated prologue.
pub const RELOCATED_BYTES: usize = 48;

/// Most `rel32` fields an entry's relocated prologue holds.
pub const MAX_FIXUPS: usize = 4;

/// Bytes of the jump a patch writes at the entry (`jmp rel32`).
pub const JUMP_BYTES: usize = 5;

/// [`PatchEntry::role`] of a free (the pointer in the first argument); the others are a
/// [`crate::AllocFn`]'s value, whose argument layout the entry has.
pub const ROLE_FREE: u32 = 0xff;

/// A `rel32` field in a relocated prologue: 4 bytes at `at`, relative to `end` (the end
/// of its instruction), aimed at `target` (a virtual address of the executable's file).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fixup {
    /// Offset of the field in [`PatchEntry::relocated`].
    pub at: u32,
    /// Offset of the end of its instruction.
    pub end: u32,
    /// Where it points, in the file's virtual addresses.
    pub target: u64,
}

/// One entry point to patch.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatchEntry {
    /// The entry's virtual address in the file (its symbol's value).
    pub address: u64,
    /// [`ROLE_FREE`] or a [`crate::AllocFn`].
    pub role: u32,
    /// Bytes the patch replaces: whole instructions, [`JUMP_BYTES`] or more.
    pub original_len: u32,
    /// Those bytes as the file has them.
    pub original: [u8; ORIGINAL_BYTES],
    /// Bytes of [`Self::relocated`] used.
    pub relocated_len: u32,
    /// [`Self::fixups`] used.
    pub fixup_count: u32,
    /// The relocated prologue's `rel32` fields.
    pub fixups: [Fixup; MAX_FIXUPS],
    /// The replaced instructions, re-encoded to run elsewhere (short branches made near).
    pub relocated: [u8; RELOCATED_BYTES],
}

impl Default for PatchEntry {
    fn default() -> PatchEntry {
        PatchEntry {
            address: 0,
            role: 0,
            original_len: 0,
            original: [0; ORIGINAL_BYTES],
            relocated_len: 0,
            fixup_count: 0,
            fixups: [Fixup::default(); MAX_FIXUPS],
            relocated: [0; RELOCATED_BYTES],
        }
    }
}

/// Bytes of a page of code.
pub const PAGE_BYTES: usize = 4096;

/// A page of the executable's code that holds entries: replaced whole by a patched copy.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PatchPage {
    /// Its virtual address in the file (page-aligned).
    pub address: u64,
    /// [`digest`] of its bytes as the file maps them: a copy that differs (a breakpoint of
    /// a uprobe attached already, another tool's patch) is not put in its place.
    pub digest: u64,
}

/// The plan for one executable, in its own pages of the family table (the library maps it
/// read-only).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PatchPlan {
    /// [`PATCH_MAGIC`].
    pub magic: u64,
    /// [`PATCH_VERSION`].
    pub version: u64,
    /// [`digest`] of the executable's program header table: which file the plan is for.
    pub digest: u64,
    /// Entries used.
    pub count: u64,
    /// The entries.
    pub entries: [PatchEntry; MAX_PATCHES],
    /// Pages used of [`Self::pages`].
    pub page_count: u64,
    /// The pages holding the entries (each entry's bytes lie in one).
    pub pages: [PatchPage; MAX_PATCHES],
}

/// FNV-1a of `bytes`: the identity of an executable's program header table, computed by
/// allocscope from the file and by the library from its own (`AT_PHDR`), with no system
/// call and no path.
pub const fn digest(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// Why [`relocate`] refused an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unrelocatable {
    /// Lengths or a field out of the entry's bounds.
    Malformed,
    /// A field's target is more than 2 GiB from where the prologue would run.
    OutOfReach,
}

/// `entry`'s relocated prologue as it must read at address `at`, in an executable loaded
/// at `bias`: each fixup's field aimed at its target from there.
pub fn relocate(
    entry: &PatchEntry,
    bias: u64,
    at: u64,
) -> Result<[u8; RELOCATED_BYTES], Unrelocatable> {
    let len = entry.relocated_len as usize;
    let fixups = entry.fixup_count as usize;
    if len > RELOCATED_BYTES || fixups > MAX_FIXUPS {
        return Err(Unrelocatable::Malformed);
    }
    let mut code = entry.relocated;
    let mut i = 0;
    while i < fixups {
        let fixup = entry.fixups[i];
        let (field, end) = (fixup.at as usize, fixup.end as usize);
        if field + 4 > end || end > len {
            return Err(Unrelocatable::Malformed);
        }
        let target = bias.wrapping_add(fixup.target) as i128;
        let from = at.wrapping_add(end as u64) as i128;
        let distance = target - from;
        if distance < i32::MIN as i128 || distance > i32::MAX as i128 {
            return Err(Unrelocatable::OutOfReach);
        }
        let bytes = (distance as i32).to_le_bytes();
        code[field] = bytes[0];
        code[field + 1] = bytes[1];
        code[field + 2] = bytes[2];
        code[field + 3] = bytes[3];
        i += 1;
    }
    Ok(code)
}

/// The `jmp rel32` from `from` to `to`, or `None` when `to` is out of its reach.
pub fn jump(from: u64, to: u64) -> Option<[u8; JUMP_BYTES]> {
    let distance = to as i128 - (from as i128 + JUMP_BYTES as i128);
    if distance < i32::MIN as i128 || distance > i32::MAX as i128 {
        return None;
    }
    let d = (distance as i32).to_le_bytes();
    Some([0xe9, d[0], d[1], d[2], d[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry_with(fixup: Fixup, len: u32) -> PatchEntry {
        PatchEntry {
            relocated_len: len,
            fixup_count: 1,
            fixups: [fixup, Fixup::default(), Fixup::default(), Fixup::default()],
            ..PatchEntry::default()
        }
    }

    #[test]
    fn a_field_is_aimed_from_the_end_of_its_instruction() {
        // mov rax, [rip + X] (48 8b 05 X): the field at 3, the instruction 7 bytes long.
        let entry = entry_with(
            Fixup {
                at: 3,
                end: 7,
                target: 0x7a180,
            },
            7,
        );
        let code = relocate(&entry, 0x5555_0000_0000, 0x5554_ff00_0000).unwrap();
        let field = i32::from_le_bytes(code[3..7].try_into().unwrap());
        assert_eq!(
            0x5554_ff00_0000i64 + 7 + i64::from(field),
            0x5555_0000_0000 + 0x7a180
        );
    }

    #[test]
    fn a_target_beyond_two_gib_or_a_field_outside_is_refused() {
        let far = entry_with(
            Fixup {
                at: 1,
                end: 5,
                target: 0,
            },
            5,
        );
        assert_eq!(
            relocate(&far, 0x7000_0000_0000, 0x1000),
            Err(Unrelocatable::OutOfReach)
        );
        let outside = entry_with(
            Fixup {
                at: 4,
                end: 7,
                target: 0,
            },
            7,
        );
        assert_eq!(relocate(&outside, 0, 0), Err(Unrelocatable::Malformed));
        let past = entry_with(
            Fixup {
                at: 3,
                end: 9,
                target: 0,
            },
            7,
        );
        assert_eq!(relocate(&past, 0, 0), Err(Unrelocatable::Malformed));
    }

    #[test]
    fn a_jump_reaches_its_target_or_is_refused() {
        let bytes = jump(0x1000, 0x2000).unwrap();
        assert_eq!(bytes[0], 0xe9);
        assert_eq!(
            i32::from_le_bytes(bytes[1..].try_into().unwrap()),
            0x1000 - 5
        );
        assert!(jump(0, 1 << 40).is_none());
    }

    #[test]
    fn the_digest_tells_tables_apart() {
        assert_ne!(digest(b"\x01\x00"), digest(b"\x00\x01"));
        assert_eq!(digest(b""), 0xcbf2_9ce4_8422_2325);
    }
}
