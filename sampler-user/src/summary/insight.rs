//! The summary's answers beyond totals: which stacks grow, and which churn temporary
//! blocks (docs/design.md §10).

use std::fmt::Write as _;

use super::{row_chains, stack_row};
use crate::{
    format::signed_bytes,
    profile::{GrowthValues, ProcessProfile, Profile, StackProfile},
    stats::Estimate,
};

/// A signed rate with its bounds: `+4.0 MiB/s [+3.4 MiB/s, +4.5 MiB/s]`.
pub fn growth_rate(growth: &GrowthValues) -> String {
    let e = &growth.bytes_per_second;
    let signed = |v: f64| format!("{}/s", signed_bytes(v));
    format!(
        "{} [{}, {}]",
        signed(e.estimate),
        signed(e.lower),
        signed(e.upper)
    )
}

/// A process's growth line.
pub fn process_growth(out: &mut String, process: &ProcessProfile) {
    if let Some(growth) = &process.growth {
        let _ = writeln!(
            out,
            "    in-use bytes change {}{}",
            growth_rate(growth),
            if growth.growing {
                ": growing"
            } else {
                ": not shown to grow"
            }
        );
    }
}

/// The stacks whose in-use bytes grow (lower bound above zero), fastest first.
pub fn growing_rows(out: &mut String, profile: &Profile, top: usize) {
    let mut growing: Vec<(&StackProfile, &GrowthValues)> = profile
        .stacks
        .iter()
        .filter_map(|s| Some((s, s.growth.as_ref().filter(|g| g.growing)?)))
        .collect();
    let Some(tick) = profile
        .stacks
        .iter()
        .find_map(|s| s.growth.map(|g| g.tick_seconds))
    else {
        return;
    };
    growing.sort_by(|a, b| {
        b.1.bytes_per_second
            .estimate
            .total_cmp(&a.1.bytes_per_second.estimate)
    });
    let _ = writeln!(
        out,
        "growing stacks (in-use bytes' slope over the recording, every {tick} s; shown when \
         its lower bound is above 0):"
    );
    if growing.is_empty() {
        let _ = writeln!(out, "  none");
        return;
    }
    let shown: Vec<&StackProfile> = growing.iter().take(top).map(|(s, _)| *s).collect();
    for ((stack, growth), chain) in growing.iter().take(top).zip(row_chains(&shown)) {
        let _ = writeln!(
            out,
            "  {:>44}  {:>6} samples  pid {}  {chain}",
            growth_rate(growth),
            growth.bytes_per_second.samples,
            stack.pid
        );
    }
}

/// Lifetime in seconds, in the unit that reads best.
pub(super) fn lifetime(seconds: Option<f64>) -> String {
    match seconds {
        None => "-".to_owned(),
        Some(s) if s < 1e-3 => format!("{:.0} µs", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.0} ms", s * 1e3),
        Some(s) => format!("{s:.1} s"),
    }
}

fn share(e: &Estimate) -> String {
    format!(
        "{:.0}% [{:.0}%, {:.0}%]",
        e.estimate * 100.0,
        e.lower * 100.0,
        e.upper * 100.0
    )
}

/// The stacks that allocate the most bytes freed within a millisecond.
pub fn temporary_rows(out: &mut String, profile: &Profile, top: usize) {
    let mut temporary: Vec<(&StackProfile, &crate::profile::LifetimeValues)> = profile
        .stacks
        .iter()
        .filter_map(|s| Some((s, s.lifetimes.as_ref()?)))
        .filter(|(_, l)| l.temporary_bytes.samples > 0)
        .collect();
    if temporary.is_empty() {
        return;
    }
    temporary.sort_by(|a, b| {
        b.1.temporary_bytes
            .estimate
            .total_cmp(&a.1.temporary_bytes.estimate)
    });
    let _ = writeln!(
        out,
        "temporary allocations (freed within 1 ms), by bytes; share of the stack's bytes, \
         lifetimes p50/p90:"
    );
    let shown: Vec<&StackProfile> = temporary.iter().take(top).map(|(s, _)| *s).collect();
    for ((stack, l), chain) in temporary.iter().take(top).zip(row_chains(&shown)) {
        let detail = format!(
            "{} temporary  {} / {}",
            share(&l.freed_within_1ms),
            lifetime(l.p50_seconds),
            lifetime(l.p90_seconds)
        );
        stack_row(out, &l.temporary_bytes, &detail, stack, &chain);
    }
}
