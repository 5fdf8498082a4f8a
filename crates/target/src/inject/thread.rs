//! The one thread of a target that allocscope stops (`PTRACE_SEIZE`, `PTRACE_INTERRUPT`),
//! has map a page, and sets up to call `dlopen`; let go as it was should anything fail.
//!
//! At every moment from its stop to its release the thread can be let go by the kernel
//! (allocscope killed: its tracees are detached as they are), and must then resume as it
//! was, through [`super::frame`]'s signal frames. A signal that arrives while it is stopped
//! is delivered at the next step it is let run, so that all arrive, in order.
//! `ALLOCSCOPE_INJECT_PAUSE=STEP` makes allocscope wait at a step ([`pause_at`]) for tests
//! that kill it there.

use std::{io, time::Duration};

use anyhow::Context as _;
use log::debug;

use super::frame::{self, Registers};

/// A thread stopped by `PTRACE_INTERRUPT`: let go as it was when dropped, unless a call was
/// set up ([`Stopped::call`]).
pub(super) struct Stopped {
    pub tid: u32,
    /// When it stopped.
    pub at: std::time::Instant,
    pub saved: Registers,
    raw: libc::user_regs_struct,
    /// A signal that arrived meanwhile (0: none), delivered when the thread next runs.
    pending: i32,
    /// Run since its stop (its `mmap`): it is put back where it resumes, not as it stopped.
    moved: bool,
    released: bool,
}

fn ptrace(request: libc::c_uint, tid: u32, addr: u64, data: u64) -> io::Result<libc::c_long> {
    // SAFETY: a ptrace request on a thread we trace; pointers passed are ours and valid.
    let r = unsafe {
        libc::ptrace(
            request,
            tid as libc::pid_t,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Waits for `tid`'s next stop: its signal.
fn wait_stop(tid: u32) -> io::Result<(i32, i32)> {
    let mut status = 0;
    // SAFETY: waitpid on a thread we trace, into our int.
    let r = unsafe { libc::waitpid(tid as libc::pid_t, &mut status, libc::__WALL) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    if !libc::WIFSTOPPED(status) {
        return Err(io::Error::other(format!(
            "thread {tid} ended (status {status:#x})"
        )));
    }
    Ok((libc::WSTOPSIG(status), status >> 16))
}

/// For the tests of the switch (tests/tests/attach.rs, xtask/torture): with
/// `ALLOCSCOPE_INJECT_PAUSE=STEP` allocscope says `paused at STEP` on stderr and waits there
/// a minute, to be killed; with `STEP:MS`, MS milliseconds, and goes on (signals sent
/// meanwhile). Steps: `mmap-set`, `mmap-entry`, `mmap-exit`, `restored`, `call-set`.
pub(super) fn pause_at(step: &str) {
    let Some(asked) = std::env::var_os("ALLOCSCOPE_INJECT_PAUSE") else {
        return;
    };
    let asked = asked.to_string_lossy();
    let (at, millis) = asked.split_once(':').unwrap_or((&asked, "60000"));
    if at == step {
        eprintln!("allocscope: paused at {step} (ALLOCSCOPE_INJECT_PAUSE)");
        std::thread::sleep(Duration::from_millis(millis.parse().unwrap_or(60_000)));
    }
}

/// `NT_X86_XSTATE`: the extended register state's regset.
const NT_X86_XSTATE: u64 = 0x202;
/// `-ENOSYS`: what `rax` holds at a system call's entry stop.
const ENTRY_RAX: u64 = (-38i64) as u64;

impl Stopped {
    pub(super) fn stop(tid: u32) -> io::Result<Stopped> {
        ptrace(
            libc::PTRACE_SEIZE,
            tid,
            0,
            libc::PTRACE_O_TRACESYSGOOD as u64,
        )?;
        let mut stopped = Stopped {
            tid,
            at: std::time::Instant::now(),
            saved: Registers::default(),
            // SAFETY: all-zero is a valid register set.
            raw: unsafe { std::mem::zeroed() },
            pending: 0,
            moved: false,
            released: false,
        };
        ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0)?;
        let (signal, event) = wait_stop(tid)?;
        stopped.at = std::time::Instant::now();
        if !(signal == libc::SIGTRAP && event == libc::PTRACE_EVENT_STOP) {
            // Stopped to receive a signal: it gets it when let go.
            stopped.pending = signal;
        }
        stopped.raw = stopped.get_registers()?;
        stopped.saved = from_raw(&stopped.raw);
        Ok(stopped)
    }

    /// The thread's `fs` base (its thread pointer: a C library thread's control block,
    /// at the top of its stack).
    pub(super) fn fs_base(&self) -> u64 {
        self.raw.fs_base
    }

    /// Has the system call the stop made return `EINTR` issued again (see
    /// [`super::calls::issued_again`]): whether the thread resumes by itself or through the
    /// resume frame, on its `syscall` instruction with the call's number.
    pub(super) fn issue_again(&mut self) {
        self.raw.rax = frame::ERESTARTNOINTR as u64;
        self.saved.rax = self.raw.rax;
    }

    /// The signal that stopped it, if that was not allocscope's interrupt (it is delivered
    /// when the thread next runs).
    pub(super) fn pending_signal(&self) -> i32 {
        self.pending
    }

    fn get_registers(&self) -> io::Result<libc::user_regs_struct> {
        // SAFETY: all-zero is a valid register set.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        ptrace(libc::PTRACE_GETREGS, self.tid, 0, (&raw mut regs) as u64)?;
        Ok(regs)
    }

    fn set_registers(&self, regs: &libc::user_regs_struct) -> io::Result<()> {
        ptrace(libc::PTRACE_SETREGS, self.tid, 0, (&raw const *regs) as u64).map(drop)
    }

    /// The registers to let it go with from any stop: where it resumes, no system call
    /// left for the kernel to restart.
    fn resumed_raw(&self) -> libc::user_regs_struct {
        let resumed = frame::resumed(&self.saved);
        let mut regs = self.raw;
        regs.rax = resumed.rax;
        regs.rip = resumed.rip;
        regs.orig_rax = u64::MAX;
        regs
    }

    /// What a signal frame needs of the thread: its extended state (`None` where the
    /// kernel gives none a frame can hold) and its signal mask.
    pub(super) fn state(&self, pid: u32) -> anyhow::Result<(frame::Thread, frame::Xstate)> {
        let mut buffer = vec![0u8; 64 * 1024];
        let mut iov = libc::iovec {
            iov_base: buffer.as_mut_ptr().cast(),
            iov_len: buffer.len(),
        };
        ptrace(
            libc::PTRACE_GETREGSET,
            self.tid,
            NT_X86_XSTATE,
            (&raw mut iov) as u64,
        )
        .context("reading its extended register state")?;
        buffer.truncate(iov.iov_len);
        let xstate = frame::Xstate::parse(&buffer)
            .context("its extended register state has no signal-frame layout")?;
        let status =
            crate::sys::process::thread_status(pid, self.tid).context("reading its signal mask")?;
        let sigmask = crate::sys::process::status_field(&status, "SigBlk")
            .and_then(|m| u64::from_str_radix(m, 16).ok())
            .context("no signal mask in its status")?;
        let thread = frame::Thread {
            registers: self.saved,
            cs: self.raw.cs,
            ss: self.raw.ss,
            sigmask,
        };
        Ok((thread, xstate))
    }

    /// Has the thread call the C library's `mmap` (at `mmap`) for `len` bytes, readable and
    /// writable (never executable), returning into `block`'s resume frame; stops it as the
    /// system call returns, and puts it back. The page's address.
    pub(super) fn map_page(
        &mut self,
        mmap: u64,
        len: u64,
        block: &frame::Block,
    ) -> anyhow::Result<u64> {
        let mut regs = self.raw;
        regs.rip = mmap;
        regs.rdi = 0;
        regs.rsi = len;
        regs.rdx = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        regs.rcx = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        regs.r8 = u64::MAX;
        regs.r9 = 0;
        regs.rsp = block.sigreturn_sp;
        regs.rax = 0;
        regs.orig_rax = u64::MAX;
        self.set_registers(&regs)?;
        self.moved = true;
        pause_at("mmap-set");
        let exit = self.until_exit_of(libc::SYS_mmap as u64, block.sigreturn_sp)?;
        pause_at("mmap-exit");
        // Back to where it resumes, should anything below fail.
        self.set_registers(&self.resumed_raw())?;
        pause_at("restored");
        let address = exit.rax as i64;
        if address < 0 {
            anyhow::bail!(
                "mmap in the target: {}",
                io::Error::from_raw_os_error(-address as i32)
            );
        }
        Ok(address as u64)
    }

    /// Runs the thread to the exit of system call `number` made with stack pointer `sp` (its
    /// own: a signal that arrives meanwhile is delivered, and its handler runs, system calls
    /// and all, before the call is made); its registers there.
    fn until_exit_of(&mut self, number: u64, sp: u64) -> anyhow::Result<libc::user_regs_struct> {
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            let deliver = std::mem::take(&mut self.pending);
            ptrace(libc::PTRACE_SYSCALL, self.tid, 0, deliver as u64)?;
            let (signal, event) = wait_stop(self.tid)?;
            if signal != libc::SIGTRAP | 0x80 {
                if event == 0 {
                    // A signal on the way: delivered as the thread runs on.
                    self.pending = signal;
                }
                continue;
            }
            let regs = self.get_registers()?;
            // A handler's calls are made on the stack below the call's frame.
            let ours = regs.orig_rax == number && (sp - 256..=sp + 8).contains(&regs.rsp);
            if regs.rax == ENTRY_RAX {
                if ours {
                    pause_at("mmap-entry");
                }
                continue;
            }
            if ours {
                return Ok(regs);
            }
        }
        anyhow::bail!("system call {number} did not return within 2 s")
    }

    /// Sets the thread up to call `function(first, second)` with stack pointer `sp` (its
    /// return address there: see [`frame::Block::call_sp`]), and lets it go.
    pub(super) fn call(
        &mut self,
        function: u64,
        (first, second): (u64, u64),
        sp: u64,
    ) -> anyhow::Result<()> {
        let mut regs = self.raw;
        regs.rip = function;
        regs.rdi = first;
        regs.rsi = second;
        regs.rsp = sp;
        regs.rax = 0;
        regs.orig_rax = u64::MAX;
        self.set_registers(&regs)?;
        pause_at("call-set");
        ptrace(libc::PTRACE_DETACH, self.tid, 0, self.pending as u64)?;
        self.released = true;
        Ok(())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let regs = if self.moved {
            self.resumed_raw()
        } else {
            self.raw
        };
        if let Err(e) = self.set_registers(&regs) {
            debug!("thread {}: restoring its registers: {e}", self.tid);
        }
        if let Err(e) = ptrace(libc::PTRACE_DETACH, self.tid, 0, self.pending as u64) {
            debug!("thread {}: letting it go: {e}", self.tid);
        }
    }
}

fn from_raw(r: &libc::user_regs_struct) -> Registers {
    Registers {
        rax: r.rax,
        rbx: r.rbx,
        rcx: r.rcx,
        rdx: r.rdx,
        rsi: r.rsi,
        rdi: r.rdi,
        rbp: r.rbp,
        rsp: r.rsp,
        r8: r.r8,
        r9: r.r9,
        r10: r.r10,
        r11: r.r11,
        r12: r.r12,
        r13: r.r13,
        r14: r.r14,
        r15: r.r15,
        rip: r.rip,
        eflags: r.eflags,
        orig_rax: r.orig_rax,
    }
}
