//! Uprobe sessions (kernel ≥ 6.13): entry and return of the allocation functions as one
//! program, where the return runs only when the entry asks for it — so only sampled calls
//! (and reallocs of tracked blocks) pay the second trap. And `free` through a plain
//! `uprobe_multi` link, one per allocator file: unlike classic uprobes (one perf event
//! each, closed one grace period after another under a kernel-wide lock:
//! docs/performance.md, "What a recording cost, measured"), a link detaches all its probes
//! in one grace period, and links close concurrently.
//!
//! aya 0.14 can neither load a program with the `BPF_TRACE_UPROBE_SESSION` or
//! `BPF_TRACE_UPROBE_MULTI` attach type nor create `uprobe_multi` links, so this module
//! does both through bpf(2), on top of aya:
//! the object is parsed and relocated by aya-obj (aya's own parser) against the maps aya
//! already created — the session program shares every map and load-time global with the
//! other programs — and the resulting file descriptors are owned here and closed on drop,
//! which detaches the links. Any failure (older kernel, missing helper) is returned as an
//! error and the caller falls back to classic return probes.

use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    io,
    os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

use aya::{maps::Map, Ebpf};

/// `BPF_TRACE_UPROBE_SESSION` in enum bpf_attach_type (not in aya-obj 0.3's bindings).
pub(crate) const BPF_TRACE_UPROBE_SESSION: u32 = 57;
/// `BPF_TRACE_UPROBE_MULTI` in enum bpf_attach_type.
pub(crate) const BPF_TRACE_UPROBE_MULTI: u32 = 48;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;

/// A program loaded for `uprobe_multi` links (a session's, or a plain one's); links to it
/// are made per allocator file and process.
pub(crate) struct MultiProgram {
    program: OwnedFd,
    attach_type: u32,
}

/// `union bpf_attr` for BPF_PROG_LOAD, up to `expected_attach_type` (the kernel zero-fills
/// the rest of a shorter attr).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for BPF_LINK_CREATE with its `uprobe_multi` member.
#[repr(C)]
#[derive(Default)]
struct UprobeMultiLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    /// Explicit, so it is zero: the kernel rejects an attr with non-zero bytes past the
    /// fields it knows, and compiler padding may hold anything.
    _pad: u32,
}

fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    // SAFETY: bpf(2) reads (and for logs writes) `size_of::<T>()` bytes of a live attr whose
    // pointers reference buffers alive for the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *mut T,
            std::mem::size_of::<T>() as u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The data (and so the fd) behind each map aya created, by name.
fn map_fds(ebpf: &Ebpf) -> HashMap<String, i32> {
    ebpf.maps()
        .filter_map(|(name, map)| {
            let data = match map {
                Map::Array(d)
                | Map::HashMap(d)
                | Map::LruHashMap(d)
                | Map::PerCpuArray(d)
                | Map::PerCpuHashMap(d)
                | Map::RingBuf(d)
                | Map::Unsupported(d) => d,
                _ => return None,
            };
            Some((name.to_owned(), data.fd().as_fd().as_raw_fd()))
        })
        .collect()
}

/// The eBPF object parsed and relocated against the maps aya created, once: programs are
/// loaded from it for `uprobe_multi` links (each parse of the 2 MB object costs time:
/// docs/performance.md, "Figures quoted from the code").
pub(crate) struct Relocated {
    obj: aya_obj::Object,
}

impl Relocated {
    /// Parses `object` and points its map references at `ebpf`'s maps.
    pub(crate) fn new(ebpf: &Ebpf, object: &[u8]) -> io::Result<Relocated> {
        let mut obj = aya_obj::Object::parse(object).map_err(io::Error::other)?;
        let fds = map_fds(ebpf);
        let maps: Vec<(String, aya_obj::Map)> = obj
            .maps
            .iter()
            .map(|(name, map)| (name.clone(), map.clone()))
            .collect();
        let relocatable: Vec<(&str, i32, &aya_obj::Map)> = maps
            .iter()
            .map(|(name, map)| {
                let fd = fds.get(name).copied().ok_or_else(|| {
                    io::Error::other(format!("map {name} not created by the loader"))
                })?;
                Ok((name.as_str(), fd, map))
            })
            .collect::<io::Result<_>>()?;
        let text_sections: HashSet<usize> =
            obj.functions.keys().map(|(section, _)| *section).collect();
        obj.relocate_maps(relocatable.into_iter(), &text_sections)
            .map_err(io::Error::other)?;
        obj.relocate_calls(&text_sections)
            .map_err(io::Error::other)?;
        Ok(Relocated { obj })
    }

    /// Loads program `name` for links of `attach_type` ([`BPF_TRACE_UPROBE_SESSION`] or
    /// [`BPF_TRACE_UPROBE_MULTI`]). Its links carry each function's cookie
    /// ([`sampler_common::cookie`]: target slot, function, moved arguments, outer malloc).
    pub(crate) fn load(&self, name: &str, attach_type: u32) -> io::Result<MultiProgram> {
        load(&self.obj, name, attach_type)
    }
}

fn load(obj: &aya_obj::Object, name: &str, attach_type: u32) -> io::Result<MultiProgram> {
    let program_name = name;
    let program = obj
        .programs
        .get(program_name)
        .ok_or_else(|| io::Error::other(format!("{program_name} missing from the object")))?;
    let instructions = &obj.functions[&program.function_key()].instructions;
    let license = CString::new("GPL").expect("no NUL");
    let mut name = [0u8; 16];
    let shown = program_name.len().min(15);
    name[..shown].copy_from_slice(&program_name.as_bytes()[..shown]);
    let attr = |log: &mut [u8]| ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: instructions.len() as u32,
        insns: instructions.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: u32::from(!log.is_empty()),
        log_size: log.len() as u32,
        log_buf: if log.is_empty() {
            0
        } else {
            log.as_mut_ptr() as u64
        },
        prog_name: name,
        expected_attach_type: attach_type,
        ..Default::default()
    };
    // Without a log first: a verbose log of a program this size overflows any buffer, and
    // the kernel reports the overflow as a failure. Only a failure is loaded again to say why.
    let program_fd = bpf(BPF_PROG_LOAD, &mut attr(&mut [])).map_err(|e| {
        let mut log = vec![0u8; 1 << 20];
        let _ = bpf(BPF_PROG_LOAD, &mut attr(&mut log));
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let verifier = String::from_utf8_lossy(&log[..end]);
        let tail: Vec<&str> = verifier.lines().rev().take(3).collect();
        io::Error::new(
            e.kind(),
            format!(
                "loading {program_name}: {e} (verifier: {})",
                tail.join(" | ")
            ),
        )
    })?;
    Ok(MultiProgram {
        program: program_fd,
        attach_type,
    })
}

impl MultiProgram {
    /// The loaded program's descriptor.
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd as _;
        self.program.as_fd()
    }

    /// Links the program at `offsets` of the file at `path` (each with its cookie), in
    /// process `pid` only (0: every process). Closing the returned link detaches it.
    pub(crate) fn link(
        &self,
        path: &Path,
        pid: u32,
        offsets: &[u64],
        cookies: &[u64],
    ) -> io::Result<OwnedFd> {
        self.link_with_semaphores(path, pid, offsets, cookies, None)
    }

    /// [`Self::link`], raising each site's USDT semaphore (`semaphores`: one file offset
    /// per site, 0 for none) while the link is attached, as the kernel does for a uprobe's
    /// reference counter.
    pub(crate) fn link_with_semaphores(
        &self,
        path: &Path,
        pid: u32,
        offsets: &[u64],
        cookies: &[u64],
        semaphores: Option<&[u64]>,
    ) -> io::Result<OwnedFd> {
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
        if semaphores.is_some_and(|s| s.len() != offsets.len()) {
            return Err(io::Error::other("one semaphore offset per site"));
        }
        let mut attr = UprobeMultiLinkAttr {
            prog_fd: self.program.as_raw_fd() as u32,
            attach_type: self.attach_type,
            path: c_path.as_ptr() as u64,
            offsets: offsets.as_ptr() as u64,
            ref_ctr_offsets: semaphores.map_or(0, |s| s.as_ptr() as u64),
            cookies: cookies.as_ptr() as u64,
            cnt: offsets.len() as u32,
            pid,
            ..Default::default()
        };
        bpf(BPF_LINK_CREATE, &mut attr).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "uprobe_multi link for pid {pid} in {} at offsets {offsets:x?}: {e}",
                    path.display()
                ),
            )
        })
    }
}
