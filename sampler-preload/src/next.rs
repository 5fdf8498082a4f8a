//! The allocator behind this library: the next definition of each function after ours in
//! the dynamic linker's search order (`dlsym(RTLD_NEXT)`), so a jemalloc, tcmalloc or
//! mimalloc preloaded after us or linked into the program still serves the memory.
//!
//! Resolving is itself a chicken-and-egg problem: `dlsym` may call `calloc` (for its error
//! buffer) before it has told us where `calloc` is. Calls made while this thread resolves
//! are served from a small static [`arena`] that is never freed; its blocks are
//! recognised by address in `free` and `realloc`.

use core::{
    ffi::{c_int, c_void},
    sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering},
};

pub type Malloc = unsafe extern "C" fn(usize) -> *mut c_void;
pub type Free = unsafe extern "C" fn(*mut c_void);
pub type Calloc = unsafe extern "C" fn(usize, usize) -> *mut c_void;
pub type Realloc = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
pub type Aligned = unsafe extern "C" fn(usize, usize) -> *mut c_void;
pub type PosixMemalign = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> c_int;

/// The next allocator's functions, as addresses (0: not found).
pub struct Next {
    pub malloc: AtomicUsize,
    pub free: AtomicUsize,
    pub calloc: AtomicUsize,
    pub realloc: AtomicUsize,
    pub memalign: AtomicUsize,
    pub posix_memalign: AtomicUsize,
    pub aligned_alloc: AtomicUsize,
    pub valloc: AtomicUsize,
    pub pvalloc: AtomicUsize,
}

pub static NEXT: Next = Next {
    malloc: AtomicUsize::new(0),
    free: AtomicUsize::new(0),
    calloc: AtomicUsize::new(0),
    realloc: AtomicUsize::new(0),
    memalign: AtomicUsize::new(0),
    posix_memalign: AtomicUsize::new(0),
    aligned_alloc: AtomicUsize::new(0),
    valloc: AtomicUsize::new(0),
    pvalloc: AtomicUsize::new(0),
};

/// Not yet resolved.
pub(crate) const UNRESOLVED: u8 = 0;
/// A thread resolves (see `setup`).
pub(crate) const RESOLVING: u8 = 1;
/// Resolved: the next allocator's functions are known.
pub(crate) const READY: u8 = 2;

/// `UNRESOLVED`, `RESOLVING` or `READY`.
pub(crate) static STATE: AtomicU8 = AtomicU8::new(UNRESOLVED);
/// The thread resolving (its calls meanwhile go to the arena).
pub(crate) static RESOLVER: AtomicU64 = AtomicU64::new(0);

/// Whether the next allocator is known (the common case: one load).
#[inline(always)]
pub fn ready() -> bool {
    STATE.load(Ordering::Acquire) == READY
}

/// Whether this library was opened into a running process (by allocscope's injector)
/// rather than preloaded: decided once, before the first lookup.
static OPENED: AtomicU8 = AtomicU8::new(0);

/// Whether this library was opened into a running process: then it is not in the global
/// scope (opened `RTLD_LOCAL`), the program's calls reach it only once routed (see
/// [`crate::route`]), and the definitions it forwards to are the global scope's.
pub fn opened() -> bool {
    OPENED.load(Ordering::Relaxed) == 1
}

/// The program's own handle (`dlopen(NULL)`): its lookups search the global scope alone,
/// whoever asks (`RTLD_DEFAULT` from this library would search its own scope too).
static PROGRAM: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn decide_opened() {
    // SAFETY: dlopen(NULL) returns the program's handle (never unloaded).
    let program = unsafe { libc::dlopen(core::ptr::null(), libc::RTLD_NOW) };
    PROGRAM.store(program as usize, Ordering::Relaxed);
    // SAFETY: dlsym on that handle with a NUL-terminated name only this library defines.
    let global = !program.is_null()
        && !unsafe { libc::dlsym(program, c"allocscope_preload_region".as_ptr()) }.is_null();
    OPENED.store(
        u8::from(!program.is_null() && !global && !in_executable()),
        Ordering::Relaxed,
    );
}

/// Whether this code is linked into the program's executable (its own tests), which
/// exports nothing: never opened into it.
pub(crate) fn in_executable() -> bool {
    let base = |address: *const c_void| {
        // SAFETY: all-zero is a valid Dl_info.
        let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
        // SAFETY: dladdr fills the struct we own.
        let found = unsafe { libc::dladdr(address, &mut info) } != 0;
        found.then_some(info.dli_fbase as usize)
    };
    // SAFETY: getauxval has no preconditions.
    let entry = unsafe { libc::getauxval(libc::AT_ENTRY) } as *const c_void;
    base(entry).is_some() && base(entry) == base(own_address())
}

/// An address inside this library, for `dladdr` to name the object it is in: a static of
/// its own, never exported (a function's address may be taken through a slot the process
/// can rebind).
pub(crate) fn own_address() -> *const c_void {
    static OWN: u8 = 0;
    (&raw const OWN).cast::<c_void>()
}

/// The definition of `name` this library forwards to: the next after it in the search
/// order when preloaded, the global scope's when opened into a running process.
pub fn lookup(name: &core::ffi::CStr) -> usize {
    let scope = if opened() {
        PROGRAM.load(Ordering::Relaxed) as *mut c_void
    } else {
        libc::RTLD_NEXT
    };
    // SAFETY: dlsym with a pseudo-handle and a NUL-terminated name.
    unsafe { libc::dlsym(scope, name.as_ptr()) as usize }
}

pub(crate) fn lookup_all() {
    let n = &NEXT;
    n.malloc.store(lookup(c"malloc"), Ordering::Relaxed);
    n.free.store(lookup(c"free"), Ordering::Relaxed);
    n.calloc.store(lookup(c"calloc"), Ordering::Relaxed);
    n.realloc.store(lookup(c"realloc"), Ordering::Relaxed);
    n.memalign.store(lookup(c"memalign"), Ordering::Relaxed);
    n.posix_memalign
        .store(lookup(c"posix_memalign"), Ordering::Relaxed);
    n.aligned_alloc
        .store(lookup(c"aligned_alloc"), Ordering::Relaxed);
    n.valloc.store(lookup(c"valloc"), Ordering::Relaxed);
    n.pvalloc.store(lookup(c"pvalloc"), Ordering::Relaxed);
    let essential = [&n.malloc, &n.free, &n.calloc, &n.realloc];
    if essential.iter().any(|f| f.load(Ordering::Relaxed) == 0) {
        crate::fatal(b"allocscope preload: no allocator after this library (malloc, free, calloc or realloc missing)\n");
    }
}

/// Loads a resolved function pointer of type `F`.
macro_rules! next {
    ($field:ident as $ty:ty) => {{
        let address = $crate::next::NEXT
            .$field
            .load(core::sync::atomic::Ordering::Relaxed);
        #[allow(unused_unsafe)]
        // SAFETY: set once by `lookup_all` to the address of a function of this C type,
        // before `ready()` turned true (the callers checked it).
        let function = unsafe { core::mem::transmute::<usize, $ty>(address) };
        function
    }};
}
pub(crate) use next;

/// The bootstrap arena: bump allocation in static memory, never freed.
pub mod arena {
    use core::{
        cell::UnsafeCell,
        ffi::c_void,
        sync::atomic::{AtomicUsize, Ordering},
    };

    const SIZE: usize = 256 * 1024;
    /// Header before each block: its size.
    const HEADER: usize = 16;

    #[repr(C, align(64))]
    struct Bytes(UnsafeCell<[u8; SIZE]>);
    // SAFETY: disjoint ranges are handed out by an atomic bump pointer.
    unsafe impl Sync for Bytes {}

    static BYTES: Bytes = Bytes(UnsafeCell::new([0; SIZE]));
    static USED: AtomicUsize = AtomicUsize::new(0);

    fn base() -> usize {
        BYTES.0.get() as usize
    }

    /// A zeroed block of `size` bytes aligned to `align` (a power of two, at most 4096),
    /// or null when the arena is exhausted.
    pub fn alloc(size: usize, align: usize) -> *mut c_void {
        let align = align.clamp(16, 4096);
        let mut used = USED.load(Ordering::Relaxed);
        loop {
            let start = (base() + used + HEADER + align - 1) & !(align - 1);
            let Some(end) = start.checked_add(size) else {
                return core::ptr::null_mut();
            };
            if end > base() + SIZE {
                return core::ptr::null_mut();
            }
            match USED.compare_exchange(used, end - base(), Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    // SAFETY: [start - HEADER, end) lies in the arena and is ours alone.
                    unsafe { ((start - HEADER) as *mut usize).write(size) };
                    return start as *mut c_void;
                }
                Err(now) => used = now,
            }
        }
    }

    /// Whether `pointer` is an arena block.
    #[inline(always)]
    pub fn contains(pointer: *mut c_void) -> bool {
        (pointer as usize).wrapping_sub(base()) < SIZE
    }

    /// The size of arena block `pointer`.
    pub fn size_of(pointer: *mut c_void) -> usize {
        // SAFETY: every arena block has its size in the header just before it.
        unsafe { ((pointer as usize - HEADER) as *const usize).read() }
    }
}
