//! Every parser of input we do not control, fed random and mutated input: it may refuse,
//! never panic. Run by `cargo test` (briefly: a few hundred cases each).
//!
//! Untrusted input: `report`'s JSON (any file a user passes), /proc files of the targets
//! (a process controls its name, its mappings' paths, its cgroup's name), and the ELF files
//! a target maps, whose code the prologue decoder reads.

use proptest::prelude::*;
use sampler_user::{
    export::{self, Format, Value},
    probe::{allocator, prologue},
    profile::Profile,
    summary,
    sys::{maps, process},
    targets,
};

const PROFILE: &[u8] = include_bytes!("data/profile.json");

/// `seed` with `flips` bytes replaced at chosen places.
fn mutate(seed: &[u8], flips: &[(usize, u8)]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for &(at, byte) in flips {
        if !bytes.is_empty() {
            let at = at % bytes.len();
            bytes[at] = byte;
        }
    }
    bytes
}

/// Everything `report` does with a profile it could parse.
fn use_profile(profile: &Profile) {
    let _ = summary::render(profile, 10, false);
    let _ = summary::render(profile, 10, true);
    for format in [Format::Json, Format::Pprof, Format::Folded, Format::Svg] {
        for value in [Value::AllocBytes, Value::InuseObjects] {
            let _ = export::write(profile, format, value, &mut std::io::sink());
        }
    }
}

fn flips() -> impl Strategy<Value = Vec<(usize, u8)>> {
    prop::collection::vec((any::<usize>(), any::<u8>()), 1..8)
}

#[test]
fn the_seed_profile_parses() {
    let profile: Profile = serde_json::from_slice(PROFILE).expect("seed parses");
    assert!(!profile.stacks.is_empty());
    use_profile(&profile);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn report_json_never_panics(flips in flips()) {
        if let Ok(profile) = serde_json::from_slice::<Profile>(&mutate(PROFILE, &flips)) {
            use_profile(&profile);
        }
    }

    #[test]
    fn report_json_numbers_of_any_value_never_panic(
        value in prop_oneof![
            Just("-1".to_owned()), Just("1e308".to_owned()), Just("-0".to_owned()),
            Just("18446744073709551615".to_owned()), Just("null".to_owned()),
            any::<f64>().prop_map(|v| format!("{v:e}")),
        ],
        which in 0usize..64,
    ) {
        // Replace the which-th number of the seed.
        let text = std::str::from_utf8(PROFILE).unwrap();
        let mut count = 0;
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(": ") {
            out.push_str(&rest[..at + 2]);
            rest = &rest[at + 2..];
            let end = rest.find([',', '\n', '}']).unwrap_or(rest.len());
            if rest[..end].parse::<f64>().is_ok() {
                if count == which {
                    out.push_str(&value);
                    rest = &rest[end..];
                }
                count += 1;
            }
        }
        out.push_str(rest);
        if let Ok(profile) = serde_json::from_str::<Profile>(&out) {
            use_profile(&profile);
        }
    }

    #[test]
    fn proc_text_parsers_never_panic(text in ".{0,400}") {
        let _ = maps::parse(&text);
        let _ = maps::uprobe_area(&text);
        let _ = process::cgroup_path(&text);
        let _ = targets::loader_list(&text);
        let _ = process::stat_flags(&text);
    }

    #[test]
    fn real_proc_files_mutated_never_panic(flips in flips()) {
        for file in ["/proc/self/maps", "/proc/self/stat", "/proc/self/cgroup"] {
            let real = std::fs::read(file).unwrap_or_default();
            let text = String::from_utf8_lossy(&mutate(&real, &flips)).into_owned();
            let _ = maps::parse(&text);
            let _ = maps::uprobe_area(&text);
            let _ = process::cgroup_path(&text);
            let _ = process::stat_flags(&text);
        }
    }

    #[test]
    fn prologue_decoding_never_panics(code in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = prologue::choose(&code, &[iced_x86::Register::RDI, iced_x86::Register::RSI]);
        let _ = prologue::choose_in_place(&code, &[iced_x86::Register::RDX]);
    }
}

proptest! {
    // A whole ELF file per case: fewer cases.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn elf_analysis_of_mutated_files_never_panics(
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..32),
        in_headers in any::<bool>(),
    ) {
        for file in ["/bin/true", "/usr/lib/x86_64-linux-gnu/libc.so.6"] {
            let real = std::fs::read(file).unwrap();
            // Half the cases hit the headers (the first 4 KiB), where a flip changes how
            // everything else is read.
            let flips: Vec<(usize, u8)> = flips
                .iter()
                .map(|&(at, byte)| (if in_headers { at % 4096 } else { at }, byte))
                .collect();
            let elf = mutate(&real, &flips);
            let _ = allocator::analyse(&elf, true, "libc.so.6");
            let _ = targets::interpreter_of(&elf);
        }
    }
}
