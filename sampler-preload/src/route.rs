//! Routing a running program's allocator calls to this library, when allocscope loaded it
//! into the process (`record -p`, `top -p`: `dlopen` called from outside by its injector)
//! rather than the loader preloading it.
//!
//! Why: a library opened into a running process interposes nothing (its symbols come after
//! everything the program bound long ago). The program reaches `malloc` and the rest
//! through its objects' global offset tables (`R_X86_64_JUMP_SLOT`, `R_X86_64_GLOB_DAT`)
//! and through pointers the loader wrote into data (`R_X86_64_64`, e.g. a table of
//! allocator functions): each such slot that holds the process's definition (the one the
//! global scope resolves: jemalloc's in a redis-server, the C library's in most programs)
//! is rewritten to hold ours, which count, sample and forward to that same definition.
//! The C library's own internal calls (`strdup`, `fopen`…) go through its table too. A slot
//! bound to something else (an object with its own allocator) is left alone and counted.
//!
//! Objects opened later are routed on the next sampled call (cold path, at most once per
//! [`RECHECK_NS`]): wrapping `dlopen` would change the caller glibc resolves `$ORIGIN`
//! and `RUNPATH` from, which can make a program's own `dlopen` fail.
//!
//! Nothing is written but slots that hold a definition of ours-to-be; a slot in the
//! object's RELRO range is made writable for the store and read-only again after. An
//! aligned 8-byte store is atomic: a thread calling through a slot meanwhile reaches either
//! the definition (uncounted, before the switch) or us.

use core::{
    ffi::{c_int, c_void, CStr},
    sync::atomic::{AtomicU64, Ordering},
};

use crate::objects::{headers, object_span, PT_LOAD};

/// How often, at most, a sampled call looks for objects opened since the last routing.
const RECHECK_NS: u64 = 10_000_000;

/// The loader's count of objects added when this process was last routed.
static ADDS_SEEN: AtomicU64 = AtomicU64::new(0);
/// When a sampled call last looked for new objects.
static CHECKED_NS: AtomicU64 = AtomicU64::new(0);

const PT_DYNAMIC: u32 = 2;
const PT_GNU_RELRO: u32 = 0x6474_e552;
const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;
const R_X86_64_64: u32 = 1;
const R_X86_64_GLOB_DAT: u32 = 6;
const R_X86_64_JUMP_SLOT: u32 = 7;

#[repr(C)]
struct Dyn {
    tag: i64,
    value: u64,
}

#[repr(C)]
struct Rela {
    offset: u64,
    info: u64,
    addend: i64,
}

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    section: u16,
    value: u64,
    size: u64,
}

/// One routed function: its name, our definition, the process's.
#[derive(Clone, Copy)]
pub struct Route {
    pub name: &'static CStr,
    pub ours: usize,
    /// The process's definition as its global scope gives it: in an executable that is not
    /// position-independent and takes the function's address, its own PLT entry (the
    /// "canonical" address every other object was bound to).
    pub theirs: usize,
    /// The function itself (where that PLT entry leads; `theirs` otherwise): what ours
    /// forward to.
    pub real: usize,
}

/// What to do with a slot of a routed function holding `value`.
#[derive(Debug, PartialEq, Eq)]
pub enum Slot {
    /// Holds the process's definition (or, bound lazily, still its own PLT stub): ours now.
    Route,
    /// Holds ours already (routed before).
    Routed,
    /// Holds another definition: left as it is.
    Left,
}

/// The decision for a slot holding `value`, in an object spanning `object` (start, end).
pub fn decide(value: usize, route: &Route, object: (usize, usize)) -> Slot {
    if value == route.ours {
        Slot::Routed
    } else if value == route.theirs || value == route.real || (object.0..object.1).contains(&value)
    {
        Slot::Route
    } else {
        Slot::Left
    }
}

/// How many functions are routed: the malloc family and the two the library wraps, then
/// C++'s operators.
const ROUTES: usize = 12 + crate::cxx::FORMS;

/// Every routed function's [`Route`]: one type, which the `dl_iterate_phdr` callbacks
/// cast their data pointer back to.
type Routes = [Route; ROUTES];

/// The routed functions, ours and the process's definitions. C++'s operators only where
/// the allocator defines them (see [`crate::cxx`]); elsewhere they call `malloc` and
/// `free`, routed already, and have no definition here (`theirs` 0: left alone).
fn routes() -> Routes {
    let family = [
        c"malloc",
        c"free",
        c"calloc",
        c"realloc",
        c"memalign",
        c"posix_memalign",
        c"aligned_alloc",
        c"valloc",
        c"pvalloc",
        c"reallocarray",
        c"prctl",
        c"syscall",
    ];
    let mut names = [c"malloc"; ROUTES];
    names[..family.len()].copy_from_slice(&family);
    names[family.len()..].copy_from_slice(&crate::cxx::NAMES);
    let operators = crate::cxx::counted_here();
    let own = own_handle();
    names.map(|name| {
        let operator = crate::cxx::NAMES.contains(&name);
        let theirs = if operator && !operators {
            0
        } else {
            crate::next::lookup(name)
        };
        Route {
            name,
            ours: if own.is_null() {
                0
            } else {
                // SAFETY: dlsym on this library's handle with a NUL-terminated name.
                unsafe { libc::dlsym(own, name.as_ptr()) as usize }
            },
            theirs,
            real: forwarder(name).map_or(theirs, |f| f.load(Ordering::Relaxed)),
        }
    })
}

/// Where ours keep the function they forward `name` to (none: `reallocarray`, which calls
/// our `realloc`).
fn forwarder(name: &CStr) -> Option<&'static core::sync::atomic::AtomicUsize> {
    let n = &crate::next::NEXT;
    Some(match name.to_bytes() {
        b"malloc" => &n.malloc,
        b"free" => &n.free,
        b"calloc" => &n.calloc,
        b"realloc" => &n.realloc,
        b"memalign" => &n.memalign,
        b"posix_memalign" => &n.posix_memalign,
        b"aligned_alloc" => &n.aligned_alloc,
        b"valloc" => &n.valloc,
        b"pvalloc" => &n.pvalloc,
        b"prctl" => &crate::sandbox::NEXT_PRCTL,
        b"syscall" => &crate::sandbox::NEXT_SYSCALL,
        _ => {
            let form = crate::cxx::NAMES.iter().position(|n| *n == name)?;
            &crate::cxx::NEXT[form]
        }
    })
}

/// Where a definition that is the executable's own PLT entry leads: ours must forward
/// there (forwarding to the entry would come back to us once the executable's slot is
/// routed). Read from the executable's slot for the function, before it is routed.
unsafe extern "C" fn find_real(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: valid during the call (see `route_all`).
    let (info, routes) = unsafe { (&*info, &mut *data.cast::<Routes>()) };
    let span = object_span(info);
    // SAFETY: the loader's description of a loaded object.
    let Some(t) = (unsafe { tables(info) }) else {
        return 1;
    };
    for rela in relocations(&t) {
        let kind = (rela.info & 0xffff_ffff) as u32;
        if kind != R_X86_64_JUMP_SLOT && kind != R_X86_64_GLOB_DAT {
            continue;
        }
        // SAFETY: a relocation of this object's table.
        let name = unsafe { symbol_name(&t, rela) };
        let base = info.dlpi_addr as usize;
        for route in routes.iter_mut() {
            let canonical = (span.0..span.1).contains(&route.theirs);
            if route.name != name || !canonical || route.real != route.theirs {
                continue;
            }
            let slot = base.wrapping_add(rela.offset as usize) as *const usize;
            // SAFETY: the slot the loader wrote for this relocation.
            let value = unsafe { core::ptr::read_volatile(slot) };
            if value != route.ours && !(span.0..span.1).contains(&value) {
                route.real = value;
                if let Some(f) = forwarder(route.name) {
                    f.store(value, Ordering::Release);
                }
            }
        }
    }
    // The executable is the first object: the others are not looked at.
    1
}

/// This library's own handle: its lookups find its own definitions (taking their address
/// in its code would read its own table, which holds the process's).
fn own_handle() -> *mut c_void {
    // SAFETY: all-zero is a valid Dl_info.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    let address = crate::next::own_address();
    // SAFETY: dladdr fills the struct we own; RTLD_NOLOAD only finds a loaded object.
    unsafe {
        if libc::dladdr(address, &mut info) == 0 || info.dli_fname.is_null() {
            return core::ptr::null_mut();
        }
        libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD)
    }
}

/// Routes every object loaded now (but this library and the dynamic loader).
pub fn route_all() {
    let mut routes = routes();
    if routes.iter().any(|r| r.ours == 0 || r.ours == r.theirs) {
        return;
    }
    // SAFETY: the callbacks get the loader's own descriptions, valid during the call.
    unsafe {
        libc::dl_iterate_phdr(Some(find_real), (&raw mut routes).cast());
        libc::dl_iterate_phdr(Some(each_object), (&raw const routes).cast_mut().cast());
    }
}

/// From a sampled call: routes objects opened since the last routing (not more often than
/// every [`RECHECK_NS`]).
pub fn recheck() {
    let now = crate::monotonic_ns();
    let last = CHECKED_NS.load(Ordering::Relaxed);
    if now.wrapping_sub(last) < RECHECK_NS
        || CHECKED_NS
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let mut adds = 0u64;
    // SAFETY: the callback reads one field of the first description and stops.
    unsafe { libc::dl_iterate_phdr(Some(count_adds), (&raw mut adds).cast()) };
    if adds != ADDS_SEEN.load(Ordering::Relaxed) {
        route_all();
    }
}

unsafe extern "C" fn count_adds(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: the loader's description and our counter, valid during the call.
    unsafe { *data.cast::<u64>() = (*info).dlpi_adds };
    1
}

unsafe extern "C" fn each_object(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: valid during the call (see `route_all`).
    let (info, routes) = unsafe { (&*info, &*data.cast::<Routes>()) };
    ADDS_SEEN.store(info.dlpi_adds, Ordering::Relaxed);
    if is_excluded(info) {
        return 0;
    }
    // SAFETY: the loader's program headers of a loaded object.
    unsafe { route_object(info, routes) };
    0
}

/// The dynamic loader (whose few allocations go through pointers of its own). This library
/// is routed too: its own calls between its functions go through its table, as when
/// preloaded.
fn is_excluded(info: &libc::dl_phdr_info) -> bool {
    if info.dlpi_name.is_null() {
        return false;
    }
    // SAFETY: a NUL-terminated name owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
    let file = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
    file.starts_with(b"ld-linux") || file.starts_with(b"ld64.so")
}

/// Whether `address` lies in one of the object's writable loaded segments.
fn in_writable_segment(info: &libc::dl_phdr_info, address: usize) -> bool {
    const PF_W: u32 = 2;
    let base = info.dlpi_addr as usize;
    headers(info).iter().any(|h| {
        let start = base.wrapping_add(h.p_vaddr as usize);
        h.p_type == PT_LOAD
            && h.p_flags & PF_W != 0
            && (start..start + h.p_memsz as usize).contains(&address)
    })
}

/// The object's dynamic tables it routes through.
struct Tables {
    symbols: usize,
    strings: usize,
    relocations: [(usize, usize); 2],
}

/// # Safety
/// `info` describes a loaded object.
unsafe fn tables(info: &libc::dl_phdr_info) -> Option<Tables> {
    let base = info.dlpi_addr as usize;
    let dynamic = headers(info).iter().find(|h| h.p_type == PT_DYNAMIC)?;
    let mut entry = base.wrapping_add(dynamic.p_vaddr as usize) as *const Dyn;
    // The loader relocates these addresses in place where the section is writable; an
    // address below the base is still an offset.
    let at = |value: u64| {
        let value = value as usize;
        if value < base {
            value + base
        } else {
            value
        }
    };
    let mut t = Tables {
        symbols: 0,
        strings: 0,
        relocations: [(0, 0); 2],
    };
    loop {
        // SAFETY: the dynamic section ends with DT_NULL.
        let d = unsafe { &*entry };
        match d.tag {
            DT_NULL => break,
            DT_SYMTAB => t.symbols = at(d.value),
            DT_STRTAB => t.strings = at(d.value),
            DT_RELA => t.relocations[0].0 = at(d.value),
            DT_RELASZ => t.relocations[0].1 = d.value as usize,
            DT_JMPREL => t.relocations[1].0 = at(d.value),
            DT_PLTRELSZ => t.relocations[1].1 = d.value as usize,
            _ => {}
        }
        // SAFETY: within the section, before DT_NULL.
        entry = unsafe { entry.add(1) };
    }
    (t.symbols != 0 && t.strings != 0).then_some(t)
}

/// The object's relocations that name a symbol (both tables).
fn relocations(t: &Tables) -> impl Iterator<Item = &'static Rela> + '_ {
    t.relocations
        .iter()
        .filter(|(start, _)| *start != 0)
        .flat_map(|&(start, bytes)| {
            let count = bytes / core::mem::size_of::<Rela>();
            // SAFETY: the object's relocation table, `count` entries, mapped while it is
            // loaded (the loader's lock is held by `dl_iterate_phdr` meanwhile).
            unsafe { core::slice::from_raw_parts(start as *const Rela, count) }.iter()
        })
        .filter(|rela| rela.info >> 32 != 0)
}

/// The name of the symbol `rela` names.
///
/// # Safety
/// `rela` is a relocation of the object `t` describes.
unsafe fn symbol_name(t: &Tables, rela: &Rela) -> &'static CStr {
    // SAFETY: the caller's promise: its symbol entry and that entry's name.
    unsafe {
        let sym = &*(t.symbols as *const Sym).add((rela.info >> 32) as usize);
        CStr::from_ptr((t.strings + sym.name as usize) as *const core::ffi::c_char)
    }
}

/// # Safety
/// `info` describes a loaded object.
unsafe fn route_object(info: &libc::dl_phdr_info, routes: &Routes) {
    // SAFETY: the caller's promise.
    let Some(t) = (unsafe { tables(info) }) else {
        return;
    };
    let base = info.dlpi_addr as usize;
    let span = object_span(info);
    let relro = headers(info)
        .iter()
        .find(|h| h.p_type == PT_GNU_RELRO)
        .map(|h| {
            // The loader made read-only only the whole pages of the range (its last page,
            // when partial, is the writable data after it): those alone are reopened and
            // closed again.
            let start = base.wrapping_add(h.p_vaddr as usize);
            (start & !4095, (start + h.p_memsz as usize) & !4095)
        });
    {
        for rela in relocations(&t) {
            let kind = (rela.info & 0xffff_ffff) as u32;
            let data = kind == R_X86_64_64 && rela.addend == 0;
            if !(kind == R_X86_64_JUMP_SLOT || kind == R_X86_64_GLOB_DAT || data) {
                continue;
            }
            // SAFETY: a relocation of this object's table.
            let name = unsafe { symbol_name(&t, rela) };
            let Some(route) = routes.iter().find(|r| r.name == name && r.theirs != 0) else {
                continue;
            };
            let slot = base.wrapping_add(rela.offset as usize) as *mut usize;
            // SAFETY: the slot the loader wrote for this relocation, in a loaded segment.
            let value = unsafe { core::ptr::read_volatile(slot) };
            // Only a jump slot can still hold its object's PLT stub (bound lazily); any
            // other slot holding an address in the object holds the object's own function.
            let lazy_span = if kind == R_X86_64_JUMP_SLOT {
                span
            } else {
                (0, 0)
            };
            match decide(value, route, lazy_span) {
                Slot::Routed => {}
                Slot::Left => {
                    crate::region::LEFT.fetch_add(1, Ordering::Relaxed);
                }
                Slot::Route => {
                    let at = slot as usize;
                    let protected = relro.is_some_and(|(s, e)| (s..e).contains(&at));
                    // Only in a writable segment (RELRO lies in one): a slot in code (a
                    // text relocation) is left alone, never written.
                    if !in_writable_segment(info, at) || slot.align_offset(8) != 0 {
                        crate::region::LEFT.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    // SAFETY: an aligned slot of a writable segment of the object, made
                    // writable again if RELRO closed its page.
                    if unsafe { store(slot, route.ours, protected) } {
                        crate::region::ROUTED.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

/// Writes `value` into `slot`, opening its page for the store when it is `protected`
/// (RELRO: read-only again after). False when the page could not be opened.
///
/// # Safety
/// `slot` is an aligned pointer-sized slot of a loaded object.
unsafe fn store(slot: *mut usize, value: usize, protected: bool) -> bool {
    let page = (slot as usize) & !4095;
    if protected {
        // SAFETY: a page of the object's RELRO segment, mapped.
        let opened = unsafe {
            libc::mprotect(
                page as *mut c_void,
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if opened != 0 {
            return false;
        }
    }
    // SAFETY: the caller's promise; atomic for an aligned word on x86-64.
    unsafe { (*(slot as *const core::sync::atomic::AtomicUsize)).store(value, Ordering::Release) };
    if protected {
        // SAFETY: as above; back to what RELRO made it.
        unsafe { libc::mprotect(page as *mut c_void, 4096, libc::PROT_READ) };
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> Route {
        Route {
            name: c"malloc",
            ours: 0x7000,
            theirs: 0x5000,
            real: 0x6000,
        }
    }

    #[test]
    fn a_slot_holding_the_definition_is_routed_and_others_left() {
        let object = (0x1000, 0x2000);
        assert_eq!(decide(0x5000, &route(), object), Slot::Route);
        // The function a canonical PLT entry leads to.
        assert_eq!(decide(0x6000, &route(), object), Slot::Route);
        assert_eq!(decide(0x7000, &route(), object), Slot::Routed);
        assert_eq!(decide(0x9000, &route(), object), Slot::Left);
        // Still bound lazily: the object's own PLT stub.
        assert_eq!(decide(0x1800, &route(), object), Slot::Route);
        // Any other kind of slot is never taken for a stub.
        assert_eq!(decide(0x1800, &route(), (0, 0)), Slot::Left);
    }
}
