//! The summary of a recording of many processes: by command, notes once per kind.
//!
//! Why: a build or a shell loop is hundreds or thousands of processes; printing each (a
//! 150-process recording printed 469 lines, most of them one coverage note) buries the
//! one line that matters. Above [`GROUPED_ABOVE`] processes the summary shows the
//! commands that allocated most (each with its processes' estimate taken together, see
//! `profile::groups`, and its largest processes), and each kind of note once with how many
//! processes it concerns; `--verbose` (`report --processes`) lists every process, and the
//! JSON keeps them all.

use std::{collections::HashMap, fmt::Write as _};

use super::estimate_bytes;
use crate::{
    format::bytes,
    schema::{CommandGroup, ProcessProfile, Profile},
    text,
};

pub use crate::schema::GROUPED_ABOVE;
/// Commands shown; the rest are summed in one line.
const GROUPS_SHOWN: usize = 6;
/// Kinds of note shown; the rest are counted.
const NOTES_SHOWN: usize = 5;

/// Whether `profile` is summarized by command (`each`: every process asked for).
pub(super) fn grouped(profile: &Profile, each: bool) -> bool {
    !each && profile.processes.len() > GROUPED_ABOVE && !profile.commands.is_empty()
}

/// The commands' lines, then the notes', for [`grouped`] profiles; `kinds` gives a
/// process's notes, each as its kind (the same text for the same kind of note).
pub(super) fn lines(
    out: &mut String,
    profile: &Profile,
    kinds: impl Fn(&ProcessProfile) -> Vec<String>,
) {
    let groups = &profile.commands;
    let _ = writeln!(
        out,
        "  {} processes of {} commands, most allocated first (each process: record --verbose, report --processes):",
        profile.processes.len(),
        groups.len()
    );
    let by_pid: HashMap<u32, &ProcessProfile> =
        profile.processes.iter().map(|p| (p.pid, p)).collect();
    for group in groups.iter().take(GROUPS_SHOWN) {
        group_lines(out, group, &by_pid);
    }
    let rest = groups.get(GROUPS_SHOWN..).unwrap_or_default();
    if !rest.is_empty() {
        let processes: u64 = rest.iter().map(|g| g.processes).sum();
        let estimate: f64 = rest.iter().map(|g| g.alloc_bytes.estimate).sum();
        let upper: f64 = rest.iter().map(|g| g.alloc_bytes.upper).sum();
        let plural =
            |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let _ = writeln!(
            out,
            "  and {} ({}): estimated {} allocated (at most {})",
            plural(rest.len() as u64, "more command", "more commands"),
            plural(processes, "process", "processes"),
            bytes(estimate),
            bytes(upper)
        );
    }
    notes(out, &profile.processes, kinds);
}

/// A command's line, and its largest processes'.
fn group_lines(out: &mut String, group: &CommandGroup, by_pid: &HashMap<u32, &ProcessProfile>) {
    let name = text::printable(&group.command);
    let who = match group.largest.as_slice() {
        [pid] if group.processes == 1 => format!("{name} (pid {pid})"),
        _ => format!("{name} ×{}", group.processes),
    };
    let live = group
        .inuse_bytes
        .as_ref()
        .filter(|live| live.samples > 0)
        .map(|live| format!(", {} of it not freed", estimate_bytes(live)))
        .unwrap_or_default();
    let exact = if group.exact.calls == 0 && group.samples > 0 {
        "no exact counts".to_owned()
    } else {
        format!(
            "exact {} in {} calls",
            bytes(group.exact.bytes as f64),
            group.exact.calls
        )
    };
    let _ = writeln!(
        out,
        "  {who}: {} samples; estimated {} allocated{live}; {exact}",
        group.samples,
        estimate_bytes(&group.alloc_bytes),
    );
    if group.processes > 1 && group.samples > 0 {
        let largest: Vec<String> = group
            .largest
            .iter()
            .filter_map(|pid| by_pid.get(pid))
            .map(|p| format!("pid {} {}", p.pid, estimate_bytes(&p.alloc_bytes)))
            .collect();
        let _ = writeln!(out, "    largest: {}", largest.join("; "));
    }
}

/// Each kind of note once, with how many processes it concerns, most frequent first.
fn notes(
    out: &mut String,
    processes: &[ProcessProfile],
    kinds: impl Fn(&ProcessProfile) -> Vec<String>,
) {
    let mut counted: Vec<(String, u64)> = Vec::new();
    for process in processes {
        let mut own = kinds(process);
        own.sort();
        own.dedup();
        for kind in own {
            match counted.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, n)) => *n += 1,
                None => counted.push((kind, 1)),
            }
        }
    }
    counted.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    for (kind, n) in counted.iter().take(NOTES_SHOWN) {
        let of = if *n == 1 { "process" } else { "processes" };
        let _ = writeln!(out, "  {n} {of}: {}", text::printable(kind));
    }
    if counted.len() > NOTES_SHOWN {
        let _ = writeln!(
            out,
            "  and {} more kinds of note (with each process: record --verbose, report --processes)",
            counted.len() - NOTES_SHOWN
        );
    }
}
