//! The block allocscope writes on a stopped thread's stack, below its red zone, before it
//! moves the thread at all: the thread's extended register state (what `XSAVE` holds: the
//! x87, SSE, AVX and AVX-512 registers, MXCSR, PKRU) and a signal frame that puts every
//! register back.
//!
//! Why a signal frame. To load the library allocscope first has the thread map a page (the
//! `mmap` it calls). Until that call has returned, allocscope has no code in the process
//! to bring the thread back: if allocscope were killed then, the kernel would let the
//! thread go wherever `mmap` returns. So `mmap` is called returning into the C library's
//! `__restore_rt` (`mov rax, 15; syscall`: `rt_sigreturn`), with this frame above it: the
//! kernel restores from it the thread's registers, its extended state and its signal mask,
//! exactly as after a signal handler. allocscope, alive, stops the thread when `mmap`
//! returns and never lets it reach the frame; killed, the thread maps a page nobody uses
//! (4 KiB, left) and resumes where it was.
//!
//! The same extended state is what the stub (see [`super::stub`]) restores with `XRSTOR`
//! after `dlopen`, which uses the vector registers (its string functions).
//!
//! Two differences from a kernel-made frame: the alternate signal stack is not known from
//! outside, so the frame's `uc_stack` holds an invalid mode, which `rt_sigreturn` ignores
//! (it leaves the thread's alternate stack as it is); and `rt_sigreturn` forgets a
//! system call's restart block, so a call the stop interrupted is re-issued from its start
//! rather than restarted (a `nanosleep` sleeps its whole time again: longer, never
//! shorter, which POSIX allows).
//!
//! Pure: bytes from registers, tested by reading them back.

use super::stub::Registers;

/// `uc_flags`: the frame holds extended state, its SS is meant, restore SS as given.
const UC_FLAGS: u64 = 0x1 | 0x2 | 0x4;
/// An `ss_flags` mode `sigaltstack` refuses: `rt_sigreturn` then leaves the alternate
/// stack alone.
const NO_ALTSTACK_CHANGE: u32 = 3;
/// `struct ucontext` (x86-64): flags, link, `stack_t` (24), `sigcontext` (256), mask.
const UCONTEXT: usize = 8 + 8 + 24 + 256 + 8;
const MCONTEXT_AT: usize = 40;
const SIGMASK_AT: usize = MCONTEXT_AT + 256;
const SIGINFO: usize = 128;
/// Below the original stack pointer: the red zone (128 bytes) and a margin.
const BELOW_SP: u64 = 256;
/// `FP_XSTATE_MAGIC1`, in the `sw_reserved` bytes (464..) of the legacy area.
pub(super) const XSTATE_MAGIC1: u32 = 0x4650_5853;
/// `FP_XSTATE_MAGIC2`, right after the extended state in a signal frame.
const XSTATE_MAGIC2: u32 = 0x4650_5845;
/// AMX tile configuration and data: never touched by the C library, and restoring them
/// may fault where the program has not asked for them.
const AMX: u64 = (1 << 17) | (1 << 18);

/// A thread's extended register state, as `PTRACE_GETREGSET` (`NT_X86_XSTATE`) gives it.
#[derive(Clone, Debug)]
pub(super) struct Xstate {
    bytes: Vec<u8>,
    /// The state components it holds (XCR0 when it was saved).
    features: u64,
}

impl Xstate {
    /// Takes the buffer the kernel gave (its length is the thread's state size; the first
    /// word of its `sw_reserved` bytes is the XCR0 the state was saved under) and writes
    /// there what a signal frame says instead: the magic word, the sizes, the components.
    /// `None` when it is too short to be one.
    pub(super) fn parse(buffer: &[u8]) -> Option<Xstate> {
        // The legacy area (512 bytes) and the XSAVE header (64).
        if buffer.len() < 576 {
            return None;
        }
        let features = u64::from_le_bytes(buffer[464..472].try_into().ok()?);
        // x87 and SSE are always there.
        if features & 3 != 3 {
            return None;
        }
        let mut bytes = buffer.to_vec();
        let size = bytes.len() as u32;
        bytes[464..512].fill(0);
        bytes[464..468].copy_from_slice(&XSTATE_MAGIC1.to_le_bytes());
        bytes[468..472].copy_from_slice(&(size + 4).to_le_bytes());
        bytes[472..480].copy_from_slice(&features.to_le_bytes());
        bytes[480..484].copy_from_slice(&size.to_le_bytes());
        Some(Xstate { bytes, features })
    }

    /// The components `XRSTOR` restores (`EDX:EAX`).
    pub(super) fn restore_mask(&self) -> u64 {
        self.features & !AMX
    }
}

/// What the thread's signal mask, segments and registers are, to put back.
#[derive(Clone, Debug)]
pub(super) struct Thread {
    pub registers: Registers,
    pub cs: u64,
    pub ss: u64,
    pub sigmask: u64,
}

/// The block, to write at `start`.
#[derive(Debug)]
pub(super) struct Block {
    pub start: u64,
    pub bytes: Vec<u8>,
    /// Where the stack pointer is when a function called with it returns into
    /// `__restore_rt`: the address of the word holding that return address.
    pub sigreturn_sp: u64,
    /// The stack pointer for the call to `dlopen` (its return address goes there).
    pub call_sp: u64,
    /// The 64-byte aligned extended state.
    pub xstate_at: u64,
}

/// The block for `thread`, whose stack pointer was `sp`, returning into `restore_rt`.
pub(super) fn block(thread: &Thread, xstate: &Xstate, restore_rt: u64) -> Block {
    let sp = thread.registers.rsp;
    let xstate_len = xstate.bytes.len() + 4;
    let xstate_at = (sp - BELOW_SP - xstate_len as u64) & !63;
    // A function's entry sees its return address at 8 mod 16.
    let sigreturn_sp = ((xstate_at - (8 + UCONTEXT + SIGINFO) as u64) & !15) - 8;
    let call_sp = sigreturn_sp - 16;
    let start = call_sp;
    let mut bytes = vec![0u8; (xstate_at - start) as usize + xstate_len];
    let at = |address: u64| (address - start) as usize;
    put(&mut bytes, at(sigreturn_sp), restore_rt);
    let uc = at(sigreturn_sp) + 8;
    put(&mut bytes, uc, UC_FLAGS);
    bytes[uc + 24..uc + 28].copy_from_slice(&NO_ALTSTACK_CHANGE.to_le_bytes());
    sigcontext(
        &mut bytes[uc + MCONTEXT_AT..uc + SIGMASK_AT],
        thread,
        xstate_at,
    );
    put(&mut bytes, uc + SIGMASK_AT, thread.sigmask);
    let x = at(xstate_at);
    bytes[x..x + xstate.bytes.len()].copy_from_slice(&xstate.bytes);
    let magic2 = x + xstate.bytes.len();
    bytes[magic2..magic2 + 4].copy_from_slice(&XSTATE_MAGIC2.to_le_bytes());
    Block {
        start,
        bytes,
        sigreturn_sp,
        call_sp,
        xstate_at,
    }
}

/// `struct sigcontext` (x86-64) of `thread`, its extended state at `fpstate`.
fn sigcontext(out: &mut [u8], thread: &Thread, fpstate: u64) {
    let r = reissued(&thread.registers);
    let words = [
        r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rdi, r.rsi, r.rbp, r.rbx, r.rdx,
        r.rax, r.rcx, r.rsp, r.rip, r.eflags,
    ];
    for (i, word) in words.iter().enumerate() {
        put(out, 8 * i, *word);
    }
    // cs, gs, fs, ss: 16 bits each.
    let segments = 8 * words.len();
    out[segments..segments + 2].copy_from_slice(&(thread.cs as u16).to_le_bytes());
    out[segments + 6..segments + 8].copy_from_slice(&(thread.ss as u16).to_le_bytes());
    // err, trapno, oldmask, cr2: nothing; then the extended state's address.
    put(out, segments + 8 + 32, fpstate);
}

/// Where the thread resumes after `rt_sigreturn`: as [`super::stub::resumed`], except that a
/// call the kernel would restart from its restart block (which `rt_sigreturn` forgets) is
/// issued again from its start, with its own arguments.
fn reissued(regs: &Registers) -> Registers {
    let mut out = super::stub::resumed(regs);
    if (regs.orig_rax as i64) >= 0 && regs.rax as i64 == super::stub::ERESTART_RESTARTBLOCK {
        out.rax = regs.orig_rax;
    }
    out
}

fn put(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As `PTRACE_GETREGSET` gives it: XCR0 in the first word of `sw_reserved`.
    fn xstate_buffer(size: usize, xcr0: u64) -> Vec<u8> {
        let mut b = vec![0u8; size];
        b[464..472].copy_from_slice(&xcr0.to_le_bytes());
        b[0] = 0x7f; // x87 control word's low byte
        b[24] = 0x80; // MXCSR
        b
    }

    fn thread() -> Thread {
        // Interrupted in a nanosleep, which the kernel restarts from its restart block.
        let registers = Registers {
            rax: (-516i64) as u64, // ERESTART_RESTARTBLOCK
            rsp: 0x7ffd_0000_1238,
            rip: 0x7f00_0000_2002,
            orig_rax: 35,
            ..super::super::stub::tests::regs()
        };
        Thread {
            registers,
            cs: 0x33,
            ss: 0x2b,
            sigmask: 0x1_0000_0002,
        }
    }

    fn word(block: &Block, address: u64) -> u64 {
        let at = (address - block.start) as usize;
        u64::from_le_bytes(block.bytes[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn the_kernels_buffer_becomes_a_signal_frames() {
        let x = Xstate::parse(&xstate_buffer(2440, 0x2e7 | AMX)).unwrap();
        assert_eq!(x.bytes.len(), 2440);
        assert_eq!(x.restore_mask(), 0x2e7);
        let word = |at: usize| u32::from_le_bytes(x.bytes[at..at + 4].try_into().unwrap());
        // fx_sw_bytes: magic1, extended size, features, state size.
        assert_eq!(
            (word(464), word(468), word(480)),
            (XSTATE_MAGIC1, 2444, 2440)
        );
        assert_eq!(word(472) as u64 | (word(476) as u64) << 32, 0x2e7 | AMX);
        assert_eq!((x.bytes[0], x.bytes[24]), (0x7f, 0x80));
        assert!(Xstate::parse(&xstate_buffer(2440, 0)).is_none());
        assert!(Xstate::parse(&[0u8; 500]).is_none());
    }

    #[test]
    fn the_frame_holds_the_thread_as_rt_sigreturn_reads_it() {
        let x = Xstate::parse(&xstate_buffer(2440, 0x2e7)).unwrap();
        let t = thread();
        let b = block(&t, &x, 0x7f00_0000_9000);
        // Below the red zone, aligned as a call and XRSTOR want.
        assert!(b.start + b.bytes.len() as u64 <= t.registers.rsp - 128);
        assert_eq!(b.xstate_at % 64, 0);
        assert_eq!(b.sigreturn_sp % 16, 8);
        assert_eq!(b.call_sp % 16, 8);
        assert!(b.call_sp + 8 <= b.sigreturn_sp);
        assert_eq!(word(&b, b.sigreturn_sp), 0x7f00_0000_9000);
        // rt_sigreturn reads the frame at its stack pointer minus 8: the return popped.
        let uc = b.sigreturn_sp + 8;
        assert!(uc + (UCONTEXT + SIGINFO) as u64 <= b.xstate_at);
        assert_eq!(word(&b, uc), UC_FLAGS);
        assert_eq!(word(&b, uc + 24) as u32, NO_ALTSTACK_CHANGE);
        let sc = uc + MCONTEXT_AT as u64;
        let field = |i: u64| word(&b, sc + 8 * i);
        assert_eq!((field(0), field(7), field(8), field(9)), (8, 15, 6, 5));
        assert_eq!((field(10), field(11), field(12)), (7, 2, 4));
        // The nanosleep is issued again from its start, on its syscall instruction.
        assert_eq!((field(13), field(16)), (35, 0x7f00_0000_2000));
        assert_eq!(
            (field(14), field(15), field(17)),
            (3, t.registers.rsp, 0x246)
        );
        assert_eq!(field(18) & 0xffff, 0x33);
        assert_eq!((field(18) >> 48) & 0xffff, 0x2b);
        assert_eq!(field(23), b.xstate_at);
        assert_eq!(word(&b, uc + SIGMASK_AT as u64), 0x1_0000_0002);
        // The extended state, then MAGIC2.
        let x_at = (b.xstate_at - b.start) as usize;
        assert_eq!(&b.bytes[x_at..x_at + 2440], &x.bytes[..]);
        assert_eq!(
            &b.bytes[x_at + 2440..x_at + 2444],
            &XSTATE_MAGIC2.to_le_bytes()
        );
    }

    #[test]
    fn a_thread_not_in_a_system_call_resumes_as_it_was() {
        let mut t = thread();
        t.registers.orig_rax = u64::MAX;
        t.registers.rax = 1;
        assert_eq!(reissued(&t.registers), t.registers);
        // Interrupted, restartable: the same as the stub's.
        t.registers.orig_rax = 232;
        t.registers.rax = (-514i64) as u64;
        assert_eq!(
            reissued(&t.registers),
            super::super::stub::resumed(&t.registers)
        );
    }
}
