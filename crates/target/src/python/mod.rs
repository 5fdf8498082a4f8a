//! Python frames in allocation stacks (CPython 3.11+).
//!
//! The kernel program reads the sampling thread's interpreter frame chain at each sampled
//! call ([`sampler_common::python`]) in a process whose interpreter this module found and
//! described to it. Everything else happens here, on the intake thread, while the target
//! still runs: find the interpreter in a process's maps at its first sample ([`detect`]:
//! the executable or `libpython`, its version and [`layout`]), hand the kernel the walk's
//! layout, pair each frames record with its sample, and read the code objects it names
//! from the target's memory ([`objects`], cached per process and address, validated on
//! every use) into names and lines ([`linetable`]). The stacks then put the Python frames
//! where the evaluator's native frames were ([`merge`]).

pub mod detect;
pub mod early_frames;
pub mod layout;
pub(crate) mod linetable;
pub(crate) mod merge;
pub(crate) mod objects;

use std::{collections::HashMap, ops::Range, sync::Arc};

use aya::maps::{HashMap as KernelMap, MapData};
use sampler_common::python::{
    PyFrameEntry, PyLayout, PyStackRecord, MAX_PY_FRAMES, PY_READ_FAILED, PY_TRUNCATED,
};

use crate::sys::maps::{FileId, Vma};
use detect::Interpreter;
use objects::{Code, ProcessMemory};

/// A Python function as a frame shows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PyFunction {
    /// `co_qualname` (`Class.method`, `<listcomp>`, `<module>`), or a marker for a code
    /// object that could not be read.
    pub qualname: Arc<str>,
    /// `co_filename`.
    pub filename: Arc<str>,
}

/// One Python frame of a sample.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// Its function.
    pub function: PyFunction,
    /// The line running (unknown: 0).
    pub line: u32,
}

/// A sample's Python frames, grouped by the evaluator call that ran them (leaf first), and
/// how to find those calls among its native frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonStack {
    /// Leaf first; each group replaces one `_PyEval_EvalFrameDefault` frame.
    pub groups: Vec<Vec<PyFrame>>,
    /// The interpreter's file (its native frames are the call machinery).
    pub interpreter: FileId,
    /// File offsets of `_PyEval_EvalFrameDefault` in it.
    pub eval: Range<u64>,
}

/// How frames are merged (`--python-frames`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    /// The interpreter's call machinery below Python frames left out.
    Python,
    /// Every native frame kept.
    All,
}

/// A Python frames record, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawStack {
    /// Process and thread.
    pub pid: u32,
    /// Thread (the sample's).
    pub tid: u32,
    /// The sample's timestamp.
    pub timestamp_ns: u64,
    /// Kernel flags (`PY_TRUNCATED`, …).
    pub flags: u32,
    /// Leaf first.
    pub frames: Vec<PyFrameEntry>,
}

/// Decodes a `PythonStack` ring-buffer record (its used length only: the head and the
/// frames sent), read as the [`PyStackRecord`] it is.
pub fn decode(bytes: &[u8]) -> Option<RawStack> {
    if bytes.len() < PyStackRecord::HEAD {
        return None;
    }
    let mut record = std::mem::MaybeUninit::<PyStackRecord>::zeroed();
    let used = bytes.len().min(std::mem::size_of::<PyStackRecord>());
    // SAFETY: `used` bytes into a record of at least that size; the rest stays zeroed, and
    // any bytes are a valid `PyStackRecord` (plain integers: `aya::Pod`).
    let record = unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), record.as_mut_ptr().cast::<u8>(), used);
        record.assume_init()
    };
    let count = (record.count as usize).min(MAX_PY_FRAMES);
    if used < PyStackRecord::HEAD + count * std::mem::size_of::<PyFrameEntry>() {
        return None;
    }
    Some(RawStack {
        pid: record.pid,
        tid: record.tid,
        timestamp_ns: record.timestamp_ns,
        flags: record.flags,
        frames: record.frames[..count].to_vec(),
    })
}

/// What the intake thread knows of one process's interpreter.
struct Process {
    interpreter: Arc<Interpreter>,
    file: FileId,
    code_type: u64,
    /// Where its walk starts (`_PyRuntime.interpreters.head`).
    head: u64,
}

/// Interpreter files analysed, by identity (`Err`: why its frames cannot be read): once
/// for every reader of frames (the intake's, and the early records' that runs first).
static ANALYSED: std::sync::LazyLock<std::sync::Mutex<HashMap<FileId, Analysis>>> =
    std::sync::LazyLock::new(Default::default);

/// What a file was found to be: an interpreter whose frames can be read, none, or one
/// whose frames cannot be read (why).
type Analysis = Result<Option<Arc<Interpreter>>, String>;

/// Most processes remembered, as the kernel's `PY_PROCESSES` holds (an LRU map of that
/// size): a host-wide recording over days sees processes come and go, and is told of
/// none leaving. Past it the longest known is forgotten.
const MAX_PROCESSES: usize = 4096;
/// Most code objects remembered (all processes); past it the cache starts over.
const MAX_CODES: usize = 1 << 16;
/// Most frames records waiting for their sample (one per thread normally).
const MAX_PENDING: usize = 4096;

/// Python frames on the intake thread: finds interpreters, tells the kernel, pairs and
/// resolves frames records. Counts what it could not do.
pub struct Frames {
    /// The kernel's map (none for the early records' frames, read by the library).
    kernel: Option<KernelMap<MapData, u32, PyLayout>>,

    processes: HashMap<u32, Process>,
    /// The processes in the order they were found (for [`MAX_PROCESSES`]).
    found: std::collections::VecDeque<u32>,
    pending: HashMap<u32, RawStack>,
    codes: HashMap<(u32, u64), Arc<Code>>,
    /// Samples whose frames record did not arrive (the ring buffer was full): read by the
    /// recording at its end.
    missing: Arc<std::sync::atomic::AtomicU64>,
}

impl Frames {
    /// Over the kernel's `PY_PROCESSES` map (`None`: for frames the in-process front end
    /// read, [`Self::of_early`]).
    pub fn new(kernel: Option<KernelMap<MapData, u32, PyLayout>>) -> Frames {
        Frames {
            kernel,
            processes: HashMap::new(),
            found: std::collections::VecDeque::new(),
            pending: HashMap::new(),
            codes: HashMap::new(),
            missing: Arc::default(),
        }
    }

    /// Forgets the processes in `gone`: their interpreters, code objects and waiting
    /// frames (the kernel's entries are the recording's to drop).
    pub fn forget(&mut self, gone: &std::collections::BTreeSet<u32>) {
        self.processes.retain(|pid, _| !gone.contains(pid));
        self.found.retain(|pid| !gone.contains(pid));
        self.pending.retain(|pid, _| !gone.contains(pid));
        self.codes.retain(|(pid, _), _| !gone.contains(pid));
    }

    /// The count of samples that missed their Python frames, shared.
    pub fn missing(&self) -> Arc<std::sync::atomic::AtomicU64> {
        Arc::clone(&self.missing)
    }

    /// A process's maps were read (its first sample since it started or exec'd): if it runs
    /// an interpreter, the kernel reads its Python frames from now on; if not, the kernel
    /// is told so (an all-zero layout), and its samples no longer wake the ring buffer's
    /// reader, which only needed to find its interpreter (see the eBPF side's `emit`).
    pub fn found_maps(&mut self, pid: u32, vmas: &[Vma]) {
        if !self.find(pid, vmas) {
            if let Some(kernel) = &mut self.kernel {
                let _ = kernel.insert(pid, PyLayout::default(), 0);
            }
        }
    }

    /// [`Self::found_maps`]' search: whether an interpreter was found and its walk given to
    /// the kernel.
    fn find(&mut self, pid: u32, vmas: &[Vma]) -> bool {
        self.processes.remove(&pid);
        self.codes.retain(|(p, _), _| *p != pid);
        // A program exec'd since: whatever its predecessor ran, the kernel walks nothing
        // until this one is found to run an interpreter too.
        if let Some(kernel) = &mut self.kernel {
            let _ = kernel.remove(&pid);
        }
        // The executable and `libpython`: whichever holds the runtime (pyenv's python3.12
        // is a small program over libpython3.12.so).
        // And the executable whatever its name: an interpreter copied or linked to another
        // name (`cp python3.11 myapp`) had no Python frames at all.
        let executable = crate::sys::process::executable_of(pid);
        let mut candidates: Vec<&Vma> = vmas
            .iter()
            .filter(|v| {
                let path = v.path.as_deref();
                (path.is_some_and(detect::may_be_interpreter)
                    || path.is_some_and(|p| Some(p) == executable.as_deref()))
                    && v.file_id.inode != 0
            })
            .collect();
        candidates.dedup_by(|a, b| a.file_id == b.file_id);
        let Some((interpreter, file)) = candidates.into_iter().find_map(|candidate| {
            Some((self.analysed(pid, candidate)?, candidate.file_id.clone()))
        }) else {
            return false;
        };
        let own: Vec<&Vma> = vmas.iter().filter(|v| v.file_id == file).collect();
        let Some(placed) = interpreter.place(&own) else {
            return false;
        };
        let mut walk = interpreter.layout.walk;
        walk.interpreters_head = placed.interpreters_head;
        if let Err(why) = check_running(&ProcessMemory(pid), &walk) {
            log::warn!(
                "pid {pid}: CPython {}.{}'s thread states do not read as expected ({why}): \
                 native frames only",
                interpreter.layout.version.0,
                interpreter.layout.version.1
            );
            return false;
        }
        if let Some(kernel) = &mut self.kernel {
            if kernel.insert(pid, walk, 0).is_err() {
                return false;
            }
        }
        self.processes.insert(
            pid,
            Process {
                interpreter,
                file,
                code_type: placed.code_type,
                head: placed.interpreters_head,
            },
        );
        self.found.push_back(pid);
        while self.found.len() > MAX_PROCESSES {
            if let Some(oldest) = self.found.pop_front() {
                if !self.found.contains(&oldest) {
                    self.processes.remove(&oldest);
                }
            }
        }
        true
    }

    /// The interpreter in `vma`'s file, analysed once per file (a file allocscope cannot
    /// read frames of is said once).
    fn analysed(&mut self, pid: u32, vma: &Vma) -> Option<Arc<Interpreter>> {
        let mut files = ANALYSED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let analysed = files.entry(vma.file_id.clone()).or_insert_with(|| {
            let bytes = crate::infile::map_regular(&vma.file_in(pid)).map_err(|e| e.to_string())?;
            Ok(detect::analyse(&bytes)?.map(Arc::new))
        });
        match analysed {
            Ok(interpreter) => interpreter.clone(),
            Err(reason) => {
                let path = vma.path.as_deref().unwrap_or(std::path::Path::new("?"));
                log::warn!(
                    "{}: {reason}",
                    crate::text::printable(&path.display().to_string())
                );
                *analysed = Ok(None);
                None
            }
        }
    }

    /// A frames record arrived: kept for its sample, which follows.
    pub fn arrived(&mut self, raw: RawStack) {
        if self.pending.len() >= MAX_PENDING {
            self.pending.clear();
        }
        self.pending.insert(raw.tid, raw);
    }

    /// Counts a sample that should have had Python frames and has none.
    pub fn count_missing(&self) {
        self.missing
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The Python frames the in-process front end read for an early record (walked from
    /// `head`), resolved; `None`, counted missing, when they cannot be believed: the
    /// process's interpreter is not the one whose walk starts at `head` (or was not found).
    pub fn of_early(&mut self, raw: RawStack, head: u64) -> Option<PythonStack> {
        if self.processes.get(&raw.pid).map(|p| p.head) != Some(head) {
            self.count_missing();
            return None;
        }
        let (pid, tid, timestamp_ns) = (raw.pid, raw.tid, raw.timestamp_ns);
        self.arrived(raw);
        self.of_sample(pid, tid, timestamp_ns)
    }

    /// The Python frames of a sample the kernel flagged, resolved.
    pub fn of_sample(&mut self, pid: u32, tid: u32, timestamp_ns: u64) -> Option<PythonStack> {
        let raw = match self.pending.remove(&tid) {
            Some(raw) if raw.timestamp_ns == timestamp_ns && raw.pid == pid => raw,
            _ => {
                self.missing
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return None;
            }
        };
        let Some(process) = self.processes.get(&pid) else {
            // Flagged by the kernel, its interpreter not (yet) known here: said, not hidden.
            self.count_missing();
            return None;
        };
        let layout = process.interpreter.layout;
        let memory = ProcessMemory(pid);
        if self.codes.len() >= MAX_CODES {
            self.codes.clear();
        }
        let mut resolved = Vec::with_capacity(raw.frames.len());
        for entry in &raw.frames {
            if !layout.is_entry_flag && entry.marker() == layout::OWNED_BY_CSTACK {
                // A shim between evaluator calls: no code object to read.
                resolved.push((unknown_frame(), entry.marker()));
                continue;
            }
            let instruction = entry.instruction();
            let key = (pid, entry.code);
            // The code object of the sample: its identity as the kernel read it with the
            // frame, its bytecode around the instruction. pymalloc reuses a freed code
            // object's block for the next one (seen: a startup module's code, cached, then
            // a method compiled later at its address); the identity tells them apart.
            let same = |c: &Code| c.holds(instruction) && c.signature == entry.signature;
            let cached = self.codes.get(&key).filter(|c| same(c)).cloned();
            let code = cached.or_else(|| {
                let code = objects::read_code(&memory, &layout, process.code_type, entry.code)
                    .filter(same)?;
                let code = Arc::new(code);
                self.codes.insert(key, Arc::clone(&code));
                Some(code)
            });
            let frame = match code {
                Some(code) => PyFrame {
                    line: code.line_at(instruction).unwrap_or(0),
                    function: PyFunction {
                        qualname: Arc::clone(&code.qualname),
                        filename: Arc::clone(&code.filename),
                    },
                },
                None => unknown_frame(),
            };
            resolved.push((frame, entry.marker()));
        }
        // 3.12+'s shim frames hold no code object: they only separate groups.
        let mut groups = merge::groups(&resolved, layout.is_entry_flag);
        if raw.flags & (PY_TRUNCATED | PY_READ_FAILED) != 0 {
            // The chain goes on below what was read: said at its root end, not hidden.
            let cut = PyFrame {
                function: PyFunction {
                    qualname: "[python frames cut: deeper than 256 or unreadable]".into(),
                    filename: "".into(),
                },
                line: 0,
            };
            match groups.last_mut() {
                Some(last) => last.push(cut),
                None => groups.push(vec![cut]),
            }
        }
        Some(PythonStack {
            groups,
            interpreter: process.file.clone(),
            eval: process.interpreter.eval.clone(),
        })
    }
}

/// Checks the layout against the running interpreter, where it has started: the first
/// thread state in the main interpreter's list must point back at that interpreter, and
/// the next ones too (at most a few). Not started yet (a command allocscope just spawned):
/// nothing to check, the walk's reads then simply find no interpreter.
fn check_running(memory: &impl objects::Memory, walk: &PyLayout) -> Result<(), String> {
    let Some(interpreter) = memory.word(walk.interpreters_head) else {
        return Err("_PyRuntime unreadable".into());
    };
    if interpreter == 0 {
        return Ok(());
    }
    let mut thread = memory
        .word(interpreter + u64::from(walk.threads_head))
        .ok_or("interpreter unreadable")?;
    for _ in 0..4 {
        if thread == 0 {
            break;
        }
        if memory.word(thread + layout::THREAD_INTERP) != Some(interpreter) {
            return Err(format!(
                "thread state {thread:#x} names another interpreter"
            ));
        }
        thread = memory
            .word(thread + u64::from(walk.thread_next))
            .unwrap_or(0);
    }
    Ok(())
}

/// A frame whose code object could not be read (freed since the sample, or the process
/// gone): marked, not guessed.
fn unknown_frame() -> PyFrame {
    PyFrame {
        function: PyFunction {
            qualname: "[python code object gone]".into(),
            filename: "".into(),
        },
        line: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record's bytes as the kernel sends it: the head and `count` frames.
    fn sent(record: &PyStackRecord, count: usize) -> Vec<u8> {
        let all = std::mem::size_of::<PyStackRecord>();
        // SAFETY: a plain #[repr(C)] struct's bytes, read within its size.
        let bytes = unsafe {
            std::slice::from_raw_parts((record as *const PyStackRecord).cast::<u8>(), all)
        };
        bytes[..PyStackRecord::HEAD + count * std::mem::size_of::<PyFrameEntry>()].to_vec()
    }

    #[test]
    fn a_record_is_read_by_its_fields_and_its_used_length() {
        let mut record = PyStackRecord {
            kind: 7,
            count: 2,
            pid: 41,
            tid: 42,
            timestamp_ns: 1_000_000_007,
            flags: PY_TRUNCATED,
            pad: 0,
            frames: [PyFrameEntry::default(); MAX_PY_FRAMES],
        };
        record.frames[0].code = 0xc0de;
        record.frames[1].instr = 0x1234;
        let stack = decode(&sent(&record, 2)).unwrap();
        assert_eq!((stack.pid, stack.tid), (41, 42));
        assert_eq!(
            (stack.timestamp_ns, stack.flags),
            (1_000_000_007, PY_TRUNCATED)
        );
        assert_eq!(stack.frames, record.frames[..2]);
        // Fewer frames sent than it says: refused; a head alone is short.
        assert!(decode(&sent(&record, 1)).is_none());
        assert!(decode(&sent(&record, 0)[..20]).is_none());
        record.count = 0;
        assert!(decode(&sent(&record, 0)).unwrap().frames.is_empty());
    }
}
