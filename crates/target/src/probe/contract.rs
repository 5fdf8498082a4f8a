//! Checks the built eBPF object against the contract in `sampler_common::kernel`: every
//! map, program and load-time global the user side looks up by name is in the object, and
//! the object has none the contract does not name (aya-log's own items aside).

use std::collections::BTreeSet;

use object::{Object as _, ObjectSection as _, ObjectSymbol as _, SymbolKind};
use sampler_common::kernel;

/// Names of the object's global symbols of `kind` in sections picked by `section`.
fn symbols(kind: SymbolKind, section: impl Fn(&str) -> bool) -> BTreeSet<String> {
    let file = object::File::parse(super::attach::SAMPLER_OBJECT).expect("the eBPF object parses");
    file.symbols()
        .filter(|s| s.is_global() && s.kind() == kind)
        .filter(|s| {
            s.section_index()
                .and_then(|i| file.section_by_index(i).ok())
                .and_then(|sec| sec.name().ok().map(&section))
                .unwrap_or(false)
        })
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .filter(|name| !name.starts_with("AYA_LOG"))
        .collect()
}

fn named(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn the_object_has_exactly_the_contracts_names() {
    let maps = symbols(SymbolKind::Data, |s| s == "maps");
    assert_eq!(maps, named(kernel::maps::ALL), "maps");
    let globals = symbols(SymbolKind::Data, |s| s == ".rodata");
    assert_eq!(globals, named(kernel::globals::ALL), "load-time globals");
    // Programs: functions in their own sections (helpers the compiler kept are in .text).
    let programs = symbols(SymbolKind::Text, |s| s != ".text");
    assert_eq!(programs, named(kernel::programs::ALL), "programs");
}
