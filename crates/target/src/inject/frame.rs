//! The block allocscope writes on a stopped thread's stack, below its red zone, before it
//! moves the thread at all: the thread's extended register state (what `XSAVE` holds: the
//! x87, SSE, AVX and AVX-512 registers, MXCSR, PKRU) and two signal frames, through which
//! the thread finds its own way back. No code of allocscope's is ever written into the
//! target, and nothing of it stays there.
//!
//! Why signal frames. The thread is made to call the C library's `mmap` (a page for the
//! library's path) returning into its `__restore_rt` (`mov rax, 15; syscall`:
//! `rt_sigreturn`) with the *resume* frame above it: the kernel restores from it the
//! thread's registers, its extended state and its signal mask, exactly as after a signal
//! handler. allocscope, alive, stops the thread when `mmap` returns and never lets it reach
//! that frame; killed, the thread resumes where it was (the page stays, 4 KiB, unused).
//! Then it is set to call `dlopen` returning into `__restore_rt` again, with the *release*
//! frame above: that one sends it into the C library's `munmap` of the page, returning into
//! the resume frame. So once let go it loads the library, unmaps the page and resumes as it
//! was, all on its own; the page's disappearance tells allocscope that `dlopen` returned.
//!
//! Differences from a kernel-made frame: the alternate signal stack is not known from
//! outside, so the frames' `uc_stack` hold an invalid mode, which `rt_sigreturn` ignores
//! (it leaves the thread's alternate stack as it is); the release frame has no extended
//! state (the kernel resets it for the `munmap`; the resume frame puts it back); and
//! `rt_sigreturn` forgets a system call's restart block, so a call the stop interrupted is
//! issued again from its start: the thread is taken in such a call only where that is
//! exact (see [`super::calls`]).
//!
//! Pure: bytes from registers, tested by reading them back.

/// The registers a frame restores (x86-64, as `PTRACE_GETREGS` gives them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Registers {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rbp: u64,
    pub rsp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
    pub rip: u64,
    pub eflags: u64,
    /// The system call the thread was in (`orig_rax`), or -1 as u64.
    pub orig_rax: u64,
}

const ERESTARTSYS: i64 = -512;
pub(super) const ERESTARTNOINTR: i64 = -513;
const ERESTARTNOHAND: i64 = -514;
const ERESTART_RESTARTBLOCK: i64 = -516;
/// Length of the `syscall` instruction.
const SYSCALL_LEN: u64 = 2;

/// Where the thread resumes, in user space, with no tracer: a system call the stop
/// interrupted is issued again on its instruction (the kernel's restart, except that a
/// restart block, which `rt_sigreturn` forgets, is replaced by the call from its start).
pub(super) fn resumed(regs: &Registers) -> Registers {
    let mut out = *regs;
    if (regs.orig_rax as i64) < 0 {
        return out;
    }
    if let ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND | ERESTART_RESTARTBLOCK = regs.rax as i64 {
        out.rax = regs.orig_rax;
        out.rip = regs.rip - SYSCALL_LEN;
    }
    out
}

/// `uc_flags`: the frame holds extended state, its SS is meant, restore SS as given.
const UC_FLAGS: u64 = UC_FP_XSTATE | 0x2 | 0x4;
const UC_FP_XSTATE: u64 = 0x1;
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
/// may fault where the program has not asked for them: left out of what is restored.
const AMX: u64 = (1 << 17) | (1 << 18);

/// A thread's extended register state, as `PTRACE_GETREGSET` (`NT_X86_XSTATE`) gives it.
#[derive(Clone, Debug)]
pub(super) struct Xstate {
    bytes: Vec<u8>,
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
        bytes[472..480].copy_from_slice(&(features & !AMX).to_le_bytes());
        bytes[480..484].copy_from_slice(&size.to_le_bytes());
        Some(Xstate { bytes })
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

/// The block, to write at `start` before the thread is moved.
#[derive(Debug)]
pub(super) struct Block {
    pub start: u64,
    pub bytes: Vec<u8>,
    /// The resume frame's return slot: where the stack pointer is when a function called
    /// with it returns into `__restore_rt`, which restores the thread as it was.
    pub sigreturn_sp: u64,
    /// The release frame's return slot: the stack pointer for the call to `dlopen`,
    /// filled by [`release`] once the page exists.
    pub call_sp: u64,
}

/// Bytes of one frame: its return slot, `struct ucontext` and a `siginfo`.
const FRAME: usize = 8 + UCONTEXT + SIGINFO;

/// The block for `thread`, its resume frame returning into `restore_rt` (the release
/// frame's room left zero).
pub(super) fn block(thread: &Thread, xstate: &Xstate, restore_rt: u64) -> Block {
    let sp = thread.registers.rsp;
    let xstate_len = xstate.bytes.len() + 4;
    let xstate_at = (sp - BELOW_SP - xstate_len as u64) & !63;
    // A function's entry sees its return address at 8 mod 16.
    let sigreturn_sp = ((xstate_at - FRAME as u64) & !15) - 8;
    let call_sp = ((sigreturn_sp - FRAME as u64) & !15) - 8;
    let start = call_sp;
    let mut bytes = vec![0u8; (xstate_at - start) as usize + xstate_len];
    let resume = (sigreturn_sp - start) as usize;
    let registers = resumed(&thread.registers);
    frame(
        &mut bytes[resume..],
        restore_rt,
        thread,
        &registers,
        xstate_at,
    );
    let x = (xstate_at - start) as usize;
    bytes[x..x + xstate.bytes.len()].copy_from_slice(&xstate.bytes);
    let magic2 = x + xstate.bytes.len();
    bytes[magic2..magic2 + 4].copy_from_slice(&XSTATE_MAGIC2.to_le_bytes());
    Block {
        start,
        bytes,
        sigreturn_sp,
        call_sp,
    }
}

/// The release frame, to write at `block.call_sp`: `dlopen` returns into `restore_rt`,
/// which sends the thread into `munmap(page, page_len)` returning into the resume frame.
/// Signals as the thread blocks them; no extended state (the resume frame has it).
pub(super) fn release(
    block: &Block,
    thread: &Thread,
    restore_rt: u64,
    munmap: u64,
    (page, page_len): (u64, u64),
) -> Vec<u8> {
    let registers = Registers {
        rdi: page,
        rsi: page_len,
        rsp: block.sigreturn_sp,
        rip: munmap,
        eflags: thread.registers.eflags,
        orig_rax: u64::MAX,
        ..Registers::default()
    };
    let mut bytes = vec![0u8; FRAME];
    frame(&mut bytes, restore_rt, thread, &registers, 0);
    bytes
}

/// One frame at the start of `out`: the return slot holding `restore_rt`, then the
/// `ucontext` that puts back `registers`, `thread`'s segments and signal mask, and the
/// extended state at `fpstate` (0: none).
fn frame(out: &mut [u8], restore_rt: u64, thread: &Thread, registers: &Registers, fpstate: u64) {
    put(out, 0, restore_rt);
    let uc = 8;
    let flags = if fpstate == 0 {
        UC_FLAGS & !UC_FP_XSTATE
    } else {
        UC_FLAGS
    };
    put(out, uc, flags);
    out[uc + 24..uc + 28].copy_from_slice(&NO_ALTSTACK_CHANGE.to_le_bytes());
    sigcontext(
        &mut out[uc + MCONTEXT_AT..uc + SIGMASK_AT],
        thread,
        registers,
        fpstate,
    );
    put(out, uc + SIGMASK_AT, thread.sigmask);
}

/// `struct sigcontext` (x86-64): `r`, `thread`'s segments, the extended state at `fpstate`.
fn sigcontext(out: &mut [u8], thread: &Thread, r: &Registers, fpstate: u64) {
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

    /// A register set whose general registers hold their own ModRM-order numbers.
    fn regs() -> Registers {
        Registers {
            rax: 1,
            rbx: 2,
            rcx: 3,
            rdx: 4,
            rsi: 5,
            rdi: 6,
            rbp: 7,
            rsp: 0x7ffd_0000_1000,
            r8: 8,
            r9: 9,
            r10: 10,
            r11: 11,
            r12: 12,
            r13: 13,
            r14: 14,
            r15: 15,
            rip: 0x5555_0000_2000,
            eflags: 0x246,
            orig_rax: u64::MAX,
        }
    }

    fn thread() -> Thread {
        // Interrupted in a nanosleep, which the kernel restarts from its restart block.
        let registers = Registers {
            rax: (-516i64) as u64, // ERESTART_RESTARTBLOCK
            rsp: 0x7ffd_0000_1238,
            rip: 0x7f00_0000_2002,
            orig_rax: 35,
            ..regs()
        };
        Thread {
            registers,
            cs: 0x33,
            ss: 0x2b,
            sigmask: 0x1_0000_0002,
        }
    }

    fn word_in(bytes: &[u8], start: u64, address: u64) -> u64 {
        let at = (address - start) as usize;
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    }

    fn word(block: &Block, address: u64) -> u64 {
        word_in(&block.bytes, block.start, address)
    }

    #[test]
    fn the_kernels_buffer_becomes_a_signal_frames() {
        let x = Xstate::parse(&xstate_buffer(2440, 0x2e7 | AMX)).unwrap();
        assert_eq!(x.bytes.len(), 2440);
        let word = |at: usize| u32::from_le_bytes(x.bytes[at..at + 4].try_into().unwrap());
        // fx_sw_bytes: magic1, extended size, features (AMX left out), state size.
        assert_eq!(
            (word(464), word(468), word(480)),
            (XSTATE_MAGIC1, 2444, 2440)
        );
        assert_eq!(word(472) as u64 | (word(476) as u64) << 32, 0x2e7);
        assert_eq!((x.bytes[0], x.bytes[24]), (0x7f, 0x80));
        assert!(Xstate::parse(&xstate_buffer(2440, 0)).is_none());
        assert!(Xstate::parse(&[0u8; 500]).is_none());
    }

    #[test]
    fn the_resume_frame_holds_the_thread_as_rt_sigreturn_reads_it() {
        let x = Xstate::parse(&xstate_buffer(2440, 0x2e7)).unwrap();
        let t = thread();
        let b = block(&t, &x, 0x7f00_0000_9000);
        // Below the red zone, aligned as a call and the extended state want.
        assert!(b.start + b.bytes.len() as u64 <= t.registers.rsp - 128);
        let uc = b.sigreturn_sp + 8;
        let xstate_at = word(&b, uc + MCONTEXT_AT as u64 + 8 * 23);
        assert_eq!(xstate_at % 64, 0);
        assert_eq!(b.sigreturn_sp % 16, 8);
        assert_eq!(b.call_sp % 16, 8);
        assert!(b.call_sp + FRAME as u64 <= b.sigreturn_sp);
        assert_eq!(b.start, b.call_sp);
        assert_eq!(word(&b, b.sigreturn_sp), 0x7f00_0000_9000);
        // rt_sigreturn reads the frame at its stack pointer minus 8: the return popped.
        assert!(uc + (UCONTEXT + SIGINFO) as u64 <= xstate_at);
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
        assert_eq!(b.start + b.bytes.len() as u64, xstate_at + 2444);
        assert_eq!(word(&b, uc + SIGMASK_AT as u64), 0x1_0000_0002);
        // The extended state, then MAGIC2.
        let x_at = (xstate_at - b.start) as usize;
        assert_eq!(&b.bytes[x_at..x_at + 2440], &x.bytes[..]);
        assert_eq!(
            &b.bytes[x_at + 2440..x_at + 2444],
            &XSTATE_MAGIC2.to_le_bytes()
        );
    }

    #[test]
    fn the_release_frame_unmaps_the_page_and_returns_into_the_resume_frame() {
        let x = Xstate::parse(&xstate_buffer(1024, 0x7)).unwrap();
        let t = thread();
        let b = block(&t, &x, 0x7f00_0000_9000);
        let f = release(
            &b,
            &t,
            0x7f00_0000_9000,
            0x7f00_0000_5550,
            (0x7f11_0000_0000, 4096),
        );
        assert_eq!(f.len(), FRAME);
        let w = |address: u64| word_in(&f, b.call_sp, address);
        assert_eq!(w(b.call_sp), 0x7f00_0000_9000);
        let uc = b.call_sp + 8;
        // No extended state: SS flags only, and a null fpstate.
        assert_eq!(w(uc), 0x2 | 0x4);
        let sc = uc + MCONTEXT_AT as u64;
        let field = |i: u64| w(sc + 8 * i);
        assert_eq!((field(8), field(9)), (0x7f11_0000_0000, 4096), "rdi, rsi");
        assert_eq!((field(15), field(16)), (b.sigreturn_sp, 0x7f00_0000_5550));
        assert_eq!(field(23), 0);
        assert_eq!(w(uc + SIGMASK_AT as u64), 0x1_0000_0002);
    }

    #[test]
    fn an_interrupted_system_call_is_issued_again_on_its_instruction() {
        let mut r = regs();
        assert_eq!(resumed(&r), r);
        r.orig_rax = 232; // epoll_wait
        for restart in [-512i64, -513, -514, -516] {
            r.rax = restart as u64;
            assert_eq!((resumed(&r).rax, resumed(&r).rip), (232, r.rip - 2));
        }
        // Finished (or failed with a real error): left as it is.
        r.rax = (-4i64) as u64;
        assert_eq!(resumed(&r), r);
        r.orig_rax = u64::MAX;
        r.rax = (-512i64) as u64;
        assert_eq!(resumed(&r), r);
    }
}
