//! Which allocators a process uses, and which of their entry points to probe.
//!
//! An allocator is any mapped ELF file that defines a malloc (by its plain name or a
//! prefixed one: `je_`, `_rjem_`, `tc_`, `mi_`): glibc's `libc.so.6`, an interposed
//! jemalloc, tcmalloc or mimalloc, or an allocator linked statically into the executable
//! (read from its full symbol table). Every allocator a process maps is probed: an
//! interposed library takes the calls, but the C library's own malloc can still be reached
//! (by code that calls it directly), and each probed call is real memory. A function
//! reached from another probed one (`new[]` tail-calling `new`, glibc's `realloc(NULL, n)`
//! calling `malloc`) is recognized in the kernel and counted once (docs/design.md §3).
//!
//! C++ `operator new`/`delete` are probed where an allocator defines them (tcmalloc,
//! jemalloc, mimalloc replace them); libstdc++'s own versions call `malloc`/`free` and
//! need no probe of their own. The analysis of a file is pure (bytes in, entry points
//! out) and cached by the caller per file identity, so a host with a thousand processes
//! parses its libc once.

use super::entry_names::{classify, is_small_objects, mimalloc_aligned};
use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use iced_x86::Register;
use object::{Object as _, ObjectSection as _, ObjectSymbol as _, ObjectSymbolTable as _};
use sampler_common::AllocFn;

use crate::sys::maps::{FileId, Vma};

use super::{
    prologue::{self, Placement},
    usdt,
};

pub use super::entry_names::Role;

/// A probed entry point as the file defines it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Which function (argument layout).
    pub function: AllocFn,
    /// The symbol chosen among its aliases (reported with `--verbose` and in JSON).
    pub symbol: String,
    /// Symbol value (address in the file's virtual address space).
    pub address: u64,
    /// Code size in bytes.
    pub size: u64,
    /// File offset of the symbol (what uprobes attach to).
    pub file_offset: u64,
    /// Where in it the probe goes (see [`prologue`]).
    pub probe: Placement,
    /// A small-object allocator's entry (CPython's `PyObject_*`): it counts only the
    /// requests it serves itself (see [`sampler_common::cookie::is_small_objects`]).
    pub small_objects: bool,
    /// Whether its symbol is global in the file (a C function of default visibility,
    /// called by the C convention from anywhere): only those are patched in-process, a
    /// local one may be called with registers its callers rely on (GCC's `-fipa-ra`).
    pub global: bool,
}

impl Function {
    /// The attach cookie of its probe for target `slot`: the function, the slot, where
    /// the probed instruction finds each argument the prologue moved, and for the `malloc`
    /// of an allocator other than glibc's (`outer`) that it may call another probed
    /// `malloc` (a program's own `malloc` calling `__libc_malloc`).
    /// `served`: the allocator is one an in-process front end serves
    /// ([`Allocator::served_by_front_end`]).
    pub fn cookie(&self, slot: u32, outer: bool, served: bool) -> u64 {
        let mut value = sampler_common::cookie::new(self.function as u32, slot);
        if served {
            value = sampler_common::cookie::with_served_by_front_end(value);
        }
        if outer && self.function == AllocFn::Malloc {
            value = sampler_common::cookie::with_outer(value);
        }
        if self.small_objects {
            value = sampler_common::cookie::with_small_objects(value);
        }
        for (own, now) in &self.probe.moved {
            let n = ARGUMENT_REGISTERS.iter().position(|r| r == own);
            if let (Some(n), Some(now)) = (n, prologue::cookie_register(*now)) {
                value = sampler_common::cookie::with_moved(value, n, now);
            }
        }
        value
    }
}

/// A probed free-like entry point (`free`, `sdallocx`, `operator delete`, `mi_free`…).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreeFunction {
    /// The symbol chosen among its aliases.
    pub symbol: String,
    /// Symbol value (address in the file's virtual address space).
    pub address: u64,
    /// Code size in bytes.
    pub size: u64,
    /// Whether its symbol is global (see [`Function::global`]).
    pub global: bool,
    /// File offset of the symbol.
    pub file_offset: u64,
    /// Where in it the probe goes.
    pub probe: Placement,
}

/// The entry points of one allocator file (the pure analysis, shared between processes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocatorFile {
    /// Which allocator this is.
    pub kind: AllocatorKind,
    /// Allocation entry points, one per distinct address.
    pub functions: Vec<Function>,
    /// Free entry points, one per distinct address.
    pub frees: Vec<FreeFunction>,
    /// The in-process front end's probe sites ([`AllocatorKind::InProcess`]: no entry points).
    pub front_end: Option<usdt::FrontEnd>,
    /// Another program's sampling allocator's probe sites ([`AllocatorKind::Producer`]: no entry
    /// points).
    pub producer: Option<usdt::Producer>,
    /// Where a Go runtime keeps what is read of it ([`AllocatorKind::GoRuntime`] only).
    pub go: Option<super::go::Places>,
    /// Linked into an executable that this recording's in-process front end patches
    /// (see [`super::patch`]): its calls reach the front end, and it is never probed (a
    /// uprobe's breakpoint over a patched entry would break it).
    pub patched_in_process: bool,
}

impl AllocatorFile {
    /// Whether the process counts and samples this allocator's calls itself (allocscope's
    /// preload library), so that the malloc-family allocators behind it need no probes.
    pub fn is_in_process(&self) -> bool {
        self.front_end.is_some()
    }

    /// Whether the process samples its allocations itself and reports them through another
    /// producer's probes (`otel_memory`, `ddheap`): probed there instead of its malloc.
    pub fn is_producer(&self) -> bool {
        self.producer.is_some() && self.kind == AllocatorKind::Producer
    }

    /// Whether this is a Go executable whose runtime's heap profiler is probed (its own
    /// sampled blocks; `malloc`, which cgo calls, stays probed as usual).
    pub fn is_go_runtime(&self) -> bool {
        self.producer.is_some() && self.kind == AllocatorKind::GoRuntime
    }

    /// Whether a process mapping it counts or samples its own allocations (allocscope's
    /// library, or another producer): its sites are reached by sampled blocks only.
    pub fn reports_itself(&self) -> bool {
        self.is_in_process() || self.is_producer()
    }
}

/// An allocator found in a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocator {
    /// Where to open (and attach to) the file: through the process's own view of it.
    pub path: PathBuf,
    /// The file's path as the process maps it (what users see).
    pub shown: PathBuf,
    /// Identity of the file (device, inode).
    pub file_id: FileId,
    /// Whether it is the executable itself (a statically linked allocator).
    pub in_executable: bool,
    /// Its entry points.
    pub file: Arc<AllocatorFile>,
}

impl Allocator {
    /// Whether its calls all reach an in-process front end in a process that has one: a
    /// malloc-family library (the front end interposes its functions; an executable's own
    /// `malloc` comes before any preloaded one in the dynamic linker's order, so the front
    /// end never sees those calls), and CPython's pymalloc wherever it is (the front end
    /// wraps the interpreter's memory and object domains with `PyMem_SetAllocator`, which
    /// every call goes through, inlined or not).
    pub fn served_by_front_end(&self) -> bool {
        match self.file.kind {
            AllocatorKind::InProcess | AllocatorKind::Producer | AllocatorKind::GoRuntime => false,
            AllocatorKind::Pymalloc => true,
            _ => !self.in_executable || self.file.patched_in_process,
        }
    }

    /// "jemalloc (/usr/lib/…/libjemalloc.so.2)", "malloc (static, in /usr/bin/x)" or
    /// "otel_memory probes (/usr/bin/x)".
    pub fn describe(&self) -> String {
        if let (Some(producer), true) = (&self.file.producer, self.file.is_go_runtime()) {
            let detail = producer.detail.as_deref().unwrap_or_default();
            format!(
                "{} ({detail}) ({})",
                producer.provider,
                self.shown.display()
            )
        } else if let Some(producer) = &self.file.producer {
            format!("{} probes ({})", producer.provider, self.shown.display())
        } else if self.in_executable && self.file.patched_in_process {
            format!(
                "{} (static, in {}{PATCHED})",
                self.file.kind,
                self.shown.display()
            )
        } else if self.in_executable {
            format!("{} (static, in {})", self.file.kind, self.shown.display())
        } else {
            format!("{} ({})", self.file.kind, self.shown.display())
        }
    }
}

/// What ends the description of an allocator linked into its executable that the
/// in-process front end patched (see [`super::patch`]).
pub const PATCHED: &str = ", patched in-process";

/// The registers of the first three arguments (System V x86-64).
pub const ARGUMENT_REGISTERS: [Register; 3] = [Register::RDI, Register::RSI, Register::RDX];

/// The registers of the arguments the probe of `function` reads.
fn argument_registers(function: AllocFn) -> Vec<Register> {
    function
        .arguments()
        .iter()
        .map(|&n| ARGUMENT_REGISTERS[n])
        .collect()
}

/// Errors finding an allocator.
#[derive(Debug, thiserror::Error)]
pub enum AllocatorError {
    /// No mapped file defines a malloc.
    #[error(
        "no allocator found: neither the executable nor any library it maps defines malloc \
         (a stripped static binary, or no allocator at all)"
    )]
    NoAllocator,
}

/// Analyses an ELF file: its allocation and free entry points, or `None` if it defines no
/// malloc (not an allocator). `full_symbols` also reads the static symbol table (the
/// executable, where a statically linked allocator's symbols are local). Pure.
pub fn analyse(elf: &[u8], full_symbols: bool, file_name: &str) -> Option<AllocatorFile> {
    let sites = usdt::sites(elf);
    if let Some(front_end) = usdt::front_end(&sites) {
        return Some(AllocatorFile {
            kind: AllocatorKind::InProcess,
            functions: Vec::new(),
            frees: Vec::new(),
            front_end: Some(front_end),
            producer: None,
            go: None,
            patched_in_process: false,
        });
    }
    // A file that fires the contract's probes samples its own allocations: probed there,
    // not at its allocation functions (which would count the same blocks again).
    if let Some(producer) = usdt::producer(&sites) {
        return Some(AllocatorFile {
            kind: AllocatorKind::Producer,
            functions: Vec::new(),
            frees: Vec::new(),
            front_end: None,
            producer: Some(producer),
            go: None,
            patched_in_process: false,
        });
    }
    match super::go::runtime(elf) {
        Some(super::go::GoRuntime::Probed {
            version,
            mut producer,
            places,
            profiling_off,
        }) => {
            producer.detail = Some(if profiling_off {
                format!("{version}, {}", super::go::PROFILING_OFF)
            } else {
                version
            });
            return Some(AllocatorFile {
                kind: AllocatorKind::GoRuntime,
                functions: Vec::new(),
                frees: Vec::new(),
                front_end: None,
                producer: Some(producer),
                go: Some(places),
                patched_in_process: false,
            });
        }
        Some(super::go::GoRuntime::Refused(why)) => {
            log::warn!("{file_name}: its Go heap is not recorded: {why}");
        }
        None => {}
    }
    let file = object::File::parse(elf).ok()?;
    let (entries, names) = entry_symbols(&file, full_symbols);
    let mut entries = allocator_entries(entries)?;
    drop_forwarders(&file, &mut entries);
    let (functions, frees) = probed_functions(&file, entries);
    Some(AllocatorFile {
        kind: AllocatorKind::of(&names, file_name),
        functions,
        frees,
        front_end: None,
        producer: None,
        go: None,
        patched_in_process: false,
    })
}

/// `entries` if they are an allocator's (a malloc, or CPython's object allocator), those
/// probed kept; `None` if they are not.
fn allocator_entries(mut entries: Vec<EntrySymbol>) -> Option<Vec<EntrySymbol>> {
    let defines_malloc = entries.iter().any(|e| match e.role {
        Role::Alloc(function) => {
            function == AllocFn::Malloc
                || e.name.ends_with("mallocx")
                // Linked in and garbage-collected by the linker, mimalloc may keep only
                // the aligned entry points a Rust program calls.
                || e.name.starts_with("mi_malloc_aligned")
        }
        Role::Free => false,
    });
    let defines_pymalloc = entries.iter().any(|e| e.name == "PyObject_Malloc");
    if !defines_malloc && !defines_pymalloc {
        return None;
    }
    // mimalloc's aligned entry points are probed only where it does not define the C
    // names too: libmimalloc's `aligned_alloc` reaches `mi_malloc_aligned` by a tail call,
    // and each of its calls counted twice.
    if entries.iter().any(|e| e.name == "malloc") {
        entries.retain(|e| {
            let base = e.name.strip_prefix("mi_");
            base.and_then(mimalloc_aligned).is_none()
        });
    }
    Some(entries)
}

/// The allocation and free entry points `file` defines (its dynamic symbols, and with
/// `full_symbols` its static ones), and every defined text symbol's name.
fn entry_symbols(file: &object::File, full_symbols: bool) -> (Vec<EntrySymbol>, Vec<String>) {
    let mut entries: Vec<EntrySymbol> = Vec::new();
    let statics = full_symbols.then(|| file.symbols()).into_iter().flatten();
    let mut names: Vec<String> = Vec::new();
    for symbol in file.dynamic_symbols().chain(statics) {
        if !symbol.is_definition() || symbol.kind() != object::SymbolKind::Text {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        let name = name.split('@').next().unwrap_or(name).to_owned();
        if let Some(role) = classify(&name) {
            entries.push(EntrySymbol {
                role,
                name: name.clone(),
                address: symbol.address(),
                size: symbol.size(),
                global: symbol.is_global(),
            });
        }
        names.push(name);
    }
    (entries, names)
}

/// A function that only jumps to another probed one (jemalloc's `new[]` to `new`,
/// mimalloc's `valloc` to `mi_valloc` through the PLT) is left to that one: probing both
/// would count each call twice.
fn drop_forwarders(file: &object::File, entries: &mut Vec<EntrySymbol>) {
    let candidates: HashSet<u64> = entries.iter().map(|e| e.address).collect();
    let candidate_names: HashSet<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    let got = got_symbols(file);
    let forwards = |address: u64, size: u64| {
        let code = super::elf::code_at(file, address, size).unwrap_or_default();
        match jump_target(code, address) {
            Some(target) if candidates.contains(&target) && target != address => true,
            Some(target) => plt_import(file, target, &got)
                .is_some_and(|name| candidate_names.contains(name.as_str())),
            None => false,
        }
    };
    let forwarders: HashSet<u64> = entries
        .iter()
        .filter(|e| forwards(e.address, e.size))
        .map(|e| e.address)
        .collect();
    entries.retain(|e| !forwarders.contains(&e.address));
}

/// One probe per address, its placement chosen: of aliases (tcmalloc's malloc and
/// tc_malloc, glibc's memalign and aligned_alloc) the first in AllocFn order, then the
/// shortest name, whose arguments are laid out alike; of free's aliases, the shortest name.
fn probed_functions(
    file: &object::File,
    mut entries: Vec<EntrySymbol>,
) -> (Vec<Function>, Vec<FreeFunction>) {
    entries.sort_by(|a, b| a.order().cmp(&b.order()));
    // Global if any of its aliases is (glibc's `malloc` beside its local `__libc_malloc`).
    let global: HashSet<u64> = entries
        .iter()
        .filter(|e| e.global)
        .map(|e| e.address)
        .collect();
    let mut probed: HashSet<(bool, u64)> = HashSet::new();
    let mut functions: Vec<Function> = Vec::new();
    let mut frees: Vec<FreeFunction> = Vec::new();
    for entry in entries {
        if !probed.insert((entry.role == Role::Free, entry.address)) {
            continue;
        }
        let code = super::elf::code_at(file, entry.address, entry.size).unwrap_or_default();
        let file_offset = super::elf::file_offset_of(file, entry.address).unwrap_or(0);
        match entry.role {
            Role::Alloc(function) => functions.push(Function {
                function,
                address: entry.address,
                size: entry.size,
                file_offset,
                probe: prologue::choose(code, &argument_registers(function)),
                small_objects: is_small_objects(&entry.name),
                global: global.contains(&entry.address),
                symbol: entry.name,
            }),
            Role::Free => frees.push(FreeFunction {
                symbol: entry.name,
                address: entry.address,
                size: entry.size,
                global: global.contains(&entry.address),
                file_offset,
                // The free program reads its pointer in place (it has no cookie to look up).
                probe: prologue::choose_in_place(code, &[Register::RDI]),
            }),
        }
    }
    (functions, frees)
}

/// A defined text symbol that is an allocation or free entry point.
struct EntrySymbol {
    role: Role,
    name: String,
    address: u64,
    size: u64,
    global: bool,
}

impl EntrySymbol {
    /// Which of several symbols at one address is probed: allocations before frees, then by
    /// AllocFn order, then the shortest name (then the name itself, for a stable order).
    fn order(&self) -> (u32, usize, &str) {
        let rank = match self.role {
            Role::Alloc(function) => function as u32,
            Role::Free => u32::MAX,
        };
        (rank, self.name.len(), &self.name)
    }
}

/// Where a function goes if its first instruction (after `endbr64`) is an unconditional
/// direct jump: the whole function is a forwarder. Pure.
pub fn jump_target(code: &[u8], address: u64) -> Option<u64> {
    let mut decoder = iced_x86::Decoder::with_ip(64, code, address, iced_x86::DecoderOptions::NONE);
    let mut instruction = decoder.decode();
    if instruction.code() == iced_x86::Code::Endbr64 {
        instruction = decoder.decode();
    }
    (instruction.flow_control() == iced_x86::FlowControl::UnconditionalBranch
        && instruction.op0_kind() == iced_x86::OpKind::NearBranch64)
        .then(|| instruction.near_branch_target())
}

/// GOT slot address → the imported symbol it is resolved to (jump-slot relocations).
fn got_symbols(file: &object::File) -> HashMap<u64, String> {
    let Some(symbols) = file.dynamic_symbol_table() else {
        return HashMap::new();
    };
    file.dynamic_relocations()
        .into_iter()
        .flatten()
        .filter_map(|(slot, relocation)| match relocation.target() {
            object::RelocationTarget::Symbol(index) => {
                let name = symbols.symbol_by_index(index).ok()?.name().ok()?;
                Some((slot, name.split('@').next().unwrap_or(name).to_owned()))
            }
            _ => None,
        })
        .collect()
}

/// The symbol a PLT stub at `address` jumps to (`jmp *GOT(%rip)`, after `endbr64`), if
/// `address` is one.
fn plt_import<'a>(
    file: &object::File,
    address: u64,
    got: &'a HashMap<u64, String>,
) -> Option<&'a String> {
    let section = file
        .sections()
        .find(|s| (s.address()..s.address() + s.size()).contains(&address))?;
    if !section.name().is_ok_and(|n| n.starts_with(".plt")) {
        return None;
    }
    let code = section.data_range(address, 16).ok()??;
    let mut decoder = iced_x86::Decoder::with_ip(64, code, address, iced_x86::DecoderOptions::NONE);
    let mut instruction = decoder.decode();
    if instruction.code() == iced_x86::Code::Endbr64 {
        instruction = decoder.decode();
    }
    if instruction.flow_control() != iced_x86::FlowControl::IndirectBranch
        || !instruction.is_ip_rel_memory_operand()
    {
        return None;
    }
    got.get(&instruction.ip_rel_memory_address())
}

/// Whether `description` (an [`Allocator::describe`] line, as profiles list a process's
/// allocators) is of allocscope's in-process front end.
pub fn describes_in_process(description: &str) -> bool {
    description.starts_with(&AllocatorKind::InProcess.to_string())
}

/// Which allocator a file is, as far as probing cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocatorKind {
    /// The GNU C library's: the innermost malloc, which others may wrap.
    Glibc,
    /// jemalloc (prefixed or not).
    Jemalloc,
    /// gperftools' tcmalloc.
    Tcmalloc,
    /// Microsoft's mimalloc.
    Mimalloc,
    /// CPython's object allocator (a small-object layer over malloc).
    Pymalloc,
    /// Another that defines malloc (a program's own).
    Malloc,
    /// allocscope's in-process front end (sampler-preload): it counts and samples the
    /// malloc family itself and fires USDT probes for sampled blocks.
    InProcess,
    /// Another program's allocator that samples itself and fires the OpenTelemetry
    /// memory-profiling contract's probes (`otel_memory`) or libdatadog's (`ddheap`).
    Producer,
    /// A Go executable: its runtime samples its heap itself ([`super::go`]).
    GoRuntime,
}

impl AllocatorKind {
    /// Names the allocator from the symbols it defines (or its file name).
    fn of(names: &[String], file_name: &str) -> AllocatorKind {
        let has = |wanted: &str| names.iter().any(|n| n == wanted);
        let has_prefix = |prefix: &str| names.iter().any(|n| n.starts_with(prefix));
        if has("mallocx") || has_prefix("je_") || has_prefix("_rjem_") {
            AllocatorKind::Jemalloc
        } else if has("tc_malloc") {
            AllocatorKind::Tcmalloc
        } else if has("mi_malloc") || has("mi_malloc_aligned") {
            AllocatorKind::Mimalloc
        } else if is_libc(file_name) || has("__libc_malloc") {
            AllocatorKind::Glibc
        } else if has("PyObject_Malloc") && !has("malloc") {
            AllocatorKind::Pymalloc
        } else {
            AllocatorKind::Malloc
        }
    }
}

impl std::fmt::Display for AllocatorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AllocatorKind::Glibc => "glibc",
            AllocatorKind::Jemalloc => "jemalloc",
            AllocatorKind::Tcmalloc => "tcmalloc",
            AllocatorKind::Mimalloc => "mimalloc",
            AllocatorKind::Pymalloc => "pymalloc",
            AllocatorKind::Malloc => "malloc",
            AllocatorKind::InProcess => "in-process (allocscope preload)",
            AllocatorKind::Producer => "in-process (its own USDT probes)",
            AllocatorKind::GoRuntime => super::go::PROVIDER,
        })
    }
}

/// Puts allocators in probing order: one in the executable or interposed first (it takes
/// the calls), the C library last.
pub fn in_probing_order(allocators: &mut [Allocator]) {
    allocators.sort_by_key(|a| (!a.in_executable, a.file.kind == AllocatorKind::Glibc));
}

/// Finds every allocator among `pid`'s executable mappings; `analysed` is asked for the
/// analysis of each distinct file (a cache by file identity), given the path to read and
/// whether it is the executable; `dormant` whether an in-process front end found there
/// counts nothing in this process (allocscope's library under a seccomp filter, or beside
/// another producer, the second argument: then it is left out and the allocators behind
/// it are kept, for uprobes or that producer's probes).
pub fn find(
    pid: u32,
    vmas: &[Vma],
    executable: Option<&Path>,
    mut analysed: impl FnMut(&Vma, &Path, bool) -> Option<Arc<AllocatorFile>>,
    dormant: impl Fn(&Allocator, bool) -> bool,
) -> Result<Vec<Allocator>, AllocatorError> {
    let mut found: Vec<Allocator> = Vec::new();
    let mut seen: Vec<&FileId> = Vec::new();
    for vma in vmas.iter().filter(|v| v.executable) {
        let Some(shown) = vma.path.as_deref() else {
            continue;
        };
        if seen.contains(&&vma.file_id) {
            continue;
        }
        seen.push(&vma.file_id);
        let in_executable = executable == Some(shown);
        let path = vma.file_in(pid);
        if let Some(file) = analysed(vma, &path, in_executable) {
            found.push(Allocator {
                path,
                shown: shown.to_owned(),
                file_id: vma.file_id.clone(),
                in_executable,
                file,
            });
        }
    }
    let producer = found.iter().any(|a| a.file.is_producer());
    found.retain(|a| !(a.file.kind == AllocatorKind::InProcess && dormant(a, producer)));
    if found.is_empty() {
        return Err(AllocatorError::NoAllocator);
    }
    behind_front_end(&mut found, false);
    in_probing_order(&mut found);
    Ok(found)
}

/// In a process that carries an in-process front end (`known`, or one among
/// `allocators`), drops the allocators whose calls it counts itself (see
/// [`Allocator::served_by_front_end`]). `known` covers a program that has just exec'd,
/// whose libraries the dynamic loader has not mapped yet.
pub fn behind_front_end(allocators: &mut Vec<Allocator>, known: bool) {
    if known || allocators.iter().any(|a| a.file.reports_itself()) {
        allocators.retain(|a| !a.served_by_front_end());
    }
}

/// Reads and analyses one file (mapped, not copied: libraries can be large).
pub fn analyse_file(path: &Path, full_symbols: bool, shown: &Path) -> Option<AllocatorFile> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: the mapping is read-only and private; a library being replaced on disk is a
    // new inode (the package manager renames), so the bytes read do not change under us.
    let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let name = shown
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    analyse(&data, full_symbols, name)
}

/// The functions of the file at `path` that look like an allocator's and are not probed
/// ([`super::entry_names::looks_like_an_allocator`]), at most `most`, by name.
pub fn allocator_like_functions(path: &Path, most: usize) -> Vec<String> {
    let Some(data) = std::fs::File::open(path)
        .ok()
        // SAFETY: as in [`analyse_file`].
        .and_then(|file| unsafe { memmap2::Mmap::map(&file) }.ok())
    else {
        return Vec::new();
    };
    let Ok(file) = object::File::parse(&*data) else {
        return Vec::new();
    };
    let (_, names) = entry_symbols(&file, true);
    let mut found: Vec<String> = names
        .into_iter()
        .filter(|name| super::entry_names::looks_like_an_allocator(name))
        .collect();
    found.sort_unstable();
    found.dedup();
    found.truncate(most);
    found
}

fn is_libc(name: &str) -> bool {
    name.starts_with("libc.so") || name.starts_with("libc-2.")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(kind: AllocatorKind, in_executable: bool) -> Allocator {
        Allocator {
            path: crate::sys::process::in_root(1, "/x".as_ref()),
            shown: PathBuf::from("/x"),
            file_id: FileId {
                device: "fe:01".into(),
                inode: kind as u64,
            },
            in_executable,
            file: Arc::new(AllocatorFile {
                kind,
                functions: Vec::new(),
                frees: Vec::new(),
                producer: None,
                go: None,
                patched_in_process: false,
                front_end: (kind == AllocatorKind::InProcess).then(|| usdt::FrontEnd {
                    allocs: Vec::new(),
                    frees: Vec::new(),
                    ready: Vec::new(),
                }),
            }),
        }
    }

    fn families(allocators: &[Allocator]) -> Vec<(AllocatorKind, bool)> {
        allocators
            .iter()
            .map(|a| (a.file.kind, a.in_executable))
            .collect()
    }

    #[test]
    fn the_front_end_serves_the_malloc_family_and_pymalloc_but_not_an_executables_malloc() {
        let all = vec![
            found(AllocatorKind::InProcess, false),
            found(AllocatorKind::Glibc, false),
            found(AllocatorKind::Jemalloc, false),
            found(AllocatorKind::Malloc, true),
            found(AllocatorKind::Pymalloc, true),
        ];
        let mut kept = all.clone();
        behind_front_end(&mut kept, false);
        assert_eq!(
            families(&kept),
            [
                (AllocatorKind::InProcess, false),
                (AllocatorKind::Malloc, true)
            ]
        );
        // Right after an exec the library is not mapped yet: known from the region.
        let mut exec_time = vec![
            found(AllocatorKind::Pymalloc, true),
            found(AllocatorKind::Glibc, false),
        ];
        behind_front_end(&mut exec_time, true);
        assert!(exec_time.is_empty(), "{:?}", families(&exec_time));
        // Without a front end nothing is dropped.
        let mut plain = all[1..].to_vec();
        behind_front_end(&mut plain, false);
        assert_eq!(plain.len(), 4);
    }

    #[test]
    fn recognizes_libc_names() {
        assert!(is_libc("libc.so.6"));
        assert!(is_libc("libc-2.31.so"));
        assert!(!is_libc("libcap.so.2"));
        assert!(!is_libc("libcrypt.so.1"));
    }

    #[test]
    fn recognizes_forwarders() {
        // endbr64; jmp rel32 (to 0x1000 + 9 + 0x10)
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0xe9, 0x10, 0, 0, 0];
        assert_eq!(jump_target(&code, 0x1000), Some(0x1019));
        // jmp rel8
        assert_eq!(jump_target(&[0xeb, 0x05], 0x2000), Some(0x2007));
        // push rbp; ... is a function of its own
        assert_eq!(jump_target(&[0x55, 0x48, 0x89, 0xe5], 0x3000), None);
        // a conditional jump is not a forwarder
        assert_eq!(jump_target(&[0x74, 0x05], 0x3000), None);
    }

    #[test]
    fn no_allocator_is_a_clear_error() {
        let err = find(1, &[], None, |_, _, _| None, |_, _| false).unwrap_err();
        assert!(err.to_string().contains("no allocator found"), "{err}");
    }

    #[test]
    fn garbage_is_not_an_allocator() {
        assert!(analyse(b"not an elf", true, "x").is_none());
    }

    /// The machine's own C library: every glibc entry point, memalign/aligned_alloc once.
    #[test]
    fn cpythons_object_allocator_is_a_small_object_layer() {
        // Debian's python3 exports pymalloc's entry points from the executable.
        let python = Path::new("/usr/bin/python3.11");
        if !python.exists() {
            assert!(
                std::env::var("CI").is_err(),
                "no /usr/bin/python3.11: cargo xtask setup installs python3-minimal"
            );
            eprintln!("*** SKIPPING: no /usr/bin/python3.11 (cargo xtask setup installs it) ***");
            return;
        }
        let file = analyse_file(python, true, python).expect("pymalloc found");
        assert_eq!(file.kind, AllocatorKind::Pymalloc);
        let mut found: Vec<(&str, AllocFn, bool)> = file
            .functions
            .iter()
            .map(|f| (f.symbol.as_str(), f.function, f.small_objects))
            .collect();
        found.sort_by_key(|f| f.0);
        assert_eq!(
            found,
            [
                ("PyObject_Calloc", AllocFn::Calloc, true),
                ("PyObject_Malloc", AllocFn::New, true),
                ("PyObject_Realloc", AllocFn::Realloc, true),
            ]
        );
        assert!(file.frees.iter().any(|f| f.symbol == "PyObject_Free"));
        let cookie = file.functions[0].cookie(7, false, false);
        assert!(sampler_common::cookie::is_small_objects(cookie));
        assert_eq!(sampler_common::cookie::slot(cookie), 7);
    }

    #[test]
    fn analyses_this_machines_libc() {
        let own = crate::sys::maps::read(std::process::id()).unwrap();
        let libc = own
            .iter()
            .find(|v| {
                v.path
                    .as_ref()
                    .is_some_and(|p| p.to_string_lossy().contains("libc.so"))
            })
            .expect("tests link glibc");
        let path = libc.path.clone().unwrap();
        let file = analyse_file(&path, false, &path).expect("libc is an allocator");
        assert_eq!(file.kind, AllocatorKind::Glibc);
        let names: Vec<&str> = file.functions.iter().map(|f| f.symbol.as_str()).collect();
        for wanted in [
            "malloc",
            "calloc",
            "realloc",
            "posix_memalign",
            "valloc",
            "pvalloc",
        ] {
            assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
        }
        assert!(file.frees.iter().any(|f| f.symbol == "free"));
        let mut addresses: Vec<u64> = file.functions.iter().map(|f| f.address).collect();
        addresses.sort_unstable();
        addresses.dedup();
        assert_eq!(
            addresses.len(),
            file.functions.len(),
            "one probe per address"
        );
    }
}
