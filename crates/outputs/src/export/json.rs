//! The `allocscope/v1` JSON export: the profile model serialized as is (docs/json-schema.md
//! documents every field).

use std::io::Write;

use crate::schema::Profile;

/// Bytes serialized before they are handed to `out`.
const CHUNK: usize = 64 * 1024;

/// Writes `profile` as compact JSON with a trailing newline (indented, a build's 23 MB
/// profile was 37 MB and took longer to write, on the command's time: docs/performance.md,
/// "Many short processes: builds and scripts"). Serialized through a buffer of its own
/// type: straight into `out`, each of the millions of tokens
/// was a call through `dyn Write`.
pub(crate) fn write(profile: &Profile, out: &mut dyn Write) -> std::io::Result<()> {
    let mut chunks = std::io::BufWriter::with_capacity(CHUNK, out);
    serde_json::to_writer(&mut chunks, profile)?;
    writeln!(chunks)?;
    chunks.flush()
}
