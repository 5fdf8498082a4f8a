//! The summary's answers beyond totals: which stacks grow, and which churn temporary
//! blocks (docs/design.md §10).

use std::fmt::Write as _;

use super::{row_chains, stack_row, Row};
use crate::{
    format::signed_bytes,
    schema::{GrowthValues, ProcessProfile, Profile, SiteProfile, StackProfile},
    stats::Estimate,
};

/// Samples a stack wants for bounds of about ±20% at 95%.
const ENOUGH_SAMPLES: f64 = 100.0;

/// When the largest stack's bounds are wider than ±20%: what they are, and what would
/// narrow them (a longer recording, or the interval that would give it about
/// [`ENOUGH_SAMPLES`] samples in the same time). `rows`: the allocated table's, largest
/// first (a command's stacks, or each process's).
pub(super) fn wide_bounds_hint<R: Row>(out: &mut String, profile: &Profile, rows: &[R]) {
    let Some(top) = rows.iter().find(|s| !s.lost()) else {
        return;
    };
    let e = top.alloc_bytes();
    if e.estimate <= 0.0 || !e.upper.is_finite() {
        return;
    }
    let half_width = (e.upper - e.lower) / 2.0 / e.estimate;
    if half_width <= 0.2 {
        return;
    }
    // The interval at which its bytes would have given about ENOUGH_SAMPLES samples (the
    // one in force may have changed: the throttle's).
    let interval = profile.sampling.mean_interval_bytes as f64;
    let wanted = (e.estimate / ENOUGH_SAMPLES).max(crate::schema::SMALLEST_INTERVAL as f64);
    // A power of two, as people type them.
    let suggested = 2f64.powi(wanted.log2().floor() as i32);
    let _ = write!(
        out,
        "bounds are wide (±{:.0}% on the largest stack, from {} samples): record longer",
        half_width * 100.0,
        top.samples()
    );
    if suggested < interval {
        let _ = write!(
            out,
            ", or sample more often: --interval {} (about {ENOUGH_SAMPLES:.0} samples on it \
             in the same time; each sample costs a few µs)",
            crate::units::size_flag(suggested as u64)
        );
    }
    let _ = writeln!(out);
}

/// A signed rate with its bounds: `+4.0 MiB/s [+3.4 MiB/s, +4.5 MiB/s]`.
pub(super) fn growth_rate(growth: &GrowthValues) -> String {
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
pub(super) fn process_growth(out: &mut String, process: &ProcessProfile) {
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

/// The sites whose in-use bytes grow (lower bound above zero), by what they hold (live at
/// the end, else at the peak): a leak reached through several stacks is one row. A profile
/// without sites (written before them) lists its growing stacks instead.
pub(super) fn growing_rows(out: &mut String, profile: &Profile, top: usize) {
    if profile.sites.is_empty() {
        return growing_stacks(out, profile, top);
    }
    let Some(tick) = profile
        .sites
        .iter()
        .find_map(|s| s.growth.map(|g| g.tick_seconds))
    else {
        return;
    };
    let held = |s: &SiteProfile| {
        s.inuse_bytes
            .filter(|e| e.estimate > 0.0)
            .or(s.peak_bytes)
            .map_or(0.0, |e| e.estimate)
    };
    let mut growing: Vec<(&SiteProfile, &GrowthValues)> = profile
        .sites
        .iter()
        .filter_map(|s| Some((s, s.growth.as_ref().filter(|g| g.growing)?)))
        .collect();
    growing.sort_by(|a, b| held(b.0).total_cmp(&held(a.0)));
    let _ = writeln!(
        out,
        "growing sites (in-use bytes' slope over the recording, every {tick} s; shown when \
         its lower bound is above 0), by what they hold:"
    );
    if growing.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for (site, growth) in growing.into_iter().take(top) {
        let _ = writeln!(
            out,
            "  {:>44}  holds {:>9}  {:>6} samples  pid {}  {}",
            growth_rate(growth),
            crate::format::bytes(held(site)),
            site.samples,
            site.pid,
            site_chain(site)
        );
    }
}

/// A site's row: its frames from the site (four at most), the allocating frame, and how
/// many stacks it sums.
fn site_chain(site: &SiteProfile) -> String {
    let names: Vec<String> = site
        .frames
        .iter()
        .take(super::ROW_FRAMES)
        .map(crate::format::frame_name)
        .collect();
    let mut chain = names.join(" ← ");
    if let Some(via) = &site.via {
        let _ = write!(chain, " [via {}]", crate::format::frame_name(via));
    }
    if site.stacks > 1 {
        let _ = write!(chain, " ({} stacks)", site.stacks);
    }
    chain
}

/// The stacks whose in-use bytes grow (lower bound above zero), fastest first.
fn growing_stacks(out: &mut String, profile: &Profile, top: usize) {
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

/// The stacks (of processes, or of commands) that allocate the most bytes freed within a
/// millisecond.
pub(super) fn temporary_rows<R: Row>(out: &mut String, stacks: &[R], top: usize) {
    let mut temporary: Vec<(&R, &crate::schema::LifetimeValues)> = stacks
        .iter()
        .filter_map(|s| Some((s, s.lifetimes()?)))
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
    let shown: Vec<&R> = temporary.iter().take(top).map(|(s, _)| *s).collect();
    for ((stack, l), chain) in temporary.iter().take(top).zip(row_chains(&shown)) {
        let detail = format!(
            "{} temporary  {} / {}",
            share(&l.freed_within_1ms),
            lifetime(l.p50_seconds),
            lifetime(l.p90_seconds)
        );
        stack_row(out, &l.temporary_bytes, &detail, *stack, &chain);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bounds of ±10% say nothing; ±50% from 10 samples at 512 KiB suggest 32 KiB (about
    /// 100 samples in the same time, rounded down to a power of two).
    #[test]
    fn wide_bounds_say_what_would_narrow_them() {
        let mut profile = allocscope_model::fixtures::synthetic();
        profile.sampling.mean_interval_bytes = 512 << 10;
        let mut out = String::new();
        wide_bounds_hint(&mut out, &profile, &profile.stacks);
        assert_eq!(out, "");
        let top = &mut profile.stacks[0];
        top.samples = 10;
        top.alloc_bytes.estimate = 10.0 * f64::from(512 << 10);
        top.alloc_bytes.lower = top.alloc_bytes.estimate * 0.5;
        top.alloc_bytes.upper = top.alloc_bytes.estimate * 1.5;
        wide_bounds_hint(&mut out, &profile, &profile.stacks);
        assert!(
            out.starts_with("bounds are wide (±50% on the largest stack, from 10 samples)")
                && out.contains("--interval 32KiB"),
            "{out}"
        );
    }
}
