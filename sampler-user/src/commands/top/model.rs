//! What `top` shows, as plain data: a [`Picture`] of the recording at one moment, turned
//! into table [`Row`]s (grouped, estimated, filtered, sorted). No terminal, no clock: the
//! rendering tests build pictures by hand.
//!
//! Stacks are grouped by (pid, site, its caller, the allocating function when it is not the
//! site; the site: [`crate::stacks::site`]), the collapsed view users
//! scan first; a group's estimates come from the merged sample sets of its stacks, so its
//! bounds are the bounds of the group, not sums of its members' bounds.

use std::collections::VecDeque;

use regex::Regex;

pub use super::columns::{
    bytes_cell, compact_bytes, compact_count, count_cell, growth_cell, rate_cell, relative_bound,
    seconds_label, Column, View,
};
pub use super::values::{Values, ViewSettings};
use crate::{
    format::frame_name,
    profile::{StackTally, Tally},
    stacks::symbolize::FrameInfo,
    stats::{estimate::Window, growth::GrowthSums, Estimate, SampleSet},
    text,
};

/// Above this many processes, rows are by command rather than by process, as the
/// summary's are.
pub use crate::summary::GROUPED_ABOVE;

/// Below this many samples a row is marked uncertain: its bounds span a factor of several.
pub const UNCERTAIN_SAMPLES: u64 = 5;

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
            from_start: false,
        }
    }
}

impl Values {
    fn of(sets: &Sets, picture: &Picture) -> Values {
        let s = &picture.settings;
        let estimate = |set: &SampleSet, window| set.estimate(s.confidence, window, s.interval);
        let all = estimate(&sets.all, Window::RECORDING);
        let recent = estimate(&sets.recent, Window::SLIDING);
        let tracked = !s.alloc_only && !sets.threads_only;
        let live = tracked.then(|| estimate(&sets.live, Window::RECORDING));
        let leaked = tracked.then(|| estimate(&sets.leaked, Window::RECORDING));
        let elapsed = picture.elapsed_seconds.max(1e-9);
        let tally = &picture.tally;
        let growth = tally
            .timeline
            .as_ref()
            .filter(|_| tracked)
            .and_then(|t| {
                sets.growth
                    .slope(tally.ticks, t.grid().tick_seconds(), s.confidence)
            })
            .map(|g| Estimate {
                samples: g.samples,
                estimate: g.bytes_per_second,
                lower: g.lower,
                upper: g.upper,
            });
        let temporary = tracked.then(|| {
            estimate(&sets.temporary, Window::RECORDING)
                .bytes
                .per_second(elapsed)
        });
        Values {
            growth,
            temporary,
            allocated: all.objects,
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
    growth: GrowthSums,
    /// Samples of blocks freed within 1 ms.
    temporary: SampleSet,
    /// Only `all` is known (one thread's part of a stack).
    threads_only: bool,
}

impl Sets {
    fn of(stack: &StackTally) -> Sets {
        Sets {
            all: stack.all,
            live: stack.live,
            leaked: stack.leaked,
            recent: stack.recent,
            growth: stack.growth,
            temporary: stack
                .breakdown
                .lifetimes
                .as_ref()
                .map(|l| l.classes[0])
                .unwrap_or_default(),
            threads_only: false,
        }
    }

    /// One thread's part of a stack: what it allocated, nothing else known.
    fn of_thread(set: &SampleSet) -> Sets {
        Sets {
            all: *set,
            threads_only: true,
            ..Sets::default()
        }
    }

    fn merge(&mut self, other: &Sets) {
        self.all.merge(&other.all);
        self.live.merge(&other.live);
        self.leaked.merge(&other.leaked);
        self.recent.merge(&other.recent);
        self.growth.merge(&other.growth);
        self.temporary.merge(&other.temporary);
        self.threads_only |= other.threads_only;
    }
}

/// What identifies a row across pictures (selection and expansion follow it).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    /// Process id (0 where rows are by command).
    pub pid: u32,
    /// The command of every process in the row, where there are more processes than
    /// [`GROUPED_ABOVE`] (a build's `cc1` ×33 is one row per site); empty otherwise.
    pub command: String,
    /// The site: the first frame past the allocator and the runtimes' allocation
    /// machinery ([`crate::stacks::site`]), the allocating function where there is none.
    pub function: String,
    /// Its caller (empty when the stack has no frame beyond it).
    pub caller: String,
    /// The allocating function, when the site is not it.
    pub via: String,
}

/// One stack of a group, for the expanded view.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// Its frames, leaf first, as displayed.
    pub frames: Vec<String>,
    /// Its estimates.
    pub values: Values,
    /// What sizes it asked for: the largest classes' shares of its bytes (`≤32B 45% ·
    /// ≤1K 55%`).
    pub sizes: String,
}

/// A table row: the stacks that share a site, its caller and their allocating function.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Identity.
    pub key: GroupKey,
    /// Module of the site (file name).
    pub module: String,
    /// Estimates of the whole group.
    pub values: Values,
    /// Its stacks, sorted like the table.
    pub members: Vec<Member>,
    /// How many processes its stacks come from.
    pub processes: usize,
}

impl Row {
    /// `site ← caller [via leaf]`.
    pub fn label(&self) -> String {
        let key = &self.key;
        let mut label = key.function.clone();
        if !key.caller.is_empty() {
            label = format!("{label} ← {}", key.caller);
        }
        if !key.via.is_empty() {
            label = format!("{label} [via {}]", key.via);
        }
        label
    }
}

/// How the rows are chosen and ordered.
#[derive(Clone, Debug, Default)]
pub struct RowQuery<'a> {
    /// Sort by this column, largest first.
    pub sort: Option<Column>,
    /// Keep groups with a frame whose function or module matches.
    pub filter: Option<&'a Regex>,
    /// Which table.
    pub view: View,
}

/// The rows of `picture`.
pub fn rows(picture: &Picture, query: &RowQuery<'_>) -> Vec<Row> {
    let sort = query
        .sort
        .unwrap_or_else(|| Column::visible(picture.settings.alloc_only, query.view)[0]);
    type Group<'a> = (String, Sets, Vec<(&'a StackTally, Sets)>);
    let mut groups: std::collections::BTreeMap<GroupKey, Group<'_>> = Default::default();
    let by_command =
        (picture.targets.len() > GROUPED_ABOVE && query.view != View::Threads).then(|| {
            picture
                .targets
                .iter()
                .map(|t| (t.pid, t.command.as_str()))
                .collect::<std::collections::HashMap<u32, &str>>()
        });
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
        for (mut key, module, sets) in groups_of(stack, picture, query.view) {
            if let Some(commands) = &by_command {
                let command = commands.get(&key.pid).copied().unwrap_or("?");
                key.command = text::printable(command).into_owned();
                key.pid = 0;
            }
            let entry = groups
                .entry(key)
                .or_insert_with(|| (module, Sets::default(), Vec::new()));
            entry.1.merge(&sets);
            entry.2.push((stack, sets));
        }
    }
    let mut rows: Vec<Row> = groups
        .into_iter()
        .map(|(key, (module, sets, stacks))| {
            let mut members: Vec<Member> = stacks
                .iter()
                .map(|(stack, sets)| Member {
                    frames: stack.frames.iter().map(frame_line).collect(),
                    values: Values::of(sets, picture),
                    sizes: sizes_line(stack),
                })
                .collect();
            members.sort_by(|a, b| {
                b.values
                    .sort_value(sort)
                    .total_cmp(&a.values.sort_value(sort))
            });
            let pids: std::collections::BTreeSet<u32> = stacks.iter().map(|(s, _)| s.pid).collect();
            Row {
                key,
                module,
                values: Values::of(&sets, picture),
                members,
                processes: pids.len(),
            }
        })
        .filter(|row| match query.view {
            View::Leaks => row.values.leaked.is_some_and(|e| e.samples > 0),
            View::Temporary => row.values.temporary.is_some_and(|e| e.samples > 0),
            _ => true,
        })
        .collect();
    rows.sort_by(|a, b| {
        b.values
            .sort_value(sort)
            .total_cmp(&a.values.sort_value(sort))
            .then_with(|| a.key.cmp(&b.key))
    });
    rows
}

/// The groups `stack` belongs to in `view`, with its sets in each: its (pid, function,
/// caller); in the thread view, each thread that allocated from it.
fn groups_of(stack: &StackTally, picture: &Picture, view: View) -> Vec<(GroupKey, String, Sets)> {
    if view == View::Threads {
        let breakdown = &stack.breakdown;
        let others =
            (breakdown.other_threads.samples() > 0).then_some((None, &breakdown.other_threads));
        return breakdown
            .threads
            .iter()
            .map(|(tid, set)| (Some(*tid), set))
            .chain(others)
            .map(|(tid, set)| {
                let label = match tid {
                    None => "[other threads]".to_owned(),
                    Some(tid) => {
                        let name = picture
                            .tally
                            .thread_names
                            .get(&(stack.pid, tid))
                            .map(|n| text::printable(n).into_owned())
                            .unwrap_or_default();
                        format!("{name} ({tid})")
                    }
                };
                let key = GroupKey {
                    pid: stack.pid,
                    command: String::new(),
                    function: label,
                    caller: String::new(),
                    via: String::new(),
                };
                (key, String::new(), Sets::of_thread(set))
            })
            .collect();
    }
    let name = |i: usize| stack.frames.get(i).map(frame_name).unwrap_or_default();
    let site = crate::stacks::site::sites().site_of(&stack.frames);
    let key = GroupKey {
        pid: stack.pid,
        command: String::new(),
        function: if stack.frames.is_empty() {
            "[no frames]".to_owned()
        } else {
            name(site)
        },
        caller: name(site + 1),
        via: if site > 0 { name(0) } else { String::new() },
    };
    let module = stack
        .frames
        .get(site)
        .and_then(|f| f.module.as_deref())
        .map(base_name)
        .map(text::printable)
        .unwrap_or_default()
        .into_owned();
    vec![(key, module, Sets::of(stack))]
}

/// The largest size classes of `stack` and their shares of its bytes: `≤32B 45% · ≤1K
/// 55%` (empty: no breakdown).
fn sizes_line(stack: &StackTally) -> String {
    let classes: Vec<(u8, f64)> = stack
        .breakdown
        .sizes
        .iter()
        .map(|(class, set)| (*class, set.horvitz_thompson().bytes))
        .collect();
    let total: f64 = classes.iter().map(|(_, b)| b).sum();
    if total <= 0.0 {
        return String::new();
    }
    let mut largest = classes;
    largest.sort_by(|a, b| b.1.total_cmp(&a.1));
    largest.truncate(4);
    largest.sort_by_key(|(class, _)| *class);
    largest
        .iter()
        .map(|(class, bytes)| {
            let top = 1u64.checked_shl(u32::from(*class)).unwrap_or(u64::MAX);
            format!(
                "≤{} {:.0}%",
                compact_bytes(top as f64),
                bytes / total * 100.0
            )
        })
        .collect::<Vec<_>>()
        .join(" · ")
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
