//! What /proc says about a process: its name, cgroup, environment, auxiliary vector, `stat`
//! and `status` fields, resident set size, executable and threads, and the list of processes.
//! Every reader returns `None` (or empty) for a process that is gone: a target may exit at
//! any moment, and that is not an error here.

use std::{os::fd::AsRawFd as _, path::PathBuf};

/// `/proc/PID/WHAT` (`what` empty: the process's directory).
pub(super) fn path(pid: u32, what: &str) -> PathBuf {
    if what.is_empty() {
        PathBuf::from(format!("/proc/{pid}"))
    } else {
        PathBuf::from(format!("/proc/{pid}/{what}"))
    }
}

/// `pid`'s file `what` (`stat`, `status`, `comm`…) as text (read once per
/// [`super::moment`]).
fn text_of(pid: u32, what: &'static str) -> Option<String> {
    super::moment::text(pid, what, || std::fs::read_to_string(path(pid, what))).ok()
}

/// Whether a process `pid` exists (its /proc directory: an exited process not yet reaped
/// counts). The one liveness check: a pid may name another process later.
pub fn exists(pid: u32) -> bool {
    path(pid, "").exists()
}

/// Whether `pid` is a kernel thread (`PF_KTHREAD` in the flags of /proc/PID/stat).
pub fn is_kernel_thread(pid: u32) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    text_of(pid, "stat")
        .and_then(|stat| stat_flags(&stat))
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// The state letter of a `/proc/PID/stat` line (`R`, `S`, `Z`…).
pub fn stat_state(stat: &str) -> Option<char> {
    stat.rsplit_once(") ")?.1.chars().next()
}

/// The `flags` field of a `/proc/PID/stat` line (the name in parentheses may hold anything,
/// `)` and spaces included: the fields start after its last `) `).
pub fn stat_flags(stat: &str) -> Option<u64> {
    // After the name: state, ppid, pgrp, session, tty, tpgid, flags.
    let fields = stat.rsplit_once(") ")?.1;
    fields.split(' ').nth(6)?.parse().ok()
}

/// `pid`'s /proc/PID/status text.
fn status_of(pid: u32) -> Option<String> {
    text_of(pid, "status")
}

/// The value of field `name` (`Seccomp`, `VmRSS`…) in a /proc/PID/status text, trimmed.
pub fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(':')?;
        Some(value.trim())
    })
}

/// The `Seccomp:` mode of `pid` (0: none, 1: strict, 2: a filter), from /proc/PID/status.
pub fn seccomp_mode(pid: u32) -> Option<u32> {
    status_field(&status_of(pid)?, "Seccomp")?.parse().ok()
}

/// The pid of the process tracing `pid` (0: none), from /proc/PID/status.
pub fn tracer_of(pid: u32) -> Option<u32> {
    status_field(&status_of(pid)?, "TracerPid")?.parse().ok()
}

/// `pid` as its own pid namespace numbers it (the last `NSpid:` field of its status).
pub fn namespace_pid(pid: u32) -> Option<u32> {
    status_field(&status_of(pid)?, "NSpid")?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The name (`comm`) of `pid`, if it lives.
pub fn comm_of(pid: u32) -> Option<String> {
    text_of(pid, "comm").map(|c| c.trim_end().to_owned())
}

/// The environment `pid` started its program with (`/proc/PID/environ`, at most 1 MiB).
pub fn environ_of(pid: u32) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path(pid, "environ"))
        .ok()?
        .take(1 << 20)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// The paths an environment block (`/proc/PID/environ`: NUL-separated `NAME=value`) puts
/// in `LD_PRELOAD`, in order (the loader splits it at spaces and colons).
pub fn ld_preload_entries(environ: &[u8]) -> Vec<&[u8]> {
    environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(b"LD_PRELOAD="))
        .map(|value| {
            value
                .split(|&b| b == b' ' || b == b':')
                .filter(|path| !path.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pid`'s program runs in secure-execution mode (its auxv's `AT_SECURE`: a
/// set-user/group-ID program or one with file capabilities, for which the dynamic loader
/// ignores `LD_PRELOAD` paths); `None` when unreadable.
pub fn secure_execution(pid: u32) -> Option<bool> {
    let auxv = std::fs::read(path(pid, "auxv")).ok()?;
    Some(at_secure(&auxv))
}

/// The files `pid`'s `LD_PRELOAD` names, through its own root (absolute paths only).
pub fn preloaded(pid: u32) -> Vec<std::path::PathBuf> {
    let Some(environ) = environ_of(pid) else {
        return Vec::new();
    };
    ld_preload_entries(&environ)
        .into_iter()
        .filter(|path| path.starts_with(b"/"))
        .map(|file| {
            in_root(
                pid,
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(file),
            )
        })
        .collect()
}

/// `AT_SECURE` in an auxiliary vector (native-endian 64-bit key/value pairs).
fn at_secure(auxv: &[u8]) -> bool {
    const AT_SECURE: u64 = 23;
    auxv.chunks_exact(16)
        .map(|pair| {
            let word =
                |at: usize| u64::from_ne_bytes(pair[at..at + 8].try_into().unwrap_or_default());
            (word(0), word(8))
        })
        .take_while(|&(key, _)| key != 0)
        .any(|(key, value)| key == AT_SECURE && value != 0)
}

/// The cgroup (v2 path) of `pid`: groups a container's or a systemd unit's processes.
pub fn cgroup_of(pid: u32) -> Option<String> {
    let text = text_of(pid, "cgroup")?;
    cgroup_path(&text)
}

/// How many bytes `pid`'s memory cgroups (its own and every parent, in the v1 memory
/// hierarchy or else in v2) let it grow by: the least, over those with a limit, of the
/// limit less what is charged, the inactive page cache (which the kernel reclaims first)
/// counted as free; `None` when none has a limit or none can be read.
pub fn memory_headroom(pid: u32) -> Option<u64> {
    let text = text_of(pid, "cgroup")?;
    let v1 = text.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_owned())
    });
    let (root, group, files) = match v1 {
        Some(group) => (
            PathBuf::from("/sys/fs/cgroup/memory"),
            group,
            [
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            ],
        ),
        None => {
            let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
            let root = mounts.lines().find_map(|line| {
                let mut fields = line.split(' ');
                let (_, at, kind) = (fields.next()?, fields.next()?, fields.next()?);
                (kind == "cgroup2").then(|| PathBuf::from(at))
            })?;
            let group = cgroup_path(&text)?;
            (
                root,
                group,
                ["memory.max", "memory.current", "inactive_file"],
            )
        }
    };
    let mut dir = root.join(group.trim_start_matches('/'));
    let mut least: Option<u64> = None;
    loop {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let number = |name: &str| read(name).and_then(|m| m.trim().parse::<u64>().ok());
        let cache = read("memory.stat").and_then(|stat| {
            stat.lines()
                .find_map(|l| l.strip_prefix(files[2])?.trim().parse::<u64>().ok())
        });
        if let (Some(limit), Some(charged)) = (number(files[0]), number(files[1])) {
            // v1 says "no limit" with a huge number.
            if limit < 1 << 62 {
                let room = (limit + cache.unwrap_or(0)).saturating_sub(charged);
                least = Some(least.map_or(room, |l| l.min(room)));
            }
        }
        if !dir.pop() || !dir.starts_with(&root) || dir == root {
            return least;
        }
    }
}

/// The unified-hierarchy path from the text of /proc/PID/cgroup (`0::/system.slice/x`), else
/// the first controller's. Pure.
pub fn cgroup_path(text: &str) -> Option<String> {
    let paths: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let id = fields.next()?;
            let _controllers = fields.next()?;
            Some((id, fields.next()?))
        })
        .collect();
    paths
        .iter()
        .find(|(id, _)| *id == "0")
        .or_else(|| paths.first())
        .map(|(_, path)| (*path).to_owned())
}

/// Every process now (pids of /proc), kernel threads included (they map nothing and are
/// skipped when their allocators are asked for).
pub fn all_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// The processes descended from `root` now (children, theirs…), from every process's
/// parent in /proc/PID/stat: those that started before the kernel's fork events were
/// watched.
pub fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = all_pids()
        .into_iter()
        .filter_map(|pid| {
            let stat = text_of(pid, "stat")?;
            Some((pid, stat_ppid(&stat)?))
        })
        .collect();
    let mut found = vec![root];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        found.extend(
            parents
                .iter()
                .filter(|&&(_, p)| p == parent)
                .map(|&(pid, _)| pid),
        );
        next += 1;
    }
    found.remove(0);
    found
}

/// The parent pid field of a /proc/PID/stat line.
pub fn stat_ppid(stat: &str) -> Option<u32> {
    stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()
}

/// `pid`'s state letter (`R`, `S`, `Z`…), if it exists.
pub fn state_of(pid: u32) -> Option<char> {
    let stat = text_of(pid, "stat")?;
    stat_state(&stat)
}

/// Resident set size of `pid` from /proc/PID/status (`VmRSS`), if it is alive.
pub fn rss_of(pid: u32) -> Option<u64> {
    vm_rss(&status_of(pid)?)
}

/// What of a process is resident, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resident {
    /// All of it (`VmRSS`).
    pub rss: u64,
    /// Its anonymous memory (`RssAnon`): heaps, arenas, whatever it mapped for itself.
    pub anon: u64,
}

/// What of `pid` is resident, from one read of /proc/PID/status, if it is alive.
pub fn resident_of(pid: u32) -> Option<Resident> {
    let status = status_of(pid)?;
    Some(Resident {
        rss: vm_rss(&status)?,
        anon: kib_field(&status, "RssAnon").unwrap_or(0),
    })
}

/// `VmRSS` of a /proc/PID/status text, in bytes.
fn vm_rss(status: &str) -> Option<u64> {
    kib_field(status, "VmRSS")
}

/// A `… kB` field of a /proc/PID/status text, in bytes.
fn kib_field(status: &str, name: &str) -> Option<u64> {
    let kib: u64 = status_field(status, name)?
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The path of `pid`'s executable, if it is alive and has one.
pub fn executable_of(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(exe_path(pid)).ok()
}

/// `/proc/PID/exe`: opens `pid`'s executable itself (even deleted, or in another mount
/// namespace), while it lives.
pub fn exe_path(pid: u32) -> PathBuf {
    path(pid, "exe")
}

/// The metadata of `pid`'s executable (through [`exe_path`]), while it lives (`NotFound`
/// once its exit began: the link is cleared first).
pub fn exe_metadata(pid: u32) -> std::io::Result<std::fs::Metadata> {
    std::fs::metadata(exe_path(pid))
}

/// The absolute path `file` as `pid` sees it, through its root (`/proc/PID/root/FILE`): a
/// container's file, not ours of the same name.
pub fn in_root(pid: u32, file: &std::ffi::OsStr) -> PathBuf {
    let mut through = path(pid, "root").into_os_string();
    through.push(file);
    PathBuf::from(through)
}

/// The ids of `pid`'s threads now (`/proc/PID/task`), unsorted.
pub fn threads_of(pid: u32) -> std::io::Result<Vec<u32>> {
    Ok(std::fs::read_dir(path(pid, "task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// How many threads of `pid` other than its main thread have not exited.
pub fn live_threads(pid: u32) -> usize {
    threads_of(pid)
        .unwrap_or_default()
        .into_iter()
        .filter(|&tid| tid != pid && thread_alive(pid, tid))
        .count()
}

/// Whether thread `tid` of `pid` has not exited (not a zombie, not dead, not gone).
pub fn thread_alive(pid: u32, tid: u32) -> bool {
    thread_status(pid, tid)
        .is_ok_and(|s| status_field(&s, "State").is_some_and(|st| !st.starts_with(['Z', 'X'])))
}

/// The `status` text of thread `tid` of `pid`.
pub fn thread_status(pid: u32, tid: u32) -> std::io::Result<String> {
    std::fs::read_to_string(path(pid, &format!("task/{tid}/status")))
}

/// What thread `tid` of `pid` is doing (`/proc/PID/task/TID/syscall`): `running`, or the
/// system call it is blocked in with its arguments (see `crate::inject`'s `calls`).
pub fn thread_syscall(pid: u32, tid: u32) -> std::io::Result<String> {
    std::fs::read_to_string(path(pid, &format!("task/{tid}/syscall")))
}

/// Whether descriptor `fd` of `pid` is a socket with a receive or send timeout (a call on
/// it returns `EINTR` after a stop). Looked at through a copy of the descriptor
/// (`pidfd_getfd`), closed at once.
pub fn socket_has_timeout(pid: u32, fd: i32) -> std::io::Result<bool> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    let link = std::fs::read_link(path(pid, &format!("fd/{fd}")))?;
    if !link.to_string_lossy().starts_with("socket:") {
        return Ok(false);
    }
    let owned = |r: libc::c_long| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            // SAFETY: a descriptor the kernel just gave us, owned here alone.
            Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
        }
    };
    // SAFETY: a system call with integer arguments.
    let pidfd = owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: as above; the pidfd is ours and open.
    let copy = owned(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) })?;
    for option in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        let mut timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        };
        let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
        // SAFETY: getsockopt into our timeval, its length given.
        let r = unsafe {
            libc::getsockopt(
                copy.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&raw mut timeout).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if timeout.tv_sec != 0 || timeout.tv_usec != 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether thread `tid` of `pid` has a signal pending that it does not block (its own or
/// its process's), from its status.
pub fn signal_pending(pid: u32, tid: u32) -> bool {
    let Ok(status) = thread_status(pid, tid) else {
        return false;
    };
    let mask = |name| {
        status_field(&status, name)
            .and_then(|m| u64::from_str_radix(m, 16).ok())
            .unwrap_or(0)
    };
    (mask("SigPnd") | mask("ShdPnd")) & !mask("SigBlk") != 0
}

/// Whether thread `tid` of `pid` has child processes (`/proc/PID/task/TID/children`): a
/// child's exit sends it `SIGCHLD`. An error where the kernel has no such file
/// (`CONFIG_PROC_CHILDREN` off) or the thread is gone.
pub fn thread_has_children(pid: u32, tid: u32) -> std::io::Result<bool> {
    let text = std::fs::read_to_string(path(pid, &format!("task/{tid}/children")))?;
    Ok(!text.trim().is_empty())
}

/// `pid`'s soft limit `name` (`Max address space`, `Max stack size`) from
/// /proc/PID/limits: `Some(None)` when unlimited, `None` when it cannot be read.
pub fn soft_limit(pid: u32, name: &str) -> Option<Option<u64>> {
    limits_field(&std::fs::read_to_string(path(pid, "limits")).ok()?, name)
}

/// The soft limit `name` in a /proc/PID/limits text (`Max stack size  8388608  unlimited
/// bytes`). Pure.
pub fn limits_field(text: &str, name: &str) -> Option<Option<u64>> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let soft = line[name.len()..].split_whitespace().next()?;
    if soft == "unlimited" {
        return Some(None);
    }
    soft.parse().ok().map(Some)
}

/// `pid`'s address space in bytes (`VmSize`), from /proc/PID/status.
pub fn address_space_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(path(pid, "status")).ok()?;
    let kib = status_field(&status, "VmSize")?.strip_suffix(" kB")?.trim();
    kib.parse::<u64>().ok().map(|k| k * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_limits_are_read_unlimited_or_in_bytes() {
        let text =
            "Limit                     Soft Limit           Hard Limit           Units     \n\
Max stack size            8388608              unlimited            bytes     \n\
Max address space         unlimited            unlimited            bytes     \n";
        assert_eq!(limits_field(text, "Max stack size"), Some(Some(8388608)));
        assert_eq!(limits_field(text, "Max address space"), Some(None));
        assert_eq!(limits_field(text, "Max open files"), None);
        let own = soft_limit(std::process::id(), "Max stack size");
        assert!(own.is_some(), "{own:?}");
        assert!(address_space_of(std::process::id()).is_some_and(|b| b > 1 << 20));
    }

    #[test]
    fn this_process_exists_and_a_pid_beyond_the_limit_does_not() {
        assert!(exists(std::process::id()));
        // pid_max is at most 2^22.
        assert!(!exists(1 << 23));
    }

    #[test]
    fn status_fields_are_found_by_their_whole_name() {
        let status = "Name:\tx\nNSpid:\t812\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n";
        assert_eq!(status_field(status, "Seccomp"), Some("2"));
        assert_eq!(status_field(status, "Seccomp_filters"), Some("1"));
        assert_eq!(status_field(status, "NSpid"), Some("812\t1"));
        assert_eq!(status_field(status, "Secc"), None);
        assert_eq!(seccomp_mode(std::process::id()), Some(0));
        assert_eq!(namespace_pid(std::process::id()), Some(std::process::id()));
    }

    #[test]
    fn descendants_are_found_through_their_parents() {
        assert_eq!(stat_ppid("12 (a) b) S 7 12 12 0 -1"), Some(7));
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & wait"])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let found = descendants(std::process::id());
        child.kill().unwrap();
        let _ = child.wait();
        assert!(found.contains(&child.id()), "{found:?}");
        assert!(found.len() >= 2, "the shell's sleep too: {found:?}");
    }

    #[test]
    fn ld_preload_is_split_as_the_loader_splits_it() {
        let environ =
            b"HOME=/root\0LD_PRELOAD=/proc/self/fd/5 /usr/lib/libjemalloc.so.2:/x.so\0PATH=/bin\0";
        assert_eq!(
            ld_preload_entries(environ),
            [
                &b"/proc/self/fd/5"[..],
                b"/usr/lib/libjemalloc.so.2",
                b"/x.so"
            ]
        );
        assert!(ld_preload_entries(b"PATH=/bin\0LD_PRELOADX=/y.so\0").is_empty());
        assert!(ld_preload_entries(b"LD_PRELOAD=\0").is_empty());
    }

    #[test]
    fn secure_execution_is_read_from_the_auxiliary_vector() {
        let vector = |pairs: &[(u64, u64)]| -> Vec<u8> {
            pairs
                .iter()
                .flat_map(|&(k, v)| k.to_ne_bytes().into_iter().chain(v.to_ne_bytes()))
                .collect()
        };
        assert!(!at_secure(&vector(&[(6, 4096), (23, 0), (0, 0)])));
        assert!(at_secure(&vector(&[(6, 4096), (23, 1), (0, 0)])));
        // Past the terminating pair, nothing counts; a cut vector is read as far as whole.
        assert!(!at_secure(&vector(&[(0, 0), (23, 1)])));
        assert!(!at_secure(&[1, 2, 3]));
        // This process is not set-user-ID.
        assert_eq!(secure_execution(std::process::id()), Some(false));
    }

    #[test]
    fn reads_cgroup_paths() {
        assert_eq!(
            cgroup_path("0::/system.slice/nginx.service\n").as_deref(),
            Some("/system.slice/nginx.service")
        );
        assert_eq!(
            cgroup_path("12:pids:/docker/abc\n0::/docker/abc\n").as_deref(),
            Some("/docker/abc")
        );
        assert_eq!(cgroup_path("3:cpu:/a\n").as_deref(), Some("/a"));
        assert_eq!(cgroup_path(""), None);
    }

    #[test]
    fn reads_resident_set_size() {
        assert_eq!(
            vm_rss("Name:\tx\nVmRSS:\t   1234 kB\nVmSwap: 0 kB\n"),
            Some(1234 * 1024)
        );
        assert_eq!(vm_rss("Name:\tkthread\n"), None);
        assert!(rss_of(std::process::id()).is_some_and(|bytes| bytes > 0));
        assert!(executable_of(std::process::id()).is_some());
    }
}
