//! The files a stack's frames are in: each interned once by the path processes show it at
//! and its identity, its image kept open (mapped) for the unwinder, the return-address
//! check and symbolization, even after the processes that mapped it are gone.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

use super::{image::Image, ModuleId};
use crate::sys::maps::FileId;

/// Interned modules: a path as processes show it, and the file itself, kept open.
#[derive(Debug, Default)]
pub struct ModuleTable {
    paths: Vec<PathBuf>,
    names: Vec<String>,
    pub(super) file_ids: Vec<FileId>,
    files: Vec<Option<std::fs::File>>,
    build_ids: Vec<OnceLock<Option<String>>>,
    images: Vec<OnceLock<Option<Arc<Image>>>>,
    pub(super) index: HashMap<(PathBuf, FileId), ModuleId>,
    /// How many distinct files go by each path (a container's libc and the host's).
    files_per_path: HashMap<PathBuf, usize>,
    /// Files allocscope holds open itself (the in-process front end's memfd), by identity:
    /// readable after the processes that map them have exited.
    held: HashMap<FileId, PathBuf>,
}

impl ModuleTable {
    /// The id of the file `file_id` shown as `path`, interning it; `open` is where to open
    /// it now (tried once).
    pub fn intern(&mut self, path: &Path, file_id: &FileId, open: &Path) -> ModuleId {
        let key = (path.to_owned(), file_id.clone());
        if let Some(&id) = self.index.get(&key) {
            return id;
        }
        let id = self.paths.len() as ModuleId;
        let seen = self.files_per_path.entry(path.to_owned()).or_default();
        self.names.push(name(path, file_id, *seen));
        *seen += 1;
        self.paths.push(path.to_owned());
        self.file_ids.push(file_id.clone());
        let file = open_module(open, path, file_id).or_else(|| {
            let held = self.held.get(file_id)?;
            std::fs::File::open(held).ok()
        });
        self.files.push(file);
        self.build_ids.push(OnceLock::new());
        self.images.push(OnceLock::new());
        self.index.insert(key, id);
        id
    }

    /// Makes the file `file_id` readable at `path` (one allocscope holds open) whatever
    /// process shows it, also once that process has exited.
    pub fn hold(&mut self, file_id: FileId, path: PathBuf) {
        self.held.insert(file_id, path);
    }

    /// Module `id`'s file, mapped once on first use (`None`: it could not be opened).
    pub fn image(&self, id: ModuleId) -> Option<&Arc<Image>> {
        self.images[id as usize]
            .get_or_init(|| Image::open(self.files[id as usize].as_ref()?))
            .as_ref()
    }

    /// The name of module `id` in profiles: its path, told apart from other files by the
    /// same path seen earlier.
    pub fn name(&self, id: ModuleId) -> &str {
        &self.names[id as usize]
    }

    /// The GNU build id of module `id`, in hex, read once from the file itself.
    pub fn build_id(&self, id: ModuleId) -> Option<&str> {
        self.build_ids[id as usize]
            .get_or_init(|| build_id(&self.source(id)))
            .as_deref()
    }

    /// Where to read module `id` from: its open file (`/proc/self/fd/N`), else its path.
    pub fn source(&self, id: ModuleId) -> PathBuf {
        match &self.files[id as usize] {
            Some(file) => crate::sys::own::fd_path(file),
            None => self.paths[id as usize].clone(),
        }
    }
}

/// How module `path` is named when `earlier` other files went by the same path: the first
/// keeps the plain path, later ones carry their device and inode.
fn name(path: &Path, file_id: &FileId, earlier: usize) -> String {
    if earlier == 0 {
        path.display().to_string()
    } else {
        let FileId { device, inode } = file_id;
        format!("{} (inode {inode} on {device})", path.display())
    }
}

/// The GNU build id of an ELF file, in hex.
pub fn build_id(path: &Path) -> Option<String> {
    use object::Object as _;
    // A module's path can be replaced once its process is gone: never a blocking open.
    let data = crate::infile::map_regular(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let id = file.build_id().ok()??;
    Some(id.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Opens a module at `open` (the process's own view of it), or, once that process is gone,
/// at `path` in our file system if it is the very same file (device and inode).
fn open_module(open: &Path, path: &Path, file_id: &FileId) -> Option<std::fs::File> {
    if let Ok(file) = std::fs::File::open(open) {
        return Some(file);
    }
    let file = std::fs::File::open(path).ok()?;
    (FileId::of(&file.metadata().ok()?) == *file_id).then_some(file)
}
