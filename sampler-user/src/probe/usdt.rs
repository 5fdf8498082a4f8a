//! USDT probe sites (`sys/sdt.h` notes, `.note.stapsdt`) of an ELF file, and which of them
//! make a file an allocation front end: allocscope's own in-process library
//! (`allocscope:alloc`/`free`, see [`sampler_common::preload`]).
//!
//! Pure: bytes in, sites out. A site's address is where the note says, moved by however far
//! the `.stapsdt.base` section is from where the note recorded it (prelinking), and turned
//! into a file offset (what uprobes attach to). Where the site is the `nop; nop5` pair
//! libbpf's `usdt.h` emits, [`Site::optimizable`] says so: probing the 5-byte nop instead
//! lets Linux ≥ 6.18 replace the trap by a call (see [`crate::probe::attach`]).

use object::{Object as _, ObjectSection as _, ObjectSegment as _};

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
}

/// The 1-byte nop and the 5-byte nop of an optimizable site.
const NOP_NOP5: [u8; 6] = [0x90, 0x0f, 0x1f, 0x44, 0x00, 0x00];
/// The note type of a USDT site.
const NT_STAPSDT: u32 = 3;

/// Every USDT site of an ELF file (none if it is not one, or has none).
pub fn sites(elf: &[u8]) -> Vec<Site> {
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
    parse_notes(notes)
        .into_iter()
        .filter_map(|note| {
            let address = match (base, note.base) {
                (Some(actual), recorded) if recorded != 0 => {
                    note.pc.wrapping_add(actual).wrapping_sub(recorded)
                }
                _ => note.pc,
            };
            let (file_offset, code) = locate(&file, elf, address)?;
            Some(Site {
                provider: note.provider,
                name: note.name,
                arguments: note.arguments,
                file_offset,
                optimizable: code.starts_with(&NOP_NOP5),
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
    let (pc, base) = (word(0)?, word(8)?);
    let mut strings = desc.get(24..)?.split(|&b| b == 0);
    let mut text = || {
        strings
            .next()
            .map(|s| String::from_utf8_lossy(s).into_owned())
    };
    Some(Note {
        pc,
        base,
        provider: text()?,
        name: text()?,
        arguments: text().unwrap_or_default(),
    })
}

/// The sites of allocscope's in-process front end in `sites`: its `alloc` and `free`
/// probes (with the argument layout this build's eBPF programs read), or `None` when the
/// file is not (or not this version of) the library.
pub fn front_end(sites: &[Site]) -> Option<FrontEnd> {
    use sampler_common::preload::{PROBE_ALLOC, PROBE_FREE, PROVIDER};
    let own = |name: &str, arguments: &str| -> Vec<Site> {
        sites
            .iter()
            .filter(|s| s.provider == PROVIDER && s.name == name && s.arguments == arguments)
            .cloned()
            .collect()
    };
    let allocs = own(PROBE_ALLOC, ALLOC_ARGUMENTS);
    let frees = own(PROBE_FREE, FREE_ARGUMENTS);
    (!allocs.is_empty() && !frees.is_empty()).then_some(FrontEnd { allocs, frees })
}

/// The argument layout `usdt_alloc` reads.
pub const ALLOC_ARGUMENTS: &str = "8@%rdi 8@%rsi 8@%rdx 8@%rcx 8@%r8";
/// The argument layout `usdt_free` reads.
pub const FREE_ARGUMENTS: &str = "8@%rdi";

/// The probe sites of an in-process front end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontEnd {
    /// `allocscope:alloc` sites (one per interposed function).
    pub allocs: Vec<Site>,
    /// `allocscope:free` sites.
    pub frees: Vec<Site>,
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
