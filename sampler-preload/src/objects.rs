//! The loaded objects' program headers, as the loader reports them (`dl_iterate_phdr`):
//! where an object's segments lie. Routing (`route`) and the producers' check
//! (`producer`) both read them.

/// A loadable segment's program header type.
pub(crate) const PT_LOAD: u32 = 1;

/// The object's program headers (none where the loader gave none).
pub(crate) fn headers(info: &libc::dl_phdr_info) -> &[libc::Elf64_Phdr] {
    if info.dlpi_phdr.is_null() {
        return &[];
    }
    // SAFETY: the loader's program headers, `dlpi_phnum` of them.
    unsafe { core::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
}

/// Where the object's loaded segments lie: [lowest, highest) address.
pub(crate) fn object_span(info: &libc::dl_phdr_info) -> (usize, usize) {
    let base = info.dlpi_addr as usize;
    let (mut low, mut high) = (usize::MAX, 0usize);
    for h in headers(info).iter().filter(|h| h.p_type == PT_LOAD) {
        low = low.min(base.wrapping_add(h.p_vaddr as usize));
        high = high.max(base.wrapping_add((h.p_vaddr + h.p_memsz) as usize));
    }
    if low > high {
        (0, 0)
    } else {
        (low, high)
    }
}
