//! How a process was measured: its front end (from the allocators probed in it), its exact
//! counts and where they come from, and what they leave out. Apart from the profile's
//! assembly ([`super::build`]) because each is a judgement on descriptions, tested alone.

use sampler_common::ProcessCounters;

use super::tally::ProcessTally;
use crate::schema::{uprobes, Coverage, CoverageStart, ExactCounts};

/// What [`measured`] says of a process.
pub(super) struct Measured {
    /// Its front end, as profiles name it.
    pub front_end: String,
    /// What its counts leave out.
    pub incomplete: Vec<String>,
    /// Its exact counts.
    pub exact: ExactCounts,
    /// Where they come from, where not our counters.
    pub exact_source: Option<String>,
    /// Its Go runtime did not sample all of its time: nothing bounds it from above.
    pub unsampled: bool,
}

/// How the process `known` (with `allocators`, `samples`, our counters' `exact` and its
/// `coverage`) was measured.
pub(super) fn measured(
    known: Option<&ProcessTally>,
    allocators: &[String],
    samples: u64,
    exact: ProcessCounters,
    coverage: Option<&Coverage>,
) -> Measured {
    let (mut incomplete, unsampled) = super::incomplete::incomplete_of(known, allocators, samples);
    let (exact, exact_source) = exact_of(known, exact);
    let front_end = match (
        front_end_of(allocators),
        known.and_then(|p| p.not_loaded.as_ref()),
    ) {
        (front_end, Some(why)) if front_end == uprobes() => format!("{front_end} ({why})"),
        (front_end, _) => front_end,
    };
    // Where every allocation call is counted (not a producer's or a Go runtime's own
    // sampling, whose exact counts are theirs).
    let calls_counted = exact_source.is_none()
        && !front_end.starts_with("in-process (")
        && !front_end.starts_with(crate::probe::go::PROVIDER);
    let from_start =
        coverage.is_some_and(|c| matches!(c.since, CoverageStart::Start | CoverageStart::Exec));
    incomplete.extend(
        known
            .filter(|_| calls_counted)
            .and_then(|p| uncounted(p, exact.bytes, from_start)),
    );
    Measured {
        front_end,
        incomplete,
        exact,
        exact_source,
        unsampled,
    }
}

/// [`super::incomplete::uncounted_memory`] of `process`, whose calls counted asked for
/// `counted_bytes`: its executable's allocator-like functions read only when it is said.
/// `from_start`: it was recorded from its program's start (its exec), when its anonymous
/// memory was next to nothing (its first reading may come after the probes loaded).
fn uncounted(
    process: &super::tally::ProcessTally,
    counted_bytes: u64,
    from_start: bool,
) -> Option<String> {
    let (first, peak) = process.anon_first_and_peak?;
    let growth = if from_start {
        peak
    } else {
        peak.saturating_sub(first)
    };
    super::incomplete::uncounted_memory(growth, counted_bytes, &[])?;
    let candidates = allocator_like_functions(&process.executable);
    super::incomplete::uncounted_memory(growth, counted_bytes, &candidates)
}

/// [`crate::probe::allocator::allocator_like_functions`] of `executable`, each file read
/// once (the agent builds a profile every period, and a host runs many processes of one
/// program): at most 256 files are remembered.
fn allocator_like_functions(executable: &str) -> Vec<String> {
    use std::{collections::HashMap, sync::Mutex};
    const CANDIDATES_KEPT: usize = 256;
    static READ: Mutex<Option<HashMap<String, Vec<String>>>> = Mutex::new(None);
    let mut read = READ.lock().unwrap_or_else(|e| e.into_inner());
    let read = read.get_or_insert_with(HashMap::new);
    if let Some(found) = read.get(executable) {
        return found.clone();
    }
    let path = std::path::Path::new(executable);
    let found = crate::probe::allocator::allocator_like_functions(path, 5);
    if read.len() >= CANDIDATES_KEPT {
        read.clear();
    }
    read.insert(executable.to_owned(), found.clone());
    found
}

/// A process's exact counts and where they come from: a Go runtime's own totals where they
/// were read (its allocations are not calls our probes counted; a cgo program's malloc
/// calls are, added), our counters' otherwise.
fn exact_of(
    known: Option<&super::tally::ProcessTally>,
    exact: ProcessCounters,
) -> (ExactCounts, Option<String>) {
    let counted = ExactCounts {
        calls: exact.calls,
        bytes: exact.bytes,
    };
    match known.and_then(|p| p.go_totals.as_ref()) {
        // A cgo program's malloc calls, counted by us, beside its Go heap.
        Some((totals, source)) if exact.calls > 0 => (
            ExactCounts {
                calls: totals.calls + counted.calls,
                bytes: totals.bytes + counted.bytes,
            },
            Some(format!("{source}, and its malloc calls counted")),
        ),
        Some((totals, source)) => (*totals, Some(source.clone())),
        None => (counted, None),
    }
}

/// Whether `allocator` (as described) is linked into its process's executable.
fn in_executable(allocator: &str) -> bool {
    allocator.contains(" (static, in ")
}

/// A process's front end, from the allocators probed in it.
fn front_end_of(allocators: &[String]) -> String {
    use crate::probe::go;
    if allocators.iter().any(|a| go::describes(a)) {
        // cgo's malloc, where it is probed, is counted beside the runtime's samples.
        let malloc = allocators.iter().any(|a| !go::describes(a));
        return if malloc {
            format!("{} + malloc", crate::probe::go::PROVIDER)
        } else {
            crate::probe::go::PROVIDER.to_owned()
        };
    }
    let producer = crate::probe::usdt::PRODUCER_PROVIDERS.iter().find(|p| {
        allocators
            .iter()
            .any(|a| a.starts_with(&format!("{p} probes")))
    });
    // A library allocator probed in it too: it exec'd a program without the library (a
    // cleared environment, its own LD_PRELOAD), counted by uprobes from then on.
    let probed = ["glibc (", "jemalloc (", "tcmalloc (", "mimalloc ("]
        .iter()
        .any(|family| {
            allocators
                .iter()
                .any(|a| a.starts_with(family) && !in_executable(a))
        });
    // An allocator linked into its executable (no preloaded library interposes it;
    // CPython's pymalloc aside, which the library wraps): probed beside the library.
    // One the front end patched counts in-process like the rest.
    let linked_in = allocators.iter().any(|a| {
        in_executable(a)
            && !a.starts_with("pymalloc ")
            && !a.ends_with(&format!("{})", crate::probe::allocator::PATCHED))
    });
    // Another producer first: allocscope's library, inherited from before an exec, stays
    // dormant in a process where another producer reports the allocations.
    if let Some(provider) = producer {
        format!("in-process ({provider})")
    } else if allocators
        .iter()
        .any(|a| crate::probe::allocator::describes_in_process(a))
    {
        if probed {
            crate::schema::IN_PROCESS_THEN_UPROBES.into()
        } else if linked_in {
            crate::schema::IN_PROCESS_AND_UPROBES.into()
        } else {
            "in-process".into()
        }
    } else {
        uprobes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_left_the_library_by_an_exec_is_said_to() {
        let library =
            "in-process (allocscope preload) (/run/allocscope/rec-1-0/libsampler_preload.so)";
        assert_eq!(front_end_of(&[library.to_owned()]), "in-process");
        let both = [
            library.to_owned(),
            "glibc (/usr/lib/x86_64-linux-gnu/libc.so.6)".to_owned(),
        ];
        assert_eq!(front_end_of(&both), crate::schema::IN_PROCESS_THEN_UPROBES);
        // An allocator linked into the executable: probed beside the library, not after an
        // exec (a Rust program's jemalloc was said to have exec'd without the library).
        for own in [
            "malloc (static, in /usr/bin/x)",
            "jemalloc (static, in /usr/bin/x)",
        ] {
            let own = [library.to_owned(), own.to_owned()];
            assert_eq!(front_end_of(&own), crate::schema::IN_PROCESS_AND_UPROBES);
        }
        // CPython's pymalloc linked in is wrapped by the library.
        let python = [
            library.to_owned(),
            "pymalloc (static, in /usr/bin/python3.11)".to_owned(),
        ];
        assert_eq!(front_end_of(&python), "in-process");
        assert_eq!(front_end_of(&both[1..]), "uprobes");
        // A producer exec'd by a process that carried the library (dormant beside it).
        let producer = [
            library.to_owned(),
            "otel_memory probes (/usr/bin/producer)".to_owned(),
        ];
        assert_eq!(front_end_of(&producer), "in-process (otel_memory)");
    }
}
