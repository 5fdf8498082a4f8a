//! Where each CPython minor version keeps what the frame walk reads: from the interpreter's
//! own headers for 3.11 and 3.12 (x86-64 release builds; `tests/fixtures/py_offsets.c`
//! prints them from any installed headers, and a user-side test compares), and from the
//! `_Py_DebugOffsets` that 3.13 publishes at the start of `_PyRuntime`. Here, not in
//! allocscope alone, because the in-process front end walks the frames too (a sample taken
//! while allocscope attaches): it finds its interpreter's version in its own memory.

use super::{PyLayout, PY_FRAME_READ_WORDS};

/// The walk of one interpreter: where its first interpreter is and the walk's offsets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// `_PyRuntimeState.interpreters.head`: its offset in `_PyRuntime`.
    pub interpreters_head: u64,
    /// The offsets (its `interpreters_head` still 0: an address, per process).
    pub layout: PyLayout,
}

impl Walk {
    /// Whether every frame field lies in a frame's first [`PY_FRAME_READ_WORDS`] words, as
    /// the readers read them.
    pub const fn is_readable(&self) -> bool {
        let words = PY_FRAME_READ_WORDS as u32;
        self.layout.frame_previous_word < words
            && self.layout.frame_code_word < words
            && self.layout.frame_instr_word < words
            && self.layout.frame_entry_byte < words * 8
    }

    /// The layout for a process whose `_PyRuntime` is at `runtime`.
    pub const fn placed(&self, runtime: u64) -> PyLayout {
        let mut layout = self.layout;
        layout.interpreters_head = runtime.wrapping_add(self.interpreters_head);
        layout
    }
}

/// `_Py_DebugOffsets.cookie`.
pub const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

const fn layout(
    threads_head: u32,
    thread_native_id: u32,
    thread_frame: u32,
    cframe: Option<u32>,
    frame: [u32; 4],
    code_identity: u32,
) -> PyLayout {
    let [previous, code, instr, entry] = frame;
    let (via_cframe, cframe_current_frame) = match cframe {
        Some(offset) => (1, offset),
        None => (0, 0),
    };
    PyLayout {
        interpreters_head: 0,
        threads_head,
        thread_next: 8,
        thread_native_id,
        thread_frame,
        via_cframe,
        cframe_current_frame,
        frame_previous_word: previous / 8,
        frame_code_word: code / 8,
        frame_instr_word: instr / 8,
        frame_entry_byte: entry,
        code_identity,
    }
}

/// The walk of a version whose offsets are known from its headers (3.11, 3.12); 3.13 comes
/// from [`walk_from_debug_offsets`].
pub const fn walk_for_version(major: u8, minor: u8) -> Option<Walk> {
    match (major, minor) {
        (3, 11) => Some(Walk {
            interpreters_head: 40,
            layout: layout(16, 160, 56, Some(8), [48, 32, 56, 68], 112),
        }),
        (3, 12) => Some(Walk {
            interpreters_head: 40,
            layout: layout(72, 144, 56, Some(0), [8, 0, 56, 70], 112),
        }),
        _ => None,
    }
}

/// The walk from the `_Py_DebugOffsets` at the start of a 3.13 `_PyRuntime`, whose `index`th
/// 8-byte word `word` gives (the first is the cookie, [`DEBUG_COOKIE`]). The struct's own
/// layout is stable within a minor version only: 3.13's is read here; later versions and
/// free-threaded builds are refused (`None`), not guessed.
pub fn walk_from_debug_offsets(word: impl Fn(usize) -> Option<u64>) -> Option<Walk> {
    if word(0)? != u64::from_le_bytes(*DEBUG_COOKIE) {
        return None;
    }
    let version = word(1)?;
    let (major, minor) = ((version >> 24) as u8, (version >> 16) as u8);
    if (major, minor) != (3, 13) || word(2)? != 0 {
        return None;
    }
    // 3.13's struct as u64 words: cookie, version, free_threaded, runtime_state{size,
    // finalizing, interpreters_head}, interpreter_state{size, id, next, threads_head, …13},
    // thread_state{size, prev, next, interp, current_frame, thread_id, native_thread_id,
    // …9}, interpreter_frame{size, previous, executable, instr_ptr, localsplus, owner},
    // code_object{size, filename, …}.
    let small = |value: u64| u32::try_from(value).ok();
    let (thread, frame, code) = (19, 28, 34);
    let walk = Walk {
        interpreters_head: word(5)?,
        layout: layout(
            small(word(6 + 3)?)?,
            small(word(thread + 6)?)?,
            small(word(thread + 4)?)?,
            None,
            [
                small(word(frame + 1)?)?,
                small(word(frame + 2)?)?,
                small(word(frame + 3)?)?,
                small(word(frame + 5)?)?,
            ],
            small(word(code + 1)?)?,
        ),
    };
    if small(word(thread + 2)?)? != walk.layout.thread_next || !walk.is_readable() {
        return None;
    }
    Some(walk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_versions_are_readable_and_others_unknown() {
        for (major, minor) in [(3, 11), (3, 12)] {
            let walk = walk_for_version(major, minor).unwrap();
            assert!(walk.is_readable());
            assert_eq!(walk.placed(0x1000).interpreters_head, 0x1000 + 40);
        }
        assert_eq!(walk_for_version(3, 10), None);
        assert_eq!(walk_for_version(3, 13), None);
        assert_eq!(walk_from_debug_offsets(|_| Some(0)), None);
    }
}
