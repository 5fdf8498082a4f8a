//! Every contact with /proc lives in the target crate's `sys` layer: a string literal that
//! is a path under `/proc` anywhere else in the user-side crates fails the check. Why: a process may exit, exec or
//! be replaced under the same pid at any moment, and the answer to that (and what a path
//! through /proc means for a process in a container) is written once, in `sys`.
//!
//! Literals are found in the token stream (comments are not tokens; doc comments become
//! literals that start with a space), inside macros too (`format!("/proc/{pid}")`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use proc_macro2::{TokenStream, TokenTree};

/// The literals of `source` whose text starts with `/proc` (`"…"`, `b"…"`, raw strings).
pub fn proc_literals(source: &str) -> anyhow::Result<Vec<String>> {
    let tokens: TokenStream = source
        .parse()
        .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
    let mut found = Vec::new();
    collect(tokens, &mut found);
    Ok(found)
}

fn collect(tokens: TokenStream, found: &mut Vec<String>) {
    for token in tokens {
        match token {
            TokenTree::Group(group) => collect(group.stream(), found),
            TokenTree::Literal(literal) => {
                let text = literal.to_string();
                let body = text.trim_start_matches(['b', 'r', '#']);
                if ["\"/proc/", "\"/proc\""]
                    .iter()
                    .any(|p| body.starts_with(p))
                {
                    found.push(text);
                }
            }
            TokenTree::Ident(_) | TokenTree::Punct(_) => {}
        }
    }
}

/// Fails, naming each, on a `/proc` literal in a file under `roots` outside `sys`.
pub fn check(sys: &Path, roots: &[PathBuf]) -> anyhow::Result<()> {
    let mut offences = Vec::new();
    for root in roots {
        for file in crate::sizes::rust_files(root)? {
            if file.starts_with(sys) {
                continue;
            }
            let text = std::fs::read_to_string(&file)?;
            let found =
                proc_literals(&text).with_context(|| format!("reading {}", file.display()))?;
            offences.extend(found.iter().map(|l| format!("  {}: {l}", file.display())));
        }
    }
    if !offences.is_empty() {
        bail!(
            "/proc spelled outside the sys layer (add a reader to {}):\n{}",
            sys.display(),
            offences.join("\n")
        );
    }
    println!("xtask: /proc is read only through the sys layer");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_proc_paths_in_calls_and_macros_but_not_in_comments_or_docs() {
        let source = r##"
            /// /proc/PID/maps, documented.
            fn f(pid: u32) {
                // "/proc/self/maps" in a comment
                let _ = std::fs::read("/proc/self/maps");
                let _ = format!("/proc/{pid}/exe");
                let _ = b"/proc/1";
                let _ = r#"/proc"#;
                let _ = "the /proc file system";
                let _ = "/process";
            }
        "##;
        assert_eq!(
            proc_literals(source).unwrap(),
            [
                "\"/proc/self/maps\"",
                "\"/proc/{pid}/exe\"",
                "b\"/proc/1\"",
                "r#\"/proc\"#"
            ]
        );
    }
}
