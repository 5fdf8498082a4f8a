//! The shape check of `cargo xtask test`: a crate's top-level modules depend on each
//! other one way (allocscope-target's sys → probe → collect → stacks, allocscope-engine's
//! profile → recording, sampler-user's config → commands; allocscope-model's stats →
//! schema), so no import cycle may form among them, nor among the files of a folder. A module's dependencies are the `crate::name` paths in its non-test code (comments
//! and `mod tests` blocks left out). Between crates, cargo keeps the graph one way.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _};

/// The package name in the `Cargo.toml` beside `src` (`allocscope-model`), for messages.
fn package_name(src: &Path) -> Option<String> {
    let manifest = std::fs::read_to_string(src.parent()?.join("Cargo.toml")).ok()?;
    let line = manifest.lines().find(|l| l.starts_with("name = "))?;
    Some(line["name = ".len()..].trim_matches('"').to_owned())
}

/// Module → the modules it uses.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// Fails, naming every cycle, if the top-level modules under `src` import each other in a
/// cycle, or if one of `self_contained` imports anything of its crate (the profile's
/// format: a reader of the format reads that folder alone).
pub fn check(src: &Path, self_contained: &[&str]) -> anyhow::Result<()> {
    let graph = module_graph(src)?;
    let name = package_name(src).unwrap_or_else(|| src.display().to_string());
    for leaf in self_contained {
        let uses = graph
            .get(*leaf)
            .with_context(|| format!("no module {leaf}"))?;
        if !uses.is_empty() {
            bail!("{leaf} must import nothing of the crate (it is plain data), but uses {uses:?}");
        }
    }
    let cycles = cycles(&graph);
    if cycles.is_empty() {
        eprintln!(
            "xtask: no import cycle among {name}'s {} modules",
            graph.len()
        );
        return Ok(());
    }
    let shown: Vec<String> = cycles.iter().map(|c| c.join(" ↔ ")).collect();
    bail!(
        "import cycle among {name}'s modules (data must flow one way): {}",
        shown.join("; ")
    )
}

/// Fails, naming every circle, if the files (or subfolders) of a folder under `src`
/// import each other in a circle: siblings that need each other are one module, or share
/// a lower one. A child uses a sibling through `super::name` or `crate::folder::name`
/// (the folder's `mod.rs` is its root, not a sibling). A folder whose root says
/// `// circle-exception: <reason>` has its circles printed with the reason, not refused.
/// Returns how many folders it read.
pub fn check_folders(sources: &[PathBuf]) -> anyhow::Result<usize> {
    let mut circles = Vec::new();
    let mut folders = 0;
    for src in sources {
        let crate_name = package_name(src).unwrap_or_else(|| src.display().to_string());
        let mut found = Vec::new();
        folders += walk_folders(src, &mut Vec::new(), &mut found)?;
        circles.extend(found.into_iter().map(|c| format!("{crate_name} {c}")));
    }
    if circles.is_empty() {
        return Ok(folders);
    }
    bail!(
        "files in a folder import each other in a circle (share a lower module instead):\n  {}",
        circles.join("\n  ")
    )
}

/// `check_folders` under `dir`, the module path `path` (empty at the crate's root).
fn walk_folders(
    dir: &Path,
    path: &mut Vec<String>,
    circles: &mut Vec<String>,
) -> anyhow::Result<usize> {
    let sources = children(dir)?;
    let mut folders = 1;
    for (name, _) in sources.iter().filter(|(_, (_, is_dir))| *is_dir) {
        path.push(name.clone());
        folders += walk_folders(&dir.join(name), path, circles)?;
        path.pop();
    }
    let absolute = format!(
        "crate::{}",
        path.iter().map(|p| format!("{p}::")).collect::<String>()
    );
    let graph: Graph = sources
        .iter()
        .map(|(name, (text, is_dir))| {
            let code = code_only(text);
            let mut uses = references_after(&code, &absolute);
            if !path.is_empty() && !is_dir {
                uses.extend(references_after(&code, "super::"));
            }
            uses.retain(|used| used != name && sources.contains_key(used));
            (name.clone(), uses)
        })
        .collect();
    let shown = if path.is_empty() {
        ".".to_owned()
    } else {
        path.join("/")
    };
    let excepted = ["lib.rs", "main.rs", "mod.rs"]
        .iter()
        .filter_map(|root| std::fs::read_to_string(dir.join(root)).ok())
        .find_map(|text| {
            text.lines().find_map(|l| {
                l.split_once("circle-exception:")
                    .map(|(_, why)| why.trim().to_owned())
            })
        });
    let found = cycles(&graph);
    if excepted.is_some() && found.is_empty() {
        circles.push(format!(
            "{shown}: says circle-exception but has no circle (remove it)"
        ));
    }
    for circle in found {
        let circle = format!("{}: {}", shown, circle.join(" ↔ "));
        match &excepted {
            Some(why) => println!("xtask: circle-exception in {circle} ({why})"),
            None => circles.push(circle),
        }
    }
    Ok(folders)
}

/// Reads every top-level module under `src` (a `name.rs` file or a `name/` directory;
/// `lib.rs` and `main.rs` are the roots, not modules).
fn module_graph(src: &Path) -> anyhow::Result<Graph> {
    let sources = children(src)?
        .into_iter()
        .map(|(name, (text, _))| (name, text))
        .collect();
    Ok(graph_of(&sources))
}

/// The modules directly under `dir`, by name: a `name.rs` file's text, or a `name/`
/// folder's files concatenated (`true`). `lib.rs`, `main.rs` and `mod.rs` are the
/// folder's root, not modules of it.
fn children(dir: &Path) -> anyhow::Result<BTreeMap<String, (String, bool)>> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.is_dir() {
            found.insert(stem.to_owned(), (read_tree(&path)?, true));
        } else if path.extension().is_some_and(|e| e == "rs")
            && !["lib", "main", "mod"].contains(&stem)
        {
            found.insert(stem.to_owned(), (std::fs::read_to_string(&path)?, false));
        }
    }
    Ok(found)
}

/// Every `.rs` file under `dir`, concatenated.
fn read_tree(dir: &Path) -> anyhow::Result<String> {
    let mut text = String::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            text.push_str(&read_tree(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") {
            text.push_str(&std::fs::read_to_string(&path)?);
            text.push('\n');
        }
    }
    Ok(text)
}

/// The dependency graph of modules given by their source text.
fn graph_of(sources: &BTreeMap<String, String>) -> Graph {
    sources
        .iter()
        .map(|(name, text)| {
            let uses = crate_references(&code_only(text))
                .into_iter()
                .filter(|used| used != name && sources.contains_key(used))
                .collect();
            (name.clone(), uses)
        })
        .collect()
}

/// `source` without comment lines and without `mod tests { … }` blocks.
fn code_only(source: &str) -> String {
    let code: String = source
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .map(|line| format!("{line}\n"))
        .collect();
    let mut out = String::with_capacity(code.len());
    let mut rest = code.as_str();
    while let Some(at) = rest.find("mod tests {") {
        out.push_str(&rest[..at]);
        let mut depth = 0usize;
        let mut end = rest.len();
        for (i, c) in rest[at..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = at + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The first path segment of every `crate::…` path in `code`, groups included
/// (`crate::{a::b, c}` uses `a` and `c`).
fn crate_references(code: &str) -> BTreeSet<String> {
    references_after(code, "crate::")
}

/// The first path segment after every `prefix` in `code` (`super::`, `crate::probe::`),
/// groups included.
fn references_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        // `crate::probe::` inside `allocscope_crate::probe::` is another crate's path.
        let preceded = rest[..at].chars().next_back().is_some_and(is_ident);
        rest = &rest[at + prefix.len()..];
        if preceded {
            continue;
        }
        let Some(group) = rest.strip_prefix('{') else {
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            found.insert(name);
            continue;
        };
        // Names at the group's own level, each at the start of an item.
        let (mut depth, mut at_item_start, mut name) = (1usize, true, String::new());
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                break;
            }
            if depth != 1 {
                continue;
            }
            if c == ',' {
                if !name.is_empty() {
                    found.insert(std::mem::take(&mut name));
                }
                at_item_start = true;
            } else if at_item_start {
                if is_ident(c) {
                    name.push(c);
                } else if !name.is_empty() {
                    found.insert(std::mem::take(&mut name));
                    at_item_start = false;
                }
            }
        }
        if !name.is_empty() {
            found.insert(name);
        }
    }
    found
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(modules: &[(&str, &str)]) -> BTreeMap<String, String> {
        modules
            .iter()
            .map(|(name, text)| (name.to_string(), text.to_string()))
            .collect()
    }

    #[test]
    fn references_in_paths_and_groups_not_comments_or_tests() {
        let text = "use crate::{a::b, c, d::{e, f}};\nfn x() { crate::g::h(); }\n\
                    // crate::comment\n#[cfg(test)]\nmod tests { use crate::t; fn y() { {} } }\n\
                    fn z() { crate::after::w() }";
        let found = crate_references(&code_only(text));
        let names: Vec<&str> = found.iter().map(String::as_str).collect();
        assert_eq!(names, ["a", "after", "c", "d", "g"]);
    }

    #[test]
    fn finds_the_cycles_that_were_there() {
        // The shape of the cycle #17 names: stacks and recording, export and summary.
        let graph = graph_of(&sources(&[
            ("stacks", "use crate::recording;"),
            ("recording", "use crate::{stacks, export};"),
            ("export", "use crate::summary::bytes;"),
            ("summary", "use crate::export::folded::frame_name;"),
            ("format", ""),
        ]));
        let found = cycles(&graph);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.contains(&vec!["recording".to_owned(), "stacks".to_owned()]));
        assert!(found.contains(&vec!["export".to_owned(), "summary".to_owned()]));
        let acyclic = graph_of(&sources(&[
            ("stacks", "use crate::collect;"),
            ("summary", "use crate::format;"),
            ("export", "use crate::format;"),
            ("collect", ""),
            ("format", ""),
        ]));
        assert!(cycles(&acyclic).is_empty());
    }

    #[test]
    fn circles_of_siblings_are_found_in_a_folder() {
        let root = std::env::temp_dir().join(format!("xtask-folders-{}", std::process::id()));
        let folder = root.join("probe");
        std::fs::create_dir_all(&folder).unwrap();
        let write = |name: &str, text: &str| std::fs::write(folder.join(name), text).unwrap();
        write("mod.rs", "mod a; mod b; mod c; use a::x; use b::y;");
        write("a.rs", "use super::b::thing;");
        write("c.rs", "use crate::probe::a;");
        write("b.rs", "// super::a in a comment\nfn f() {}");
        assert_eq!(check_folders(std::slice::from_ref(&root)).unwrap(), 2);
        write("b.rs", "fn f() { crate::probe::c::g() }");
        let err = check_folders(std::slice::from_ref(&root))
            .unwrap_err()
            .to_string();
        assert!(err.contains("probe: a ↔ b ↔ c"), "{err}");
        write(
            "mod.rs",
            "// circle-exception: a test\nmod a; mod b; mod c;",
        );
        assert_eq!(check_folders(std::slice::from_ref(&root)).unwrap(), 2);
        write("b.rs", "fn f() {}");
        let err = check_folders(std::slice::from_ref(&root))
            .unwrap_err()
            .to_string();
        assert!(err.contains("has no circle"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_user_side_crates_have_none() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let graph = module_graph(&workspace.join("sampler-user/src")).unwrap();
        assert!(graph.contains_key("commands") && graph["commands"].contains("config"));
        assert_eq!(cycles(&graph), Vec::<Vec<String>>::new());
        let graph = module_graph(&workspace.join("crates/engine/src")).unwrap();
        assert!(graph.contains_key("recording") && graph["recording"].contains("profile"));
        assert_eq!(cycles(&graph), Vec::<Vec<String>>::new());
        let graph = module_graph(&workspace.join("crates/target/src")).unwrap();
        assert!(graph.contains_key("stacks") && graph["stacks"].contains("sys"));
        assert_eq!(cycles(&graph), Vec::<Vec<String>>::new());
    }
}
