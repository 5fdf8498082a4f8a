//! The Python frames of early records (samples a command's library took while allocscope
//! attached, see the engine's `recording::early_intake`), resolved while the command runs.
//!
//! The library reads a sample's frames (code objects and instructions) itself; what they
//! name (file, function, line) is read from the process's code objects, as for a kernel
//! sample. Those objects must still exist: a short Python command may have finished and
//! freed them by the time the probes are attached. So a thread reads the records as they
//! are completed, every few milliseconds, and resolves each sample's frames at once; the
//! rest are resolved when the records are taken in.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use sampler_common::preload::EARLY_ALLOC;

use super::{Frames, PythonStack, RawStack};
use crate::preload::{EarlyCopy, EarlyRecords};

/// How often the thread looks for new records.
const POLL: Duration = Duration::from_millis(2);

/// Frames resolved so far, by record index, and the resolver that knows the processes.
pub struct Resolved {
    frames: Frames,
    stacks: HashMap<usize, Option<PythonStack>>,
    /// Processes whose maps were read.
    looked: std::collections::HashSet<u32>,
}

impl Resolved {
    fn new() -> Resolved {
        Resolved {
            frames: Frames::new(None),
            stacks: HashMap::new(),
            looked: std::collections::HashSet::new(),
        }
    }

    /// Resolves record `index` unless done: `None` when it carries no frames the
    /// library read, or they cannot be believed (counted missing). A sample of a process
    /// the library found no interpreter in has none to resolve: it may have been taken
    /// before an exec into Python, which its maps, read now, cannot tell.
    fn resolve(&mut self, index: usize, record: &EarlyCopy) {
        if self.stacks.contains_key(&index) {
            return;
        }
        let head = &record.head;
        let pid = record.pid();
        let stack = if head.kind != EARLY_ALLOC || head.py_head == 0 {
            None
        } else {
            if self.looked.insert(pid) {
                if let Ok(vmas) = crate::sys::maps::read(pid) {
                    self.frames.found_maps(pid, &vmas);
                }
            }
            let raw = RawStack {
                pid,
                tid: head.tid as u32,
                timestamp_ns: head.timestamp_ns,
                flags: head.py_flags,
                frames: record.python.clone(),
            };
            self.frames.of_early(raw, head.py_head)
        };
        self.stacks.insert(index, stack);
    }

    /// Record `index`'s frames (resolved now if they were not).
    pub fn take(&mut self, index: usize, record: &EarlyCopy) -> Option<PythonStack> {
        self.resolve(index, record);
        self.stacks.remove(&index).flatten()
    }

    /// Samples whose frames could not be believed.
    pub fn missing(&self) -> u64 {
        self.frames.missing().load(Ordering::Relaxed)
    }
}

/// The resolving thread (stopped when dropped).
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Resolved>>,
}

impl Watcher {
    /// Starts resolving `records` as they are completed.
    pub fn start(records: EarlyRecords) -> std::io::Result<Watcher> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("early-python".into())
            .spawn(move || {
                let mut resolved = Resolved::new();
                let mut next = 0;
                while !stopped.load(Ordering::Acquire) {
                    next = sweep(&records, next, &mut resolved);
                    std::thread::sleep(POLL);
                }
                resolved
            })?;
        Ok(Watcher {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and returns what it resolved (nothing if it panicked).
    pub fn finish(mut self) -> Resolved {
        self.stop.store(true, Ordering::Release);
        self.thread
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or_else(Resolved::new)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Resolves the complete records from `next` on; returns the first index not complete
/// then (a record being written, or whose writer died: the ones after it are resolved
/// all the same, once).
fn sweep(records: &EarlyRecords, next: usize, resolved: &mut Resolved) -> usize {
    let (claimed, mut first_open) = (records.claimed(), None);
    for index in next..claimed {
        if resolved.stacks.contains_key(&index) {
            continue;
        }
        match records.get_without_stack(index) {
            Some(record) => resolved.resolve(index, &record),
            None => {
                first_open.get_or_insert(index);
            }
        }
    }
    first_open.unwrap_or(claimed.max(next))
}
