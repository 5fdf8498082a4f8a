//! Where the arguments of another program's USDT probe are, as the eBPF side reads them.
//!
//! allocscope's own probes pin their arguments to registers; a producer built with
//! `sys/sdt.h` (an allocator firing `otel_memory:alloc(ptr, size, weight)`, libdatadog's
//! `ddheap:*`) lets the compiler choose: a register, memory at a register plus an offset, or
//! a constant, each of 1, 2, 4 or 8 bytes, signed or not (the note's `-4@-20(%rbp)`). User
//! space parses each site's argument string into a [`UsdtSpec`], stores it in the kernel's
//! spec table and gives its index in the site's attach cookie; the program reads the
//! arguments with [`UsdtArgument`]'s fields.

/// The stack pointer's code in [`UsdtArgument::register`] (the general-purpose registers
/// use [`crate::cookie::Register`]'s codes, 1–15).
pub const REGISTER_RSP: u8 = 16;

/// The probed instruction's address as [`UsdtArgument::register`]: with `deref`, a global
/// variable at a fixed distance from the probe (a Go runtime's `MemProfileRate`), wherever
/// the file was loaded.
pub const REGISTER_RIP: u8 = 17;

/// Specs the kernel's table holds: one per probe site of a producer.
pub const MAX_SPECS: u32 = 256;

/// Arguments a spec describes (the contract's probes have at most three).
pub const MAX_ARGUMENTS: usize = 3;

/// [`UsdtSpec::kind`]: an allocation, `(pointer, size, weight)`.
pub const KIND_ALLOC: u32 = 0;
/// [`UsdtSpec::kind`]: a free, `(pointer)`.
pub const KIND_FREE: u32 = 1;
/// [`UsdtSpec::kind`]: a language runtime sampled a block by its own countdown over
/// allocated bytes, `(pointer, size, mean rate)` (Go's `runtime.mProf_Malloc`, the rate
/// read from `runtime.MemProfileRate`).
pub const KIND_RUNTIME_ALLOC: u32 = 2;
/// [`UsdtSpec::kind`]: the runtime is about to free `(pointer)`'s bookkeeping, which a
/// [`KIND_RUNTIME_FREED`] site on the same thread confirms was a sampled block's (Go's
/// `runtime.freeSpecial`, then `runtime.mProf_Free`).
pub const KIND_RUNTIME_FREEING: u32 = 3;
/// [`UsdtSpec::kind`]: the block of this thread's last [`KIND_RUNTIME_FREEING`] is freed.
pub const KIND_RUNTIME_FREED: u32 = 4;
/// [`UsdtSpec::kind`]: `(pointer, what)`: `pointer` is freed if `what` is
/// [`UsdtSpec::guard`] (Go's `runtime.freeSpecial(s, p, size)` with `s.kind` the heap
/// profile's: one probe per freed sample where [`KIND_RUNTIME_FREEING`] and
/// [`KIND_RUNTIME_FREED`] take two).
pub const KIND_RUNTIME_FREE_IF: u32 = 5;

/// One argument: `register` (or none) plus `value`, dereferenced if `deref`, then cut to
/// `size` bytes and sign-extended if `signed`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtArgument {
    /// A constant (no register), or the offset added to the register before dereferencing.
    pub value: i64,
    /// [`crate::cookie::Register`] code, [`REGISTER_RSP`], or 0 for a constant.
    pub register: u8,
    /// Non-zero: the argument is in memory at `register + value`.
    pub deref: u8,
    /// Its size in bytes: 1, 2, 4 or 8.
    pub size: u8,
    /// Non-zero: sign-extend from `size` bytes.
    pub signed: u8,
    /// Explicit padding (zero).
    pub pad: [u8; 4],
}

impl UsdtArgument {
    /// `raw` (the register's value, or the bytes read from memory, or the constant) cut to
    /// the argument's size and extended as it says.
    pub const fn extend(&self, raw: u64) -> u64 {
        let bits = (self.size as u32) * 8;
        if bits == 0 || bits >= 64 {
            return raw;
        }
        let unused = 64 - bits;
        if self.signed != 0 {
            (((raw << unused) as i64) >> unused) as u64
        } else {
            (raw << unused) >> unused
        }
    }
}

/// A probe site's arguments and what the probe reports.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtSpec {
    /// The arguments, the first `count` used.
    pub arguments: [UsdtArgument; MAX_ARGUMENTS],
    /// Arguments described.
    pub count: u32,
    /// [`KIND_ALLOC`], [`KIND_FREE`] or a runtime's kind.
    pub kind: u32,
    /// [`KIND_RUNTIME_FREE_IF`]: the value the second argument must have.
    pub guard: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_cut_and_extended_as_their_size_and_sign_say() {
        let arg = |size, signed| UsdtArgument {
            size,
            signed,
            ..UsdtArgument::default()
        };
        assert_eq!(arg(8, 0).extend(u64::MAX), u64::MAX);
        assert_eq!(arg(4, 0).extend(0xffff_ffff_8000_0001), 0x8000_0001);
        assert_eq!(arg(4, 1).extend(0x0000_0000_ffff_fffe), (-2i64) as u64);
        assert_eq!(arg(2, 1).extend(0x7fff), 0x7fff);
        assert_eq!(arg(1, 0).extend(0x1ff), 0xff);
        assert_eq!(arg(1, 1).extend(0x80), (-128i64) as u64);
    }
}
