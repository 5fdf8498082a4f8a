//! Symbol names, files and lines for normalized frames, on a thread of its own.
//!
//! blazesym's `Symbolizer` is not `Send`, and symbolizing is slow next to sample intake, so
//! one thread owns it and answers batched requests over a channel; results are cached per
//! (file, offset), so each distinct frame is resolved once per session. Files are read from
//! disk by path and file offset, which keeps working after the process has exited.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::mpsc,
    thread,
};

use blazesym::symbolize::{
    source::{Elf, Source},
    Input, Symbolized, Symbolizer as Blazesym,
};
use tokio::sync::oneshot;

use super::debuginfod::Fetcher;

/// A resolved frame. One return address can resolve to several (inlined calls).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FrameInfo {
    /// Function name, demangled; `None` when unknown.
    pub function: Option<String>,
    /// Path of the module (executable or library) as the process mapped it.
    pub module: Option<String>,
    /// Source file, when debug info has it.
    pub file: Option<String>,
    /// Source line, when debug info has it.
    pub line: Option<u32>,
    /// File offset of the return address in the module (or the raw address when unmapped).
    pub address: u64,
}

/// A batch: (module path, file offset of a return address) per frame.
type Request = (Vec<(PathBuf, u64)>, oneshot::Sender<Vec<Vec<FrameInfo>>>);

/// Handle to the symbolizer thread; the thread ends when the handle is dropped.
pub struct Symbolizer {
    requests: mpsc::Sender<Request>,
}

impl Symbolizer {
    /// Starts the thread. Separate debug files are looked up (by build id, then by
    /// `.gnu_debuglink` name) in `debug_dirs`, then in /usr/lib/debug and /lib/debug, then,
    /// when `DEBUGINFOD_URLS` is set, fetched from debuginfod ([`super::debuginfod`]).
    pub fn spawn(debug_dirs: &[PathBuf]) -> std::io::Result<Symbolizer> {
        let (requests, incoming) = mpsc::channel::<Request>();
        let mut dirs = debug_dirs.to_vec();
        dirs.extend(DEFAULT_DEBUG_DIRS.iter().map(PathBuf::from));
        thread::Builder::new()
            .name("symbolizer".into())
            .spawn(move || serve(incoming, dirs))?;
        Ok(Symbolizer { requests })
    }

    /// Resolves each frame to its (possibly inlined) functions, innermost first. A frame
    /// that cannot be resolved comes back with `function: None`, never as an error.
    pub async fn resolve(&self, frames: Vec<(PathBuf, u64)>) -> Vec<Vec<FrameInfo>> {
        let count = frames.len();
        let (reply, answer) = oneshot::channel();
        if self.requests.send((frames, reply)).is_err() {
            return vec![Vec::new(); count];
        }
        answer.await.unwrap_or_else(|_| vec![Vec::new(); count])
    }
}

/// Where distributions install separate debug files (Debian: `*-dbg`, `*-dbgsym`).
const DEFAULT_DEBUG_DIRS: [&str; 2] = ["/usr/lib/debug", "/lib/debug"];

fn serve(incoming: mpsc::Receiver<Request>, mut debug_dirs: Vec<PathBuf>) {
    // The debuginfod client blocks: made here, on this thread, never in the async runtime.
    let mut fetcher = Fetcher::from_env(&debug_dirs).unwrap_or_else(|e| {
        log::warn!("debuginfod disabled: {e:#}");
        None
    });
    if let Some(fetcher) = &fetcher {
        debug_dirs.push(fetcher.tree().to_owned());
    }
    let symbolizer = Blazesym::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .set_debug_dirs(Some(debug_dirs))
        .build();
    let mut cache: HashMap<(PathBuf, u64), Vec<FrameInfo>> = HashMap::new();
    for (frames, reply) in incoming {
        let mut by_module: HashMap<&Path, Vec<u64>> = HashMap::new();
        for (path, offset) in &frames {
            if !cache.contains_key(&(path.clone(), *offset)) {
                by_module.entry(path).or_default().push(*offset);
            }
        }
        for (path, offsets) in by_module {
            if let Some(fetcher) = &mut fetcher {
                if let Some(id) = super::build_id(path) {
                    fetcher.ensure(&id);
                }
            }
            let resolved = resolve_module(&symbolizer, path, &offsets);
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

fn resolve_module(symbolizer: &Blazesym, path: &Path, offsets: &[u64]) -> Vec<Vec<FrameInfo>> {
    let module = Some(path.display().to_string());
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
    let source = Source::Elf(Elf::new(path));
    let Ok(results) = symbolizer.symbolize(&source, Input::FileOffset(&call_sites)) else {
        return offsets.iter().map(|&o| unresolved(o)).collect();
    };
    offsets
        .iter()
        .zip(results)
        .map(|(&offset, result)| match result {
            Symbolized::Sym(sym) => {
                let location = |info: Option<&blazesym::symbolize::CodeInfo>| {
                    info.map(|info| (Some(info.to_path().display().to_string()), info.line))
                        .unwrap_or((None, None))
                };
                let mut frames = Vec::with_capacity(sym.inlined.len() + 1);
                for inlined in sym.inlined.iter().rev() {
                    let (file, line) = location(inlined.code_info.as_ref());
                    frames.push(FrameInfo {
                        function: Some(inlined.name.to_string()),
                        module: module.clone(),
                        file,
                        line,
                        address: offset,
                    });
                }
                let (file, line) = location(sym.code_info.as_deref());
                frames.push(FrameInfo {
                    function: Some(sym.name.to_string()),
                    module: module.clone(),
                    file,
                    line,
                    address: offset,
                });
                frames
            }
            Symbolized::Unknown(_) => unresolved(offset),
        })
        .collect()
}
