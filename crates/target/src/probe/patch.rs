//! The plan for counting an allocator linked into the executable in-process: which entry
//! points the library patches and each one's prologue, moved to run elsewhere (see
//! [`sampler_common::patch`] for what the library does with it).
//!
//! Why: a Rust program's `#[global_allocator]` (tikv-jemallocator, mimalloc) or a C++
//! program's static tcmalloc is called directly, not through the dynamic linker, so the
//! preloaded library interposes nothing there, and uprobes on it cost a trap per call (a
//! Rust program with jemalloc ran 42× slower). Patched, each call costs what the library's
//! `malloc` does.
//!
//! What is refused, for the whole file (uprobes then, with the reason): a function that is
//! not global (a local one may be called with registers its callers rely on), one shorter
//! than the jump, a prologue with an instruction that cannot run elsewhere (`loop`,
//! `jrcxz`, an `int3`: a probe already there), one the function's own branches jump into,
//! or more entry points than the library has wrappers. Pure: bytes in, a plan out.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction};
use object::{Object as _, ObjectSegment as _};
use sampler_common::patch::{
    Fixup, PatchEntry, PatchPage, PatchPlan, JUMP_BYTES, MAX_FIXUPS, MAX_PATCHES, ORIGINAL_BYTES,
    PAGE_BYTES, PATCH_MAGIC, PATCH_VERSION, RELOCATED_BYTES, ROLE_FREE,
};

use super::allocator::AllocatorFile;

/// The plan for `file`, the allocator analysed from the executable `data`: every entry
/// point patched, or why none can be.
pub fn plan(data: &[u8], file: &AllocatorFile) -> Result<Box<PatchPlan>, String> {
    let object = object::File::parse(data).map_err(|e| format!("not an ELF file: {e}"))?;
    let digest = program_headers(data)
        .map(sampler_common::patch::digest)
        .ok_or("its program headers could not be read")?;
    let entries = file
        .functions
        .iter()
        .map(|f| {
            (
                f.symbol.as_str(),
                f.address,
                f.size,
                f.global,
                f.function as u32,
            )
        })
        .chain(
            file.frees
                .iter()
                .map(|f| (f.symbol.as_str(), f.address, f.size, f.global, ROLE_FREE)),
        )
        .collect::<Vec<_>>();
    if entries.is_empty() {
        return Err("it has no entry points".into());
    }
    if entries.len() > MAX_PATCHES {
        return Err(format!(
            "{} entry points, more than the {MAX_PATCHES} the sampler patches",
            entries.len()
        ));
    }
    let mut plan = Box::new(PatchPlan {
        magic: PATCH_MAGIC,
        version: PATCH_VERSION,
        digest,
        count: entries.len() as u64,
        entries: [PatchEntry::default(); MAX_PATCHES],
        page_count: 0,
        pages: [PatchPage::default(); MAX_PATCHES],
    });
    for (slot, (symbol, address, size, global, role)) in entries.into_iter().enumerate() {
        if !global {
            return Err(format!("{symbol} is not a global function"));
        }
        if may_throw(symbol) {
            return Err(format!(
                "{symbol} may throw a C++ exception, which cannot unwind through the sampler"
            ));
        }
        let code = super::elf::code_at(&object, address, size)
            .ok_or_else(|| format!("{symbol}: its code is not in the file"))?;
        let entry = plan_function(code, address, role).map_err(|e| format!("{symbol}: {e}"))?;
        add_page(&mut plan, data, &object, &entry).map_err(|e| format!("{symbol}: {e}"))?;
        plan.entries[slot] = entry;
    }
    let names: Vec<&str> = file
        .functions
        .iter()
        .map(|f| f.symbol.as_str())
        .chain(file.frees.iter().map(|f| f.symbol.as_str()))
        .collect();
    let bodies = bodies(&object, &plan, &names);
    if let Some(why) = branch_into_any(&object, &plan, &bodies) {
        return Err(why);
    }
    Ok(plan)
}

/// Per plan entry, the code that is its own: its symbol's range and those of its parts
/// the compiler split off (`malloc.cold`, `malloc.part.0`), which may jump back to it.
fn bodies(object: &object::File, plan: &PatchPlan, names: &[&str]) -> Vec<Vec<(u64, u64)>> {
    use object::ObjectSymbol as _;
    let mut bodies: Vec<Vec<(u64, u64)>> = vec![Vec::new(); plan.count as usize];
    for symbol in object.symbols().chain(object.dynamic_symbols()) {
        let Ok(name) = symbol.name() else { continue };
        for (slot, entry) in plan.entries[..plan.count as usize].iter().enumerate() {
            let own = symbol.address() == entry.address;
            let part = name
                .strip_prefix(names[slot])
                .is_some_and(|rest| rest.starts_with('.'));
            if (own || part) && symbol.size() > 0 {
                bodies[slot].push((symbol.address(), symbol.address() + symbol.size()));
            }
        }
    }
    bodies
}

/// Why the plan cannot be kept, if a direct branch anywhere in the file's code lands in an
/// entry's replaced bytes past its first (it would run the jump's middle), or a jump in the
/// entry's own code goes back to its first byte (a loop through the entry would go
/// through the wrapper on each turn, a frame deeper each time).
fn branch_into_any(
    object: &object::File,
    plan: &PatchPlan,
    bodies: &[Vec<(u64, u64)>],
) -> Option<String> {
    use object::{ObjectSection as _, SectionKind};
    let entries = &plan.entries[..plan.count as usize];
    let mut instruction = Instruction::default();
    for section in object.sections().filter(|s| s.kind() == SectionKind::Text) {
        let Ok(code) = section.data() else { continue };
        let mut decoder = Decoder::with_ip(64, code, section.address(), DecoderOptions::NONE);
        while decoder.can_decode() {
            decoder.decode_out(&mut instruction);
            let call = instruction.is_call_near();
            let jump = instruction.is_jmp_short_or_near()
                || instruction.is_jcc_short_or_near()
                || instruction.is_jcx_short()
                || instruction.is_loop()
                || instruction.is_loopcc();
            if !call && !jump {
                continue;
            }
            let (from, to) = (instruction.ip(), instruction.near_branch_target());
            for (slot, entry) in entries.iter().enumerate() {
                let end = entry.address + u64::from(entry.original_len);
                let inside = to > entry.address && to < end;
                let own = bodies[slot].iter().any(|&(a, b)| (a..b).contains(&from));
                let patched = from >= entry.address && from < end;
                if inside {
                    return Some(format!(
                        "the code at {from:#x} jumps into the first bytes of the entry at {:#x}",
                        entry.address
                    ));
                }
                if jump && to == entry.address && (own || patched) {
                    return Some(format!(
                        "the code at {from:#x} loops back to the entry at {:#x}",
                        entry.address
                    ));
                }
            }
        }
    }
    None
}

/// Adds the page holding `entry`'s replaced bytes to `plan`'s pages (once), with the
/// digest of its bytes as the file maps them.
fn add_page(
    plan: &mut PatchPlan,
    data: &[u8],
    object: &object::File,
    entry: &PatchEntry,
) -> Result<(), String> {
    let page = entry.address & !(PAGE_BYTES as u64 - 1);
    let last = entry.address + u64::from(entry.original_len) - 1;
    if last & !(PAGE_BYTES as u64 - 1) != page {
        return Err("its first bytes cross a page boundary".into());
    }
    let used = plan.page_count as usize;
    if !plan.pages[..used].iter().any(|p| p.address == page) {
        let bytes = page_bytes(data, object, page).ok_or("its page is not in the file")?;
        plan.pages[used] = PatchPage {
            address: page,
            digest: sampler_common::patch::digest(&bytes),
        };
        plan.page_count += 1;
    }
    Ok(())
}

/// The bytes of the page at virtual `address` as the loader maps it from the file (its
/// segment's pages come whole from the file, zeros past its end).
fn page_bytes(data: &[u8], object: &object::File, address: u64) -> Option<Vec<u8>> {
    let segment = object.segments().find(|s| {
        let start = s.address() & !(PAGE_BYTES as u64 - 1);
        (start..s.address() + s.size()).contains(&address)
    })?;
    let (offset, _) = segment.file_range();
    // The loader maps from the page-aligned offset (the virtual address and the offset are
    // congruent modulo the page size).
    let at = usize::try_from((address + offset).checked_sub(segment.address())?).ok()?;
    let mut bytes = vec![0u8; PAGE_BYTES];
    let available = data.get(at..)?;
    let n = available.len().min(PAGE_BYTES);
    bytes[..n].copy_from_slice(&available[..n]);
    Some(bytes)
}

/// Whether `symbol` is a form of C++'s `operator new` that throws on failure (its
/// exception would unwind through the sampler's wrapper, which has no unwind entries).
fn may_throw(symbol: &str) -> bool {
    let new = symbol.starts_with("_Znwm") || symbol.starts_with("_Znam") || {
        let base = symbol
            .strip_prefix("tc_")
            .or_else(|| symbol.strip_prefix("mi_"));
        base.is_some_and(|b| b.starts_with("new"))
    };
    new && !symbol.contains("nothrow")
}

/// The ELF program header table's bytes (the library hashes its own, `AT_PHDR`).
pub fn program_headers(data: &[u8]) -> Option<&[u8]> {
    let word = |at: usize, n: usize| -> Option<u64> {
        let bytes = data.get(at..at + n)?;
        Some(
            bytes
                .iter()
                .rev()
                .fold(0u64, |v, &b| (v << 8) | u64::from(b)),
        )
    };
    if data.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let offset = usize::try_from(word(0x20, 8)?).ok()?;
    let (size, count) = (word(0x36, 2)? as usize, word(0x38, 2)? as usize);
    data.get(offset..offset.checked_add(size * count)?)
}

/// The patch of one function whose code (its whole body) is `code` at `address`.
pub fn plan_function(code: &[u8], address: u64, role: u32) -> Result<PatchEntry, String> {
    let mut entry = PatchEntry {
        address,
        role,
        ..PatchEntry::default()
    };
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut covered = 0usize;
    let mut out: Vec<u8> = Vec::new();
    let mut fixups: Vec<Fixup> = Vec::new();
    while covered < JUMP_BYTES {
        if !decoder.can_decode() {
            return Err(format!(
                "shorter ({covered} bytes) than the {JUMP_BYTES}-byte jump"
            ));
        }
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            return Err(format!("an instruction at +{covered} could not be decoded"));
        }
        let bytes = &code[covered..covered + instruction.len()];
        let ends = relocate_one(&decoder, &instruction, bytes, &mut out, &mut fixups)?;
        covered += instruction.len();
        if ends && covered < JUMP_BYTES {
            return Err(format!(
                "shorter ({covered} bytes) than the {JUMP_BYTES}-byte jump"
            ));
        }
    }
    if covered > ORIGINAL_BYTES || out.len() > RELOCATED_BYTES || fixups.len() > MAX_FIXUPS {
        return Err("its first instructions are too long to move".into());
    }
    if let Some(from) = branch_into(code, address, covered) {
        return Err(format!(
            "a branch at +{:#x} jumps into its first {covered} bytes",
            from - address
        ));
    }
    entry.original_len = covered as u32;
    entry.original[..covered].copy_from_slice(&code[..covered]);
    entry.relocated_len = out.len() as u32;
    entry.relocated[..out.len()].copy_from_slice(&out);
    entry.fixup_count = fixups.len() as u32;
    entry.fixups[..fixups.len()].copy_from_slice(&fixups);
    Ok(entry)
}

/// Appends `instruction` (its `bytes`), re-encoded to run anywhere, to `out`: a relative
/// branch or call made near (`rel32`), a RIP-relative operand's displacement recorded as a
/// fixup. True when nothing falls through after it (a jump, a return).
fn relocate_one(
    decoder: &Decoder,
    instruction: &Instruction,
    bytes: &[u8],
    out: &mut Vec<u8>,
    fixups: &mut Vec<Fixup>,
) -> Result<bool, String> {
    let mut near = |opcode: &[u8], target: u64| {
        out.extend_from_slice(opcode);
        let at = out.len() as u32;
        out.extend_from_slice(&[0; 4]);
        fixups.push(Fixup {
            at,
            end: out.len() as u32,
            target,
        });
    };
    match instruction.flow_control() {
        FlowControl::UnconditionalBranch if instruction.is_jmp_short_or_near() => {
            near(&[0xe9], instruction.near_branch_target());
            Ok(true)
        }
        FlowControl::ConditionalBranch if instruction.is_jcc_short_or_near() => {
            // The condition is the low nibble of either form's opcode (7x, 0F 8x).
            let condition = if bytes[0] == 0x0f { bytes[1] } else { bytes[0] } & 0x0f;
            near(&[0x0f, 0x80 | condition], instruction.near_branch_target());
            Ok(false)
        }
        FlowControl::Call if instruction.is_call_near() => {
            near(&[0xe8], instruction.near_branch_target());
            Ok(false)
        }
        FlowControl::Next
        | FlowControl::Return
        | FlowControl::IndirectBranch
        | FlowControl::IndirectCall => {
            let start = out.len();
            out.extend_from_slice(bytes);
            if instruction.is_ip_rel_memory_operand() {
                let offsets = decoder.get_constant_offsets(instruction);
                if !offsets.has_displacement() || offsets.displacement_size() != 4 {
                    return Err("a RIP-relative operand without a 32-bit displacement".into());
                }
                fixups.push(Fixup {
                    at: (start + offsets.displacement_offset()) as u32,
                    end: out.len() as u32,
                    target: instruction.ip_rel_memory_address(),
                });
            }
            Ok(matches!(
                instruction.flow_control(),
                FlowControl::Return | FlowControl::IndirectBranch
            ))
        }
        FlowControl::Interrupt if instruction.code() == iced_x86::Code::Int3 => {
            Err("its first bytes hold an int3 (a probe or a breakpoint)".into())
        }
        other => Err(format!(
            "its prologue has an instruction that cannot run elsewhere ({other:?}: {instruction})"
        )),
    }
}

/// Where a direct branch of the function (`code` at `address`) lands inside its first
/// `len` bytes, past the entry: the address of that branch.
fn branch_into(code: &[u8], address: u64, len: usize) -> Option<u64> {
    let inside = (address + 1)..(address + len as u64);
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        let direct = instruction.is_jmp_short_or_near()
            || instruction.is_jcc_short_or_near()
            || instruction.is_call_near()
            || instruction.is_jcx_short()
            || instruction.is_loop()
            || instruction.is_loopcc();
        if direct && inside.contains(&instruction.near_branch_target()) {
            return Some(instruction.ip());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use sampler_common::patch::relocate;

    #[test]
    fn plain_instructions_are_copied_whole() {
        // cmp rdi, 0x1000; ja +0x77 (jemalloc's malloc): the compare alone covers the jump.
        let code = [0x48, 0x81, 0xff, 0x00, 0x10, 0x00, 0x00, 0x77, 0x77, 0xc3];
        let entry = plan_function(&code, 0x2f3a0, 0).unwrap();
        assert_eq!(entry.original_len, 7);
        assert_eq!(&entry.relocated[..7], &code[..7]);
        assert_eq!(entry.fixup_count, 0);
    }

    #[test]
    fn a_rip_relative_load_is_reaimed_from_where_it_runs() {
        // mov rax, [rip + 0x4c4b9] at 0x2dcc0 (mimalloc's free): reads 0x7a180.
        let code = [
            0x48, 0x8b, 0x05, 0xb9, 0xc4, 0x04, 0x00, 0x48, 0x89, 0xfa, 0xc3,
        ];
        let entry = plan_function(&code, 0x2dcc0, ROLE_FREE).unwrap();
        assert_eq!(entry.original_len, 7);
        assert_eq!(entry.fixup_count, 1);
        assert_eq!(entry.fixups[0].target, 0x7a180);
        let bias = 0x5555_5555_0000u64;
        let at = bias - 0x10_0000;
        let moved = relocate(&entry, bias, at).unwrap();
        let mut decoder = Decoder::with_ip(64, &moved[..7], at, DecoderOptions::NONE);
        let instruction = decoder.decode();
        assert_eq!(instruction.ip_rel_memory_address(), bias + 0x7a180);
    }

    /// `entry`'s relocated prologue, decoded where it would run at `at`.
    fn moved_instructions(entry: &PatchEntry, at: u64) -> Vec<Instruction> {
        let moved = relocate(entry, 0, at).unwrap();
        let code = &moved[..entry.relocated_len as usize];
        Decoder::with_ip(64, code, at, DecoderOptions::NONE)
            .into_iter()
            .collect()
    }

    #[test]
    fn short_branches_become_near_and_reach_their_targets() {
        // xor ecx, ecx; jmp rel32 (jemalloc's rallocx, 7 bytes, nothing after it).
        let code = [0x31, 0xc9, 0xe9, 0xe9, 0xad, 0xff, 0xff];
        let entry = plan_function(&code, 0x31840, 2).unwrap();
        assert_eq!(entry.original_len, 7);
        let jump = moved_instructions(&entry, 0x1000)[1];
        assert_eq!(jump.near_branch_target(), 0x2c630);
        // test rdi, rdi; je +0x10; ...: the short je becomes a near one to the same place.
        let code = [0x48, 0x85, 0xff, 0x74, 0x10, 0x90, 0x90, 0xc3];
        let entry = plan_function(&code, 0x4000, 0).unwrap();
        assert_eq!(entry.original_len, 5);
        let branch = moved_instructions(&entry, 0x9000)[1];
        assert!(branch.is_jcc_near());
        assert_eq!(branch.condition_code(), iced_x86::ConditionCode::e);
        assert_eq!(branch.near_branch_target(), 0x4015);
    }

    #[test]
    fn what_cannot_move_is_refused_with_its_reason() {
        // Shorter than the jump: ret.
        assert!(plan_function(&[0x31, 0xc0, 0xc3], 0x1000, 0)
            .unwrap_err()
            .contains("shorter"));
        // A probe's int3 at the entry.
        assert!(
            plan_function(&[0xcc, 0x90, 0x90, 0x90, 0x90, 0xc3], 0x1000, 0)
                .unwrap_err()
                .contains("int3")
        );
        // loop in the prologue.
        assert!(
            plan_function(&[0xe2, 0xfe, 0x90, 0x90, 0x90, 0xc3], 0x1000, 0)
                .unwrap_err()
                .contains("cannot run elsewhere")
        );
        // A later branch back into the third byte: push rbx; push rbp; push r12; ...; jmp
        // back to 0x1002.
        let code = [0x53, 0x55, 0x41, 0x54, 0x90, 0x90, 0xeb, 0xfa, 0xc3];
        assert!(plan_function(&code, 0x1000, 0)
            .unwrap_err()
            .contains("jumps into"));
    }

    #[test]
    fn throwing_forms_of_new_are_told_from_the_others() {
        for symbol in ["_Znwm", "_ZnamSt11align_val_t", "tc_new", "mi_new_aligned"] {
            assert!(may_throw(symbol), "{symbol}");
        }
        for symbol in [
            "_ZnwmRKSt9nothrow_t",
            "tc_new_nothrow",
            "mi_malloc",
            "_rjem_mallocx",
        ] {
            assert!(!may_throw(symbol), "{symbol}");
        }
    }

    #[test]
    fn the_program_headers_are_found_in_an_elf_file() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let headers = program_headers(&exe).unwrap();
        assert_eq!(headers.len() % 56, 0);
        // PT_PHDR or PT_LOAD first: a known type.
        assert!(matches!(headers[0], 1 | 6));
        assert!(program_headers(b"not elf").is_none());
    }
}
