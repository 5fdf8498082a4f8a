//! C++'s `operator new` and `operator delete` (every form: arrays, sized, aligned,
//! nothrow), counted where the program's allocator defines them itself.
//!
//! Why: tcmalloc, jemalloc and mimalloc define `operator new` and `delete` beside `malloc`,
//! and their C++ programs' `new` never reaches `malloc`: without these a C++ program under
//! tcmalloc or jemalloc was counted at 2 calls out of 400,000, silently. Where the next
//! definition is in the same object as the next `malloc` (the allocator's own), a call is
//! counted and sampled here as `malloc` is (`AllocFn::New`; `delete` as `free`) and
//! forwarded to it. Where it is elsewhere (libstdc++'s or libc++'s, which call `malloc` and
//! `free`), it is only forwarded: `malloc` counts it, once. Where none is found (a C++
//! runtime opened later with `RTLD_LOCAL`, out of this library's sight), `new` is served
//! by `malloc` and `delete` by `free`, which is what those runtimes do (a failed `new` then
//! ends the process with a message instead of throwing `std::bad_alloc`).
//!
//! A `std::bad_alloc` thrown by the allocator's `new` unwinds to the program's handler, as it
//! would without the library (such a call is not counted: the count is taken once the
//! allocator returned). The library is built with `panic=abort` (no standard library, see
//! the crate's docs), where an exception entering a Rust frame ends the process; so the four
//! forms that throw are [`throwing_new!`] trampolines, whose only frame while the
//! allocator's `new` runs is described to the unwinder (call-frame information) with
//! [`personality`], which leaves the thread's calls counted again as the exception passes.
//! The other forms never throw and are plain functions.

use core::{
    ffi::{c_int, c_void},
    sync::atomic::{AtomicU8, AtomicUsize, Ordering},
};

use sampler_common::AllocFn;

/// How many forms there are.
pub const FORMS: usize = 20;

/// Every form, by mangled name (x86-64: `size_t` is `m`). `new` forms first.
pub const NAMES: [&core::ffi::CStr; FORMS] = [
    c"_Znwm",
    c"_Znam",
    c"_ZnwmRKSt9nothrow_t",
    c"_ZnamRKSt9nothrow_t",
    c"_ZnwmSt11align_val_t",
    c"_ZnamSt11align_val_t",
    c"_ZnwmSt11align_val_tRKSt9nothrow_t",
    c"_ZnamSt11align_val_tRKSt9nothrow_t",
    c"_ZdlPv",
    c"_ZdaPv",
    c"_ZdlPvm",
    c"_ZdaPvm",
    c"_ZdlPvRKSt9nothrow_t",
    c"_ZdaPvRKSt9nothrow_t",
    c"_ZdlPvSt11align_val_t",
    c"_ZdaPvSt11align_val_t",
    c"_ZdlPvmSt11align_val_t",
    c"_ZdaPvmSt11align_val_t",
    c"_ZdlPvSt11align_val_tRKSt9nothrow_t",
    c"_ZdaPvSt11align_val_tRKSt9nothrow_t",
];

/// The definitions forwarded to, by index of [`NAMES`] (0: none found).
pub static NEXT: [AtomicUsize; FORMS] = [const { AtomicUsize::new(0) }; FORMS];

/// Not looked up yet.
const UNKNOWN: u8 = 0;
/// The allocator's own: counted here.
const COUNTED: u8 = 1;
/// A C++ runtime's, which calls `malloc`: forwarded only.
const FORWARDED: u8 = 2;
/// None found: `malloc` and `free` serve.
const MALLOC: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// How the operators are served; looked up on the first call (the library ready).
fn state() -> u8 {
    match STATE.load(Ordering::Acquire) {
        UNKNOWN => resolve(),
        known => known,
    }
}

/// Looks up every form's next definition and decides (racing threads decide alike).
#[cold]
#[inline(never)]
fn resolve() -> u8 {
    for (name, next) in NAMES.iter().zip(&NEXT) {
        next.store(crate::next::lookup(name), Ordering::Relaxed);
    }
    let new = NEXT[0].load(Ordering::Relaxed);
    let malloc = crate::next::NEXT.malloc.load(Ordering::Relaxed);
    let state = if new == 0 {
        MALLOC
    } else if object_of(new).is_some() && object_of(new) == object_of(malloc) {
        COUNTED
    } else {
        FORWARDED
    };
    STATE.store(state, Ordering::Release);
    state
}

/// Whether the operators are the allocator's own, counted here (route.rs routes only
/// those).
pub fn counted_here() -> bool {
    state() == COUNTED
}

/// The base address of the object holding `address`.
fn object_of(address: usize) -> Option<usize> {
    // SAFETY: all-zero is a valid Dl_info.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: dladdr fills the struct we own.
    let found = unsafe { libc::dladdr(address as *const c_void, &mut info) } != 0;
    found.then_some(info.dli_fbase as usize)
}

/// A nothrow `new` form with its arguments after the size (`$arg: $ty`), index `$i` of
/// [`NAMES`], served by `$fallback(size, align)` when no definition was found.
macro_rules! new_form {
    ($name:ident, $i:expr, ($($arg:ident: $ty:ty),*), $fallback:expr) => {
        /// # Safety
        /// The C++ contract of this `operator new` form.
        #[no_mangle]
        pub unsafe extern "C" fn $name(size: usize $(, $arg: $ty)*) -> *mut c_void {
            type Form = unsafe extern "C" fn(usize $(, $ty)*) -> *mut c_void;
            let state = if crate::ensure_ready() { state() } else { MALLOC };
            // None found (or not this form: the allocator's `malloc` serves it, counted).
            if state == MALLOC || NEXT[$i].load(Ordering::Relaxed) == 0 {
                return $fallback(size, &[$($arg as usize),*]);
            }
            // SAFETY: set by `resolve` to a definition of this very form (same name).
            let next = unsafe {
                core::mem::transmute::<usize, Form>(NEXT[$i].load(Ordering::Relaxed))
            };
            if state == FORWARDED {
                // SAFETY: forwarding the caller's arguments to the next definition.
                return unsafe { next(size $(, $arg)*) };
            }
            // SAFETY: likewise. Counted once it returned (as the throwing forms are). What
            // it calls underneath is part of this call: not counted again.
            let pointer = crate::thread::busy(|| unsafe { next(size $(, $arg)*) });
            crate::counted(size as u64, AllocFn::New, || pointer)
        }
    };
}

/// A `delete` form with its arguments after the pointer, index `$i` of [`NAMES`].
macro_rules! delete_form {
    ($name:ident, $i:expr, ($($arg:ident: $ty:ty),*)) => {
        /// # Safety
        /// The C++ contract of this `operator delete` form.
        #[no_mangle]
        pub unsafe extern "C" fn $name(pointer: *mut c_void $(, $arg: $ty)*) {
            type Form = unsafe extern "C" fn(*mut c_void $(, $ty)*);
            let state = if crate::next::ready() { state() } else { MALLOC };
            let address = NEXT[$i].load(Ordering::Relaxed);
            // None found, or not this form (a `new` served by `malloc` then), or an arena
            // block: `free` takes it (the allocator's, in the same object, when counted).
            if state == MALLOC || address == 0 || crate::next::arena::contains(pointer) {
                // SAFETY: a block of the allocator `free` forwards to (or of the arena).
                return unsafe { crate::free(pointer) };
            }
            if state == COUNTED && !pointer.is_null() {
                crate::forget(pointer);
            }
            // SAFETY: set by `resolve` to a definition of this very form; the caller's
            // arguments forwarded.
            unsafe { core::mem::transmute::<usize, Form>(address)(pointer $(, $arg)*) }
        }
    };
}

/// `new` served by `malloc` (aligned forms: `args[0]` is the alignment).
fn by_malloc(size: usize, args: &[usize]) -> *mut c_void {
    let pointer = from_malloc(size, args.first().copied());
    if pointer.is_null() {
        crate::fatal(b"allocscope: operator new: out of memory (no C++ runtime found to throw std::bad_alloc)\n");
    }
    pointer
}

/// A nothrow `new` served by `malloc` (`args`: the alignment, if any, then the nothrow
/// tag): null on failure.
fn by_malloc_nothrow(size: usize, args: &[usize]) -> *mut c_void {
    from_malloc(size, (args.len() == 2).then(|| args[0]))
}

/// A block of `size` bytes (at least one) from `malloc`, or from `posix_memalign` where
/// `align` is wider than `malloc`'s 16: null on failure.
fn from_malloc(size: usize, align: Option<usize>) -> *mut c_void {
    let size = size.max(1);
    // SAFETY: the C contracts of malloc and posix_memalign hold for any size.
    unsafe {
        match align {
            Some(align) if align > 16 => {
                let mut out = core::ptr::null_mut();
                if crate::posix_memalign(&mut out, align, size) == 0 {
                    out
                } else {
                    core::ptr::null_mut()
                }
            }
            _ => crate::malloc(size),
        }
    }
}

/// What a throwing `new` form's trampoline does next: jump to `target` with the caller's
/// arguments (`counted` 0: the call is not counted here), or call it and then [`leave`]
/// (`counted` 1: this thread's calls are uncounted meanwhile). Returned in two registers.
#[repr(C)]
struct Enter {
    target: usize,
    counted: usize,
}

/// A throwing `new` form's first step: where the call goes (see [`Enter`]).
extern "C" fn enter(form: usize) -> Enter {
    let state = if crate::ensure_ready() {
        state()
    } else {
        MALLOC
    };
    let next = NEXT[form].load(Ordering::Relaxed);
    if state == MALLOC || next == 0 {
        // None found (or not this form: the allocator's `malloc` serves it, counted).
        let fallback: extern "C" fn(usize, usize) -> *mut c_void = if ALIGNED.contains(&form) {
            new_aligned_by_malloc
        } else {
            new_by_malloc
        };
        return Enter {
            target: fallback as usize,
            counted: 0,
        };
    }
    // Forwarded only (a C++ runtime's `new`, which calls `malloc`), or made where this
    // thread's calls are not counted (inside an allocator call counted already).
    let counted = state == COUNTED && crate::thread::mark_busy();
    Enter {
        target: next,
        counted: usize::from(counted),
    }
}

/// A counted throwing `new` form's last step, once the allocator returned `pointer`: what
/// it called underneath (jemalloc's aligned `new` calls `aligned_alloc`, which reaches
/// ours) was part of this call; the call itself is counted now.
extern "C" fn leave(pointer: *mut c_void, size: usize) -> *mut c_void {
    crate::thread::unmark_busy();
    crate::counted(size as u64, AllocFn::New, || pointer)
}

/// The personality routine of the [`throwing_new!`] trampolines' frames (the Itanium C++
/// ABI's, which GCC's unwinder and LLVM's call alike): an exception passing a counted call
/// (the cleanup phase; also a forced unwind, as a thread's cancellation) leaves this
/// thread's calls counted again, as [`leave`] would have. Nothing is caught, no landing
/// pad is run, no unwinder function is called.
extern "C" fn personality(
    _version: c_int,
    actions: c_int,
    _class: u64,
    _exception: *mut c_void,
    _context: *mut c_void,
) -> c_int {
    const UA_CLEANUP_PHASE: c_int = 2;
    if actions & UA_CLEANUP_PHASE != 0 {
        crate::thread::unmark_busy();
    }
    URC_CONTINUE_UNWIND
}

/// What a personality routine returns for a frame that neither handles an exception nor
/// has a cleanup to run: the unwinder goes on to the next frame.
pub(crate) const URC_CONTINUE_UNWIND: c_int = 8;

/// The aligned throwing forms (their second argument is the alignment).
const ALIGNED: [usize; 2] = [4, 5];

extern "C" fn new_by_malloc(size: usize, _: usize) -> *mut c_void {
    by_malloc(size, &[])
}

extern "C" fn new_aligned_by_malloc(size: usize, align: usize) -> *mut c_void {
    by_malloc(size, &[align])
}

/// A `new` form that may throw (`$arg`: the alignment, for the aligned ones), index `$i`
/// of [`NAMES`]: a trampoline that asks [`enter`] where to go; a counted call is made from
/// its own frame (frame pointer kept, for stack walks; call-frame information with
/// [`personality`], for an exception) and finished by [`leave`]; any other jumps there
/// with the caller's arguments, leaving no frame.
macro_rules! throwing_new {
    ($name:ident, $i:expr, ($($arg:ident: $ty:ty),*)) => {
        /// # Safety
        /// The C++ contract of this `operator new` form.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name(size: usize $(, $arg: $ty)*) -> *mut c_void {
            core::arch::naked_asm!(
                ".cfi_startproc",
                ".cfi_personality 0x1b, {personality}",
                "push rbp",
                ".cfi_def_cfa_offset 16",
                ".cfi_offset rbp, -16",
                "mov rbp, rsp",
                ".cfi_def_cfa_register rbp",
                // The arguments: size at rbp-8, alignment (if any) at rbp-16.
                "push rdi",
                "push rsi",
                "mov edi, {form}",
                "call {enter}",
                "mov rdi, [rbp - 8]",
                "mov rsi, [rbp - 16]",
                "test rdx, rdx",
                "jz 2f",
                "call rax",
                "mov rdi, rax",
                "mov rsi, [rbp - 8]",
                "call {leave}",
                ".cfi_remember_state",
                "leave",
                ".cfi_def_cfa rsp, 8",
                "ret",
                ".cfi_restore_state",
                "2:",
                "leave",
                ".cfi_def_cfa rsp, 8",
                "jmp rax",
                ".cfi_endproc",
                form = const $i,
                enter = sym enter,
                leave = sym leave,
                personality = sym personality,
            )
        }
    };
}

type Nothrow = *const c_void;

throwing_new!(_Znwm, 0, ());
throwing_new!(_Znam, 1, ());
new_form!(_ZnwmRKSt9nothrow_t, 2, (nothrow: Nothrow), by_malloc_nothrow);
new_form!(_ZnamRKSt9nothrow_t, 3, (nothrow: Nothrow), by_malloc_nothrow);
throwing_new!(_ZnwmSt11align_val_t, 4, (align: usize));
throwing_new!(_ZnamSt11align_val_t, 5, (align: usize));
new_form!(_ZnwmSt11align_val_tRKSt9nothrow_t, 6, (align: usize, nothrow: Nothrow), by_malloc_nothrow);
new_form!(_ZnamSt11align_val_tRKSt9nothrow_t, 7, (align: usize, nothrow: Nothrow), by_malloc_nothrow);
delete_form!(_ZdlPv, 8, ());
delete_form!(_ZdaPv, 9, ());
delete_form!(_ZdlPvm, 10, (size: usize));
delete_form!(_ZdaPvm, 11, (size: usize));
delete_form!(_ZdlPvRKSt9nothrow_t, 12, (nothrow: Nothrow));
delete_form!(_ZdaPvRKSt9nothrow_t, 13, (nothrow: Nothrow));
delete_form!(_ZdlPvSt11align_val_t, 14, (align: usize));
delete_form!(_ZdaPvSt11align_val_t, 15, (align: usize));
delete_form!(_ZdlPvmSt11align_val_t, 16, (size: usize, align: usize));
delete_form!(_ZdaPvmSt11align_val_t, 17, (size: usize, align: usize));
delete_form!(_ZdlPvSt11align_val_tRKSt9nothrow_t, 18, (align: usize, nothrow: Nothrow));
delete_form!(_ZdaPvSt11align_val_tRKSt9nothrow_t, 19, (align: usize, nothrow: Nothrow));
