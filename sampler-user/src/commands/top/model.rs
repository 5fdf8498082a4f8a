//! What `top` shows, as plain data: a [`Picture`] of the recording at one moment, turned
//! into table [`Row`]s (grouped, estimated, filtered, sorted). No terminal, no clock: the
//! rendering tests build pictures by hand.
//!
//! Stacks are grouped by (pid, allocating function, its caller), the collapsed view users
//! scan first; a group's estimates come from the merged sample sets of its stacks, so its
//! bounds are the bounds of the group, not sums of its members' bounds.

use std::collections::VecDeque;

use regex::Regex;

use crate::{
    format::frame_name,
    profile::{StackTally, Tally},
    stacks::symbolize::FrameInfo,
    stats::{estimate::Window, Estimate, SampleSet},
    text,
};

/// Below this many samples a row is marked uncertain: its bounds span a factor of several.
pub const UNCERTAIN_SAMPLES: u64 = 5;

/// Sampling settings the picture was taken with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ViewSettings {
    /// Mean sampling interval in bytes.
    pub interval: u64,
    /// Confidence of the bounds.
    pub confidence: f64,
    /// Frees are not tracked (no live numbers).
    pub alloc_only: bool,
    /// Leak view threshold in seconds.
    pub leak_age_seconds: f64,
    /// The rate window asked for, in seconds.
    pub window_seconds: f64,
}

/// Process-wide numbers for the header, over the rate window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    /// Exact allocation calls per second (kernel counters).
    pub calls_per_second: f64,
    /// Exact bytes requested per second (kernel counters).
    pub bytes_per_second: f64,
    /// Samples received per second.
    pub samples_per_second: f64,
    /// Events lost so far (ring buffer full, maps full).
    pub lost: u64,
    /// What the probes cost over the last picture's time, measured.
    pub cost: ProbeCost,
}

/// The probes' measured cost over a short span (see [`crate::cost`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProbeCost {
    /// CPU the probes added to the targets, in cores (0.01 = 1% of one core).
    pub cores: f64,
    /// `added / own` over the targets whose CPU time moved (`None`: too little to tell).
    pub share: Option<f64>,
    /// Nanoseconds added per allocation call.
    pub ns_per_call: f64,
}

/// A target as the header shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetState {
    /// Process id.
    pub pid: u32,
    /// Command name.
    pub command: String,
    /// It exited (the picture is its last).
    pub exited: bool,
}

/// One point of the sparklines.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HistoryPoint {
    /// Exact bytes allocated per second over the last second.
    pub bytes_per_second: f64,
    /// Estimated live heap.
    pub live_bytes: f64,
}

/// The recording at one moment: everything the view draws.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Picture {
    /// Seconds since the probes were attached.
    pub elapsed_seconds: f64,
    /// Sampling settings.
    pub settings: ViewSettings,
    /// Targets.
    pub targets: Vec<TargetState>,
    /// Header numbers.
    pub totals: Totals,
    /// Per stack sample sets and per process RSS.
    pub tally: Tally,
    /// The last minute, oldest first, one point per second.
    pub history: Vec<HistoryPoint>,
    /// Probes are detached (every target exited): the numbers are final.
    pub finished: bool,
}

impl Default for ViewSettings {
    fn default() -> Self {
        ViewSettings {
            interval: 512 * 1024,
            confidence: 0.95,
            alloc_only: false,
            leak_age_seconds: 30.0,
            window_seconds: 10.0,
        }
    }
}

/// The estimates a row (or a member stack) shows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Values {
    /// Bytes per second over the recent window.
    pub rate: Estimate,
    /// Bytes per second since the start.
    pub average: Estimate,
    /// Bytes live now (frees tracked).
    pub live: Option<Estimate>,
    /// Objects live now (frees tracked), else objects allocated since the start.
    pub objects: Estimate,
    /// Bytes live for longer than the leak age (frees tracked).
    pub leaked: Option<Estimate>,
    /// Objects live for longer than the leak age.
    pub leaked_objects: Option<Estimate>,
    /// Samples since the start.
    pub samples: u64,
}

impl Values {
    fn of(sets: &Sets, picture: &Picture) -> Values {
        let s = &picture.settings;
        let estimate = |set: &SampleSet, window| set.estimate(s.confidence, window, s.interval);
        let all = estimate(&sets.all, Window::RECORDING);
        let recent = estimate(&sets.recent, Window::SLIDING);
        let live = (!s.alloc_only).then(|| estimate(&sets.live, Window::RECORDING));
        let leaked = (!s.alloc_only).then(|| estimate(&sets.leaked, Window::RECORDING));
        Values {
            rate: recent
                .bytes
                .per_second(picture.tally.recent_seconds.max(1e-9)),
            average: all.bytes.per_second(picture.elapsed_seconds.max(1e-9)),
            live: live.map(|e| e.bytes),
            objects: live.map_or(all.objects, |e| e.objects),
            leaked: leaked.map(|e| e.bytes),
            leaked_objects: leaked.map(|e| e.objects),
            samples: sets.all.samples(),
        }
    }

    /// The value of `column` (0 where it does not apply), for sorting.
    pub fn sort_value(&self, column: Column) -> f64 {
        match column {
            Column::Rate => self.rate.estimate,
            Column::Average => self.average.estimate,
            Column::Live => self.live.map_or(0.0, |e| e.estimate),
            Column::Objects => self.objects.estimate,
            Column::Leaked => self.leaked.map_or(0.0, |e| e.estimate),
            Column::LeakedObjects => self.leaked_objects.map_or(0.0, |e| e.estimate),
            Column::Samples => self.samples as f64,
        }
    }

    /// Few samples: the numbers are rough.
    pub fn uncertain(&self) -> bool {
        self.samples < UNCERTAIN_SAMPLES
    }
}

/// The sample sets behind one row or member.
#[derive(Clone, Copy, Debug, Default)]
struct Sets {
    all: SampleSet,
    live: SampleSet,
    leaked: SampleSet,
    recent: SampleSet,
}

impl Sets {
    fn of(stack: &StackTally) -> Sets {
        Sets {
            all: stack.all,
            live: stack.live,
            leaked: stack.leaked,
            recent: stack.recent,
        }
    }

    fn merge(&mut self, other: &Sets) {
        self.all.merge(&other.all);
        self.live.merge(&other.live);
        self.leaked.merge(&other.leaked);
        self.recent.merge(&other.recent);
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
    /// Samples.
    Samples,
}

impl Column {
    /// The columns of a view, in display order.
    pub fn visible(alloc_only: bool, leak_view: bool) -> &'static [Column] {
        match (alloc_only, leak_view) {
            (true, _) => &[
                Column::Rate,
                Column::Average,
                Column::Objects,
                Column::Samples,
            ],
            (false, false) => &[
                Column::Rate,
                Column::Average,
                Column::Live,
                Column::Objects,
                Column::Samples,
            ],
            (false, true) => &[
                Column::Leaked,
                Column::LeakedObjects,
                Column::Live,
                Column::Rate,
                Column::Samples,
            ],
        }
    }

    /// Width of its cells.
    pub fn width(self) -> u16 {
        match self {
            Column::Rate | Column::Average => 12,
            Column::Live | Column::Leaked => 11,
            Column::Objects | Column::LeakedObjects => 10,
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

/// What identifies a row across pictures (selection and expansion follow it).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    /// Process id.
    pub pid: u32,
    /// The allocating function.
    pub function: String,
    /// Its caller (empty when the stack has one frame).
    pub caller: String,
}

/// One stack of a group, for the expanded view.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// Its frames, leaf first, as displayed.
    pub frames: Vec<String>,
    /// Its estimates.
    pub values: Values,
}

/// A table row: the stacks that share an allocating function and caller.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Identity.
    pub key: GroupKey,
    /// Module of the allocating function (file name).
    pub module: String,
    /// Estimates of the whole group.
    pub values: Values,
    /// Its stacks, sorted like the table.
    pub members: Vec<Member>,
}

impl Row {
    /// `function ← caller`.
    pub fn label(&self) -> String {
        if self.key.caller.is_empty() {
            self.key.function.clone()
        } else {
            format!("{} ← {}", self.key.function, self.key.caller)
        }
    }
}

/// How the rows are chosen and ordered.
#[derive(Clone, Debug, Default)]
pub struct RowQuery<'a> {
    /// Sort by this column, largest first.
    pub sort: Option<Column>,
    /// Keep groups with a frame whose function or module matches.
    pub filter: Option<&'a Regex>,
    /// Leak view: only groups with live blocks older than the leak age.
    pub leak_view: bool,
}

/// The rows of `picture`.
pub fn rows(picture: &Picture, query: &RowQuery<'_>) -> Vec<Row> {
    let sort = query
        .sort
        .unwrap_or_else(|| Column::visible(picture.settings.alloc_only, query.leak_view)[0]);
    let mut groups: std::collections::BTreeMap<GroupKey, (String, Sets, Vec<&StackTally>)> =
        Default::default();
    for stack in &picture.tally.stacks {
        if let Some(filter) = query.filter {
            if !stack
                .frames
                .iter()
                .any(|frame| frame_matches(frame, filter))
            {
                continue;
            }
        }
        let name = |i: usize| stack.frames.get(i).map(frame_name).unwrap_or_default();
        let key = GroupKey {
            pid: stack.pid,
            function: if stack.frames.is_empty() {
                "[no frames]".to_owned()
            } else {
                name(0)
            },
            caller: name(1),
        };
        let module = stack
            .frames
            .first()
            .and_then(|f| f.module.as_deref())
            .map(base_name)
            .map(text::printable)
            .unwrap_or_default()
            .into_owned();
        let entry = groups
            .entry(key)
            .or_insert_with(|| (module, Sets::default(), Vec::new()));
        entry.1.merge(&Sets::of(stack));
        entry.2.push(stack);
    }
    let mut rows: Vec<Row> = groups
        .into_iter()
        .map(|(key, (module, sets, stacks))| {
            let mut members: Vec<Member> = stacks
                .iter()
                .map(|stack| Member {
                    frames: stack.frames.iter().map(frame_line).collect(),
                    values: Values::of(&Sets::of(stack), picture),
                })
                .collect();
            members.sort_by(|a, b| {
                b.values
                    .sort_value(sort)
                    .total_cmp(&a.values.sort_value(sort))
            });
            Row {
                key,
                module,
                values: Values::of(&sets, picture),
                members,
            }
        })
        .filter(|row| !query.leak_view || row.values.leaked.is_some_and(|e| e.samples > 0))
        .collect();
    rows.sort_by(|a, b| {
        b.values
            .sort_value(sort)
            .total_cmp(&a.values.sort_value(sort))
            .then_with(|| a.key.cmp(&b.key))
    });
    rows
}

fn frame_matches(frame: &FrameInfo, filter: &Regex) -> bool {
    frame
        .function
        .as_deref()
        .is_some_and(|f| filter.is_match(f))
        || frame.module.as_deref().is_some_and(|m| filter.is_match(m))
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `function (module:line)` for the expanded stack.
pub fn frame_line(frame: &FrameInfo) -> String {
    let name = frame_name(frame);
    let module = frame.module.as_deref().map(base_name).map(text::printable);
    match (module, &frame.file, frame.line) {
        (_, Some(file), Some(line)) => {
            format!("{name}  {}:{line}", text::printable(base_name(file)))
        }
        (Some(module), _, _) => format!("{name}  ({module})"),
        _ => name,
    }
}

/// Exact counter readings over time, for rates over the window.
#[derive(Clone, Debug, Default)]
pub struct CounterHistory {
    /// (seconds since start, calls, bytes, samples), oldest first.
    points: VecDeque<(f64, u64, u64, u64)>,
}

impl CounterHistory {
    /// Records a reading, keeping readings back to `keep_seconds` before it.
    pub fn push(&mut self, seconds: f64, calls: u64, bytes: u64, samples: u64, keep_seconds: f64) {
        self.points.push_back((seconds, calls, bytes, samples));
        while self
            .points
            .get(1)
            .is_some_and(|&(t, ..)| t <= seconds - keep_seconds)
        {
            self.points.pop_front();
        }
    }

    /// Calls, bytes and samples per second between the oldest reading kept at least
    /// `window_seconds` back (or the first) and the latest.
    pub fn rates(&self, window_seconds: f64) -> (f64, f64, f64) {
        let Some(&(t1, c1, b1, s1)) = self.points.back() else {
            return (0.0, 0.0, 0.0);
        };
        let &(t0, c0, b0, s0) = self
            .points
            .iter()
            .rev()
            .find(|&&(t, ..)| t <= t1 - window_seconds)
            .or_else(|| self.points.front())
            .unwrap_or(&(t1, c1, b1, s1));
        let dt = t1 - t0;
        if dt <= 0.0 {
            return (0.0, 0.0, 0.0);
        }
        let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / dt;
        (per(c0, c1), per(b0, b1), per(s0, s1))
    }

    /// Bytes per second over the last reading's interval.
    pub fn last_bytes_per_second(&self) -> f64 {
        let n = self.points.len();
        if n < 2 {
            return 0.0;
        }
        let (t0, _, b0, _) = self.points[n - 2];
        let (t1, _, b1, _) = self.points[n - 1];
        if t1 <= t0 {
            0.0
        } else {
            b1.saturating_sub(b0) as f64 / (t1 - t0)
        }
    }
}

/// The live-heap estimate of the whole picture (all stacks' live samples merged).
pub fn live_heap(picture: &Picture) -> Option<Estimate> {
    if picture.settings.alloc_only {
        return None;
    }
    let mut live = SampleSet::default();
    for stack in &picture.tally.stacks {
        live.merge(&stack.live);
    }
    Some(
        live.estimate(
            picture.settings.confidence,
            Window::RECORDING,
            picture.settings.interval,
        )
        .bytes,
    )
}

/// The sampled estimate of the allocation rate over the window (all stacks merged).
pub fn sampled_rate(picture: &Picture) -> Estimate {
    let mut recent = SampleSet::default();
    for stack in &picture.tally.stacks {
        recent.merge(&stack.recent);
    }
    recent
        .estimate(
            picture.settings.confidence,
            Window::SLIDING,
            picture.settings.interval,
        )
        .bytes
        .per_second(picture.tally.recent_seconds.max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_numbers() {
        assert_eq!(compact_bytes(0.0), "0B");
        assert_eq!(compact_bytes(999.0), "999B");
        assert_eq!(compact_bytes(1023.0), "1023B");
        assert_eq!(compact_bytes(1023.9), "1.00K");
        assert_eq!(compact_bytes(12.3 * 1024.0 * 1024.0), "12.3M");
        assert_eq!(compact_bytes(156.0 * 1024.0 * 1024.0), "156M");
        assert_eq!(compact_count(45_600.0), "45.6k");
        assert_eq!(compact_count(7.0), "7");
        assert_eq!(seconds_label(10.0), "10s");
        assert_eq!(seconds_label(90.0), "1m30s");
        assert_eq!(seconds_label(120.0), "2m");
    }

    #[test]
    fn bounds_are_shown_relative() {
        let e = Estimate {
            samples: 40,
            estimate: 100.0,
            lower: 92.0,
            upper: 110.0,
        };
        assert_eq!(relative_bound(&e), "±10%");
        assert_eq!(bytes_cell(&e), "100B ±10%");
        let none = Estimate {
            samples: 0,
            estimate: 0.0,
            lower: 0.0,
            upper: 2048.0,
        };
        assert_eq!(bytes_cell(&none), "<2.00K");
    }

    #[test]
    fn counter_history_rates_cover_the_window() {
        let mut h = CounterHistory::default();
        for second in 0..=30u64 {
            // 100 calls/s and 1000 B/s until 20 s, then 10x.
            let (calls, bytes) = if second <= 20 {
                (second * 100, second * 1000)
            } else {
                (2000 + (second - 20) * 1000, 20_000 + (second - 20) * 10_000)
            };
            h.push(second as f64, calls, bytes, second, 60.0);
        }
        let (calls, bytes, samples) = h.rates(10.0);
        assert!((calls - 1000.0).abs() < 1e-9, "{calls}");
        assert!((bytes - 10_000.0).abs() < 1e-9);
        assert!((samples - 1.0).abs() < 1e-9);
        assert!((h.last_bytes_per_second() - 10_000.0).abs() < 1e-9);
        let (calls, ..) = h.rates(30.0);
        assert!((calls - 400.0).abs() < 1e-9, "{calls}");
        // Keeping 5 s drops older readings.
        let mut short = CounterHistory::default();
        for second in 0..100u64 {
            short.push(second as f64, second, second, second, 5.0);
        }
        assert!(short.points.len() <= 7);
    }
}
