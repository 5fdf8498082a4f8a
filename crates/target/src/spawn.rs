//! Starting `-- CMD ARGS` so that its first allocation is already probed.
//!
//! The child is forked before the tokio runtime exists (the only other thread is `main`
//! waiting for ours: it holds no lock the child could need) and waits on a pipe before
//! `execve` of the file the engine's `preflight::resolve_command` resolved; the parent
//! attaches the probes to the child's pid, then releases it. uprobes attached to a pid follow it through exec: the kernel installs the
//! breakpoints when the new program maps the allocator library. A second, close-on-exec pipe
//! tells the parent that exec happened (EOF) or why it failed (errno).
//!
//! The child never outlives us: it holds no write end of its own go-pipe (so our death, or
//! dropping the [`PausedChild`], makes its read return EOF and it exits), it asks the
//! kernel for SIGKILL should we die while it waits and for SIGTERM once it runs the command
//! (`PR_SET_PDEATHSIG`, kept through exec), and an unreleased child is killed and reaped.

use std::{
    ffi::{CString, OsString},
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::{OsStrExt as _, OsStringExt as _},
    },
    path::Path,
};

/// A forked child waiting for [`PausedChild::release`] before it execs the command.
#[derive(Debug)]
pub struct PausedChild {
    /// The child's pid (stays the same through exec).
    pub pid: u32,
    go: Option<OwnedFd>,
    exec_status: OwnedFd,
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Where a spawned command's standard streams go instead of ours.
#[derive(Debug)]
pub struct Redirect {
    /// Standard input (e.g. /dev/null).
    pub stdin: OwnedFd,
    /// Standard output and error.
    pub output: OwnedFd,
}

/// What the child execs, prepared before the fork (the child allocates nothing): the
/// file, its argv and environment as C arrays, and `sh FILE ARGS…` for a file the kernel
/// cannot execute (ENOEXEC), as `execvp` would.
struct Exec {
    file: CString,
    shell: CString,
    _args: Vec<CString>,
    _environment: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    by_shell: Vec<*const libc::c_char>,
    environ: Vec<*const libc::c_char>,
}

impl Exec {
    fn prepare(
        program: &Path,
        argv: &[OsString],
        env: &[(OsString, OsString)],
    ) -> io::Result<Exec> {
        let c_string = |bytes: &[u8]| {
            CString::new(bytes)
                .map_err(|_| io::Error::other("argument or environment contains NUL"))
        };
        let args: Vec<CString> = argv
            .iter()
            .map(|a| c_string(a.as_bytes()))
            .collect::<Result<_, _>>()?;
        let mut pointers: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        pointers.push(std::ptr::null());
        let file = c_string(program.as_os_str().as_bytes())?;
        let shell = c_string(b"/bin/sh")?;
        let mut by_shell: Vec<*const libc::c_char> = vec![shell.as_ptr(), file.as_ptr()];
        by_shell.extend(&pointers[1.min(pointers.len() - 1)..]);
        let environment: Vec<CString> = std::env::vars_os()
            .filter(|(key, _)| !env.iter().any(|(set, _)| set == key))
            .chain(env.iter().cloned())
            .map(|(key, value)| {
                let mut entry = key.into_vec();
                entry.push(b'=');
                entry.extend(value.as_bytes());
                c_string(&entry)
            })
            .collect::<Result<_, _>>()?;
        let mut environ: Vec<*const libc::c_char> =
            environment.iter().map(|e| e.as_ptr()).collect();
        environ.push(std::ptr::null());
        Ok(Exec {
            file,
            shell,
            _args: args,
            _environment: environment,
            argv: pointers,
            by_shell,
            environ,
        })
    }

    /// Execs (returns only if that failed; errno says why). Async-signal-safe.
    ///
    /// # Safety
    /// In a forked child, before anything else runs in it.
    unsafe fn run(&self) {
        // SAFETY: NUL-terminated strings and null-terminated arrays owned by `self`.
        unsafe {
            libc::execve(
                self.file.as_ptr(),
                self.argv.as_ptr(),
                self.environ.as_ptr(),
            );
            if *libc::__errno_location() == libc::ENOEXEC {
                libc::execve(
                    self.shell.as_ptr(),
                    self.by_shell.as_ptr(),
                    self.environ.as_ptr(),
                );
            }
        }
    }
}

/// Forks a child that will exec `program` (the file the engine's `preflight` resolved
/// `argv[0]` to, and checked: not looked up on PATH again) with `argv` once released, with its standard
/// streams redirected when `redirect` is given and `env` set in its environment (over
/// ours). A file the kernel cannot execute (a script without `#!`) is run by `/bin/sh`, as
/// `execvp` would. Call before any thread is started.
pub fn spawn_paused(
    program: &Path,
    argv: &[OsString],
    redirect: Option<Redirect>,
    env: &[(OsString, OsString)],
) -> io::Result<PausedChild> {
    let exec = Exec::prepare(program, argv, env)?;
    let (go_read, go_write) = pipe()?;
    let (status_read, status_write) = pipe()?;
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: no thread but this one runs here (no runtime yet; `main` waits for
    // this thread); the child only calls
    // async-signal-safe functions (close, prctl, getppid, dup2, read, write, sigaction,
    // sigprocmask, execve, _exit) on memory prepared before.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: child side, see above.
        unsafe {
            // Our copies of the parent's ends: with them open, the read below could never
            // see EOF when the parent dies.
            libc::close(go_write.as_raw_fd());
            libc::close(status_read.as_raw_fd());
            // Killed if the parent dies while this waits; checked once after asking, in
            // case it died before.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            if libc::getppid() != parent {
                libc::_exit(127);
            }
            if let Some(redirect) = &redirect {
                libc::dup2(redirect.stdin.as_raw_fd(), 0);
                libc::dup2(redirect.output.as_raw_fd(), 1);
                libc::dup2(redirect.output.as_raw_fd(), 2);
            }
            let mut byte = 0u8;
            if libc::read(go_read.as_raw_fd(), (&raw mut byte).cast(), 1) == 1 {
                // The command gets SIGTERM if we die while it runs (even by SIGKILL).
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong);
                // The dispositions and mask allocscope was started with (SIGPIPE at its
                // default again, unless our own parent ignored it).
                crate::signals::restore();
                exec.run();
                let errno = *libc::__errno_location();
                libc::write(status_write.as_raw_fd(), (&raw const errno).cast(), 4);
            }
            libc::_exit(127);
        }
    }
    drop((go_read, status_write, redirect));
    Ok(PausedChild {
        pid: pid as u32,
        go: Some(go_write),
        exec_status: status_read,
    })
}

impl PausedChild {
    /// Lets the child exec and waits until it has (`Ok`) or failed to (`Err` with the
    /// reason; the child then exits with status 127).
    pub fn release(mut self) -> io::Result<()> {
        let go = self
            .go
            .take()
            .ok_or_else(|| io::Error::other("released twice"))?;
        let byte = 1u8;
        // SAFETY: writing one byte from a live local to a pipe we own.
        if unsafe { libc::write(go.as_raw_fd(), (&raw const byte).cast(), 1) } != 1 {
            let error = io::Error::last_os_error();
            self.go = Some(go);
            return Err(error);
        }
        let mut errno = 0i32;
        // SAFETY: reading at most 4 bytes into a live local.
        let n = unsafe { libc::read(self.exec_status.as_raw_fd(), (&raw mut errno).cast(), 4) };
        if n == 4 {
            Err(io::Error::from_raw_os_error(errno))
        } else {
            Ok(())
        }
    }
}

impl Drop for PausedChild {
    /// A child never released (the start failed after the fork) is killed and reaped.
    fn drop(&mut self) {
        if self.go.take().is_some() {
            // SAFETY: kill and waitpid on our own, never-released child.
            unsafe {
                libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
                libc::waitpid(self.pid as libc::pid_t, std::ptr::null_mut(), 0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::process::state_of;

    #[test]
    fn an_unreleased_child_is_killed_and_reaped() {
        let child = spawn_paused(Path::new("/bin/true"), &["true".into()], None, &[]).unwrap();
        let pid = child.pid;
        assert!(state_of(pid).is_some(), "the paused child exists");
        drop(child);
        assert_eq!(state_of(pid), None, "gone, not even a zombie");
    }

    #[test]
    fn a_released_child_runs_the_command() {
        let child = spawn_paused(Path::new("/bin/true"), &["true".into()], None, &[]).unwrap();
        let pid = child.pid as libc::pid_t;
        child.release().unwrap();
        let mut status = 0;
        // SAFETY: waiting for our own child with a pointer to a local.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }

    /// Runs `program` as `argv`; its exit status.
    fn status_of(program: &Path, argv: &[&str]) -> i32 {
        let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
        let child = spawn_paused(program, &argv, None, &[]).unwrap();
        let pid = child.pid as libc::pid_t;
        child.release().unwrap();
        let mut status = 0;
        // SAFETY: waiting for our own child with a pointer to a local.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status));
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn the_resolved_file_runs_not_argv0_looked_up_again() {
        // argv[0] says `false`; the file resolved is /bin/true.
        assert_eq!(status_of(Path::new("/bin/true"), &["false"]), 0);
    }

    #[test]
    fn a_script_without_an_interpreter_line_runs_in_sh_with_its_arguments() {
        let nanos = std::time::UNIX_EPOCH.elapsed().unwrap().subsec_nanos();
        let dir =
            std::env::temp_dir().join(format!("allocscope-spawn-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let script = dir.join("script");
        std::fs::write(&script, "exit $(($1 + $2))\n").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let status = status_of(&script, &["script", "3", "4"]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(status, 7);
    }
}
