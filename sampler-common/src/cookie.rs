//! The attach cookie of every allocation probe: which target's counters the call goes to,
//! which function the session program is in, and where the probed instruction finds each
//! argument.
//!
//! A probe sits on the first instruction the kernel emulates (`probe::prologue`); the
//! instructions before it may have copied an argument to another register and reused its
//! own (mimalloc's `malloc` moves the size from `rdi` to `rsi`). User space records where
//! each argument went; the program reads it there. Layout, low to high bits:
//!
//! * 0–31: the target's counter slot ([`crate::HOST_SLOT`] for host-wide probes);
//! * 32–46: the [`crate::AllocFn`] (session program), a producer's spec index, or which
//!   site of the in-process front end ([`FRONT_END_READY`]);
//! * 47: the probed function is one an in-process front end counts itself (the malloc
//!   family in a library, CPython's pymalloc): a file-wide probe ignores the call in a
//!   process that carries one, see [`is_served_by_front_end`];
//! * 48–59: four bits per argument `n` (at `48 + 4n`): 0 for its own register, else the
//!   [`Register`] code it moved to;
//! * 60: the site is another program's USDT probe (`otel_memory`, `ddheap`): bits 32–47
//!   index its argument spec in the kernel's table ([`crate::usdt`]): see [`is_producer`];
//! * 61: the site is an in-process front end's `free` probe, not its `alloc` probe (one
//!   program serves both, so that a process's front end is one link): see
//!   [`is_front_end_free`];
//! * 62: the function is a small-object allocator layered over `malloc` (CPython's
//!   `PyObject_Malloc`): see [`is_small_objects`];
//! * 63: the probed `malloc` may call another probed `malloc` (an interposer's: a program's
//!   own `malloc` calling `__libc_malloc`, an allocator reached through `dlsym`): see
//!   [`is_outer`].

/// A general-purpose register an argument can have moved to, by its code in the cookie.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Register {
    /// `rdi`
    Rdi = 1,
    /// `rsi`
    Rsi = 2,
    /// `rdx`
    Rdx = 3,
    /// `rcx`
    Rcx = 4,
    /// `r8`
    R8 = 5,
    /// `r9`
    R9 = 6,
    /// `rax`
    Rax = 7,
    /// `rbx`
    Rbx = 8,
    /// `rbp`
    Rbp = 9,
    /// `r10`
    R10 = 10,
    /// `r11`
    R11 = 11,
    /// `r12`
    R12 = 12,
    /// `r13`
    R13 = 13,
    /// `r14`
    R14 = 14,
    /// `r15`
    R15 = 15,
}

impl Register {
    /// Every register, in code order.
    pub const ALL: [Register; 15] = [
        Register::Rdi,
        Register::Rsi,
        Register::Rdx,
        Register::Rcx,
        Register::R8,
        Register::R9,
        Register::Rax,
        Register::Rbx,
        Register::Rbp,
        Register::R10,
        Register::R11,
        Register::R12,
        Register::R13,
        Register::R14,
        Register::R15,
    ];

    /// The register of a cookie code (0 and unknown codes: none).
    pub const fn from_code(code: u8) -> Option<Register> {
        if code == 0 || code as usize > Self::ALL.len() {
            None
        } else {
            Some(Self::ALL[code as usize - 1])
        }
    }
}

/// Arguments that can be relocated (the probes read at most the third).
pub const MAX_ARGUMENTS: usize = 3;

const MOVED_SHIFT: u32 = 48;

/// The counter slot.
pub const fn slot(cookie: u64) -> u32 {
    cookie as u32
}

/// The function's discriminant (session program).
pub const fn function(cookie: u64) -> u32 {
    ((cookie >> 32) & 0x7fff) as u32
}

const SERVED_BIT: u64 = 1 << 47;

/// Whether the probed function's calls all reach an in-process front end in a process that
/// carries one (allocscope's library interposes the malloc family and wraps pymalloc): a
/// file-wide probe (`--follow`, `--comm`, `--all`) then leaves the call to the front end,
/// which counts it, instead of counting it twice.
pub const fn is_served_by_front_end(cookie: u64) -> bool {
    cookie & SERVED_BIT != 0
}

/// `cookie` marked as a function served by a front end ([`is_served_by_front_end`]).
pub const fn with_served_by_front_end(cookie: u64) -> u64 {
    cookie | SERVED_BIT
}

/// The [`function`] field of a front end's `ready` site (its `alloc` and `free` sites
/// have 0): the library has started in this process, before it forwards any call.
pub const FRONT_END_READY: u32 = 1;

/// The cookie of a front end's `ready` site for target `slot`.
pub const fn front_end_ready(slot: u32) -> u64 {
    new(FRONT_END_READY, slot)
}

/// Whether the probed site is a front end's `ready` site ([`front_end_ready`]).
pub const fn is_front_end_ready(cookie: u64) -> bool {
    !is_producer(cookie) && function(cookie) == FRONT_END_READY
}

/// The code of the register argument `n` moved to; 0: it is in its own.
pub const fn moved(cookie: u64, n: usize) -> u8 {
    if n >= MAX_ARGUMENTS {
        return 0;
    }
    ((cookie >> (MOVED_SHIFT + 4 * n as u32)) & 0xf) as u8
}

/// `cookie` telling that argument `n` is in `register` at the probed instruction.
pub const fn with_moved(cookie: u64, n: usize, register: Register) -> u64 {
    if n >= MAX_ARGUMENTS {
        return cookie;
    }
    let shift = MOVED_SHIFT + 4 * n as u32;
    (cookie & !(0xf << shift)) | ((register as u64) << shift)
}

const OUTER_BIT: u64 = 1 << 63;

/// Whether the probed `malloc` is an outer one: it leaves a nesting marker, so that a probed
/// `malloc` it calls (glibc's, under its `__libc_malloc` alias) is not counted again.
pub const fn is_outer(cookie: u64) -> bool {
    cookie & OUTER_BIT != 0
}

/// `cookie` marked as an outer `malloc`'s ([`is_outer`]).
pub const fn with_outer(cookie: u64) -> u64 {
    cookie | OUTER_BIT
}

const PRODUCER_BIT: u64 = 1 << 60;

/// Whether the probed site is another program's USDT allocation probe, its argument spec
/// at index [`function`] of the kernel's table.
pub const fn is_producer(cookie: u64) -> bool {
    cookie & PRODUCER_BIT != 0
}

/// The cookie of another program's USDT site whose argument spec is at `index`.
pub const fn producer(index: u32, slot: u32) -> u64 {
    new(index, slot) | PRODUCER_BIT
}

const FRONT_END_FREE_BIT: u64 = 1 << 61;

/// Whether the probed site is an in-process front end's `free(ptr)` probe (else its
/// `alloc` probe).
pub const fn is_front_end_free(cookie: u64) -> bool {
    cookie & FRONT_END_FREE_BIT != 0
}

/// `cookie` marked as a front end's `free` site's ([`is_front_end_free`]).
pub const fn with_front_end_free(cookie: u64) -> u64 {
    cookie | FRONT_END_FREE_BIT
}

const SMALL_OBJECTS_BIT: u64 = 1 << 62;

/// Largest request a small-object allocator serves itself ([`is_small_objects`]): CPython's
/// `SMALL_REQUEST_THRESHOLD` (512 since 3.8).
pub const SMALL_OBJECT_LIMIT: u64 = 512;

/// Whether the probed function is a small-object allocator layered over `malloc`: it serves
/// requests of 1 to [`SMALL_OBJECT_LIMIT`] bytes from its own arenas (counted at its probe)
/// and hands every other request to `malloc`, `calloc` or `realloc` (counted there, with it
/// in the stack). It leaves no nesting marker.
pub const fn is_small_objects(cookie: u64) -> bool {
    cookie & SMALL_OBJECTS_BIT != 0
}

/// `cookie` marked as a small-object allocator's ([`is_small_objects`]).
pub const fn with_small_objects(cookie: u64) -> u64 {
    cookie | SMALL_OBJECTS_BIT
}

/// A cookie of `function` and `slot`, arguments in place.
pub const fn new(function: u32, slot: u32) -> u64 {
    ((function as u64 & 0x7fff) << 32) | slot as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_served_bit_and_the_ready_site_leave_the_other_fields_alone() {
        let plain = new(0x7fff, 0xffff_ffff);
        let served = with_served_by_front_end(with_moved(plain, 2, Register::R15));
        assert!(is_served_by_front_end(served));
        assert!(!is_served_by_front_end(plain));
        assert_eq!((function(served), slot(served)), (0x7fff, 0xffff_ffff));
        assert_eq!(moved(served, 2), Register::R15 as u8);
        let ready = front_end_ready(3);
        assert!(is_front_end_ready(ready));
        assert!(!is_front_end_free(ready) && !is_producer(ready));
        assert_eq!(slot(ready), 3);
        assert!(!is_front_end_ready(3), "an alloc site");
        assert!(!is_front_end_ready(with_front_end_free(3)), "a free site");
        assert!(!is_front_end_ready(producer(FRONT_END_READY, 3)));
    }

    #[test]
    fn fields_round_trip_without_touching_each_other() {
        let plain = new(3, 0xffff_ffff);
        assert_eq!((function(plain), slot(plain)), (3, 0xffff_ffff));
        assert_eq!(
            (moved(plain, 0), moved(plain, 1), moved(plain, 2)),
            (0, 0, 0)
        );
        let cookie = with_moved(with_moved(plain, 0, Register::Rsi), 2, Register::R15);
        assert_eq!((function(cookie), slot(cookie)), (3, 0xffff_ffff));
        assert_eq!(moved(cookie, 0), Register::Rsi as u8);
        assert_eq!(moved(cookie, 1), 0);
        assert_eq!(moved(cookie, 2), Register::R15 as u8);
        // Moving again replaces; out-of-range arguments change nothing.
        let again = with_moved(cookie, 0, Register::Rax);
        assert_eq!(moved(again, 0), Register::Rax as u8);
        assert_eq!(with_moved(again, 3, Register::Rdi), again);
        assert_eq!(moved(again, 7), 0);
        for register in Register::ALL {
            assert_eq!(Register::from_code(register as u8), Some(register));
        }
        assert_eq!(Register::from_code(0), None);
        let outer = with_outer(cookie);
        assert!(is_outer(outer) && !is_outer(cookie));
        assert_eq!((function(outer), slot(outer)), (3, 0xffff_ffff));
        assert_eq!(moved(outer, 2), Register::R15 as u8);
        assert_eq!(Register::from_code(16), None);
        let small = with_small_objects(outer);
        assert!(is_small_objects(small) && !is_small_objects(outer) && is_outer(small));
        assert_eq!((function(small), slot(small)), (3, 0xffff_ffff));
        assert_eq!(moved(small, 2), Register::R15 as u8);
    }
}
