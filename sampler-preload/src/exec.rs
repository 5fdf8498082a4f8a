//! Children keep the library whatever environment they are given: the exec family and
//! `posix_spawn` pass on an environment whose `LD_PRELOAD` still names this library.
//!
//! Why: a command's tree is counted in-process because every process in it inherits
//! `LD_PRELOAD`. A program that sets its own (`LD_PRELOAD=libjemalloc.so.2 ./prog` in a
//! shell script) or clears its environment (`env -i`) would start a child without the
//! library, which allocscope could then only probe once it noticed it, late and trap by
//! trap. Here the child's `LD_PRELOAD` becomes this library's path followed by what the
//! program set (the library must come first: it forwards to an allocator preloaded after
//! it); every other variable stays as the program set it, and an environment that already
//! names the library is passed on untouched.
//!
//! Only where the library was preloaded: opened into a running process (`-p`) these
//! definitions are in its own scope and nobody calls them. The new environment is built
//! on the caller's stack, never on the heap or in a mapping: `execve` may run in a
//! `vfork` child, which shares its parent's memory (a mapping made there would stay in
//! the parent for good). An environment too large for [`WORDS`] is passed on as it is.
//! `execl`, `execlp` and `execle` (variadic: not definable here) reach the C library
//! directly.

use core::{
    ffi::{c_char, c_int, c_void},
    sync::atomic::{AtomicUsize, Ordering},
};

use crate::next;

/// The words of stack a new environment may take: its pointers, then its `LD_PRELOAD`.
/// 4 KiB (a C library's own `execvp` takes `PATH_MAX` of stack for its search): room
/// for ~400 variables and a long `LD_PRELOAD`.
const WORDS: usize = 512;

const LD_PRELOAD: &[u8] = b"LD_PRELOAD=";

type Envp = *const *const c_char;

extern "C" {
    static environ: Envp;
}

/// The next definitions, found on first use (0: not yet).
static EXECVE: AtomicUsize = AtomicUsize::new(0);
static EXECVPE: AtomicUsize = AtomicUsize::new(0);
static EXECVEAT: AtomicUsize = AtomicUsize::new(0);
static FEXECVE: AtomicUsize = AtomicUsize::new(0);
static POSIX_SPAWN: AtomicUsize = AtomicUsize::new(0);
static POSIX_SPAWNP: AtomicUsize = AtomicUsize::new(0);

/// The next definition of `name`, cached in `slot`; `None` (errno ENOSYS) if there is none.
fn next_of(slot: &AtomicUsize, name: &core::ffi::CStr) -> Option<usize> {
    let mut found = slot.load(Ordering::Relaxed);
    if found == 0 {
        found = next::lookup(name);
        slot.store(found, Ordering::Relaxed);
    }
    if found == 0 {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return None;
    }
    Some(found)
}

/// The path the loader opened this library from, if it was preloaded from an absolute
/// path (what a child's `LD_PRELOAD` must name).
fn own_path() -> Option<&'static [u8]> {
    if next::opened() || next::in_executable() {
        return None;
    }
    // SAFETY: all-zero is a valid Dl_info.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: dladdr fills the struct we own.
    if unsafe { libc::dladdr(next::own_address(), &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string owned by the loader, kept while the library is.
    let path = unsafe { core::ffi::CStr::from_ptr(info.dli_fname) }.to_bytes();
    (path.first() == Some(&b'/')).then_some(path)
}

/// Runs `run` with `envp`, or with a copy on this stack whose `LD_PRELOAD` names the
/// library where `envp`'s does not.
fn with_library<R>(envp: Envp, run: impl FnOnce(Envp) -> R) -> R {
    let mut words = [0usize; WORDS];
    let patched = own_path().and_then(|own| {
        // SAFETY: `envp` is the caller's NULL-terminated environment (or null: empty).
        let entries = unsafe { entries(envp) };
        patch(entries, own, &mut words)
    });
    run(patched.unwrap_or(envp))
}

/// `envp`'s entries (empty for a null `envp`, which Linux takes as an empty environment).
///
/// # Safety
/// `envp` is null or a NULL-terminated array of NUL-terminated strings.
unsafe fn entries<'a>(envp: Envp) -> &'a [*const c_char] {
    if envp.is_null() {
        return &[];
    }
    let mut n = 0;
    // SAFETY: the array is NULL-terminated (the caller's promise).
    while !unsafe { *envp.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: `n` valid entries before the NULL.
    unsafe { core::slice::from_raw_parts(envp, n) }
}

/// The bytes of a NUL-terminated string.
fn bytes<'a>(entry: *const c_char) -> &'a [u8] {
    // SAFETY: an environment entry: a NUL-terminated string.
    unsafe { core::ffi::CStr::from_ptr(entry) }.to_bytes()
}

/// Whether `value` (an `LD_PRELOAD`: paths separated by spaces or colons) names `own`.
fn names(value: &[u8], own: &[u8]) -> bool {
    value
        .split(|&b| b == b' ' || b == b':')
        .any(|path| path == own)
}

/// `entries` with an `LD_PRELOAD` that names `own` first, laid out in `words` (the
/// pointers, then the new `LD_PRELOAD` string); `None` if it names `own` already or does
/// not fit.
fn patch(entries: &[*const c_char], own: &[u8], words: &mut [usize]) -> Option<Envp> {
    let theirs = entries
        .iter()
        .map(|&entry| bytes(entry))
        .find_map(|entry| entry.strip_prefix(LD_PRELOAD));
    if theirs.is_some_and(|value| names(value, own)) {
        return None;
    }
    let theirs = theirs.filter(|value| !value.is_empty());
    let kept = entries
        .iter()
        .filter(|&&entry| !bytes(entry).starts_with(LD_PRELOAD));
    let string_len = LD_PRELOAD.len() + own.len() + theirs.map_or(0, |t| 1 + t.len()) + 1;
    let pointers = kept.clone().count() + 2;
    let string_words = string_len.div_ceil(size_of::<usize>());
    if pointers + string_words > words.len() {
        return None;
    }
    let (pointer_words, string_area) = words.split_at_mut(pointers);
    // SAFETY: `string_area` is at least `string_words` words, viewed as bytes.
    let string = unsafe {
        core::slice::from_raw_parts_mut(string_area.as_mut_ptr().cast::<u8>(), string_len)
    };
    let mut at = 0;
    for part in [LD_PRELOAD, own] {
        string[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    if let Some(theirs) = theirs {
        string[at] = b' ';
        string[at + 1..at + 1 + theirs.len()].copy_from_slice(theirs);
        at += 1 + theirs.len();
    }
    string[at] = 0;
    let string = string.as_ptr() as usize;
    let mut slots = pointer_words.iter_mut();
    // The entries first in `zip`: a slot is taken only for an entry.
    for (entry, slot) in kept.zip(slots.by_ref()) {
        *slot = *entry as usize;
    }
    // The new LD_PRELOAD, then the terminating NULL (the words start zeroed).
    if let Some(slot) = slots.next() {
        *slot = string;
    }
    Some(pointer_words.as_ptr().cast())
}

/// `execve` with the library kept in the child's `LD_PRELOAD`.
///
/// # Safety
/// As `execve(2)`.
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: Envp, envp: Envp) -> c_int {
    let Some(next) = next_of(&EXECVE, c"execve") else {
        return -1;
    };
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
    let Some(next) = next_of(&EXECVPE, c"execvpe") else {
        return -1;
    };
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
    let Some(next) = next_of(&EXECVEAT, c"execveat") else {
        return -1;
    };
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
    let Some(next) = next_of(&FEXECVE, c"fexecve") else {
        return -1;
    };
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
    name: &core::ffi::CStr,
    args: (
        *mut libc::pid_t,
        *const c_char,
        *const c_void,
        *const c_void,
    ),
    argv: Envp,
    envp: Envp,
) -> c_int {
    let Some(next) = next_of(slot, name) else {
        return libc::ENOSYS;
    };
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

    fn env(list: &[&core::ffi::CStr]) -> Vec<*const c_char> {
        list.iter().map(|s| s.as_ptr()).collect()
    }

    fn read(envp: Envp) -> Vec<String> {
        // SAFETY: a NULL-terminated array built by `patch`.
        unsafe { entries(envp) }
            .iter()
            .map(|&e| String::from_utf8_lossy(bytes(e)).into_owned())
            .collect()
    }

    const OWN: &[u8] = b"/run/allocscope/rec-1-2/libsampler_preload.so";

    #[test]
    fn an_emptied_environment_gets_the_library_alone() {
        let mut words = [0usize; WORDS];
        let envp = patch(&[], OWN, &mut words).unwrap();
        assert_eq!(
            read(envp),
            ["LD_PRELOAD=/run/allocscope/rec-1-2/libsampler_preload.so"]
        );
    }

    #[test]
    fn their_preload_follows_the_library_and_the_rest_stays() {
        let entries = env(&[c"HOME=/root", c"LD_PRELOAD=libjemalloc.so.2", c"A=b"]);
        let mut words = [0usize; WORDS];
        let envp = patch(&entries, OWN, &mut words).unwrap();
        assert_eq!(
            read(envp),
            [
                "HOME=/root",
                "A=b",
                "LD_PRELOAD=/run/allocscope/rec-1-2/libsampler_preload.so libjemalloc.so.2"
            ]
        );
    }

    #[test]
    fn an_environment_naming_the_library_is_left_alone() {
        let mut words = [0usize; WORDS];
        for value in [
            c"LD_PRELOAD=/run/allocscope/rec-1-2/libsampler_preload.so",
            c"LD_PRELOAD=x.so:/run/allocscope/rec-1-2/libsampler_preload.so",
            c"LD_PRELOAD=/run/allocscope/rec-1-2/libsampler_preload.so libjemalloc.so.2",
        ] {
            assert!(patch(&env(&[c"A=b", value]), OWN, &mut words).is_none());
        }
        // A path that only starts like it is another library.
        let other = env(&[c"LD_PRELOAD=/run/allocscope/rec-1-2/libsampler_preload.so.old"]);
        assert!(patch(&other, OWN, &mut words).is_some());
    }

    #[test]
    fn an_environment_too_large_for_the_stack_is_passed_on() {
        let long: Vec<std::ffi::CString> = (0..WORDS)
            .map(|i| std::ffi::CString::new(format!("V{i}=1")).unwrap())
            .collect();
        let entries: Vec<*const c_char> = long.iter().map(|s| s.as_ptr()).collect();
        let mut words = [0usize; WORDS];
        assert!(patch(&entries, OWN, &mut words).is_none());
        // One fewer pointer than the room, but no room left for the string.
        assert!(patch(&entries[..WORDS - 3], OWN, &mut words).is_none());
        let fits = WORDS - 2 - LD_PRELOAD.len().div_ceil(8) - OWN.len().div_ceil(8) - 1;
        let envp = patch(&entries[..fits], OWN, &mut words).unwrap();
        assert_eq!(read(envp).len(), fits + 1);
    }
}
