//! ③ Stacks: unwind, check, normalize and intern early, symbolize late.
//!
//! A sample arrives with the kernel's frame-pointer walk (`--unwind fp`) or with a copy of
//! the top of its user stack, which [`unwind`] walks with the modules' CFI. Either way every
//! frame must be a return address ([`call_site`]): code in a mapped file right after a call
//! instruction, or the stack ends there and says why ([`StackEnd`]).
//!
//! A sample's raw addresses mean something only in the address space of a process that may
//! exit a millisecond later, so each address is normalized on arrival to (module, file
//! offset) with a cached copy of the process's maps (re-read on a miss while the process
//! lives, and only when the copy is older than the sample: an address nothing maps, such
//! as JIT code, costs one read per batch, not one per sample). Normalized stacks are
//! interned into [`StackId`]s; names are resolved once per distinct frame, at the end, by
//! [`symbolize`]. Each module file is opened when first seen, through the process's own view
//! of it (`/proc/PID/map_files`), and kept open: symbols and build ids then come from the very
//! file the process mapped, even after the process has gone, the file was replaced on disk,
//! or it lives in a container's file system.

pub use crate::schema::Unwinding;

pub(crate) mod call_site;
pub(crate) mod debuginfod;
pub(crate) mod demangle;
pub mod forget;
pub(crate) mod image;
mod modules;
pub(crate) mod python;
pub mod site;
pub mod symbolize;
pub(crate) mod unwind;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
};

use crate::{
    collect::Sample,
    sys::maps::{self, FileId, Vma},
};
use image::FrameRole;
pub use modules::{build_id, ModuleTable};
pub use unwind::StackEnd;
use unwind::{Mapped, Unwinders};

/// How an interned stack was found and where it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackOrigin {
    /// The unwinding mode.
    pub unwinding: Unwinding,
    /// Why the walk ended.
    pub end: StackEnd,
}

/// Index of an interned stack.
pub type StackId = u32;

/// Index of an interned module (mapped file).
pub type ModuleId = u32;

/// One frame, normalized: a file offset in a module, or a raw address nothing maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frame {
    /// A return address inside a mapped file.
    File {
        /// Module.
        module: ModuleId,
        /// File offset of the return address.
        offset: u64,
    },
    /// An address in no file-backed executable mapping (JIT code, or the process is gone).
    Unknown {
        /// The raw address.
        address: u64,
    },
    /// A Python function at a line ([`crate::python`]).
    Python {
        /// The function, interned in the table's `PythonFunctions`.
        function: u32,
        /// The line (0: unknown).
        line: u32,
    },
}

/// Builds the list of return addresses, leaf first and without the allocator's own frame,
/// from what the kernel sent. From an entry probe, `raw[0]` is the probed instruction (the
/// allocator) and `raw[1..]` the frame-pointer walk, which misses the direct caller unless
/// the kernel recovered it; `return_address` is that caller, read from `[rsp]`. From a
/// return probe (`at_return`), `raw` starts at the direct caller.
pub fn caller_chain(return_address: u64, raw: &[u64], at_return: bool) -> Vec<u64> {
    if at_return {
        // Taken at the allocator's return: `raw[0]` is the direct caller already.
        return raw
            .iter()
            .copied()
            .filter(|&address| address != 0)
            .collect();
    }
    let walked = raw.get(1..).unwrap_or_default();
    let mut chain = Vec::with_capacity(walked.len() + 1);
    if return_address != 0 && walked.first() != Some(&return_address) {
        chain.push(return_address);
    }
    chain.extend(walked.iter().copied().filter(|&address| address != 0));
    chain
}

/// Cached executable mappings of one process, refreshed when an address misses.
#[derive(Clone, Debug, Default)]
struct ProcessMaps {
    vmas: Vec<Vma>,
    /// The module each of `vmas` was interned as, once a frame fell in it: a frame's
    /// module is then found without a path, an allocation or a hash of either (it took
    /// five allocations a frame, ~150 a sample).
    module_ids: Vec<Option<ModuleId>>,
    /// Start of the kernel's `[uprobes]` area, once the process has one.
    uprobe_area: Option<u64>,
    /// When the maps were last read (CLOCK_MONOTONIC ns, the samples' clock).
    read_ns: u64,
    /// Bumped whenever a read finds different executable mappings (the unwinder's modules
    /// are rebuilt only then).
    generation: u64,
    /// When a stack that did not unwind to its root last made us re-read the maps.
    retried_ns: u64,
    gone: bool,
}

impl ProcessMaps {
    /// Takes the executable mappings of a maps file's `text`.
    fn take(&mut self, text: &str) {
        self.take_vmas(text, Self::executable(text));
    }

    /// Takes `text`, a read its process's exit may have cut short, unless it lacks a
    /// mapping the copy has (it then says less, not something newer).
    fn take_unless_shorter(&mut self, text: &str) {
        let vmas = Self::executable(text);
        let keeps_all = self.vmas.iter().all(|old| {
            vmas.iter()
                .any(|new| new.start == old.start && new.path == old.path)
        });
        if keeps_all {
            self.take_vmas(text, vmas);
        }
    }

    fn executable(text: &str) -> Vec<Vma> {
        maps::parse(text)
            .into_iter()
            .filter(|vma| vma.executable && vma.path.is_some())
            .collect()
    }

    fn take_vmas(&mut self, text: &str, vmas: Vec<Vma>) {
        self.uprobe_area = maps::uprobe_area(text);
        if vmas != self.vmas {
            self.vmas = vmas;
            self.module_ids.clear();
            self.generation += 1;
        }
    }
}

/// Least time between two re-reads of a process's maps caused by stacks that did not
/// unwind to their root (a JIT or very deep stacks would otherwise cause one per batch).
const RETRY_MAPS_NS: u64 = 50_000_000;

/// Normalizes and interns stacks for all target processes, at most `max_stacks` whole
/// ones: beyond that, a new stack is cut to its leaf frame (the allocation site), so memory
/// and output stay bounded however many paths a program takes to its allocator.
#[derive(Debug, Default)]
pub struct StackTable {
    modules: ModuleTable,
    maps: HashMap<u32, ProcessMaps>,
    unwinders: Unwinders,
    stacks: Vec<StackKey>,
    index: HashMap<StackKey, StackId>,
    /// Whether each (module, file offset) seen as a frame follows a call instruction.
    return_addresses: HashMap<(ModuleId, u64), bool>,
    /// Most distinct whole stacks kept (`None`: no limit).
    max_stacks: Option<usize>,
    /// Stacks that hold samples of longer stacks cut to their leaf.
    cut: HashSet<StackId>,
    /// Samples whose stack was cut to its leaf.
    cut_samples: u64,
    /// Stacks unwound, checked and interned, and the time that took (the per-sample cost
    /// in user space, `-v`).
    interned: u64,
    intern_ns: u64,
    copied_bytes: u64,
    /// Python functions the stacks' Python frames name.
    python: python::PythonFunctions,
    /// How Python frames are merged (`None`: `Merge::Python`, the default).
    python_merge: Option<crate::python::Merge>,
}

/// What identifies an interned stack.
type StackKey = (u32, Vec<Frame>, StackOrigin);

impl StackTable {
    /// Every process with maps or a stack here.
    pub fn pids(&self) -> std::collections::BTreeSet<u32> {
        let mut pids: std::collections::BTreeSet<u32> = self.maps.keys().copied().collect();
        pids.extend(self.stacks.iter().map(|key| key.0));
        pids
    }

    /// Records `pid`'s current maps (call at attach, while it surely lives, and at its
    /// exec). What it had mapped before is forgotten: after an exec, a process gone before
    /// this read must not have its new program's addresses named by its old one's maps.
    pub fn snapshot(&mut self, pid: u32) {
        if let Some(entry) = self.maps.get_mut(&pid) {
            let generation = entry.generation + 1;
            *entry = ProcessMaps {
                generation,
                ..ProcessMaps::default()
            };
        }
        self.refresh(pid);
    }

    /// Gives `pid`, just forked from `parent`, its parent's maps (what it started with)
    /// unless it has maps of its own; returns whether it has maps now.
    pub fn inherit(&mut self, pid: u32, parent: u32) -> bool {
        let own = self.maps.get(&pid);
        if own.is_some_and(|m| !m.vmas.is_empty()) {
            return true;
        }
        let (gone, generation) = own.map_or((false, 0), |m| (m.gone, m.generation + 1));
        if let Some(maps) = self.maps.get(&parent) {
            // Read 0: any reading of its own replaces the copy, however old (a child that
            // exec'd and exited at once has its library's copy, read before allocscope read
            // its parent's: refused as older, its samples were unwound against the
            // parent's maps, a third to a half of a shell loop's stacks ending "in no file").
            let copy = ProcessMaps {
                gone,
                generation,
                retried_ns: 0,
                read_ns: 0,
                ..maps.clone()
            };
            self.maps.insert(pid, copy);
            return true;
        }
        false
    }

    fn refresh(&mut self, pid: u32) {
        let entry = self.maps.entry(pid).or_default();
        if entry.gone {
            return;
        }
        let read_ns = crate::collect::monotonic_ns();
        match maps::read_text_until_exit(pid) {
            // A process that exited but was not reaped yet has no maps left.
            Ok((text, _)) if text.is_empty() => entry.gone = true,
            Ok((text, false)) => {
                entry.read_ns = read_ns;
                entry.take(&text);
            }
            // A read the exit overtook may be short: it replaces no mapping the copy has,
            // and keeps the copy's time (a copy read later, offered later, still replaces
            // it; with none before, any copy read at a time does).
            Ok((text, true)) => {
                entry.gone = true;
                entry.take_unless_shorter(&text);
            }
            // Keep the last snapshot, and its time: it is what the process had when it
            // died, and maps read earlier but offered later (its in-process front end's
            // copy) still replace it.
            Err(_) => entry.gone = true,
        }
    }

    /// Takes `pid`'s maps as read at `read_ns` by the intake thread ([`Event::Maps`]) when
    /// they are newer than what the table has; read at 0 (a read its exit overtook, maybe
    /// short), only where it lacks none of the table's mappings.
    ///
    /// [`Event::Maps`]: crate::collect::Event::Maps
    pub fn offer_maps(&mut self, pid: u32, read_ns: u64, text: &str) {
        let entry = self.maps.entry(pid).or_default();
        if text.is_empty() {
            return;
        }
        if read_ns == 0 {
            entry.take_unless_shorter(text);
        } else if read_ns > entry.read_ns {
            entry.read_ns = read_ns;
            entry.take(text);
        }
    }

    /// Re-reads the maps of every process still alive.
    pub fn refresh_live(&mut self) {
        let live: Vec<u32> = self
            .maps
            .iter()
            .filter(|(_, m)| !m.gone)
            .map(|(&pid, _)| pid)
            .collect();
        for pid in live {
            self.refresh(pid);
        }
    }

    /// Where the kernel put `pid`'s uprobe area, as of the last maps read.
    pub fn uprobe_area(&self, pid: u32) -> Option<u64> {
        self.maps.get(&pid)?.uprobe_area
    }

    /// Marks `pid` as exited: its last snapshot stays, nothing is re-read.
    pub fn mark_gone(&mut self, pid: u32) {
        self.maps.entry(pid).or_default().gone = true;
    }

    /// Re-reads `pid`'s maps when `address`, seen at `taken_ns`, is in none of them and the
    /// copy is older than that (a library loaded after the last read, most likely).
    fn refresh_for(&mut self, pid: u32, address: u64, taken_ns: u64) {
        let stale = self.maps.get(&pid).is_none_or(|m| m.read_ns < taken_ns);
        if stale && self.lookup_index(pid, address).is_none() {
            self.refresh(pid);
        }
    }

    fn normalize(&mut self, pid: u32, address: u64, taken_ns: u64) -> Frame {
        self.refresh_for(pid, address, taken_ns);
        let Some((index, offset)) = self.lookup_index(pid, address) else {
            return Frame::Unknown { address };
        };
        let Some(maps) = self.maps.get_mut(&pid) else {
            return Frame::Unknown { address };
        };
        if let Some(module) = maps.module_ids.get(index).copied().flatten() {
            return Frame::File { module, offset };
        }
        let vma = &maps.vmas[index];
        let path = vma.path.clone().unwrap_or_default();
        let module = self.modules.intern(&path, &vma.file_id, &vma.file_in(pid));
        maps.module_ids.resize(maps.vmas.len(), None);
        maps.module_ids[index] = Some(module);
        Frame::File { module, offset }
    }

    /// The index among `pid`'s file-backed mappings of the one holding `address`, and the
    /// file offset there.
    fn lookup_index(&self, pid: u32, address: u64) -> Option<(usize, u64)> {
        let vmas = &self.maps.get(&pid)?.vmas;
        vmas.iter().enumerate().find_map(|(index, vma)| {
            vma.path.as_ref()?;
            Some((index, vma.file_offset(address)?))
        })
    }

    /// Unwinds, checks and interns the stack of `sample`.
    pub fn intern_sample(&mut self, sample: &Sample) -> StackId {
        let started = std::time::Instant::now();
        let id = self.unwind_and_intern(sample);
        self.interned += 1;
        self.intern_ns += started.elapsed().as_nanos() as u64;
        self.copied_bytes += sample.copied.as_ref().map_or(0, |c| c.bytes.len() as u64);
        id
    }

    /// Samples whose stacks were interned, the mean time each took (ns) and the mean bytes
    /// of stack copied with each.
    pub fn intern_cost(&self) -> (u64, f64, f64) {
        let samples = self.interned.max(1) as f64;
        let mean = self.intern_ns as f64 / samples;
        (self.interned, mean, self.copied_bytes as f64 / samples)
    }

    fn unwind_and_intern(&mut self, sample: &Sample) -> StackId {
        let (addresses, origin) = match &sample.copied {
            Some(copied) => {
                let (pid, at_return) = (sample.pid, sample.stack_at_return);
                self.prepare_unwinder(pid, copied.ip, sample.timestamp_ns);
                let trampoline = self
                    .uprobe_area(pid)
                    .unwrap_or(sampler_common::UPROBE_TRAMPOLINE);
                let (mut addresses, mut end) =
                    self.unwinders.unwind(pid, copied, at_return, trampoline);
                // A library mapped after the last read of the maps (a process just started,
                // a dlopen) has no CFI in the unwinder yet: read them again, once, and retry.
                let retry = self.maps.get_mut(&pid).filter(|m| {
                    !m.gone
                        && m.read_ns < sample.timestamp_ns
                        && sample.timestamp_ns.saturating_sub(m.retried_ns) > RETRY_MAPS_NS
                });
                if let (false, Some(maps)) = (end == StackEnd::Root, retry) {
                    maps.retried_ns = sample.timestamp_ns;
                    self.refresh(pid);
                    self.prepare_unwinder(pid, copied.ip, sample.timestamp_ns);
                    (addresses, end) = self.unwinders.unwind(pid, copied, at_return, trampoline);
                }
                let origin = StackOrigin {
                    unwinding: Unwinding::Dwarf,
                    end,
                };
                (addresses, origin)
            }
            None => {
                let addresses =
                    caller_chain(sample.return_address, &sample.stack, sample.stack_at_return);
                let end = if sample.stack.len() >= sampler_common::MAX_STACK_DEPTH {
                    StackEnd::Depth
                } else {
                    StackEnd::Unknown
                };
                let unwinding = if sample.runtime_traceback {
                    Unwinding::GoRuntime
                } else {
                    Unwinding::FramePointers
                };
                (addresses, StackOrigin { unwinding, end })
            }
        };
        let (mut frames, origin) =
            self.normalized(sample.pid, &addresses, origin, sample.timestamp_ns);
        if let Some(python) = &sample.python {
            frames = self.with_python(&frames, python);
        }
        self.intern_frames(sample.pid, frames, origin)
    }

    /// Makes `pid`'s unwinder know the modules it maps now: its maps are re-read if `ip`
    /// is in none of them (and the copy is older than the sample), and the unwinder is
    /// rebuilt whenever the maps were.
    fn prepare_unwinder(&mut self, pid: u32, ip: u64, taken_ns: u64) {
        self.refresh_for(pid, ip, taken_ns);
        let Some(maps) = self.maps.get(&pid) else {
            return;
        };
        if self.unwinders.is_current(pid, maps.generation) {
            return;
        }
        let generation = maps.generation;
        let vmas = maps.vmas.clone();
        let modules = vmas
            .into_iter()
            .filter_map(|vma| {
                let path = vma.path.clone()?;
                let id = self.modules.intern(&path, &vma.file_id, &vma.file_in(pid));
                let image = self.modules.image(id)?.clone();
                Some(Mapped {
                    range: vma.start..vma.end,
                    bias: image.bias(vma.start, vma.offset)?,
                    image,
                    name: path.display().to_string(),
                })
            })
            .collect();
        self.unwinders.rebuild(pid, generation, modules);
    }

    /// Normalizes `addresses` (leaf first) of process `pid`, taken at `taken_ns`
    /// (CLOCK_MONOTONIC) and found as `origin` says, and returns the stack's id. The stack
    /// ends at the first frame that is not a return address in a mapped file (the leaf
    /// frame is kept as an unknown address if it is in no file), whatever found it.
    pub fn intern(
        &mut self,
        pid: u32,
        addresses: &[u64],
        origin: StackOrigin,
        taken_ns: u64,
    ) -> StackId {
        let (frames, origin) = self.normalized(pid, addresses, origin, taken_ns);
        self.intern_frames(pid, frames, origin)
    }

    /// [`StackTable::intern`]'s frames, before they are interned.
    fn normalized(
        &mut self,
        pid: u32,
        addresses: &[u64],
        mut origin: StackOrigin,
        taken_ns: u64,
    ) -> (Vec<Frame>, StackOrigin) {
        let mut frames: Vec<Frame> = Vec::with_capacity(addresses.len());
        let mut leading = true;
        // A Go sample's leading runtime frames, kept if nothing but the runtime follows.
        let mut runtime: Vec<Frame> = Vec::new();
        for &address in addresses {
            let frame = self.normalize(pid, address, taken_ns);
            let role = match frame {
                Frame::File { module, offset } => {
                    self.modules.image(module).map(|i| i.role(offset))
                }
                _ => None,
            };
            match role {
                Some(FrameRole::GoroutineRoot) => {
                    origin.end = StackEnd::Root;
                    break;
                }
                Some(FrameRole::FrontEnd) if leading => continue,
                Some(FrameRole::GoRuntime) if leading => {
                    runtime.push(frame);
                    continue;
                }
                _ => leading = false,
            }
            let believed = match frame {
                Frame::File { module, offset } => self.is_return_address(module, offset),
                Frame::Python { .. } => true,
                Frame::Unknown { .. } => {
                    if frames.is_empty() {
                        frames.push(frame);
                    }
                    origin.end = StackEnd::Unmapped;
                    break;
                }
            };
            if !believed && origin.unwinding == Unwinding::GoRuntime {
                // The runtime's entry for an inlined call's caller (its inline mark, plus
                // one): the caller is expanded from the call's return address already.
                continue;
            }
            if !believed {
                origin.end = StackEnd::NotAReturnAddress;
                break;
            }
            frames.push(frame);
        }
        if frames.is_empty() && !runtime.is_empty() {
            // The runtime's own allocation (a GC worker's): its frames are the stack.
            frames = runtime;
        }
        (frames, origin)
    }

    /// Interns normalized, checked `frames` of `pid`.
    fn intern_frames(&mut self, pid: u32, frames: Vec<Frame>, origin: StackOrigin) -> StackId {
        let key = (pid, frames, origin);
        if let Some(&id) = self.index.get(&key) {
            return id;
        }
        let full = self.max_stacks.is_some_and(|max| self.stacks.len() >= max);
        if full && key.1.len() > 1 {
            let leaf = (pid, key.1[..1].to_vec(), origin);
            let id = self.insert(leaf);
            self.cut.insert(id);
            self.cut_samples += 1;
            return id;
        }
        self.insert(key)
    }

    /// Whether file offset `offset` of `module` follows a call instruction (true when the
    /// file cannot be read: nothing to check against).
    fn is_return_address(&mut self, module: ModuleId, offset: u64) -> bool {
        if let Some(&known) = self.return_addresses.get(&(module, offset)) {
            return known;
        }
        let believed = match self.modules.image(module) {
            Some(image) => image
                .bytes_before(offset, call_site::LONGEST_CALL)
                .is_some_and(call_site::follows_call),
            None => true,
        };
        self.return_addresses.insert((module, offset), believed);
        believed
    }

    fn insert(&mut self, key: StackKey) -> StackId {
        if let Some(&id) = self.index.get(&key) {
            return id;
        }
        let id = self.stacks.len() as StackId;
        self.stacks.push(key.clone());
        self.index.insert(key, id);
        id
    }

    /// Keeps at most `max` whole stacks from now on (see the type's doc).
    pub fn limit(&mut self, max: usize) {
        self.max_stacks = Some(max);
    }

    /// Whether stack `id` holds stacks cut to their leaf (beyond the limit).
    pub fn is_cut(&self, id: StackId) -> bool {
        self.cut.contains(&id)
    }

    /// Samples whose stack was cut to its leaf so far.
    pub fn cut_samples(&self) -> u64 {
        self.cut_samples
    }

    /// The pid and frames of stack `id`.
    pub fn stack(&self, id: StackId) -> (u32, &[Frame]) {
        let (pid, frames, _) = &self.stacks[id as usize];
        (*pid, frames)
    }

    /// How stack `id` was unwound and where it ended.
    pub fn origin(&self, id: StackId) -> StackOrigin {
        self.stacks[id as usize].2
    }

    /// The module table.
    pub fn modules(&self) -> &ModuleTable {
        &self.modules
    }

    /// See [`ModuleTable::hold`].
    pub fn hold_file(&mut self, file_id: FileId, path: PathBuf) {
        self.modules.hold(file_id, path);
    }

    /// The file frames of the stacks interned since the first `from` (each once, as the
    /// symbolizer reads them), and how many stacks there are now: for warming the
    /// symbolizer while the targets run.
    pub fn file_frames_since(&self, from: usize) -> (Vec<(PathBuf, u64)>, usize) {
        let mut frames: Vec<(ModuleId, u64)> = self
            .stacks
            .iter()
            .skip(from)
            .flat_map(|(_, frames, _)| frames.iter())
            .filter_map(|frame| match *frame {
                Frame::File { module, offset } => Some((module, offset)),
                Frame::Unknown { .. } | Frame::Python { .. } => None,
            })
            .collect();
        frames.sort_unstable();
        frames.dedup();
        let files = frames
            .into_iter()
            .map(|(module, offset)| (self.modules.source(module), offset))
            .collect();
        (files, self.stacks.len())
    }

    /// Every interned stack with its id, pid and frames.
    pub fn iter(&self) -> impl Iterator<Item = (StackId, u32, &[Frame])> {
        self.stacks
            .iter()
            .enumerate()
            .map(|(id, (pid, frames, _))| (id as StackId, *pid, frames.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn file(device: &str, inode: u64) -> FileId {
        FileId {
            device: device.to_owned(),
            inode,
        }
    }

    const FP: StackOrigin = StackOrigin {
        unwinding: Unwinding::FramePointers,
        end: StackEnd::Unknown,
    };

    /// Interns raw addresses as unknown frames, unchecked.
    pub(crate) fn raw(table: &mut StackTable, pid: u32, addresses: &[u64]) -> StackId {
        let frames = addresses
            .iter()
            .map(|&address| Frame::Unknown { address })
            .collect();
        table.intern_frames(pid, frames, FP)
    }

    #[test]
    fn beyond_the_limit_stacks_are_cut_to_their_leaf() {
        let mut table = StackTable::default();
        table.limit(2);
        // Addresses in no mapping of a process that does not exist: Unknown frames.
        let pid = u32::MAX - 3;
        let a = raw(&mut table, pid, &[1, 2, 3]);
        let b = raw(&mut table, pid, &[1, 2, 4]);
        assert_ne!(a, b);
        assert_eq!(
            raw(&mut table, pid, &[1, 2, 3]),
            a,
            "known stacks still whole"
        );
        let cut = raw(&mut table, pid, &[1, 5, 6]);
        assert_eq!(table.stack(cut).1.len(), 1, "cut to the leaf");
        assert_eq!(
            raw(&mut table, pid, &[1, 7]),
            cut,
            "merged with others of that leaf"
        );
        assert!(table.is_cut(cut) && !table.is_cut(a));
        assert_eq!(table.cut_samples(), 2);
        let other_leaf = raw(&mut table, pid, &[9, 7]);
        assert_ne!(other_leaf, cut);
        assert_eq!(table.iter().count(), 4);
    }

    #[test]
    fn caller_chain_inserts_the_missed_direct_caller() {
        // Frame-pointer walk missed the caller (glibc malloc starts with push %r12).
        let chain = caller_chain(0x10, &[0xa110c, 0x20, 0x30], false);
        assert_eq!(chain, vec![0x10, 0x20, 0x30]);
        // The kernel recovered it (entry starts with push %rbp): not twice.
        assert_eq!(
            caller_chain(0x10, &[0xa110c, 0x10, 0x20], false),
            vec![0x10, 0x20]
        );
        // Nothing walked.
        assert_eq!(caller_chain(0x10, &[], false), vec![0x10]);
        assert_eq!(caller_chain(0, &[0xa110c], false), Vec::<u64>::new());
        // At the return the walk starts at the caller.
        assert_eq!(caller_chain(0, &[0x10, 0x20], true), vec![0x10, 0x20]);
    }

    #[test]
    fn identical_stacks_intern_once_per_process() {
        let mut table = StackTable::default();
        // No maps for these pids: frames stay raw addresses, which still intern.
        table.maps.insert(
            1,
            ProcessMaps {
                vmas: vec![],
                gone: true,
                ..ProcessMaps::default()
            },
        );
        table.maps.insert(
            2,
            ProcessMaps {
                vmas: vec![],
                gone: true,
                ..ProcessMaps::default()
            },
        );
        let a = raw(&mut table, 1, &[1, 2, 3]);
        let b = raw(&mut table, 1, &[1, 2, 3]);
        let c = raw(&mut table, 2, &[1, 2, 3]);
        let d = raw(&mut table, 1, &[1, 2]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert_eq!(table.iter().count(), 3);
        assert_eq!(table.stack(c).0, 2);
    }

    #[test]
    fn a_frames_module_is_remembered_until_the_maps_change() {
        let mut table = StackTable::default();
        let maps = |path: &str, inode: u64| {
            format!("00001000-00002000 r-xp 00000400 fe:01 {inode} {path}\n")
        };
        table.maps.insert(
            9,
            ProcessMaps {
                gone: true,
                ..ProcessMaps::default()
            },
        );
        table
            .maps
            .get_mut(&9)
            .unwrap()
            .take(&maps("/lib/old.so", 11));
        let first = table.normalize(9, 0x1010, 0);
        let again = table.normalize(9, 0x1020, 0);
        let old = table.modules().intern_lookup("/lib/old.so");
        assert_eq!(
            first,
            Frame::File {
                module: old,
                offset: 0x410
            }
        );
        assert_eq!(
            again,
            Frame::File {
                module: old,
                offset: 0x420
            }
        );
        // Another library at the same addresses (dlclose, dlopen): the new one's module.
        table
            .maps
            .get_mut(&9)
            .unwrap()
            .take(&maps("/lib/new.so", 12));
        let new = table.normalize(9, 0x1010, 0);
        let module = table.modules().intern_lookup("/lib/new.so");
        assert_ne!(module, old);
        assert_eq!(
            new,
            Frame::File {
                module,
                offset: 0x410
            }
        );
    }

    #[test]
    fn addresses_normalize_to_file_offsets() {
        let mut table = StackTable::default();
        let vma = Vma {
            start: 0x1000,
            end: 0x2000,
            offset: 0x400,
            executable: true,
            writable: false,
            stack: false,
            file_id: file("fe:01", 7),
            path: Some("/bin/x".into()),
        };
        table.maps.insert(
            7,
            ProcessMaps {
                vmas: vec![vma],
                gone: true,
                ..ProcessMaps::default()
            },
        );
        let id = table.intern(7, &[0x1010, 0x5000], FP, 0);
        let (_, frames) = table.stack(id);
        let module = table.modules().intern_lookup("/bin/x");
        // /bin/x cannot be read: its frame cannot be checked, and is kept.
        assert_eq!(
            frames,
            [Frame::File {
                module,
                offset: 0x410
            }]
        );
        // An address in no mapping ends the stack, and says so.
        assert_eq!(table.origin(id).end, StackEnd::Unmapped);
        let leaf = table.intern(7, &[0x5000, 0x1010], FP, 0);
        assert_eq!(table.stack(leaf).1, [Frame::Unknown { address: 0x5000 }]);
    }

    #[test]
    fn frames_that_follow_no_call_end_the_stack() {
        // Our own executable: a return address into this very function, and an address
        // that is the function's first byte (nothing calls into the middle of a prologue).
        let mut table = StackTable::default();
        let pid = std::process::id();
        table.snapshot(pid);
        let after_call = return_here();
        let not_after_call = frames_that_follow_no_call_end_the_stack as *const () as u64;
        let id = table.intern(pid, &[after_call, not_after_call, after_call], FP, 0);
        assert_eq!(table.stack(id).1.len(), 1, "{:?}", table.stack(id));
        assert_eq!(table.origin(id).end, StackEnd::NotAReturnAddress);
        let whole = table.intern(pid, &[after_call, after_call], FP, 0);
        assert_eq!(table.stack(whole).1.len(), 2);
        assert_eq!(table.origin(whole).end, StackEnd::Unknown);
    }

    /// An address right after a call instruction in our own code: a call to the next
    /// instruction, whose pushed return address is popped again.
    fn return_here() -> u64 {
        let address: u64;
        // SAFETY: pushes and pops one word (the asm may use the stack: no `nostack`).
        unsafe {
            std::arch::asm!("call 2f", "2:", "pop {}", out(reg) address);
        }
        address
    }

    #[test]
    fn files_sharing_a_path_keep_their_own_names_and_build_ids() {
        // A container's libc and the host's: one path, two files.
        let shown = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let mut modules = ModuleTable::default();
        let host = modules.intern(shown, &file("fe:01", 1), Path::new("/usr/bin/true"));
        let container = modules.intern(shown, &file("0:57", 2), Path::new("/usr/bin/sleep"));
        assert_eq!(
            modules.intern(shown, &file("fe:01", 1), Path::new("/x")),
            host
        );
        assert_eq!(modules.name(host), shown.to_str().unwrap());
        assert_eq!(
            modules.name(container),
            "/usr/lib/x86_64-linux-gnu/libc.so.6 (inode 2 on 0:57)"
        );
        // Each build id is read from the file opened, never from the path shown.
        let true_id = build_id(Path::new("/usr/bin/true"));
        let sleep_id = build_id(Path::new("/usr/bin/sleep"));
        assert!(true_id.is_some() && true_id != sleep_id);
        assert_eq!(modules.build_id(host), true_id.as_deref());
        assert_eq!(modules.build_id(container), sleep_id.as_deref());
    }

    #[test]
    fn a_process_that_exited_keeps_its_last_maps() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Spawned is not yet exec'd: in between, its maps may be the parent's or none. Once
        // named sleep it runs in its own memory; once that maps libc, sleep itself is mapped.
        let execed = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            crate::sys::process::comm_of(pid).is_some_and(|c| c == "sleep")
                && maps::read_text(pid).is_ok_and(|m| m.contains("libc"))
        });
        assert!(execed, "sleep did not start");
        let mut table = StackTable::default();
        table.snapshot(pid);
        let vmas = &table.maps[&pid].vmas;
        assert!(!vmas.is_empty(), "no file mapping read for sleep");
        let text = vmas[0].start + 1;
        child.kill().unwrap();
        // Not reaped yet: a zombie, whose maps file reads empty.
        let dead = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            maps::read_text(pid).is_ok_and(|m| m.is_empty())
        });
        assert!(dead, "sleep did not become a zombie");
        // An unmapped address in a sample newer than the copy forces a re-read, which
        // finds nothing: the last copy stays for the samples still to come.
        table.normalize(pid, 0x10, crate::collect::monotonic_ns());
        assert!(table.maps[&pid].gone);
        let frame = table.normalize(pid, text, crate::collect::monotonic_ns());
        assert!(matches!(frame, Frame::File { .. }), "{frame:?}");
        child.wait().unwrap();
    }

    #[test]
    fn unmapped_addresses_reread_the_maps_once_per_newer_sample() {
        let mut table = StackTable::default();
        let pid = std::process::id();
        table.snapshot(pid);
        let first_read = table.maps[&pid].read_ns;
        // Older than the copy: the copy already answered for that moment.
        table.normalize(pid, 0x10, first_read - 1);
        assert_eq!(table.maps[&pid].read_ns, first_read);
        // Newer: one re-read.
        table.normalize(pid, 0x10, crate::collect::monotonic_ns());
        assert!(table.maps[&pid].read_ns > first_read);
    }

    /// A maps read its process's exit overtook ends short, without the libraries; the
    /// intake thread offers it as read at 0: a stand-in where nothing is known, never over
    /// a whole copy (the library's own, read at its sample).
    #[test]
    fn a_maps_read_the_exit_overtook_does_not_replace_a_whole_copy() {
        let exe = "55d000000000-55d000010000 r-xp 00002000 08:01 100 /usr/bin/sort\n";
        let libc = "7f0000000000-7f0000100000 r-xp 00026000 08:01 200 /usr/lib/libc.so.6\n";
        let whole = format!("{exe}{libc}");
        let paths = |table: &StackTable, pid: u32| -> Vec<String> {
            table.maps[&pid]
                .vmas
                .iter()
                .filter_map(|v| Some(v.path.as_ref()?.display().to_string()))
                .collect()
        };
        let mut table = StackTable::default();
        table.offer_maps(7, 100, &whole);
        table.offer_maps(7, 0, exe);
        assert_eq!(paths(&table, 7), ["/usr/bin/sort", "/usr/lib/libc.so.6"]);
        assert_eq!(table.maps[&7].read_ns, 100);
        table.offer_maps(8, 0, exe);
        assert_eq!(paths(&table, 8), ["/usr/bin/sort"]);
        // Any copy read at a time replaces the stand-in.
        table.offer_maps(8, 50, &whole);
        assert_eq!(paths(&table, 8).len(), 2);
        // A read the exit overtook that still has every mapping (and more) is taken over
        // a copy read before the program's libraries were mapped.
        table.offer_maps(9, 100, exe);
        table.offer_maps(9, 0, &whole);
        assert_eq!(paths(&table, 9).len(), 2);
        assert_eq!(table.maps[&9].read_ns, 100, "its own time is not known");
    }

    impl ModuleTable {
        fn intern_lookup(&self, path: &str) -> ModuleId {
            self.index
                .iter()
                .find(|((p, _), _)| p == Path::new(path))
                .map(|(_, &id)| id)
                .expect("module interned")
        }
    }
}
