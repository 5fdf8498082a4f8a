//! `allocscope diff BASE.json NEW.json`: read two saved recordings, print what changed
//! beyond the sampling noise ([`crate::diff`]), write the diff where asked, and with
//! `--fail-on-growth` exit 1 on a significant growth above the threshold.

use std::path::PathBuf;

use anyhow::Context as _;

use super::report;
use crate::{
    cli::DiffArgs,
    config::BadInput,
    diff::{self, render, Basis},
    export::{self, Format},
    outfile, output_check,
};

/// What a file named on `-o` receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Json,
    Folded,
    Pprof,
    Html,
}

fn output_of(path: &std::path::Path) -> Result<Output, BadInput> {
    match Format::for_path(path).map_err(BadInput)? {
        Format::Json => Ok(Output::Json),
        Format::Folded => Ok(Output::Folded),
        Format::Pprof => Ok(Output::Pprof),
        Format::Html => Ok(Output::Html),
        Format::Svg | Format::Speedscope => Err(BadInput(format!(
            "{}: a diff is written as .json, .folded, .pb.gz or .html (a differential flame \
             graph; or make one from the .folded with inferno-flamegraph)",
            path.display()
        ))),
    }
}

/// Runs the diff; the exit code is 1 when `--fail-on-growth` found a growth above it.
pub fn run(args: DiffArgs) -> anyhow::Result<u8> {
    let outputs: Vec<(PathBuf, Output)> = args
        .output
        .iter()
        .map(|path| Ok((path.clone(), output_of(path)?)))
        .collect::<Result<_, BadInput>>()?;
    for (path, _) in &outputs {
        output_check::check_output_file(path)?;
    }
    if let Some(level) = args.confidence.filter(|c| !(*c > 0.0 && *c < 1.0)) {
        return Err(BadInput(format!(
            "invalid --confidence {level}: must be strictly between 0 and 1"
        ))
        .into());
    }
    if let Some(pct) = args
        .fail_on_growth
        .filter(|p| !(p.is_finite() && *p >= 0.0))
    {
        return Err(BadInput(format!(
            "invalid --fail-on-growth {pct}: a percentage, 0 or more"
        ))
        .into());
    }
    let base = report::read(&args.base)?;
    let new = report::read(&args.new)?;
    let confidence = args.confidence.unwrap_or(new.sampling.confidence);
    let asked = match (args.per_run, args.per_second) {
        (true, _) => Some(Basis::PerRun),
        (_, true) => Some(Basis::PerSecond),
        _ => None,
    };
    let found = diff::diff(&base, &new, confidence, args.by_command, asked);
    crate::show!(
        "{}",
        render::table(
            &found,
            &args.base.to_string_lossy(),
            &args.new.to_string_lossy()
        )
    );
    let names = (
        crate::text::printable(&args.base.to_string_lossy()).into_owned(),
        crate::text::printable(&args.new.to_string_lossy()).into_owned(),
    );
    for (path, output) in &outputs {
        write_output(path, *output, &found, &new, &names)?;
    }
    let Some(threshold) = args.fail_on_growth else {
        return Ok(0);
    };
    let grown = diff::grown_beyond(&found, threshold);
    if grown.is_empty() {
        return Ok(0);
    }
    for c in &grown {
        crate::say!(
            "significant growth above {threshold}%: {} ({})",
            c.key
                .iter()
                .skip(1)
                .take(3)
                .map(|n| crate::format::sanitize(n))
                .collect::<Vec<_>>()
                .join(" ← "),
            crate::format::sanitize(&c.commands.join(", "))
        );
    }
    Ok(1)
}

/// Writes `found` to `path` as `output` (`new`: the new recording, for pprof; `names`: the
/// two files, for the HTML report's title).
fn write_output(
    path: &std::path::Path,
    output: Output,
    found: &diff::Diff,
    new: &crate::profile::Profile,
    names: &(String, String),
) -> anyhow::Result<()> {
    outfile::write_replacing(path, |out| match output {
        Output::Json => render::json(found, out),
        Output::Folded => render::folded(found, out),
        Output::Html => {
            export::html::page(&export::html::diff_data(found, &names.0, &names.1), out)
        }
        Output::Pprof => {
            let profile = render::difference_profile(found, new);
            export::pprof::write_noted(&profile, std::slice::from_ref(&profile.sampling.model), out)
        }
    })
    .with_context(|| format!("writing {}", path.display()))?;
    crate::say!("wrote {}", path.display());
    Ok(())
}
