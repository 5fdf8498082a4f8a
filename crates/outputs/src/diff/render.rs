//! A diff as people and tools read it: the table `allocscope diff` prints, its JSON, a
//! differential folded file (`stack base new`, what `inferno-flamegraph` and
//! flamegraph.pl's `difffolded` take) and a pprof whose values are the changes.

use std::{fmt::Write as _, io::Write};

use super::{Basis, Compared, Diff};
use crate::{
    format::{bytes as human_bytes, frame_name, sanitize, signed_bytes},
    schema::{Profile, StackProfile},
    stats::{estimate::Posterior, Estimate},
};

/// Rows of each table.
pub(crate) const ROWS: usize = 20;

/// The printed table: what is compared and why, significant changes (growth first) per
/// stack and per function, and how many were within the noise.
pub fn table(diff: &Diff, base: &str, new: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "allocscope diff: {} ({}) → {} ({}); bounds at {:.0}% simultaneously over {} \
         comparisons (Bonferroni): a change is shown as significant only when they exclude 0",
        sanitize(base),
        seconds(diff.base_seconds),
        sanitize(new),
        seconds(diff.new_seconds),
        diff.confidence * 100.0,
        diff.comparisons
    );
    let _ = writeln!(out, "compared: {}", basis_reason(diff));
    for (title, list) in [("stacks", &diff.stacks), ("functions", &diff.functions)] {
        let significant: Vec<&Compared> = list.iter().filter(|c| c.significant()).collect();
        let _ = writeln!(
            out,
            "\n{title}: {} of {} changed significantly",
            significant.len(),
            list.len()
        );
        for c in significant.iter().take(ROWS) {
            let _ = writeln!(out, "{}", row(c, diff.basis));
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

/// A recording's length: two decimals under 10 s (a 0.09 s run and a 0.16 s one are not
/// both "0.1 s").
fn seconds(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.1} s")
    }
}

/// Why allocations are compared as they are.
fn basis_reason(diff: &Diff) -> String {
    let (basis, base, new) = (diff.basis, diff.base_covers, diff.new_covers);
    let covers = if base == new {
        format!("each recording is {}", base.describe())
    } else {
        format!(
            "the base is {}; the new, {}",
            base.describe(),
            new.describe()
        )
    };
    let how = basis.describe();
    match (diff.basis_asked, basis) {
        (true, _) => format!("{how}, as asked ({covers})."),
        (false, Basis::PerRun) => format!("{how}: {covers}, and a slower run allocates the same."),
        (false, Basis::PerSecond) => format!(
            "{how}: {covers}, whose length is the recorder's, not the program's \
             (--per-run compares totals)."
        ),
    }
}

/// One comparison: the allocations' change (and the in-use bytes') and the stack.
fn row(c: &Compared, basis: Basis) -> String {
    let per = basis.suffix();
    let rate = |v: f64| format!("{}{per}", human_bytes(v));
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
        "  alloc {}{per} [{}{per}, {}{per}] {:>6}  ({} → {}){}",
        signed(a.estimate),
        signed(a.lower),
        signed(a.upper),
        percent(c.alloc_percent()),
        rate(c.base_alloc),
        rate(c.new_alloc),
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
pub fn json(diff: &Diff, out: &mut dyn Write) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, diff)?;
    writeln!(out)
}

/// Differential folded stacks: `command;root;…;leaf base new`, bytes allocated per run or
/// per second ([`Diff::basis`]) in each recording (rounded).
pub fn folded(diff: &Diff, out: &mut dyn Write) -> std::io::Result<()> {
    for c in &diff.stacks {
        let mut path = vec![sanitize(&c.commands.join(","))];
        path.extend(c.frames.iter().rev().map(frame_name));
        writeln!(
            out,
            "{} {} {}",
            path.join(";"),
            c.base_alloc.max(0.0).round() as u64,
            c.new_alloc.max(0.0).round() as u64
        )?;
    }
    Ok(())
}

/// A profile whose values are the changes (new − base): `alloc_space` in bytes allocated
/// per run or per second, `inuse_space` in bytes; objects are not compared (0). `new` gives the
/// recording's metadata.
pub fn difference_profile(diff: &Diff, new: &Profile) -> Profile {
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
        "difference new - base ({:.1} s, {:.1} s): alloc_space is the change in {}, \
         inuse_space the change in bytes in use at the end; objects are not compared",
        diff.new_seconds,
        diff.base_seconds,
        diff.basis.describe()
    );
    profile.processes.truncate(1);
    profile.stacks = stacks;
    profile
}
