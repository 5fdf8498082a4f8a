//! Which allocator a process uses, and which of its functions to probe.
//!
//! This first version knows glibc: the mapped `libc.so.6` provides the malloc family. The
//! function sizes from its dynamic symbol table let the kernel side recognize a malloc called
//! from inside realloc or the memalign family (counted once, DESIGN.md §3).

use std::path::{Path, PathBuf};

use iced_x86::Register;
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use sampler_common::AllocFn;

use super::{
    maps::Vma,
    prologue::{self, Placement},
};

/// An allocator library found in a process, with the functions it exports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocator {
    /// Path of the library as the process maps it.
    pub path: PathBuf,
    /// Probed functions present in the library, one per distinct address.
    pub functions: Vec<Function>,
    /// Where to probe `free` (to track frees), if the library exports it.
    pub free: Option<Placement>,
}

/// A probed function as the library defines it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Which function.
    pub function: AllocFn,
    /// Symbol value (address in the file's virtual address space).
    pub address: u64,
    /// Code size in bytes.
    pub size: u64,
    /// File offset of the symbol (what uprobes attach to).
    pub file_offset: u64,
    /// Where in it the probe goes (see [`prologue`]).
    pub probe: Placement,
}

/// Registers the allocation probes read: the size and pointer arguments.
const ARGUMENT_REGISTERS: [Register; 3] = [Register::RDI, Register::RSI, Register::RDX];

/// Errors finding an allocator.
#[derive(Debug, thiserror::Error)]
pub enum AllocatorError {
    /// No mapping looks like glibc.
    #[error("no allocator found: the process maps no libc.so (statically linked or not glibc?)")]
    NoLibc,
    /// The library could not be read or parsed.
    #[error("cannot read allocator library {path}")]
    Unreadable {
        /// The library.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The library has no malloc symbol.
    #[error("{path} exports no malloc to probe")]
    NoMalloc {
        /// The library.
        path: PathBuf,
    },
}

/// Finds glibc among the mappings.
pub fn find(vmas: &[Vma]) -> Result<Allocator, AllocatorError> {
    let path = vmas
        .iter()
        .filter_map(|vma| vma.path.as_deref())
        .find(|path| is_libc(path))
        .ok_or(AllocatorError::NoLibc)?;
    let data = std::fs::read(path).map_err(|source| AllocatorError::Unreadable {
        path: path.to_owned(),
        source,
    })?;
    let functions = exported_functions(&data).map_err(|source| AllocatorError::Unreadable {
        path: path.to_owned(),
        source,
    })?;
    let free = free_placement(&data);
    if !functions.iter().any(|f| f.function == AllocFn::Malloc) {
        return Err(AllocatorError::NoMalloc {
            path: path.to_owned(),
        });
    }
    Ok(Allocator {
        path: path.to_owned(),
        functions,
        free,
    })
}

/// Where to probe `free(ptr)`: it reads only `rdi`.
pub fn free_placement(elf: &[u8]) -> Option<Placement> {
    let file = object::File::parse(elf).ok()?;
    let symbol = file.dynamic_symbols().chain(file.symbols()).find(|s| {
        s.is_definition() && s.name().is_ok_and(|n| n.split('@').next() == Some("free"))
    })?;
    let code = code_at(&file, symbol.address(), symbol.size())?;
    Some(prologue::choose(code, &[Register::RDI]))
}

/// The file offset of virtual `address`, through the section holding it.
fn file_offset_of(file: &object::File, address: u64) -> Option<u64> {
    let section = file
        .sections()
        .find(|s| (s.address()..s.address() + s.size()).contains(&address))?;
    let (offset, _) = section.file_range()?;
    Some(address - section.address() + offset)
}

/// The bytes of `[address, address + size)` from the section holding them.
fn code_at<'data>(file: &object::File<'data>, address: u64, size: u64) -> Option<&'data [u8]> {
    file.sections()
        .find(|s| (s.address()..s.address() + s.size()).contains(&address))?
        .data_range(address, size.max(1))
        .ok()?
}

fn is_libc(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("libc.so") || name.starts_with("libc-2."))
}

/// The probed functions an ELF file defines (dynamic symbols first, the static table as a
/// fallback). Aliases are dropped: glibc's memalign and aligned_alloc are one function at one
/// address, and two probes there would count each call twice; the one kept comes first in
/// [`AllocFn::ALL`] order (the arguments of aliases are laid out alike). Pure: takes the
/// file's bytes.
pub fn exported_functions(elf: &[u8]) -> std::io::Result<Vec<Function>> {
    let file = object::File::parse(elf).map_err(std::io::Error::other)?;
    let mut found: Vec<Function> = Vec::new();
    for symbol in file.dynamic_symbols().chain(file.symbols()) {
        if !symbol.is_definition() || symbol.kind() != object::SymbolKind::Text {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        // Versioned names (malloc@@GLIBC_2.2.5) appear in some tables.
        let name = name.split('@').next().unwrap_or(name);
        if let Some(function) = AllocFn::ALL.into_iter().find(|f| f.symbol() == name) {
            if !found.iter().any(|f| f.function == function) {
                let code = code_at(&file, symbol.address(), symbol.size()).unwrap_or_default();
                found.push(Function {
                    function,
                    address: symbol.address(),
                    size: symbol.size(),
                    file_offset: file_offset_of(&file, symbol.address()).unwrap_or(0),
                    probe: prologue::choose(code, &ARGUMENT_REGISTERS),
                });
            }
        }
    }
    found.sort_by_key(|f| f.function as u32);
    let mut distinct: Vec<Function> = Vec::with_capacity(found.len());
    for function in found {
        if !distinct.iter().any(|kept| kept.address == function.address) {
            distinct.push(function);
        }
    }
    Ok(distinct)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognizes_libc_names() {
        assert!(is_libc(Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6")));
        assert!(is_libc(Path::new("/lib/libc-2.31.so")));
        assert!(!is_libc(Path::new("/usr/lib/libcap.so.2")));
        assert!(!is_libc(Path::new("/usr/lib/libcrypt.so.1")));
    }

    #[test]
    fn no_libc_is_a_clear_error() {
        let err = find(&[]).unwrap_err();
        assert!(err.to_string().contains("no allocator found"), "{err}");
    }

    #[test]
    fn garbage_is_not_an_elf() {
        assert!(exported_functions(b"not an elf").is_err());
    }
}
