//! Code objects read from a target's memory: qualified name, file, first line, location
//! table and where its bytecode lies, so an instruction pointer gives a line. A code
//! object is believed only when its type is the interpreter's `PyCode_Type` and the
//! frame's instruction lies inside its bytecode: an address whose object was freed (and
//! perhaps reused) since the sample reads as gone, never as another function.

use std::sync::Arc;

use super::{
    layout::{Layout, BYTES_SVAL, OB_SIZE, OB_TYPE},
    linetable,
};

/// A target's memory.
pub(crate) trait Memory {
    /// Fills `buffer` from `address`; false when any of it cannot be read.
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool;

    /// A little-endian word at `address`.
    fn word(&self, address: u64) -> Option<u64> {
        let mut bytes = [0u8; 8];
        self.read(address, &mut bytes)
            .then(|| u64::from_le_bytes(bytes))
    }
}

/// A live process's memory, read with `process_vm_readv` (no ptrace stop, nothing written).
pub(crate) struct ProcessMemory(pub u32);

impl Memory for ProcessMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
        let local = libc::iovec {
            iov_base: buffer.as_mut_ptr().cast(),
            iov_len: buffer.len(),
        };
        let remote = libc::iovec {
            iov_base: address as *mut libc::c_void,
            iov_len: buffer.len(),
        };
        // SAFETY: one local iovec over `buffer` (live, writable, its length); the remote
        // one is only read by the kernel, which checks it.
        let read =
            unsafe { libc::process_vm_readv(self.0 as libc::pid_t, &local, 1, &remote, 1, 0) };
        read == buffer.len() as isize
    }
}

/// Longest name or file name read (characters).
const MAX_STRING: u64 = 4096;
/// Largest location table read (bytes).
const MAX_LINETABLE: u64 = 1 << 20;

/// A code object, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Code {
    /// `co_qualname`.
    pub qualname: Arc<str>,
    /// `co_filename`.
    pub filename: Arc<str>,
    /// Its identity ([`sampler_common::python::code_signature`]), as the kernel reads it
    /// with each frame.
    pub signature: u64,
    first_line: i64,
    linetable: Vec<u8>,
    /// Address of its first code unit, and how many there are.
    bytecode: u64,
    units: u64,
}

impl Code {
    /// Whether `instruction` points into this code object's bytecode.
    pub(crate) fn holds(&self, instruction: u64) -> bool {
        instruction >= self.bytecode && instruction < self.bytecode + self.units * 2
    }

    /// The line of the instruction at `instruction` (an address in its bytecode).
    pub(crate) fn line_at(&self, instruction: u64) -> Option<u32> {
        let index = instruction.checked_sub(self.bytecode)? / 2;
        linetable::line_of(&self.linetable, self.first_line, index)
    }
}

/// Reads the code object at `address`; `code_type` is the process's `&PyCode_Type`.
pub(crate) fn read_code(
    memory: &impl Memory,
    layout: &Layout,
    code_type: u64,
    address: u64,
) -> Option<Code> {
    if address == 0 || memory.word(address + OB_TYPE)? != code_type {
        return None;
    }
    let units = memory.word(address + OB_SIZE)?;
    let field = |offset: u64| memory.word(address + offset);
    let first_line = field(layout.code.firstlineno)? as u32 as i32;
    let linetable = read_bytes(memory, field(layout.code.linetable)?)?;
    let identity = [
        field(layout.code.filename)?,
        field(layout.code.name)?,
        field(layout.code.qualname)?,
        field(layout.code.linetable)?,
    ];
    Some(Code {
        qualname: read_str(memory, layout, identity[2])?.into(),
        signature: sampler_common::python::code_signature(identity),
        filename: read_str(memory, layout, field(layout.code.filename)?)?.into(),
        first_line: i64::from(first_line),
        linetable,
        bytecode: address + layout.code.code_adaptive,
        units,
    })
}

/// A `bytes` object's contents.
fn read_bytes(memory: &impl Memory, address: u64) -> Option<Vec<u8>> {
    let length = memory.word(address + OB_SIZE)?;
    if length > MAX_LINETABLE {
        return None;
    }
    let mut bytes = vec![0; length as usize];
    memory
        .read(address + BYTES_SVAL, &mut bytes)
        .then_some(bytes)
}

/// A compact `str` object's text (how code objects' names are stored).
fn read_str(memory: &impl Memory, layout: &Layout, address: u64) -> Option<String> {
    let length = memory.word(address + OB_SIZE)?;
    let state = memory.word(address + layout.unicode_state)? as u32;
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 || length > MAX_STRING {
        return None;
    }
    let (start, width) = if ascii == 1 {
        (layout.unicode_ascii_size, 1)
    } else {
        (layout.unicode_compact_size, kind)
    };
    if !matches!(width, 1 | 2 | 4) {
        return None;
    }
    let mut bytes = vec![0; (length * u64::from(width)) as usize];
    if !memory.read(address + start, &mut bytes) {
        return None;
    }
    let text: String = match width {
        1 => bytes.iter().map(|&b| char::from(b)).collect(),
        2 => bytes
            .chunks_exact(2)
            .map(|c| {
                char::from_u32(u32::from(u16::from_le_bytes([c[0], c[1]]))).unwrap_or('\u{fffd}')
            })
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('\u{fffd}')
            })
            .collect(),
    };
    // A name or path never holds NUL, and is never empty: a str read while being set up or
    // torn down (one frame in four runs was named "\0") is no name.
    (!text.is_empty() && !text.contains('\0')).then_some(text)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::python::layout::for_version;

    /// Memory as a few byte runs at addresses.
    #[derive(Default)]
    struct Fake(BTreeMap<u64, Vec<u8>>);

    impl Fake {
        fn put(&mut self, address: u64, bytes: &[u8]) {
            self.0.insert(address, bytes.to_vec());
        }
        fn put_word(&mut self, address: u64, word: u64) {
            self.put(address, &word.to_le_bytes());
        }
        /// A compact str (3.11 layout): ASCII, or UCS-2 when `wide`.
        fn put_str(&mut self, address: u64, text: &str, wide: bool) {
            let layout = for_version(3, 11).unwrap();
            self.put_word(address + 16, text.chars().count() as u64);
            let (kind, ascii) = if wide { (2u64, 0u64) } else { (1, 1) };
            self.put_word(
                address + layout.unicode_state,
                (kind << 2) | (1 << 5) | (ascii << 6),
            );
            let bytes: Vec<u8> = if wide {
                text.encode_utf16().flat_map(u16::to_le_bytes).collect()
            } else {
                text.as_bytes().to_vec()
            };
            let start = if wide {
                layout.unicode_compact_size
            } else {
                layout.unicode_ascii_size
            };
            self.put(address + start, &bytes);
        }
    }

    impl Memory for Fake {
        fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
            let Some((&start, bytes)) = self.0.range(..=address).next_back() else {
                return false;
            };
            let from = (address - start) as usize;
            match bytes.get(from..from + buffer.len()) {
                Some(source) => {
                    buffer.copy_from_slice(source);
                    true
                }
                None => false,
            }
        }
    }

    const CODE_TYPE: u64 = 0x5000;

    fn code_object(memory: &mut Fake, at: u64) {
        let layout = for_version(3, 11).unwrap();
        memory.put_word(at + OB_TYPE, CODE_TYPE);
        memory.put_word(at + OB_SIZE, 4);
        memory.put_word(at + layout.code.firstlineno, 7);
        memory.put_word(at + layout.code.qualname, 0x10_000);
        memory.put_word(at + layout.code.name, 0x18_000);
        memory.put_word(at + layout.code.filename, 0x20_000);
        memory.put_word(at + layout.code.linetable, 0x30_000);
        memory.put_str(0x10_000, "Outer.<listcomp>", false);
        memory.put_str(0x20_000, "/srv/äpp.py", true);
        // Two entries of two units: line 7 + 1, then + 2 (one-line forms).
        memory.put_word(0x30_000 + OB_SIZE, 6);
        memory.put(
            0x30_000 + BYTES_SVAL,
            &[0x80 | (11 << 3) | 1, 0, 0, 0x80 | (12 << 3) | 1, 0, 0],
        );
    }

    #[test]
    fn a_name_of_nul_bytes_or_nothing_is_no_name() {
        let mut memory = Fake::default();
        code_object(&mut memory, 0x1000);
        let layout = for_version(3, 11).unwrap();
        for torn in ["\0", "", "a\0b"] {
            memory.put_str(0x10_000, torn, false);
            assert!(
                read_code(&memory, &layout, CODE_TYPE, 0x1000).is_none(),
                "{torn:?}"
            );
        }
    }

    #[test]
    fn a_code_object_gives_names_and_lines() {
        let mut memory = Fake::default();
        code_object(&mut memory, 0x1000);
        let layout = for_version(3, 11).unwrap();
        let code = read_code(&memory, &layout, CODE_TYPE, 0x1000).unwrap();
        assert_eq!(&*code.qualname, "Outer.<listcomp>");
        assert_eq!(&*code.filename, "/srv/äpp.py");
        assert_eq!(
            code.signature,
            sampler_common::python::code_signature([0x20_000, 0x18_000, 0x10_000, 0x30_000])
        );
        let bytecode = 0x1000 + layout.code.code_adaptive;
        assert!(code.holds(bytecode + 6) && !code.holds(bytecode + 8));
        assert_eq!(code.line_at(bytecode + 2), Some(8));
        assert_eq!(code.line_at(bytecode + 4), Some(10));
    }

    #[test]
    fn another_object_is_not_a_code_object() {
        let mut memory = Fake::default();
        code_object(&mut memory, 0x1000);
        let layout = for_version(3, 11).unwrap();
        assert_eq!(read_code(&memory, &layout, CODE_TYPE + 8, 0x1000), None);
        assert_eq!(
            read_code(&memory, &layout, CODE_TYPE, 0x2000),
            None,
            "unreadable"
        );
        assert_eq!(read_code(&memory, &layout, CODE_TYPE, 0), None);
    }
}
