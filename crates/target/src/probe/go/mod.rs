//! Go executables, probed where their runtime's own heap profiler sees a sampled block.
//!
//! A Go program allocates through its runtime, not through `malloc`: a uprobe on
//! `runtime.mallocgc` would trap on every allocation. But the runtime already samples by
//! bytes (a per-P countdown of mean `runtime.MemProfileRate`, 512 KiB unless the program
//! says otherwise) and calls its memory profiler only for sampled blocks:
//! `runtime.mProf_Malloc(…, p, size…)` when one is allocated, `runtime.freeSpecial(s, p,
//! size)` (then `runtime.mProf_Free`) when the sweeper frees it. Those are probed (entry
//! only: a return probe's trampoline in a goroutine's stack breaks the runtime's stack
//! copying and tracebacks), described as USDT-like sites whose arguments the eBPF program
//! reads by the same specs as another producer's ([`crate::probe::usdt`]):
//!
//! * `alloc`: the block and its size in the registers Go's internal ABI gives them (`rax`,
//!   `rbx`, `rcx`… in order; which argument they are depends on the Go version), and the
//!   rate read from `runtime.MemProfileRate` at its distance from the probed instruction;
//! * `freeing`: `freeSpecial`'s block (`rbx`), a free where its record's kind (`[rax+D]`,
//!   one byte) is the heap profile's, the place and value read from the store
//!   `setprofilebucket` makes (the kinds are renumbered in nearly every release); where
//!   that store is not found, the block is kept per thread and
//! * `freed`: `mProf_Free`, called by `freeSpecial` only for a sampled block's record, says
//!   it was one.
//!
//! Pure: bytes in, sites out. The Go version comes from the `.go.buildinfo` section (Go ≥
//! 1.18 writes it inline); a version whose layout is not known here is refused by name
//! rather than guessed.
//!
//! Everything allocscope knows of Go runtimes lives in this folder: which runtime a file
//! is and its probe sites (here), the runtime's types read from its DWARF ([`dwarf`]), its
//! exact totals ([`memstats`]), its heap profile's buckets ([`buckets`]) and the reader
//! that turns them into samples with no probe in the program ([`reader`]).

pub mod buckets;
mod dwarf;
pub mod memstats;
pub mod reader;

use object::{Object as _, ObjectSection as _};
use sampler_common::usdt::{
    UsdtArgument, UsdtSpec, KIND_RUNTIME_ALLOC, KIND_RUNTIME_FREED, KIND_RUNTIME_FREEING,
    KIND_RUNTIME_FREE_IF, MAX_ARGUMENTS, REGISTER_RIP,
};

use crate::probe::usdt::{parse_arguments, Producer, Site};

/// The provider name Go runtime sites are reported under.
pub const PROVIDER: &str = "go runtime";

/// What a Go runtime's description adds where the linker turned heap profiling off.
pub const PROFILING_OFF: &str = "heap profiling off unless the program sets runtime.MemProfileRate";

/// What a Go runtime's description adds where its heap profile is read, not probed
/// ([`buckets`]).
pub const READ: &str = "its heap profile read every 100 ms, no probe in the process";

/// Whether `allocator`, as a process's allocators are described to users
/// ([`crate::probe::allocator::Allocator::describe`]), is a Go runtime: `go runtime (go1.19.8) (…)`.
pub fn describes(allocator: &str) -> bool {
    allocator
        .strip_prefix(PROVIDER)
        .is_some_and(|rest| rest.starts_with(" ("))
}

/// The oldest and newest Go releases whose runtime layout is known here.
pub(crate) const KNOWN: (GoVersion, GoVersion) = (GoVersion(1, 18), GoVersion(1, 27));

/// A Go release, `go1.N` (patch releases keep the layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct GoVersion(pub u32, pub u32);

impl std::fmt::Display for GoVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "go{}.{}", self.0, self.1)
    }
}

/// Where a Go runtime keeps what allocscope reads of it (the file's virtual addresses:
/// a process's are these plus its load bias, [`Producer::bias_in`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Places {
    /// `runtime.MemProfileRate`, for a look at whether it samples.
    pub rate_at: u64,
    /// Its exact allocation totals, or why they cannot be read.
    pub memstats: Result<memstats::Layout, String>,
    /// Its heap profile's buckets, read instead of probing it where they can be, or why
    /// they cannot be.
    pub buckets: Result<Box<buckets::Layout>, String>,
}

/// What a Go executable offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GoRuntime {
    /// Its runtime's sampled-allocation and sampled-free paths, as producer sites.
    Probed {
        /// The full version string (`go1.19.8`).
        version: String,
        /// The sites.
        producer: Producer,
        /// Where its runtime keeps what is read of it.
        places: Places,
        /// The linker turned the runtime's heap profiling off (the program never calls
        /// `runtime.MemProfile`, e.g. through `runtime/pprof`): nothing is sampled unless
        /// the program sets `runtime.MemProfileRate` itself.
        profiling_off: bool,
    },
    /// A Go executable allocscope cannot probe, and why (said to the user).
    Refused(String),
}

/// The runtime of `elf` if it is a Go executable (`None`: not Go).
pub(crate) fn runtime(elf: &[u8]) -> Option<GoRuntime> {
    let file = object::File::parse(elf).ok()?;
    let buildinfo = file.section_by_name(".go.buildinfo")?;
    let version = buildinfo.data().ok().and_then(build_version);
    let Some(version) = version else {
        return Some(GoRuntime::Refused(
            "a Go executable older than go1.18 (no inline build information): its runtime's \
             layout is not known to allocscope"
                .into(),
        ));
    };
    let Some(release) = parse_version(&version) else {
        return Some(GoRuntime::Refused(format!(
            "{version}: not a Go version allocscope can read"
        )));
    };
    if file.architecture() != object::Architecture::X86_64 {
        return Some(GoRuntime::Refused(format!(
            "{version}: only x86-64 is supported"
        )));
    }
    let Some(layout) = Layout::of(release) else {
        return Some(GoRuntime::Refused(format!(
            "{version}: its runtime's layout is not known to this allocscope (known: {} to {})",
            KNOWN.0, KNOWN.1
        )));
    };
    Some(match sites(&file, layout) {
        Ok((producer, places, profiling_off)) => GoRuntime::Probed {
            version,
            producer,
            places,
            profiling_off,
        },
        Err(missing) => GoRuntime::Refused(format!("{version}: {missing}")),
    })
}

/// Where a release's runtime keeps the arguments the probes read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    /// `mProf_Malloc`'s block and size: `(p, size)` until go1.22, `(mp, p, size…)` since.
    alloc_registers: [&'static str; 2],
}

impl Layout {
    fn of(release: GoVersion) -> Option<Layout> {
        if release < KNOWN.0 || release > KNOWN.1 {
            return None;
        }
        // Go's internal ABI (go1.17+ on amd64) passes integer arguments in rax, rbx, rcx…
        let alloc_registers = if release < GoVersion(1, 23) {
            ["rax", "rbx"]
        } else {
            ["rbx", "rcx"]
        };
        Some(Layout { alloc_registers })
    }
}

/// The runtime's sites in `file`, where it keeps what is read of it, and whether the
/// linker turned heap profiling off; or what is missing.
fn sites(file: &object::File, layout: Layout) -> Result<(Producer, Places, bool), String> {
    let find = |names: &[&str]| crate::probe::elf::symbol_in(file, names);
    let symbol = |names: &[&str]| {
        find(names).ok_or_else(|| {
            format!(
                "no {} symbol (a stripped executable): its runtime cannot be probed",
                names[0]
            )
        })
    };
    let malloc = symbol(&["runtime.mProf_Malloc"])?;
    let (rate, _) = symbol(&["runtime.MemProfileRate"])?;
    let freeing = find(&["runtime.freeSpecial", "runtime.freespecial"]);
    let freed = find(&["runtime.mProf_Free"]);
    let [block, size] = layout.alloc_registers;
    let alloc = place(file, malloc, &[block, size])?;
    // The rate is read relative to the probed instruction, wherever the file is loaded.
    let distance = rate.wrapping_sub(malloc.0 + alloc.offset) as i64;
    let mut sites = vec![site(
        file,
        ("alloc", malloc.0, alloc),
        &format!("8@%{block} 8@%{size} 8@{distance}(%rip)"),
        KIND_RUNTIME_ALLOC,
    )?];
    // A free: freeSpecial names the block, and its record's kind says it was a sampled
    // one's (the kind's place and value as setprofilebucket writes them); or, where that
    // store is not found, mProf_Free says so after it on the same thread (a second probe).
    let profile_kind = find(&["runtime.setprofilebucket"]).and_then(|f| profile_kind(file, f));
    match (freeing, profile_kind, freed) {
        (Some(freeing), Some((at, kind)), _) => {
            let placed = place(file, freeing, &["rax", "rbx"])?;
            let arguments = format!("8@%rbx 1@{at}(%rax)");
            let mut free = site(
                file,
                ("freeing", freeing.0, placed),
                &arguments,
                KIND_RUNTIME_FREE_IF,
            )?;
            free.1.guard = u64::from(kind);
            sites.push(free);
        }
        (Some(freeing), None, Some(freed)) => {
            let placed = place(file, freeing, &["rbx"])?;
            sites.push(site(
                file,
                ("freeing", freeing.0, placed),
                "8@%rbx",
                KIND_RUNTIME_FREEING,
            )?);
            let placed = place(file, freed, &[])?;
            sites.push(site(
                file,
                ("freed", freed.0, placed),
                "",
                KIND_RUNTIME_FREED,
            )?);
        }
        _ => {}
    }
    let (memstats, buckets) = readers(file);
    let profiling_off = find(&["runtime.disableMemoryProfiling"])
        .and_then(|(at, _)| byte_at(file, at))
        .is_some_and(|b| b != 0);
    Ok((
        Producer {
            provider: PROVIDER.to_owned(),
            sites,
            detail: None,
            pie_segments: (file.kind() != object::ObjectKind::Executable)
                .then(|| crate::sys::maps::loadable_segments(file)),
        },
        Places {
            rate_at: rate,
            memstats,
            buckets,
        },
        profiling_off,
    ))
}

/// Where `file`'s runtime keeps its exact totals and its heap profile's buckets (or why
/// they cannot be read), from one reading of its DWARF.
type Readers = (
    Result<memstats::Layout, String>,
    Result<Box<buckets::Layout>, String>,
);

fn readers(file: &object::File) -> Readers {
    let wanted: Vec<&str> = memstats::STRUCTURES
        .iter()
        .chain(&buckets::STRUCTURES)
        .copied()
        .collect();
    match dwarf::Types::read(file, &wanted) {
        Ok(types) => (
            memstats::layout(file, &types),
            buckets::layout(file, &types).map(Box::new),
        ),
        Err(why) => (Err(why.clone()), Err(why)),
    }
}

/// Where in the function at `(address, size)` the probe goes: Go's prologue first compares
/// the stack pointer with the goroutine's stack bound and branches to grow it; the branch
/// is an instruction the kernel emulates, where the entry's `lea`/`cmp` would be
/// single-stepped (a second trap, far slower than the first: docs/performance.md, "Figures
/// quoted from the code"). The registers `reads` hold the arguments there still.
fn place(
    file: &object::File,
    (address, size): (u64, u64),
    reads: &[&str],
) -> Result<super::prologue::Placement, String> {
    use iced_x86::Register;
    let registers: Vec<Register> = reads
        .iter()
        .map(|name| match *name {
            "rax" => Register::RAX,
            "rbx" => Register::RBX,
            _ => Register::RCX,
        })
        .collect();
    let code = crate::probe::elf::code_at(file, address, size)
        .ok_or_else(|| format!("the code at {address:#x} is in no section"))?;
    Ok(super::prologue::choose_in_place(code, &registers))
}

/// One site, probed at `placement` in the function `name` at `address`, with its
/// argument spec.
fn site(
    file: &object::File,
    (name, address, placement): (&str, u64, super::prologue::Placement),
    arguments: &str,
    kind: u32,
) -> Result<(Site, UsdtSpec), String> {
    let entry = crate::probe::elf::file_offset_of(file, address)
        .ok_or_else(|| format!("runtime {name} site at {address:#x} is in no section"))?;
    // The rate, `8@D(%rip)`: memory at the probed instruction plus D (a USDT note's
    // `%rip` would mean the next instruction's: the note parser does not take it).
    let mut parsed = Vec::new();
    for word in arguments.split_whitespace() {
        let relative = word
            .strip_prefix("8@")
            .and_then(|w| w.strip_suffix("(%rip)"));
        if let Some(distance) = relative {
            parsed.push(UsdtArgument {
                value: distance
                    .parse()
                    .map_err(|_| format!("{name}: cannot read {word}"))?,
                register: REGISTER_RIP,
                deref: 1,
                size: 8,
                ..UsdtArgument::default()
            });
        } else {
            let argument = parse_arguments(word).unwrap_or_default();
            parsed.extend(argument.into_iter().take(1));
        }
    }
    let mut spec = UsdtSpec {
        kind,
        count: parsed.len().min(MAX_ARGUMENTS) as u32,
        ..UsdtSpec::default()
    };
    for (slot, argument) in spec.arguments.iter_mut().zip(parsed) {
        *slot = argument;
    }
    let site = Site {
        provider: PROVIDER.to_owned(),
        name: name.to_owned(),
        arguments: arguments.to_owned(),
        file_offset: entry + placement.offset,
        optimizable: false,
        semaphore: None,
        probed: Some(placement),
    };
    Ok((site, spec))
}

/// Where a heap-profile record keeps its kind and which kind it is: the one byte store of
/// a constant through a register that `runtime.setprofilebucket` makes
/// (`s.special.kind = _KindSpecialProfile`: `mov byte [rbx+0xa], 2` in go1.19, `[rbx+0x10],
/// 4` in go1.27). `None` unless exactly one such store is found.
fn profile_kind(file: &object::File, (address, size): (u64, u64)) -> Option<(i64, u8)> {
    kind_store(crate::probe::elf::code_at(file, address, size)?)
}

/// The one `mov byte [reg+D], imm8` in `code`, as `(D, imm8)`.
fn kind_store(code: &[u8]) -> Option<(i64, u8)> {
    use iced_x86::{Code, Decoder, DecoderOptions, OpKind, Register};
    let mut stores = Decoder::with_ip(64, code, 0, DecoderOptions::NONE)
        .into_iter()
        .filter(|i| {
            i.code() == Code::Mov_rm8_imm8
                && i.op0_kind() == OpKind::Memory
                && i.memory_base().is_gpr64()
                && i.memory_index() == Register::None
        })
        .map(|i| (i.memory_displacement64() as i64, i.immediate8()));
    let first = stores.next()?;
    stores.next().is_none().then_some(first)
}

/// The byte at virtual `address` as the file initialises it.
fn byte_at(file: &object::File, address: u64) -> Option<u8> {
    let section = file
        .sections()
        .find(|s| (s.address()..s.address() + s.size()).contains(&address))?;
    // A zero-initialised variable (.noptrbss) has no bytes in the file: false.
    match section.data_range(address, 1) {
        Ok(Some(bytes)) => bytes.first().copied(),
        _ => Some(0),
    }
}

/// The Go version (`go1.19.8`) in a `.go.buildinfo` section written inline (Go ≥ 1.18):
/// a 32-byte header (magic, pointer size, flags with bit 2 set) then the version as a
/// uvarint-prefixed string.
pub(crate) fn build_version(section: &[u8]) -> Option<String> {
    const MAGIC: &[u8] = b"\xff Go buildinf:";
    const INLINE: u8 = 2;
    if !section.starts_with(MAGIC) || section.get(15)? & INLINE == 0 {
        return None;
    }
    let mut at = 32;
    let (mut length, mut shift) = (0usize, 0u32);
    loop {
        let byte = *section.get(at)?;
        at += 1;
        length |= usize::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
    let text = section.get(at..at.checked_add(length)?)?;
    let version = std::str::from_utf8(text).ok()?;
    version.starts_with("go").then(|| version.to_owned())
}

/// `go1.19.8`, `go1.23rc1`, `go1.22.0 X:boringcrypto` → its release.
pub(crate) fn parse_version(version: &str) -> Option<GoVersion> {
    let rest = version.strip_prefix("go")?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some(GoVersion(major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buildinfo(version: &str) -> Vec<u8> {
        let mut section = b"\xff Go buildinf:".to_vec();
        section.extend([8, 2]);
        section.resize(32, 0);
        section.push(version.len() as u8);
        section.extend(version.as_bytes());
        section.extend(b"\x00more");
        section
    }

    #[test]
    fn versions_are_read_from_inline_build_information() {
        assert_eq!(
            build_version(&buildinfo("go1.19.8")).as_deref(),
            Some("go1.19.8")
        );
        let mut old = buildinfo("go1.16");
        old[15] = 0;
        assert_eq!(
            build_version(&old),
            None,
            "pointer-style (go1.17 and older)"
        );
        assert_eq!(build_version(b"\xff Go buildinf:"), None, "truncated");
        let mut long = buildinfo("");
        long.truncate(32);
        long.extend([0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
        assert_eq!(build_version(&long), None, "runaway length");
    }

    #[test]
    fn releases_choose_the_argument_registers_or_are_refused() {
        assert_eq!(parse_version("go1.19.8"), Some(GoVersion(1, 19)));
        assert_eq!(parse_version("go1.23rc1"), Some(GoVersion(1, 23)));
        assert_eq!(
            parse_version("go1.22.0 X:boringcrypto"),
            Some(GoVersion(1, 22))
        );
        assert_eq!(parse_version("devel +abc"), None);
        let registers = |v| Layout::of(v).map(|l| l.alloc_registers);
        assert_eq!(registers(GoVersion(1, 19)), Some(["rax", "rbx"]));
        assert_eq!(registers(GoVersion(1, 22)), Some(["rax", "rbx"]));
        assert_eq!(registers(GoVersion(1, 23)), Some(["rbx", "rcx"]));
        assert_eq!(registers(GoVersion(1, 27)), Some(["rbx", "rcx"]));
        assert_eq!(registers(GoVersion(1, 17)), None);
        assert_eq!(registers(GoVersion(1, 28)), None);
    }

    /// Go's prologues (go1.19's `mProf_Malloc` with a large frame, `freeSpecial` with a
    /// small one): the probe goes on the stack check's branch, emulated, the arguments
    /// still in their registers.
    #[test]
    fn probes_go_on_the_stack_checks_branch() {
        use iced_x86::Register;
        let large = [
            0x4c, 0x8d, 0xa4, 0x24, 0x10, 0xff, 0xff, 0xff, // lea r12, [rsp-0xf0]
            0x4d, 0x3b, 0x66, 0x10, // cmp r12, [r14+0x10]
            0x0f, 0x86, 0xaa, 0x01, 0x00, 0x00, // jbe morestack
            0x48, 0x81, 0xec, 0x70, 0x01, 0x00, 0x00, // sub rsp, 0x170
        ];
        let placed =
            super::super::prologue::choose_in_place(&large, &[Register::RAX, Register::RBX]);
        assert_eq!((placed.offset, placed.emulated), (0xc, true), "{placed:?}");
        assert!(placed.moved.is_empty());
        let small = [
            0x49, 0x3b, 0x66, 0x10, // cmp rsp, [r14+0x10]
            0x0f, 0x86, 0x0a, 0x01, 0x00, 0x00, // jbe morestack
            0x48, 0x83, 0xec, 0x30, // sub rsp, 0x30
        ];
        let placed = super::super::prologue::choose_in_place(&small, &[Register::RBX]);
        assert_eq!((placed.offset, placed.emulated), (4, true), "{placed:?}");
    }

    /// setprofilebucket's store of the kind, as go1.19 and go1.27 compile it, among other
    /// instructions; two such stores are not guessed between.
    #[test]
    fn the_profile_records_kind_is_read_from_its_store() {
        let go119 = [
            0x48, 0x89, 0x44, 0x24, 0x08, // mov [rsp+8], rax
            0xc6, 0x43, 0x0a, 0x02, // mov byte [rbx+0xa], 2
            0x48, 0x89, 0x4b, 0x10, // mov [rbx+0x10], rcx
        ];
        assert_eq!(kind_store(&go119), Some((0xa, 2)));
        let go127 = [0xc6, 0x43, 0x10, 0x04, 0xc3]; // mov byte [rbx+0x10], 4; ret
        assert_eq!(kind_store(&go127), Some((0x10, 4)));
        let twice = [0xc6, 0x43, 0x10, 0x04, 0xc6, 0x43, 0x11, 0x01];
        assert_eq!(kind_store(&twice), None);
        assert_eq!(kind_store(&[0xc3]), None);
    }

    #[test]
    fn go_runtimes_are_told_by_their_description() {
        assert!(describes("go runtime (go1.19.8) (/usr/bin/x)"));
        assert!(describes(&format!(
            "go runtime (go1.27.3, {PROFILING_OFF}) (/x)"
        )));
        assert!(!describes("glibc (/usr/lib/x86_64-linux-gnu/libc.so.6)"));
        assert!(!describes("go runtime"));
    }

    #[test]
    fn other_files_are_not_go() {
        let own = std::fs::read(crate::sys::own::EXE).unwrap();
        assert_eq!(runtime(&own), None);
        assert_eq!(runtime(b"not an elf"), None);
    }
}
