//! Reading an ELF file's code and symbols by address, for every part that decides where
//! a probe goes (`allocator`, `go` and its `memstats` and `buckets`) or reads a frame's file
//! (`stacks`).

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

/// The file offset of virtual `address`, through the section holding it.
pub(crate) fn file_offset_of(file: &object::File, address: u64) -> Option<u64> {
    let section = file
        .sections()
        .find(|s| (s.address()..s.address() + s.size()).contains(&address))?;
    let (offset, _) = section.file_range()?;
    Some(address - section.address() + offset)
}

/// The bytes of `[address, address + size)` from the section holding them.
pub(crate) fn code_at<'data>(
    file: &object::File<'data>,
    address: u64,
    size: u64,
) -> Option<&'data [u8]> {
    file.sections()
        .find(|s| (s.address()..s.address() + s.size()).contains(&address))?
        .data_range(address, size.max(1))
        .ok()?
}

/// The address and size of the first defined symbol of `file` named one of `names` (the
/// runtime renames some between releases).
pub(crate) fn symbol_in(file: &object::File, names: &[&str]) -> Option<(u64, u64)> {
    file.symbols()
        .find(|s| s.name().is_ok_and(|n| names.contains(&n)) && s.address() != 0)
        .map(|s| (s.address(), s.size()))
}
