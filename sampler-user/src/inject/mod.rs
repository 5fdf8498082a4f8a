//! Loading allocscope's in-process sampler into a running process (`record -p`, `top -p`),
//! by itself: no debugger on the host.
//!
//! One thread of the target is stopped with `ptrace` (`PTRACE_SEIZE`, `PTRACE_INTERRUPT`:
//! the others run on), at a point where it holds neither the allocator's nor the loader's
//! lock ([`safe`]). Made to run one system call, it maps a page for allocscope ([`stub`]:
//! the library's path, its registers, and the code that puts them back); then it is set up
//! to call the C library's `dlopen` on the library, returning into that code, and let go.
//! It loads the library (whose constructor routes the program's allocator calls to itself:
//! see `sampler-preload`'s `route`) and resumes where it was, on its own. allocscope waits
//! for the result word. The thread is stopped only for the set-up; the loading is timed
//! too. Both are said with `-v`.
//!
//! Refused, for uprobes to take the process instead (each said): a process under a seccomp
//! filter, one traced already, one whose C library has no `dlopen` (static, or glibc before
//! 2.34), one where the library's path is another file (another mount namespace), and
//! wherever the kernel refuses `ptrace` (Yama).

mod safe;
mod stub;

use std::{
    fs::File,
    io,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use log::debug;

use crate::probe::maps::{self, FileId, Vma};

/// A library loaded into a process.
#[derive(Debug)]
pub struct Loaded {
    /// The thread that loaded it.
    pub tid: u32,
    /// How long that thread was stopped (the set-up).
    pub stopped: Duration,
    /// From its release to the library's `dlopen` returning.
    pub loading: Duration,
}

impl std::fmt::Display for Loaded {
    /// "thread T stopped 0.10 ms; loaded in 0.86 ms" (what `-v` says of each load).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "thread {} stopped {:.2} ms; loaded in {:.2} ms",
            self.tid,
            self.stopped.as_secs_f64() * 1e3,
            self.loading.as_secs_f64() * 1e3
        )
    }
}

/// Why allocscope's sampler was not loaded into a process.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The kernel refused to trace it (Yama, privileges).
    #[error("ptrace refused: {0}")]
    Ptrace(io::Error),
    /// Another tracer (a debugger) has it.
    #[error("traced by pid {0} already")]
    Traced(u32),
    /// Its filter could forbid what the library does.
    #[error("under a seccomp filter")]
    Seccomp,
    /// Stopped (SIGSTOP, a debugger's stop): its thread would not run the loading.
    #[error("stopped")]
    Stopped,
    /// Nothing to load a library with.
    #[error("no dlopen in its C library (statically linked, or glibc before 2.34)")]
    NoDlopen,
    /// Its mount namespace has another file (or none) at the library's path.
    #[error("the library's path is another file in its mount namespace")]
    Namespace,
    /// Every thread stayed inside the allocator or the loader.
    #[error("no thread outside the allocator and the loader within {0:?}")]
    Busy(Duration),
    /// `dlopen` returned null.
    #[error("its loader could not open the library")]
    Dlopen,
    /// Anything else (the process ended meanwhile…).
    #[error("{0:#}")]
    Failed(anyhow::Error),
}

/// How long to look for a thread at a safe point.
const SAFE_POINT_WITHIN: Duration = Duration::from_secs(2);
/// How long the loading may take.
const LOADING_WITHIN: Duration = Duration::from_secs(10);
const RTLD_NOW: u64 = 2;

/// Loads `library` into process `pid`.
pub fn load(pid: u32, library: &Path) -> Result<Loaded, Refused> {
    if crate::procfs::seccomp_mode(pid).is_some_and(|m| m != 0) {
        return Err(Refused::Seccomp);
    }
    if matches!(crate::procfs::state_of(pid), Some('T' | 't')) {
        return Err(Refused::Stopped);
    }
    if let Some(tracer) = crate::procfs::tracer_of(pid).filter(|&t| t != 0) {
        return Err(Refused::Traced(tracer));
    }
    let same = |a: &Path, b: &Path| {
        let id = |p: &Path| std::fs::metadata(p).ok().map(|m| FileId::of(&m));
        id(a).is_some() && id(a) == id(b)
    };
    let inside =
        PathBuf::from(format!("/proc/{pid}/root")).join(library.strip_prefix("/").map_err(
            |_| Refused::Failed(anyhow::anyhow!("{} is not absolute", library.display())),
        )?);
    if !same(library, &inside) {
        return Err(Refused::Namespace);
    }
    let vmas = maps::read(pid)
        .with_context(|| format!("reading the maps of pid {pid}"))
        .map_err(Refused::Failed)?;
    let (dlopen, syscall) = entry_points(pid, &vmas)?;
    let path = library.as_os_str().as_encoded_bytes();
    let mem = File::options()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|e| Refused::Failed(anyhow::Error::new(e).context("opening its memory")))?;
    let started = Instant::now();
    let mut stopped = take_a_thread(pid, &vmas, started)?;
    let tid = stopped.tid;
    let page = stopped
        .map_page(syscall)
        .map_err(|e| Refused::Failed(e.context("mapping a page in the target")))?;
    let code = stub::page(&stopped.resume_registers(), path)
        .context("the library's path is too long")
        .map_err(Refused::Failed)?;
    mem.write_all_at(&code, page)
        .map_err(|e| Refused::Failed(anyhow::Error::new(e).context("writing the page")))?;
    stopped
        .call(
            &mem,
            dlopen,
            page + stub::PATH as u64,
            RTLD_NOW,
            page + stub::CODE as u64,
        )
        .map_err(Refused::Failed)?;
    let stop_ended = Instant::now();
    let stopped = stop_ended - started;
    let result = wait_for_result(&mem, page + stub::RESULT as u64)?;
    let loading = stop_ended.elapsed();
    debug!("pid {pid}: thread {tid} stopped {stopped:?}, the library loaded in {loading:?}");
    if result == 0 {
        return Err(Refused::Dlopen);
    }
    Ok(Loaded {
        tid,
        stopped,
        loading,
    })
}

/// The C library's `dlopen` and a `syscall` instruction of its code, in `pid`.
fn entry_points(pid: u32, vmas: &[Vma]) -> Result<(u64, u64), Refused> {
    let libc = vmas
        .iter()
        .find(|v| {
            v.path
                .as_deref()
                .and_then(Path::file_name)
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        })
        .ok_or(Refused::NoDlopen)?;
    let file = PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        libc.start, libc.end
    ));
    let [dlopen, syscall] =
        crate::preload::symbol_addresses(pid, vmas, &file, ["dlopen", "syscall"])
            .map_err(|_| Refused::NoDlopen)?;
    // `syscall(3)` makes its system call within its first few instructions.
    let mut code = [0u8; 64];
    File::open(format!("/proc/{pid}/mem"))
        .and_then(|f| f.read_exact_at(&mut code, syscall))
        .map_err(|e| Refused::Failed(anyhow::Error::new(e).context("reading syscall(3)")))?;
    let at = code
        .windows(2)
        .position(|w| w == [0x0f, 0x05])
        .context("no syscall instruction in syscall(3)")
        .map_err(Refused::Failed)?;
    Ok((dlopen, syscall + at as u64))
}

/// Stops a thread of `pid` at a safe point ([`safe`]), the main thread first, trying again
/// until [`SAFE_POINT_WITHIN`] has passed since `started`.
fn take_a_thread(pid: u32, vmas: &[Vma], started: Instant) -> Result<Stopped, Refused> {
    loop {
        let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map_err(|e| Refused::Failed(e.into()))?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        tids.sort_by_key(|&t| (t != pid, t));
        for tid in tids {
            let stopped = match Stopped::stop(tid) {
                Ok(s) => s,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                Err(e) => return Err(Refused::Ptrace(e)),
            };
            match safe::check(stopped.saved.rip, stopped.saved.orig_rax, vmas) {
                Ok(()) => return Ok(stopped),
                Err(why) => debug!("pid {pid}: thread {tid} not now: {why:?}"),
            }
        }
        if started.elapsed() > SAFE_POINT_WITHIN {
            return Err(Refused::Busy(SAFE_POINT_WITHIN));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Polls the result word until `dlopen` has returned.
fn wait_for_result(mem: &File, at: u64) -> Result<u64, Refused> {
    let deadline = Instant::now() + LOADING_WITHIN;
    loop {
        let mut word = [0u8; 8];
        mem.read_exact_at(&mut word, at)
            .map_err(|e| Refused::Failed(anyhow::Error::new(e).context("reading the result")))?;
        let value = u64::from_le_bytes(word);
        if value != stub::PENDING {
            return Ok(value);
        }
        if Instant::now() > deadline {
            return Err(Refused::Failed(anyhow::anyhow!(
                "the library was still loading after {LOADING_WITHIN:?}"
            )));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A thread stopped by `PTRACE_INTERRUPT`: let go as it was when dropped, unless a call was
/// set up ([`Stopped::call`]).
struct Stopped {
    tid: u32,
    saved: stub::Registers,
    raw: libc::user_regs_struct,
    /// A signal that arrived meanwhile, delivered when the thread is let go.
    pending: i32,
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

impl Stopped {
    fn stop(tid: u32) -> io::Result<Stopped> {
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
    fn resume_registers(&self) -> stub::Registers {
        stub::resumed(&self.saved)
    }

    /// Has the thread map one page, readable, writable and executable, through the
    /// `syscall` instruction at `syscall`; its address.
    fn map_page(&mut self, syscall: u64) -> anyhow::Result<u64> {
        let mut regs = self.raw;
        regs.rip = syscall;
        regs.rax = libc::SYS_mmap as u64;
        regs.rdi = 0;
        regs.rsi = stub::PAGE as u64;
        regs.rdx = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
        regs.r10 = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        regs.r8 = u64::MAX;
        regs.r9 = 0;
        regs.orig_rax = u64::MAX;
        self.set_registers(&regs)?;
        // To the system call's entry, then its exit.
        for _ in 0..2 {
            loop {
                ptrace(libc::PTRACE_SYSCALL, self.tid, 0, 0)?;
                let (signal, event) = wait_stop(self.tid)?;
                if signal == libc::SIGTRAP | 0x80 {
                    break;
                }
                if event == 0 {
                    // A signal on the way: kept for when the thread is let go.
                    self.pending = signal;
                }
            }
        }
        let after = self.get_registers()?;
        // Back to where it was stopped, should anything below fail.
        self.set_registers(&self.raw)?;
        let address = after.rax as i64;
        if address < 0 {
            anyhow::bail!(
                "mmap in the target: {}",
                io::Error::from_raw_os_error(-address as i32)
            );
        }
        Ok(address as u64)
    }

    /// Sets the thread up to call `function(first, second)` returning to `back`, on its
    /// stack below its red zone, and lets it go.
    fn call(
        &mut self,
        mem: &File,
        function: u64,
        first: u64,
        second: u64,
        back: u64,
    ) -> anyhow::Result<()> {
        // Below the red zone, 16-byte aligned at the call (the return address pushed).
        let sp = ((self.raw.rsp - 256) & !15) - 8;
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
        if let Err(e) = self.set_registers(&self.raw) {
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
