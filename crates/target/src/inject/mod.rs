//! Loading allocscope's in-process sampler into a running process (`record -p`, `top -p`),
//! by itself: no debugger on the host.
//!
//! One thread of the target is stopped with `ptrace` (`PTRACE_SEIZE`, `PTRACE_INTERRUPT`:
//! the others run on), at a moment the program cannot tell from a native run ([`calls`]:
//! not in a call the stop would cut short or lengthen) and where `dlopen` can run
//! ([`safe`]: holding neither the allocator's nor the loader's lock, on its own stack with
//! room). A block on its stack holds its extended register state and two signal frames
//! ([`frame`]); made to call `mmap` returning through the first, it maps a page (readable
//! and writable, never executable) for the library's path; then it is set up to call the C
//! library's `dlopen` on it, returning through the second frame into `munmap` of the page
//! and back through the first, and let go. From its stop on, allocscope killed at any
//! moment leaves it resuming as it was.
//! It loads the library (whose constructor routes the program's allocator calls to itself:
//! see `sampler-preload`'s `route`), unmaps the page and resumes where it was, on its own.
//! allocscope waits for the page to go. The thread is stopped only for the set-up; the
//! loading is timed too. Both are said with `-v`.
//!
//! Refused, for uprobes to take the process instead (each said): a process with a thread
//! under a seccomp filter, traced already or stopped, one whose C library has no `dlopen`
//! (static, or glibc before 2.34), one where the library's path is another file (another
//! mount namespace), one whose address-space limit or memory cgroup leaves too little room,
//! one where no thread came to a safe point in time, and wherever the kernel refuses
//! `ptrace` (Yama).

mod calls;
mod frame;
mod held;
mod lock_files;
mod safe;
mod thread;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    io,
    os::unix::fs::FileExt as _,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use log::debug;

use crate::sys::{
    maps::{self, FileId, Vma},
    process,
};
use thread::Stopped;

/// A library loaded into a process.
#[derive(Debug)]
pub struct Loaded {
    /// The thread that loaded it.
    pub tid: u32,
    /// How long that thread was stopped (the set-up; not the looking for it).
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
    /// No thread came to a safe point in time: why each was not taken.
    #[error("no thread at a safe point within {0:?} ({1})")]
    Busy(Duration, String),
    /// Its limits leave the library too little room.
    #[error("{0}")]
    Limit(String),
    /// `dlopen` returned null.
    #[error("its loader could not open the library")]
    Dlopen,
    /// Anything else (the process ended meanwhile…).
    #[error("{0:#}")]
    Failed(anyhow::Error),
}

/// How long to look for a thread at a safe point.
const SAFE_POINT_WITHIN: Duration = Duration::from_secs(2);
/// How long a thread stopped and let go (not at a safe point) is left alone.
const AGAIN_AFTER: Duration = Duration::from_millis(20);
/// How long the loading may take.
const LOADING_WITHIN: Duration = Duration::from_secs(10);
const RTLD_NOW: u64 = 2;
/// The page the library's path is written in.
const PAGE: u64 = 4096;

/// Loads `library` into process `pid`.
pub fn load(pid: u32, library: &Path) -> Result<Loaded, Refused> {
    every_thread_allows(pid)?;
    let same = |a: &Path, b: &Path| {
        let id = |p: &Path| std::fs::metadata(p).ok().map(|m| FileId::of(&m));
        id(a).is_some() && id(a) == id(b)
    };
    if !library.is_absolute() {
        let failed = anyhow::anyhow!("{} is not absolute", library.display());
        return Err(Refused::Failed(failed));
    }
    let inside = process::in_root(pid, library.as_os_str());
    if !same(library, &inside) {
        return Err(Refused::Namespace);
    }
    room_for(pid, library)?;
    let vmas = maps::read(pid)
        .with_context(|| format!("reading the maps of pid {pid}"))
        .map_err(Refused::Failed)?;
    let mem = crate::sys::memory::open_writable(pid)
        .map_err(|e| Refused::Failed(anyhow::Error::new(e).context("opening its memory")))?;
    let entry = entry_points(pid, &vmas, &mem)?;
    let path = library.as_os_str().as_encoded_bytes();
    if path.len() as u64 >= PAGE || path.contains(&0) {
        let failed = anyhow::anyhow!("the library's path does not fit a page");
        return Err(Refused::Failed(failed));
    }
    let mut runtime = held::Runtime::of(pid, &vmas, &mem).map_err(Refused::Failed)?;
    let started = Instant::now();
    let mut stopped = take_a_thread(pid, (&vmas, &mut runtime), &mem, started)?;
    let tid = stopped.tid;
    let stopped_at = stopped.at;
    let page = switch(&mut stopped, pid, &mem, &entry, path).map_err(Refused::Failed)?;
    let stop_ended = Instant::now();
    let stopped = stop_ended - stopped_at;
    wait_until_unmapped(pid, &mem, page)?;
    let loading = stop_ended.elapsed();
    debug!("pid {pid}: thread {tid} stopped {stopped:?}, the library loaded in {loading:?}");
    let id = std::fs::metadata(library)
        .map(|m| FileId::of(&m))
        .map_err(|e| Refused::Failed(e.into()))?;
    if !maps::maps_file(pid, &id) {
        return Err(Refused::Dlopen);
    }
    Ok(Loaded {
        tid,
        stopped,
        loading,
    })
}

/// Refuses a process any of whose threads is under a seccomp filter (the library runs on
/// every thread: a filter could forbid what it does), traced or stopped.
fn every_thread_allows(pid: u32) -> Result<(), Refused> {
    let tids = process::threads_of(pid).map_err(|e| Refused::Failed(e.into()))?;
    for tid in tids {
        let Ok(status) = process::thread_status(pid, tid) else {
            continue; // gone meanwhile
        };
        let field = |name| process::status_field(&status, name).unwrap_or_default();
        if field("Seccomp").parse::<u32>().is_ok_and(|m| m != 0) {
            return Err(Refused::Seccomp);
        }
        if let Some(tracer) = field("TracerPid").parse::<u32>().ok().filter(|&t| t != 0) {
            return Err(Refused::Traced(tracer));
        }
        if field("State").starts_with(['T', 't']) {
            return Err(Refused::Stopped);
        }
    }
    Ok(())
}

/// Address space the library takes beyond its file's segments: its counter region, the
/// copy of the maps it takes at its start, the page (measured: 1,068 kB in all with the
/// library's segments).
const LIBRARY_MAPS: u64 = 256 << 10;
/// What a limited process keeps free of its limit after the load, at least.
const KEPT_FREE: u64 = 16 << 20;
/// Memory the library makes resident in a process (its data and table pages touched, the
/// counter region), at most.
const LIBRARY_RESIDENT: u64 = 1 << 20;

/// Refuses a process whose address-space limit (`RLIMIT_AS`) or memory cgroup would leave
/// it less than [`KEPT_FREE`] once the library is loaded: the program's own next mapping
/// would fail where natively it would not.
fn room_for(pid: u32, library: &Path) -> Result<(), Refused> {
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    if let Some(Some(limit)) = process::soft_limit(pid, "Max address space") {
        let needs = segments_span(library).map_err(Refused::Failed)? + LIBRARY_MAPS + PAGE;
        let used = process::address_space_of(pid).unwrap_or(u64::MAX);
        let free = limit.saturating_sub(used);
        if free < needs + KEPT_FREE {
            return Err(Refused::Limit(format!(
                "its address-space limit (RLIMIT_AS, {:.1} MiB) leaves {:.1} MiB free: the \
                 library needs {:.1} MiB and {:.0} MiB stay the program's",
                mib(limit),
                mib(free),
                mib(needs),
                mib(KEPT_FREE)
            )));
        }
    }
    if let Some(free) = process::memory_headroom(pid) {
        if free < LIBRARY_RESIDENT + KEPT_FREE {
            return Err(Refused::Limit(format!(
                "its memory cgroup is {:.1} MiB from its limit: the library needs up to \
                 {:.0} MiB and {:.0} MiB stay the program's",
                mib(free),
                mib(LIBRARY_RESIDENT),
                mib(KEPT_FREE)
            )));
        }
    }
    Ok(())
}

/// The address space `library`'s loadable segments span.
fn segments_span(library: &Path) -> anyhow::Result<u64> {
    use object::{Object as _, ObjectSegment as _};
    let bytes = std::fs::read(library).with_context(|| format!("reading {}", library.display()))?;
    let elf = object::File::parse(&*bytes).context("parsing the library")?;
    let (low, high) = elf.segments().fold((u64::MAX, 0), |(low, high), s| {
        (low.min(s.address()), high.max(s.address() + s.size()))
    });
    anyhow::ensure!(high > low, "the library has no loadable segment");
    Ok(((high + PAGE - 1) & !(PAGE - 1)) - (low & !(PAGE - 1)))
}

/// What the switch calls in the target's C library.
struct EntryPoints {
    dlopen: u64,
    mmap: u64,
    munmap: u64,
    /// `__restore_rt` (`mov rax, 15; syscall`), which signal handlers return into.
    restore_rt: u64,
}

/// Most code of a C library read to find `__restore_rt` (glibc's is under 2 MiB): a
/// mapping named so but larger is not read.
const MAX_LIBC_CODE: u64 = 64 << 20;

/// `__restore_rt`'s code in glibc (x86-64).
const RESTORE_RT: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// The C library's `dlopen`, `mmap`, `munmap` and `__restore_rt`, in `pid` (its memory
/// `mem`).
fn entry_points(pid: u32, vmas: &[Vma], mem: &File) -> Result<EntryPoints, Refused> {
    let is_libc = |v: &&Vma| {
        v.path
            .as_deref()
            .and_then(Path::file_name)
            .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
    };
    let libc = vmas.iter().find(is_libc).ok_or(Refused::NoDlopen)?;
    let file = libc.file_in(pid);
    let [dlopen, mmap, munmap] =
        crate::preload::symbol_addresses(pid, vmas, &file, ["dlopen", "mmap", "munmap"])
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
        munmap,
        restore_rt: code.start + at as u64,
    })
}

/// The switch, on a thread stopped at a safe point: the block on its stack, the page with
/// the library's path, the frame that unmaps it, the call to `dlopen` set up, and the
/// thread let go. The page's address.
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
        .map_page(entry.mmap, PAGE, &block)
        .context("mapping a page in the target")?;
    let mut text = path.to_vec();
    text.push(0);
    mem.write_all_at(&text, page).context("writing the page")?;
    let release = frame::release(&block, &state, entry.restore_rt, entry.munmap, (page, PAGE));
    mem.write_all_at(&release, block.call_sp)
        .context("writing on its stack")?;
    stopped.call(entry.dlopen, (page, RTLD_NOW), block.call_sp)?;
    Ok(page)
}

/// Stops a thread of `pid` at a safe point, the main thread last, trying again until
/// [`SAFE_POINT_WITHIN`] has passed since `started`: a thread is looked at before it is
/// stopped ([`calls`]) and once stopped ([`safe`]); one that is not at one is let go as it
/// was.
fn take_a_thread(
    pid: u32,
    (vmas, runtime): (&[Vma], &mut held::Runtime),
    mem: &File,
    started: Instant,
) -> Result<Stopped, Refused> {
    let stack_limit = process::soft_limit(pid, "Max stack size").flatten();
    let mut not_now: BTreeMap<u32, String> = BTreeMap::new();
    // A thread let go after its stop is stopped again only this much later.
    let mut stopped_last: BTreeMap<u32, Instant> = BTreeMap::new();
    // Threads seen creating processes: never stopped (see `before_stop`), looked for a few
    // times before any is stopped, as a thread caught running may be forking.
    let mut parents = parents_of(pid);
    loop {
        if let Some(name) = crate::interrupted::received() {
            return Err(Refused::Failed(anyhow::anyhow!(
                "{name} while looking for a thread"
            )));
        }
        let mut tids = process::threads_of(pid).map_err(|e| Refused::Failed(e.into()))?;
        // The main thread last: signals sent to the process are sent to it.
        tids.sort_by_key(|&t| (t == pid, t));
        if let Some(owner) = runtime.loader_lock_owner(mem) {
            // Whichever thread loads would wait for it, maybe for ever.
            not_now.insert(owner, held::Holds::LoaderLock(owner).to_string());
            tids.clear();
        }
        for tid in tids {
            let recent = stopped_last
                .get(&tid)
                .is_some_and(|t| t.elapsed() < AGAIN_AFTER);
            if recent || parents.contains(&tid) {
                continue;
            }
            if let Err(why) = before_stop(pid, tid) {
                if why == PARENT {
                    parents.insert(tid);
                }
                not_now.insert(tid, why.into());
                continue;
            }
            let mut stopped = match Stopped::stop(tid) {
                Ok(s) => s,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                Err(e) => return Err(Refused::Ptrace(e)),
            };
            if calls::forks(stopped.saved.orig_rax)
                || process::thread_has_children(pid, tid).unwrap_or(false)
            {
                // Let go at once.
                drop(stopped);
                parents.insert(tid);
                not_now.insert(tid, PARENT.into());
                continue;
            }
            match once_stopped(&mut stopped, pid, (vmas, &mut *runtime, mem), stack_limit) {
                Ok(()) => return Ok(stopped),
                Err(why) => {
                    debug!("pid {pid}: thread {tid} not now: {why}");
                    not_now.insert(tid, why.to_string());
                    stopped_last.insert(tid, Instant::now());
                }
            }
        }
        if started.elapsed() > SAFE_POINT_WITHIN {
            let why: Vec<String> = not_now
                .iter()
                .map(|(tid, why)| format!("thread {tid}: {why}"))
                .collect();
            return Err(Refused::Busy(SAFE_POINT_WITHIN, why.join("; ")));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Looks at `pid`'s threads [`PARENT_LOOKS`] times, [`PARENT_LOOK_EVERY`] apart: those seen
/// in a call that creates a process or with children.
fn parents_of(pid: u32) -> BTreeSet<u32> {
    let mut parents = BTreeSet::new();
    for look in 0..PARENT_LOOKS {
        if look > 0 {
            std::thread::sleep(PARENT_LOOK_EVERY);
        }
        for tid in process::threads_of(pid).unwrap_or_default() {
            let forking = process::thread_syscall(pid, tid)
                .ok()
                .and_then(|text| calls::parse(&text))
                .is_some_and(|doing| {
                    matches!(doing, calls::Doing::Blocked { number, .. } if calls::forks(number))
                });
            if forking || process::thread_has_children(pid, tid).unwrap_or(false) {
                parents.insert(tid);
            }
        }
    }
    parents
}

/// How many times, and how far apart, threads are looked at for forks before any is stopped.
const PARENT_LOOKS: usize = 8;
const PARENT_LOOK_EVERY: Duration = Duration::from_millis(1);

/// Why a thread that creates processes is not taken: a signal the program ignores is
/// dropped when it is sent, unless the thread it is sent to is traced; then it is queued,
/// and another thread is woken for it, whose `epoll_wait` returns `EINTR` (seen: a thread
/// forking in a loop, stopped, and the main thread's timed wait cut short by a child's
/// `SIGCHLD`). For the same reason the main thread, to which signals sent to the process
/// go, is tried last.
const PARENT: &str = "it creates processes, whose exits a stop would make seen";

/// Whether thread `tid` may be stopped now: alive, not a parent ([`PARENT`]), and not
/// blocked in a call the stop would change or that may hold the allocator's locks.
fn before_stop(pid: u32, tid: u32) -> Result<(), std::borrow::Cow<'static, str>> {
    if !process::thread_alive(pid, tid) {
        return Err("exited".into());
    }
    if process::thread_has_children(pid, tid).unwrap_or(false) {
        return Err(PARENT.into());
    }
    let text = process::thread_syscall(pid, tid).map_err(|e| e.to_string())?;
    match calls::parse(&text) {
        None => Err(format!("unreadable state {:?}", text.trim()).into()),
        Some(calls::Doing::Running | calls::Doing::Faulting) => Ok(()),
        Some(calls::Doing::Blocked { number, .. }) if calls::forks(number) => Err(PARENT.into()),
        Some(calls::Doing::Blocked { number, args }) => {
            let socket_timeout = calls::SOCKET_CALLS.contains(&number)
                && process::socket_has_timeout(pid, args[0] as i32).unwrap_or(true);
            match calls::stop_in(number, &args, socket_timeout) {
                calls::Stop::Unseen => Ok(()),
                calls::Stop::Seen(why) | calls::Stop::HoldsLocks(why) => Err(why.into()),
            }
        }
    }
}

/// Whether the stopped thread may load the library here ([`safe`], [`held`]); a call the
/// stop cut short is set to be issued again.
fn once_stopped(
    stopped: &mut Stopped,
    pid: u32,
    (vmas, runtime, mem): (&[Vma], &mut held::Runtime, &File),
    stack_limit: Option<u64>,
) -> Result<(), safe::NotNow> {
    let regs = stopped.saved;
    safe::check(regs.rip, regs.orig_rax, vmas)?;
    safe::stack_room(regs.rsp, stopped.fs_base(), vmas, stack_limit)?;
    runtime
        .holds((regs.rip, regs.rsp, regs.rbp), mem, vmas)
        .map_err(safe::NotNow::Holds)?;
    if let Some(owner) = runtime.loader_lock_owner(mem) {
        return Err(safe::NotNow::Holds(held::Holds::LoaderLock(owner)));
    }
    let signal = stopped.pending_signal() != 0 || process::signal_pending(pid, stopped.tid);
    if calls::issued_again(regs.orig_rax, regs.rax, signal) {
        stopped.issue_again();
    }
    Ok(())
}

/// Waits until the page is gone: the thread has returned from `dlopen` and unmapped it.
fn wait_until_unmapped(pid: u32, mem: &File, page: u64) -> Result<(), Refused> {
    let deadline = Instant::now() + LOADING_WITHIN;
    loop {
        let mut byte = [0u8; 1];
        if mem.read_exact_at(&mut byte, page).is_err() {
            // Unmapped, or the process ended: its maps say which.
            let vmas = maps::read(pid).unwrap_or_default();
            if vmas.is_empty() {
                return Err(Refused::Failed(anyhow::anyhow!("it ended while loading")));
            }
            if !vmas.iter().any(|v| (v.start..v.end).contains(&page)) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(Refused::Failed(anyhow::anyhow!(
                "the library was still loading after {LOADING_WITHIN:?}"
            )));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}
