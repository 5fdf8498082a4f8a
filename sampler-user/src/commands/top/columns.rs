//! The table's columns and views: which columns a view shows, their titles, and how a
//! cell renders an estimate (compact units, the bound as ± relative).

use super::values::{Values, ViewSettings};
use crate::stats::Estimate;

/// Which table `top` shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum View {
    /// Stacks grouped by site and caller (the default).
    #[default]
    Stacks,
    /// Stacks with blocks live for longer than the leak age (`l`).
    Leaks,
    /// Stacks by the growth of their in-use bytes (`r`).
    Growth,
    /// Stacks by the bytes they free within 1 ms (`t`).
    Temporary,
    /// Threads: what each allocated, by name (`T`).
    Threads,
}

impl View {
    /// The header's tag for the view (`None`: the default).
    pub fn tag(self) -> Option<&'static str> {
        match self {
            View::Stacks => None,
            View::Leaks => Some("LEAKS"),
            View::Growth => Some("GROWTH"),
            View::Temporary => Some("TEMPORARY"),
            View::Threads => Some("THREADS"),
        }
    }

    /// Whether it needs frees tracked.
    pub fn needs_frees(self) -> bool {
        matches!(self, View::Leaks | View::Growth | View::Temporary)
    }
}

/// A table column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Column {
    /// Allocation rate over the recent window.
    Rate,
    /// Allocation rate since the start.
    Average,
    /// Live bytes.
    Live,
    /// Live objects (allocated objects without free tracking).
    Objects,
    /// Bytes live longer than the leak age.
    Leaked,
    /// Objects live longer than the leak age.
    LeakedObjects,
    /// Growth of the in-use bytes, per second (▲: growing).
    Growth,
    /// Bytes freed within 1 ms of their allocation, per second since the start.
    Temporary,
    /// Objects allocated since the start (the thread view's: nothing is known live per
    /// thread).
    Allocated,
    /// Samples.
    Samples,
}

impl Column {
    /// The columns of a view, in display order.
    pub fn visible(alloc_only: bool, view: View) -> &'static [Column] {
        match (alloc_only, view) {
            (_, View::Threads) => &[Column::Average, Column::Allocated, Column::Samples],
            (true, _) => &[
                Column::Rate,
                Column::Average,
                Column::Objects,
                Column::Samples,
            ],
            (false, View::Stacks) => &[
                Column::Rate,
                Column::Average,
                Column::Live,
                Column::Objects,
                Column::Samples,
            ],
            (false, View::Leaks) => &[
                Column::Leaked,
                Column::LeakedObjects,
                Column::Live,
                Column::Rate,
                Column::Samples,
            ],
            (false, View::Growth) => &[Column::Growth, Column::Live, Column::Rate, Column::Samples],
            (false, View::Temporary) => &[
                Column::Temporary,
                Column::Average,
                Column::Live,
                Column::Samples,
            ],
        }
    }

    /// Width of its cells.
    pub fn width(self) -> u16 {
        match self {
            Column::Rate | Column::Average | Column::Temporary => 12,
            Column::Growth => 14,
            Column::Live | Column::Leaked => 11,
            Column::Objects | Column::LeakedObjects | Column::Allocated => 10,
            Column::Samples => 5,
        }
    }

    /// Header text.
    pub fn title(self, settings: &ViewSettings) -> String {
        match self {
            Column::Rate => format!("RATE {}", seconds_label(settings.window_seconds)),
            Column::Average => "RATE all".to_owned(),
            Column::Live => "LIVE".to_owned(),
            Column::Objects if settings.alloc_only => "OBJECTS".to_owned(),
            Column::Objects => "LIVE OBJ".to_owned(),
            Column::Leaked => format!(">{} LIVE", seconds_label(settings.leak_age_seconds)),
            Column::LeakedObjects => "OBJ".to_owned(),
            Column::Growth => "GROWTH".to_owned(),
            Column::Temporary => "TEMP <1ms".to_owned(),
            Column::Allocated => "OBJECTS".to_owned(),
            Column::Samples => "SAMP".to_owned(),
        }
    }

    /// The cell text of `values`.
    pub fn cell(self, values: &Values) -> String {
        match self {
            Column::Rate => rate_cell(&values.rate),
            Column::Average => rate_cell(&values.average),
            Column::Live => values.live.map_or_else(String::new, |e| bytes_cell(&e)),
            Column::Objects => count_cell(&values.objects),
            Column::Leaked => values.leaked.map_or_else(String::new, |e| bytes_cell(&e)),
            Column::LeakedObjects => values
                .leaked_objects
                .map_or_else(String::new, |e| count_cell(&e)),
            Column::Growth => values.growth.map_or_else(String::new, |g| growth_cell(&g)),
            Column::Temporary => values.temporary.map_or_else(String::new, |e| rate_cell(&e)),
            Column::Allocated => count_cell(&values.allocated),
            Column::Samples => values.samples.to_string(),
        }
    }
}

/// `10s`, `1m`, `1m30s`, `2h`.
pub fn seconds_label(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

/// `12.3M`: binary units, three significant digits, one letter.
pub fn compact_bytes(value: f64) -> String {
    compact(value, 1024.0, &["B", "K", "M", "G", "T"])
}

/// `45.6k`: decimal units for counts.
pub fn compact_count(value: f64) -> String {
    compact(value, 1000.0, &["", "k", "M", "G", "T"])
}

fn compact(value: f64, base: f64, units: &[&str]) -> String {
    let mut value = value.max(0.0);
    let mut unit = 0;
    while value >= base * 0.9995 && unit < units.len() - 1 {
        value /= base;
        unit += 1;
    }
    let digits = if unit == 0 || value >= 99.95 {
        0
    } else if value >= 9.995 {
        1
    } else {
        2
    };
    format!("{value:.digits$}{}", units[unit])
}

/// Half the interval's width relative to the estimate: `±8%` (the larger side).
pub fn relative_bound(estimate: &Estimate) -> String {
    if estimate.estimate <= 0.0 {
        return String::new();
    }
    let half = (estimate.upper - estimate.estimate).max(estimate.estimate - estimate.lower);
    let percent = (half / estimate.estimate * 100.0).round();
    if percent >= 1000.0 {
        "±>999%".to_owned()
    } else {
        format!("±{percent:.0}%")
    }
}

/// `12.3M ±8%`, or `<12.3M` (the upper bound) with no samples.
pub fn bytes_cell(estimate: &Estimate) -> String {
    cell(estimate, compact_bytes, "")
}

/// `12.3M/s ±8%`, or `<12.3M/s` with no samples.
pub fn rate_cell(estimate: &Estimate) -> String {
    cell(estimate, compact_bytes, "/s")
}

/// `+1.2M/s ±15% ▲` (growing: the lower bound is above zero), `-3.0K/s ±90%`.
pub fn growth_cell(growth: &Estimate) -> String {
    let magnitude = compact_bytes(growth.estimate.abs());
    let sign = if growth.estimate < 0.0 { "-" } else { "+" };
    let half = (growth.upper - growth.estimate).max(growth.estimate - growth.lower);
    let bound = if growth.estimate == 0.0 {
        format!("±{}", compact_bytes(half))
    } else {
        let percent = (half / growth.estimate.abs() * 100.0).round();
        if percent >= 1000.0 {
            "±>999%".to_owned()
        } else {
            format!("±{percent:.0}%")
        }
    };
    let mark = if growth.lower > 0.0 { " ▲" } else { "" };
    format!("{sign}{magnitude}/s {bound}{mark}")
}

/// `4.5k ±8%`, or `<30` with no samples.
pub fn count_cell(estimate: &Estimate) -> String {
    cell(estimate, compact_count, "")
}

fn cell(estimate: &Estimate, number: fn(f64) -> String, unit: &str) -> String {
    if estimate.samples == 0 {
        format!("<{}{unit}", number(estimate.upper))
    } else {
        format!(
            "{}{unit} {}",
            number(estimate.estimate),
            relative_bound(estimate)
        )
    }
}

impl Values {
    /// The value of `column` (0 where it does not apply), for sorting.
    pub fn sort_value(&self, column: Column) -> f64 {
        match column {
            Column::Rate => self.rate.estimate,
            Column::Average => self.average.estimate,
            Column::Live => self.live.map_or(0.0, |e| e.estimate),
            Column::Objects => self.objects.estimate,
            Column::Leaked => self.leaked.map_or(0.0, |e| e.estimate),
            Column::LeakedObjects => self.leaked_objects.map_or(0.0, |e| e.estimate),
            Column::Growth => self.growth.map_or(f64::MIN, |e| e.estimate),
            Column::Temporary => self.temporary.map_or(0.0, |e| e.estimate),
            Column::Allocated => self.allocated.estimate,
            Column::Samples => self.samples as f64,
        }
    }
}
