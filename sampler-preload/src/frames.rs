//! Python frames of a sample taken while allocscope attaches (an early record).
//!
//! Once attached, the kernel program reads a sampled call's Python frames at its probe.
//! Before, the library reads them itself, with the same walk
//! ([`sampler_common::python::read_frames`]) over its own memory, so that a Python command
//! may run while its probes load and its first samples still say which Python code made
//! them. The layout comes from the process itself: `Py_Version` and `_PyRuntime` (exported
//! by the `python3.X` executable or `libpython3.X`), the version's known offsets or 3.13's
//! `_Py_DebugOffsets`. allocscope checks the walk's start against the interpreter it finds
//! in the process's maps before it believes the frames.

use core::{
    cell::UnsafeCell,
    ffi::c_void,
    sync::atomic::{AtomicBool, Ordering},
};

use sampler_common::python::{
    read_frames, walk_for_version, walk_from_debug_offsets, Memory, PyFrameEntry, PyLayout,
};

/// The walk placed in this process, written once at set-up before [`FOUND`] says so.
struct Found(UnsafeCell<PyLayout>);

// SAFETY: written by the one thread that sets the library up, before `FOUND` is set
// (release); read only after `FOUND` is seen (acquire).
unsafe impl Sync for Found {}

static LAYOUT: Found = Found(UnsafeCell::new(PyLayout {
    interpreters_head: 0,
    threads_head: 0,
    thread_next: 0,
    thread_native_id: 0,
    thread_frame: 0,
    via_cframe: 0,
    cframe_current_frame: 0,
    frame_previous_word: 0,
    frame_code_word: 0,
    frame_instr_word: 0,
    frame_entry_byte: 0,
    code_identity: 0,
}));
static FOUND: AtomicBool = AtomicBool::new(false);

/// Finds the process's interpreter, if it has one whose frames can be read: at set-up
/// (after an exec the library sets up again; a forked child keeps its parent's).
pub fn find() {
    if FOUND.load(Ordering::Acquire) {
        return;
    }
    use crate::python::symbol;
    let (runtime, version) = (symbol(c"_PyRuntime"), symbol(c"Py_Version"));
    if runtime.is_null() || version.is_null() {
        return;
    }
    // SAFETY: `Py_Version` is a constant unsigned long in the interpreter's data.
    let version = unsafe { core::ptr::read_volatile(version.cast::<u32>()) };
    let (major, minor) = ((version >> 24) as u8, (version >> 16) as u8);
    let walk = walk_for_version(major, minor).or_else(|| {
        walk_from_debug_offsets(|index| {
            let mut out = [0u64; 1];
            OwnMemory
                .words(runtime as u64 + 8 * index as u64, &mut out)
                .then_some(out[0])
        })
    });
    let Some(walk) = walk.filter(|w| w.is_readable()) else {
        return;
    };
    // SAFETY: the one writer, before FOUND is set.
    unsafe { *LAYOUT.0.get() = walk.placed(runtime as u64) };
    FOUND.store(true, Ordering::Release);
}

/// Reads this thread's Python frames into `frames`: the walk's start (`_PyRuntime`'s
/// `interpreters.head`; 0 when the process has no interpreter known here), the count and
/// the walk's flags.
pub fn read(frames: &mut [PyFrameEntry]) -> (u64, usize, u32) {
    if !FOUND.load(Ordering::Acquire) {
        return (0, 0, 0);
    }
    // SAFETY: written before FOUND was set, never again.
    let layout = unsafe { &*LAYOUT.0.get() };
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u64;
    let (count, flags) = read_frames(layout, tid, &mut OwnMemory, frames);
    (layout.interpreters_head, count, flags)
}

/// This process's memory, read with `process_vm_readv` (a torn chain or a freed frame
/// makes a read fail, not fault).
struct OwnMemory;

impl Memory for OwnMemory {
    fn words(&mut self, address: u64, out: &mut [u64]) -> bool {
        let bytes = core::mem::size_of_val(out);
        let local = libc::iovec {
            iov_base: out.as_mut_ptr().cast::<c_void>(),
            iov_len: bytes,
        };
        let remote = libc::iovec {
            iov_base: address as *mut c_void,
            iov_len: bytes,
        };
        // SAFETY: reads our own memory into `out` (its length given); the kernel checks
        // the source and fails on an unmapped address.
        let read = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        read == bytes as isize
    }
}
