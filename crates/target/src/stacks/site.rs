//! The site of a stack: the frame a person recognises as theirs. A stack's leaf is whoever
//! called the allocator, which in most programs is not the program's own code: redis calls
//! `zmalloc`, CPython `PyMem_Malloc` or `_PyObject_GC_New`, C++ `operator new` through the
//! standard library, Perl `Perl_safesysmalloc`. Seven rows all named `zmalloc` say nothing;
//! the site is the first frame, from the leaf, outside that machinery, or the first Python
//! frame where the stack has one. Tables, legends, `top` and the summary lead with the site
//! and keep the leaf beside it.
//!
//! The machinery is a list of function-name patterns ([`BUILT_IN`], documented in
//! docs/manual.md), which `--wrapper REGEX` extends for a program's own wrappers. Pure.

use std::sync::OnceLock;

use regex::RegexSet;

use super::symbolize::{FrameInfo, FrameKind};

/// Functions that only pass an allocation on: allocators, the C++ runtime and standard
/// library, language runtimes' allocation layers and well-known wrappers (anchored regexes
/// on demangled names).
pub const BUILT_IN: &[&str] = &[
    // C allocators and their internals.
    r"^(__libc_)?(malloc|calloc|realloc|reallocarray|free|memalign|posix_memalign|aligned_alloc|valloc|pvalloc)$",
    r"^_int_(malloc|realloc|memalign|free)$",
    r"^(je_|_rjem_|mi_|tc_|__wrap_)",
    r"^(xmalloc|xcalloc|xrealloc|xstrdup|xmemdup|xzalloc|g_malloc.*|g_realloc.*|g_try_malloc.*|g_slice_.*|g_new.*|g_strdup.*)$",
    r"^(strdup|strndup|asprintf|vasprintf|__strdup|open_memstream)$",
    // Wrappers of well-known servers.
    r"^z(try)?(malloc|calloc|realloc)(_usable)?$",
    r"^(ztrymalloc_usable|ztrycalloc_usable|ztryrealloc_usable|zstrdup)$",
    // C++: operator new, the standard library, the ABI.
    r"^operator new",
    r"^(std|__gnu_cxx|__cxxabiv1)::",
    r"^__cxa_",
    // Rust's allocation layer and collections (`std::` is above).
    r"^(__rust_(alloc|realloc|alloc_zeroed)|__rdl_|__rg_)",
    r"^<?(alloc|core)::",
    // CPython's allocation layers.
    r"^_?(PyMem|PyObject)_(Raw)?(Malloc|Calloc|Realloc|New|NewVar|GC_New|GC_NewVar|GC_Resize|Init|InitVar)$",
    r"^_?PyObject_GC_(New|NewVar|Resize|Link)$",
    r"^_PyObject_(New|NewVar|GC_New|GC_NewVar|Malloc|Calloc|Realloc)$",
    r"^(_PyMem_|_PyObject_Malloc|pymalloc_|_PyObject_GC_Alloc|gc_alloc|PyType_GenericAlloc|_PyType_AllocNoTrack)",
    // Perl's.
    r"^Perl_(safesys(malloc|calloc|realloc)|sv_grow|more_bodies|more_sv|newSV_type)$",
];

/// Where a stack's site is, and the patterns it was found with.
#[derive(Debug)]
pub struct Sites {
    machinery: RegexSet,
}

impl Sites {
    /// The built-in list and `extra` patterns (a user's own wrappers).
    pub fn new(extra: &[String]) -> Result<Sites, regex::Error> {
        let patterns = BUILT_IN
            .iter()
            .map(|p| (*p).to_owned())
            .chain(extra.iter().cloned());
        Ok(Sites {
            machinery: RegexSet::new(patterns)?,
        })
    }

    /// Whether `frame` only passes an allocation on.
    pub fn is_machinery(&self, frame: &FrameInfo) -> bool {
        frame.kind.is_none()
            && frame
                .function
                .as_deref()
                .is_some_and(|name| self.machinery.is_match(name))
    }

    /// The index of `frames`' (leaf first) site: its first Python frame, else its first
    /// frame outside the machinery, else its leaf (0; also for an empty stack).
    pub fn site_of(&self, frames: &[FrameInfo]) -> usize {
        frames
            .iter()
            .position(|f| f.kind == Some(FrameKind::Python))
            .or_else(|| frames.iter().position(|f| !self.is_machinery(f)))
            .unwrap_or(0)
    }
}

static SITES: OnceLock<Sites> = OnceLock::new();

/// Sets the patterns every output uses, once, at start (`--wrapper`); an invalid pattern is
/// the caller's to report.
pub fn configure(extra: &[String]) -> Result<(), regex::Error> {
    let sites = Sites::new(extra)?;
    let _ = SITES.set(sites);
    Ok(())
}

/// The patterns every output uses: those [`configure`]d, else the built-in list.
pub fn sites() -> &'static Sites {
    SITES.get_or_init(|| Sites::new(&[]).expect("the built-in patterns compile"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(name: &str) -> FrameInfo {
        FrameInfo {
            function: Some(name.into()),
            ..FrameInfo::default()
        }
    }

    fn python(name: &str, line: u32) -> FrameInfo {
        FrameInfo {
            function: Some(name.into()),
            file: Some("app.py".into()),
            line: Some(line),
            kind: Some(FrameKind::Python),
            ..FrameInfo::default()
        }
    }

    fn site(frames: &[FrameInfo]) -> String {
        let sites = Sites::new(&[]).unwrap();
        frames[sites.site_of(frames)]
            .function
            .as_deref()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn a_wrapper_gives_way_to_its_caller() {
        // redis: seven rows were all `zmalloc`.
        let redis = [
            native("zmalloc_usable"),
            native("_sdsnewlen"),
            native("createStringObject"),
        ];
        assert_eq!(site(&redis), "_sdsnewlen");
        let list = [
            native("ztrymalloc_usable"),
            native("zrealloc_usable"),
            native("lpInsert"),
        ];
        assert_eq!(site(&list), "lpInsert");
    }

    #[test]
    fn cxx_gives_way_to_the_programs_own_code() {
        let frames = [
            native("operator new(unsigned long)"),
            native("std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, int const&)"),
            native("std::vector<int, std::allocator<int> >::push_back(int const&)"),
            native("Index::add(int)"),
            native("main"),
        ];
        assert_eq!(site(&frames), "Index::add(int)");
    }

    #[test]
    fn rust_gives_way_to_the_programs_own_code() {
        let frames = [
            native("alloc::raw_vec::finish_grow"),
            native("alloc::raw_vec::RawVec<T,A>::grow_one"),
            native("<alloc::string::String as core::clone::Clone>::clone"),
            native("server::session::Store::insert"),
        ];
        assert_eq!(site(&frames), "server::session::Store::insert");
    }

    #[test]
    fn python_stacks_are_named_by_their_python_line() {
        let frames = [
            native("PyList_Append"),
            native("_PyAccu_Accumulate"),
            python("render", 12),
            python("handle", 30),
        ];
        let sites = Sites::new(&[]).unwrap();
        assert_eq!(sites.site_of(&frames), 2);
        // Without Python frames: past CPython's allocation layers.
        let native_only = [
            native("PyObject_Malloc"),
            native("_PyObject_GC_New"),
            native("PyList_New"),
        ];
        assert_eq!(site(&native_only), "PyList_New");
        let perl = [
            native("Perl_safesysmalloc"),
            native("Perl_sv_grow"),
            native("Perl_pp_concat"),
        ];
        assert_eq!(site(&perl), "Perl_pp_concat");
    }

    #[test]
    fn a_users_own_wrapper_is_skipped_and_an_all_machinery_stack_keeps_its_leaf() {
        let frames = [native("my_alloc"), native("arena_grow"), native("parse")];
        let sites = Sites::new(&["^(my_alloc|arena_grow)$".into()]).unwrap();
        assert_eq!(sites.site_of(&frames), 2);
        assert_eq!(site(&[native("malloc"), native("free")]), "malloc");
        assert_eq!(Sites::new(&[]).unwrap().site_of(&[]), 0);
        assert!(Sites::new(&["(".into()]).is_err());
        // Unknown frames are the program's (an unsymbolized address is not machinery).
        let unknown = [FrameInfo::default(), native("main")];
        assert_eq!(Sites::new(&[]).unwrap().site_of(&unknown), 0);
    }
}
