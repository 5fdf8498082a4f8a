//! CPython's own allocators, wrapped: the calls pymalloc serves without reaching `malloc`.
//!
//! CPython serves small objects (1 to 512 bytes) from its own arenas, for its object domain
//! (`PyObject_Malloc`) and, since 3.6, its memory domain (`PyMem_Malloc`) too; those calls
//! never reach the `malloc` this library interposes, and calls inside the interpreter do
//! not go through the dynamic linker at all (an LTO build inlines `PyObject_Malloc`). What
//! every one of them does go through is the domain's allocator, a table of function
//! pointers that CPython lets a process replace with `PyMem_SetAllocator`, forwarding to
//! the one it had (`PyMem_GetAllocator`), as `tracemalloc` does. So when the process is a
//! Python (or embeds one), the library wraps both domains at set-up, before `main` and so
//! before the interpreter initialises: each call is counted and sampled here, at the size
//! the program asked for, and the `malloc`, `realloc` or `free` pymalloc makes underneath
//! (for a request over 512 bytes, or a new arena) is not counted again (the thread is
//! marked busy meanwhile: [`crate::thread::busy`]).
//!
//! `PyMemAllocatorEx` and the domain numbers are CPython's stable C API (3.5 onwards). The
//! interpreter resets the domains only when asked to use other allocators
//! (`PYTHONMALLOC=debug`, `-X dev`, or a program calling `PyMem_SetupDebugHooks`); those
//! replace this wrapper, and the small objects are then not counted (docs/preload.md).

use core::{
    cell::UnsafeCell,
    ffi::{c_int, c_void},
    sync::atomic::{AtomicBool, Ordering},
};

use sampler_common::AllocFn;

use crate::{counted, forget, reallocated, thread};

/// CPython's `PyMemAllocatorEx`: a context and four functions that take it first.
#[repr(C)]
struct Allocator {
    ctx: *mut c_void,
    malloc: Option<unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>,
    calloc: Option<unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void>,
    realloc: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void>,
    free: Option<unsafe extern "C" fn(*mut c_void, *mut c_void)>,
}

const EMPTY: Allocator = Allocator {
    ctx: core::ptr::null_mut(),
    malloc: None,
    calloc: None,
    realloc: None,
    free: None,
};

/// `PYMEM_DOMAIN_MEM` and `PYMEM_DOMAIN_OBJ` (`PYMEM_DOMAIN_RAW`, 0, is `malloc` itself).
const DOMAINS: [c_int; 2] = [1, 2];

/// The allocators the wrapped domains had, one per domain: each wrapper's context points
/// at its domain's, so the wrappers need not know which domain they serve.
struct Previous([UnsafeCell<Allocator>; 2]);

// SAFETY: written once, by the one thread that sets the library up, before the wrappers
// that read it are installed; read-only afterwards.
unsafe impl Sync for Previous {}

static PREVIOUS: Previous = Previous([UnsafeCell::new(EMPTY), UnsafeCell::new(EMPTY)]);

/// Whether [`wrap`] has run (once per process; a forked child keeps what it did).
static WRAPPED: AtomicBool = AtomicBool::new(false);

type GetAllocator = unsafe extern "C" fn(c_int, *mut Allocator);
type SetAllocator = unsafe extern "C" fn(c_int, *mut Allocator);

/// Wraps CPython's memory and object domains if the process has an interpreter (its
/// `PyMem_GetAllocator` and `PyMem_SetAllocator` are found); nothing otherwise. Runs in
/// the library's set-up, on one thread.
pub fn wrap() {
    if WRAPPED.load(Ordering::Acquire) {
        return;
    }
    let (get, set) = (symbol(c"PyMem_GetAllocator"), symbol(c"PyMem_SetAllocator"));
    if get.is_null() || set.is_null() {
        return;
    }
    // SAFETY: the addresses of CPython's functions of these C types.
    let (get, set) = unsafe {
        (
            core::mem::transmute::<*mut c_void, GetAllocator>(get),
            core::mem::transmute::<*mut c_void, SetAllocator>(set),
        )
    };
    for (domain, previous) in DOMAINS.iter().zip(&PREVIOUS.0) {
        // SAFETY: CPython fills the struct we own; nothing reads it until the wrapper is
        // installed below.
        unsafe { get(*domain, previous.get()) };
        // SAFETY: reading what was just written.
        let complete = unsafe {
            let p = &*previous.get();
            p.malloc.is_some() && p.calloc.is_some() && p.realloc.is_some() && p.free.is_some()
        };
        if !complete {
            continue;
        }
        let mut ours = Allocator {
            ctx: previous.get().cast(),
            malloc: Some(py_malloc),
            calloc: Some(py_calloc),
            realloc: Some(py_realloc),
            free: Some(py_free),
        };
        // SAFETY: CPython copies the struct; its context outlives the process.
        unsafe { set(*domain, &mut ours) };
    }
    WRAPPED.store(true, Ordering::Release);
}

/// The address of `name` in the process's global scope (the interpreter's, when it has
/// one); null when nothing defines it. For the set-up only: `dlsym` may allocate.
pub fn symbol(name: &core::ffi::CStr) -> *mut c_void {
    // SAFETY: dlsym on the global scope with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// The allocator a wrapper forwards to.
///
/// # Safety
/// `ctx` is the context [`wrap`] installed: one of [`PREVIOUS`]'s entries.
unsafe fn previous<'a>(ctx: *mut c_void) -> &'a Allocator {
    // SAFETY: the caller's contract.
    unsafe { &*ctx.cast::<Allocator>() }
}

unsafe extern "C" fn py_malloc(ctx: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: called by CPython with the context we installed.
    let next = unsafe { previous(ctx) };
    counted(size as u64, AllocFn::New, || {
        thread::busy(|| {
            // SAFETY: forwarding to the domain's previous allocator (complete: checked
            // in `wrap`).
            unsafe { next.malloc.unwrap_unchecked()(next.ctx, size) }
        })
    })
}

unsafe extern "C" fn py_calloc(ctx: *mut c_void, count: usize, size: usize) -> *mut c_void {
    // SAFETY: called by CPython with the context we installed.
    let next = unsafe { previous(ctx) };
    let bytes = sampler_common::geometric::saturating_product(count as u64, size as u64);
    counted(bytes, AllocFn::Calloc, || {
        thread::busy(|| {
            // SAFETY: forwarding to the domain's previous allocator (complete: checked
            // in `wrap`).
            unsafe { next.calloc.unwrap_unchecked()(next.ctx, count, size) }
        })
    })
}

unsafe extern "C" fn py_realloc(
    ctx: *mut c_void,
    pointer: *mut c_void,
    size: usize,
) -> *mut c_void {
    // SAFETY: called by CPython with the context we installed.
    let next = unsafe { previous(ctx) };
    reallocated(pointer, size, || {
        thread::busy(|| {
            // SAFETY: forwarding to the domain's previous allocator (complete: checked
            // in `wrap`).
            unsafe { next.realloc.unwrap_unchecked()(next.ctx, pointer, size) }
        })
    })
}

unsafe extern "C" fn py_free(ctx: *mut c_void, pointer: *mut c_void) {
    // SAFETY: called by CPython with the context we installed.
    let next = unsafe { previous(ctx) };
    forget(pointer);
    // Not marked busy: a `free` underneath (a block over 512 bytes, from `malloc`) only
    // forgets its pointer, which is not sampled at that level (its `malloc` ran busy) and
    // was forgotten here already if it was at this one. Half a dozen million frees a
    // second in a Python program: two thread-local writes each saved.
    // SAFETY: forwarding to the domain's previous allocator (complete: checked in `wrap`).
    unsafe { next.free.unwrap_unchecked()(next.ctx, pointer) }
}
