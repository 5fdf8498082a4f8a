//! The `allocscope/v1` JSON export: the profile model serialized as is (docs/json-schema.md
//! documents every field).

use std::io::Write;

use crate::profile::Profile;

/// Writes `profile` as pretty-printed JSON with a trailing newline.
pub fn write(profile: &Profile, out: &mut dyn Write) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, profile)?;
    writeln!(out)
}
