//! USDT probe sites (`sys/sdt.h` notes, `.note.stapsdt`) of an ELF file, and which of them
//! make a file an allocation front end: allocscope's own in-process library
//! (`allocscope:alloc`/`free`, see [`sampler_common::preload`]), or another program's
//! allocator that samples itself and reports through the OpenTelemetry memory-profiling
//! contract (`otel_memory:alloc(ptr, size, weight)`, `otel_memory:free(ptr)`) or
//! libdatadog's equivalent (`ddheap:*`), whose argument strings are parsed here into the
//! [`UsdtSpec`]s the eBPF program reads.
//!
//! Pure: bytes in, sites out. A site's address is where the note says, moved by however far
//! the `.stapsdt.base` section is from where the note recorded it (prelinking), and turned
//! into a file offset (what uprobes attach to). Where the site is the `nop; nop5` pair
//! libbpf's `usdt.h` emits, [`Site::optimizable`] says so: probing the 5-byte nop instead
//! lets Linux ≥ 6.18 replace the trap by a call (see [`crate::probe::attach`]).

use object::{Object as _, ObjectSection as _, ObjectSegment as _};
use sampler_common::{
    cookie::Register,
    usdt::{UsdtArgument, UsdtSpec, KIND_ALLOC, KIND_FREE, MAX_ARGUMENTS, REGISTER_RSP},
};

/// One probe site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// Provider (`allocscope`, `otel_memory`…).
    pub provider: String,
    /// Probe name (`alloc`, `free`).
    pub name: String,
    /// Its arguments as the note describes them (`8@%rdi 8@%rsi`).
    pub arguments: String,
    /// File offset of the site's first instruction.
    pub file_offset: u64,
    /// Whether a 5-byte nop follows a 1-byte nop there (probe `file_offset + 1`).
    pub optimizable: bool,
    /// File offset of its semaphore, if it has one: the probe fires only while the
    /// semaphore is non-zero, which the kernel raises for each attached consumer.
    pub semaphore: Option<u64>,
    /// The instruction probed where it is not a USDT `nop` (a Go runtime function's), as
    /// [`super::prologue`] chose it in the function (`file_offset` includes its offset).
    pub probed: Option<super::prologue::Placement>,
}

/// The 1-byte nop and the 5-byte nop of an optimizable site.
const NOP_NOP5: [u8; 6] = [0x90, 0x0f, 0x1f, 0x44, 0x00, 0x00];
/// The note type of a USDT site.
const NT_STAPSDT: u32 = 3;

/// Every USDT site of an ELF file (none if it is not one, or has none).
pub(crate) fn sites(elf: &[u8]) -> Vec<Site> {
    let Ok(file) = object::File::parse(elf) else {
        return Vec::new();
    };
    let Some(notes) = file
        .section_by_name(".note.stapsdt")
        .and_then(|s| s.data().ok())
    else {
        return Vec::new();
    };
    let base = file.section_by_name(".stapsdt.base").map(|s| s.address());
    let placed = |recorded_address: u64, recorded_base: u64| match (base, recorded_base) {
        (Some(actual), recorded) if recorded != 0 => {
            recorded_address.wrapping_add(actual).wrapping_sub(recorded)
        }
        _ => recorded_address,
    };
    parse_notes(notes)
        .into_iter()
        .filter_map(|note| {
            let (file_offset, code) = locate(&file, elf, placed(note.pc, note.base))?;
            // A semaphore that cannot be placed makes the site useless (it would never fire).
            let semaphore = match note.semaphore {
                0 => None,
                at => Some(locate(&file, elf, placed(at, note.base))?.0),
            };
            Some(Site {
                provider: note.provider,
                name: note.name,
                arguments: note.arguments,
                file_offset,
                optimizable: code.starts_with(&NOP_NOP5),
                semaphore,
                probed: None,
            })
        })
        .collect()
}

/// The file offset of virtual `address` and the bytes from there to its segment's end.
fn locate<'a>(file: &object::File, elf: &'a [u8], address: u64) -> Option<(u64, &'a [u8])> {
    for segment in file.segments() {
        let (start, size) = (segment.address(), segment.size());
        let (offset, file_size) = segment.file_range();
        if address < start || address >= start + size.min(file_size) {
            continue;
        }
        let at = offset + (address - start);
        let end = (offset + file_size) as usize;
        return Some((at, elf.get(at as usize..end.min(elf.len()))?));
    }
    None
}

/// A note's fields before the address is placed.
#[derive(Debug, PartialEq, Eq)]
struct Note {
    pc: u64,
    base: u64,
    semaphore: u64,
    provider: String,
    name: String,
    arguments: String,
}

/// Parses the notes of a `.note.stapsdt` section (4-byte aligned entries); stops at the
/// first malformed one.
fn parse_notes(data: &[u8]) -> Vec<Note> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
    };
    let align = |n: usize| (n + 3) & !3;
    let mut notes = Vec::new();
    let mut at = 0;
    while let (Some(name_size), Some(desc_size), Some(kind)) =
        (word(at), word(at + 4), word(at + 8))
    {
        let name_at = at + 12;
        let desc_at = name_at + align(name_size as usize);
        let next = desc_at + align(desc_size as usize);
        let (Some(name), Some(desc)) = (
            data.get(name_at..name_at + name_size as usize),
            data.get(desc_at..desc_at + desc_size as usize),
        ) else {
            break;
        };
        if kind == NT_STAPSDT && name == b"stapsdt\0" {
            if let Some(note) = parse_desc(desc) {
                notes.push(note);
            }
        }
        at = next;
    }
    notes
}

fn parse_desc(desc: &[u8]) -> Option<Note> {
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(desc.get(at..at + 8)?.try_into().ok()?))
    };
    let (pc, base, semaphore) = (word(0)?, word(8)?, word(16)?);
    let mut strings = desc.get(24..)?.split(|&b| b == 0);
    let mut text = || {
        strings
            .next()
            .map(|s| String::from_utf8_lossy(s).into_owned())
    };
    Some(Note {
        pc,
        base,
        semaphore,
        provider: text()?,
        name: text()?,
        arguments: text().unwrap_or_default(),
    })
}

/// The sites of allocscope's in-process front end in `sites`: its `alloc` and `free`
/// probes (with the argument layout this build's eBPF programs read), or `None` when the
/// file is not (or not this version of) the library.
pub(crate) fn front_end(sites: &[Site]) -> Option<FrontEnd> {
    use sampler_common::preload::{PROBE_ALLOC, PROBE_FREE, PROBE_READY, PROVIDER};
    let own = |name: &str, arguments: &str| -> Vec<Site> {
        sites
            .iter()
            .filter(|s| s.provider == PROVIDER && s.name == name && s.arguments == arguments)
            .cloned()
            .collect()
    };
    let allocs = own(PROBE_ALLOC, ALLOC_ARGUMENTS);
    let frees = own(PROBE_FREE, FREE_ARGUMENTS);
    let ready = own(PROBE_READY, "");
    (!allocs.is_empty() && !frees.is_empty()).then_some(FrontEnd {
        allocs,
        frees,
        ready,
    })
}

/// The argument layout the `usdt` program reads at an `alloc` site.
pub(crate) const ALLOC_ARGUMENTS: &str = "8@%rdi 8@%rsi 8@%rdx 8@%rcx 8@%r8";
/// The argument layout the `usdt` program reads at a `free` site.
pub(crate) const FREE_ARGUMENTS: &str = "8@%rdi";

pub use sampler_common::preload::PRODUCER_PROVIDERS;

/// Another program's allocation probes: `alloc(ptr, size, weight)` and `free(ptr)` sites of
/// one provider, each with where its arguments are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Producer {
    /// `otel_memory` or `ddheap`.
    pub provider: String,
    /// Every site with its argument spec (allocations and frees).
    pub sites: Vec<(Site, UsdtSpec)>,
    /// What else a reader is told about it (a Go runtime's version).
    pub detail: Option<String>,
    /// The file's loadable segments if it is position-independent: its variables' places
    /// in a process are its virtual addresses plus the process's load bias
    /// ([`crate::sys::maps::load_bias`]).
    pub pie_segments: Option<Vec<(std::ops::Range<u64>, u64)>>,
}

impl Producer {
    /// What `pid` adds to the virtual addresses of this producer's file (`file`): 0 for a
    /// position-dependent executable, its load bias for a position-independent one (from
    /// its mapping of the file); `None` if the file is not mapped (gone, or another
    /// program now).
    pub fn bias_in(&self, pid: u32, file: &crate::sys::maps::FileId) -> Option<u64> {
        let Some(segments) = &self.pie_segments else {
            return Some(0);
        };
        let vmas = crate::sys::maps::read(pid).ok()?;
        vmas.iter()
            .filter(|v| &v.file_id == file)
            .find_map(|v| crate::sys::maps::load_bias(segments, v.start, v.offset))
    }
}

/// The allocation probes of another producer among `sites` (the first provider of
/// [`PRODUCER_PROVIDERS`] with at least one `alloc` site whose arguments parse), or `None`.
pub(crate) fn producer(sites: &[Site]) -> Option<Producer> {
    PRODUCER_PROVIDERS.iter().find_map(|&provider| {
        let specs: Vec<(Site, UsdtSpec)> = sites
            .iter()
            .filter(|s| s.provider == provider)
            .filter_map(|site| {
                let (kind, wanted) = match site.name.as_str() {
                    "alloc" => (KIND_ALLOC, 3),
                    "free" => (KIND_FREE, 1),
                    _ => return None,
                };
                let arguments = parse_arguments(&site.arguments)?;
                if arguments.len() < wanted {
                    return None;
                }
                let mut spec = UsdtSpec {
                    kind,
                    count: wanted as u32,
                    ..UsdtSpec::default()
                };
                spec.arguments[..wanted].copy_from_slice(&arguments[..wanted]);
                Some((site.clone(), spec))
            })
            .collect();
        specs
            .iter()
            .any(|(_, spec)| spec.kind == KIND_ALLOC)
            .then(|| Producer {
                provider: provider.to_owned(),
                sites: specs,
                detail: None,
                pie_segments: None,
            })
    })
}

/// Parses a note's argument string (`8@%rdi -4@-20(%rbp) 8@$42`), x86-64: `None` if an
/// argument is not one the eBPF program can read (a register it does not know, an index
/// register, more than [`MAX_ARGUMENTS`] is fine: only the first are kept).
pub(crate) fn parse_arguments(text: &str) -> Option<Vec<UsdtArgument>> {
    text.split_whitespace()
        .take(MAX_ARGUMENTS)
        .map(parse_argument)
        .collect()
}

fn parse_argument(text: &str) -> Option<UsdtArgument> {
    let (size, location) = text.split_once('@')?;
    let size: i32 = size.parse().ok()?;
    let (signed, bytes) = (size < 0, size.unsigned_abs());
    if ![1, 2, 4, 8].contains(&bytes) {
        return None;
    }
    let mut argument = UsdtArgument {
        size: bytes as u8,
        signed: u8::from(signed),
        ..UsdtArgument::default()
    };
    if let Some(constant) = location.strip_prefix('$') {
        argument.value = parse_integer(constant)?;
    } else if let Some(name) = location.strip_prefix('%') {
        argument.register = register_code(name)?;
    } else {
        // offset(%reg): memory at a register plus a displacement (no index register).
        let (offset, rest) = location.split_once('(')?;
        let name = rest.strip_suffix(')')?.strip_prefix('%')?;
        argument.value = if offset.is_empty() {
            0
        } else {
            parse_integer(offset)?
        };
        argument.register = register_code(name)?;
        argument.deref = 1;
    }
    Some(argument)
}

fn parse_integer(text: &str) -> Option<i64> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let value = match digits.strip_prefix("0x") {
        Some(hex) => i64::from_str_radix(hex, 16).ok()?,
        None => digits.parse().ok()?,
    };
    Some(if negative { -value } else { value })
}

/// The code of a register by any of its names (`rdi`, `edi`, `di`, `dil`; `r8`, `r8d`…):
/// a narrower name reads the same register, cut by the argument's size.
fn register_code(name: &str) -> Option<u8> {
    let full = match name {
        "rdi" | "edi" | "di" | "dil" => Register::Rdi,
        "rsi" | "esi" | "si" | "sil" => Register::Rsi,
        "rdx" | "edx" | "dx" | "dl" => Register::Rdx,
        "rcx" | "ecx" | "cx" | "cl" => Register::Rcx,
        "rax" | "eax" | "ax" | "al" => Register::Rax,
        "rbx" | "ebx" | "bx" | "bl" => Register::Rbx,
        "rbp" | "ebp" | "bp" | "bpl" => Register::Rbp,
        "rsp" | "esp" | "sp" | "spl" => return Some(REGISTER_RSP),
        _ => {
            let number = name.strip_prefix('r')?;
            let digits = number.trim_end_matches(['d', 'w', 'b']);
            match digits.parse::<u8>().ok()? {
                8 => Register::R8,
                9 => Register::R9,
                10 => Register::R10,
                11 => Register::R11,
                12 => Register::R12,
                13 => Register::R13,
                14 => Register::R14,
                15 => Register::R15,
                _ => return None,
            }
        }
    };
    Some(full as u8)
}

/// The probe sites of an in-process front end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontEnd {
    /// `allocscope:alloc` sites (one per interposed function).
    pub allocs: Vec<Site>,
    /// `allocscope:free` sites.
    pub frees: Vec<Site>,
    /// `allocscope:ready` sites (attached for file-wide probes only).
    pub ready: Vec<Site>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(pc: u64, base: u64, provider: &str, name: &str, args: &str) -> Vec<u8> {
        let mut desc = Vec::new();
        desc.extend(pc.to_le_bytes());
        desc.extend(base.to_le_bytes());
        desc.extend(0u64.to_le_bytes());
        for s in [provider, name, args] {
            desc.extend(s.as_bytes());
            desc.push(0);
        }
        let mut out = Vec::new();
        out.extend(8u32.to_le_bytes());
        out.extend((desc.len() as u32).to_le_bytes());
        out.extend(3u32.to_le_bytes());
        out.extend(b"stapsdt\0");
        out.extend(&desc);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    #[test]
    fn argument_strings_parse_as_the_compiler_writes_them() {
        let parsed = parse_arguments("8@%r13 -4@-20(%rbp) 8@$42").unwrap();
        assert_eq!(parsed.len(), 3);
        assert_eq!(
            parsed[0],
            UsdtArgument {
                register: Register::R13 as u8,
                size: 8,
                ..UsdtArgument::default()
            }
        );
        assert_eq!(
            parsed[1],
            UsdtArgument {
                register: Register::Rbp as u8,
                deref: 1,
                value: -20,
                size: 4,
                signed: 1,
                ..UsdtArgument::default()
            }
        );
        assert_eq!(parsed[2].value, 42);
        assert_eq!(parsed[2].register, 0);
        let narrow = parse_arguments("4@%r8d 2@%si 1@%al 8@(%rsp) 8@0x10(%rdi)").unwrap();
        let registers: Vec<u8> = narrow.iter().map(|a| a.register).collect();
        assert_eq!(
            registers,
            [Register::R8 as u8, Register::Rsi as u8, Register::Rax as u8]
        );
        let memory = parse_arguments("8@(%rsp) 8@0x10(%rdi)").unwrap();
        assert_eq!(
            (memory[0].register, memory[0].deref, memory[0].value),
            (REGISTER_RSP, 1, 0)
        );
        assert_eq!(
            (memory[1].register, memory[1].value),
            (Register::Rdi as u8, 16)
        );
        // What the eBPF program cannot read is refused, not guessed.
        for bad in [
            "8@%xmm0",
            "3@%rdi",
            "8@-8(%rbp,%rax,8)",
            "8@%rip",
            "rdi",
            "8@",
        ] {
            assert_eq!(parse_arguments(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_producers_alloc_and_free_sites_are_found_with_their_specs() {
        let site = |provider: &str, name: &str, arguments: &str| Site {
            provider: provider.into(),
            name: name.into(),
            arguments: arguments.into(),
            file_offset: 0x100,
            optimizable: false,
            semaphore: Some(0x4060),
            probed: None,
        };
        let sites = [
            site("ddheap", "alloc", "8@%r13 8@%r12 8@%rax"),
            site("ddheap", "free", "8@%rdi"),
            site("ddheap", "other", "8@%rdi"),
        ];
        let found = producer(&sites).unwrap();
        assert_eq!(found.provider, "ddheap");
        let kinds: Vec<u32> = found.sites.iter().map(|(_, spec)| spec.kind).collect();
        assert_eq!(kinds, [KIND_ALLOC, KIND_FREE]);
        assert_eq!(found.sites[0].1.count, 3);
        // An alloc probe with too few arguments is no producer; allocscope's own is not one.
        assert_eq!(
            producer(&[site("otel_memory", "alloc", "8@%rdi 8@%rsi")]),
            None
        );
        assert_eq!(
            producer(&[site("allocscope", "alloc", ALLOC_ARGUMENTS)]),
            None
        );
    }

    #[test]
    fn notes_parse_in_order_and_a_truncated_one_ends_the_list() {
        let mut data = note(0x1000, 0x2000, "allocscope", "alloc", ALLOC_ARGUMENTS);
        data.extend(note(0x1010, 0, "otel_memory", "free", "8@%rdi"));
        let whole = parse_notes(&data);
        assert_eq!(whole.len(), 2);
        assert_eq!(whole[0].provider, "allocscope");
        assert_eq!(whole[0].arguments, ALLOC_ARGUMENTS);
        assert_eq!((whole[1].pc, whole[1].name.as_str()), (0x1010, "free"));
        assert_eq!(parse_notes(&data[..data.len() - 3]).len(), 1);
        assert!(parse_notes(&[1, 2, 3]).is_empty());
    }

    #[test]
    fn the_front_end_needs_both_probes_with_our_layout() {
        let site = |provider: &str, name: &str, arguments: &str| Site {
            provider: provider.into(),
            name: name.into(),
            arguments: arguments.into(),
            file_offset: 0x10,
            optimizable: true,
            semaphore: None,
            probed: None,
        };
        let ours = vec![
            site("allocscope", "alloc", ALLOC_ARGUMENTS),
            site("allocscope", "free", FREE_ARGUMENTS),
            site("otel_memory", "alloc", "8@%rdi 8@%rsi 8@%rdx"),
        ];
        let found = front_end(&ours).expect("our library");
        assert_eq!((found.allocs.len(), found.frees.len()), (1, 1));
        assert!(front_end(&ours[1..]).is_none(), "no alloc probe");
        let other_layout = vec![
            site("allocscope", "alloc", "8@%rax"),
            site("allocscope", "free", FREE_ARGUMENTS),
        ];
        assert!(front_end(&other_layout).is_none());
    }
}
