//! The size check of `cargo xtask test`: no source file over [`MAX_FILE_LINES`] lines and no
//! function over [`MAX_FN_LINES`] lines outside tests, so that every file is one concern a
//! newcomer reads in one sitting and every function one step. Test code (`#[cfg(test)]`
//! modules, `#[test]` functions, the `tests` crate) is not counted: a test's length is its
//! scenario.
//!
//! An exception says why where it is: a `// size-exception: <reason>` comment within the
//! lines above the function (among its doc comment and attributes) or, for a file, in its
//! first ten lines. The check fails on an exception without a reason.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use syn::visit::Visit;

/// Longest source file, counted without its test modules.
pub const MAX_FILE_LINES: usize = 700;
/// Longest function, from its `fn` to its closing brace.
pub const MAX_FN_LINES: usize = 80;
const MARKER: &str = "size-exception:";

/// One file or function over its limit.
#[derive(Debug, PartialEq, Eq)]
pub struct Oversize {
    pub file: PathBuf,
    /// The function, or `None` for the whole file.
    pub function: Option<String>,
    pub lines: usize,
    /// The reason given at the site, if any.
    pub reason: Option<String>,
}

/// Fails, naming each, if a file or function under `roots` is over its limit without a
/// reason given at the site; prints the exceptions with their reasons.
pub fn check(roots: &[PathBuf]) -> anyhow::Result<()> {
    let mut found = Vec::new();
    for root in roots {
        for file in rust_files(root)? {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            found.extend(oversizes(&file, &text).with_context(|| format!("{}", file.display()))?);
        }
    }
    let (excused, unexcused): (Vec<_>, Vec<_>) =
        found.into_iter().partition(|o| o.reason.is_some());
    for o in &excused {
        eprintln!(
            "xtask: size exception {} ({} lines): {}",
            site(o),
            o.lines,
            o.reason.as_deref().unwrap_or_default()
        );
    }
    if unexcused.is_empty() {
        eprintln!(
            "xtask: no file over {MAX_FILE_LINES} lines, no function over {MAX_FN_LINES} lines \
             ({} exceptions, each with its reason)",
            excused.len()
        );
        return Ok(());
    }
    let shown: Vec<String> = unexcused
        .iter()
        .map(|o| format!("{} ({} lines)", site(o), o.lines))
        .collect();
    bail!(
        "over the size limits (files {MAX_FILE_LINES} lines, functions {MAX_FN_LINES}; split \
         it, or say why at the site with `// {MARKER} <reason>`):\n  {}",
        shown.join("\n  ")
    )
}

fn site(o: &Oversize) -> String {
    match &o.function {
        Some(f) => format!("{}: fn {f}", o.file.display()),
        None => o.file.display().to_string(),
    }
}

/// Every `.rs` file under `root`, sorted.
pub fn rust_files(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The file (if over, test modules left out) and the functions over their limits in `text`.
pub fn oversizes(file: &Path, text: &str) -> anyhow::Result<Vec<Oversize>> {
    let syntax = syn::parse_file(text).context("parsing")?;
    let lines: Vec<&str> = text.lines().collect();
    let mut visitor = Functions {
        lines: &lines,
        file,
        test_lines: 0,
        found: Vec::new(),
    };
    visitor.visit_file(&syntax);
    let counted = lines.len().saturating_sub(visitor.test_lines);
    let mut found = visitor.found;
    if counted > MAX_FILE_LINES {
        let head = lines.iter().take(10).copied();
        found.insert(
            0,
            Oversize {
                file: file.to_path_buf(),
                function: None,
                lines: counted,
                reason: reason_in(head),
            },
        );
    }
    Ok(found)
}

/// The reason after the marker in `lines`, if one is given.
fn reason_in<'a>(lines: impl Iterator<Item = &'a str>) -> Option<String> {
    lines
        .filter_map(|line| line.split_once(MARKER).map(|(_, r)| r.trim().to_owned()))
        .find(|r| !r.is_empty())
}

struct Functions<'a> {
    lines: &'a [&'a str],
    file: &'a Path,
    /// Lines in test modules.
    test_lines: usize,
    found: Vec<Oversize>,
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || (a.path().is_ident("cfg")
                && a.parse_args::<syn::Path>()
                    .is_ok_and(|p| p.is_ident("test")))
    })
}

impl Functions<'_> {
    /// Records the function spanning from `first` (its first attribute or doc line) over
    /// `sig_line..=end` when it is over the limit.
    fn function(&mut self, name: String, first: usize, sig_line: usize, end: usize) {
        let length = end + 1 - sig_line;
        if length <= MAX_FN_LINES {
            return;
        }
        // Lines are 1-based; the marker may sit on the line above the first attribute.
        let from = first.saturating_sub(2);
        let to = sig_line.min(self.lines.len());
        let reason = reason_in(self.lines[from..to].iter().copied());
        self.found.push(Oversize {
            file: self.file.to_path_buf(),
            function: Some(name),
            lines: length,
            reason,
        });
    }
}

impl Functions<'_> {
    /// A function with its attributes (doc comments among them), signature and body.
    fn function_item(&mut self, attrs: &[syn::Attribute], sig: &syn::Signature, body: &syn::Block) {
        let first = first_line(attrs, sig);
        let start = sig.fn_token.span.start().line;
        let end = body.brace_token.span.close().end().line;
        self.function(sig.ident.to_string(), first, start, end);
    }
}

fn first_line(attrs: &[syn::Attribute], sig: &syn::Signature) -> usize {
    attrs
        .iter()
        .map(|a| a.pound_token.span.start().line)
        .chain(std::iter::once(sig.fn_token.span.start().line))
        .min()
        .unwrap_or(1)
}

impl<'ast> Visit<'ast> for Functions<'_> {
    fn visit_item_mod(&mut self, module: &'ast syn::ItemMod) {
        if is_test(&module.attrs) {
            if let Some((brace, _)) = &module.content {
                let span = brace.span;
                self.test_lines += span.close().end().line + 1 - module.mod_token.span.start().line;
            }
            return;
        }
        syn::visit::visit_item_mod(self, module);
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_test(&item.attrs) {
            self.function_item(&item.attrs, &item.sig, &item.block);
            syn::visit::visit_item_fn(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_test(&item.attrs) {
            self.function_item(&item.attrs, &item.sig, &item.block);
            syn::visit::visit_impl_item_fn(self, item);
        }
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if let Some(block) = &item.default {
            self.function_item(&item.attrs, &item.sig, block);
        }
        syn::visit::visit_trait_item_fn(self, item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long_fn(name: &str, body_lines: usize, above: &str) -> String {
        let body = "    let _x = 1;\n".repeat(body_lines);
        format!("{above}/// Doc.\nfn {name}() {{\n{body}}}\n")
    }

    #[test]
    fn a_long_function_is_found_and_a_short_one_is_not() {
        let text = long_fn("long", 79, "") + &long_fn("short", 78, "");
        let found = oversizes(Path::new("x.rs"), &text).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].function.as_deref(), Some("long"));
        assert_eq!(found[0].lines, 81);
        assert_eq!(found[0].reason, None);
    }

    #[test]
    fn a_reason_at_the_site_excuses_and_an_empty_one_does_not() {
        let text = long_fn("a", 90, "// size-exception: one match over the opcodes\n")
            + &long_fn("b", 90, "// size-exception:\n");
        let found = oversizes(Path::new("x.rs"), &text).unwrap();
        assert_eq!(
            found[0].reason.as_deref(),
            Some("one match over the opcodes")
        );
        assert_eq!(found[1].reason, None);
    }

    #[test]
    fn test_code_is_not_counted() {
        let tests = long_fn("in_tests", 800, "");
        let text = format!(
            "fn a() {{}}\n#[cfg(test)]\nmod tests {{\n{tests}}}\n#[test]\n{}",
            long_fn("t", 100, "")
        );
        assert!(oversizes(Path::new("x.rs"), &text).unwrap().is_empty());
    }

    #[test]
    fn a_long_file_is_found_with_its_reason_from_its_head() {
        let text = "fn a() {}\n".repeat(701);
        let found = oversizes(Path::new("x.rs"), &text).unwrap();
        assert_eq!((found[0].function.clone(), found[0].lines), (None, 701));
        let excused = format!("//! x\n// size-exception: a table\n{text}");
        let found = oversizes(Path::new("x.rs"), &excused).unwrap();
        assert_eq!(found[0].reason.as_deref(), Some("a table"));
    }

    #[test]
    fn methods_and_nested_functions_count() {
        let inner = long_fn("inner", 85, "");
        let text = format!(
            "struct S;\nimpl S {{\n{}}}\nfn outer() {{\n{inner}}}\n",
            long_fn("m", 85, "")
        );
        let names: Vec<_> = oversizes(Path::new("x.rs"), &text)
            .unwrap()
            .into_iter()
            .filter_map(|o| o.function)
            .collect();
        assert_eq!(names, ["m", "outer", "inner"]);
    }
}
