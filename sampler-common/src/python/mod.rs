//! Python frames: the wire format of the interpreter's frame chain, read by the kernel at a
//! sampled call, and the layout it is read with.
//!
//! CPython 3.11+ keeps each thread's Python frames in a linked chain of
//! `_PyInterpreterFrame`s (`previous`, the code object, the instruction pointer), reached
//! from the thread's `PyThreadState`, which is in the interpreter's list of threads (its
//! `native_thread_id` is the kernel's tid). At a sampled call the kernel program walks that
//! chain for the sampling thread and sends the (code object, instruction) pairs in a
//! [`PyStackRecord`] just before the sample; user space resolves the code objects to files,
//! functions and lines, reading the target's memory, and merges the frames into the native
//! stack. The offsets differ per CPython minor version (and 3.13 publishes them in
//! `_PyRuntime`'s `_Py_DebugOffsets`): user space finds them and hands the program a
//! [`PyLayout`] per process.

mod versions;
mod walk;

pub use versions::{walk_for_version, walk_from_debug_offsets, Walk, DEBUG_COOKIE};
pub use walk::{read_frames, Memory};

/// Most Python frames read per sample: 256 (a 200-deep recursion and its callers fit); a
/// deeper chain is cut at the leaf end's 256 and says so ([`PY_TRUNCATED`]).
pub const MAX_PY_FRAMES: usize = 256;

/// Most thread states visited to find the sampling thread's: a thread further down the
/// interpreter's list gets no Python frames ([`PY_THREAD_NOT_FOUND`]).
pub const MAX_PY_THREADS: usize = 128;

/// Words of a frame read at once: every field the walk needs lies in its first 80 bytes,
/// in every supported version (the layout's word indices are below this).
pub const PY_FRAME_READ_WORDS: usize = 10;

/// Words of the kernel's frame scratch: a power of two above [`PY_FRAME_READ_WORDS`], so
/// a masked index is provably in range.
pub const PY_FRAME_WORDS: usize = 16;

/// [`PyStackRecord::flags`]: the chain was longer than [`MAX_PY_FRAMES`].
pub const PY_TRUNCATED: u32 = 1;
/// [`PyStackRecord::flags`]: a read of the chain failed midway (the frames so far are sent).
pub const PY_READ_FAILED: u32 = 2;
/// [`PyStackRecord::flags`]: the sampling thread was not among the first
/// [`MAX_PY_THREADS`] thread states.
pub const PY_THREAD_NOT_FOUND: u32 = 4;

/// [`crate::AllocEvent::flags`]: a [`PyStackRecord`] for this sample (same tid and
/// timestamp) was sent just before it.
pub const FLAG_PYTHON: u32 = 16;

/// How to walk one process's interpreter: absolute addresses and byte offsets, set by user
/// space per process (map `PY_PROCESSES`, keyed by pid). All zero (`interpreters_head` 0):
/// user space found no interpreter it reads in the process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyLayout {
    /// Address of `_PyRuntime.interpreters.head` in the process (a pointer to the main
    /// interpreter).
    pub interpreters_head: u64,
    /// `PyInterpreterState.threads.head`.
    pub threads_head: u32,
    /// `PyThreadState.next`.
    pub thread_next: u32,
    /// `PyThreadState.native_thread_id`.
    pub thread_native_id: u32,
    /// `PyThreadState.cframe` (3.11, 3.12) or `.current_frame` (3.13+).
    pub thread_frame: u32,
    /// Non-zero when `thread_frame` points at a `_PyCFrame` whose `current_frame` is at
    /// [`PyLayout::cframe_current_frame`] (3.11, 3.12).
    pub via_cframe: u32,
    /// `_PyCFrame.current_frame`.
    pub cframe_current_frame: u32,
    /// Word index of `_PyInterpreterFrame.previous` in the frame's first
    /// [`PY_FRAME_READ_WORDS`] words.
    pub frame_previous_word: u32,
    /// Word index of the code object (`f_code`, 3.13+ `f_executable`).
    pub frame_code_word: u32,
    /// Word index of the instruction pointer (`prev_instr`, 3.13+ `instr_ptr`).
    pub frame_instr_word: u32,
    /// Byte offset of the entry marker (`is_entry` in 3.11, `owner` later).
    pub frame_entry_byte: u32,
    /// `PyCodeObject.co_filename`, followed by `co_name`, `co_qualname` and
    /// `co_linetable` (in every supported version): the four pointers read with each frame
    /// make its code object's [`code_signature`].
    pub code_identity: u32,
}

/// Words of a code object read for its [`code_signature`].
pub const CODE_IDENTITY_WORDS: usize = 4;

/// A code object's identity at the sample: its file name, name, qualified name and
/// location table pointers, mixed. A code object freed and another allocated at its
/// address (pymalloc's free lists are last-in first-out, so that is common) rarely gets
/// all four: its name alone was seen reused, with the qualified name's string at the
/// freed one's address too. The same function on both sides, so the kernel's and user
/// space's signatures agree.
pub const fn code_signature(words: [u64; CODE_IDENTITY_WORDS]) -> u64 {
    words[0] ^ words[1].rotate_left(16) ^ words[2].rotate_left(32) ^ words[3].rotate_left(48)
}

/// One Python frame as read: the code object, its signature, and the instruction pointer, whose top byte (above any user address) carries the frame's
/// entry-marker byte.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrameEntry {
    /// Address of the code object (`PyCodeObject *`; 3.13's `f_executable` may be another
    /// object, such as `None` in a C-stack shim frame).
    pub code: u64,
    /// Its [`code_signature`] at the sample (0: unreadable).
    pub signature: u64,
    /// Instruction pointer in the code object's bytecode, bits 0..56; the entry-marker byte
    /// in bits 56..64 ([`PyFrameEntry::marker`]).
    pub instr: u64,
}

impl PyFrameEntry {
    /// The instruction pointer's bits, without the marker.
    pub const INSTR_MASK: u64 = (1 << 56) - 1;

    /// The instruction pointer.
    pub const fn instruction(&self) -> u64 {
        self.instr & Self::INSTR_MASK
    }

    /// The entry-marker byte (`is_entry` in 3.11; `owner` later).
    pub const fn marker(&self) -> u8 {
        (self.instr >> 56) as u8
    }
}

/// The Python frames of one sample, leaf first, sent just before the sample itself (whose
/// flags carry [`FLAG_PYTHON`]); its used length only.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyStackRecord {
    /// [`crate::EventKind::PythonStack`].
    pub kind: u32,
    /// Frames sent.
    pub count: u32,
    /// Process.
    pub pid: u32,
    /// Thread (the sample's).
    pub tid: u32,
    /// The sample's timestamp: pairs the two records.
    pub timestamp_ns: u64,
    /// [`PY_TRUNCATED`], [`PY_READ_FAILED`], [`PY_THREAD_NOT_FOUND`].
    pub flags: u32,
    /// Explicit padding.
    pub pad: u32,
    /// Leaf first.
    pub frames: [PyFrameEntry; MAX_PY_FRAMES],
}

impl PyStackRecord {
    /// Bytes before the frames.
    pub const HEAD: usize = 32;
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] integer structs without padding; any bit pattern is valid.
    unsafe impl aya::Pod for super::PyLayout {}
    // SAFETY: as above (explicit padding field).
    unsafe impl aya::Pod for super::PyStackRecord {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_head_is_what_its_constant_says() {
        assert_eq!(
            core::mem::offset_of!(PyStackRecord, frames),
            PyStackRecord::HEAD
        );
        assert_eq!(core::mem::size_of::<PyLayout>() % 8, 0);
    }

    #[test]
    fn a_signature_tells_apart_objects_sharing_some_pointers() {
        let words = [
            0x7f00_0000_1000,
            0x7f00_0000_2000,
            0x7f00_0000_3000,
            0x7f00_0000_4000,
        ];
        let mut other = words;
        other[1] = 0x7f00_0000_2100;
        assert_ne!(code_signature(words), code_signature(other));
        // Swapped pointers are another object too.
        assert_ne!(
            code_signature(words),
            code_signature([words[1], words[0], words[2], words[3]])
        );
    }

    #[test]
    fn the_marker_rides_above_the_instruction_pointer() {
        let entry = PyFrameEntry {
            code: 0x7f00_0000_1000,
            signature: 0,
            instr: 0x7f00_0000_2002 | (3 << 56),
        };
        assert_eq!(entry.instruction(), 0x7f00_0000_2002);
        assert_eq!(entry.marker(), 3);
    }
}
