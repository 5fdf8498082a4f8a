//! A module's file as the unwinder and the return-address check need it: mapped once (never
//! copied: libraries can be hundreds of megabytes), with its loadable segments (to place it
//! in a process) and its sections by name (CFI for framehop, code bytes for the check).

use std::{collections::HashMap, ops::Range, sync::Arc};

use object::{Object as _, ObjectSection as _};

/// A mapped ELF file and what is read from its headers.
#[derive(Debug)]
pub struct Image {
    data: memmap2::Mmap,
    /// Loadable segments: (file range, virtual address of its start).
    segments: Vec<(Range<u64>, u64)>,
    /// Sections with file contents: name → (virtual address range, file range).
    sections: HashMap<Vec<u8>, (Range<u64>, Range<usize>)>,
    /// Whether this is allocscope's in-process front end, whose own frames lead the
    /// stacks it reports and are dropped like an allocator's own frame.
    pub front_end: bool,
    /// A Go executable's runtime functions (file offsets, sorted) and its `goexit`.
    go: Option<GoText>,
}

/// What a frame is to a sample's stack ([`Image::role`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameRole {
    /// allocscope's in-process front end: its own frames lead the stacks it reports (its
    /// probe sits inside the interposed function), left out like an allocator's frame.
    FrontEnd,
    /// A Go runtime function: leading ones are its allocation machinery, left out.
    GoRuntime,
    /// `runtime.goexit`: a goroutine's root, whose return address follows no call.
    GoroutineRoot,
    /// Anything else.
    Code,
}

/// Where a Go executable's runtime code is: a Go sample's stack leads with the runtime's
/// allocation machinery (`mallocgc`, `newobject`, `makeslice`…), left out as Go's own
/// `pprof` leaves out leading `runtime.` frames, and every goroutine's stack ends at a
/// return address into `runtime.goexit` that follows no call (its root).
#[derive(Debug, Default)]
struct GoText {
    runtime: Vec<Range<u64>>,
    goexit: Range<u64>,
}

impl GoText {
    /// The runtime's functions of a Go executable `elf` (`None`: not Go, or no symbols).
    fn of(elf: &object::File) -> Option<GoText> {
        use object::ObjectSymbol as _;
        elf.section_by_name(".go.buildinfo")?;
        let offset_of = |address: u64, size: u64| {
            let start = crate::probe::elf::file_offset_of(elf, address)?;
            Some(start..start + size.max(1))
        };
        let mut text = GoText::default();
        for symbol in elf.symbols() {
            let Ok(name) = symbol.name() else { continue };
            if symbol.kind() != object::SymbolKind::Text || !name.starts_with("runtime.") {
                continue;
            }
            let Some(range) = offset_of(symbol.address(), symbol.size()) else {
                continue;
            };
            if name == "runtime.goexit" || name == "runtime.goexit.abi0" {
                text.goexit = range.clone();
            }
            text.runtime.push(range);
        }
        text.runtime.sort_by_key(|r| r.start);
        (!text.runtime.is_empty()).then_some(text)
    }

    fn is_runtime(&self, offset: u64) -> bool {
        let at = self.runtime.partition_point(|r| r.start <= offset);
        at > 0 && self.runtime[at - 1].contains(&offset)
    }
}

impl Image {
    /// Maps and reads `file`; `None` if it is not an ELF file we can read.
    pub fn open(file: &std::fs::File) -> Option<Arc<Image>> {
        // SAFETY: the mapping is read-only and private; a file changed underneath would only
        // give wrong frames (each one is checked), never unsafety in safe code reading a
        // byte slice, which is how it is used (as `probe::allocator` does).
        let data = unsafe { memmap2::Mmap::map(file) }.ok()?;
        let (segments, sections, go) = {
            let elf = object::File::parse(&*data).ok()?;
            let segments = crate::sys::maps::loadable_segments(&elf);
            let sections: HashMap<Vec<u8>, (Range<u64>, Range<usize>)> = elf
                .sections()
                .filter_map(|section| {
                    let (offset, size) = section.file_range()?;
                    let name = section.name_bytes().ok()?.to_vec();
                    let address = section.address();
                    let file =
                        usize::try_from(offset).ok()?..usize::try_from(offset + size).ok()?;
                    (file.end <= data.len()).then_some((name, (address..address + size, file)))
                })
                .collect();
            (segments, sections, GoText::of(&elf))
        };
        let front_end = sections.contains_key(&b".note.stapsdt"[..])
            && crate::probe::usdt::front_end(&crate::probe::usdt::sites(&data)).is_some();
        Some(Arc::new(Image {
            data,
            segments,
            sections,
            front_end,
            go,
        }))
    }

    /// What a frame at file offset `offset` of this file is to a sample's stack.
    pub fn role(&self, offset: u64) -> FrameRole {
        if self.front_end {
            return FrameRole::FrontEnd;
        }
        match &self.go {
            Some(go) if go.goexit.contains(&offset) => FrameRole::GoroutineRoot,
            Some(go) if go.is_runtime(offset) => FrameRole::GoRuntime,
            _ => FrameRole::Code,
        }
    }

    /// The load bias of a mapping of this file at `start` from file offset `offset` (see
    /// [`load_bias`](crate::sys::maps::load_bias)).
    pub fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        crate::sys::maps::load_bias(&self.segments, start, offset)
    }

    /// Up to `length` bytes of the file that end just before file offset `end`.
    pub fn bytes_before(&self, end: u64, length: usize) -> Option<&[u8]> {
        let end = usize::try_from(end).ok()?.min(self.data.len());
        Some(&self.data[end.saturating_sub(length)..end])
    }

    /// The named section: its virtual address range and its bytes.
    pub fn section(self: &Arc<Self>, name: &[u8]) -> Option<(Range<u64>, SectionBytes)> {
        let (address, file) = self.sections.get(name)?;
        Some((
            address.clone(),
            SectionBytes {
                image: Arc::clone(self),
                range: file.clone(),
            },
        ))
    }
}

/// A section's bytes, kept alive with the image they are in (framehop's section data).
#[derive(Clone, Debug)]
pub struct SectionBytes {
    image: Arc<Image>,
    range: Range<usize>,
}

impl std::ops::Deref for SectionBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.image.data[self.range.clone()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sections_and_places_segments() {
        let file = std::fs::File::open(crate::sys::own::EXE).unwrap();
        let image = Image::open(&file).expect("our own executable");
        let (address, bytes) = image.section(b".eh_frame_hdr").expect(".eh_frame_hdr");
        assert_eq!(bytes.len() as u64, address.end - address.start);
        // .eh_frame_hdr starts with its version, 1.
        assert_eq!(bytes[0], 1);
        assert!(image.section(b".no_such_section").is_none());
        // Our own text mapping's bias is our load address of virtual address 0.
        let exe = std::fs::read_link(crate::sys::own::EXE).unwrap();
        let text = crate::sys::maps::read(std::process::id())
            .unwrap()
            .into_iter()
            .find(|vma| vma.executable && vma.path.as_deref() == Some(exe.as_path()))
            .expect("our text mapping");
        let bias = image.bias(text.start, text.offset).expect("a segment");
        let here = reads_sections_and_places_segments as *const () as u64;
        assert!(here - bias < file.metadata().unwrap().len() * 4);
        assert!(image.bytes_before(16, 8).unwrap().len() == 8);
        assert!(image.bytes_before(3, 8).unwrap().len() == 3);
    }
}
