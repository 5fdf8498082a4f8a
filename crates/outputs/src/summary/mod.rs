//! The short human summary `record` prints on stderr.

mod groups;
pub use groups::GROUPED_ABOVE;
use rows::{command_rows, Row};
mod insight;
mod rows;

use std::{collections::BTreeMap, fmt::Write as _};

use crate::{
    cost::{Overhead, TrapSource},
    format::{bytes, frame_name, percent},
    schema::Losses,
    schema::{Coverage, DutyRecord, ProcessProfile, Profile, StackProfile, LOST_FRAME},
    stacks::StackEnd,
    stats::Estimate,
    text,
};

/// `12.3 MiB [11.0 MiB, 13.5 MiB]`, or `< 370.0 KiB` when there are no samples; an
/// infinite upper bound reads `no upper bound` (`unknown` without samples: nothing
/// sampled the process at all).
pub fn estimate_bytes(estimate: &Estimate) -> String {
    let upper = if estimate.upper.is_finite() {
        bytes(estimate.upper)
    } else {
        "no upper bound".to_owned()
    };
    if estimate.samples == 0 && estimate.estimate == 0.0 && !estimate.upper.is_finite() {
        "unknown (no samples, no upper bound)".to_owned()
    } else if estimate.samples == 0 && estimate.estimate == 0.0 {
        format!("< {upper} (no samples)")
    } else {
        format!(
            "{} [{}, {upper}]",
            bytes(estimate.estimate),
            bytes(estimate.lower),
        )
    }
}

/// How a duty-cycled recording observed its targets, for people.
fn describe_duty(duty: &DutyRecord) -> String {
    format!(
        "duty-cycled (--max-overhead {}): probes attached {:.1}% of the time, in {:.0} ms \
         slots (one in up to {}); exact counts cover those slots, estimates the whole time",
        percent(duty.max_overhead),
        duty.observed_share * 100.0,
        duty.slot_seconds * 1e3,
        duty.largest_stratum_slots,
    )
}

/// What a process's coverage leaves out, for people; `None` when nothing is.
fn describe_coverage(coverage: &Coverage) -> Option<String> {
    if coverage.complete() {
        return None;
    }
    let since = format!("{:?}", coverage.since).to_lowercase();
    let mut parts: Vec<String> = coverage
        .late
        .iter()
        .map(|late| {
            format!(
                "{} probed {:.1} ms after its {} (calls through it before then not seen)",
                text::printable(&late.allocator),
                late.after_ms,
                if late.after_exec { "exec" } else { &since },
            )
        })
        .collect();
    if !coverage.checked {
        parts.push(
            "gone before its mappings were read: what went through probed allocators is in, \
             another allocator would not be"
                .to_owned(),
        );
    }
    Some(format!("coverage: {}", parts.join("; ")))
}

/// Every non-zero loss counter, with what it does to the numbers.
fn describe_losses(losses: &Losses) -> String {
    let parts = [
        (
            losses.ringbuf_full,
            "samples without a stack (ring buffer full; counted in the totals)",
        ),
        (
            losses.lost_unrecorded,
            "samples not even counted (lost-sample map full: totals are low)",
        ),
        (
            losses.free_event_lost,
            "frees (ring buffer full: live numbers may be high)",
        ),
        (
            losses.process_event_lost,
            "fork/exec events (ring buffer full: processes may be missed)",
        ),
        (
            losses.followed_full,
            "new processes not followed (followed set full: not counted)",
        ),
        (
            losses.front_end_full,
            "processes with an in-process front end not noted (table full: calls may count twice)",
        ),
        (
            losses.stacks_cut_to_leaf,
            "stacks cut to their leaf frame (more distinct stacks than --max-stacks)",
        ),
        (losses.stack_missing, "stacks missing"),
        (losses.counters_full, "calls without a counter slot"),
        (losses.thread_state_full, "calls (thread map full)"),
        (
            losses.live_map_full,
            "sampled blocks untracked (live map full)",
        ),
    ];
    parts
        .iter()
        .filter(|(count, _)| *count > 0)
        .map(|(count, what)| format!("{count} {what}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How the sampled stacks ended, by share (and number) of samples: whole, or cut and why.
/// What the probes cost, measured: per call, in CPU, and as a share of the targets' own.
fn describe_overhead(overhead: &Overhead) -> String {
    let source = match overhead.trap.source {
        TrapSource::Calibrated => "calibrated",
        TrapSource::Modelled => "modelled",
    };
    let program = overhead.program_ns_per_run.map_or_else(
        || "program time unknown".to_owned(),
        |ns| format!("program {ns:.0} ns"),
    );
    let mut line = format!(
        "{:.0} ns per allocation call ({:.2} probe hits, each the trap {:.0} ns {source} + \
         {program}); {:.2} CPU-s added to the targets",
        overhead.ns_per_call,
        overhead.runs_per_call,
        overhead.trap.ns,
        overhead.targets_added_cpu_seconds,
    );
    match (overhead.share, overhead.targets_cpu_seconds) {
        (Some(share), Some(cpu)) if share >= 1.0 => line.push_str(&format!(
            " of their {cpu:.2} s: {:.1}× the CPU time of their own work",
            1.0 + share
        )),
        (Some(share), Some(cpu)) => line.push_str(&format!(
            " of their {cpu:.2} s: +{:.1}% CPU over their own work",
            share * 100.0
        )),
        (None, Some(cpu)) if cpu >= 0.05 => line.push_str(&format!(
            " of their {cpu:.2} s: nearly all of it (their own work is within the \
             measurement's error)"
        )),
        _ => line.push_str(" (their CPU time was too short to compare)"),
    }
    if let Some(modelled) = overhead.targets_modelled_cpu_seconds {
        line.push_str(&format!(
            " (the model gave {modelled:.2} CPU-s, more than a target used: capped at its CPU time)"
        ));
    }
    let targets = overhead
        .targets_modelled_cpu_seconds
        .unwrap_or(overhead.targets_added_cpu_seconds);
    let others = overhead.added_cpu_seconds - targets;
    if others >= 0.005 {
        line.push_str(&format!(
            "; {others:.2} CPU-s to other processes hitting the file-wide probes"
        ));
    }
    line
}

fn describe_stack_ends(stacks: &[StackProfile]) -> Option<String> {
    let mut per_end: BTreeMap<StackEnd, u64> = BTreeMap::new();
    for stack in stacks {
        if let Some(end) = stack.end {
            *per_end.entry(end).or_default() += stack.samples;
        }
    }
    let total: u64 = per_end.values().sum();
    if total == 0 {
        return None;
    }
    let mut ends: Vec<(StackEnd, u64)> = per_end.into_iter().collect();
    ends.sort_by_key(|&(end, samples)| (end.is_truncated(), std::cmp::Reverse(samples)));
    let parts: Vec<String> = ends
        .iter()
        .map(|&(end, samples)| {
            let share = samples as f64 * 100.0 / total as f64;
            let share = if share < 0.1 {
                "<0.1%".to_owned()
            } else {
                format!("{share:.1}%")
            };
            format!("{share} ({samples}) {}", end.describe())
        })
        .collect();
    Some(parts.join("; "))
}

/// Renders the summary: totals per process (by command when there are many, unless
/// `each`), losses, and the top `top` stacks.
pub fn render(profile: &Profile, top: usize, each: bool) -> String {
    let mut out = preamble(profile, each);
    if profile.stacks.is_empty() {
        // Too little counted is not too little allocated where memory grew uncounted.
        let uncounted = profile
            .processes
            .iter()
            .flat_map(|p| &p.incomplete)
            .any(|why| why.contains(crate::schema::UNCOUNTED_MEMORY));
        let _ = writeln!(
            out,
            "{}",
            if uncounted {
                "  no samples: too little was counted for this interval (memory grew that \
                 was not: see `incomplete` above)"
            } else {
                "  no samples: too little was allocated for this interval"
            }
        );
        return out;
    }
    if let Some(age) = profile.leaks_older_than_seconds {
        leak_rows(&mut out, profile, age, top);
    }
    // Many processes: each command's alike stacks taken together, per-process growth and
    // leaks aside (a process's own).
    if groups::grouped(profile, each) && !profile.command_stacks.is_empty() {
        stack_tables(&mut out, profile, &command_rows(profile), top);
    } else {
        stack_tables(&mut out, profile, &profile.stacks, top);
    }
    out
}

/// The tables of `rows` (a profile's stacks, or its command stacks, sorted by bytes
/// allocated): live at the peak and at the end, the growing sites (each process's),
/// temporary allocations, allocated bytes, and the hint when the largest's bounds are wide.
fn stack_tables<R: Row>(out: &mut String, profile: &Profile, rows: &[R], top: usize) {
    if !profile.alloc_only {
        if profile.opens_on() == crate::schema::Opening::Peak {
            let heading = "top stacks by estimated live bytes at the peak (each process's \
                           highest live heap):";
            live_rows(out, rows, top, heading, R::peak_bytes);
        }
        let heading = "top stacks by estimated live bytes:";
        live_rows(out, rows, top, heading, R::inuse_bytes);
        insight::growing_rows(out, profile, top);
        insight::temporary_rows(out, rows, top);
    }
    let _ = writeln!(out, "top stacks by estimated allocated bytes:");
    allocated_rows(out, rows, top);
    insight::wide_bounds_hint(out, profile, rows);
}

/// The top `top` of `rows` (sorted by bytes allocated) by bytes allocated.
fn allocated_rows<R: Row>(out: &mut String, rows: &[R], top: usize) {
    let shown: Vec<&R> = rows.iter().take(top).collect();
    for (stack, chain) in shown.iter().zip(row_chains(&shown)) {
        let detail = format!("{:>6} samples", stack.samples());
        stack_row(out, stack.alloc_bytes(), &detail, *stack, &chain);
    }
}

/// What was recorded and how: the interval, duration and confidence, each process's
/// totals, coverage and front end (by command when there are many, unless `each`), the
/// losses, the measured overhead and how the stacks ended (the summary's head, and the
/// HTML report's header).
pub fn preamble(profile: &Profile, each: bool) -> String {
    let mut out = String::new();
    header(&mut out, profile);
    if groups::grouped(profile, each) {
        groups::lines(&mut out, profile, note_kinds);
    } else {
        for process in &profile.processes {
            process_lines(&mut out, process);
        }
    }
    let losses = profile.losses;
    if losses.total() == 0 {
        let _ = writeln!(out, "  lost events: none");
    } else {
        let _ = writeln!(out, "  lost events: {}", describe_losses(&losses));
    }
    if let Some(overhead) = &profile.overhead {
        let _ = writeln!(out, "  overhead: {}", describe_overhead(overhead));
    }
    if let Some(line) = describe_stack_ends(&profile.stacks) {
        let _ = writeln!(out, "  stacks: {line}");
    }
    out
}

/// What was recorded, how long, at which interval and confidence, and the duty cycle.
fn header(out: &mut String, profile: &Profile) {
    let confidence = percent(profile.sampling.confidence);
    let throttled = profile
        .sampling
        .throttle
        .as_ref()
        .map(|t| {
            let start = profile.sampling.mean_interval_bytes;
            let changes = t.changes.len() as u64 + t.changes_not_listed;
            let lowered = t.smallest_interval_bytes > 0 && t.smallest_interval_bytes < start;
            let raised = t.largest_interval_bytes > start;
            let range = match (lowered, raised) {
                (true, true) => format!(
                    "from {} to {}",
                    bytes(t.smallest_interval_bytes as f64),
                    bytes(t.largest_interval_bytes as f64)
                ),
                (true, false) => format!("lowered to {}", bytes(t.smallest_interval_bytes as f64)),
                _ => format!("raised up to {}", bytes(t.largest_interval_bytes as f64)),
            };
            let band = if t.min_samples_per_second > 0 {
                format!(
                    "--min-samples-per-sec {}, --max-samples-per-sec {}",
                    t.min_samples_per_second, t.max_samples_per_second
                )
            } else {
                format!("--max-samples-per-sec {}", t.max_samples_per_second)
            };
            format!(" (then {range} by {band}, {changes} changes)")
        })
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "allocscope: {:.1} s recorded, mean sampling interval {}{throttled}, bounds at \
         {confidence}",
        profile.duration_seconds,
        bytes(profile.sampling.mean_interval_bytes as f64),
    );
    if let Some(duty) = &profile.sampling.duty {
        let _ = writeln!(out, "  {}", describe_duty(duty));
    }
}

/// What the summary says of a process's exact counts.
fn exact_counts(process: &ProcessProfile) -> String {
    // Another program's allocator reports samples with their weights, no totals.
    if let Some(source) = &process.exact_source {
        // A Go runtime's own totals: heap objects, not calls.
        return format!(
            "exact {} in {} objects (the Go runtime's {source})",
            bytes(process.exact.bytes as f64),
            process.exact.calls,
        );
    }
    if process.front_end == crate::probe::go::PROVIDER {
        return "no exact counts (sampled by the Go runtime at its runtime.MemProfileRate)".into();
    }
    match process.front_end.strip_prefix("in-process (") {
        Some(provider) => format!(
            "no exact counts (sampled by its own allocator, reported through its {} probes)",
            provider.trim_end_matches(')')
        ),
        // Samples without a single call counted: its counts were never published (a child
        // forked after its program installed a seccomp filter counts privately).
        None if process.front_end == "in-process"
            && process.exact.calls == 0
            && process.samples > 0 =>
        {
            "no exact counts (its in-process sampler could not publish them)".to_owned()
        }
        None => format!(
            "exact {} in {} calls{}",
            bytes(process.exact.bytes as f64),
            process.exact.calls,
            match process.front_end.as_str() {
                "in-process" => " (counted in-process)".into(),
                crate::schema::IN_PROCESS_THEN_UPROBES => {
                    " (counted in-process, then by uprobes: it exec'd a program without the library)".into()
                }
                crate::schema::IN_PROCESS_AND_UPROBES => {
                    " (counted in-process, and by uprobes at the allocator linked into its executable)".into()
                }
                // `-p`: the in-process sampler could not be loaded, said why.
                other if other.starts_with("uprobes (") => format!(" (counted by {other})"),
                _ => String::new(),
            }
        ),
    }
}

/// A process's lines: its estimate beside its exact counts, what it was observed over,
/// its coverage, what is incomplete, and its live heap.
fn process_lines(out: &mut String, process: &ProcessProfile) {
    let exact = exact_counts(process);
    let _ = writeln!(
        out,
        "  pid {} ({}): {} samples; estimated {} allocated; {exact}",
        process.pid,
        text::printable(&process.command),
        process.samples,
        estimate_bytes(&process.alloc_bytes),
    );
    if let Some(share) = process.observed_share {
        let _ = writeln!(
            out,
            "    observed {:.1}% of its own work (CPU time less the probes'); the estimate \
             weighs each on slot by its stratum's work{}",
            share * 100.0,
            if process.alloc_bytes.upper.is_finite() {
                ""
            } else {
                ": no upper bound, because the probes cost it far more than its own \
                 work, or too few strata were sampled (record longer, or without \
                 --max-overhead)"
            }
        );
    }
    if let Some(line) = process.coverage.as_ref().and_then(describe_coverage) {
        let _ = writeln!(out, "    {line}");
    }
    let read = process.allocators.iter();
    for allocator in read.filter(|a| a.ends_with(crate::probe::go::READ)) {
        let _ = writeln!(out, "    front end: {}", text::printable(allocator));
    }
    for reason in &process.incomplete {
        let _ = writeln!(out, "    incomplete: {}", text::printable(reason));
    }
    if process.lost_samples > 0 {
        let _ = writeln!(
            out,
            "    incomplete: {} samples lost without a stack (ring buffer full): the \
             total above includes them (under {LOST_FRAME}); the stacks below and the live \
             numbers leave them out, so they may be low",
            process.lost_samples
        );
    }
    if let Some(live) = &process.inuse_bytes {
        let rss = process
            .rss_bytes
            .map_or_else(|| "unknown".to_owned(), |rss| bytes(rss as f64));
        let since = if process.seen_from_its_start() {
            "since it started"
        } else {
            "since attach"
        };
        let _ = writeln!(
            out,
            "    live heap (allocated {since}, not freed): {}; RSS {rss}",
            estimate_bytes(live)
        );
        if let Some(peak) = &process.peak {
            let at = peak
                .at_seconds
                .map(|s| format!(" ({} after the start)", insight::lifetime(Some(s))))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "    peak live heap{at}: {}",
                estimate_bytes(&peak.inuse_bytes)
            );
        }
        insight::process_growth(out, process);
        if process.untracked_samples > 0 {
            let _ = writeln!(
                out,
                "    incomplete: {} sampled blocks could not be tracked (raise --max-tracked); \
                 live numbers leave them out",
                process.untracked_samples
            );
        }
    }
}

/// A process's notes as kinds: the same text for the same kind of note in any process
/// (without its own numbers), for a summary by command.
fn note_kinds(process: &ProcessProfile) -> Vec<String> {
    let mut kinds = Vec::new();
    if let Some(coverage) = &process.coverage {
        let since = format!("{:?}", coverage.since).to_lowercase();
        kinds.extend(coverage.late.iter().map(|late| {
            format!(
                "coverage: {} probed after its {since} (calls through it before then not seen)",
                late.allocator
            )
        }));
        if !coverage.checked {
            kinds.push(
                "coverage: gone before its mappings were read: what went through probed \
                 allocators is in, another allocator would not be"
                    .to_owned(),
            );
        }
    }
    kinds.extend(
        process
            .incomplete
            .iter()
            .map(|why| format!("incomplete: {why}")),
    );
    if process.lost_samples > 0 {
        kinds.push("incomplete: samples lost without a stack (ring buffer full)".to_owned());
    }
    if process.untracked_samples > 0 {
        kinds.push(
            "incomplete: sampled blocks whose frees could not be tracked (raise --max-tracked)"
                .to_owned(),
        );
    }
    kinds
}

/// The top `top` leak candidates: stacks with blocks live for more than `age` seconds.
fn leak_rows(out: &mut String, profile: &Profile, age: f64, top: usize) {
    let mut leaks: Vec<_> = profile
        .stacks
        .iter()
        .filter_map(|stack| Some((stack, stack.leak?)))
        .collect();
    leaks.sort_by(|a, b| {
        b.1.inuse_bytes
            .estimate
            .total_cmp(&a.1.inuse_bytes.estimate)
    });
    let _ = writeln!(out, "leak candidates (live for more than {age:.0} s):");
    if leaks.is_empty() {
        let _ = writeln!(out, "  none");
    }
    let shown: Vec<&StackProfile> = leaks.iter().take(top).map(|(s, _)| *s).collect();
    for ((stack, leak), chain) in leaks.iter().take(top).zip(row_chains(&shown)) {
        let detail = format!(
            "{:>6.0} blocks  oldest {:.0} s",
            leak.inuse_objects.estimate, leak.oldest_seconds
        );
        stack_row(out, &leak.inuse_bytes, &detail, *stack, &chain);
    }
}

/// The top `top` stacks by a live value (`of`: at the end, or at the peak) under
/// `heading`; nothing when no stack has a sample of it.
fn live_rows<R: Row>(
    out: &mut String,
    stacks: &[R],
    top: usize,
    heading: &str,
    of: fn(&R) -> Option<Estimate>,
) {
    let mut rows: Vec<(&R, Estimate)> = stacks
        .iter()
        .filter_map(|stack| Some((stack, of(stack)?)))
        .filter(|(_, value)| value.samples > 0)
        .collect();
    rows.sort_by(|a, b| b.1.estimate.total_cmp(&a.1.estimate));
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "{heading}");
    let shown: Vec<&R> = rows.iter().take(top).map(|(s, _)| *s).collect();
    for ((stack, value), chain) in rows.iter().take(top).zip(row_chains(&shown)) {
        let detail = format!("{:>6} samples", value.samples);
        stack_row(out, value, &detail, *stack, &chain);
    }
}

/// Frames a row shows.
pub(super) const ROW_FRAMES: usize = 4;

/// What each row of a table shows of its stack: from its site (its first frame outside the
/// allocator and the runtimes' allocation machinery, [`crate::stacks::site`]) the first
/// [`ROW_FRAMES`] frames, and `[via LEAF]` where the site is not the leaf; when another
/// row of the same process reads the same, ` … ← ` and the first frame that tells them
/// apart (or, when no frame's name does, the return address where they part).
pub(super) fn row_chains<R: Row>(stacks: &[&R]) -> Vec<String> {
    let names: Vec<Vec<String>> = stacks
        .iter()
        .map(|s| s.frames().iter().map(frame_name).collect())
        .collect();
    let sites = crate::stacks::site::sites();
    let site: Vec<usize> = stacks.iter().map(|s| sites.site_of(s.frames())).collect();
    // What a row reads: the frames from its site, and the ones before it.
    let shown = |i: usize| {
        let from = site[i].min(names[i].len());
        let head = &names[i][from..names[i].len().min(from + ROW_FRAMES)];
        (head, &names[i][..from])
    };
    (0..stacks.len())
        .map(|i| {
            let (head, via) = shown(i);
            let mut chain = head.join(" ← ");
            if let Some(leaf) = via.first() {
                let more = if via.len() > 1 { " ← …" } else { "" };
                let _ = write!(chain, " [via {leaf}{more}]");
            }
            // Per row that reads alike: the first frame whose name differs, else the first
            // whose address does.
            let alike: Vec<(Option<usize>, Option<usize>)> = (0..stacks.len())
                .filter(|&j| j != i && stacks[j].owner() == stacks[i].owner())
                .filter(|&j| shown(j) == (head, via))
                .map(|j| {
                    let (a, b) = (stacks[i].frames(), stacks[j].frames());
                    let by_name = (site[i] + ROW_FRAMES..names[i].len())
                        .find(|&k| names[j].get(k) != Some(&names[i][k]));
                    let by_address =
                        (0..a.len()).find(|&k| b.get(k).is_none_or(|f| f.address != a[k].address));
                    (by_name, by_address)
                })
                .collect();
            if let Some(k) = alike.iter().filter_map(|(name, _)| *name).max() {
                let _ = write!(chain, " … ← {}", names[i][k]);
            }
            // Rows that no name tells apart: where their addresses part.
            if let Some(k) = alike
                .iter()
                .filter(|(name, _)| name.is_none())
                .filter_map(|(_, address)| *address)
                .max()
            {
                let _ = write!(
                    chain,
                    " (at {:#x} in frame {})",
                    stacks[i].frames()[k].address,
                    k + 1
                );
            }
            chain
        })
        .collect()
}

/// One table row: the estimate with its bounds, `detail`, whose it is and `chain` (the
/// frames shown, see [`row_chains`]).
pub(super) fn stack_row<R: Row>(
    out: &mut String,
    estimate: &Estimate,
    detail: &str,
    stack: &R,
    chain: &str,
) {
    let _ = writeln!(
        out,
        "  {:>38}  {detail}  {}  {chain}",
        estimate_bytes(estimate),
        stack.who(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{CoverageStart, LateAllocator};

    /// Two rows whose first four frames read alike show where they part (without it
    /// the top list seemed to repeat a row).
    #[test]
    fn rows_alike_in_their_first_frames_show_where_they_part() {
        use crate::stacks::symbolize::FrameInfo;
        let frame = |name: &str, address: u64| FrameInfo {
            function: Some(name.into()),
            module: Some("/bin/app".into()),
            file: None,
            line: None,
            address,
            kind: None,
        };
        let mut profile = allocscope_model::fixtures::synthetic();
        let common = ["leaf", "a", "b", "c"];
        let mut first = profile.stacks[0].clone();
        first.frames = common.iter().map(|n| frame(n, 1)).collect();
        first.frames.push(frame("from_x", 5));
        let mut second = first.clone();
        second.frames[4] = frame("from_y", 6);
        let mut third = first.clone();
        third.frames[4].address = 7;
        let other = profile.stacks[1].clone();
        profile.stacks = vec![first, second, third, other];
        let refs: Vec<&StackProfile> = profile.stacks.iter().collect();
        let chains = row_chains(&refs);
        assert_eq!(chains[0], "leaf ← a ← b ← c … ← from_x (at 0x5 in frame 5)");
        assert_eq!(chains[1], "leaf ← a ← b ← c … ← from_y");
        assert_eq!(chains[2], "leaf ← a ← b ← c … ← from_x (at 0x7 in frame 5)");
        assert!(!chains[3].contains('…'), "{}", chains[3]);
    }

    /// Above the grouping threshold the tables show each command's stacks (`app ×9`, or
    /// `app (pid 42)` for one process's), and the wide-bounds hint reads their first row;
    /// `--verbose` keeps each process's stacks.
    #[test]
    fn many_processes_tables_show_a_commands_stacks_taken_together() {
        use crate::schema::{CommandGroup, CommandStackProfile, ExactCounts};
        let mut profile = allocscope_model::fixtures::synthetic();
        let one = profile.processes[0].clone();
        profile.processes = (0..9)
            .map(|i| ProcessProfile {
                pid: 42 + i,
                ..one.clone()
            })
            .collect();
        profile.commands = vec![CommandGroup {
            command: one.command.clone(),
            processes: 9,
            samples: 90,
            exact: ExactCounts { calls: 9, bytes: 9 },
            alloc_bytes: one.alloc_bytes,
            inuse_bytes: None,
            largest: vec![42, 43, 44],
        }];
        let summed = Estimate {
            samples: 90,
            estimate: 9e6,
            lower: 8e6,
            upper: 1e7,
        };
        let command_stack =
            |stack: usize, processes: u64, alloc_bytes: Estimate| CommandStackProfile {
                command: one.command.clone(),
                processes,
                largest_pid: 42,
                stack,
                samples: alloc_bytes.samples,
                alloc_bytes,
                inuse_bytes: None,
                peak_bytes: None,
                lifetimes: None,
                lost: false,
            };
        let alone = profile.stacks[1].alloc_bytes;
        profile.command_stacks = vec![command_stack(0, 9, summed), command_stack(1, 1, alone)];
        let out = render(&profile, 10, false);
        let rows: Vec<&str> = out
            .lines()
            .skip_while(|l| !l.starts_with("top stacks by estimated allocated bytes:"))
            .skip(1)
            .collect();
        let name = &one.command;
        assert!(
            rows[0].contains(&format!("    90 samples  {name} ×9  ")),
            "{out}"
        );
        assert!(rows[1].contains(&format!("  {name} (pid 42)  ")), "{out}");
        assert!(!out.contains("bounds are wide"), "{out}");
        // Each process's stacks with --verbose.
        let each = render(&profile, 10, true);
        assert!(
            each.contains("  pid 42  ") && !each.contains(" ×9  "),
            "{each}"
        );
    }

    #[test]
    fn the_live_heap_says_since_when_it_counts() {
        use crate::schema::{Coverage, CoverageStart};
        let mut profile = allocscope_model::fixtures::synthetic();
        profile.alloc_only = false;
        profile.processes[0].inuse_bytes = Some(profile.processes[0].alloc_bytes);
        let attached = render(&profile, 10, true);
        assert!(
            attached.contains("allocated since attach, not freed"),
            "{attached}"
        );
        profile.processes[0].coverage = Some(Coverage {
            since: CoverageStart::Start,
            ..Default::default()
        });
        let started = render(&profile, 10, true);
        assert!(
            started.contains("allocated since it started, not freed"),
            "{started}"
        );
    }

    #[test]
    fn overhead_says_per_call_cost_and_share() {
        use crate::cost::{self, TargetUse, Trap};
        use crate::probe::runs::{ProgramRuns, Runs};
        let runs = ProgramRuns {
            allocations: Runs {
                runs: 1_000_000,
                run_ns: 200_000_000,
            },
            ..ProgramRuns::default()
        };
        let trap = Trap {
            ns: 700.0,
            source: TrapSource::Calibrated,
        };
        let target = |cpu| TargetUse {
            pid: 1,
            calls: 1_000_000,
            cpu_seconds: Some(cpu),
            runtime_hits: 0,
            runtime_calls: 0,
        };
        let heavy = cost::measure(trap, runs, true, false, 1.0, &[target(1.2)]);
        assert_eq!(
            describe_overhead(&heavy),
            "900 ns per allocation call (1.00 probe hits, each the trap 700 ns calibrated + \
             program 200 ns); 0.90 CPU-s added to the targets of their 1.20 s: 4.0× the CPU \
             time of their own work"
        );
        let light = cost::measure(trap, runs, true, true, 1.0, &[target(10.9)]);
        assert!(
            describe_overhead(&light).ends_with("of their 10.90 s: +9.0% CPU over their own work"),
            "{}",
            describe_overhead(&light)
        );
        let swamped = cost::measure(trap, runs, true, false, 1.0, &[target(0.9)]);
        assert!(
            describe_overhead(&swamped).ends_with("of their 0.90 s: nearly all of it (their own work is within the measurement's error)"),
            "{}",
            describe_overhead(&swamped)
        );
        let unknown = cost::measure(Trap::MODELLED, runs, false, false, 1.0, &[target(0.0)]);
        let text = describe_overhead(&unknown);
        assert!(text.contains("modelled + program time unknown"), "{text}");
        assert!(
            text.ends_with("(their CPU time was too short to compare)"),
            "{text}"
        );
    }

    #[test]
    fn coverage_says_what_was_missed_and_nothing_when_complete() {
        let mut coverage = Coverage {
            since: CoverageStart::Exec,
            late: Vec::new(),
            checked: true,
        };
        assert_eq!(describe_coverage(&coverage), None);
        coverage.late.push(LateAllocator {
            after_exec: false,
            allocator: "pymalloc (/usr/bin/Python3.11)".into(),
            after_ms: 12.25,
        });
        coverage.checked = false;
        let line = describe_coverage(&coverage).unwrap();
        assert!(
            line.starts_with(
                "coverage: pymalloc (/usr/bin/Python3.11) probed 12.2 ms after its exec"
            ),
            "{line}"
        );
        assert!(
            line.ends_with(
                "; gone before its mappings were read: what went through probed allocators \
                 is in, another allocator would not be"
            ),
            "{line}"
        );
    }

    #[test]
    fn stack_endings_are_shared_out_whole_ones_first() {
        let mut profile = allocscope_model::fixtures::synthetic();
        let ends = [
            (StackEnd::Window, 1),
            (StackEnd::Root, 1000),
            (StackEnd::Unmapped, 30),
        ];
        let template = profile.stacks[0].clone();
        profile.stacks = ends
            .iter()
            .map(|&(end, samples)| StackProfile {
                end: Some(end),
                samples,
                ..template.clone()
            })
            .collect();
        let line = describe_stack_ends(&profile.stacks).expect("stacks with ends");
        assert_eq!(
            line,
            "97.0% (1000) reached their root; \
             2.9% (30) stopped at code in no file (JIT, unmapped); \
             <0.1% (1) went beyond the stack copied (--stack-bytes)"
        );
        // The lost-samples pseudo-stack has no ending, and alone says nothing.
        profile.stacks.iter_mut().for_each(|s| s.end = None);
        assert_eq!(describe_stack_ends(&profile.stacks), None);
    }
}
