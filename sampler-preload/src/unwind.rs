//! The unwinder's interface (`_Unwind_*`), forwarded to the process's own unwinder.
//!
//! Why: the standard library calls GCC's unwinder (to unwind a panic, and in its
//! personality routine), which would make the library depend on `libgcc_s.so.1`, and every
//! process it is loaded into load that file and run its constructor, whose `cpuid` probing
//! traps in a VM: ~0.14 ms of each short process's start here, a third of what the library
//! cost it. Linking a copy of the unwinder in (`libgcc_eh.a`) is not an option: a C++
//! `std::bad_alloc` thrown by the process's unwinder through our `operator new` (see
//! [`crate::cxx`]) ran our landing pad and then our copy's `_Unwind_Resume`, and the
//! process aborted.
//!
//! So each function the standard library references is defined here, hidden (bound within
//! this library, never seen by the program), as a trampoline to the process's definition,
//! looked up with `dlsym(RTLD_DEFAULT, …)`: libgcc_s's (or LLVM's libunwind's) in a
//! process that throws C++ exceptions, the very unwinder that threw. A process with no
//! unwinder throws nothing through us; should the library itself panic there (it never
//! does by design) the process ends with a message, as [`crate::fatal`] ends it.
//! sampler-user's build script hands the linker an empty `libgcc_s.so`, so nothing else
//! provides these names.

use core::{
    ffi::{c_void, CStr},
    sync::atomic::{AtomicUsize, Ordering},
};

/// Each function's address in the process, once found (0: not yet).
static FOUND: [AtomicUsize; NAMES.len()] = [const { AtomicUsize::new(0) }; NAMES.len()];

/// Looks up every function the process defines: called where a C++ exception may soon
/// pass through the library (its first `operator new`), so that no lookup runs while one
/// does (`dlsym` takes the loader's lock).
pub fn find() {
    for index in 0..NAMES.len() {
        let _ = lookup(index);
    }
}

fn lookup(index: usize) -> usize {
    let found = FOUND[index].load(Ordering::Acquire);
    if found != 0 {
        return found;
    }
    // SAFETY: dlsym on the global scope with a NUL-terminated name; our own definitions
    // are hidden, so what it finds is another object's.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, NAMES[index].as_ptr()) } as usize;
    FOUND[index].store(address, Ordering::Release);
    address
}

/// The address a trampoline jumps to: the process's function `index`.
#[cfg_attr(test, allow(dead_code))]
extern "C" fn target(index: usize) -> *const c_void {
    match lookup(index) {
        0 => crate::fatal(
            b"allocscope: the in-process sampler needed an unwinder and the process has none\n",
        ),
        address => address as *const c_void,
    }
}

/// One hidden trampoline per name (`$index`: its place in the list, checked): keeps the
/// argument registers (every one of these takes at most three integer or pointer
/// arguments; four are kept), asks [`target`] where the process's function is, and jumps
/// there with the caller's return address in place. Also defines [`NAMES`].
macro_rules! trampolines {
    ($($index:literal $name:ident),* $(,)?) => {
        /// The functions, in the order of their trampolines.
        const NAMES: [&CStr; [$($index),*].len()] = [$(
            match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                Ok(name) => name,
                Err(_) => panic!("a name with a NUL"),
            }
        ),*];
        const _: () = {
            let indices = [$($index),*];
            let mut i = 0;
            while i < indices.len() {
                assert!(indices[i] == i, "trampolines! lists its indices in order");
                i += 1;
            }
        };
        $(
            #[cfg(not(test))]
            core::arch::global_asm!(
                concat!(".pushsection .text.", stringify!($name), ",\"ax\",@progbits"),
                ".p2align 4",
                concat!(".globl ", stringify!($name)),
                concat!(".hidden ", stringify!($name)),
                concat!(".type ", stringify!($name), ",@function"),
                concat!(stringify!($name), ":"),
                "push rdi",
                "push rsi",
                "push rdx",
                "push rcx",
                "sub rsp, 8",
                "mov edi, {index}",
                "call {target}",
                "add rsp, 8",
                "pop rcx",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "jmp rax",
                concat!(".size ", stringify!($name), ", . - ", stringify!($name)),
                ".popsection",
                index = const $index,
                target = sym target,
            );
        )*
    };
}

// (Not in the unit tests' binary: there the standard library's own unwinder serves.)
trampolines!(
    0 _Unwind_Backtrace,
    1 _Unwind_GetDataRelBase,
    2 _Unwind_GetIP,
    3 _Unwind_GetIPInfo,
    4 _Unwind_GetLanguageSpecificData,
    5 _Unwind_GetRegionStart,
    6 _Unwind_GetTextRelBase,
    7 _Unwind_RaiseException,
    8 _Unwind_Resume,
    9 _Unwind_SetGR,
    10 _Unwind_SetIP,
);
