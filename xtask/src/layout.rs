//! The layout check of `cargo xtask check`: every file and folder that docs/layout.md (the
//! source tree a newcomer reads first) names exists. Its listing names a top-level folder
//! at the start of a line (`sampler-ebpf/`, `sampler-user/src/`) and then, in the lines
//! under it, files (`sample/emit.rs`, `attach.md`) and folders (`top/`); each must be found
//! under that top-level folder, by its path's end. Module names without an extension
//! (`unwind`, `symbolize`) are prose and not checked.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

/// Extensions of the files the listing names.
const FILES: [&str; 5] = [".rs", ".md", ".py", ".c", ".sh"];

/// Entries of `listing` (the first fenced block of layout.md) not found under `workspace`:
/// (top-level folder, entry).
pub fn missing(listing: &str, workspace: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut root: Option<(String, Vec<String>)> = None;
    let mut missing = Vec::new();
    for line in listing.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        let mut rest = line;
        if !line.starts_with(' ') && first.ends_with('/') {
            let entries = walk(&workspace.join(first))
                .with_context(|| format!("layout.md names {first}, which cannot be read"))?;
            root = Some((first.to_owned(), entries));
            rest = &line[first.len()..];
        }
        let Some((name, entries)) = &root else {
            continue;
        };
        for token in rest.split(|c: char| !(c.is_alphanumeric() || "_./-".contains(c))) {
            // What builds and runs make (target/screenshots/) is not in the tree.
            if token.starts_with("target/") {
                continue;
            }
            let named = FILES.iter().any(|e| token.ends_with(e))
                || (token.ends_with('/') && token.len() > 1 && !token.starts_with('/'));
            if named
                && !entries
                    .iter()
                    .any(|e| e == token || e.ends_with(&format!("/{token}")))
            {
                missing.push((name.clone(), token.to_owned()));
            }
        }
    }
    Ok(missing)
}

/// Every file and folder under `dir`, relative to it (folders with a trailing `/`).
fn walk(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            let relative = path.strip_prefix(dir)?.to_string_lossy().into_owned();
            if path.is_dir() {
                if path
                    .file_name()
                    .is_some_and(|n| n == "target" || n == ".git")
                {
                    continue;
                }
                out.push(format!("{relative}/"));
                dirs.push(path);
            } else {
                out.push(relative);
            }
        }
    }
    Ok(out)
}

/// Fails, naming each, on an entry of docs/layout.md that does not exist.
pub fn check(workspace: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(workspace.join("docs/layout.md"))?;
    let listing = text
        .split("```")
        .nth(1)
        .context("docs/layout.md has no listing")?;
    let missing = missing(listing, workspace)?;
    if !missing.is_empty() {
        let lines: Vec<String> = missing.iter().map(|(r, e)| format!("  {r}: {e}")).collect();
        bail!(
            "docs/layout.md names what does not exist:\n{}",
            lines.join("\n")
        );
    }
    println!("xtask: every file and folder docs/layout.md names exists");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_file_or_folder_that_is_not_there_is_said() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let listing = "\
xtask/            src/main.rs, sizes.rs (sizes), e2e/ scripts, nowhere.rs, gone/
  prose words, fork/exec/exit, /run/allocscope, 1.5 ms
docs/             layout.md, missing.md
";
        let missing = missing(listing, workspace).unwrap();
        let names: Vec<&str> = missing.iter().map(|(_, e)| e.as_str()).collect();
        assert_eq!(names, ["nowhere.rs", "gone/", "missing.md"]);
    }
}
