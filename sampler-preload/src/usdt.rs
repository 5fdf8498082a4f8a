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
//!
//! Every site sits in one function ([`fire`]), within 128 aligned bytes and so on one
//! page: a probe attached to the file makes the kernel write its breakpoint into every
//! process that maps the library, at the mapping, copying the page it sits on. Spread over
//! three functions the sites sat on three pages: three page copies in every process the
//! library was loaded into, sampled or not.

/// One site of `provider:name`, its arguments described by `args`: a template line for
/// [`fire`]'s `asm!` (the note points at local label 990, defined just before it).
macro_rules! site {
    ($provider:literal, $name:literal, $args:literal) => {
        concat!(
            ".balign 8\n",
            "990: nop\n",
            ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n",
            ".pushsection .note.stapsdt,\"\",\"note\"\n",
            ".balign 4\n",
            ".4byte 992f-991f, 994f-993f, 3\n",
            "991: .asciz \"stapsdt\"\n",
            "992: .balign 4\n",
            "993: .8byte 990b\n",
            ".8byte _.stapsdt.base\n",
            ".8byte 0\n",
            ".asciz \"",
            $provider,
            "\"\n",
            ".asciz \"",
            $name,
            "\"\n",
            ".asciz \"",
            $args,
            "\"\n",
            "994: .balign 4\n",
            ".popsection\n",
            ".ifndef _.stapsdt.base\n",
            ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n",
            ".weak _.stapsdt.base\n",
            ".hidden _.stapsdt.base\n",
            "_.stapsdt.base: .space 1\n",
            ".size _.stapsdt.base, 1\n",
            ".popsection\n",
            ".endif\n",
        )
    };
}

/// Which sites [`fire`] runs.
#[derive(Clone, Copy)]
#[repr(u64)]
enum Sites {
    Alloc = 0,
    Free = 1,
    Ready = 2,
}

/// Fires the sites of `which`, with `rdi, rsi, rdx, rcx, r8` holding `args` (and `rdx`
/// holding `weight` at `otel_memory:alloc`).
#[inline(never)]
fn fire(which: Sites, args: [u64; 5], weight: u64) {
    // SAFETY: nops, notes in a non-loaded section and jumps within the block; the
    // registers are inputs (rdx is overwritten and declared so).
    unsafe {
        core::arch::asm!(
            ".balign 128",
            "cmp {which}, 1",
            "je 31f",
            "cmp {which}, 2",
            "je 32f",
            site!("allocscope", "alloc", "8@%rdi 8@%rsi 8@%rdx 8@%rcx 8@%r8"),
            "mov rdx, {weight}",
            site!("otel_memory", "alloc", "8@%rdi 8@%rsi 8@%rdx"),
            "jmp 39f",
            "31:",
            site!("allocscope", "free", "8@%rdi"),
            site!("otel_memory", "free", "8@%rdi"),
            "jmp 39f",
            "32:",
            site!("allocscope", "ready", ""),
            "39:",
            which = in(reg) which as u64,
            weight = in(reg) weight,
            in("rdi") args[0],
            in("rsi") args[1],
            inout("rdx") args[2] => _,
            in("rcx") args[3],
            in("r8") args[4],
            // Not `nostack`: on Linux ≥ 6.18 a probed 5-byte nop becomes a `call`, which
            // writes below the stack pointer, so no red-zone data may live across it.
            options(readonly),
        )
    }
}

/// `allocscope:alloc` and `otel_memory:alloc` for a sampled block (see
/// [`sampler_common::preload::PROBE_ALLOC`]).
#[inline(always)]
pub fn alloc(pointer: u64, size: u64, offset: u64, interval: u64, how: u64, weight: u64) {
    fire(Sites::Alloc, [pointer, size, offset, interval, how], weight);
}

/// `allocscope:ready` (see [`sampler_common::preload::PROBE_READY`]): the library starts in
/// this program. An int3 when attached (once per program): allocscope attaches it only for
/// its file-wide probes.
#[inline(always)]
pub fn ready() {
    fire(Sites::Ready, [0; 5], 0);
}

/// `allocscope:free` and `otel_memory:free` for a sampled block being freed.
#[inline(always)]
pub fn free(pointer: u64) {
    fire(Sites::Free, [pointer, 0, 0, 0, 0], 0);
}
