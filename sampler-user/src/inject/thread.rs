//! The one thread of a target that allocscope stops (`PTRACE_SEIZE`, `PTRACE_INTERRUPT`),
//! has map a page, and sets up to call `dlopen`; let go as it was should anything fail.
//!
//! At every moment from its stop to its release the thread can be let go by the kernel
//! (allocscope killed: its tracees are detached as they are), and must then resume as it
//! was: before the page exists the thread is sent through [`super::frame`]'s signal frame,
//! after it through the stub's code ([`super::stub`]). `ALLOCSCOPE_INJECT_PAUSE=STEP`
//! makes allocscope wait at a step ([`pause_at`]) for tests that kill it there.

use std::{fs::File, io, os::unix::fs::FileExt as _, time::Duration};

use anyhow::Context as _;
use log::debug;

use super::{frame, stub};

/// A thread stopped by `PTRACE_INTERRUPT`: let go as it was when dropped, unless a call was
/// set up ([`Stopped::call`]).
pub(super) struct Stopped {
    pub tid: u32,
    pub saved: stub::Registers,
    raw: libc::user_regs_struct,
    /// A signal that arrived meanwhile, delivered when the thread is let go.
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

/// For the tests of the switch (tests/tests/attach.rs): with `ALLOCSCOPE_INJECT_PAUSE=STEP`
/// allocscope says `paused at STEP` on stderr and waits there a minute, to be killed.
/// Steps: `mmap-set`, `mmap-entry`, `mmap-exit`, `restored`, `call-set`.
pub(super) fn pause_at(step: &str) {
    if std::env::var_os("ALLOCSCOPE_INJECT_PAUSE").is_some_and(|s| s == step) {
        eprintln!("allocscope: paused at {step} (ALLOCSCOPE_INJECT_PAUSE)");
        std::thread::sleep(Duration::from_secs(60));
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
            saved: stub::Registers::default(),
            // SAFETY: all-zero is a valid register set.
            raw: unsafe { std::mem::zeroed() },
            pending: 0,
            moved: false,
            released: false,
        };
        ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0)?;
        let (signal, event) = wait_stop(tid)?;
        if !(signal == libc::SIGTRAP && event == libc::PTRACE_EVENT_STOP) {
            // Stopped to receive a signal: it gets it when let go.
            stopped.pending = signal;
        }
        stopped.raw = stopped.get_registers()?;
        stopped.saved = from_raw(&stopped.raw);
        Ok(stopped)
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

    /// Where the thread resumes once the call returns (see [`stub::resumed`]).
    pub(super) fn resume_registers(&self) -> stub::Registers {
        stub::resumed(&self.saved)
    }

    /// The registers to let it go with from any stop: where it resumes, no system call
    /// left for the kernel to restart.
    fn resumed_raw(&self) -> libc::user_regs_struct {
        let resumed = self.resume_registers();
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

    /// Has the thread call the C library's `mmap` (at `mmap`) for one page, readable,
    /// writable and executable, returning into `block`'s signal frame; stops it as the
    /// system call returns, and puts it back. The page's address.
    pub(super) fn map_page(&mut self, mmap: u64, block: &frame::Block) -> anyhow::Result<u64> {
        let mut regs = self.raw;
        regs.rip = mmap;
        regs.rdi = 0;
        regs.rsi = stub::PAGE as u64;
        regs.rdx = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
        regs.rcx = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        regs.r8 = u64::MAX;
        regs.r9 = 0;
        regs.rsp = block.sigreturn_sp;
        regs.rax = 0;
        regs.orig_rax = u64::MAX;
        self.set_registers(&regs)?;
        self.moved = true;
        pause_at("mmap-set");
        let exit = self.until_exit_of(libc::SYS_mmap as u64)?;
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

    /// Runs the thread to the exit of system call `number` (its first), a few stops at
    /// most; its registers there.
    fn until_exit_of(&mut self, number: u64) -> anyhow::Result<libc::user_regs_struct> {
        for _ in 0..8 {
            ptrace(libc::PTRACE_SYSCALL, self.tid, 0, 0)?;
            let (signal, event) = wait_stop(self.tid)?;
            if signal != libc::SIGTRAP | 0x80 {
                if event == 0 {
                    // A signal on the way: kept for when the thread is let go.
                    self.pending = signal;
                }
                continue;
            }
            let regs = self.get_registers()?;
            if regs.rax == ENTRY_RAX {
                pause_at("mmap-entry");
                continue;
            }
            anyhow::ensure!(
                regs.orig_rax == number,
                "the thread made system call {} instead of {number}",
                regs.orig_rax as i64
            );
            return Ok(regs);
        }
        anyhow::bail!("system call {number} did not return")
    }

    /// Sets the thread up to call `function(first, second)` returning to `back`, its stack
    /// pointer `sp` (below the block: see [`frame::Block::call_sp`]), and lets it go.
    pub(super) fn call(
        &mut self,
        mem: &File,
        function: u64,
        (first, second): (u64, u64),
        back: u64,
        sp: u64,
    ) -> anyhow::Result<()> {
        mem.write_all_at(&back.to_le_bytes(), sp)
            .context("writing the return address")?;
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

fn from_raw(r: &libc::user_regs_struct) -> stub::Registers {
    stub::Registers {
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
