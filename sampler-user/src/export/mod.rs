//! ⑥ One exporter per format, each over `&Profile`.

pub mod folded;
pub mod json;

use std::io::Write;

use crate::profile::Profile;

/// Output formats of `record`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The `allocscope/v1` JSON schema (estimates with bounds).
    Json,
    /// Folded stacks (`root;...;leaf bytes`) for flame-graph tools.
    Folded,
}

impl Format {
    /// The name users type (`--format NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Folded => "folded",
        }
    }
}

/// Writes `profile` in `format`.
pub fn write(profile: &Profile, format: Format, out: &mut dyn Write) -> std::io::Result<()> {
    match format {
        Format::Json => json::write(profile, out),
        Format::Folded => folded::write(profile, out),
    }
}
