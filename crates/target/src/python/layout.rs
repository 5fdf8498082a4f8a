//! Where CPython keeps what the frame walk and the code-object reader need, per minor
//! version: from the interpreter's own headers for 3.11 and 3.12 (x86-64 release builds;
//! `tests/fixtures/py_offsets.c` prints them from any installed headers, and a test
//! compares), and from the `_Py_DebugOffsets` that 3.13+ publishes at the start of
//! `_PyRuntime` (read from the interpreter's file, where `_PyRuntime`'s initial value is).

pub use sampler_common::python::DEBUG_COOKIE;
use sampler_common::python::{walk_for_version, walk_from_debug_offsets, PyLayout, Walk};

/// Everything version-specific: the kernel's part (offsets; addresses added per process)
/// and the code, string and bytes objects' fields user space reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// (major, minor).
    pub version: (u8, u8),
    /// `_PyRuntimeState.interpreters.head`.
    pub interpreters_head: u64,
    /// The kernel walk's offsets (its `interpreters_head` still 0: per process).
    pub walk: PyLayout,
    /// Entry marker semantics: `true` for 3.11's `is_entry` (the frame is its C call's
    /// first), `false` for `owner` (3.12+: a frame owned by the C stack is a shim that
    /// separates C calls).
    pub is_entry_flag: bool,
    /// `PyCodeObject` fields.
    pub code: CodeFields,
    /// `PyASCIIObject`/`PyCompactUnicodeObject`: `state`'s offset and the two header sizes.
    pub unicode_state: u64,
    /// `sizeof(PyASCIIObject)`: where an ASCII string's characters start.
    pub unicode_ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: where other compact strings' characters start.
    pub unicode_compact_size: u64,
}

/// `PyCodeObject` fields (byte offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeFields {
    /// `co_filename` (str).
    pub filename: u64,
    /// `co_name` (str).
    pub name: u64,
    /// `co_qualname` (str).
    pub qualname: u64,
    /// `co_linetable` (bytes).
    pub linetable: u64,
    /// `co_firstlineno` (int).
    pub firstlineno: u64,
    /// `co_code_adaptive`: the bytecode, inside the object.
    pub code_adaptive: u64,
}

/// `ob_type`'s offset in every object; `ob_size`'s in variable-size ones (a code object's
/// is its bytecode's length in code units); a bytes object's characters.
pub const OB_TYPE: u64 = 8;
/// See [`OB_TYPE`].
pub const OB_SIZE: u64 = 16;
/// See [`OB_TYPE`].
pub const BYTES_SVAL: u64 = 32;

/// `PyThreadState.interp`, in every supported version.
pub const THREAD_INTERP: u64 = 16;

/// `FRAME_OWNED_BY_CSTACK` (3.12+).
pub const OWNED_BY_CSTACK: u8 = 3;

/// The layout of a version whose offsets are known from its headers (3.11, 3.12); 3.13+
/// come from [`from_debug_offsets`].
pub fn for_version(major: u8, minor: u8) -> Option<Layout> {
    let known = walk_for_version(major, minor)?;
    match (major, minor) {
        (3, 11) => Some(Layout {
            version: (3, 11),
            interpreters_head: known.interpreters_head,
            walk: known.layout,
            is_entry_flag: true,
            code: CodeFields {
                filename: 112,
                name: 120,
                qualname: 128,
                linetable: 136,
                firstlineno: 72,
                code_adaptive: 184,
            },
            unicode_state: 32,
            unicode_ascii_size: 48,
            unicode_compact_size: 72,
        }),
        (3, 12) => Some(Layout {
            version: (3, 12),
            interpreters_head: known.interpreters_head,
            walk: known.layout,
            is_entry_flag: false,
            code: CodeFields {
                filename: 112,
                name: 120,
                qualname: 128,
                linetable: 136,
                firstlineno: 68,
                code_adaptive: 192,
            },
            unicode_state: 32,
            unicode_ascii_size: 40,
            unicode_compact_size: 56,
        }),
        _ => None,
    }
}

/// The layout from the `_Py_DebugOffsets` at the start of a 3.13 `_PyRuntime` (`bytes`
/// from its start). The struct's own layout is stable within a minor version only: 3.13's
/// is read here; later versions are refused (`None`), not guessed.
pub fn from_debug_offsets(bytes: &[u8]) -> Option<Layout> {
    let word = |index: usize| -> Option<u64> {
        let at = index * 8;
        Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
    };
    let walk = walk_from_debug_offsets(word)?;
    // The rest of 3.13's struct (see `walk_from_debug_offsets` for its start): …,
    // code_object{size, filename, name, qualname, linetable, firstlineno, argcount,
    // localsplusnames, localspluskinds, co_code_adaptive}, pyobject{2}, type_object{4},
    // tuple{3}, list{3}, dict{3}, float{2}, long{3}, bytes{3}, unicode{size, state, length,
    // asciiobject_size}.
    let code = 34;
    let unicode = code + 10 + 2 + 4 + 3 + 3 + 3 + 2 + 3 + 3;
    let ascii = word(unicode + 3)?;
    let layout = Layout {
        version: (3, 13),
        interpreters_head: walk.interpreters_head,
        walk: walk.layout,
        is_entry_flag: false,
        code: CodeFields {
            filename: word(code + 1)?,
            name: word(code + 2)?,
            qualname: word(code + 3)?,
            linetable: word(code + 4)?,
            firstlineno: word(code + 5)?,
            code_adaptive: word(code + 9)?,
        },
        unicode_state: word(unicode + 1)?,
        unicode_ascii_size: ascii,
        // PyCompactUnicodeObject adds utf8_length and utf8 to PyASCIIObject.
        unicode_compact_size: ascii + 16,
    };
    layout.is_usable().then_some(layout)
}

impl Layout {
    /// Whether the kernel can read every frame field from a frame's first words, and a
    /// code object's identity words are its file name, name, qualified name and location
    /// table, one after another.
    pub fn is_usable(&self) -> bool {
        let identity = u64::from(self.walk.code_identity);
        identity == self.code.filename
            && self.code.name == identity + 8
            && self.code.qualname == identity + 16
            && self.code.linetable == identity + 24
            && Walk {
                interpreters_head: self.interpreters_head,
                layout: self.walk,
            }
            .is_readable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3.13.0's `_Py_DebugOffsets` as its `_PyRuntime` starts (x86-64 release build),
    /// its words up to the unicode fields.
    fn debug_offsets_3_13() -> Vec<u8> {
        let mut words: Vec<u64> = vec![0; 72];
        for (index, value) in [
            (1, 0x030d00f0),
            (5, 632),
            (9, 7344),
            (21, 8),
            (23, 72),
            (25, 160),
            (29, 8),
            (30, 0),
            (31, 56),
            (33, 70),
            (35, 112),
            (36, 120),
            (37, 128),
            (38, 136),
            (39, 68),
            (43, 200),
            (68, 32),
            (70, 40),
        ] {
            words[index] = value;
        }
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes[..8].copy_from_slice(DEBUG_COOKIE);
        bytes
    }

    #[test]
    fn debug_offsets_give_what_the_headers_say() {
        let layout = from_debug_offsets(&debug_offsets_3_13()).unwrap();
        assert_eq!(layout.version, (3, 13));
        assert_eq!(layout.interpreters_head, 632);
        assert_eq!(layout.walk.threads_head, 7344);
        assert_eq!(layout.walk.thread_frame, 72);
        assert_eq!(layout.walk.via_cframe, 0);
        assert_eq!(layout.walk.thread_native_id, 160);
        assert_eq!(layout.walk.frame_previous_word, 1);
        assert_eq!(layout.walk.frame_instr_word, 7);
        assert_eq!(layout.walk.frame_entry_byte, 70);
        assert_eq!(layout.code.code_adaptive, 200);
        assert_eq!(layout.code.firstlineno, 68);
        assert_eq!(layout.unicode_compact_size, 56);
        assert_eq!(layout.walk.code_identity, 112);
        assert!(layout.is_usable());
    }

    #[test]
    fn other_structs_are_refused_not_guessed() {
        let mut bytes = debug_offsets_3_13();
        bytes[8..16].copy_from_slice(&0x030e00f0u64.to_le_bytes());
        assert_eq!(from_debug_offsets(&bytes), None, "3.14's struct differs");
        let mut bytes = debug_offsets_3_13();
        bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
        assert_eq!(from_debug_offsets(&bytes), None, "free-threaded");
        assert_eq!(from_debug_offsets(b"notdebug"), None);
        assert_eq!(for_version(3, 10), None);
        for layout in [for_version(3, 11).unwrap(), for_version(3, 12).unwrap()] {
            assert!(layout.is_usable());
        }
    }
}
