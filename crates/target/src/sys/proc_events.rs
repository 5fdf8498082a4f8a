//! The kernel's process events (the netlink proc connector) while the probes load.
//!
//! Why: `record -- CMD` counted in-process lets the command run at once, while the eBPF
//! programs load (docs/performance.md, "Figures quoted from the code"), and its tree's
//! processes keep early records through the library. A child that drops the library in that
//! window (a cleared environment, its own `LD_PRELOAD`, a static or set-user-ID program)
//! and exits before the probes are attached left no trace at all: its allocations were
//! missing without a word. The proc connector reports every fork, exec and exit from the
//! moment its socket listens (a few system calls, before the command is let go), so those
//! processes are named, with what their numbers leave out, instead of vanishing.
//!
//! The events are read by a thread (the parsing and the tree are pure, below); a child's
//! name is read from `/proc` at its exec (one gone already is named by its pid). An
//! overflowing socket is said: processes may then be missing unnamed.

use std::{
    collections::BTreeMap,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
};

const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_FORK: u32 = 0x1;
const PROC_EVENT_EXEC: u32 = 0x2;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// `nlmsghdr` (16 bytes), then `cn_msg` (20), then `proc_event`.
const EVENT_AT: usize = 36;

/// One process event of interest (`at_ns`: when, CLOCK_MONOTONIC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A new process (not a thread).
    Fork {
        /// Its parent's pid.
        parent: u32,
        /// Its pid.
        child: u32,
        /// When.
        at_ns: u64,
    },
    /// A process ran a new program.
    Exec {
        /// Its pid.
        pid: u32,
        /// When.
        at_ns: u64,
    },
    /// A process ended (its last thread).
    Exit {
        /// Its pid.
        pid: u32,
        /// When.
        at_ns: u64,
    },
}

/// Reads one connector message (a `proc_event` behind its netlink and connector headers);
/// `None` for anything else (threads' forks and exits, other kinds, short messages).
pub(crate) fn parse(message: &[u8]) -> Option<Event> {
    let word = |at: usize| {
        Some(u32::from_ne_bytes(
            message
                .get(EVENT_AT + at..EVENT_AT + at + 4)?
                .try_into()
                .ok()?,
        ))
    };
    let at_ns = u64::from_ne_bytes(message.get(EVENT_AT + 8..EVENT_AT + 16)?.try_into().ok()?);
    match word(0)? {
        PROC_EVENT_FORK => {
            let (parent, child_pid, child) = (word(20)?, word(24)?, word(28)?);
            (child_pid == child).then_some(Event::Fork {
                parent,
                child,
                at_ns,
            })
        }
        PROC_EVENT_EXEC => Some(Event::Exec {
            pid: word(20)?,
            at_ns,
        }),
        PROC_EVENT_EXIT => {
            let (pid, tgid) = (word(16)?, word(20)?);
            (pid == tgid).then_some(Event::Exit { pid, at_ns })
        }
        _ => None,
    }
}

/// A process of the tree, as its events told it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Member {
    /// Its latest exec: when, and the program's name if it could be read then.
    pub exec: Option<(u64, Option<String>)>,
    /// When it exited, if it did.
    pub exited_ns: Option<u64>,
}

/// The command's tree: its root and every process forked from it, with their execs and
/// exits.
#[derive(Debug, Default)]
pub struct Tree {
    /// By pid.
    pub members: BTreeMap<u32, Member>,
    /// Events were lost (the socket overflowed): the tree may be incomplete.
    pub lost: bool,
}

impl Tree {
    /// A tree of `root` alone.
    pub(crate) fn new(root: u32) -> Self {
        let mut members = BTreeMap::new();
        members.insert(root, Member::default());
        Self {
            members,
            lost: false,
        }
    }

    /// Takes in `event`; at an exec of a member, its program's name is what `named` reads
    /// now (while it most likely lives).
    pub(crate) fn apply(&mut self, event: Event, named: impl FnOnce(u32) -> Option<String>) {
        match event {
            Event::Fork { parent, child, .. } if self.members.contains_key(&parent) => {
                self.members.insert(child, Member::default());
            }
            Event::Exec { pid, at_ns } => {
                if let Some(member) = self.members.get_mut(&pid) {
                    member.exec = Some((at_ns, named(pid)));
                }
            }
            Event::Exit { pid, at_ns } => {
                if let Some(member) = self.members.get_mut(&pid) {
                    member.exited_ns = Some(at_ns);
                }
            }
            Event::Fork { .. } => {}
        }
    }

    /// Whether every member has exited, no event lost: the tree is complete and gone (a
    /// fork needs a living member, so none can join it any more).
    pub(crate) fn all_exited(&self) -> bool {
        !self.lost && self.members.values().all(|m| m.exited_ns.is_some())
    }

    /// The members that exited after an exec: each with the time and name of its latest
    /// exec (the candidates for a process that dropped the library unseen).
    pub fn gone_after_exec(&self) -> Vec<(u32, u64, Option<&str>)> {
        self.members
            .iter()
            .filter(|(_, m)| m.exited_ns.is_some())
            .filter_map(|(&pid, m)| {
                let (at, name) = m.exec.as_ref()?;
                Some((pid, *at, name.as_deref()))
            })
            .collect()
    }
}

/// A listening connector socket and the thread reading it (stopped when dropped).
pub struct Watch {
    stop: Arc<AtomicBool>,
    /// Set once [`Tree::all_exited`] holds.
    gone: Arc<AtomicBool>,
    /// Written once to wake the reader when it is to stop (never read: it stays readable).
    wake: Arc<OwnedFd>,
    reader: Option<JoinHandle<Tree>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop_reader();
    }
}

impl Watch {
    /// Listens for process events, following the tree of `root` (a paused child, not let
    /// go yet). Fails where the connector is unavailable (not root, a kernel without it).
    pub fn start(root: u32) -> io::Result<Self> {
        let socket = listen()?;
        // SAFETY: eventfd with constant flags; the result is checked.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor we just opened.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(wake) });
        let stop = Arc::new(AtomicBool::new(false));
        let gone = Arc::new(AtomicBool::new(false));
        let reading = Reading {
            socket,
            wake: wake.clone(),
            stop: stop.clone(),
            gone: gone.clone(),
        };
        let reader = std::thread::Builder::new()
            .name("proc-events".into())
            .spawn(move || reading.until_stopped(Tree::new(root)))?;
        Ok(Self {
            stop,
            gone,
            wake,
            reader: Some(reader),
        })
    }

    /// Tells the reader to stop, waking it.
    fn stop_reader(&self) {
        self.stop.store(true, Ordering::Release);
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live local to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Whether the whole tree has exited (every member's exit read, no event lost).
    pub fn gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Stops listening (after the events queued so far are read) and returns the tree.
    pub fn finish(mut self) -> Tree {
        self.stop_reader();
        let reader = self.reader.take();
        reader.and_then(|r| r.join().ok()).unwrap_or_default()
    }
}

/// A connector socket bound to the process events' group, listening, with a large buffer.
fn listen() -> io::Result<OwnedFd> {
    // SAFETY: plain socket call; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_CONNECTOR,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just opened.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = socket.as_raw_fd();
    // SAFETY: a zeroed sockaddr_nl is valid; the fields are set below.
    let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    address.nl_family = libc::AF_NETLINK as u16;
    address.nl_groups = CN_IDX_PROC;
    // SAFETY: binding our socket to an address of the right size.
    let bound = unsafe {
        libc::bind(
            raw,
            (&address as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if bound < 0 {
        return Err(io::Error::last_os_error());
    }
    set_option(raw, libc::SO_RCVBUFFORCE, 8 << 20);
    let request = listen_request();
    // SAFETY: sends our buffer, of its length.
    let sent = unsafe { libc::send(raw, request.as_ptr().cast(), request.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

fn set_option(fd: i32, option: i32, value: i32) {
    // SAFETY: an int option of the right size; a refusal leaves the default.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as u32,
        )
    };
}

/// The `PROC_CN_MCAST_LISTEN` message: netlink header, connector header, the operation.
fn listen_request() -> Vec<u8> {
    let length = 16 + 20 + 4;
    let mut message = Vec::with_capacity(length);
    message.extend_from_slice(&(length as u32).to_ne_bytes());
    message.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
    message.extend_from_slice(&0u16.to_ne_bytes()); // flags
    message.extend_from_slice(&0u32.to_ne_bytes()); // sequence
    message.extend_from_slice(&std::process::id().to_ne_bytes());
    message.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
    message.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
    message.extend_from_slice(&0u32.to_ne_bytes()); // sequence
    message.extend_from_slice(&0u32.to_ne_bytes()); // acknowledgement
    message.extend_from_slice(&4u16.to_ne_bytes()); // data length
    message.extend_from_slice(&0u16.to_ne_bytes()); // flags
    message.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
    message
}

/// The reader thread's side: the socket, its wake-up, its flags.
struct Reading {
    socket: OwnedFd,
    wake: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    /// Set once the whole tree has exited.
    gone: Arc<AtomicBool>,
}

impl Reading {
    /// Reads events into `tree` until told to stop and nothing more is queued. At the
    /// ordinary priority: raised to −20 (to read a 1 ms child's name before it is gone), it
    /// took a core from the rest of allocscope's start often enough that 1 run in 4 of 150
    /// quick children lost one of them entirely (torture #39.8).
    fn until_stopped(self, mut tree: Tree) -> Tree {
        let mut buffer = [0u8; 256];
        loop {
            let stopping = self.stop.load(Ordering::Acquire);
            // SAFETY: receives into our buffer, within its length.
            let n = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::ENOBUFS) => tree.lost = true,
                    Some(libc::EINTR) => {}
                    Some(libc::EAGAIN) if !stopping => self.wait(),
                    _ => return tree,
                }
                continue;
            }
            if let Some(event) = parse(&buffer[..n as usize]) {
                tree.apply(event, crate::sys::process::comm_of);
                if matches!(event, Event::Exit { .. }) && tree.all_exited() {
                    self.gone.store(true, Ordering::Release);
                }
            }
        }
    }

    /// Waits until an event is queued or the reader is told to stop.
    fn wait(&self) {
        let mut fds = [
            libc::pollfd {
                fd: self.socket.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll on two live descriptors; interrupted, the caller tries again.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(what: u32, at_ns: u64, words: &[u32]) -> Vec<u8> {
        let mut m = vec![0u8; EVENT_AT];
        m.extend_from_slice(&what.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes()); // cpu
        m.extend_from_slice(&at_ns.to_ne_bytes());
        for w in words {
            m.extend_from_slice(&w.to_ne_bytes());
        }
        m
    }

    #[test]
    fn forks_execs_and_exits_are_read_and_threads_left_out() {
        let fork = message(PROC_EVENT_FORK, 5, &[10, 10, 11, 11]);
        assert_eq!(
            parse(&fork),
            Some(Event::Fork {
                parent: 10,
                child: 11,
                at_ns: 5
            })
        );
        let thread = message(PROC_EVENT_FORK, 5, &[10, 10, 12, 10]);
        assert_eq!(parse(&thread), None);
        let exec = message(PROC_EVENT_EXEC, 6, &[11, 11]);
        assert_eq!(parse(&exec), Some(Event::Exec { pid: 11, at_ns: 6 }));
        let exit = message(PROC_EVENT_EXIT, 7, &[11, 11, 0, 17, 10, 10]);
        assert_eq!(parse(&exit), Some(Event::Exit { pid: 11, at_ns: 7 }));
        let thread_exit = message(PROC_EVENT_EXIT, 7, &[12, 10, 0, 17, 10, 10]);
        assert_eq!(parse(&thread_exit), None);
        assert_eq!(parse(&exec[..EVENT_AT + 10]), None);
        assert_eq!(parse(&message(0x4, 1, &[1, 1, 1, 1])), None);
    }

    #[test]
    fn the_tree_keeps_its_descendants_and_their_early_execs() {
        let mut tree = Tree::new(10);
        let name = |pid: u32| Some(format!("p{pid}"));
        tree.apply(
            Event::Fork {
                parent: 10,
                child: 11,
                at_ns: 1,
            },
            name,
        );
        tree.apply(
            Event::Fork {
                parent: 11,
                child: 12,
                at_ns: 2,
            },
            name,
        );
        tree.apply(
            Event::Fork {
                parent: 99,
                child: 13,
                at_ns: 2,
            },
            name,
        );
        tree.apply(Event::Exec { pid: 12, at_ns: 3 }, name);
        tree.apply(Event::Exec { pid: 13, at_ns: 3 }, name);
        tree.apply(Event::Exec { pid: 11, at_ns: 50 }, |_| None);
        for pid in [11, 12, 13] {
            tree.apply(Event::Exit { pid, at_ns: 60 }, name);
        }
        assert_eq!(tree.members.len(), 3);
        assert!(!tree.all_exited(), "10, the root, lives");
        tree.apply(Event::Exit { pid: 10, at_ns: 61 }, name);
        assert!(tree.all_exited());
        tree.lost = true;
        assert!(!tree.all_exited(), "an event lost: maybe a member unknown");
        // 13 is not of the tree; 11's latest exec could not be named.
        assert_eq!(
            tree.gone_after_exec(),
            vec![(11, 50, None), (12, 3, Some("p12"))]
        );
        let mut alive = Tree::new(1);
        alive.apply(Event::Exec { pid: 1, at_ns: 3 }, name);
        assert!(alive.gone_after_exec().is_empty());
    }
}
