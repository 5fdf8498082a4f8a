//! The structures of a Go executable's runtime as its DWARF lays them out: a field's place
//! changes between releases, so it is read from the file rather than from a table per
//! release. Pure: the file's bytes in, sizes and offsets out.

use std::borrow::Cow;

use object::{Object as _, ObjectSection as _};

/// The structures of a Go executable's DWARF that a reader asks about: each one's size
/// and members' offsets.
#[derive(Default)]
pub(crate) struct Types {
    /// `(structure, member or "" for its size, value)`.
    found: Vec<(String, String, u64)>,
}

impl Types {
    /// The sizes and members of the structures named `wanted` (read until each is found).
    pub(crate) fn read(file: &object::File, wanted: &[&str]) -> Result<Types, String> {
        let section = |id: gimli::SectionId| -> Result<Cow<[u8]>, String> {
            match file.section_by_name(id.name()) {
                Some(section) => uncompressed(&section),
                None => Ok(Cow::Borrowed(&[][..])),
            }
        };
        if file.section_by_name(".debug_info").is_none() {
            return Err("no DWARF (built with -ldflags=-w)".into());
        }
        let sections = gimli::DwarfSections::load(section)?;
        let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, gimli::LittleEndian));
        let mut found = Vec::new();
        let mut units = dwarf.units();
        let broken = |e: gimli::Error| format!("its DWARF does not parse: {e}");
        while let Some(header) = units.next().map_err(broken)? {
            let unit = dwarf.unit(header).map_err(broken)?;
            Self::structures_of(&dwarf, &unit, wanted, &mut found).map_err(broken)?;
            if wanted.iter().all(|s| {
                found
                    .iter()
                    .any(|(name, member, _)| name == s && member.is_empty())
            }) {
                break;
            }
        }
        Ok(Types { found })
    }

    /// Adds the sizes and members of the `wanted` structures among `unit`'s top-level
    /// entries.
    fn structures_of<R: gimli::Reader>(
        dwarf: &gimli::Dwarf<R>,
        unit: &gimli::Unit<R>,
        wanted: &[&str],
        found: &mut Vec<(String, String, u64)>,
    ) -> gimli::Result<()> {
        let name_of = |entry: &gimli::DebuggingInformationEntry<R>| -> gimli::Result<String> {
            Ok(match entry.attr_value(gimli::DW_AT_name) {
                Some(value) => dwarf
                    .attr_string(unit, value)?
                    .to_string_lossy()?
                    .into_owned(),
                None => String::new(),
            })
        };
        let mut tree = unit.entries_tree(None)?;
        let root = tree.root()?;
        let mut children = root.children();
        while let Some(node) = children.next()? {
            let entry = node.entry();
            if entry.tag() != gimli::DW_TAG_structure_type {
                continue;
            }
            let structure = name_of(entry)?;
            if !wanted.contains(&structure.as_str()) {
                continue;
            }
            let size = entry.attr_value(gimli::DW_AT_byte_size);
            if let Some(size) = size.and_then(|v| v.udata_value()) {
                found.push((structure.clone(), String::new(), size));
            }
            let mut members = node.children();
            while let Some(member) = members.next()? {
                let entry = member.entry();
                let at = entry.attr_value(gimli::DW_AT_data_member_location);
                if let (gimli::DW_TAG_member, Some(at)) = (entry.tag(), at) {
                    if let Some(offset) = at.udata_value() {
                        found.push((structure.clone(), name_of(entry)?, offset));
                    }
                }
            }
        }
        Ok(())
    }

    /// The offset of `structure`'s `member`.
    pub(crate) fn member(&self, structure: &str, member: &str) -> Option<u64> {
        self.found
            .iter()
            .find(|(s, m, _)| s == structure && m == member)
            .map(|f| f.2)
    }

    /// `structure`'s size in bytes.
    pub(crate) fn size(&self, structure: &str) -> Option<u64> {
        self.member(structure, "")
    }
}

/// A section's bytes, inflated if the linker compressed it (Go compresses its DWARF with
/// zlib, `SHF_COMPRESSED`).
fn uncompressed<'a>(section: &object::Section<'a, '_>) -> Result<Cow<'a, [u8]>, String> {
    use std::io::Read as _;
    let compressed = section
        .compressed_data()
        .map_err(|e| format!("its DWARF cannot be read: {e}"))?;
    match compressed.format {
        object::CompressionFormat::None => Ok(Cow::Borrowed(compressed.data)),
        object::CompressionFormat::Zlib => {
            let size = usize::try_from(compressed.uncompressed_size).unwrap_or(usize::MAX);
            // A section larger than a header says is refused, not inflated without end.
            let mut out = Vec::with_capacity(size.min(1 << 30));
            flate2::read::ZlibDecoder::new(compressed.data)
                .take(size as u64)
                .read_to_end(&mut out)
                .map_err(|e| format!("its DWARF does not inflate: {e}"))?;
            Ok(Cow::Owned(out))
        }
        other => Err(format!("its DWARF is compressed as {other:?}")),
    }
}
