//! One event's view of a process: while allocscope handles a fork or an exec of `pid`
//! ([`during`]), each of its /proc text files (`maps`, `status`, `comm`, `stat`,
//! `cgroup`) is read once, and every reader asking again gets that reading; once one is
//! found gone (the process exited and was reaped), so are the others.
//!
//! Why: handling one exec asked the same files several times over (the allocators, the
//! stack table and the front-end check each read `maps`; the front-end check and the
//! resident size each read `status`): in a shell loop of ~1,500 short processes that was
//! ~2,300 reads of `maps` and ~1,500 of `status`, each formatted anew by the kernel, on
//! the core the workload needs. Readings a few microseconds apart say the same thing.
//!
//! What must see the process as it is *after* something changed it (allocscope loaded its
//! library into it, or told the kernel about it, or waited for its loader) calls
//! [`renew`] first. Not held here: the executable link (`exe`), which a reader checks
//! *after* a `maps` reading to tell a read overtaken by the exit (see
//! `StackTable::refresh`), and every file of another process.

use std::{cell::RefCell, io};

/// How a reading failed, kept to be given again as the same `io::Error`.
#[derive(Clone, Copy, Debug)]
struct Failure {
    os: Option<i32>,
    kind: io::ErrorKind,
}

impl Failure {
    fn of(error: &io::Error) -> Self {
        Self {
            os: error.raw_os_error(),
            kind: error.kind(),
        }
    }

    /// The process's /proc directory is gone: it exited and was reaped.
    fn gone(self) -> bool {
        self.kind == io::ErrorKind::NotFound
    }

    fn error(self) -> io::Error {
        match self.os {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::from(self.kind),
        }
    }
}

/// The readings of one event's process.
struct Moment {
    pid: u32,
    readings: Vec<(&'static str, Result<String, Failure>)>,
}

thread_local! {
    static MOMENT: RefCell<Option<Moment>> = const { RefCell::new(None) };
}

/// Puts back the moment that was open before [`during`]'s (none, mostly), even if `f`
/// unwinds.
struct Restore(Option<Moment>);

impl Drop for Restore {
    fn drop(&mut self) {
        let outer = self.0.take();
        MOMENT.with(|moment| *moment.borrow_mut() = outer);
    }
}

/// Runs `f` with `pid`'s /proc text files read at most once each (until [`renew`]).
pub fn during<T>(pid: u32, f: impl FnOnce() -> T) -> T {
    let outer = MOMENT.with(|moment| {
        moment.borrow_mut().replace(Moment {
            pid,
            readings: Vec::new(),
        })
    });
    let _restore = Restore(outer);
    f()
}

/// Forgets the open moment's readings: the process may have changed since (allocscope
/// loaded its library into it or attached its probes, or waited for its loader).
pub fn renew() {
    MOMENT.with(|moment| {
        if let Some(moment) = moment.borrow_mut().as_mut() {
            moment.readings.clear();
        }
    });
}

/// `pid`'s file `what` as `read` reads it, or as it was read already in this moment.
pub(super) fn text(
    pid: u32,
    what: &'static str,
    read: impl FnOnce() -> io::Result<String>,
) -> io::Result<String> {
    let held = MOMENT.with(|moment| {
        let moment = moment.borrow();
        let moment = moment.as_ref().filter(|m| m.pid == pid)?;
        // A process found gone has no other file either (by a file every process has:
        // `cgroup` is absent on a kernel built without cgroups).
        let gone = |w: &str, r: &Result<String, Failure>| {
            w != "cgroup" && r.as_ref().is_err_and(|f| f.gone())
        };
        let (_, reading) = moment
            .readings
            .iter()
            .find(|(w, r)| *w == what || gone(w, r))?;
        Some(reading.clone())
    });
    if let Some(reading) = held {
        return reading.map_err(Failure::error);
    }
    let reading = read();
    MOMENT.with(|moment| {
        if let Some(moment) = moment.borrow_mut().as_mut().filter(|m| m.pid == pid) {
            let kept = reading.as_ref().map(Clone::clone).map_err(Failure::of);
            moment.readings.push((what, kept));
        }
    });
    reading
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn counted(reads: &Cell<u32>, pid: u32, what: &'static str) -> io::Result<String> {
        text(pid, what, || {
            reads.set(reads.get() + 1);
            Ok(format!("{what} {}", reads.get()))
        })
    }

    #[test]
    fn a_file_is_read_once_per_moment_and_again_after_renew() {
        let reads = Cell::new(0);
        during(7, || {
            assert_eq!(counted(&reads, 7, "maps").unwrap(), "maps 1");
            assert_eq!(counted(&reads, 7, "maps").unwrap(), "maps 1");
            assert_eq!(counted(&reads, 7, "status").unwrap(), "status 2");
            // Another process's files are not held.
            assert_eq!(counted(&reads, 8, "maps").unwrap(), "maps 3");
            assert_eq!(counted(&reads, 8, "maps").unwrap(), "maps 4");
            renew();
            assert_eq!(counted(&reads, 7, "maps").unwrap(), "maps 5");
        });
        // Outside a moment, every call reads.
        assert_eq!(counted(&reads, 7, "maps").unwrap(), "maps 6");
        assert_eq!(counted(&reads, 7, "maps").unwrap(), "maps 7");
    }

    #[test]
    fn a_failed_reading_fails_again_the_same_way() {
        during(9, || {
            let gone = || text(9, "maps", || Err(io::Error::from_raw_os_error(libc::ESRCH)));
            assert_eq!(gone().unwrap_err().raw_os_error(), Some(libc::ESRCH));
            let again = text(9, "maps", || Ok("read".into()));
            assert_eq!(again.unwrap_err().raw_os_error(), Some(libc::ESRCH));
        });
    }

    #[test]
    fn a_process_found_gone_is_not_read_again() {
        let reads = Cell::new(0);
        during(5, || {
            let gone = text(5, "maps", || {
                Err(io::Error::from_raw_os_error(libc::ENOENT))
            });
            assert!(gone.is_err());
            assert_eq!(
                counted(&reads, 5, "status").unwrap_err().kind(),
                io::ErrorKind::NotFound
            );
            assert_eq!(reads.get(), 0);
        });
        // Not by a file only some kernels have.
        during(6, || {
            let absent = text(6, "cgroup", || {
                Err(io::Error::from_raw_os_error(libc::ENOENT))
            });
            assert!(absent.is_err());
            assert_eq!(counted(&reads, 6, "maps").unwrap(), "maps 1");
        });
    }

    #[test]
    fn moments_nest_and_the_outer_one_comes_back() {
        let reads = Cell::new(0);
        during(1, || {
            counted(&reads, 1, "comm").unwrap();
            during(2, || {
                assert_eq!(counted(&reads, 2, "comm").unwrap(), "comm 2");
                assert_eq!(counted(&reads, 2, "comm").unwrap(), "comm 2");
            });
            assert_eq!(counted(&reads, 1, "comm").unwrap(), "comm 1");
        });
    }
}
