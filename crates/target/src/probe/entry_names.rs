//! Which symbol names are allocation entry points, and what each does: the C names and
//! their allocators' prefixed ones (`je_`, `_rjem_`, `tc_`, `mi_`), C++'s operators, the
//! allocators' own extensions (`mallocx`, `mi_malloc_aligned`…) and CPython's object
//! allocator. Pure: a name in, a role out.

use sampler_common::AllocFn;

/// What a probed entry point does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Allocates, with the arguments laid out like this function.
    Alloc(AllocFn),
    /// Frees the pointer in its first argument.
    Free,
}

/// The allocation role of a symbol name, if it is an entry point we probe. Pure.
pub fn classify(name: &str) -> Option<Role> {
    // Versioned names (malloc@@GLIBC_2.2.5) appear in some tables.
    let name = name.split('@').next().unwrap_or(name);
    if let Some(role) = python_role(name) {
        return Some(role);
    }
    if name.starts_with("_ZdlPv") || name.starts_with("_ZdaPv") {
        return Some(Role::Free);
    }
    if name.starts_with("_Znwm") || name.starts_with("_Znam") {
        return Some(Role::Alloc(AllocFn::New));
    }
    if let Some(role) = name.strip_prefix("mi_").and_then(mimalloc_aligned) {
        return Some(role);
    }
    if let Some(base) = name
        .strip_prefix("tc_")
        .or_else(|| name.strip_prefix("mi_"))
    {
        // tcmalloc's and mimalloc's own names for operator new and delete.
        if base.starts_with("new") {
            return Some(Role::Alloc(AllocFn::New));
        }
        if base.starts_with("delete") {
            return Some(Role::Free);
        }
    }
    ["", "je_", "_rjem_", "tc_", "mi_"]
        .iter()
        .find_map(|prefix| classify_base(name.strip_prefix(prefix)?))
}

/// Whether `name`, a function that is not an entry point allocscope probes, looks like an
/// allocator's (`arena_alloc`, `pool_malloc`, `xcalloc`): a word of its name, split at
/// underscores, is an allocation verb. C names only: a mangled C++ or Rust name holds
/// its namespaces' words (`alloc::` is every Rust collection), and is left out.
pub fn looks_like_an_allocator(name: &str) -> bool {
    const VERBS: [&str; 7] = [
        "alloc", "malloc", "calloc", "realloc", "zalloc", "allocate", "mallocx",
    ];
    // `xmalloc`, `xcalloc`: the allocate-or-die wrappers.
    let verb = |word: &str| {
        let word = word.to_ascii_lowercase();
        VERBS.contains(&word.as_str()) || word.strip_prefix('x').is_some_and(|w| VERBS.contains(&w))
    };
    let mangled = name.starts_with("_Z") || name.starts_with("_R") || name.contains("::");
    // The C library's own internals (a static executable's), probed at their entry points.
    let internal = name.starts_with("__libc_") || name.starts_with("_int_");
    !mangled && !internal && classify(name).is_none() && name.split('_').any(verb)
}

/// mimalloc's aligned entry points, which Rust's `mimalloc::MiMalloc` calls for every
/// allocation (`mi_malloc_aligned(size, align)`: the size first, as `operator new`'s).
pub(super) fn mimalloc_aligned(base: &str) -> Option<Role> {
    let alloc = |f| Some(Role::Alloc(f));
    match base.strip_suffix("_at").unwrap_or(base) {
        "malloc_aligned" | "zalloc_aligned" => alloc(AllocFn::New),
        "calloc_aligned" => alloc(AllocFn::Calloc),
        "realloc_aligned" | "rezalloc" | "rezalloc_aligned" => alloc(AllocFn::Realloc),
        _ => None,
    }
}

/// CPython's object allocator (pymalloc), exported by libpython or a static python binary:
/// small objects never reach malloc.
fn python_role(name: &str) -> Option<Role> {
    match name {
        "PyObject_Malloc" => Some(Role::Alloc(AllocFn::New)),
        "PyObject_Calloc" => Some(Role::Alloc(AllocFn::Calloc)),
        "PyObject_Realloc" => Some(Role::Alloc(AllocFn::Realloc)),
        "PyObject_Free" => Some(Role::Free),
        _ => None,
    }
}

/// Whether `name` is an entry of a small-object allocator layered over malloc.
pub(super) fn is_small_objects(name: &str) -> bool {
    python_role(name).is_some()
}

fn classify_base(base: &str) -> Option<Role> {
    let alloc = |f| Some(Role::Alloc(f));
    match base {
        "malloc" => alloc(AllocFn::Malloc),
        "calloc" => alloc(AllocFn::Calloc),
        "realloc" | "rallocx" => alloc(AllocFn::Realloc),
        "posix_memalign" => alloc(AllocFn::PosixMemalign),
        "aligned_alloc" => alloc(AllocFn::AlignedAlloc),
        "memalign" => alloc(AllocFn::Memalign),
        "valloc" => alloc(AllocFn::Valloc),
        "pvalloc" => alloc(AllocFn::Pvalloc),
        "mallocx" | "zalloc" => alloc(AllocFn::New),
        "free" | "cfree" | "sdallocx" | "dallocx" | "free_size" | "free_aligned"
        | "free_size_aligned" | "free_sized" => Some(Role::Free),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_like_names_are_told_from_others() {
        for name in [
            "arena_alloc",
            "pool_malloc",
            "xcalloc",
            "my_Alloc",
            "__rust_alloc",
        ] {
            assert!(looks_like_an_allocator(name), "{name}");
        }
        for name in [
            "malloc",
            "mi_malloc",
            "allocator_init",
            "_ZN5alloc7raw_vec11finish_grow17h0123456789abcdefE",
            "dealloc_all",
            "main",
        ] {
            assert!(!looks_like_an_allocator(name), "{name}");
        }
    }

    #[test]
    fn classifies_entry_points_of_every_family() {
        let alloc = |f| Some(Role::Alloc(f));
        assert_eq!(classify("malloc@@GLIBC_2.2.5"), alloc(AllocFn::Malloc));
        assert_eq!(classify("je_malloc"), alloc(AllocFn::Malloc));
        assert_eq!(classify("_rjem_mallocx"), alloc(AllocFn::New));
        assert_eq!(classify("_rjem_sdallocx"), Some(Role::Free));
        assert_eq!(classify("PyObject_Malloc"), alloc(AllocFn::New));
        assert_eq!(classify("PyObject_Calloc"), alloc(AllocFn::Calloc));
        assert_eq!(classify("PyObject_Realloc"), alloc(AllocFn::Realloc));
        assert_eq!(classify("PyObject_Free"), Some(Role::Free));
        assert_eq!(classify("PyMem_RawMalloc"), None);
        assert_eq!(classify("rallocx"), alloc(AllocFn::Realloc));
        assert_eq!(classify("dallocx"), Some(Role::Free));
        assert_eq!(classify("tc_newarray_nothrow"), alloc(AllocFn::New));
        assert_eq!(classify("tc_delete_sized"), Some(Role::Free));
        assert_eq!(classify("mi_zalloc"), alloc(AllocFn::New));
        assert_eq!(classify("mi_calloc"), alloc(AllocFn::Calloc));
        assert_eq!(classify("mi_free"), Some(Role::Free));
        assert_eq!(classify("_ZnamSt11align_val_t"), alloc(AllocFn::New));
        assert_eq!(classify("_ZdlPvm"), Some(Role::Free));
        assert_eq!(classify("malloc_usable_size"), None);
        assert_eq!(classify("tc_malloc_stats"), None);
        assert_eq!(classify("mi_malloc_size"), None);
        assert_eq!(classify("mi_malloc_aligned"), alloc(AllocFn::New));
        assert_eq!(classify("mi_zalloc_aligned_at"), alloc(AllocFn::New));
        assert_eq!(classify("mi_calloc_aligned"), alloc(AllocFn::Calloc));
        assert_eq!(classify("mi_realloc_aligned"), alloc(AllocFn::Realloc));
        assert_eq!(classify("mi_malloc_aligned_size"), None);
        assert_eq!(classify("je_malloc_aligned"), None);
        assert_eq!(classify("xallocx"), None);
        // glibc functions that merely start like C++'s.
        assert_eq!(classify("newlocale"), None);
        assert_eq!(classify("delete_module"), None);
    }
}
