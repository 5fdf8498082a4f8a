//! The layout check of `cargo xtask check`, both ways: every file and folder that
//! docs/layout.md (the source tree a newcomer reads first) names exists, and every file
//! under its top-level folders is named (see [`unnamed`] for how). Its listing names a top-level folder
//! at the start of a line (`sampler-ebpf/`, `sampler-user/src/`) and then, in the lines
//! under it, files (`sample/emit.rs`, `attach.md`) and folders (`top/`); each must be found
//! under that top-level folder, by its path's end. Module names without an extension
//! (`unwind`, `symbolize`) are prose and not checked.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

/// Extensions of the files the listing names.
const FILES: [&str; 5] = [".rs", ".md", ".py", ".c", ".sh"];

/// Files every crate has, named by naming their folder: they need no line of their own.
const STRUCTURAL: [&str; 5] = ["Cargo.toml", "build.rs", "lib.rs", "main.rs", "mod.rs"];

/// The listing cut by top-level folder: each folder, the tokens of its lines.
fn sections(listing: &str) -> Vec<(String, Vec<String>)> {
    let mut sections: Vec<(String, Vec<String>)> = Vec::new();
    for line in listing.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        let mut rest = line;
        if !line.starts_with(' ') && first.ends_with('/') {
            sections.push((first.to_owned(), Vec::new()));
            rest = &line[first.len()..];
        }
        let Some((_, tokens)) = sections.last_mut() else {
            continue;
        };
        tokens.extend(
            rest.split(|c: char| !(c.is_alphanumeric() || "_./-*".contains(c)))
                .map(|t| t.trim_end_matches('.'))
                .filter(|t| !t.is_empty())
                .map(str::to_owned),
        );
    }
    sections
}

/// Entries of `listing` (the first fenced block of layout.md) not found under `workspace`:
/// (top-level folder, entry).
pub fn missing(listing: &str, workspace: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut missing = Vec::new();
    for (root, tokens) in sections(listing) {
        let entries = walk(&workspace.join(&root))
            .with_context(|| format!("layout.md names {root}, which cannot be read"))?;
        for token in tokens {
            // What builds and runs make (target/screenshots/) is not in the tree.
            if token.starts_with("target/") || token.contains('*') {
                continue;
            }
            let named = FILES.iter().any(|e| token.ends_with(e))
                || (token.ends_with('/') && token.len() > 1 && !token.starts_with('/'));
            if named && !entries.iter().any(|e| ends_with_path(e, &token)) {
                missing.push((root.clone(), token));
            }
        }
    }
    Ok(missing)
}

/// Files under the listing's top-level folders that it does not name: (folder, file). A
/// file is named by its path's end (`sample/emit.rs`, `emit.rs`), by its module's name in
/// prose (`unwind` for `unwind.rs`), by a pattern (`tests/*.rs`), or, for what every crate
/// has (`Cargo.toml`, `lib.rs`, `mod.rs`, …) and for files that are not Rust (fixtures,
/// scripts, images), by naming the folder it is in (a crate's root and `src/` need none).
pub fn unnamed(listing: &str, workspace: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut unnamed = Vec::new();
    for (root, tokens) in sections(listing) {
        let entries = walk(&workspace.join(&root))
            .with_context(|| format!("layout.md names {root}, which cannot be read"))?;
        for file in entries.iter().filter(|e| !e.ends_with('/')) {
            let name = file.rsplit('/').next().unwrap_or(file);
            let folders: Vec<&str> = file.split('/').collect();
            let folders = &folders[..folders.len() - 1];
            // A folder is named by its path's end or, as a module, by its name in prose.
            let folder_named = |i: usize| {
                let path = format!("{}/", folders[..=i].join("/"));
                tokens
                    .iter()
                    .any(|t| ends_with_path(&path, t) || t == folders[i])
            };
            let by_folder = (STRUCTURAL.contains(&name) || !name.ends_with(".rs"))
                && (folders.is_empty()
                    || folders == ["src"]
                    || (0..folders.len()).any(folder_named));
            let by_name = tokens.iter().any(|t| {
                ends_with_path(file, t)
                    || name.strip_suffix(".rs") == Some(t.as_str())
                    || t.strip_suffix("*.rs").is_some_and(|dir| {
                        file.starts_with(dir) && !file[dir.len()..].contains('/')
                    })
            });
            if !by_folder && !by_name {
                unnamed.push((root.clone(), file.clone()));
            }
        }
    }
    Ok(unnamed)
}

/// Whether `path` (relative to a top-level folder) is `token` or ends with `/token`.
fn ends_with_path(path: &str, token: &str) -> bool {
    path == token || path.ends_with(&format!("/{token}"))
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
    let shown = |found: Vec<(String, String)>| -> Vec<String> {
        found.iter().map(|(r, e)| format!("  {r}{e}")).collect()
    };
    let missing = shown(missing(listing, workspace)?);
    if !missing.is_empty() {
        bail!(
            "docs/layout.md names what does not exist:\n{}",
            missing.join("\n")
        );
    }
    let unnamed = shown(unnamed(listing, workspace)?);
    if !unnamed.is_empty() {
        bail!(
            "docs/layout.md does not name these files (name each, or its module, where it \
             belongs):\n{}",
            unnamed.join("\n")
        );
    }
    println!("xtask: docs/layout.md names every file there is, and nothing that is not there");
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

    #[test]
    fn a_file_the_listing_does_not_name_is_said() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        // sampler-common's files: each named by its path, its module, a pattern or its
        // folder, except kernel.rs.
        let listing = "\
sampler-common/   src/event.rs, geometric (the draw), src/python/*.rs, cookie.rs, usdt.rs,
                  preload.rs, patch.rs
";
        let unnamed = unnamed(listing, workspace).unwrap();
        let names: Vec<&str> = unnamed.iter().map(|(_, e)| e.as_str()).collect();
        assert_eq!(names, ["src/kernel.rs"]);
    }
}
