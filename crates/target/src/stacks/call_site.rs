//! Is this a return address? A frame of a user stack, however it was found (frame pointers,
//! CFI, the kernel's walk), is believed only if the bytes just before it in the module's code
//! decode to a call instruction that ends exactly there. A frame-pointer walk through code
//! that keeps data in `rbp` otherwise yields text, heap pointers and key bytes as "callers"
//! (docs/design.md §3); a walk stops at the first frame that fails this test. Pure.

use iced_x86::{Decoder, DecoderOptions, FlowControl};

/// Longest x86-64 call encoding checked: `call qword ptr [base+index*scale+disp32]` with a
/// REX prefix and a segment override fits in 9 bytes; calls longer than that (redundant
/// prefixes) are not emitted by compilers.
pub(crate) const LONGEST_CALL: usize = 9;

/// Whether `code`, the bytes that end just before a return address, ends with a call
/// instruction (direct or indirect, any length up to [`LONGEST_CALL`]).
pub(crate) fn follows_call(code: &[u8]) -> bool {
    (2..=LONGEST_CALL.min(code.len())).any(|length| {
        let bytes = &code[code.len() - length..];
        let mut decoder = Decoder::new(64, bytes, DecoderOptions::NONE);
        let instruction = decoder.decode();
        !instruction.is_invalid()
            && instruction.len() == length
            && matches!(
                instruction.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_and_indirect_calls_are_recognized() {
        // call rel32
        assert!(follows_call(&[0x90, 0xe8, 0x10, 0x20, 0x30, 0x40]));
        // call *%rax
        assert!(follows_call(&[0x90, 0xff, 0xd0]));
        // call *%r11 (REX.B)
        assert!(follows_call(&[0x41, 0xff, 0xd3]));
        // call *0x10(%rbx)
        assert!(follows_call(&[0x48, 0x89, 0xc7, 0xff, 0x53, 0x10]));
        // call *0x2fe2(%rip) (through the GOT, -fno-plt)
        assert!(follows_call(&[0xff, 0x15, 0xe2, 0x2f, 0x00, 0x00]));
        // call *0x8(%rax,%rbx,8) with a disp32
        assert!(follows_call(&[0xff, 0x94, 0xd8, 0x00, 0x01, 0x00, 0x00]));
    }

    #[test]
    fn data_and_other_instructions_are_not_return_addresses() {
        // "ion Sele" as seen in a frame-pointer walk through clang: no call ends there.
        assert!(!follows_call(b"ion Sele"));
        // mov %rdi,%rax ; ret
        assert!(!follows_call(&[0x48, 0x89, 0xf8, 0xc3]));
        // jmp rel32: control leaves, but nothing returns here
        assert!(!follows_call(&[0xe9, 0x10, 0x20, 0x30, 0x40]));
        // A call that ends one byte early: the address is inside the next instruction.
        assert!(!follows_call(&[0xe8, 0x10, 0x20, 0x30, 0x40, 0x90]));
        assert!(!follows_call(&[]));
        assert!(!follows_call(&[0xe8]));
    }
}
