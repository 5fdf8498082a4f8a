//! What a process's numbers leave out, said beside them: what the probes are known to miss
//! given its allocators (pymalloc inlined into an LTO-built interpreter), a Go runtime whose
//! heap profiling was off for some or all of its time, and the notes the recording made
//! (`ProcessBook::incomplete`). Pure: descriptions in, sentences out.

use super::tally::ProcessTally;

/// What a process's counts leave out, and whether its Go runtime did not sample all of its
/// time (its heap profiling off): then nothing bounds what it allocated from above.
pub(super) fn incomplete_of(
    known: Option<&ProcessTally>,
    allocators: &[String],
    samples: u64,
) -> (Vec<String>, bool) {
    let noted = known.map(|p| p.incomplete.clone()).unwrap_or_default();
    let rate_zero = noted.iter().any(|n| n == super::processes::GO_RATE_ZERO);
    let unsampled = go_unsampled(allocators, samples, rate_zero);
    let unsampled_said = unsampled.is_some();
    let incomplete = incomplete_reasons(allocators)
        .into_iter()
        .chain(
            noted
                .into_iter()
                .filter(|n| n != super::processes::GO_RATE_ZERO),
        )
        .chain(unsampled)
        .collect();
    (incomplete, unsampled_said)
}

/// The least growth of a process's anonymous memory that is worth a word when its counted
/// calls do not account for it (below, a few arenas and thread stacks).
const UNCOUNTED_AT_LEAST: u64 = 32 << 20;

/// Said of a process whose anonymous memory grew by `anon_growth` bytes, more than twice
/// what its counted calls allocated (`counted_bytes`): it allocates through something
/// allocscope does not count (a mimalloc program once showed "0 samples … too little was
/// allocated" for 1.1 GB). `candidates`: functions of its executable that look like an
/// allocator.
pub(super) fn uncounted_memory(
    anon_growth: u64,
    counted_bytes: u64,
    candidates: &[String],
) -> Option<String> {
    if anon_growth < UNCOUNTED_AT_LEAST || anon_growth <= counted_bytes.saturating_mul(2) {
        return None;
    }
    let named = if candidates.is_empty() {
        String::new()
    } else {
        format!(
            "; in its executable, functions that look like one: {}",
            candidates.join(", ")
        )
    };
    Some(format!(
        "its anonymous memory grew by {} while the allocation calls counted asked for {}: it \
         {} (an allocator it does not know, a runtime's own heap, its own mmap){named}; \
         the numbers shown cover the calls counted only",
        crate::format::bytes(anon_growth as f64),
        crate::format::bytes(counted_bytes as f64),
        crate::schema::UNCOUNTED_MEMORY,
    ))
}

/// What the probes are known to miss in a process, from the allocators probed in it: with
/// uprobes, CPython's pymalloc linked into the executable (a statically linked, LTO-built
/// interpreter such as Debian's python3) is reached by the interpreter's own calls without
/// passing its exported entry points (inlined), so most small objects are not seen (Debian's
/// python3 on a dict/JSON script: 547 MiB seen of 1145 MiB).
pub fn incomplete_reasons(allocators: &[String]) -> Vec<String> {
    let in_executable = format!(
        "{} (static, in ",
        crate::probe::allocator::AllocatorKind::Pymalloc
    );
    allocators
        .iter()
        .filter_map(|a| a.strip_prefix(&in_executable))
        .map(|rest| {
            format!(
                "pymalloc is linked into {}: the interpreter's own calls reach it without \
                 passing the probed entry points (an LTO build inlines them), so small \
                 objects are undercounted; record it in-process (`-- CMD`, without \
                 --no-preload) to count them all",
                rest.trim_end_matches(')')
            )
        })
        .collect()
}

/// Why a Go process shows no samples, or too few, where its runtime's heap profiling was
/// off: the program set `runtime.MemProfileRate` to 0 (`rate_zero`: so it read when last
/// looked at; samples from before it did are true, of part of its time), or the linker
/// turned it off in a program that never calls `runtime.MemProfile` (through
/// `runtime/pprof` or `net/http/pprof`) and the program did not turn it on.
fn go_unsampled(allocators: &[String], samples: u64, rate_zero: bool) -> Option<String> {
    use crate::probe::go;
    let linker = allocators
        .iter()
        .any(|a| go::describes(a) && a.contains(go::PROFILING_OFF));
    if rate_zero && !linker && samples > 0 {
        // Samples until the program turned its sampler off: true, but of part of its time.
        return Some(
            "its Go runtime stopped sampling: the program set runtime.MemProfileRate to 0 \
             (so it read when last looked at); what it allocated since is not seen, and its \
             estimates have no upper bound"
                .to_owned(),
        );
    }
    if samples > 0 {
        return None;
    }
    if rate_zero && !linker {
        return Some(
            "its Go runtime sampled nothing: the program set runtime.MemProfileRate to 0 \
             (so it read when last looked at); its Go heap is not seen"
                .to_owned(),
        );
    }
    linker.then(|| {
        "its Go runtime sampled nothing: heap profiling is off in this program (the Go \
         linker turns it off where nothing calls runtime.MemProfile, as runtime/pprof does) \
         and the program did not set runtime.MemProfileRate; its Go heap is not seen"
            .to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_the_counted_calls_do_not_explain_is_said() {
        let mib = 1u64 << 20;
        // A program whose allocator is not known: 1.1 GB of arenas, 2 KiB counted.
        let said = uncounted_memory(1100 * mib, 2048, &["arena_alloc".to_owned()]).unwrap();
        assert!(said.contains("1.1 GiB") || said.contains("1100"), "{said}");
        assert!(
            said.contains("arena_alloc") && said.contains("does not count"),
            "{said}"
        );
        // Counted calls that explain the growth, or too little growth to matter: nothing.
        assert_eq!(uncounted_memory(100 * mib, 60 * mib, &[]), None);
        assert_eq!(uncounted_memory(31 * mib, 0, &[]), None);
        assert!(
            uncounted_memory(100 * mib, 40 * mib, &[]).is_some_and(|s| !s.contains("look like"))
        );
    }

    #[test]
    fn pymalloc_in_the_executable_makes_a_uprobe_count_incomplete() {
        let debian = [
            "pymalloc (static, in /usr/bin/python3.11)".to_owned(),
            "glibc (/usr/lib/x86_64-linux-gnu/libc.so.6)".to_owned(),
        ];
        let reasons = incomplete_reasons(&debian);
        assert_eq!(reasons.len(), 1);
        assert!(reasons[0].contains("/usr/bin/python3.11"), "{reasons:?}");
        // A shared libpython's entry points are what its callers go through; the in-process
        // front end counts every call.
        let shared = ["pymalloc (/usr/lib/libpython3.11.so.1.0)".to_owned()];
        assert!(incomplete_reasons(&shared).is_empty());
        let in_process = ["in-process (allocscope preload) (/memfd:allocscope-preload)".to_owned()];
        assert!(incomplete_reasons(&in_process).is_empty());
    }

    #[test]
    fn a_go_runtime_off_for_some_or_all_of_its_time_is_said_and_unbounded() {
        let go = ["go runtime (go1.19.8) (/usr/bin/app)".to_owned()];
        let linker_off = [format!(
            "go runtime (go1.19.8, {}) (/usr/bin/app)",
            crate::probe::go::PROFILING_OFF
        )];
        let said = |allocators: &[String], samples, rate_zero| {
            go_unsampled(allocators, samples, rate_zero).unwrap_or_default()
        };
        assert!(said(&go, 0, true).contains("sampled nothing: the program set"));
        assert!(said(&go, 12, true).contains("stopped sampling"));
        assert!(said(&linker_off, 0, false).contains("heap profiling is off"));
        // Sampling all along, or turned on by a program the linker had turned it off in.
        assert_eq!(go_unsampled(&go, 12, false), None);
        assert_eq!(go_unsampled(&go, 0, false), None);
        assert_eq!(go_unsampled(&linker_off, 5, false), None);
        let mut known = ProcessTally {
            pid: 1,
            command: "app".into(),
            executable: "/usr/bin/app".into(),
            rss_bytes: None,
            anon_first_and_peak: None,
            cpu_seconds: None,
            untracked_samples: 0,
            lost_samples: 0,
            runtime_hits: 0,
            cgroup: None,
            allocators: go.to_vec(),
            duty: None,
            go_totals: None,
            not_loaded: None,
            incomplete: vec![super::super::processes::GO_RATE_ZERO.to_owned()],
        };
        let (notes, unbounded) = incomplete_of(Some(&known), &go, 12);
        assert!(unbounded);
        assert_eq!(notes.len(), 1, "the mark is not said as it is: {notes:?}");
        known.incomplete.clear();
        assert_eq!(incomplete_of(Some(&known), &go, 12), (Vec::new(), false));
    }
}
