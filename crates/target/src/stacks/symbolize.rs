//! Symbol names, files and lines for normalized frames, on a thread of its own.
//!
//! blazesym's `Symbolizer` is not `Send`, and symbolizing is slow next to sample intake, so
//! one thread owns it and answers batched requests over a channel; results are cached per
//! (file, offset), so each distinct frame is resolved once per session; its strings are shared
//! (`Arc<str>`) by every stack that holds it (100,000 stacks of 46 frames each held their own
//! copies: 28 KB a stack). Files are read from
//! disk by path and file offset, which keeps working after the process has exited.

pub use crate::schema::{FrameInfo, FrameKind};

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{mpsc, Arc},
    thread,
};

use blazesym::symbolize::{
    source::{Elf, Source},
    Input, Symbolized, Symbolizer as Blazesym,
};
use tokio::sync::oneshot;

use super::debuginfod::Fetcher;

/// What the thread is asked.
enum Request {
    /// A batch: (module path, file offset of a return address) per frame.
    Resolve(Vec<(PathBuf, u64)>, oneshot::Sender<Vec<Vec<FrameInfo>>>),
    /// Drop every cache (the parsed files, the resolved frames): a recording that runs
    /// for days (the agent) would otherwise keep every program the host ever ran parsed.
    Forget,
}

/// Handle to the symbolizer thread; the thread ends when the handle is dropped.
pub struct Symbolizer {
    requests: mpsc::Sender<Request>,
    /// Set when a request outlived [`DEADLINE`] or was cancelled: the thread may be stuck
    /// (in a blocking read of a file someone else controls), so nothing more is asked of it.
    abandoned: std::sync::atomic::AtomicBool,
    /// The build-id tree fetched debug files are linked into (`DEBUGINFOD_URLS` set):
    /// held here, so that it is removed when allocscope ends, whatever the thread is doing.
    _tree: Option<tempfile::TempDir>,
}

/// The longest one batch of frames may take to symbolize (debuginfod lookups included)
/// before the profile is written with the rest unresolved.
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

impl Symbolizer {
    /// Starts the thread. Separate debug files are looked up (by build id, then by
    /// `.gnu_debuglink` name) in `debug_dirs`, then in /usr/lib/debug and /lib/debug, then,
    /// when `DEBUGINFOD_URLS` is set, fetched from debuginfod ([`super::debuginfod`]).
    pub fn spawn(debug_dirs: &[PathBuf]) -> std::io::Result<Symbolizer> {
        let (requests, incoming) = mpsc::channel::<Request>();
        let mut dirs = debug_dirs.to_vec();
        dirs.extend(DEFAULT_DEBUG_DIRS.iter().map(PathBuf::from));
        let tree =
            if super::debuginfod::servers_of(&std::env::var("DEBUGINFOD_URLS").unwrap_or_default())
                .is_empty()
            {
                None
            } else {
                Some(
                    tempfile::Builder::new()
                        .prefix("allocscope-debuginfod-")
                        .tempdir()?,
                )
            };
        let tree_path = tree.as_ref().map(|t| t.path().to_owned());
        thread::Builder::new()
            .name("symbolizer".into())
            .spawn(move || serve(incoming, dirs, tree_path))?;
        Ok(Symbolizer {
            requests,
            abandoned: std::sync::atomic::AtomicBool::new(false),
            _tree: tree,
        })
    }

    /// Drops the thread's caches (parsed files, resolved frames); later batches parse
    /// again what they need.
    pub fn forget_caches(&self) {
        let _ = self.requests.send(Request::Forget);
    }

    /// Has the thread resolve `frames` now, into its caches, answering nobody: the files
    /// they are in are parsed while the targets run (on another core, mostly), not after
    /// they exit, when the profile is awaited (part of a Python command's end:
    /// docs/performance.md, "Figures quoted from the code").
    pub fn warm(&self, frames: Vec<(PathBuf, u64)>) {
        if frames.is_empty() || self.abandoned.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let (reply, _) = oneshot::channel();
        let _ = self.requests.send(Request::Resolve(frames, reply));
    }

    /// Resolves each frame to its (possibly inlined) functions, innermost first. A frame
    /// that cannot be resolved comes back with `function: None`, never as an error.
    ///
    /// Under [`DEADLINE`], and cancelled by a second SIGINT or SIGTERM while it runs (the
    /// first may be a stop request crossing a recording that stopped on its own: it gets a
    /// note): the frames then come back unresolved (module and address), with a warning,
    /// and the symbolizer is not asked again.
    pub async fn resolve(&self, frames: Vec<(PathBuf, u64)>) -> Vec<Vec<FrameInfo>> {
        use std::sync::atomic::Ordering;
        use tokio::signal::unix::{signal, SignalKind};
        let count = frames.len();
        // Unresolved: each frame keeps its module and address.
        let unresolved = |frames: &[(PathBuf, u64)]| -> Vec<Vec<FrameInfo>> {
            frames
                .iter()
                .map(|(module, offset)| {
                    vec![FrameInfo {
                        module: Some(module.display().to_string().into()),
                        address: *offset,
                        ..FrameInfo::default()
                    }]
                })
                .collect()
        };
        if self.abandoned.load(Ordering::Relaxed) {
            return unresolved(&frames);
        }
        let asked = frames.clone();
        let (reply, answer) = oneshot::channel();
        if self.requests.send(Request::Resolve(frames, reply)).is_err() {
            return unresolved(&asked);
        }
        let mut interrupt = signal(SignalKind::interrupt()).ok();
        let mut terminate = signal(SignalKind::terminate()).ok();
        // A signal that arrived before (the one that stopped the recording) may still be
        // pending for a new listener: taken now, so that only a later one cancels.
        for pending in [&mut interrupt, &mut terminate].into_iter().flatten() {
            let _ = tokio::time::timeout(std::time::Duration::ZERO, pending.recv()).await;
        }
        // One signal may be a stop request that crossed a recording already stopping on its
        // own (every target gone): it is answered with a note; a second one cancels.
        let signalled = async {
            let mut seen = 0;
            loop {
                let which = match (&mut interrupt, &mut terminate) {
                    (Some(i), Some(t)) => tokio::select! {
                        _ = i.recv() => "SIGINT",
                        _ = t.recv() => "SIGTERM",
                    },
                    _ => std::future::pending().await,
                };
                seen += 1;
                if seen >= 2 {
                    break which;
                }
                log::warn!("symbolizing the stacks before writing the profile: {which} again writes it with addresses only");
            }
        };
        let why = tokio::select! {
            answered = answer => return answered.unwrap_or_else(|_| unresolved(&asked)),
            _ = tokio::time::sleep(DEADLINE) => format!("took over {} s", DEADLINE.as_secs()),
            signal = signalled => format!("was cancelled by {signal}"),
        };
        self.abandoned.store(true, Ordering::Relaxed);
        log::warn!("symbolization {why}: {count} frames and any later ones are left unresolved (addresses only)");
        unresolved(&asked)
    }
}

/// Where distributions install separate debug files (Debian: `*-dbg`, `*-dbgsym`).
const DEFAULT_DEBUG_DIRS: [&str; 2] = ["/usr/lib/debug", "/lib/debug"];

fn serve(incoming: mpsc::Receiver<Request>, mut debug_dirs: Vec<PathBuf>, tree: Option<PathBuf>) {
    // The debuginfod client blocks: made here, on this thread, never in the async runtime.
    let mut fetcher = tree.as_deref().and_then(|tree| {
        Fetcher::from_env(&debug_dirs, tree).unwrap_or_else(|e| {
            log::warn!("debuginfod disabled: {e:#}");
            None
        })
    });
    if let Some(tree) = tree.filter(|_| fetcher.is_some()) {
        debug_dirs.push(tree);
    }
    let build = || {
        Blazesym::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            // Ours demangles only mangled names (blazesym's reads a C function `f` as `float`).
            .enable_demangling(false)
            .set_debug_dirs(Some(debug_dirs.clone()))
            .build()
    };
    let mut symbolizer = build();
    let mut cache: HashMap<(PathBuf, u64), Vec<FrameInfo>> = HashMap::new();
    // Per module: whether its DWARF (and so its debug link) may be read.
    let mut debug_syms: HashMap<PathBuf, bool> = HashMap::new();
    for request in incoming {
        let (frames, reply) = match request {
            Request::Resolve(frames, reply) => (frames, reply),
            Request::Forget => {
                symbolizer = build();
                cache = HashMap::new();
                debug_syms = HashMap::new();
                continue;
            }
        };
        let mut by_module: HashMap<&Path, Vec<u64>> = HashMap::new();
        for (path, offset) in &frames {
            if !cache.contains_key(&(path.clone(), *offset)) {
                by_module.entry(path).or_default().push(*offset);
            }
        }
        for (path, offsets) in by_module {
            if let Some(fetcher) = &mut fetcher {
                if let Some(id) = super::build_id(path) {
                    let size = std::fs::metadata(path).map_or(0, |m| m.len());
                    fetcher.ensure(&id, size);
                }
            }
            let with_debug = *debug_syms.entry(path.to_owned()).or_insert_with(|| {
                match irregular_debug_file(path, &debug_dirs) {
                    Some((candidate, what)) => {
                        log::warn!(
                            "not reading {}'s separate debug info: {} is {what} (opening it could block forever); its symbols come from the file itself",
                            crate::text::printable(&path.display().to_string()),
                            crate::text::printable(&candidate.display().to_string()),
                        );
                        false
                    }
                    None => true,
                }
            });
            let resolved = resolve_module(&symbolizer, path, &offsets, with_debug);
            for (offset, infos) in offsets.into_iter().zip(resolved) {
                cache.insert((path.to_owned(), offset), infos);
            }
        }
        let answer = frames
            .iter()
            .map(|key| cache.get(key).cloned().unwrap_or_default())
            .collect();
        let _ = reply.send(answer);
    }
}

/// Where blazesym may look for `module`'s separate debug file, and the first of those that
/// exists but is not a regular file. blazesym opens the first candidate that exists with a
/// blocking `open`: a FIFO planted there by a target's owner would block the symbolizer
/// forever. A superset of its candidates is checked: the build-id paths under each debug
/// directory, and the `.gnu_debuglink` name beside the module (its real path), in its
/// `.debug` directory, and under each debug directory (with and without the module's
/// directory).
fn irregular_debug_file(module: &Path, debug_dirs: &[PathBuf]) -> Option<(PathBuf, &'static str)> {
    use object::Object as _;
    use std::os::unix::ffi::OsStrExt as _;
    if let Some(what) = crate::infile::exists_irregular(module) {
        return Some((module.to_owned(), what));
    }
    let data = crate::infile::map_regular(module).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(Some(id)) = file.build_id() {
        if let Some((first, rest)) = id.split_first() {
            let rest: String = rest.iter().map(|b| format!("{b:02x}")).collect();
            for dir in debug_dirs {
                candidates.push(
                    dir.join(".build-id")
                        .join(format!("{first:02x}"))
                        .join(format!("{rest}.debug")),
                );
            }
        }
    }
    if let Ok(Some((name, _))) = file.gnu_debuglink() {
        let name = Path::new(std::ffi::OsStr::from_bytes(name));
        let real = std::fs::canonicalize(module).unwrap_or_else(|_| module.to_owned());
        if let Some(dir) = real.parent() {
            candidates.push(dir.join(name));
            candidates.push(dir.join(".debug").join(name));
            let relative = dir.strip_prefix("/").unwrap_or(dir);
            for debug_dir in debug_dirs {
                candidates.push(debug_dir.join(relative).join(name));
                candidates.push(debug_dir.join(name));
            }
        }
    }
    candidates
        .into_iter()
        .find_map(|c| crate::infile::exists_irregular(&c).map(|what| (c, what)))
}

fn resolve_module(
    symbolizer: &Blazesym,
    path: &Path,
    offsets: &[u64],
    debug_syms: bool,
) -> Vec<Vec<FrameInfo>> {
    let module: Option<Arc<str>> = Some(path.display().to_string().into());
    // One copy of each source file's name for all its frames.
    let mut files: HashMap<PathBuf, Arc<str>> = HashMap::new();
    let unresolved = |offset: u64| {
        vec![FrameInfo {
            module: module.clone(),
            address: offset,
            ..FrameInfo::default()
        }]
    };
    // A return address points after the call; its call instruction is one byte earlier
    // (and may be the last instruction of the function, before another function starts).
    let call_sites: Vec<u64> = offsets.iter().map(|o| o.saturating_sub(1)).collect();
    let mut elf = Elf::new(path);
    elf.debug_syms = debug_syms;
    let source = Source::Elf(elf);
    let Ok(results) = symbolizer.symbolize(&source, Input::FileOffset(&call_sites)) else {
        return offsets.iter().map(|&o| unresolved(o)).collect();
    };
    offsets
        .iter()
        .zip(results)
        .map(|(&offset, result)| match result {
            Symbolized::Sym(sym) => {
                let mut location = |info: Option<&blazesym::symbolize::CodeInfo>| {
                    info.map(|info| {
                        let path = info.to_path().into_owned();
                        let name = files
                            .entry(path)
                            .or_insert_with_key(|path| path.display().to_string().into())
                            .clone();
                        (Some(name), info.line)
                    })
                    .unwrap_or((None, None))
                };
                let mut frames = Vec::with_capacity(sym.inlined.len() + 1);
                for inlined in sym.inlined.iter().rev() {
                    let (file, line) = location(inlined.code_info.as_ref());
                    frames.push(FrameInfo {
                        function: Some(super::demangle::demangle(&inlined.name).into()),
                        module: module.clone(),
                        file,
                        line,
                        address: offset,
                        kind: None,
                    });
                }
                let (file, line) = location(sym.code_info.as_deref());
                frames.push(FrameInfo {
                    function: Some(super::demangle::demangle(&sym.name).into()),
                    module: module.clone(),
                    file,
                    line,
                    address: offset,
                    kind: None,
                });
                frames
            }
            Symbolized::Unknown(_) => unresolved(offset),
        })
        .collect()
}
