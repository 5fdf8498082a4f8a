//! What a stop would change in a thread blocked in a system call, read before it is stopped
//! (`/proc/PID/task/TID/syscall`), and the one change a stop that came anyway can undo.
//!
//! A ptrace stop is seen by the program where the kernel does not restart the call it
//! interrupts (signal(7), "Interruption of system calls and library functions by stop
//! signals"): the epoll family, `io_getevents`, `semop`, `sigtimedwait` and sockets with
//! a timeout return `EINTR`; and the signal frame a stopped thread resumes through (see
//! [`super::frame`]) forgets a restart block, so `nanosleep`, `poll` with a timeout and a
//! relative `futex` wait are issued again from their start, for their whole time. So a
//! thread blocked in one of those is not taken, unless issuing it again is exact (no
//! timeout; an absolute one; a `nanosleep` whose remaining time the kernel writes where it
//! reads its request), and a thread in the middle of a `fork` or of the allocator's own
//! calls is never taken (it may hold every allocator lock). A thread taken running that
//! entered such a call just before the stop came back from it with `EINTR`: issued again
//! ([`issued_again`]), which lengthens it by no more than the stop's own moment.
//!
//! Pure: decisions from system call numbers and arguments (x86-64).

/// What a thread was doing before it was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Doing {
    /// Running (or runnable): no system call to interrupt.
    Running,
    /// Blocked outside any system call (a page fault): nothing to interrupt either.
    Faulting,
    /// Blocked in system call `number` with these arguments.
    Blocked { number: u64, args: [u64; 6] },
}

/// Parses a `/proc/PID/task/TID/syscall` text: `running`, `-1 SP PC`, or `NR A1 … A6 SP PC`
/// (arguments in hex). `None` when it is none of these.
pub(super) fn parse(text: &str) -> Option<Doing> {
    let text = text.trim();
    if text == "running" {
        return Some(Doing::Running);
    }
    let mut fields = text.split(' ');
    let number: i64 = fields.next()?.parse().ok()?;
    if number < 0 {
        return Some(Doing::Faulting);
    }
    let mut args = [0u64; 6];
    for arg in &mut args {
        *arg = u64::from_str_radix(fields.next()?.trim_start_matches("0x"), 16).ok()?;
    }
    Some(Doing::Blocked {
        number: number as u64,
        args,
    })
}

/// What stopping a thread doing this would do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// Nothing the program can see: the call is restarted as the kernel would, or issued
    /// again exactly.
    Unseen,
    /// The call would return early (`EINTR`) or take longer (its timeout started again):
    /// wait for it to return.
    Seen(&'static str),
    /// It may hold the allocator's locks (in `fork`, or a call the allocator makes
    /// holding them): `dlopen` there would wait on itself.
    HoldsLocks(&'static str),
}

mod nr {
    pub(super) const READ: u64 = 0;
    pub(super) const WRITE: u64 = 1;
    pub(super) const POLL: u64 = 7;
    pub(super) const MMAP: u64 = 9;
    pub(super) const MPROTECT: u64 = 10;
    pub(super) const MUNMAP: u64 = 11;
    pub(super) const BRK: u64 = 12;
    pub(super) const READV: u64 = 19;
    pub(super) const WRITEV: u64 = 20;
    pub(super) const MREMAP: u64 = 25;
    pub(super) const MADVISE: u64 = 28;
    pub(super) const NANOSLEEP: u64 = 35;
    pub(super) const CONNECT: u64 = 42;
    pub(super) const ACCEPT: u64 = 43;
    pub(super) const SENDTO: u64 = 44;
    pub(super) const RECVFROM: u64 = 45;
    pub(super) const SENDMSG: u64 = 46;
    pub(super) const RECVMSG: u64 = 47;
    pub(super) const CLONE: u64 = 56;
    pub(super) const FORK: u64 = 57;
    pub(super) const VFORK: u64 = 58;
    pub(super) const EXECVE: u64 = 59;
    pub(super) const SEMOP: u64 = 65;
    pub(super) const RT_SIGTIMEDWAIT: u64 = 128;
    pub(super) const FUTEX: u64 = 202;
    pub(super) const IO_GETEVENTS: u64 = 208;
    pub(super) const SEMTIMEDOP: u64 = 220;
    pub(super) const CLOCK_NANOSLEEP: u64 = 230;
    pub(super) const EPOLL_WAIT: u64 = 232;
    pub(super) const EPOLL_PWAIT: u64 = 281;
    pub(super) const ACCEPT4: u64 = 288;
    pub(super) const RECVMMSG: u64 = 299;
    pub(super) const SENDMMSG: u64 = 307;
    pub(super) const EXECVEAT: u64 = 322;
    pub(super) const MEMBARRIER: u64 = 324;
    pub(super) const IO_PGETEVENTS: u64 = 333;
    pub(super) const IO_URING_ENTER: u64 = 426;
    pub(super) const CLONE3: u64 = 435;
    pub(super) const EPOLL_PWAIT2: u64 = 441;
}

/// Calls that return `EINTR` after a stop (with no handler anywhere), and the index of the
/// argument that holds their timeout: `Some(i)` a pointer (null: none), for the epoll pair
/// an int (negative: none), `None` when they have no timeout at all.
const EINTR_AFTER_STOP: &[(u64, Timeout)] = &[
    (nr::EPOLL_WAIT, Timeout::Millis(3)),
    (nr::EPOLL_PWAIT, Timeout::Millis(3)),
    (nr::EPOLL_PWAIT2, Timeout::Pointer(3)),
    (nr::IO_GETEVENTS, Timeout::Pointer(4)),
    (nr::IO_PGETEVENTS, Timeout::Pointer(4)),
    (nr::SEMOP, Timeout::None),
    (nr::SEMTIMEDOP, Timeout::Pointer(3)),
    (nr::RT_SIGTIMEDWAIT, Timeout::Pointer(2)),
];

#[derive(Clone, Copy)]
enum Timeout {
    None,
    Pointer(usize),
    Millis(usize),
}

impl Timeout {
    fn is_set(self, args: &[u64; 6]) -> bool {
        match self {
            Timeout::None => false,
            Timeout::Pointer(i) => args[i] != 0,
            Timeout::Millis(i) => (args[i] as i32) >= 0,
        }
    }
}

/// Calls on a descriptor that return `EINTR` after a stop when it is a socket with a
/// receive or send timeout.
pub(super) const SOCKET_CALLS: &[u64] = &[
    nr::READ,
    nr::WRITE,
    nr::READV,
    nr::WRITEV,
    nr::CONNECT,
    nr::ACCEPT,
    nr::ACCEPT4,
    nr::SENDTO,
    nr::RECVFROM,
    nr::SENDMSG,
    nr::RECVMSG,
    nr::RECVMMSG,
    nr::SENDMMSG,
];

/// Calls an allocator makes while it may hold its lock, and `fork`, which holds them all.
const HOLDING_LOCKS: &[u64] = &[
    nr::MMAP,
    nr::MPROTECT,
    nr::MUNMAP,
    nr::BRK,
    nr::MREMAP,
    nr::MADVISE,
    nr::MEMBARRIER,
    nr::CLONE,
    nr::CLONE3,
    nr::FORK,
    nr::VFORK,
    nr::EXECVE,
    nr::EXECVEAT,
];

const TIMER_ABSTIME: u64 = 1;
/// The operation's bits of a `futex` op (without `FUTEX_PRIVATE_FLAG`, `FUTEX_CLOCK_REALTIME`).
const FUTEX_CMD: u64 = 127;
const FUTEX_WAIT: u64 = 0;

/// Whether `number` creates a process (`fork`, `vfork`, `clone`, `clone3`).
pub(super) fn forks(number: u64) -> bool {
    matches!(number, nr::CLONE | nr::CLONE3 | nr::FORK | nr::VFORK)
}

/// Whether `number` is a call an allocator makes holding its lock, or `fork`'s.
pub(super) fn holds_locks(number: u64) -> bool {
    HOLDING_LOCKS.contains(&number)
}

/// What stopping a thread blocked in `number` with `args` would do (`socket_timeout`: the
/// descriptor in its first argument is a socket with a timeout, for [`SOCKET_CALLS`]).
pub(super) fn stop_in(number: u64, args: &[u64; 6], socket_timeout: bool) -> Stop {
    if HOLDING_LOCKS.contains(&number) {
        return Stop::HoldsLocks(if matches!(number, nr::CLONE | nr::CLONE3 | nr::FORK) {
            "forking"
        } else {
            "in a call its allocator makes holding its lock"
        });
    }
    if let Some((_, timeout)) = EINTR_AFTER_STOP.iter().find(|(n, _)| *n == number) {
        return if timeout.is_set(args) {
            Stop::Seen("in a timed wait a stop cuts short (EINTR)")
        } else {
            Stop::Unseen
        };
    }
    if SOCKET_CALLS.contains(&number) && socket_timeout {
        return Stop::Seen("on a socket with a timeout, which a stop cuts short (EINTR)");
    }
    const RESTARTED_LONGER: Stop = Stop::Seen("in a timed sleep a stop would lengthen");
    match number {
        // The remaining time is written back where the request is read from: exact.
        nr::NANOSLEEP if args[0] == args[1] => Stop::Unseen,
        nr::NANOSLEEP => RESTARTED_LONGER,
        nr::CLOCK_NANOSLEEP if args[1] & TIMER_ABSTIME != 0 || args[2] == args[3] => Stop::Unseen,
        nr::CLOCK_NANOSLEEP => RESTARTED_LONGER,
        nr::POLL if (args[2] as i32) > 0 => RESTARTED_LONGER,
        nr::FUTEX if args[1] & FUTEX_CMD == FUTEX_WAIT && args[3] != 0 => RESTARTED_LONGER,
        nr::IO_URING_ENTER => Stop::Seen("in io_uring_enter, which a stop may cut short"),
        _ => Stop::Unseen,
    }
}

/// Whether a thread stopped right after system call `number` returned `rax` came back
/// early because of the stop (the calls that return `EINTR` after one), so that it is to be
/// issued again. `signal_pending`: a signal it does not block is pending for it (then the
/// `EINTR` is that signal's, as natively).
pub(super) fn issued_again(number: u64, rax: u64, signal_pending: bool) -> bool {
    const EINTR: i64 = -4;
    rax as i64 == EINTR
        && !signal_pending
        && (EINTR_AFTER_STOP.iter().any(|(n, _)| *n == number) || SOCKET_CALLS.contains(&number))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_syscall_texts_are_read() {
        assert_eq!(parse("running\n"), Some(Doing::Running));
        assert_eq!(parse("-1 0x7ffd1000 0x4011d0\n"), Some(Doing::Faulting));
        assert_eq!(
            parse("232 0x3 0x7ffd0 0x40 0xffffffff 0x0 0x0 0x7ffd1000 0x7f001234\n"),
            Some(Doing::Blocked {
                number: 232,
                args: [3, 0x7ffd0, 0x40, 0xffff_ffff, 0, 0]
            })
        );
        assert_eq!(parse("232 0x3"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn untimed_waits_are_unseen_and_timed_ones_that_a_stop_cuts_short_are_not() {
        let forever = [3, 0, 64, 0xffff_ffff, 0, 0];
        let half_second = [3, 0, 64, 500, 0, 0];
        for epoll in [nr::EPOLL_WAIT, nr::EPOLL_PWAIT] {
            assert_eq!(stop_in(epoll, &forever, false), Stop::Unseen);
            assert!(matches!(stop_in(epoll, &half_second, false), Stop::Seen(_)));
        }
        assert!(matches!(
            stop_in(nr::EPOLL_PWAIT2, &[3, 0, 64, 0x7ffd0, 0, 0], false),
            Stop::Seen(_)
        ));
        assert_eq!(
            stop_in(nr::EPOLL_PWAIT2, &[3, 0, 64, 0, 0, 0], false),
            Stop::Unseen
        );
        assert_eq!(stop_in(nr::SEMOP, &[0; 6], false), Stop::Unseen);
        // A pipe read is restarted; a socket read with a timeout is not.
        assert_eq!(stop_in(nr::READ, &[0; 6], false), Stop::Unseen);
        assert!(matches!(stop_in(nr::READ, &[0; 6], true), Stop::Seen(_)));
        assert_eq!(stop_in(nr::ACCEPT, &[0; 6], false), Stop::Unseen);
    }

    #[test]
    fn sleeps_are_taken_only_where_issuing_them_again_is_exact() {
        // sleep(3): nanosleep(&ts, &ts).
        assert_eq!(
            stop_in(nr::NANOSLEEP, &[0x10, 0x10, 0, 0, 0, 0], false),
            Stop::Unseen
        );
        // usleep: no remaining time written.
        assert!(matches!(
            stop_in(nr::NANOSLEEP, &[0x10, 0, 0, 0, 0, 0], false),
            Stop::Seen(_)
        ));
        let clock =
            |flags, req, rem| stop_in(nr::CLOCK_NANOSLEEP, &[1, flags, req, rem, 0, 0], false);
        assert_eq!(clock(TIMER_ABSTIME, 0x10, 0), Stop::Unseen);
        assert_eq!(clock(0, 0x10, 0x10), Stop::Unseen);
        assert!(matches!(clock(0, 0x10, 0), Stop::Seen(_)));
        assert_eq!(
            stop_in(nr::POLL, &[0, 1, 0xffff_ffff, 0, 0, 0], false),
            Stop::Unseen
        );
        assert!(matches!(
            stop_in(nr::POLL, &[0, 1, 100, 0, 0, 0], false),
            Stop::Seen(_)
        ));
        // A lock or condition wait (FUTEX_WAIT, private), with and without a timeout; the
        // absolute FUTEX_WAIT_BITSET is exact.
        assert_eq!(
            stop_in(nr::FUTEX, &[0x10, 128, 0, 0, 0, 0], false),
            Stop::Unseen
        );
        assert!(matches!(
            stop_in(nr::FUTEX, &[0x10, 128, 0, 0x20, 0, 0], false),
            Stop::Seen(_)
        ));
        assert_eq!(
            stop_in(nr::FUTEX, &[0x10, 9 | 128, 0, 0x20, 0, 0], false),
            Stop::Unseen
        );
    }

    #[test]
    fn fork_and_the_allocators_calls_may_hold_its_locks() {
        for call in [
            nr::CLONE,
            nr::CLONE3,
            nr::FORK,
            nr::MMAP,
            nr::MUNMAP,
            nr::BRK,
        ] {
            assert!(matches!(stop_in(call, &[0; 6], false), Stop::HoldsLocks(_)));
        }
    }

    #[test]
    fn only_an_eintr_the_stop_made_is_issued_again() {
        let eintr = (-4i64) as u64;
        assert!(issued_again(nr::EPOLL_WAIT, eintr, false));
        assert!(issued_again(nr::RECVFROM, eintr, false));
        // A signal for it is pending: the EINTR is the signal's.
        assert!(!issued_again(nr::EPOLL_WAIT, eintr, true));
        // Returned (events, or an error of its own), or a call the kernel restarts.
        assert!(!issued_again(nr::EPOLL_WAIT, 1, false));
        assert!(!issued_again(nr::EPOLL_WAIT, (-9i64) as u64, false));
        assert!(!issued_again(nr::NANOSLEEP, eintr, false));
    }
}
