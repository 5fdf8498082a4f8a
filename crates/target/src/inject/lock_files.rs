//! The files whose code may hold the allocator's or the loader's lock, by name: the
//! loader, the C library and the allocators' libraries. Whether a thread may be taken
//! (`safe`) and what its stack says it holds (`held`) both ask.

/// The loader's files.
pub(super) const LOADER_FILES: &[&str] = &["ld-linux", "ld64.so"];
/// Allocator libraries' files, allocscope's own library among them.
pub(super) const ALLOCATOR_FILES: &[&str] = &[
    "libjemalloc",
    "libtcmalloc",
    "libmimalloc",
    "libsampler_preload",
];
/// The C library's files (its lock-holding functions are told apart by `super::held`).
pub(super) const C_LIBRARY_FILES: &[&str] = &["libc.so", "libc-"];

/// Whether the file at `path` is named with one of `prefixes`.
pub(super) fn named(path: &std::path::Path, prefixes: &[&str]) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    prefixes.iter().any(|prefix| name.starts_with(prefix))
}

/// The files whose code may hold the allocator's or the loader's lock.
pub(super) fn holds_locks(path: &std::path::Path) -> bool {
    [
        C_LIBRARY_FILES,
        &["libpthread"],
        LOADER_FILES,
        ALLOCATOR_FILES,
    ]
    .iter()
    .any(|files| named(path, files))
}
