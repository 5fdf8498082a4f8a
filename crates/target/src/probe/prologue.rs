//! Where to put a uprobe in a function: on the first instruction the kernel *emulates*.
//!
//! A uprobe replaces an instruction with `int3`. After the BPF program runs, the kernel must
//! execute the original instruction: x86 emulates a few in the trap handler (`push` of a
//! 64-bit register since 4.18; `jmp`, `call`, `jcc`, `nop` since 3.x) and single-steps the
//! rest out of line, which costs a second trap: several times the cost of an emulated one
//! for glibc's `free`, whose first instruction is `test %rdi,%rdi` (docs/design.md §5;
//! docs/performance.md, "Figures quoted from the code").
//!
//! So the probe goes on the first emulated instruction reached from the entry by falling
//! through, provided nothing before it writes the stack pointer (the direct caller is read
//! from `[rsp]`) or loses an argument the probe reads. An argument copied to another register
//! (`mov rsi, rdi`) before its own is overwritten is followed there: the placement says where
//! ([`Placement::moved`]) and the program reads it there (`sampler_common::cookie`). When no
//! such instruction comes early, the entry is used. The decoding is iced-x86's; the choice is
//! pure and tested on real byte sequences.

use iced_x86::{
    Code, Decoder, DecoderOptions, Instruction, InstructionInfoFactory, OpAccess, OpKind, Register,
};
use sampler_common::cookie;

/// Instructions inspected before giving up and probing the entry.
const MAX_INSTRUCTIONS: usize = 12;

/// Where the probe goes, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Offset from the function's entry.
    pub offset: u64,
    /// The instruction probed, disassembled (`push rbp`).
    pub instruction: String,
    /// Whether the kernel emulates the instruction (false: the entry, single-stepped).
    pub emulated: bool,
    /// Arguments no longer in their own register there: (its register at the entry, the
    /// register holding it at the probe).
    pub moved: Vec<(Register, Register)>,
}

impl Placement {
    /// The function's entry, when nothing better is known.
    pub fn entry() -> Placement {
        Placement {
            offset: 0,
            instruction: "(entry)".to_owned(),
            emulated: false,
            moved: Vec::new(),
        }
    }
}

/// The cookie's code for `register` (a 64-bit general-purpose register other than `rsp`).
pub fn cookie_register(register: Register) -> Option<cookie::Register> {
    use cookie::Register as C;
    Some(match register {
        Register::RDI => C::Rdi,
        Register::RSI => C::Rsi,
        Register::RDX => C::Rdx,
        Register::RCX => C::Rcx,
        Register::R8 => C::R8,
        Register::R9 => C::R9,
        Register::RAX => C::Rax,
        Register::RBX => C::Rbx,
        Register::RBP => C::Rbp,
        Register::R10 => C::R10,
        Register::R11 => C::R11,
        Register::R12 => C::R12,
        Register::R13 => C::R13,
        Register::R14 => C::R14,
        Register::R15 => C::R15,
        _ => return None,
    })
}

/// `mov r64, r64`: (destination, source).
fn register_copy(instruction: &Instruction) -> Option<(Register, Register)> {
    let copies = matches!(instruction.code(), Code::Mov_r64_rm64 | Code::Mov_rm64_r64)
        && instruction.op0_kind() == OpKind::Register
        && instruction.op1_kind() == OpKind::Register;
    let (to, from) = (instruction.op0_register(), instruction.op1_register());
    (copies && cookie_register(to).is_some()).then_some((to, from))
}

/// Whether the x86 uprobe code emulates `instruction` instead of single-stepping it.
pub fn is_emulated(instruction: &Instruction) -> bool {
    match instruction.code() {
        // push r64 (with or without REX.B).
        Code::Push_r64 => true,
        // 0x90 with any operand-size prefix (not the 0F 1F long nops: single-stepped).
        Code::Nopd | Code::Nopw | Code::Nopq => true,
        Code::Jmp_rel8_64 | Code::Jmp_rel32_64 | Code::Call_rel32_64 => true,
        _ => instruction.is_jcc_short_or_near() && !instruction.has_any_prefix(),
    }
}

trait Prefixes {
    fn has_any_prefix(&self) -> bool;
}

impl Prefixes for Instruction {
    /// Branch hints and `bnd` prefixes make the kernel refuse to emulate a branch.
    fn has_any_prefix(&self) -> bool {
        self.has_repe_prefix() || self.has_repne_prefix() || self.segment_prefix() != Register::None
    }
}

/// Chooses the probe point of the function whose code starts with `code`. `reads` are the
/// registers the probe program reads (argument registers), followed where they are copied
/// to; the stack pointer is always kept.
pub fn choose(code: &[u8], reads: &[Register]) -> Placement {
    choose_with(code, reads, true)
}

/// As [`choose`], for a program that reads its arguments in their own registers only.
pub fn choose_in_place(code: &[u8], reads: &[Register]) -> Placement {
    choose_with(code, reads, false)
}

fn choose_with(code: &[u8], reads: &[Register], follow_copies: bool) -> Placement {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut entry = None;
    // Per argument register: the registers holding its entry value now.
    let mut holders: Vec<(Register, Vec<Register>)> = reads.iter().map(|&r| (r, vec![r])).collect();
    for _ in 0..MAX_INSTRUCTIONS {
        if !decoder.can_decode() {
            break;
        }
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            break;
        }
        let moved: Vec<(Register, Register)> = holders
            .iter()
            .filter(|(own, now)| !now.contains(own))
            .map(|(own, now)| (*own, now[0]))
            .collect();
        let mut text = format!("{instruction}");
        for (own, now) in &moved {
            text.push_str(&format!(" ({own:?} in {now:?})").to_lowercase());
        }
        let placement = Placement {
            offset: instruction.ip(),
            instruction: text,
            emulated: is_emulated(&instruction),
            moved,
        };
        if entry.is_none() {
            entry = Some(placement.clone());
        }
        if placement.emulated {
            return placement;
        }
        // The probe must see [rsp] as it was at the entry, and every argument somewhere.
        let written: Vec<Register> = info
            .info(&instruction)
            .used_registers()
            .iter()
            .filter(|used| {
                matches!(
                    used.access(),
                    OpAccess::Write
                        | OpAccess::CondWrite
                        | OpAccess::ReadWrite
                        | OpAccess::ReadCondWrite
                )
            })
            .map(|used| used.register().full_register())
            .collect();
        if written.contains(&Register::RSP) {
            break;
        }
        let copy = register_copy(&instruction).filter(|_| follow_copies);
        for (_, now) in &mut holders {
            let copied = copy.is_some_and(|(_, from)| now.contains(&from));
            now.retain(|register| !written.contains(register));
            if let (true, Some((to, _))) = (copied, copy) {
                now.push(to);
            }
        }
        let lost = holders.iter().any(|(_, now)| now.is_empty());
        let ends_path = instruction.flow_control() != iced_x86::FlowControl::Next;
        if lost || ends_path {
            break;
        }
    }
    entry.unwrap_or_else(Placement::entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    // First bytes of glibc 2.36 (Debian 12) functions, read from libc.so.6.
    const FREE: [u8; 32] = [
        0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55, 0x48, 0x8d, 0x77, 0xf0, 0x53,
        0x48, 0x83, 0xec, 0x18, 0x48, 0x8b, 0x1d, 0xd6, 0x9e, 0x13, 0x00, 0x48, 0x8b, 0x47, 0xf8,
        0x64, 0x8b,
    ];
    const MALLOC: [u8; 32] = [
        0x41, 0x54, 0x55, 0x53, 0x48, 0x89, 0xfb, 0x48, 0x83, 0xec, 0x10, 0x80, 0x3d, 0x46, 0x1b,
        0x14, 0x00, 0x00, 0x0f, 0x84, 0xf8, 0x01, 0x00, 0x00, 0x48, 0x85, 0xdb, 0x0f, 0x88, 0xfd,
        0x01, 0x00,
    ];
    const CALLOC: [u8; 32] = [
        0x41, 0x55, 0x48, 0x89, 0xf8, 0x41, 0x54, 0x55, 0x53, 0x48, 0x83, 0xec, 0x18, 0x48, 0xf7,
        0xe6, 0x48, 0x89, 0xc3, 0x0f, 0x90, 0xc0, 0x48, 0x85, 0xdb, 0x0f, 0x88, 0xd9, 0x02, 0x00,
        0x00, 0x0f,
    ];
    const REALLOC: [u8; 32] = [
        0x41, 0x57, 0x41, 0x56, 0x41, 0x55, 0x41, 0x54, 0x55, 0x48, 0x89, 0xf5, 0x53, 0x48, 0x89,
        0xfb, 0x48, 0x83, 0xec, 0x28, 0x80, 0x3d, 0x3d, 0x13, 0x14, 0x00, 0x00, 0x0f, 0x84, 0x57,
        0x01, 0x00,
    ];
    const POSIX_MEMALIGN: [u8; 32] = [
        0x80, 0x3d, 0x01, 0x02, 0x14, 0x00, 0x00, 0x41, 0x54, 0x49, 0x89, 0xd4, 0x55, 0x48, 0x89,
        0xfd, 0x53, 0x48, 0x89, 0xf3, 0x74, 0x5a, 0x48, 0x89, 0xda, 0x48, 0xc1, 0xea, 0x03, 0x48,
        0x8d, 0x42,
    ];

    const ARGS: [Register; 3] = [Register::RDI, Register::RSI, Register::RDX];

    #[test]
    fn free_skips_the_single_stepped_test() {
        // test rdi,rdi (single-stepped) → je (emulated): the NULL check's branch.
        let placement = choose(&FREE, &[Register::RDI]);
        assert_eq!(placement.offset, 3, "{placement:?}");
        assert!(placement.emulated);
        assert!(placement.instruction.starts_with("je "), "{placement:?}");
    }

    #[test]
    fn functions_starting_with_push_stay_at_the_entry() {
        for (name, code) in [
            ("malloc", &MALLOC),
            ("calloc", &CALLOC),
            ("realloc", &REALLOC),
        ] {
            let placement = choose(code, &ARGS);
            assert_eq!(placement.offset, 0, "{name}: {placement:?}");
            assert!(
                placement.emulated && placement.instruction.starts_with("push "),
                "{name}"
            );
        }
    }

    #[test]
    fn posix_memalign_skips_a_rip_relative_compare() {
        // cmp byte ptr [rip+...],0 reads memory only; push r12 follows.
        let placement = choose(&POSIX_MEMALIGN, &ARGS);
        assert_eq!(placement.offset, 7, "{placement:?}");
        assert_eq!(placement.instruction, "push r12");
    }

    #[test]
    fn an_argument_copied_before_its_register_is_reused_is_followed() {
        // mimalloc 2.0.9 (Debian 12) malloc: mov rax,[rip+…]; mov rsi,rdi; mov rdi,fs:[rax];
        // cmp rsi,400h; ja … — the size moves to rsi before rdi is reused.
        let mimalloc_malloc = [
            0x48, 0x8b, 0x05, 0x49, 0xb4, 0x00, 0x00, 0x48, 0x89, 0xfe, 0x64, 0x48, 0x8b, 0x38,
            0x48, 0x81, 0xfe, 0x00, 0x04, 0x00, 0x00, 0x77, 0x29,
        ];
        let placement = choose(&mimalloc_malloc, &[Register::RDI]);
        assert_eq!(placement.offset, 21, "{placement:?}");
        assert!(placement.emulated);
        assert_eq!(placement.moved, [(Register::RDI, Register::RSI)]);
        assert!(
            placement.instruction.ends_with("(rdi in rsi)"),
            "{placement:?}"
        );
        // A program reading arguments in place only cannot go there.
        let in_place = choose_in_place(&mimalloc_malloc, &[Register::RDI]);
        assert_eq!((in_place.offset, in_place.emulated), (0, false));
        // A copy that is itself overwritten is lost: back to the entry.
        let copy_lost = [0x48, 0x89, 0xfe, 0x31, 0xff, 0x31, 0xf6, 0x55];
        assert_eq!(choose(&copy_lost, &[Register::RDI]).offset, 0);
        // Copied and still in place: not moved.
        let copy_kept = [0x48, 0x89, 0xfe, 0x55];
        let kept = choose(&copy_kept, &[Register::RDI]);
        assert_eq!((kept.offset, kept.moved.len()), (3, 0), "{kept:?}");
    }

    #[test]
    fn no_safe_point_falls_back_to_the_entry() {
        // mov rdi,rsi; mov eax,1; ret — the argument is overwritten before anything emulated.
        let clobbers_argument = [0x48, 0x89, 0xf7, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3];
        let placement = choose(&clobbers_argument, &[Register::RDI]);
        assert_eq!(
            (placement.offset, placement.emulated),
            (0, false),
            "{placement:?}"
        );
        // sub rsp,8 moves [rsp] away from the return address.
        let moves_stack = [0x48, 0x83, 0xec, 0x08, 0x55];
        assert_eq!(choose(&moves_stack, &[]).offset, 0);
        // ret ends the path before anything emulated.
        let returns = [0x31, 0xc0, 0xc3, 0x55];
        assert_eq!(choose(&returns, &[]).offset, 0);
        // Nothing decodable.
        assert_eq!(choose(&[], &[]).offset, 0);
    }
}
