//! HTTP headers the sinks send (`Authorization: Bearer …`, `X-Scope-OrgID: tenant`): from a
//! file (`--headers-file`) and from the environment (`ALLOCSCOPE_HEADERS`), never from the
//! command line, where every user of the host could read a secret in `ps`.
//!
//! The file has a `Name: value` per line (`#` comments, blank lines skipped); the variable
//! is `Name=value,Name=value` (OpenTelemetry's `OTEL_EXPORTER_OTLP_HEADERS` form). Names
//! must be HTTP tokens and values must not break a line: a header cannot smuggle another.
//! The file must be neither writable by other users (they could redirect what we send) nor
//! readable by them (it holds secrets), and at most [`MAX_FILE_BYTES`] long.

use std::{os::unix::fs::MetadataExt as _, path::Path};

use crate::config::BadInput;

/// Bytes a headers file may hold (a few headers; a 3 GB file was read whole).
pub(crate) const MAX_FILE_BYTES: u64 = 64 * 1024;

/// The variable the headers may come from.
pub(crate) const ENV: &str = "ALLOCSCOPE_HEADERS";

/// Headers, in order, names as given.
pub(crate) type Headers = Vec<(String, String)>;

/// The headers of `file` (if given) then of [`ENV`] (if set).
pub(crate) fn load(file: Option<&Path>) -> Result<Headers, BadInput> {
    let mut headers = Vec::new();
    if let Some(file) = file {
        let shown = file.display();
        let meta = std::fs::metadata(file)
            .map_err(|e| BadInput(format!("invalid --headers-file {shown}: {e}")))?;
        if !meta.is_file() {
            return Err(BadInput(format!(
                "invalid --headers-file {shown}: not a regular file"
            )));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(BadInput(format!(
                "invalid --headers-file {shown}: writable by other users (chmod go-w)"
            )));
        }
        if meta.mode() & 0o044 != 0 {
            return Err(BadInput(format!(
                "invalid --headers-file {shown}: readable by other users, who would read its secrets (chmod 600)"
            )));
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(BadInput(format!(
                "invalid --headers-file {shown}: {} bytes, more than the {MAX_FILE_BYTES} a headers file may hold",
                meta.len()
            )));
        }
        let bytes = crate::infile::read_regular(file)
            .map_err(|e| BadInput(format!("invalid --headers-file {shown}: {e}")))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| BadInput(format!("invalid --headers-file {shown}: not UTF-8 text")))?;
        headers.extend(
            parse_file(&text)
                .map_err(|e| BadInput(format!("invalid --headers-file {shown}: {e}")))?,
        );
    }
    if let Ok(text) = std::env::var(ENV) {
        headers.extend(parse_env(&text).map_err(|e| BadInput(format!("invalid {ENV}: {e}")))?);
    }
    Ok(headers)
}

/// `Name: value` lines.
pub(crate) fn parse_file(text: &str) -> Result<Headers, String> {
    text.lines()
        .enumerate()
        .map(|(n, line)| (n + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
        .map(|(n, line)| {
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| format!("line {n}: expected `Name: value`"))?;
            checked(name, value).map_err(|e| format!("line {n}: {e}"))
        })
        .collect()
}

/// `Name=value,Name=value`.
pub(crate) fn parse_env(text: &str) -> Result<Headers, String> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("expected `Name=value`, got {pair:?}"))?;
            checked(name, value)
        })
        .collect()
}

fn checked(name: &str, value: &str) -> Result<(String, String), String> {
    let (name, value) = (name.trim(), value.trim());
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(format!("{name:?} is not a header name"));
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(format!("the value of {name} holds a control character"));
    }
    Ok((name.to_owned(), value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_file_of_headers() {
        let text = "# tenant\nX-Scope-OrgID: team-a\n\nAuthorization: Bearer abc:def\n";
        assert_eq!(
            parse_file(text).unwrap(),
            [
                ("X-Scope-OrgID".to_owned(), "team-a".to_owned()),
                ("Authorization".to_owned(), "Bearer abc:def".to_owned()),
            ]
        );
        assert!(parse_file("no colon here").unwrap_err().contains("line 1"));
        assert!(parse_file("Bad Name: x").is_err());
    }

    #[test]
    fn reads_the_environment_form() {
        assert_eq!(
            parse_env("authorization=Bearer x, x-scope-orgid=t").unwrap(),
            [
                ("authorization".to_owned(), "Bearer x".to_owned()),
                ("x-scope-orgid".to_owned(), "t".to_owned()),
            ]
        );
        assert!(parse_env("novalue").is_err());
    }

    #[test]
    fn a_value_cannot_start_another_header() {
        assert!(checked("X-A", "a\r\nX-B: b").is_err());
    }
}
