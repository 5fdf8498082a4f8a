//! The page allocscope maps into a target to load its library: the path to open, the
//! thread's registers as they were when it was stopped, a word the result lands in, and
//! the code `dlopen` returns to, which puts every register back (the extended state with
//! `XRSTOR`, from the block on the thread's stack: see [`super::frame`]) and jumps to
//! where the thread was.
//!
//! Why a stub and not a breakpoint: the thread is let go (detached) as soon as the call is
//! set up, and finds its own way back. If allocscope is killed at any moment after that —
//! or even before it detaches, since the kernel then detaches the thread as it is — the
//! thread completes the call and resumes exactly as it was; a breakpoint left for a tracer
//! that is gone would kill the process with SIGTRAP. The thread's stop is the set-up only.
//!
//! A thread stopped inside a system call that the kernel would have restarted (the usual
//! case: `epoll_wait`, `read`, `nanosleep` interrupted by the stop) is put back *on* its
//! `syscall` instruction with the call's number, which restarts it as the kernel would
//! have.
//!
//! Pure: bytes from registers, tested by decoding them.

/// The registers the stub restores (x86-64, as `PTRACE_GETREGS` gives them).
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
const ERESTARTNOINTR: i64 = -513;
const ERESTARTNOHAND: i64 = -514;
pub(super) const ERESTART_RESTARTBLOCK: i64 = -516;
const NR_RESTART_SYSCALL: u64 = 219;
/// Length of the `syscall` instruction.
const SYSCALL_LEN: u64 = 2;

/// Where the thread resumes, in user space, with no tracer: a system call the stop
/// interrupted is restarted as the kernel would have on resuming it.
pub(super) fn resumed(regs: &Registers) -> Registers {
    let mut out = *regs;
    if (regs.orig_rax as i64) < 0 {
        return out;
    }
    match regs.rax as i64 {
        ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND => {
            out.rax = regs.orig_rax;
            out.rip = regs.rip - SYSCALL_LEN;
        }
        ERESTART_RESTARTBLOCK => {
            out.rax = NR_RESTART_SYSCALL;
            out.rip = regs.rip - SYSCALL_LEN;
        }
        _ => {}
    }
    out
}

/// Value of the result word until `dlopen` returns.
pub(super) const PENDING: u64 = u64::MAX;

/// Offsets within the page.
pub(super) const CODE: usize = 0;
const SAVED: usize = 1024;
/// The result word (`dlopen`'s handle, 0 when it failed).
pub(super) const RESULT: usize = 1024 + 8 * 20;
/// The NUL-terminated path of the library.
pub(super) const PATH: usize = 2048;
pub(super) const PAGE: usize = 4096;

/// Register order in the saved area and the restore sequence: (index for `mov r64`, value).
fn order(regs: &Registers) -> [(u8, u64); 15] {
    [
        (0, regs.rax),
        (3, regs.rbx),
        (1, regs.rcx),
        (2, regs.rdx),
        (6, regs.rsi),
        (7, regs.rdi),
        (5, regs.rbp),
        (8, regs.r8),
        (9, regs.r9),
        (10, regs.r10),
        (11, regs.r11),
        (12, regs.r12),
        (13, regs.r13),
        (14, regs.r14),
        (15, regs.r15),
    ]
}

/// The thread's extended register state: where it was saved (64-byte aligned, on the
/// thread's stack above the call: see [`super::frame`]) and the components to restore.
#[derive(Clone, Copy, Debug)]
pub(super) struct Extended {
    pub at: u64,
    pub mask: u64,
}

/// The page: code at [`CODE`], `regs` (where the thread resumes: see [`resumed`]) saved,
/// [`RESULT`] set to [`PENDING`], `path` at [`PATH`]; the code restores `extended` too.
/// `None` when the path does not fit.
pub(super) fn page(regs: &Registers, extended: Extended, path: &[u8]) -> Option<Vec<u8>> {
    if path.contains(&0) || PATH + path.len() + 1 > PAGE {
        return None;
    }
    let mut page = vec![0u8; PAGE];
    let registers = order(regs);
    // Saved area: the 15 registers, then rsp, rip, eflags.
    let mut slot = SAVED;
    for (_, value) in registers {
        page[slot..slot + 8].copy_from_slice(&value.to_le_bytes());
        slot += 8;
    }
    let rsp_at = slot;
    let rip_at = slot + 8;
    let flags_at = slot + 16;
    page[rsp_at..rsp_at + 8].copy_from_slice(&regs.rsp.to_le_bytes());
    page[rip_at..rip_at + 8].copy_from_slice(&regs.rip.to_le_bytes());
    page[flags_at..flags_at + 8].copy_from_slice(&regs.eflags.to_le_bytes());
    page[RESULT..RESULT + 8].copy_from_slice(&PENDING.to_le_bytes());
    page[PATH..PATH + path.len()].copy_from_slice(path);

    let mut code = Code::default();
    // mov [rip+RESULT], rax: the handle.
    code.rip_relative(&[0x48, 0x89], 0, RESULT);
    // movabs rcx, at; mov eax, mask; mov edx, mask >> 32; xrstor64 [rcx]: the vector
    // registers, MXCSR and the x87 state, which `dlopen`'s string functions use.
    code.bytes.extend_from_slice(&[0x48, 0xb9]);
    code.bytes.extend_from_slice(&extended.at.to_le_bytes());
    code.bytes.push(0xb8);
    code.bytes
        .extend_from_slice(&(extended.mask as u32).to_le_bytes());
    code.bytes.push(0xba);
    code.bytes
        .extend_from_slice(&((extended.mask >> 32) as u32).to_le_bytes());
    code.bytes.extend_from_slice(&[0x48, 0x0f, 0xae, 0x29]);
    // lea rsp, [rip+flags]; popfq: the flags (before anything that sets them).
    code.rip_relative(&[0x48, 0x8d], 4, flags_at);
    code.bytes.push(0x9d);
    // mov rsp, [rip+rsp_at]
    code.rip_relative(&[0x48, 0x8b], 4, rsp_at);
    for (i, (reg, _)) in registers.iter().enumerate() {
        let rex = 0x48 | if *reg >= 8 { 0x04 } else { 0 };
        code.rip_relative(&[rex, 0x8b], reg & 7, SAVED + 8 * i);
    }
    // jmp [rip+rip_at]
    code.rip_relative(&[0xff], 4, rip_at);
    if code.bytes.len() > SAVED {
        return None;
    }
    page[CODE..CODE + code.bytes.len()].copy_from_slice(&code.bytes);
    Some(page)
}

#[derive(Default)]
struct Code {
    bytes: Vec<u8>,
}

impl Code {
    /// `opcode` with a ModRM of `reg` and a RIP-relative operand at page offset `target`.
    fn rip_relative(&mut self, opcode: &[u8], reg: u8, target: usize) {
        self.bytes.extend_from_slice(opcode);
        self.bytes.push(0x05 | (reg << 3));
        let next = CODE + self.bytes.len() + 4;
        let displacement = target as i64 - next as i64;
        self.bytes
            .extend_from_slice(&(displacement as i32).to_le_bytes());
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Formatter as _, IntelFormatter};

    /// A register set whose general registers hold their own ModRM-order numbers.
    pub(in crate::inject) fn regs() -> Registers {
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

    fn listing(page: &[u8], base: u64) -> Vec<String> {
        let mut decoder = Decoder::with_ip(64, &page[..SAVED], base, DecoderOptions::NONE);
        let mut formatter = IntelFormatter::new();
        let mut out = Vec::new();
        for instruction in &mut decoder {
            let mut text = String::new();
            formatter.format(&instruction, &mut text);
            out.push(text);
            if instruction.mnemonic() == iced_x86::Mnemonic::Jmp {
                break;
            }
        }
        out
    }

    #[test]
    fn the_stub_saves_the_result_restores_every_register_and_jumps_back() {
        let base = 0x7f00_0000_0000u64;
        let extended = Extended {
            at: 0x7ffd_0000_0c40,
            mask: 0x2_0000_02e7,
        };
        let page = page(&regs(), extended, b"/run/allocscope/x/lib.so").unwrap();
        let mut code = listing(&page, base);
        let at = |offset: usize| format!("{:X}h", base + offset as u64);
        assert_eq!(code[0], format!("mov [{}],rax", at(RESULT)));
        let restore: Vec<String> = code.drain(1..5).collect();
        assert_eq!(
            restore,
            [
                "mov rcx,7FFD00000C40h",
                "mov eax,2E7h",
                "mov edx,2",
                "xrstor64 [rcx]"
            ]
        );
        assert!(code[1].starts_with("lea rsp,"), "{code:?}");
        assert_eq!(code[2], "popfq");
        assert!(code[3].starts_with("mov rsp,"), "{code:?}");
        let restored: Vec<&str> = code[4..19]
            .iter()
            .map(|l| l.split([' ', ',']).nth(1).unwrap())
            .collect();
        assert_eq!(
            restored,
            [
                "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "r8", "r9", "r10", "r11", "r12",
                "r13", "r14", "r15"
            ]
        );
        assert!(code[19].starts_with("jmp qword ptr"), "{code:?}");
        // Each load reads the slot holding that register's value.
        let value =
            |offset: usize| u64::from_le_bytes(page[offset..offset + 8].try_into().unwrap());
        for (i, expected) in [1u64, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
            .iter()
            .enumerate()
        {
            assert_eq!(value(SAVED + 8 * i), *expected);
            assert!(code[4 + i].contains(&at(SAVED + 8 * i)), "{}", code[4 + i]);
        }
        assert_eq!(value(SAVED + 8 * 15), regs().rsp);
        assert_eq!(value(SAVED + 8 * 16), regs().rip);
        assert_eq!(value(SAVED + 8 * 17), 0x246);
        assert!(code[3].contains(&at(SAVED + 8 * 15)));
        assert!(code[19].contains(&at(SAVED + 8 * 16)));
        assert!(code[1].contains(&at(SAVED + 8 * 17)));
        assert_eq!(value(RESULT), PENDING);
        assert_eq!(&page[PATH..PATH + 25], b"/run/allocscope/x/lib.so\0");
    }

    #[test]
    fn an_interrupted_system_call_is_restarted_on_its_instruction() {
        let mut r = regs();
        r.orig_rax = 232; // epoll_wait
        r.rax = ERESTARTNOHAND as u64;
        let back = resumed(&r);
        assert_eq!((back.rax, back.rip), (232, r.rip - 2));
        r.rax = ERESTART_RESTARTBLOCK as u64;
        assert_eq!(resumed(&r).rax, NR_RESTART_SYSCALL);
        // Finished (or failed with a real error): left as it is.
        r.rax = (-4i64) as u64;
        assert_eq!(resumed(&r), r);
        r.orig_rax = u64::MAX;
        r.rax = ERESTARTSYS as u64;
        assert_eq!(resumed(&r), r);
    }

    #[test]
    fn a_path_that_does_not_fit_is_refused() {
        let extended = Extended { at: 0, mask: 3 };
        assert!(page(&regs(), extended, &[b'a'; 3000]).is_none());
        assert!(page(&regs(), extended, b"a\0b").is_none());
    }
}
