//! Go processes read, not probed: a process that was running before the recording (`-p`)
//! and whose runtime's heap profile can be read ([`crate::probe::go::buckets`]) has no probe
//! put in it; its buckets are read every [`READ_EVERY`] instead and what changed is taken
//! in as the probes' events would be ([`crate::probe::go::reader`]).
//!
//! Why only those: a process that ends during the recording takes the samples since its
//! last reading with it (up to [`READ_EVERY`]); a command allocscope starts, or a process
//! followed from its fork, usually ends while recorded, and is probed as before.

use std::collections::BTreeMap;

use log::{debug, info, warn};

use crate::{collect::Event, probe::allocator::Allocator, probe::go::reader::GoProfile};

pub(crate) use crate::probe::go::reader::READ_EVERY;

/// What a Go process read, not probed, that ended while recorded leaves out.
pub(super) const ENDED_UNREAD: &str = "its Go heap profile was read every 100 ms: the \
     samples of its last moments, after the last reading, ended with it";

/// Readings in a row that may fail before a process still there is taken as gone.
const FAILURES: u32 = 3;

// The descriptions say the interval.
const _: () = assert!(READ_EVERY.as_millis() == 100);

/// The Go processes being read, by pid.
#[derive(Default)]
pub(super) struct GoReaders {
    profiles: BTreeMap<u32, GoProfile>,
    /// Processes found gone by a reading, not yet ended, with what their readings left
    /// out: their last interval is not in the samples.
    gone: BTreeMap<u32, Vec<String>>,
    /// Processes read that exec'd a new program, with what the readings of the programs
    /// before left out; `true` until the new one is read from zero ([`Self::start`]).
    earlier: BTreeMap<u32, (bool, Vec<String>)>,
}

/// What a Go process read, not probed, that exec'd a new program leaves out.
pub(super) const EXEC_UNREAD: &str = "its Go heap profile was read every 100 ms: the \
     samples of a program's last moments before it exec'd another were not read";

impl GoReaders {
    /// Starts reading `pid`'s Go runtime `allocator` if it can be read; whether it is.
    pub(super) fn start(&mut self, pid: u32, allocator: &Allocator) -> bool {
        let (Some(producer), Some(places)) = (&allocator.file.producer, &allocator.file.go) else {
            return false;
        };
        let (Ok(layout), rate_at) = (&places.buckets, places.rate_at) else {
            return false;
        };
        let Some(bias) = producer.bias_in(pid, &allocator.file_id) else {
            return false;
        };
        let mut layout = (**layout).clone();
        layout.head = layout.head.wrapping_add(bias);
        let rate_at = rate_at.wrapping_add(bias);
        let again = self.restarts(pid);
        let mut profile = match GoProfile::open(pid, layout, rate_at) {
            // A new program's runtime began at its exec: all it has is the recording's.
            Ok(profile) if again => profile.begun_at_exec(),
            Ok(profile) => profile,
            Err(e) => {
                debug!("pid {pid}: its Go heap profile cannot be read ({e}): probed instead");
                return false;
            }
        };
        // The first reading is the baseline: what it finds was before the recording.
        if let Err(e) = profile.read(crate::collect::monotonic_ns()) {
            debug!("pid {pid}: its Go heap profile cannot be read ({e}): probed instead");
            return false;
        }
        info!("pid {pid}: its Go runtime's heap profile is read every {READ_EVERY:?}, no probe");
        self.profiles.insert(pid, profile);
        if let Some((pending, _)) = self.earlier.get_mut(&pid) {
            *pending = false;
        }
        true
    }

    /// `pid`, read, exec'd a new program: its old program's profile is read no more (its
    /// memory is gone); the new one's is read from zero if it can be, once its files are
    /// found ([`Self::start`]; [`Self::restarts`] says whether).
    pub(super) fn exec(&mut self, pid: u32) {
        if !self.profiles.contains_key(&pid) {
            return;
        }
        let (_, mut notes) = self.earlier.remove(&pid).unwrap_or_default();
        notes.extend(self.losses(pid));
        notes.push(EXEC_UNREAD.to_owned());
        notes.sort();
        notes.dedup();
        self.profiles.remove(&pid);
        self.gone.remove(&pid);
        self.earlier.insert(pid, (true, notes));
    }

    /// Whether `pid` exec'd while read, its new program not read yet: it is read too, if it
    /// can be.
    pub(super) fn restarts(&self, pid: u32) -> bool {
        self.earlier.get(&pid).is_some_and(|(pending, _)| *pending)
    }

    /// Whether any process is read.
    pub(super) fn any(&self) -> bool {
        !self.profiles.is_empty()
    }

    /// Whether `pid` is read.
    pub(super) fn reads(&self, pid: u32) -> bool {
        self.profiles.contains_key(&pid)
    }

    /// Reads every process's profile now: the events since each one's last reading. A
    /// process that cannot be read any more (gone) is dropped, noted as ended unread.
    pub(super) fn read_all(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        let now = crate::collect::monotonic_ns();
        let mut gone = Vec::new();
        for (&pid, profile) in &mut self.profiles {
            match profile.read(now) {
                Ok(more) => events.extend(more),
                // Still there: read again next time (what changed meanwhile is not lost,
                // the counts are totals), up to a few times in a row (then it is gone, or
                // another program since an exec).
                Err(e) if profile.failed() < FAILURES && crate::sys::process::exists(pid) => {
                    debug!("pid {pid}: its Go heap profile was not read this time ({e})");
                }
                Err(e) => {
                    if crate::sys::process::exists(pid) {
                        warn!("pid {pid}: its Go heap profile is read no more: {e}");
                    } else {
                        debug!("pid {pid}: its Go heap profile is not readable any more ({e})");
                    }
                    gone.push(pid);
                }
            }
        }
        for pid in gone {
            let notes = self.losses(pid);
            self.profiles.remove(&pid);
            self.gone.insert(pid, notes);
        }
        events
    }

    /// `pid` exited: it is read no more; whether it was read (its last interval is lost),
    /// and what its readings left out.
    pub(super) fn end(&mut self, pid: u32) -> (bool, Vec<String>) {
        let (_, mut notes) = self.earlier.remove(&pid).unwrap_or_default();
        if let Some(more) = self.gone.remove(&pid) {
            notes.extend(more);
            return (true, notes);
        }
        notes.extend(self.losses(pid));
        (self.profiles.remove(&pid).is_some(), notes)
    }

    /// What the readings of `pid`'s current program had to leave out, for its notes (asked
    /// once per process: at its end, or at the recording's).
    pub(super) fn losses(&self, pid: u32) -> Vec<String> {
        let Some(profile) = self.profiles.get(&pid) else {
            return Vec::new();
        };
        let (buckets, untracked) = profile.losses();
        let mut notes = Vec::new();
        if buckets > 0 {
            notes.push(format!(
                "{buckets} of its Go heap profile's buckets (stacks) were not read (more \
                 than {} or unreadable): their samples are missing",
                crate::probe::go::reader::MAX_BUCKETS
            ));
        }
        if untracked > 0 {
            notes.push(format!(
                "{untracked} sampled blocks' frees could not be followed (more than {} \
                 live): they count as live",
                crate::probe::go::reader::MAX_LIVE
            ));
        }
        notes
    }

    /// Every process read, and what each one's readings left out (of every program it
    /// ran while read).
    pub(super) fn all_losses(&self) -> Vec<(u32, String)> {
        let earlier = self
            .earlier
            .iter()
            .flat_map(|(&pid, (_, notes))| notes.iter().map(move |n| (pid, n.clone())));
        let pids: Vec<u32> = self.profiles.keys().copied().collect();
        let current = pids
            .into_iter()
            .flat_map(|pid| self.losses(pid).into_iter().map(move |n| (pid, n)));
        earlier.chain(current).collect()
    }
}
