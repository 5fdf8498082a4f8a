//! `/proc/PID/maps`: the parser is pure (tested on text), the reader is a thin wrapper.

use std::{io, ops::Range, path::PathBuf};

/// The page size of x86-64 user mappings.
pub const PAGE_SIZE: u64 = 4096;

/// A file's identity as maps shows it: its device and inode, the identity of the file
/// itself, whatever path or mount namespace it is seen through (a container's libc and the
/// host's share a path, not an identity).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    /// `major:minor`, in hex as maps prints it.
    pub device: String,
    /// Inode number (0: no file).
    pub inode: u64,
}

impl FileId {
    /// The identity of the file `metadata` was read from.
    pub fn of(metadata: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt as _;
        let dev = metadata.dev();
        FileId {
            device: format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev)),
            inode: metadata.ino(),
        }
    }
}

/// One mapping of a process's address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vma {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset that `start` maps.
    pub offset: u64,
    /// Whether the mapping is executable.
    pub executable: bool,
    /// Whether it is writable.
    pub writable: bool,
    /// Whether it is the main thread's stack (`[stack]`).
    pub stack: bool,
    /// The backing file's identity (inode 0: none).
    pub file_id: FileId,
    /// Backing file path, if the mapping has one (not `[heap]`, `[vdso]`, anonymous).
    pub path: Option<PathBuf>,
}

impl Vma {
    /// File offset of `address` in this mapping, if it falls inside.
    pub fn file_offset(&self, address: u64) -> Option<u64> {
        (self.start..self.end)
            .contains(&address)
            .then(|| address - self.start + self.offset)
    }
}

/// The loadable segments of `elf`: (file range, virtual address of its start), as
/// [`load_bias`] takes them.
pub fn loadable_segments(elf: &object::File<'_>) -> Vec<(Range<u64>, u64)> {
    use object::{Object as _, ObjectSegment as _};
    elf.segments()
        .map(|segment| {
            let (offset, size) = segment.file_range();
            (offset..offset + size, segment.address())
        })
        .collect()
}

/// The load bias of a mapping at `start` from file offset `offset` of a file whose loadable
/// `segments` are (file range, virtual address of its start): what is added to the file's
/// virtual addresses to give the process's. A mapping starts at its segment's offset
/// rounded down to a page, which may fall inside the previous segment's bytes: the segment
/// whose page-rounded start is `offset` is the one.
pub fn load_bias(segments: &[(Range<u64>, u64)], start: u64, offset: u64) -> Option<u64> {
    let page = !(PAGE_SIZE - 1);
    let (file, address) = segments
        .iter()
        .find(|(file, _)| file.start & page == offset)
        .or_else(|| segments.iter().find(|(file, _)| file.contains(&offset)))?;
    // The process address of the segment's first byte is `start + (file.start - offset)`.
    Some(
        start
            .wrapping_add(file.start.wrapping_sub(offset))
            .wrapping_sub(*address),
    )
}

/// Parses the text of a maps file. Malformed lines are skipped, not fatal: the kernel's
/// format is stable, and a partial map is more useful than none.
pub fn parse(text: &str) -> Vec<Vma> {
    let mut vmas: Vec<Vma> = text.lines().filter_map(parse_line).collect();
    attribute_patched_pages(&mut vmas);
    vmas
}

/// Gives back to its file a page of code that allocscope's in-process sampler replaced by
/// a patched copy (see `sampler-preload`'s `patch`): anonymous, executable, and between
/// two mappings of one file whose offsets it continues exactly (the kernel shows the copy
/// as memory of no file; its code is the file's, but for the patched entries' first
/// bytes). Its frames are then the file's, as they were.
fn attribute_patched_pages(vmas: &mut [Vma]) {
    for i in 1..vmas.len().saturating_sub(1) {
        let (before, rest) = vmas.split_at_mut(i);
        let (this, after) = rest.split_at_mut(1);
        let (prev, this, next) = (&before[i - 1], &mut this[0], &after[0]);
        let continues = prev.end == this.start
            && this.end == next.start
            && prev.path.is_some()
            && prev.file_id == next.file_id
            && prev.offset + (prev.end - prev.start) + (this.end - this.start) == next.offset;
        if this.path.is_none()
            && this.file_id.inode == 0
            && this.executable
            && !this.writable
            && continues
        {
            this.offset = prev.offset + (prev.end - prev.start);
            this.file_id = prev.file_id.clone();
            this.path = prev.path.clone();
        }
    }
}

fn parse_line(line: &str) -> Option<Vma> {
    // start-end perms offset dev inode [path]
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let dev = fields.next()?;
    let inode = fields.next()?;
    let name = fields.next().map(str::trim_start).unwrap_or("");
    let path = (inode != "0" && name.starts_with('/'))
        .then(|| PathBuf::from(name.trim_end_matches(" (deleted)")));
    Some(Vma {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        writable: perms.as_bytes().get(1) == Some(&b'w'),
        stack: inode == "0" && name.trim_end() == "[stack]",
        file_id: FileId {
            device: dev.to_owned(),
            inode: inode.parse().ok()?,
        },
        path,
    })
}

/// Start of the kernel's `[uprobes]` area in a maps text, if the process has one yet.
pub fn uprobe_area(text: &str) -> Option<u64> {
    let line = text.lines().find(|line| line.ends_with("[uprobes]"))?;
    u64::from_str_radix(line.split('-').next()?, 16).ok()
}

impl Vma {
    /// The file this mapping maps, opened through `pid`'s own view of it
    /// (`/proc/PID/map_files/START-END`): right even when the process lives in another mount
    /// namespace or root (a container) or the file was deleted since (an upgraded library).
    pub fn file_in(&self, pid: u32) -> PathBuf {
        super::process::path(pid, &format!("map_files/{:x}-{:x}", self.start, self.end))
    }
}

/// Reads and parses `/proc/PID/maps`.
pub fn read(pid: u32) -> io::Result<Vec<Vma>> {
    Ok(parse(&read_text(pid)?))
}

/// Whether `pid` maps file `id` now, read in `pid`'s own maps (a forked child's allocators
/// may be its parent's, read through the parent's). Anywhere: a program it exec'd since maps
/// the same library at another address (looked for at the old one, a workload exec'd by a
/// shell's child was taken for one without its front end in one run of two, and the kernel
/// counted its first calls a second time).
/// Read now, never as held by a [`super::moment`]: it checks for a change.
pub fn maps_file(pid: u32, id: &FileId) -> bool {
    read_now(pid).is_ok_and(|text| parse(&text).iter().any(|vma| vma.file_id == *id))
}

/// The text of `/proc/PID/maps` (empty for a process that exited and was not reaped), read
/// once per [`super::moment`].
pub fn read_text(pid: u32) -> io::Result<String> {
    super::moment::text(pid, "maps", || read_now(pid))
}

/// [`read_text`], and whether the process's exit may have cut it short. Each chunk of a
/// maps file holds the memory anew, refused once the exit began: a read the exit overtook
/// ends short, without the libraries (last, at the top). The exit clears the exe link
/// first, so it is looked at after the read (not held by the moment). An empty text (a
/// process not yet reaped) is exiting without a look.
pub fn read_text_until_exit(pid: u32) -> io::Result<(String, bool)> {
    let text = read_text(pid)?;
    let exiting = text.is_empty() || super::process::executable_of(pid).is_none();
    Ok((text, exiting))
}

fn read_now(pid: u32) -> io::Result<String> {
    std::fs::read_to_string(super::process::path(pid, "maps"))
}

/// Whether `pid`'s maps hold a dynamic loader (`ld-linux…`, `ld-musl…`): its program is
/// dynamically linked, and `LD_PRELOAD` applies to it.
pub fn has_dynamic_loader(pid: u32) -> bool {
    read(pid).is_ok_and(|vmas| {
        vmas.iter().any(|vma| {
            vma.path
                .as_deref()
                .and_then(std::path::Path::file_name)
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("ld-linux") || name.starts_with("ld-musl"))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
5581f0a00000-5581f0a01000 r--p 00000000 fe:01 1234 /usr/bin/demo
5581f0a01000-5581f0a02000 r-xp 00001000 fe:01 1234 /usr/bin/demo
5581f1000000-5581f1021000 rw-p 00000000 00:00 0 [heap]
7f1c2a600000-7f1c2a626000 r--p 00000000 fe:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2a626000-7f1c2a77b000 r-xp 00026000 fe:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2a800000-7f1c2a801000 r-xp 00000000 fe:01 77 /tmp/a b (deleted)
7ffd5b3f1000-7ffd5b3f3000 r-xp 00000000 00:00 0 [vdso]
garbage line
7fffffffe000-7ffffffff000 --xp 00000000 00:00 0                          [uprobes]
";

    #[test]
    fn load_bias_picks_the_segment_a_mapping_starts() {
        // A PIE's text segment at file 0x1120 (page 0x1000), virtual 0x2120; the data
        // segment's page-rounded start shares no page with it.
        let segments = [
            (0..0x1000, 0),
            (0x1120..0x5000, 0x2120),
            (0x5e00..0x6000, 0x7e00),
        ];
        let bias = load_bias(&segments, 0x7f00_0000_1000, 0x1000).unwrap();
        assert_eq!(bias.wrapping_add(0x2120), 0x7f00_0000_1120);
        // An offset inside a segment, not at its page, still finds it.
        let bias = load_bias(&segments, 0x7f00_0000_1200, 0x1200).unwrap();
        assert_eq!(bias.wrapping_add(0x2200), 0x7f00_0000_1200);
        assert_eq!(load_bias(&segments, 0x1000, 0x9000), None);
    }

    #[test]
    fn a_patched_page_of_code_is_its_files_again() {
        // The sampler's copy of the executable's page 0x2000 (anonymous, executable) sits
        // between the file's pages whose offsets it continues; the trampolines' page below
        // the executable, and a JIT page beside a library, are left as they are.
        let text = "\
5581f09ff000-5581f0a00000 r-xp 00000000 00:00 0
5581f0a00000-5581f0a01000 r--p 00000000 fe:01 1234 /usr/bin/demo
5581f0a01000-5581f0a02000 r-xp 00001000 fe:01 1234 /usr/bin/demo
5581f0a02000-5581f0a03000 r-xp 00000000 00:00 0
5581f0a03000-5581f0a05000 r-xp 00003000 fe:01 1234 /usr/bin/demo
7f1c2a626000-7f1c2a77b000 r-xp 00026000 fe:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2a77b000-7f1c2a77c000 rwxp 00000000 00:00 0
7f1c2a77c000-7f1c2a77d000 r-xp 00000000 00:00 0
";
        let vmas = parse(text);
        assert_eq!(vmas[3].path.as_deref(), Some("/usr/bin/demo".as_ref()));
        assert_eq!(vmas[3].file_id.inode, 1234);
        assert_eq!(vmas[3].file_offset(0x5581f0a02010), Some(0x2010));
        assert_eq!(vmas[0].path, None);
        assert_eq!(vmas[6].path, None);
        assert_eq!(vmas[7].path, None);
    }

    #[test]
    fn parses_file_backed_and_anonymous_mappings() {
        let vmas = parse(SAMPLE);
        assert_eq!(vmas.len(), 8);
        assert_eq!(uprobe_area(SAMPLE), Some(0x7fff_ffff_e000));
        assert_eq!(uprobe_area("garbage"), None);
        assert_eq!(vmas[1].path.as_deref(), Some("/usr/bin/demo".as_ref()));
        assert_eq!(
            vmas[1].file_id,
            FileId {
                device: "fe:01".to_owned(),
                inode: 1234
            }
        );
        assert_eq!(
            vmas[1].file_in(7),
            PathBuf::from("/proc/7/map_files/5581f0a01000-5581f0a02000")
        );
        assert!(vmas[1].executable && !vmas[0].executable);
        assert_eq!(vmas[2].path, None);
        assert_eq!(vmas[5].path.as_deref(), Some("/tmp/a b".as_ref()));
        assert_eq!(vmas[6].path, None);
        assert_eq!(vmas[4].file_offset(0x7f1c2a626010), Some(0x26010));
        assert_eq!(vmas[4].file_offset(0x7f1c2a77b000), None);
    }
}
