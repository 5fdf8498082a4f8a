//! A diff as people and tools read it: the table `allocscope diff` prints, its JSON, a
//! differential folded file (`stack base new`, what `inferno-flamegraph` and
//! flamegraph.pl's `difffolded` take) and a pprof whose values are the changes.

use std::{fmt::Write as _, io::Write};

use super::{Compared, Diff};
use crate::{
    format::{bytes as human_bytes, frame_name, sanitize, signed_bytes},
    profile::{Profile, StackProfile},
    stats::{estimate::Posterior, Estimate},
};

/// Rows of each table.
pub(crate) const ROWS: usize = 20;

/// The printed table: significant changes (growth first) per stack and per function, and
/// how many were within the noise.
pub(crate) fn table(diff: &Diff, base: &str, new: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "allocscope diff: {} ({:.1} s) → {} ({:.1} s); bounds at {:.0}% simultaneously over {} \
         comparisons (Bonferroni): a change is shown as significant only when they exclude 0",
        sanitize(base),
        diff.base_seconds,
        sanitize(new),
        diff.new_seconds,
        diff.confidence * 100.0,
        diff.comparisons
    );
    for (title, list) in [("stacks", &diff.stacks), ("functions", &diff.functions)] {
        let significant: Vec<&Compared> = list.iter().filter(|c| c.significant()).collect();
        let _ = writeln!(
            out,
            "\n{title}: {} of {} changed significantly",
            significant.len(),
            list.len()
        );
        for c in significant.iter().take(ROWS) {
            let _ = writeln!(out, "{}", row(c));
        }
        if significant.len() > ROWS {
            let _ = writeln!(
                out,
                "  … and {} more (see -o FILE.json)",
                significant.len() - ROWS
            );
        }
    }
    out
}

/// One comparison: the allocation rate's change (and the in-use bytes') and the stack.
fn row(c: &Compared) -> String {
    let rate = |v: f64| format!("{}/s", human_bytes(v));
    let signed = signed_bytes;
    let percent = |p: f64| {
        if p.is_infinite() {
            "new".to_owned()
        } else {
            format!("{p:+.0}%")
        }
    };
    let a = &c.alloc_change;
    let mut line = format!(
        "  alloc {}/s [{}/s, {}/s] {:>6}  ({} → {}){}",
        signed(a.estimate),
        signed(a.lower),
        signed(a.upper),
        percent(c.alloc_percent()),
        rate(c.base_alloc_per_second),
        rate(c.new_alloc_per_second),
        if a.significant { "" } else { " ~" }
    );
    if let (Some(i), Some(base), Some(new)) = (c.inuse_change, c.base_inuse, c.new_inuse) {
        if base <= 0.0 && new <= 0.0 && !i.significant {
            // Nothing in use in either: only noise to show.
            return finish(line, c);
        }
        let _ = write!(
            line,
            "  in use {} [{}, {}] {} ({} → {}){}",
            signed(i.estimate),
            signed(i.lower),
            signed(i.upper),
            c.inuse_percent().map(percent).unwrap_or_default(),
            human_bytes(base),
            human_bytes(new),
            if i.significant { "" } else { " ~" }
        );
    }
    finish(line, c)
}

/// The row's second line: the command and the stack.
fn finish(mut line: String, c: &Compared) -> String {
    let names: Vec<String> = c.key.iter().skip(1).take(5).map(|n| sanitize(n)).collect();
    let more = if c.key.len() > 6 { " ← …" } else { "" };
    let _ = write!(
        line,
        "\n      {}: {}{more}",
        sanitize(&c.commands.join(", ")),
        names.join(" ← ")
    );
    line
}

/// The diff as JSON.
pub(crate) fn json(diff: &Diff, out: &mut dyn Write) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, diff)?;
    writeln!(out)
}

/// Differential folded stacks: `command;root;…;leaf base new`, bytes allocated per second
/// in each recording (rounded).
pub(crate) fn folded(diff: &Diff, out: &mut dyn Write) -> std::io::Result<()> {
    for c in &diff.stacks {
        let mut path = vec![sanitize(&c.commands.join(","))];
        path.extend(c.frames.iter().rev().map(frame_name));
        writeln!(
            out,
            "{} {} {}",
            path.join(";"),
            c.base_alloc_per_second.max(0.0).round() as u64,
            c.new_alloc_per_second.max(0.0).round() as u64
        )?;
    }
    Ok(())
}

/// A profile whose values are the changes (new − base): `alloc_space` in bytes allocated
/// per second, `inuse_space` in bytes; objects are not compared (0). `new` gives the
/// recording's metadata.
pub(crate) fn difference_profile(diff: &Diff, new: &Profile) -> Profile {
    let value = |v: f64| Estimate {
        samples: 0,
        estimate: v,
        lower: v,
        upper: v,
    };
    let pid = new.processes.first().map_or(0, |p| p.pid);
    let stacks = diff
        .stacks
        .iter()
        .map(|c| StackProfile {
            pid,
            frames: c.frames.clone(),
            samples: 0,
            alloc_bytes: value(c.alloc_change.estimate),
            alloc_objects: value(0.0),
            alloc_bytes_by_trials: c.alloc_change.estimate,
            alloc_posterior: Posterior {
                bytes_sampled: 0,
                bytes_to_sample: 0.0,
                p: 1.0,
                mean: 0.0,
                variance: 0.0,
            },
            inuse_bytes: c.inuse_change.map(|i| value(i.estimate)),
            inuse_objects: c.inuse_change.map(|_| value(0.0)),
            peak_bytes: None,
            peak_objects: None,
            leak: None,
            period: None,
            lost: false,
            cut_to_leaf: false,
            unwound: None,
            end: None,
            growth: None,
            lifetimes: None,
            sizes: Vec::new(),
            threads: Vec::new(),
            timeline: None,
        })
        .collect();
    let mut profile = new.clone();
    profile.sampling.model = format!(
        "difference new - base ({:.1} s, {:.1} s): alloc_space is the change in bytes \
         allocated per second, inuse_space the change in bytes in use at the end; objects \
         are not compared",
        diff.new_seconds, diff.base_seconds
    );
    profile.processes.truncate(1);
    profile.stacks = stacks;
    profile
}
