//! USDT probe sites in the `sys/sdt.h` note format, written as inline assembly.
//!
//! Each site is a 1-byte `nop` followed by a 5-byte `nop` (`0f 1f 44 00 00`), the form
//! libbpf's `usdt.h` emits: the note points at the first `nop`, which every consumer can
//! probe (the kernel emulates it after the int3 trap), and a consumer on Linux ≥ 6.18
//! probes the 5-byte `nop` instead, which the kernel optimises into a call to a user
//! trampoline plus a syscall (no trap). `.balign 8` before the pair keeps the 5-byte `nop`
//! inside one page, which the optimisation requires. A site costs two `nop`s when nothing
//! is attached, and sits only on the sampled paths.
//!
//! The arguments are pinned to registers so the note's argument string is exact.

/// Fires `provider:name` with up to five 8-byte arguments in `rdi, rsi, rdx, rcx, r8`.
macro_rules! probe {
    ($provider:literal, $name:literal, $args:literal $(, $reg:tt = $value:expr)* $(,)?) => {
        // SAFETY: two nops and a note in a non-loaded section; the registers are inputs only.
        unsafe {
            core::arch::asm!(
                ".balign 8",
                "990: nop",
                ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
                ".pushsection .note.stapsdt,\"\",\"note\"",
                ".balign 4",
                ".4byte 992f-991f, 994f-993f, 3",
                "991: .asciz \"stapsdt\"",
                "992: .balign 4",
                "993: .8byte 990b",
                ".8byte _.stapsdt.base",
                ".8byte 0",
                concat!(".asciz \"", $provider, "\""),
                concat!(".asciz \"", $name, "\""),
                concat!(".asciz \"", $args, "\""),
                "994: .balign 4",
                ".popsection",
                ".ifndef _.stapsdt.base",
                ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat",
                ".weak _.stapsdt.base",
                ".hidden _.stapsdt.base",
                "_.stapsdt.base: .space 1",
                ".size _.stapsdt.base, 1",
                ".popsection",
                ".endif",
                $(in($reg) $value,)*
                // Not `nostack`: on Linux ≥ 6.18 a probed 5-byte nop becomes a `call`, which
                // writes below the stack pointer, so no red-zone data may live across it.
                options(preserves_flags, readonly),
            )
        }
    };
}

/// `allocscope:alloc` and `otel_memory:alloc` for a sampled block (see
/// [`sampler_common::preload::PROBE_ALLOC`]).
#[inline(always)]
pub fn alloc(pointer: u64, size: u64, offset: u64, interval: u64, how: u64, weight: u64) {
    probe!(
        "allocscope",
        "alloc",
        "8@%rdi 8@%rsi 8@%rdx 8@%rcx 8@%r8",
        "rdi" = pointer,
        "rsi" = size,
        "rdx" = offset,
        "rcx" = interval,
        "r8" = how,
    );
    probe!(
        "otel_memory",
        "alloc",
        "8@%rdi 8@%rsi 8@%rdx",
        "rdi" = pointer,
        "rsi" = size,
        "rdx" = weight,
    );
}

/// `allocscope:ready` (see [`sampler_common::preload::PROBE_READY`]): the library starts in
/// this program. An int3 when attached (once per program): allocscope attaches it only for
/// its file-wide probes.
#[inline(never)]
pub fn ready() {
    probe!("allocscope", "ready", "");
}

/// `allocscope:free` and `otel_memory:free` for a sampled block being freed.
#[inline(always)]
pub fn free(pointer: u64) {
    probe!("allocscope", "free", "8@%rdi", "rdi" = pointer);
    probe!("otel_memory", "free", "8@%rdi", "rdi" = pointer);
}
