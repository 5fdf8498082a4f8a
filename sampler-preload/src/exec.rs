//! Children keep the library whatever environment they are given: the exec family and
//! `posix_spawn` pass on an environment whose `LD_PRELOAD` still names this library.
//!
//! Why: a command's tree is counted in-process because every process in it inherits
//! `LD_PRELOAD`. A program that sets its own (`LD_PRELOAD=libjemalloc.so.2 ./prog` in a
//! shell script) or clears its environment (`env -i`) would start a child without the
//! library, which allocscope could then only probe once it noticed it, late and trap by
//! trap. Here the child's `LD_PRELOAD` becomes this library's path followed by what the
//! program set (the library must come first: it forwards to an allocator preloaded after
//! it), in the place of the program's own (the last, which the loader reads), or last;
//! every other variable stays as the program set it, and an environment that already
//! names the library is passed on untouched.
//!
//! Only where the library was preloaded: opened into a running process (`-p`) these
//! definitions are in its own scope and nobody calls them. An exec may run in a signal
//! handler, a `vfork` child or a child of a raw `clone`, where the loader's lock may be
//! held by a thread that is not there: the next definitions and the library's path are
//! found at the library's set-up ([`resolve`]), and an exec calls into nothing but them
//! (before the set-up, the next definition is looked up then: a program that execs
//! before its first allocation). The new environment is built on the caller's stack,
//! never on the heap or in a mapping (a `vfork` child shares its parent's memory), and
//! only when it is needed: a larger one than [`WORDS`] is passed on as it is, as is one
//! where the library's file cannot be read (a child that chroot'ed, a recording's
//! directory removed: its loader would print an error). `execl`, `execlp` and `execle`
//! (variadic: not definable here), `system` and `popen` reach the C library's own.

use core::{
    ffi::{c_char, c_int, c_void, CStr},
    mem::MaybeUninit,
    sync::atomic::{AtomicUsize, Ordering},
};

use crate::next;

/// The words of stack a new environment may take: its pointers, then its `LD_PRELOAD`.
/// 4 KiB (a C library's own `execvp` takes `PATH_MAX` of stack for its search): room
/// for ~500 variables less what a long `LD_PRELOAD` takes.
const WORDS: usize = 512;

const LD_PRELOAD: &[u8] = b"LD_PRELOAD=";

type Envp = *const *const c_char;

extern "C" {
    static environ: Envp;
}

/// The next definitions (0: not found yet).
static EXECVE: AtomicUsize = AtomicUsize::new(0);
static EXECVPE: AtomicUsize = AtomicUsize::new(0);
static EXECVEAT: AtomicUsize = AtomicUsize::new(0);
static FEXECVE: AtomicUsize = AtomicUsize::new(0);
static POSIX_SPAWN: AtomicUsize = AtomicUsize::new(0);
static POSIX_SPAWNP: AtomicUsize = AtomicUsize::new(0);

/// This library's path as the loader opened it (a NUL-terminated string the loader owns),
/// and its length; 0: not preloaded, not set up, or a path a child's `LD_PRELOAD` cannot
/// name.
static OWN: AtomicUsize = AtomicUsize::new(0);
static OWN_LEN: AtomicUsize = AtomicUsize::new(0);

/// At the library's set-up: the next definitions and this library's path, so that an exec
/// needs the loader for neither.
pub(crate) fn resolve() {
    if next::opened() || next::in_executable() {
        return;
    }
    for (slot, name) in [
        (&EXECVE, c"execve"),
        (&EXECVPE, c"execvpe"),
        (&EXECVEAT, c"execveat"),
        (&FEXECVE, c"fexecve"),
        (&POSIX_SPAWN, c"posix_spawn"),
        (&POSIX_SPAWNP, c"posix_spawnp"),
    ] {
        slot.store(next::lookup(name), Ordering::Relaxed);
    }
    // SAFETY: all-zero is a valid Dl_info.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: dladdr fills the struct we own.
    if unsafe { libc::dladdr(next::own_address(), &mut info) } == 0 || info.dli_fname.is_null() {
        return;
    }
    // SAFETY: a NUL-terminated string owned by the loader, kept while the library is.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    // Absolute, and one word of an `LD_PRELOAD` (the loader splits at spaces and colons).
    let nameable = path.first() == Some(&b'/') && !path.iter().any(|&b| b == b' ' || b == b':');
    if nameable {
        OWN_LEN.store(path.len(), Ordering::Relaxed);
        OWN.store(info.dli_fname as usize, Ordering::Release);
    }
}

/// This library's path, if a child's `LD_PRELOAD` may name it ([`resolve`]).
fn own_path() -> Option<&'static [u8]> {
    let own = OWN.load(Ordering::Acquire);
    // SAFETY: [`resolve`] stored the loader's string and its length.
    (own != 0).then(|| unsafe {
        core::slice::from_raw_parts(own as *const u8, OWN_LEN.load(Ordering::Relaxed))
    })
}

/// The next definition of `name`, found at set-up (or now, before it); 0 if there is none.
fn next_of(slot: &AtomicUsize, name: &CStr) -> usize {
    let found = slot.load(Ordering::Relaxed);
    if found != 0 {
        return found;
    }
    let found = next::lookup(name);
    slot.store(found, Ordering::Relaxed);
    found
}

/// Sets errno to ENOSYS (no next definition) and returns -1.
fn no_next() -> c_int {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// Runs `run` with `envp`, or with a copy on this stack whose `LD_PRELOAD` names the
/// library where `envp`'s does not (built apart, so that the common case takes no stack).
fn with_library<R>(envp: Envp, run: impl FnOnce(Envp) -> R) -> R {
    match own_path() {
        // SAFETY: `envp` is the caller's NULL-terminated environment (or null: empty).
        Some(own) if unsafe { needs_library(envp, own) } => with_copy(envp, own, run),
        _ => run(envp),
    }
}

#[inline(never)]
fn with_copy<R>(envp: Envp, own: &[u8], run: impl FnOnce(Envp) -> R) -> R {
    let mut words = [const { MaybeUninit::<usize>::uninit() }; WORDS];
    // SAFETY: as in `with_library`.
    match unsafe { patch(envp, own, &mut words) } {
        Some(patched) => run(patched),
        None => run(envp),
    }
}

/// The value of `entry` if it is an `LD_PRELOAD` entry.
fn preload_value(entry: *const c_char) -> Option<&'static [u8]> {
    // SAFETY: an environment entry: a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(entry) }.to_bytes();
    bytes.strip_prefix(LD_PRELOAD)
}

/// Whether `value` (an `LD_PRELOAD`: paths separated by spaces or colons) names `own`.
fn names(value: &[u8], own: &[u8]) -> bool {
    value
        .split(|&b| b == b' ' || b == b':')
        .any(|path| path == own)
}

/// Whether the environment `envp` lacks the library in the `LD_PRELOAD` the loader will
/// read (the last), and the library's file can be read where the child will run.
///
/// # Safety
/// `envp` is null or a NULL-terminated array of NUL-terminated strings.
unsafe fn needs_library(envp: Envp, own: &[u8]) -> bool {
    let mut last = None;
    let mut at = envp;
    // SAFETY: the array is NULL-terminated (the caller's promise).
    while !envp.is_null() && !unsafe { *at }.is_null() {
        // SAFETY: within the array.
        last = preload_value(unsafe { *at }).or(last);
        // SAFETY: the next entry, at most the terminating NULL.
        at = unsafe { at.add(1) };
    }
    if last.is_some_and(|value| names(value, own)) {
        return false;
    }
    // A seccomp filter may forbid `access`: there the file is taken as readable.
    crate::sandbox::quiet()
        // SAFETY: the loader's NUL-terminated string (see `resolve`).
        || unsafe { libc::access(OWN.load(Ordering::Acquire) as *const c_char, libc::R_OK) } == 0
}

/// `envp` with its last `LD_PRELOAD` (or a new last entry) naming `own` first, laid out in
/// `words` (the pointers, then the new `LD_PRELOAD` string) in one pass over `envp`;
/// `None` if it does not fit.
///
/// # Safety
/// `envp` is null or a NULL-terminated array of NUL-terminated strings.
unsafe fn patch(envp: Envp, own: &[u8], words: &mut [MaybeUninit<usize>]) -> Option<Envp> {
    // The pointers are copied in one pass (another thread's `setenv` may change the array
    // meanwhile), each with room kept for the new entry, the NULL and the string.
    let mut count = 0;
    let mut last: Option<(usize, &[u8])> = None;
    let mut at = envp;
    // SAFETY: the array is NULL-terminated (the caller's promise).
    while !envp.is_null() && !unsafe { *at }.is_null() {
        // SAFETY: within the array.
        let entry = unsafe { *at };
        if let Some(value) = preload_value(entry) {
            last = Some((count, value));
        }
        let theirs = last.map_or(0, |(_, value)| value.len());
        let string_words = (LD_PRELOAD.len() + own.len() + 1 + theirs + 1).div_ceil(8);
        if count + 3 + string_words > words.len() {
            return None;
        }
        words[count].write(entry as usize);
        count += 1;
        // SAFETY: the next entry, at most the terminating NULL.
        at = unsafe { at.add(1) };
    }
    let theirs = last
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty());
    let string_len = LD_PRELOAD.len() + own.len() + theirs.map_or(0, |t| 1 + t.len()) + 1;
    let string_words = string_len.div_ceil(size_of::<usize>());
    let pointers = count + usize::from(last.is_none()) + 1;
    if pointers + string_words > words.len() {
        return None;
    }
    let (pointer_words, string_area) = words.split_at_mut(words.len() - string_words);
    // SAFETY: `string_area` is `string_words` words, viewed as bytes.
    let string = unsafe {
        core::slice::from_raw_parts_mut(string_area.as_mut_ptr().cast::<u8>(), string_len)
    };
    let mut end = 0;
    let mut put = |part: &[u8]| {
        string[end..end + part.len()].copy_from_slice(part);
        end += part.len();
    };
    put(LD_PRELOAD);
    put(own);
    if let Some(theirs) = theirs {
        put(b" ");
        put(theirs);
    }
    put(b"\0");
    let string = string.as_ptr() as usize;
    // In the place of the loader's (the last), or after the others.
    let place = last.map_or(count, |(index, _)| index);
    pointer_words[place].write(string);
    pointer_words[pointers - 1].write(0);
    Some(pointer_words.as_ptr().cast())
}

/// `execve` with the library kept in the child's `LD_PRELOAD`.
///
/// # Safety
/// As `execve(2)`.
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: Envp, envp: Envp) -> c_int {
    let next = next_of(&EXECVE, c"execve");
    if next == 0 {
        return no_next();
    }
    // SAFETY: the next definition of execve has its signature.
    let next: unsafe extern "C" fn(*const c_char, Envp, Envp) -> c_int =
        unsafe { core::mem::transmute(next) };
    // SAFETY: the caller's arguments, the environment perhaps replaced by a valid one.
    with_library(envp, |envp| unsafe { next(path, argv, envp) })
}

/// `execv`: `execve` with the program's environment.
///
/// # Safety
/// As `execv(3)`.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: Envp) -> c_int {
    // SAFETY: the caller's arguments and the program's environment.
    unsafe { execve(path, argv, environ) }
}

/// `execvpe` with the library kept in the child's `LD_PRELOAD`.
///
/// # Safety
/// As `execvpe(3)`.
#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: Envp, envp: Envp) -> c_int {
    let next = next_of(&EXECVPE, c"execvpe");
    if next == 0 {
        return no_next();
    }
    // SAFETY: the next definition of execvpe has its signature.
    let next: unsafe extern "C" fn(*const c_char, Envp, Envp) -> c_int =
        unsafe { core::mem::transmute(next) };
    // SAFETY: the caller's arguments, the environment perhaps replaced by a valid one.
    with_library(envp, |envp| unsafe { next(file, argv, envp) })
}

/// `execvp`: `execvpe` with the program's environment (the C library's own `execvp`
/// reaches its `execve` without passing through ours).
///
/// # Safety
/// As `execvp(3)`.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: Envp) -> c_int {
    // SAFETY: the caller's arguments and the program's environment.
    unsafe { execvpe(file, argv, environ) }
}

/// `execveat` with the library kept in the child's `LD_PRELOAD`.
///
/// # Safety
/// As `execveat(2)`.
#[no_mangle]
pub unsafe extern "C" fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: Envp,
    envp: Envp,
    flags: c_int,
) -> c_int {
    let next = next_of(&EXECVEAT, c"execveat");
    if next == 0 {
        return no_next();
    }
    // SAFETY: the next definition of execveat has its signature.
    let next: unsafe extern "C" fn(c_int, *const c_char, Envp, Envp, c_int) -> c_int =
        unsafe { core::mem::transmute(next) };
    // SAFETY: the caller's arguments, the environment perhaps replaced by a valid one.
    with_library(envp, |envp| unsafe { next(dirfd, path, argv, envp, flags) })
}

/// `fexecve` with the library kept in the child's `LD_PRELOAD`.
///
/// # Safety
/// As `fexecve(3)`.
#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: Envp, envp: Envp) -> c_int {
    let next = next_of(&FEXECVE, c"fexecve");
    if next == 0 {
        return no_next();
    }
    // SAFETY: the next definition of fexecve has its signature.
    let next: unsafe extern "C" fn(c_int, Envp, Envp) -> c_int =
        unsafe { core::mem::transmute(next) };
    // SAFETY: the caller's arguments, the environment perhaps replaced by a valid one.
    with_library(envp, |envp| unsafe { next(fd, argv, envp) })
}

type Spawn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const c_void,
    *const c_void,
    Envp,
    Envp,
) -> c_int;

/// `posix_spawn` or `posix_spawnp` (`slot`, `name`) with the library kept in the child's
/// `LD_PRELOAD` (they return an error number, not -1).
fn spawn(
    slot: &AtomicUsize,
    name: &CStr,
    args: (
        *mut libc::pid_t,
        *const c_char,
        *const c_void,
        *const c_void,
    ),
    argv: Envp,
    envp: Envp,
) -> c_int {
    let next = next_of(slot, name);
    if next == 0 {
        return libc::ENOSYS;
    }
    // SAFETY: the next definition of posix_spawn(p) has this signature.
    let next: Spawn = unsafe { core::mem::transmute(next) };
    let (pid, path, actions, attributes) = args;
    // SAFETY: the caller's arguments, the environment perhaps replaced by a valid one.
    with_library(envp, |envp| unsafe {
        next(pid, path, actions, attributes, argv, envp)
    })
}

/// `posix_spawn` with the library kept in the child's `LD_PRELOAD`.
///
/// # Safety
/// As `posix_spawn(3)`.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const c_void,
    attributes: *const c_void,
    argv: Envp,
    envp: Envp,
) -> c_int {
    let args = (pid, path, actions, attributes);
    spawn(&POSIX_SPAWN, c"posix_spawn", args, argv, envp)
}

/// `posix_spawnp` with the library kept in the child's `LD_PRELOAD`.
///
/// # Safety
/// As `posix_spawnp(3)`.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const c_void,
    attributes: *const c_void,
    argv: Envp,
    envp: Envp,
) -> c_int {
    let args = (pid, file, actions, attributes);
    spawn(&POSIX_SPAWNP, c"posix_spawnp", args, argv, envp)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: &[u8] = b"/run/allocscope/rec-1-2/libsampler_preload.so";

    /// NUL-terminated copies of `list` and a NULL-terminated array of them.
    fn envp(list: &[&str]) -> (Vec<std::ffi::CString>, Vec<*const c_char>) {
        let owned: Vec<std::ffi::CString> = list
            .iter()
            .map(|s| std::ffi::CString::new(*s).unwrap())
            .collect();
        let mut pointers: Vec<*const c_char> = owned.iter().map(|s| s.as_ptr()).collect();
        pointers.push(core::ptr::null());
        (owned, pointers)
    }

    /// `list` patched, as strings (`None`: passed on as it is).
    fn patched(list: &[&str]) -> Option<Vec<String>> {
        let (_owned, pointers) = envp(list);
        let mut words = [const { MaybeUninit::<usize>::uninit() }; WORDS];
        // SAFETY: a NULL-terminated array of the strings above.
        let envp = unsafe { patch(pointers.as_ptr(), OWN, &mut words) }?;
        let mut out = Vec::new();
        let mut at = envp;
        // SAFETY: `patch` wrote a NULL-terminated array of NUL-terminated strings.
        while !unsafe { *at }.is_null() {
            // SAFETY: as above.
            let entry = unsafe { CStr::from_ptr(*at) };
            out.push(entry.to_string_lossy().into_owned());
            // SAFETY: as above.
            at = unsafe { at.add(1) };
        }
        Some(out)
    }

    const MINE: &str = "LD_PRELOAD=/run/allocscope/rec-1-2/libsampler_preload.so";

    #[test]
    fn an_emptied_environment_gets_the_library_alone() {
        assert_eq!(patched(&[]).unwrap(), [MINE]);
    }

    #[test]
    fn their_preload_follows_the_library_in_its_place_and_the_rest_stays() {
        let env = ["HOME=/root", "LD_PRELOAD=libjemalloc.so.2", "A=b"];
        let theirs = format!("{MINE} libjemalloc.so.2");
        assert_eq!(patched(&env).unwrap(), ["HOME=/root", &theirs, "A=b"]);
        assert_eq!(patched(&["A=b", "LD_PRELOAD="]).unwrap(), ["A=b", MINE]);
        // The loader reads the last of two: that one is replaced, the first kept.
        let two = ["LD_PRELOAD=a.so", "B=c", "LD_PRELOAD=b.so"];
        let b = format!("{MINE} b.so");
        assert_eq!(patched(&two).unwrap(), ["LD_PRELOAD=a.so", "B=c", &b]);
    }

    #[test]
    fn only_an_environment_whose_last_preload_names_the_library_is_left_alone() {
        // The library's file is read (`access`) only when the environment lacks it: the
        // path here does not exist, so an environment that lacks it is passed on too.
        let needs = |list: &[&str]| {
            let (_owned, pointers) = envp(list);
            let mut last = None;
            for &p in &pointers[..pointers.len() - 1] {
                last = preload_value(p).or(last);
            }
            !last.is_some_and(|value| names(value, OWN))
        };
        assert!(!needs(&[MINE]));
        assert!(!needs(&[
            "LD_PRELOAD=x.so:/run/allocscope/rec-1-2/libsampler_preload.so"
        ]));
        assert!(!needs(&[&format!("{MINE} libjemalloc.so.2"), "A=b"]));
        assert!(needs(&[MINE, "LD_PRELOAD=other.so"]));
        assert!(needs(&[
            "LD_PRELOAD=/run/allocscope/rec-1-2/libsampler_preload.so.old"
        ]));
        assert!(needs(&["A=b"]));
    }

    #[test]
    fn an_environment_too_large_for_the_stack_is_passed_on() {
        let many: Vec<String> = (0..WORDS).map(|i| format!("V{i}=1")).collect();
        let list: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(patched(&list).is_none());
        // The pointers, the new entry, the NULL and the string's 8 words.
        let fits = WORDS - 2 - (LD_PRELOAD.len() + OWN.len() + 1).div_ceil(8) - 1;
        assert_eq!(patched(&list[..fits]).unwrap().len(), fits + 1);
        assert!(patched(&list[..fits + 2]).is_none());
    }
}
