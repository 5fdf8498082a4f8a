//! Loading allocscope's in-process sampler into a running process (`record -p`, `top -p`),
//! by itself: no debugger on the host.
//!
//! One thread of the target is stopped with `ptrace` (`PTRACE_SEIZE`, `PTRACE_INTERRUPT`:
//! the others run on), at a point where it holds neither the allocator's nor the loader's
//! lock ([`safe`], [`thread`]). A block on its stack holds its extended register state and a
//! signal frame of it as it was ([`frame`]); made to call `mmap` returning through that
//! frame, it maps a page for allocscope ([`stub`]: the library's path, its registers, and
//! the code that puts them all back); then it is set up to call the C library's `dlopen` on
//! the library, returning into that code, and let go. From its stop on, allocscope killed at
//! any moment leaves it resuming as it was.
//! It loads the library (whose constructor routes the program's allocator calls to itself:
//! see `sampler-preload`'s `route`) and resumes where it was, on its own. allocscope waits
//! for the result word. The thread is stopped only for the set-up; the loading is timed
//! too. Both are said with `-v`.
//!
//! Refused, for uprobes to take the process instead (each said): a process under a seccomp
//! filter, one traced already, one whose C library has no `dlopen` (static, or glibc before
//! 2.34), one where the library's path is another file (another mount namespace), and
//! wherever the kernel refuses `ptrace` (Yama).

mod frame;
mod safe;
mod stub;
mod thread;

use std::{
    fs::File,
    io,
    os::unix::fs::FileExt as _,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use log::debug;

use crate::sys::maps::{self, FileId, Vma};
use thread::Stopped;

/// A library loaded into a process.
#[derive(Debug)]
pub(crate) struct Loaded {
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
pub(crate) enum Refused {
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
pub(crate) fn load(pid: u32, library: &Path) -> Result<Loaded, Refused> {
    if crate::sys::process::seccomp_mode(pid).is_some_and(|m| m != 0) {
        return Err(Refused::Seccomp);
    }
    if matches!(crate::sys::process::state_of(pid), Some('T' | 't')) {
        return Err(Refused::Stopped);
    }
    if let Some(tracer) = crate::sys::process::tracer_of(pid).filter(|&t| t != 0) {
        return Err(Refused::Traced(tracer));
    }
    let same = |a: &Path, b: &Path| {
        let id = |p: &Path| std::fs::metadata(p).ok().map(|m| FileId::of(&m));
        id(a).is_some() && id(a) == id(b)
    };
    if !library.is_absolute() {
        let failed = anyhow::anyhow!("{} is not absolute", library.display());
        return Err(Refused::Failed(failed));
    }
    let inside = crate::sys::process::in_root(pid, library.as_os_str());
    if !same(library, &inside) {
        return Err(Refused::Namespace);
    }
    let vmas = maps::read(pid)
        .with_context(|| format!("reading the maps of pid {pid}"))
        .map_err(Refused::Failed)?;
    let mem = crate::sys::memory::open_writable(pid)
        .map_err(|e| Refused::Failed(anyhow::Error::new(e).context("opening its memory")))?;
    let entry = entry_points(pid, &vmas, &mem)?;
    let path = library.as_os_str().as_encoded_bytes();
    let started = Instant::now();
    let mut stopped = take_a_thread(pid, &vmas, started)?;
    let tid = stopped.tid;
    let page = switch(&mut stopped, pid, &mem, &entry, path).map_err(Refused::Failed)?;
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

/// What the switch calls in the target's C library.
struct EntryPoints {
    dlopen: u64,
    mmap: u64,
    /// `__restore_rt` (`mov rax, 15; syscall`), which signal handlers return into.
    restore_rt: u64,
}

/// Most code of a C library read to find `__restore_rt` (glibc's is under 2 MiB): a
/// mapping named so but larger is not read.
const MAX_LIBC_CODE: u64 = 64 << 20;

/// `__restore_rt`'s code in glibc (x86-64).
const RESTORE_RT: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// The C library's `dlopen`, `mmap` and `__restore_rt`, in `pid` (its memory `mem`).
fn entry_points(pid: u32, vmas: &[Vma], mem: &File) -> Result<EntryPoints, Refused> {
    let is_libc = |v: &&Vma| {
        v.path
            .as_deref()
            .and_then(Path::file_name)
            .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
    };
    let libc = vmas.iter().find(is_libc).ok_or(Refused::NoDlopen)?;
    let file = libc.file_in(pid);
    let [dlopen, mmap] = crate::preload::symbol_addresses(pid, vmas, &file, ["dlopen", "mmap"])
        .map_err(|_| Refused::NoDlopen)?;
    // Not exported: found by its bytes in the library's code.
    let code = vmas
        .iter()
        .filter(is_libc)
        .find(|v| v.executable && v.file_id == libc.file_id)
        .filter(|v| v.end - v.start <= MAX_LIBC_CODE)
        .ok_or(Refused::NoDlopen)?;
    let mut bytes = vec![0u8; (code.end - code.start) as usize];
    mem.read_exact_at(&mut bytes, code.start)
        .map_err(|e| Refused::Failed(anyhow::Error::new(e).context("reading its C library")))?;
    let at = bytes
        .windows(RESTORE_RT.len())
        .position(|w| w == RESTORE_RT)
        .context("no __restore_rt in its C library")
        .map_err(Refused::Failed)?;
    Ok(EntryPoints {
        dlopen,
        mmap,
        restore_rt: code.start + at as u64,
    })
}

/// The switch, on a thread stopped at a safe point: the block on its stack, the page,
/// the call to `dlopen` set up, and the thread let go. The page's address.
fn switch(
    stopped: &mut Stopped,
    pid: u32,
    mem: &File,
    entry: &EntryPoints,
    path: &[u8],
) -> anyhow::Result<u64> {
    let (state, xstate) = stopped.state(pid)?;
    let block = frame::block(&state, &xstate, entry.restore_rt);
    mem.write_all_at(&block.bytes, block.start)
        .context("writing on its stack")?;
    let page = stopped
        .map_page(entry.mmap, &block)
        .context("mapping a page in the target")?;
    let extended = stub::Extended {
        at: block.xstate_at,
        mask: xstate.restore_mask(),
    };
    let code = stub::page(&stopped.resume_registers(), extended, path)
        .context("the library's path is too long")?;
    mem.write_all_at(&code, page).context("writing the page")?;
    stopped.call(
        mem,
        entry.dlopen,
        (page + stub::PATH as u64, RTLD_NOW),
        page + stub::CODE as u64,
        block.call_sp,
    )?;
    Ok(page)
}

/// Stops a thread of `pid` at a safe point ([`safe`]), the main thread first, trying again
/// until [`SAFE_POINT_WITHIN`] has passed since `started`.
fn take_a_thread(pid: u32, vmas: &[Vma], started: Instant) -> Result<Stopped, Refused> {
    loop {
        let mut tids =
            crate::sys::process::threads_of(pid).map_err(|e| Refused::Failed(e.into()))?;
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
