//! What the report's page is given: the values it can show, every stack root first with
//! its values as (estimate, error below, error above), the timeline's series and the size
//! histogram. Pure: a profile in, serializable data out.

use std::collections::HashMap;

use serde::Serialize;

use super::super::Value;
use crate::{
    format::{frame_name, sanitize},
    schema::{CommandGroup, ProcessProfile},
    schema::{Profile, SeriesValues, StackProfile},
    stacks::symbolize::FrameInfo,
    stats::{
        difference::{self, Spread},
        Estimate,
    },
    text,
};

/// The page's data (`kind` "profile" or "diff").
#[derive(Debug, Serialize)]
pub struct Data {
    /// "profile" or "diff".
    pub kind: &'static str,
    /// The page's title.
    pub title: String,
    /// The summary's header, as text.
    pub preamble: String,
    /// Confidence of every bound.
    pub confidence: f64,
    /// Standard errors on each side of a bound at `confidence` (for a diff, over its
    /// comparisons).
    pub z: f64,
    /// The values offered.
    pub metrics: Vec<Metric>,
    /// The metric shown first (index into `metrics`).
    pub first: usize,
    /// Frame names, indexed by the stacks.
    pub frames: Vec<String>,
    /// Every stack.
    pub stacks: Vec<StackData>,
    /// Charts over time (recordings with a timeline).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<Series>,
    /// Seconds of each point of `series`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub at_seconds: Vec<f64>,
    /// Allocated bytes per size class, over all stacks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sizes: Vec<SizeBar>,
}

/// A value the flame graph and table can show.
#[derive(Debug, Serialize)]
pub struct Metric {
    pub key: &'static str,
    pub label: &'static str,
    /// "bytes", "count" or "bytes/s".
    pub unit: &'static str,
    /// It can be negative (a growth rate, a change): its lower bound is not held at 0.
    pub signed: bool,
}

/// One stack: frames root first (the process first), samples, and per metric `[estimate,
/// error below, error above]` (`null`: the stack has no such value; an error above that
/// is `null` is unbounded). A diff's values are `[change, below, above, width, base, new]`.
#[derive(Debug, Serialize)]
pub struct StackData {
    pub f: Vec<u32>,
    /// The index in `f` of its site ([`crate::stacks::site`]): the frame its rows are named by.
    pub site: usize,
    pub s: u64,
    pub v: Vec<Option<Vec<f64>>>,
    /// Shares of its bytes freed within 1 ms, within 1 s, later, still in use (estimate,
    /// lower, upper each), and the lifetime quantiles p50, p90 (seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub life: Option<Vec<Option<f64>>>,
    /// Its size classes: `[from, to, bytes, lower, upper]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sizes: Vec<[f64; 5]>,
    /// Its threads: name (or tid) and bytes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<(String, f64)>,
}

/// A series of a chart: a process's total or one stack's.
#[derive(Debug, Serialize)]
pub struct Series {
    pub name: String,
    /// In-use bytes, lower, upper per point.
    pub inuse: [Vec<f64>; 3],
    /// Allocated bytes per second, lower, upper per point.
    pub alloc: [Vec<f64>; 3],
}

/// A bar of the size histogram.
#[derive(Debug, Serialize)]
pub struct SizeBar {
    pub from: u64,
    pub to: u64,
    pub bytes: f64,
    pub lower: f64,
    pub upper: f64,
}

/// The bounds the page shows for a node (a stack, a flame-graph frame, a function): the
/// sum of its stacks' estimates, their errors added in quadrature, `z` of them each side,
/// the lower not below zero unless the value is `signed`. The script's rule, written here
/// to be tested.
#[cfg(test)]
fn node_bounds(stacks: &[[f64; 3]], z: f64, signed: bool) -> (f64, f64, f64) {
    let estimate: f64 = stacks.iter().map(|s| s[0]).sum();
    let below = stacks.iter().map(|s| s[1] * s[1]).sum::<f64>().sqrt();
    let above = stacks.iter().map(|s| s[2] * s[2]).sum::<f64>().sqrt();
    let lower = estimate - z * below;
    (
        estimate,
        if signed { lower } else { lower.max(0.0) },
        estimate + z * above,
    )
}

/// A stack's value of one metric.
type Of = fn(&StackProfile) -> Option<Estimate>;

/// The values a profile has, in the order the page offers them.
fn metrics(profile: &Profile) -> Vec<(Metric, Of)> {
    let mut metrics: Vec<(Metric, Of)> = vec![
        (
            Metric {
                key: "alloc_bytes",
                label: "allocated bytes",
                unit: "bytes",
                signed: false,
            },
            |s| Some(s.alloc_bytes),
        ),
        (
            Metric {
                key: "alloc_objects",
                label: "allocations",
                unit: "count",
                signed: false,
            },
            |s| Some(s.alloc_objects),
        ),
    ];
    if !profile.alloc_only {
        metrics.push((
            Metric {
                key: "inuse_bytes",
                label: "live bytes",
                unit: "bytes",
                signed: false,
            },
            |s| s.inuse_bytes,
        ));
        metrics.push((
            Metric {
                key: "inuse_objects",
                label: "live allocations",
                unit: "count",
                signed: false,
            },
            |s| s.inuse_objects,
        ));
    }
    if profile.stacks.iter().any(|s| s.peak_bytes.is_some()) {
        metrics.push((
            Metric {
                key: "peak_bytes",
                label: "live bytes at the peak",
                unit: "bytes",
                signed: false,
            },
            |s| s.peak_bytes,
        ));
        metrics.push((
            Metric {
                key: "peak_objects",
                label: "live allocations at the peak",
                unit: "count",
                signed: false,
            },
            |s| s.peak_objects,
        ));
    }
    if profile.stacks.iter().any(|s| s.growth.is_some()) {
        metrics.push((
            Metric {
                key: "growth",
                label: "growth of live bytes",
                unit: "bytes/s",
                signed: true,
            },
            |s| s.growth.map(|g| g.bytes_per_second),
        ));
    }
    metrics
}

/// Interns frame names.
#[derive(Default)]
pub(super) struct Names {
    pub names: Vec<String>,
    index: HashMap<String, u32>,
}

impl Names {
    pub(super) fn of(&mut self, name: String) -> u32 {
        if let Some(&i) = self.index.get(&name) {
            return i;
        }
        self.names.push(name.clone());
        let i = self.names.len() as u32 - 1;
        self.index.insert(name, i);
        i
    }
}

/// The index of the site of `frames` (leaf first) in their path (root first, the process
/// at 0: frame `k` at `len - k`).
pub(super) fn site_in_path(frames: &[FrameInfo]) -> usize {
    frames.len()
        - crate::stacks::site::sites()
            .site_of(frames)
            .min(frames.len())
}

/// A stack's path, root first: its process's root (see [`roots`]), then its frames from
/// the outermost.
fn path(names: &mut Names, roots: &HashMap<u32, String>, stack: &StackProfile) -> Vec<u32> {
    let unknown = || format!("? ({})", stack.pid);
    let root = roots.get(&stack.pid).cloned().unwrap_or_else(unknown);
    path_of_frames(names, &root, &stack.frames)
}

/// Each process's root in the flame graph and the stacks table: `command (pid)`; where the
/// profile groups its processes by command (as the summary does, above 8 processes),
/// `command ×N` for a command N > 1 processes ran, so that a build's 300 `cc1`s are one
/// tower whose same frames merge, not 300 roots a pixel wide.
fn roots(profile: &Profile) -> HashMap<u32, String> {
    let groups: HashMap<&str, u64> = profile
        .commands
        .iter()
        .map(|g| (g.command.as_str(), g.processes))
        .collect();
    profile
        .processes
        .iter()
        .map(|p| {
            let root = match groups.get(p.command.as_str()) {
                Some(&n) if n > 1 => format!("{} ×{n}", p.command),
                _ => format!("{} ({})", p.command, p.pid),
            };
            (p.pid, root)
        })
        .collect()
}

/// `root`, then `frames` (leaf first) from the outermost.
pub(super) fn path_of_frames(names: &mut Names, root: &str, frames: &[FrameInfo]) -> Vec<u32> {
    let mut path = vec![names.of(sanitize(root))];
    path.extend(frames.iter().rev().map(|f| names.of(frame_name(f))));
    path
}

/// The triple the page reads: estimate and its standard errors.
fn triple(estimate: &Estimate, confidence: f64) -> Vec<f64> {
    let spread = Spread::of(estimate, confidence);
    vec![spread.estimate, spread.below, spread.above]
}

/// The page's data for `profile`, opening on `value`.
pub(crate) fn profile_data(profile: &Profile, value: Value) -> Data {
    let confidence = profile.sampling.confidence;
    let roots = roots(profile);
    let metrics = metrics(profile);
    let mut names = Names::default();
    let stacks = profile
        .stacks
        .iter()
        .map(|stack| StackData {
            f: path(&mut names, &roots, stack),
            site: site_in_path(&stack.frames),
            s: stack.samples,
            v: metrics
                .iter()
                .map(|(_, of)| of(stack).map(|e| triple(&e, confidence)))
                .collect(),
            life: stack.lifetimes.as_ref().map(|l| {
                let mut out = Vec::new();
                for share in [
                    &l.freed_within_1ms,
                    &l.freed_within_1s,
                    &l.freed_later,
                    &l.still_in_use,
                ] {
                    out.extend([share.estimate, share.lower, share.upper].map(Some));
                }
                out.extend([l.p50_seconds, l.p90_seconds]);
                out
            }),
            sizes: stack
                .sizes
                .iter()
                .map(|c| {
                    let e = c.alloc_bytes;
                    [
                        c.from_bytes as f64,
                        c.to_bytes as f64,
                        e.estimate,
                        e.lower,
                        e.upper,
                    ]
                })
                .collect(),
            threads: stack
                .threads
                .iter()
                .map(|t| {
                    let name = match (t.name.is_empty(), t.tid) {
                        (false, Some(tid)) => format!("{} ({tid})", text::printable(&t.name)),
                        (_, Some(tid)) => format!("tid {tid}"),
                        (_, None) => "other threads".to_owned(),
                    };
                    (name, t.alloc_bytes.estimate)
                })
                .collect(),
        })
        .collect();
    let first = metrics
        .iter()
        .position(|(m, _)| m.key == value_key(value))
        .unwrap_or(0);
    let (at_seconds, series) = series(profile);
    Data {
        kind: "profile",
        title: title(profile),
        preamble: crate::summary::preamble(profile, false),
        confidence,
        z: difference::z(confidence),
        metrics: metrics.into_iter().map(|(m, _)| m).collect(),
        first,
        frames: names.names,
        stacks,
        series,
        at_seconds,
        sizes: sizes(profile),
    }
}

fn value_key(value: Value) -> &'static str {
    match value {
        Value::AllocBytes => "alloc_bytes",
        Value::AllocObjects => "alloc_objects",
        Value::InuseBytes => "inuse_bytes",
        Value::InuseObjects => "inuse_objects",
        Value::PeakBytes => "peak_bytes",
        Value::PeakObjects => "peak_objects",
    }
}

/// "allocscope: sqlite3 (1234), …", or by command where the profile groups its processes:
/// "allocscope: cc1 ×33, as ×33, …".
pub(super) fn title(profile: &Profile) -> String {
    // What the title lists (at most 8), and how many there are.
    let (targets, listed): (Vec<String>, usize) = if profile.commands.is_empty() {
        let label = |p: &ProcessProfile| format!("{} ({})", text::printable(&p.command), p.pid);
        let processes = &profile.processes;
        (
            processes.iter().take(8).map(label).collect(),
            processes.len(),
        )
    } else {
        let label = |g: &CommandGroup| format!("{} ×{}", text::printable(&g.command), g.processes);
        let commands = &profile.commands;
        (commands.iter().take(8).map(label).collect(), commands.len())
    };
    let more = listed.saturating_sub(targets.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!("allocscope: {}{more}", targets.join(", "))
}

/// The charts' series: each process's total (those with a timeline), then up to five
/// stacks with the most bytes allocated among those with one; all on the same points.
fn series(profile: &Profile) -> (Vec<f64>, Vec<Series>) {
    let mut found: Vec<(String, &SeriesValues)> = profile
        .processes
        .iter()
        .filter_map(|p| {
            let name = format!("{} ({}) total", text::printable(&p.command), p.pid);
            p.timeline.as_ref().map(|t| (name, t))
        })
        .collect();
    let mut stacks: Vec<&StackProfile> = profile
        .stacks
        .iter()
        .filter(|s| s.timeline.is_some())
        .collect();
    stacks.sort_by(|a, b| b.alloc_bytes.estimate.total_cmp(&a.alloc_bytes.estimate));
    for stack in stacks.into_iter().take(5) {
        let site = crate::stacks::site::sites().site_of(&stack.frames);
        let name = stack
            .frames
            .get(site)
            .map_or_else(|| "?".into(), frame_name);
        if let Some(timeline) = &stack.timeline {
            found.push((format!("{name} (pid {})", stack.pid), timeline));
        }
    }
    let Some(at) = found.first().map(|(_, t)| t.at_seconds.clone()) else {
        return (Vec::new(), Vec::new());
    };
    let series = found
        .into_iter()
        .filter(|(_, t)| t.at_seconds.len() == at.len())
        .map(|(name, t)| Series {
            name,
            inuse: [
                t.inuse_bytes.clone(),
                t.inuse_lower.clone(),
                t.inuse_upper.clone(),
            ],
            alloc: [
                t.alloc_bytes_per_second.clone(),
                t.alloc_lower.clone(),
                t.alloc_upper.clone(),
            ],
        })
        .collect();
    (at, series)
}

/// Bytes allocated per size class over every stack, bounds in quadrature.
fn sizes(profile: &Profile) -> Vec<SizeBar> {
    let confidence = profile.sampling.confidence;
    let mut classes: std::collections::BTreeMap<(u64, u64), Spread> = Default::default();
    for stack in &profile.stacks {
        for class in &stack.sizes {
            classes
                .entry((class.from_bytes, class.to_bytes))
                .or_default()
                .add(&Spread::of(&class.alloc_bytes, confidence));
        }
    }
    classes
        .into_iter()
        .map(|((from, to), spread)| {
            let (lower, upper) = spread.bounds(confidence);
            SizeBar {
                from,
                to,
                bytes: spread.estimate,
                lower,
                upper,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commands_processes_share_one_root_where_the_profile_groups_them() {
        use crate::schema::ExactCounts;
        let mut profile = allocscope_model::fixtures::synthetic();
        let mut other = profile.processes[0].clone();
        other.pid = 43;
        profile.processes.push(other);
        let copies = profile.stacks.to_vec();
        profile
            .stacks
            .extend(copies.into_iter().map(|s| StackProfile { pid: 43, ..s }));
        let command = profile.processes[0].command.clone();
        let root_of =
            |data: &Data, stack: usize| data.frames[data.stacks[stack].f[0] as usize].clone();
        // Stack `copy` is pid 43's copy of pid 42's first stack.
        let copy = profile.stacks.len() / 2;

        let apart = profile_data(&profile, Value::AllocBytes);
        assert_eq!(root_of(&apart, 0), format!("{command} (42)"));
        assert_eq!(root_of(&apart, copy), format!("{command} (43)"));

        profile.commands = vec![CommandGroup {
            command: command.clone(),
            processes: 2,
            samples: 0,
            exact: ExactCounts { calls: 0, bytes: 0 },
            alloc_bytes: profile.processes[0].alloc_bytes,
            inuse_bytes: None,
            largest: vec![42, 43],
        }];
        let grouped = profile_data(&profile, Value::AllocBytes);
        assert_eq!(grouped.title, format!("allocscope: {command} ×2"));
        assert_eq!(root_of(&grouped, 0), format!("{command} ×2"));
        // One path: the flame graph merges the two processes' same frames.
        assert_eq!(grouped.stacks[0].f, grouped.stacks[copy].f);
    }

    #[test]
    fn a_node_of_one_stack_shows_its_bounds_and_a_sum_adds_in_quadrature() {
        let confidence = 0.95;
        let z = difference::z(confidence);
        let one = Estimate {
            samples: 12,
            estimate: 1000.0,
            lower: 600.0,
            upper: 1700.0,
        };
        let t = triple(&one, confidence);
        let (e, l, u) = node_bounds(&[[t[0], t[1], t[2]]], z, false);
        assert!((e - 1000.0).abs() < 1e-9);
        assert!(
            (l - 600.0).abs() < 1e-6 && (u - 1700.0).abs() < 1e-6,
            "{l} {u}"
        );
        // Two stacks: what Spread::add gives.
        let two = Estimate {
            samples: 3,
            estimate: 500.0,
            lower: 100.0,
            upper: 1500.0,
        };
        let s = triple(&two, confidence);
        let (e, l, u) = node_bounds(&[[t[0], t[1], t[2]], [s[0], s[1], s[2]]], z, false);
        let mut spread = Spread::of(&one, confidence);
        spread.add(&Spread::of(&two, confidence));
        let (sl, su) = spread.bounds(confidence);
        assert!((e - 1500.0).abs() < 1e-9);
        assert!((l - sl).abs() < 1e-6 && (u - su).abs() < 1e-6);
        // Narrower, relative to the estimate, than the less certain of the two alone.
        assert!((u - l) / e < (1500.0 - 100.0) / 500.0);
        // A growth rate's lower bound may be negative.
        let shrinking = [-50.0, 30.0, 30.0];
        assert!(node_bounds(&[shrinking], z, true).1 < -50.0);
        assert_eq!(node_bounds(&[shrinking], z, false).1, 0.0);
    }

    #[test]
    fn stacks_are_root_first_under_their_process_with_one_value_per_metric() {
        let profile = allocscope_model::fixtures::synthetic();
        let data = profile_data(&profile, Value::AllocObjects);
        assert_eq!(data.kind, "profile");
        let keys: Vec<&str> = data.metrics.iter().map(|m| m.key).collect();
        assert_eq!(keys, ["alloc_bytes", "alloc_objects"], "alloc-only");
        assert_eq!(data.first, 1);
        let names: Vec<&str> = data.stacks[0]
            .f
            .iter()
            .map(|&i| data.frames[i as usize].as_str())
            .collect();
        assert_eq!(names, ["app (42)", "main", "leaf", "inlined_leaf"]);
        assert_eq!(data.stacks[0].v.len(), 2);
        assert_eq!(data.stacks[0].v[0].as_ref().unwrap()[0], 20000.0);
        assert!(data.preamble.contains("mean sampling interval"));
    }
}
