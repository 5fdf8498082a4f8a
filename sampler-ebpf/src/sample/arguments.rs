//! Where a probed call's arguments are: the attach cookie says which register holds each
//! (a prologue before the probed instruction may have moved it), a USDT spec where another
//! program's probe put its own.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The running program's attach cookie ([`sampler_common::cookie`]).
#[inline(always)]
pub fn cookie<C: EbpfContext>(ctx: &C) -> u64 {
    // SAFETY: the helper only reads the cookie of the running program's attachment.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

/// The size `function` is asked for and its pointer argument (`realloc`'s old block,
/// `posix_memalign`'s `memptr`; 0 otherwise), each read where the cookie says it is.
#[inline(always)]
pub fn arguments(ctx: &ProbeContext, cookie: u64, function: AllocFn) -> (u64, u64) {
    let arg = |n: usize| argument(ctx, cookie, n);
    match function {
        AllocFn::Malloc | AllocFn::Valloc | AllocFn::Pvalloc | AllocFn::New => (arg(0), 0),
        AllocFn::Calloc => (geometric::saturating_product(arg(0), arg(1)), 0),
        AllocFn::Realloc => (arg(1), arg(0)),
        AllocFn::PosixMemalign => (arg(2), arg(0)),
        AllocFn::AlignedAlloc | AllocFn::Memalign => (arg(1), 0),
    }
}

/// Argument `n`: in its own register, or in the one the prologue before the probed
/// instruction moved it to.
#[inline(always)]
pub(super) fn argument(ctx: &ProbeContext, cookie: u64, n: usize) -> u64 {
    match cookie::moved(cookie, n) {
        0 => ctx.arg::<u64>(n).unwrap_or(0),
        code => register(ctx, code),
    }
}

/// The probed task's register of `code` ([`cookie::Register`]'s, or
/// [`sampler_common::usdt::REGISTER_RSP`], [`sampler_common::usdt::REGISTER_RIP`]); 0 for an
/// unknown code.
#[inline(always)]
pub(super) fn register(ctx: &ProbeContext, code: u8) -> u64 {
    use cookie::Register;
    let regs = ctx.regs;
    // The verifier accepts only constant offsets into the context: one volatile load per
    // arm keeps the compiler from turning the match into a computed address.
    // SAFETY: `regs` is the probed task's saved registers, valid for the program's run.
    let read = |field: *const u64| unsafe { core::ptr::read_volatile(field) };
    if code == sampler_common::usdt::REGISTER_RSP {
        // SAFETY: as below.
        return read(unsafe { &raw const (*regs).rsp });
    }
    if code == sampler_common::usdt::REGISTER_RIP {
        // SAFETY: as below. A uprobe's handlers see the probed instruction's address.
        return read(unsafe { &raw const (*regs).rip });
    }
    let Some(register) = Register::from_code(code) else {
        return 0;
    };
    // SAFETY: each arm takes the address of a field of `*regs` (nothing is dereferenced
    // but by `read`).
    unsafe {
        match register {
            Register::Rdi => read(&raw const (*regs).rdi),
            Register::Rsi => read(&raw const (*regs).rsi),
            Register::Rdx => read(&raw const (*regs).rdx),
            Register::Rcx => read(&raw const (*regs).rcx),
            Register::R8 => read(&raw const (*regs).r8),
            Register::R9 => read(&raw const (*regs).r9),
            Register::Rax => read(&raw const (*regs).rax),
            Register::Rbx => read(&raw const (*regs).rbx),
            Register::Rbp => read(&raw const (*regs).rbp),
            Register::R10 => read(&raw const (*regs).r10),
            Register::R11 => read(&raw const (*regs).r11),
            Register::R12 => read(&raw const (*regs).r12),
            Register::R13 => read(&raw const (*regs).r13),
            Register::R14 => read(&raw const (*regs).r14),
            Register::R15 => read(&raw const (*regs).r15),
        }
    }
}

/// One argument of another program's USDT probe, where its spec says it is.
#[inline(always)]
pub(super) fn usdt_argument(
    ctx: &ProbeContext,
    argument: &sampler_common::usdt::UsdtArgument,
) -> u64 {
    if argument.register == 0 {
        return argument.extend(argument.value as u64);
    }
    let base = register(ctx, argument.register);
    if argument.deref == 0 {
        return argument.extend(base);
    }
    let at = base.wrapping_add(argument.value as u64);
    // SAFETY: bpf_probe_read_user copies from user memory, failing (not faulting) on a bad
    // address; exactly the argument's bytes are read.
    let raw = unsafe {
        match argument.size {
            1 => bpf_probe_read_user(at as *const u8).map(u64::from),
            2 => bpf_probe_read_user(at as *const u16).map(u64::from),
            4 => bpf_probe_read_user(at as *const u32).map(u64::from),
            _ => bpf_probe_read_user(at as *const u64),
        }
    };
    argument.extend(raw.unwrap_or(0))
}
