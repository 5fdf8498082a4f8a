//! The frame walk over any memory: what the kernel program does at a sampled call
//! (`sampler-ebpf`'s `sample::python`, whose loops are shaped for the verifier), for a
//! reader that is not the kernel: the in-process front end, which walks its own thread's
//! frames for a sample it takes while allocscope attaches. Same rules, same record: the
//! sampling thread's state found by its native id among the first [`MAX_PY_THREADS`], the
//! chain read leaf first up to the room given, each code object's [`code_signature`].

use super::{
    code_signature, PyFrameEntry, PyLayout, CODE_IDENTITY_WORDS, MAX_PY_THREADS,
    PY_FRAME_READ_WORDS, PY_READ_FAILED, PY_THREAD_NOT_FOUND, PY_TRUNCATED,
};

/// Memory the walk reads: fills `out` with the 8-byte words at `address`, or says it
/// could not (false), never faulting.
pub trait Memory {
    /// See the trait.
    fn words(&mut self, address: u64, out: &mut [u64]) -> bool;
}

fn word(memory: &mut impl Memory, address: u64) -> Option<u64> {
    let mut out = [0u64; 1];
    memory.words(address, &mut out).then_some(out[0])
}

/// Reads thread `tid`'s Python frames, leaf first, into `frames`: how many, and the
/// [`PY_TRUNCATED`], [`PY_READ_FAILED`] and [`PY_THREAD_NOT_FOUND`] flags. `(0, 0)` when
/// there is nothing to say: the interpreter is not running yet, or the thread runs no
/// Python (or is not one of its threads).
pub fn read_frames(
    layout: &PyLayout,
    tid: u64,
    memory: &mut impl Memory,
    frames: &mut [PyFrameEntry],
) -> (usize, u32) {
    let mut flags = 0;
    let Some(mut frame) = current_frame(layout, tid, memory, &mut flags) else {
        return (0, flags);
    };
    let mut count = 0;
    let mut words = [0u64; PY_FRAME_READ_WORDS];
    let at = |words: &[u64; PY_FRAME_READ_WORDS], index: u32| {
        words.get(index as usize).copied().unwrap_or(0)
    };
    while frame != 0 {
        if count == frames.len() {
            flags |= PY_TRUNCATED;
            break;
        }
        if !memory.words(frame, &mut words) {
            flags |= PY_READ_FAILED;
            break;
        }
        let entry_byte = layout.frame_entry_byte;
        let marker = (at(&words, entry_byte / 8) >> ((entry_byte % 8) * 8)) & 0xff;
        let code = at(&words, layout.frame_code_word);
        let instr =
            (at(&words, layout.frame_instr_word) & PyFrameEntry::INSTR_MASK) | (marker << 56);
        frame = at(&words, layout.frame_previous_word);
        let mut identity = [0u64; CODE_IDENTITY_WORDS];
        let signature = if memory.words(
            code.wrapping_add(u64::from(layout.code_identity)),
            &mut identity,
        ) {
            code_signature(identity)
        } else {
            0
        };
        frames[count] = PyFrameEntry {
            code,
            signature,
            instr,
        };
        count += 1;
    }
    (count, flags)
}

/// The thread's innermost interpreter frame (0: none running), or `None` when the
/// interpreter is not running yet, the thread is not one of its threads, or a read failed
/// (`flags` then says which of the last two).
fn current_frame(
    layout: &PyLayout,
    tid: u64,
    memory: &mut impl Memory,
    flags: &mut u32,
) -> Option<u64> {
    let interpreter = word(memory, layout.interpreters_head)?;
    if interpreter == 0 {
        return None;
    }
    let mut thread = word(
        memory,
        interpreter.wrapping_add(u64::from(layout.threads_head)),
    )?;
    let mut seen = 0;
    while thread != 0 {
        if seen == MAX_PY_THREADS {
            *flags |= PY_THREAD_NOT_FOUND;
            return None;
        }
        seen += 1;
        let Some(native) = word(
            memory,
            thread.wrapping_add(u64::from(layout.thread_native_id)),
        ) else {
            *flags |= PY_READ_FAILED;
            return None;
        };
        if native == tid {
            let frame = word(memory, thread.wrapping_add(u64::from(layout.thread_frame)))?;
            if layout.via_cframe != 0 && frame != 0 {
                return word(
                    memory,
                    frame.wrapping_add(u64::from(layout.cframe_current_frame)),
                );
            }
            return Some(frame);
        }
        thread = word(memory, thread.wrapping_add(u64::from(layout.thread_next))).unwrap_or(0);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::walk_for_version;

    /// A sparse memory of 8-byte words.
    #[derive(Default)]
    struct Words(std::collections::BTreeMap<u64, u64>);

    impl Words {
        fn set(&mut self, address: u64, value: u64) {
            self.0.insert(address, value);
        }
    }

    impl Memory for Words {
        fn words(&mut self, address: u64, out: &mut [u64]) -> bool {
            for (i, word) in out.iter_mut().enumerate() {
                match self.0.get(&(address + 8 * i as u64)) {
                    Some(&value) => *word = value,
                    None => return false,
                }
            }
            true
        }
    }

    /// A 3.11 interpreter at 0x1000 whose thread states (native ids `tids`) are linked
    /// from 0x2000 on; the last thread runs `depth` frames, each with a code object.
    fn interpreter(tids: &[u64], depth: u64) -> (PyLayout, Words) {
        let layout = walk_for_version(3, 11).unwrap().placed(0x100);
        let mut memory = Words::default();
        memory.set(layout.interpreters_head, 0x1000);
        memory.set(0x1000 + u64::from(layout.threads_head), 0x2000);
        for (i, &tid) in tids.iter().enumerate() {
            let thread = 0x2000 + 0x400 * i as u64;
            let next = if i + 1 < tids.len() {
                thread + 0x400
            } else {
                0
            };
            memory.set(thread + u64::from(layout.thread_next), next);
            memory.set(thread + u64::from(layout.thread_native_id), tid);
            memory.set(thread + u64::from(layout.thread_frame), thread + 0x200);
            let first = if next == 0 && depth > 0 { 0x10_0000 } else { 0 };
            memory.set(
                thread + 0x200 + u64::from(layout.cframe_current_frame),
                first,
            );
        }
        for level in 0..depth {
            let frame = 0x10_0000 + 0x100 * level;
            let code = 0x20_0000 + 0x1000 * level;
            for word in 0..PY_FRAME_READ_WORDS as u64 {
                memory.set(frame + 8 * word, 0);
            }
            let previous = if level + 1 < depth { frame + 0x100 } else { 0 };
            memory.set(frame + 8 * u64::from(layout.frame_previous_word), previous);
            memory.set(frame + 8 * u64::from(layout.frame_code_word), code);
            memory.set(
                frame + 8 * u64::from(layout.frame_instr_word),
                code + 0xc0 + level,
            );
            for word in 0..CODE_IDENTITY_WORDS as u64 {
                memory.set(
                    code + u64::from(layout.code_identity) + 8 * word,
                    code + word,
                );
            }
        }
        (layout, memory)
    }

    #[test]
    fn the_sampling_threads_chain_is_read_leaf_first() {
        let (layout, mut memory) = interpreter(&[7, 8, 9], 3);
        let mut frames = [PyFrameEntry::default(); 8];
        assert_eq!(read_frames(&layout, 9, &mut memory, &mut frames), (3, 0));
        for (level, frame) in frames[..3].iter().enumerate() {
            let code = 0x20_0000 + 0x1000 * level as u64;
            assert_eq!(frame.code, code);
            assert_eq!(frame.instruction(), code + 0xc0 + level as u64);
            assert_eq!(
                frame.signature,
                code_signature([code, code + 1, code + 2, code + 3])
            );
        }
        // A thread of the interpreter running no Python, and one that is not its.
        assert_eq!(read_frames(&layout, 7, &mut memory, &mut frames), (0, 0));
        assert_eq!(read_frames(&layout, 99, &mut memory, &mut frames), (0, 0));
    }

    #[test]
    fn a_long_chain_is_cut_and_a_broken_one_says_so() {
        let (layout, mut memory) = interpreter(&[5], 12);
        let mut frames = [PyFrameEntry::default(); 8];
        assert_eq!(
            read_frames(&layout, 5, &mut memory, &mut frames),
            (8, PY_TRUNCATED)
        );
        // The fourth frame unreadable: three read, and the failure said.
        memory.0.remove(&(0x10_0000 + 0x300));
        let mut frames = [PyFrameEntry::default(); 16];
        assert_eq!(
            read_frames(&layout, 5, &mut memory, &mut frames),
            (3, PY_READ_FAILED)
        );
        // Not running yet: nothing to say.
        let (layout, mut memory) = interpreter(&[5], 2);
        memory.set(layout.interpreters_head, 0);
        assert_eq!(read_frames(&layout, 5, &mut memory, &mut frames), (0, 0));
    }

    #[test]
    fn a_thread_past_the_first_thread_states_is_said_not_found() {
        let tids: std::vec::Vec<u64> = (1..=MAX_PY_THREADS as u64 + 1).collect();
        let (layout, mut memory) = interpreter(&tids, 1);
        let mut frames = [PyFrameEntry::default(); 4];
        assert_eq!(
            read_frames(&layout, MAX_PY_THREADS as u64 + 1, &mut memory, &mut frames),
            (0, PY_THREAD_NOT_FOUND)
        );
    }
}
