//! The contract check of `cargo xtask check`: a map of the eBPF object is looked up by its
//! constant in `sampler_common::kernel::maps`, never by a string spelled again elsewhere
//! (a renamed map would then fail at run time, not at build time). A literal that is a map's
//! name, passed to a function or method named `map`, `map_mut` or `take_map`, is refused.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _};
use syn::visit::Visit;

/// Lookups that take a map's name.
const LOOKUPS: [&str; 3] = ["map", "map_mut", "take_map"];

/// The map names `kernel.rs` (sampler-common) defines in its `maps` module.
pub fn map_names(kernel_rs: &str) -> anyhow::Result<HashSet<String>> {
    let file = syn::parse_file(kernel_rs).context("parsing sampler-common's kernel.rs")?;
    let mut names = HashSet::new();
    for item in &file.items {
        let syn::Item::Mod(module) = item else {
            continue;
        };
        if module.ident != "maps" {
            continue;
        }
        for item in module.content.iter().flat_map(|(_, items)| items) {
            if let syn::Item::Const(constant) = item {
                if let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) = &*constant.expr
                {
                    names.insert(s.value());
                }
            }
        }
    }
    Ok(names)
}

/// Map names looked up by a literal in `source`.
pub fn literal_lookups(source: &str, names: &HashSet<String>) -> anyhow::Result<Vec<String>> {
    struct Finder<'a> {
        names: &'a HashSet<String>,
        found: Vec<String>,
    }
    impl Finder<'_> {
        fn args<'b>(&mut self, args: impl Iterator<Item = &'b syn::Expr>) {
            for arg in args {
                if let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) = arg
                {
                    if self.names.contains(&s.value()) {
                        self.found.push(s.value());
                    }
                }
            }
        }
    }
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
            if LOOKUPS.iter().any(|l| call.method == l) {
                self.args(call.args.iter());
            }
            syn::visit::visit_expr_method_call(self, call);
        }
        fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
            if let syn::Expr::Path(path) = &*call.func {
                let last = path.path.segments.last().map(|s| s.ident.to_string());
                if last.is_some_and(|l| LOOKUPS.contains(&l.as_str())) {
                    self.args(call.args.iter());
                }
            }
            syn::visit::visit_expr_call(self, call);
        }
    }
    let file = syn::parse_file(source)?;
    let mut finder = Finder {
        names,
        found: Vec::new(),
    };
    finder.visit_file(&file);
    Ok(finder.found)
}

/// Fails, naming each, on a map looked up by a literal name under `roots`.
pub fn check(kernel_rs: &Path, roots: &[PathBuf]) -> anyhow::Result<()> {
    let names = map_names(&std::fs::read_to_string(kernel_rs)?)?;
    anyhow::ensure!(!names.is_empty(), "no map names in {}", kernel_rs.display());
    let mut offences = Vec::new();
    for root in roots {
        for file in crate::sizes::rust_files(root)? {
            let text = std::fs::read_to_string(&file)?;
            let found = literal_lookups(&text, &names)
                .with_context(|| format!("parsing {}", file.display()))?;
            offences.extend(
                found
                    .into_iter()
                    .map(|n| format!("  {}: \"{n}\"", file.display())),
            );
        }
    }
    if !offences.is_empty() {
        bail!(
            "maps looked up by a literal name (use sampler_common::kernel::maps):\n{}",
            offences.join("\n")
        );
    }
    println!(
        "xtask: every map looked up by its sampler-common constant ({} names)",
        names.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_looked_up_by_its_literal_name_is_found_and_a_heading_is_not() {
        let names = map_names(
            "pub mod maps { pub const LIVE: &str = \"LIVE\"; pub const RATE: &str = \"RATE\"; }",
        )
        .unwrap();
        assert_eq!(names.len(), 2);
        let source = r#"
            fn f(ebpf: &mut Ebpf) {
                let a = map_mut(ebpf, "RATE");
                let b = ebpf.take_map("LIVE");
                let c = ebpf.map(kernel::maps::LIVE);
                let heading = "LIVE";
                println!("{}", "RATE");
            }
        "#;
        assert_eq!(literal_lookups(source, &names).unwrap(), ["RATE", "LIVE"]);
    }
}
