//! An allocator linked into the executable, counted here: its entry points patched to
//! reach this library, from the plan allocscope wrote into the family table (see
//! [`sampler_common::patch`]: why a plan, and what each entry holds).
//!
//! Once, in the set-up of a process the plan is for (`record -- CMD`: the command and the
//! processes of its tree that run the same executable), while the process has one thread:
//! - every entry is checked first (the program headers hash to the plan's digest, each
//!   entry lies in an executable segment and its bytes are the file's), or none is patched;
//! - the trampolines are written in a private page within 2 GiB of the executable, made
//!   read-only and executable before any is used (no page is writable and executable at
//!   once): per entry, the relocated prologue and a jump back past the patch, and a stub
//!   that jumps to this entry's wrapper;
//! - each page of the executable holding entries is copied into a private page, checked
//!   against the file's (a uprobe's breakpoint there, or any change, and the page is left
//!   as it is), given its entries' `jmp`s, made read-and-execute and moved over the
//!   original in one `mremap`: the executable's code is never writable, a thread sees the
//!   old page or the new one, and a uprobe attached to the file later does not reach the
//!   copy (it is not the file's), so it can never write its breakpoint over a patch.
//!
//! A wrapper counts and samples the call as this library's `malloc` does and calls the
//! relocated prologue: what the allocator calls underneath (another patched entry,
//! `malloc`), deeper on the thread's stack, is not counted again ([`thread::within`]).
//! Frees forget a sampled block first. A forked child's region says it is patched too. The outcome is in the region: [`Region::patched`] or [`Region::patch_refused`].
//! A library opened into a running process (`-p`) patches nothing (other threads run).

use core::{
    ffi::c_void,
    ptr,
    sync::atomic::{AtomicU32, AtomicUsize, Ordering},
};

use sampler_common::{
    patch::{
        jump, relocate, PatchEntry, PatchPage, PatchPlan, JUMP_BYTES, MAX_PATCHES, PAGE_BYTES,
        PATCH_MAGIC, PATCH_VERSION, ROLE_FREE,
    },
    preload::{family_patches_bytes, PatchRefusal},
    AllocFn,
};

use crate::{counted, forget, reallocated, region, thread};

/// Per wrapper: the relocated prologue it calls (0: unused).
static ORIGINALS: [AtomicUsize; MAX_PATCHES] = [const { AtomicUsize::new(0) }; MAX_PATCHES];
/// Per wrapper: the entry's role ([`ROLE_FREE`] or an [`AllocFn`]).
static ROLES: [AtomicU32; MAX_PATCHES] = [const { AtomicU32::new(0) }; MAX_PATCHES];

/// Bytes of one entry's trampoline: its relocated prologue and jump back, then its stub.
const SLOT_BYTES: usize = 128;
/// Where in a slot the stub is.
const STUB_AT: usize = 96;
/// `jmp [rip + 0]`, followed by the 8-byte address it jumps to.
const ABSOLUTE_JUMP: [u8; 6] = [0xff, 0x25, 0, 0, 0, 0];
const PAGE: usize = 4096;

/// Patches what the plan says (`patching`: preloaded, not opened into a running process),
/// if there is one for this executable, and says so in the region. Runs once, in the
/// set-up, after the region is current.
pub fn apply(patching: bool) {
    let outcome = match region::take_patch_plan() {
        None => return,
        Some(None) => Err((0, PatchRefusal::Unreadable)),
        Some(Some(plan)) => {
            // SAFETY: a plan-sized read-only mapping made by the region's set-up.
            let outcome = patching.then(|| patch_all(unsafe { &*plan }));
            // SAFETY: unmapping the mapping the region's set-up made; nothing refers to it.
            unsafe { libc::munmap(plan.cast_mut().cast(), family_patches_bytes()) };
            match outcome {
                Some(outcome) => outcome,
                None => return,
            }
        }
    };
    let region = region::current();
    match outcome {
        Ok(patched) => region.patched.store(patched, Ordering::Relaxed),
        Err((patched, refusal)) => {
            region.patched.store(patched, Ordering::Relaxed);
            region
                .patch_refused
                .store(refusal as u64, Ordering::Relaxed);
        }
    }
}

/// The executable as the kernel loaded it: its program headers and load bias.
struct Executable {
    headers: &'static [libc::Elf64_Phdr],
    bias: u64,
}

impl Executable {
    /// From the auxiliary vector (no system call, no path).
    fn find() -> Option<Executable> {
        // SAFETY: getauxval has no preconditions.
        let (phdr, count, size) = unsafe {
            (
                libc::getauxval(libc::AT_PHDR),
                libc::getauxval(libc::AT_PHNUM),
                libc::getauxval(libc::AT_PHENT),
            )
        };
        if phdr == 0 || size as usize != core::mem::size_of::<libc::Elf64_Phdr>() {
            return None;
        }
        // SAFETY: the kernel's pointer to the executable's program headers, mapped for the
        // process's life, `AT_PHNUM` of them.
        let headers =
            unsafe { core::slice::from_raw_parts(phdr as *const libc::Elf64_Phdr, count as usize) };
        const PT_PHDR: u32 = 6;
        let own = headers.iter().find(|h| h.p_type == PT_PHDR)?;
        Some(Executable {
            headers,
            bias: phdr.wrapping_sub(own.p_vaddr),
        })
    }

    /// The program header table's bytes (what the plan's digest is of).
    fn header_bytes(&self) -> &[u8] {
        // SAFETY: the same memory as `headers`, viewed as bytes.
        unsafe {
            core::slice::from_raw_parts(
                self.headers.as_ptr().cast(),
                core::mem::size_of_val(self.headers),
            )
        }
    }

    /// Whether `address..address + len` (file addresses) lies in an executable segment.
    fn executes(&self, address: u64, len: u64) -> bool {
        const PF_X: u32 = 1;
        self.headers.iter().any(|h| {
            h.p_type == crate::objects::PT_LOAD
                && h.p_flags & PF_X != 0
                && address >= h.p_vaddr
                && address + len <= h.p_vaddr + h.p_memsz
        })
    }

    /// Whether the page at file address `page` is all code: the only loaded segment on
    /// it is executable and not writable (it is replaced by a read-and-execute copy).
    fn code_page(&self, page: u64) -> bool {
        const PF_X: u32 = 1;
        const PF_W: u32 = 2;
        let mut on_it = self.headers.iter().filter(|h| {
            h.p_type == crate::objects::PT_LOAD
                && h.p_vaddr < page + PAGE as u64
                && page < h.p_vaddr + h.p_memsz
        });
        matches!(
            (on_it.next(), on_it.next()),
            (Some(h), None) if h.p_flags & PF_X != 0 && h.p_flags & PF_W == 0
        )
    }

    /// Where its loaded segments start, in memory.
    fn lowest(&self) -> u64 {
        let low = self
            .headers
            .iter()
            .filter(|h| h.p_type == crate::objects::PT_LOAD)
            .map(|h| h.p_vaddr)
            .min()
            .unwrap_or(0);
        self.bias.wrapping_add(low) & !(PAGE as u64 - 1)
    }
}

/// Every entry patched (their count), or how many were before the refusal.
fn patch_all(plan: &PatchPlan) -> Result<u64, (u64, PatchRefusal)> {
    let refuse = |r| Err((0, r));
    if plan.magic != PATCH_MAGIC || plan.version != PATCH_VERSION {
        return refuse(PatchRefusal::Unreadable);
    }
    let count = plan.count as usize;
    if count == 0 || count > MAX_PATCHES {
        return refuse(PatchRefusal::Unreadable);
    }
    let Some(executable) = Executable::find() else {
        return refuse(PatchRefusal::OtherExecutable);
    };
    if sampler_common::patch::digest(executable.header_bytes()) != plan.digest {
        // Another program of the command's tree: the plan is not for it, nothing to say.
        return Ok(0);
    }
    let entries = &plan.entries[..count];
    let pages = plan.page_count as usize;
    let in_a_page = |e: &PatchEntry| {
        plan.pages[..pages.min(MAX_PATCHES)]
            .iter()
            .any(|p| p.address == e.address & !(PAGE_BYTES as u64 - 1))
    };
    if pages == 0 || pages > MAX_PATCHES || !entries.iter().all(in_a_page) {
        return refuse(PatchRefusal::Unreadable);
    }
    if !plan.pages[..pages]
        .iter()
        .all(|p| executable.code_page(p.address))
    {
        return refuse(PatchRefusal::Changed);
    }
    if !entries.iter().all(|e| unchanged(&executable, e)) {
        return refuse(PatchRefusal::Changed);
    }
    if !single_threaded() {
        return refuse(PatchRefusal::Threads);
    }
    let bytes = (count * SLOT_BYTES).next_multiple_of(PAGE);
    let Some(trampolines) = map_near(executable.lowest(), bytes) else {
        return refuse(PatchRefusal::NoRoom);
    };
    let written = write_trampolines(&executable, entries, trampolines);
    // SAFETY: our own mapping, now complete: read and executed from here on, never written.
    let sealed = written.is_ok()
        && unsafe { libc::mprotect(trampolines.cast(), bytes, libc::PROT_READ | libc::PROT_EXEC) }
            == 0;
    if !sealed {
        // SAFETY: unmapping our own mapping, which nothing jumps to yet.
        unsafe { libc::munmap(trampolines.cast(), bytes) };
        return refuse(written.err().unwrap_or(PatchRefusal::Protected));
    }
    for (slot, entry) in entries.iter().enumerate() {
        let at = trampolines as usize + slot * SLOT_BYTES;
        ORIGINALS[slot].store(at, Ordering::Release);
        ROLES[slot].store(entry.role, Ordering::Release);
    }
    put_in_place(&executable, plan, trampolines, bytes)
}

/// Puts patched copies of the plan's pages in place, all of them made and checked before
/// any is (all or nothing; `trampolines`, `bytes` long, unmapped if none is): the entries
/// patched, or how many were before a refusal.
fn put_in_place(
    executable: &Executable,
    plan: &PatchPlan,
    trampolines: *mut u8,
    bytes: usize,
) -> Result<u64, (u64, PatchRefusal)> {
    let (entries, pages) = (
        &plan.entries[..plan.count as usize],
        plan.page_count as usize,
    );
    // Every copy made and checked before any is put in place: all or nothing.
    let mut copies = [(ptr::null_mut::<u8>(), 0u64, 0u64); MAX_PATCHES];
    for (i, page) in plan.pages[..pages].iter().enumerate() {
        match copy_page(executable, page, entries, trampolines) {
            Ok(copy) => copies[i] = copy,
            Err(refusal) => {
                for &(copy, _, _) in &copies[..i] {
                    // SAFETY: unmapping our own copies, which nothing refers to.
                    unsafe { libc::munmap(copy.cast(), PAGE) };
                }
                // SAFETY: unmapping our own mapping, which nothing jumps to.
                unsafe { libc::munmap(trampolines.cast(), bytes) };
                return Err((0, refusal));
            }
        }
    }
    let mut patched = 0;
    for (i, &(copy, at, n)) in copies[..pages].iter().enumerate() {
        if !move_page(copy, at) {
            for &(copy, _, _) in &copies[i..pages] {
                // SAFETY: unmapping our own copies not put in place.
                unsafe { libc::munmap(copy.cast(), PAGE) };
            }
            return Err((patched, PatchRefusal::Protected));
        }
        patched += n;
    }
    Ok(patched)
}

/// Whether `entry` lies in an executable segment and its bytes are still the file's.
fn unchanged(executable: &Executable, entry: &PatchEntry) -> bool {
    let len = entry.original_len as usize;
    if !(JUMP_BYTES..=entry.original.len()).contains(&len)
        || !executable.executes(entry.address, len as u64)
    {
        return false;
    }
    let at = executable.bias.wrapping_add(entry.address) as *const u8;
    // SAFETY: `len` bytes inside a loaded executable segment of the executable.
    let now = unsafe { core::slice::from_raw_parts(at, len) };
    now == &entry.original[..len]
}

/// Whether the process has only this thread: glibc's own flag (false from its first
/// `pthread_create` on; no system call), or before glibc 2.32, which has none, the
/// kernel's count (`/proc/self/stat`). Unknown counts as not.
fn single_threaded() -> bool {
    let flag = crate::python::symbol(c"__libc_single_threaded").cast::<u8>();
    if !flag.is_null() {
        // SAFETY: glibc's `char __libc_single_threaded`, read once.
        return unsafe { ptr::read_volatile(flag) } != 0;
    }
    threads_from_stat() == Some(1)
}

/// The process's threads as the kernel counts them (`/proc/self/stat`, field 20).
fn threads_from_stat() -> Option<u64> {
    let mut buffer = [0u8; 1024];
    // SAFETY: opening a proc file with a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/stat".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: reads into our buffer; closes what we opened.
    let n = unsafe {
        let n = libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len());
        libc::close(fd);
        n
    };
    let text = buffer.get(..usize::try_from(n).ok()?)?;
    // The name (field 2) may hold spaces and parentheses: fields are counted after its end.
    let after = text.iter().rposition(|&b| b == b')')? + 1;
    let field = text[after..]
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .nth(17)?;
    field.iter().try_fold(0u64, |v, &b| {
        b.is_ascii_digit().then(|| v * 10 + u64::from(b - b'0'))
    })
}

/// A private read-write mapping of `bytes` within reach (±2 GiB) of code starting at
/// `lowest`: tried below it, 2 MiB apart, never replacing a mapping.
fn map_near(lowest: u64, bytes: usize) -> Option<*mut u8> {
    const STEP: u64 = 2 << 20;
    for k in 1..=64u64 {
        let Some(hint) = lowest.checked_sub(k * STEP + bytes as u64) else {
            break;
        };
        if hint < (1 << 20) {
            break;
        }
        // SAFETY: a new anonymous mapping that replaces nothing (MAP_FIXED_NOREPLACE).
        let mapped = unsafe {
            libc::mmap(
                hint as *mut c_void,
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            continue;
        }
        if mapped as u64 == hint {
            return Some(mapped.cast());
        }
        // An older kernel took the address as a hint only: not where it was asked.
        // SAFETY: unmapping the mapping just made.
        unsafe { libc::munmap(mapped, bytes) };
    }
    None
}

/// Writes each entry's trampoline and stub into `trampolines` (writable, not executable).
fn write_trampolines(
    executable: &Executable,
    entries: &[PatchEntry],
    trampolines: *mut u8,
) -> Result<(), PatchRefusal> {
    for (slot, entry) in entries.iter().enumerate() {
        let at = trampolines as u64 + (slot * SLOT_BYTES) as u64;
        let code = relocate(entry, executable.bias, at).map_err(|_| PatchRefusal::OutOfReach)?;
        let len = entry.relocated_len as usize;
        let back = executable.bias + entry.address + u64::from(entry.original_len);
        let stub_at = at + STUB_AT as u64;
        if jump(executable.bias + entry.address, stub_at).is_none() {
            return Err(PatchRefusal::OutOfReach);
        }
        let wrapper = WRAPPERS[slot] as usize as u64;
        // SAFETY: within this slot of our own writable mapping (relocated ≤ 48 bytes, its
        // jump back 14 more, before the stub at 96; the stub 14 bytes of 128).
        unsafe {
            let base = at as *mut u8;
            ptr::copy_nonoverlapping(code.as_ptr(), base, len);
            ptr::copy_nonoverlapping(ABSOLUTE_JUMP.as_ptr(), base.add(len), 6);
            ptr::copy_nonoverlapping(back.to_le_bytes().as_ptr(), base.add(len + 6), 8);
            ptr::copy_nonoverlapping(ABSOLUTE_JUMP.as_ptr(), base.add(STUB_AT), 6);
            ptr::copy_nonoverlapping(wrapper.to_le_bytes().as_ptr(), base.add(STUB_AT + 6), 8);
        }
    }
    Ok(())
}

/// A patched copy of the executable's `page`, read-and-execute, where its `entries` jump
/// to their stubs in `trampolines`: the copy, where it goes, and how many entries it
/// patches; or why it cannot be made (nothing left mapped).
fn copy_page(
    executable: &Executable,
    page: &PatchPage,
    entries: &[PatchEntry],
    trampolines: *mut u8,
) -> Result<(*mut u8, u64, u64), PatchRefusal> {
    let at = executable.bias.wrapping_add(page.address);
    // SAFETY: a new private anonymous page, ours until moved or unmapped.
    let copy = unsafe {
        libc::mmap(
            ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if copy == libc::MAP_FAILED {
        return Err(PatchRefusal::NoRoom);
    }
    let copy = copy.cast::<u8>();
    let discard = |refusal| {
        // SAFETY: unmapping our own page, which nothing refers to.
        unsafe { libc::munmap(copy.cast(), PAGE) };
        Err(refusal)
    };
    // SAFETY: the executable's mapped page (its entries were checked to lie in an
    // executable segment) into ours.
    unsafe { ptr::copy_nonoverlapping(at as *const u8, copy, PAGE) };
    // SAFETY: our page, PAGE bytes.
    let bytes = unsafe { core::slice::from_raw_parts(copy, PAGE) };
    if sampler_common::patch::digest(bytes) != page.digest {
        // A breakpoint (a uprobe attached to the file), or the page changed otherwise:
        // copied, it would outlive the uprobe that put it there.
        return discard(PatchRefusal::Changed);
    }
    let mut patched = 0;
    for (slot, entry) in entries.iter().enumerate() {
        if entry.address & !(PAGE_BYTES as u64 - 1) != page.address {
            continue;
        }
        let from = executable.bias + entry.address;
        let stub = trampolines as u64 + (slot * SLOT_BYTES + STUB_AT) as u64;
        let Some(jump) = jump(from, stub) else {
            return discard(PatchRefusal::OutOfReach);
        };
        let offset = (entry.address - page.address) as usize;
        for i in 0..entry.original_len as usize {
            // SAFETY: within our page (each entry's bytes lie in its page: checked).
            unsafe { *copy.add(offset + i) = jump.get(i).copied().unwrap_or(0xcc) };
        }
        patched += 1;
    }
    // SAFETY: our own page, complete: executed from now on, never written.
    if unsafe { libc::mprotect(copy.cast(), PAGE, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
        return discard(PatchRefusal::Protected);
    }
    Ok((copy, at, patched))
}

/// Moves the patched `copy` over the executable's page at `at`: false if it could not be.
fn move_page(copy: *mut u8, at: u64) -> bool {
    // SAFETY: moves our page over the executable's (one step: the old page or the new one
    // is mapped there at every moment); no other thread runs (checked).
    let moved = unsafe {
        libc::mremap(
            copy.cast(),
            PAGE,
            PAGE,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            at as *mut c_void,
        )
    };
    moved != libc::MAP_FAILED
}

/// A relocated prologue, called with the caller's six argument registers.
type Original = unsafe extern "C" fn(usize, usize, usize, usize, usize, usize) -> usize;

/// The call of patched entry `slot` with arguments `a`: counted by its role, forwarded.
/// Out of line: one body for every wrapper (each a few bytes that pass their slot), not
/// 32 copies of the library's counting paths.
#[inline(never)]
fn call(slot: usize, a: [usize; 6]) -> usize {
    // SAFETY: set to the entry's trampoline before its patch was written.
    let original: Original =
        unsafe { core::mem::transmute::<usize, Original>(ORIGINALS[slot].load(Ordering::Relaxed)) };
    // SAFETY: the caller's arguments, forwarded to the allocator's own code.
    let forward = || unsafe { original(a[0], a[1], a[2], a[3], a[4], a[5]) };
    let busy = || thread::within(forward) as *mut c_void;
    let role = ROLES[slot].load(Ordering::Relaxed);
    if role == ROLE_FREE {
        forget(a[0] as *mut c_void);
        return forward();
    }
    let Some(&function) = AllocFn::ALL.get(role as usize) else {
        return forward();
    };
    match function {
        AllocFn::Realloc => reallocated(a[0] as *mut c_void, a[1], busy) as usize,
        AllocFn::Calloc => {
            let bytes = sampler_common::geometric::saturating_product(a[0] as u64, a[1] as u64);
            counted(bytes, function, busy) as usize
        }
        AllocFn::PosixMemalign => posix_memalign(a, forward),
        AllocFn::AlignedAlloc | AllocFn::Memalign => counted(a[1] as u64, function, busy) as usize,
        _ => counted(a[0] as u64, function, busy) as usize,
    }
}

/// `posix_memalign(out, align, size)`: the block is in `*out` when it returns 0.
#[inline(always)]
fn posix_memalign(a: [usize; 6], forward: impl FnOnce() -> usize) -> usize {
    let sampled = thread::count(a[2] as u64);
    let status = thread::within(forward);
    if sampled {
        let pointer = if status as u32 == 0 {
            // SAFETY: set by a successful posix_memalign.
            unsafe { *(a[0] as *const *mut c_void) }
        } else {
            ptr::null_mut()
        };
        crate::report(pointer, a[2] as u64, AllocFn::PosixMemalign);
    }
    status
}

macro_rules! wrappers {
    ($($slot:literal)*) => {
        /// One wrapper per plan entry: the stub of entry `slot` jumps to `WRAPPERS[slot]`.
        static WRAPPERS: [Original; MAX_PATCHES] = [$({
            unsafe extern "C" fn wrapper(
                a: usize, b: usize, c: usize, d: usize, e: usize, f: usize,
            ) -> usize {
                call($slot, [a, b, c, d, e, f])
            }
            wrapper
        }),*];
    };
}

wrappers!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
