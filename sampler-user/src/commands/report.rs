//! `allocscope report FILE.json`: look at a recording again without re-running it — print
//! its top stacks, or convert it to pprof, folded or SVG.

use anyhow::Context as _;

use crate::{
    cli::ReportArgs,
    config::BadInput,
    export::{self, Format, Value},
    output_check,
    profile::{Profile, SCHEMA},
    summary,
};

/// Reads an `allocscope/v1` JSON profile.
pub fn read(path: &std::path::Path) -> Result<Profile, BadInput> {
    // Not a FIFO (which would block) nor a device (`/dev/zero` never ends).
    let bytes = crate::infile::read_regular(path)
        .map_err(|e| BadInput(format!("cannot read {}: {e}", path.display())))?;
    let profile: Profile = serde_json::from_slice(&bytes).map_err(|e| {
        BadInput(format!(
            "{} is not an {SCHEMA} JSON profile (convert from the JSON that `record` writes): {e}",
            path.display()
        ))
    })?;
    if profile.schema != SCHEMA {
        return Err(BadInput(format!(
            "{}: schema {:?}, expected {SCHEMA:?}",
            path.display(),
            profile.schema
        )));
    }
    profile
        .check()
        .map_err(|why| BadInput(format!("{}: {why}", path.display())))?;
    Ok(profile)
}

/// Prints the table on stdout and writes the conversion, if asked.
pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    // The output's format is known (or refused) before anything is read or printed.
    let output = match &args.output {
        Some(output) => {
            let format = match args.format {
                Some(format) => format,
                None => Format::for_path(output).map_err(BadInput)?,
            };
            output_check::check_output_file(output)?;
            Some((output, format))
        }
        None => None,
    };
    let profile = read(&args.input)?;
    let summary = summary::render(&profile, args.top, args.processes);
    if output.is_some() {
        // Beside a file written, the summary goes where `record`'s does.
        crate::say_raw!("{summary}");
    } else {
        // The summary is the output.
        crate::show!("{summary}");
    }
    if let Some((output, format)) = output {
        let value = args.value.unwrap_or_else(|| Value::default_for(&profile));
        if profile.alloc_only && value.needs_frees() {
            return Err(BadInput(format!(
                "{}: recorded with --alloc-only, it has no in-use values to show",
                args.input.display()
            ))
            .into());
        }
        if let Some(empty) = value.empty_in(&profile, format) {
            log::warn!("{empty}");
        }
        export::write_file(&profile, format, value, output)
            .with_context(|| format!("writing {}", output.display()))?;
        crate::say!("wrote {} ({})", output.display(), format.name());
    }
    Ok(())
}
