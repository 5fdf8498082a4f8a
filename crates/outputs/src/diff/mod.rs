//! `allocscope diff BASE NEW`: what changed between two saved recordings, and only what is
//! larger than the sampling noise. Pure: profiles in, comparisons out ([`render`] writes
//! them); the statistics are [`crate::stats::difference`].
//!
//! Stacks are matched by what they mean, not where they were: each frame's function from
//! leaf to root; pids, load addresses, the directories of paths and the command's name
//! differ between runs and are left out (the same program under another file name showed
//! every stack as new or −100% when its name was part of the key); `--by-command` keeps
//! the command in the key, to compare each program's stacks apart. A frame without a name is matched by its
//! module's file name and its offset in that file: stable across runs of one build (ASLR
//! moves addresses, not file offsets); a rebuilt unsymbolized library's stacks show as
//! gone and new.
//! Stacks of one recording that coincide under this key are summed. Functions are
//! compared too: the sum of the stacks whose leaf (allocating) frame is that function.
//!
//! Allocations are compared per run when both recordings are whole runs of a command
//! (each from its start: a run on a busy CI machine takes longer and allocates the same,
//! so its bytes per second fall and a gate on rates failed for nothing), per second when
//! either is a window (processes attached, host-wide, an agent's period, or a command cut
//! short), whose lengths are the recorder's ([`Basis`]); in-use bytes as they were at each recording's end, when both
//! tracked frees.

pub mod render;

use std::collections::BTreeMap;

use crate::{
    schema::{CoverageStart, Profile, StackProfile},
    stacks::symbolize::FrameInfo,
    stats::{
        difference::{change, Change, Spread},
        estimate::Window,
        Estimate, SampleSet,
    },
};

/// A stack's identity across recordings: the command ([`ANY_COMMAND`] unless matched by
/// command), then frames leaf first.
pub(crate) type Key = Vec<String>;

/// The first word of a [`Key`] when stacks are matched whatever their command.
pub(crate) const ANY_COMMAND: &str = "*";

/// What allocations are compared as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Bytes allocated in each recording: both are whole runs of a command.
    PerRun,
    /// Bytes allocated per second of each recording: a window of running processes.
    PerSecond,
}

/// What a recording covers: a whole run of a command, or a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Span {
    /// A command allocscope started, and its descendants, each from its start, until it
    /// ended on its own.
    WholeRun,
    /// Processes attached while running, a process not covered from its start, or a
    /// command cut by `--duration` or a signal (or a profile that does not say).
    Window,
    /// An agent's period: a window, whatever its processes.
    Period,
}

impl Span {
    /// What `profile` covers: a whole run when its command ran to its end and it (from
    /// its start) and every other process (from its fork or exec) were seen whole.
    pub(crate) fn of(profile: &Profile) -> Span {
        if profile.period {
            return Span::Period;
        }
        if !profile.whole_run {
            return Span::Window;
        }
        let started = profile.processes.iter().any(|p| {
            p.coverage
                .as_ref()
                .is_some_and(|c| c.since == CoverageStart::Start)
        });
        if started && profile.all_seen_from_their_start() {
            Span::WholeRun
        } else {
            Span::Window
        }
    }

    /// How a reader is told.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Span::WholeRun => "a whole run of a command",
            Span::Window => "a window of processes attached, or of a command cut short",
            Span::Period => "an agent's period",
        }
    }
}

impl Basis {
    /// Per run when both recordings are whole runs of a command, else per second;
    /// `chosen` (`--per-run`, `--per-second`) overrides.
    pub(crate) fn of(base: Span, new: Span, chosen: Option<Basis>) -> Basis {
        chosen.unwrap_or(if base == Span::WholeRun && new == Span::WholeRun {
            Basis::PerRun
        } else {
            Basis::PerSecond
        })
    }

    /// What a value is, after a number of bytes: "" or "/s".
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Basis::PerRun => "",
            Basis::PerSecond => "/s",
        }
    }

    /// "bytes allocated per run" and the like.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Basis::PerRun => "bytes allocated per run",
            Basis::PerSecond => "bytes allocated per second",
        }
    }
}

/// One stack's (or function's) values in both recordings, and their changes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Compared {
    /// The command ([`ANY_COMMAND`] unless matched by command), then the frames, leaf
    /// first (a function: that and the leaf).
    pub key: Key,
    /// The commands the stack ran in, the new recording's first (what a reader is shown).
    #[serde(default)]
    pub commands: Vec<String>,
    /// The frames as the new recording resolved them (the base's, for a stack only it
    /// has).
    pub frames: Vec<FrameInfo>,
    /// Bytes allocated in the base recording and in the new one, per run or per second
    /// ([`Diff::basis`]).
    pub base_alloc: f64,
    /// See `base_alloc`.
    pub new_alloc: f64,
    /// The change in bytes allocated (per run or per second).
    pub alloc_change: Change,
    /// In-use bytes at each recording's end (both tracked frees).
    pub base_inuse: Option<f64>,
    /// See `base_inuse`.
    pub new_inuse: Option<f64>,
    /// The change in in-use bytes.
    pub inuse_change: Option<Change>,
}

impl Compared {
    /// The change in allocations relative to the base, in percent (infinite: new).
    pub(crate) fn alloc_percent(&self) -> f64 {
        percent(self.alloc_change.estimate, self.base_alloc)
    }

    /// The change in in-use bytes relative to the base, in percent.
    pub(crate) fn inuse_percent(&self) -> Option<f64> {
        Some(percent(self.inuse_change?.estimate, self.base_inuse?))
    }

    /// Whether either change is significant.
    pub(crate) fn significant(&self) -> bool {
        self.alloc_change.significant || self.inuse_change.is_some_and(|c| c.significant)
    }

    /// The largest significant growth in percent (`None`: none grew significantly).
    pub(crate) fn significant_growth_percent(&self) -> Option<f64> {
        let alloc = (self.alloc_change.significant && self.alloc_change.estimate > 0.0)
            .then(|| self.alloc_percent());
        let inuse = self
            .inuse_change
            .filter(|c| c.significant && c.estimate > 0.0)
            .and_then(|_| self.inuse_percent());
        alloc.into_iter().chain(inuse).reduce(f64::max)
    }
}

fn percent(change: f64, base: f64) -> f64 {
    if base > 0.0 {
        100.0 * change / base
    } else if change > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

/// What `diff` found.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Diff {
    /// Schema tag, [`SCHEMA`].
    pub schema: String,
    /// The simultaneous confidence of every bound.
    pub confidence: f64,
    /// Comparisons the bounds are simultaneous over (Bonferroni).
    pub comparisons: usize,
    /// Whether allocations are compared per run or per second.
    pub basis: Basis,
    /// Whether `basis` was asked for (`--per-run`, `--per-second`) rather than chosen from
    /// what the recordings cover.
    pub basis_asked: bool,
    /// What the base recording covers.
    pub base_covers: Span,
    /// What the new recording covers.
    pub new_covers: Span,
    /// Seconds each recording lasted.
    pub base_seconds: f64,
    /// See `base_seconds`.
    pub new_seconds: f64,
    /// Per stack, largest significant growth first.
    pub stacks: Vec<Compared>,
    /// Per allocating function, likewise.
    pub functions: Vec<Compared>,
}

/// Schema tag of `diff`'s JSON.
pub(crate) const SCHEMA: &str = "allocscope/diff-v2";

/// Values of one side, summed per key.
#[derive(Clone, Debug, Default)]
struct Side {
    alloc: Spread,
    inuse: Option<Spread>,
    frames: Vec<FrameInfo>,
    commands: Vec<String>,
}

/// A frame as matched across recordings.
fn frame_key(frame: &crate::stacks::symbolize::FrameInfo) -> String {
    match (&frame.function, &frame.module) {
        (Some(function), _) => function.to_string(),
        (None, Some(module)) => format!(
            "{}+{:#x}",
            module.rsplit('/').next().unwrap_or(module),
            frame.address
        ),
        (None, None) => "[unknown]".to_owned(),
    }
}

/// Every stack of `profile` by key, and every leaf function's sum; `by_command`: the
/// command is part of the key.
fn sides(profile: &Profile, by_command: bool) -> (BTreeMap<Key, Side>, BTreeMap<Key, Side>) {
    let confidence = profile.sampling.confidence;
    let commands = profile.process_labels();
    let (mut stacks, mut functions): (BTreeMap<Key, Side>, BTreeMap<Key, Side>) =
        Default::default();
    for stack in &profile.stacks {
        let command = commands.get(&stack.pid).map_or("?", |(c, _)| *c).to_owned();
        let scope = if by_command {
            command.clone()
        } else {
            ANY_COMMAND.to_owned()
        };
        let mut key = vec![scope.clone()];
        key.extend(stack.frames.iter().map(frame_key));
        let leaf = vec![scope, key.get(1).cloned().unwrap_or_default()];
        let side = side_of(stack, confidence);
        for (map, key, frames) in [
            (&mut stacks, key, &stack.frames[..]),
            (
                &mut functions,
                leaf,
                &stack.frames[..stack.frames.len().min(1)],
            ),
        ] {
            let entry = map.entry(key).or_default();
            if entry.frames.is_empty() {
                entry.frames = frames.to_vec();
            }
            if !entry.commands.contains(&command) {
                entry.commands.push(command.clone());
            }
            entry.alloc.add(&side.alloc);
            entry.inuse = match (entry.inuse, side.inuse) {
                (Some(mut sum), Some(more)) => {
                    sum.add(&more);
                    Some(sum)
                }
                (None, more) => more,
                (sum, None) => sum,
            };
        }
    }
    (stacks, functions)
}

fn side_of(stack: &StackProfile, confidence: f64) -> Side {
    Side {
        alloc: Spread::of(&stack.alloc_bytes, confidence),
        inuse: stack.inuse_bytes.map(|e| Spread::of(&e, confidence)),
        frames: Vec::new(),
        commands: Vec::new(),
    }
}

/// What a recording says of a stack it has no sample of: zero, and at most what an empty
/// sample set's bound allows at its largest interval.
fn absent(profile: &Profile) -> Spread {
    let interval = profile
        .sampling
        .throttle
        .as_ref()
        .map_or(profile.sampling.mean_interval_bytes, |t| {
            t.largest_interval_bytes
        });
    let bound: Estimate = SampleSet::default()
        .estimate(profile.sampling.confidence, Window::RECORDING, interval)
        .bytes;
    Spread::of(&bound, profile.sampling.confidence)
}

/// Compares `new` with `base` at `confidence` (simultaneous over every comparison made),
/// allocations per run or per second as the recordings' spans say unless `asked`;
/// `by_command`: a stack is matched within its command only.
pub fn diff(
    base: &Profile,
    new: &Profile,
    confidence: f64,
    by_command: bool,
    asked: Option<Basis>,
) -> Diff {
    let (base_covers, new_covers) = (Span::of(base), Span::of(new));
    let basis = Basis::of(base_covers, new_covers, asked);
    let (base_stacks, base_functions) = sides(base, by_command);
    let (new_stacks, new_functions) = sides(new, by_command);
    let tracked = !base.alloc_only && !new.alloc_only;
    let keys = |a: &BTreeMap<Key, Side>, b: &BTreeMap<Key, Side>| {
        let mut keys: Vec<Key> = a.keys().chain(b.keys()).cloned().collect();
        keys.sort();
        keys.dedup();
        keys
    };
    let stack_keys = keys(&base_stacks, &new_stacks);
    let function_keys = keys(&base_functions, &new_functions);
    let per_key = if tracked { 2 } else { 1 };
    let comparisons = (stack_keys.len() + function_keys.len()) * per_key;
    let sides = Sides {
        base: (base, absent(base)),
        new: (new, absent(new)),
        tracked,
        confidence,
        comparisons,
        basis,
    };
    let mut stacks = sides.compare(&stack_keys, &base_stacks, &new_stacks);
    let mut functions = sides.compare(&function_keys, &base_functions, &new_functions);
    for list in [&mut stacks, &mut functions] {
        list.sort_by(|a, b| order(b).total_cmp(&order(a)));
    }
    Diff {
        schema: SCHEMA.to_owned(),
        confidence,
        comparisons,
        basis,
        basis_asked: asked.is_some(),
        base_covers,
        new_covers,
        base_seconds: base.duration_seconds,
        new_seconds: new.duration_seconds,
        stacks,
        functions,
    }
}

/// Significant growth first (largest change first), then significant shrinkage, then the
/// rest by apparent change.
fn order(c: &Compared) -> f64 {
    let change = c.alloc_change.estimate.abs() + c.inuse_change.map_or(0.0, |c| c.estimate.abs());
    let rank = if c.significant_growth_percent().is_some() {
        2.0
    } else if c.significant() {
        1.0
    } else {
        0.0
    };
    rank * 1e300 + change.min(1e299)
}

/// The two recordings, what each says of an absent stack, and how to bound.
struct Sides<'a> {
    base: (&'a Profile, Spread),
    new: (&'a Profile, Spread),
    tracked: bool,
    confidence: f64,
    comparisons: usize,
    basis: Basis,
}

impl Sides<'_> {
    fn compare(
        &self,
        keys: &[Key],
        base: &BTreeMap<Key, Side>,
        new: &BTreeMap<Key, Side>,
    ) -> Vec<Compared> {
        let per_second = |profile: &Profile| match self.basis {
            Basis::PerRun => 1.0,
            Basis::PerSecond => 1.0 / profile.duration_seconds.max(1e-9),
        };
        keys.iter()
            .map(|key| {
                let (b, n) = (base.get(key), new.get(key));
                let base_alloc = b
                    .map_or(self.base.1, |s| s.alloc)
                    .scaled(per_second(self.base.0));
                let new_alloc = n
                    .map_or(self.new.1, |s| s.alloc)
                    .scaled(per_second(self.new.0));
                let inuse = self.tracked.then(|| {
                    (
                        b.and_then(|s| s.inuse).unwrap_or(self.base.1),
                        n.and_then(|s| s.inuse).unwrap_or(self.new.1),
                    )
                });
                let mut commands: Vec<String> = n.map(|s| s.commands.clone()).unwrap_or_default();
                for command in b.map(|s| &s.commands[..]).unwrap_or_default() {
                    if !commands.contains(command) {
                        commands.push(command.clone());
                    }
                }
                Compared {
                    key: key.clone(),
                    commands,
                    frames: n.or(b).map(|s| s.frames.clone()).unwrap_or_default(),
                    base_alloc: base_alloc.estimate,
                    new_alloc: new_alloc.estimate,
                    alloc_change: change(
                        &base_alloc,
                        &new_alloc,
                        self.confidence,
                        self.comparisons,
                    ),
                    base_inuse: inuse.map(|(b, _)| b.estimate),
                    new_inuse: inuse.map(|(_, n)| n.estimate),
                    inuse_change: inuse
                        .map(|(b, n)| change(&b, &n, self.confidence, self.comparisons)),
                }
            })
            .collect()
    }
}

/// The stacks (or functions) whose significant growth exceeds `percent`.
pub fn grown_beyond(diff: &Diff, percent: f64) -> Vec<&Compared> {
    diff.stacks
        .iter()
        .chain(&diff.functions)
        .filter(|c| c.significant_growth_percent().is_some_and(|p| p > percent))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Estimate;
    use allocscope_model::fixtures::synthetic;

    fn exact(value: f64) -> Estimate {
        Estimate {
            samples: 1000,
            estimate: value,
            lower: value * 0.95,
            upper: value * 1.05,
        }
    }

    /// `synthetic()` as a whole run of its command.
    fn whole_run() -> Profile {
        let mut run = synthetic();
        run.whole_run = true;
        for process in &mut run.processes {
            process.coverage = Some(crate::schema::Coverage {
                since: CoverageStart::Start,
                ..Default::default()
            });
        }
        run
    }

    #[test]
    fn runs_are_compared_per_run_and_windows_per_second() {
        let run = whole_run();
        assert_eq!(Span::of(&run), Span::WholeRun);
        // The same run, twice as slow: per run nothing changed; per second, all halved.
        let mut slower = run.clone();
        slower.duration_seconds *= 2.0;
        let per_run = diff(&run, &slower, 0.95, false, None);
        assert_eq!(per_run.basis, Basis::PerRun);
        assert!(!per_run.basis_asked);
        for c in &per_run.stacks {
            assert_eq!(c.alloc_change.estimate, 0.0, "{c:?}");
            assert!(!c.alloc_change.significant);
            assert_eq!(c.base_alloc, c.new_alloc);
        }
        let per_second = diff(&run, &slower, 0.95, false, Some(Basis::PerSecond));
        assert!(per_second.basis_asked);
        for c in &per_second.stacks {
            assert!((c.new_alloc - c.base_alloc / 2.0).abs() <= 1e-9 * c.base_alloc);
            assert!(c.alloc_change.estimate < 0.0, "{c:?}");
        }
        // Not whole runs: cut short, a process attached, an agent's period, an old file.
        let mut cut = run.clone();
        cut.whole_run = false;
        let mut attached = run.clone();
        attached.processes[0].coverage.as_mut().unwrap().since = CoverageStart::Attach;
        let mut period = run.clone();
        period.period = true;
        let mut unknown = run.clone();
        unknown.processes[0].coverage = None;
        for (window, span) in [
            (&cut, Span::Window),
            (&attached, Span::Window),
            (&period, Span::Period),
            (&unknown, Span::Window),
        ] {
            assert_eq!(Span::of(window), span);
            let found = diff(&run, window, 0.95, false, None);
            assert_eq!(found.basis, Basis::PerSecond, "{span:?}");
            assert_eq!(
                (found.base_covers, found.new_covers),
                (Span::WholeRun, span)
            );
            assert_eq!(
                diff(&run, window, 0.95, false, Some(Basis::PerRun)).basis,
                Basis::PerRun
            );
        }
    }

    #[test]
    fn the_same_program_under_another_name_is_matched_unless_by_command() {
        let base = synthetic();
        let mut renamed = synthetic();
        renamed.processes[0].command = "app-v2".into();
        let matched = diff(&base, &renamed, 0.95, false, Some(Basis::PerSecond));
        assert_eq!(matched.stacks.len(), base.stacks.len(), "{matched:#?}");
        assert!(matched.stacks.iter().all(|c| !c.alloc_change.significant));
        assert_eq!(matched.stacks[0].commands, ["app-v2", "app"]);
        // Within each command: every stack is gone from one and new in the other.
        let apart = diff(&base, &renamed, 0.95, true, Some(Basis::PerSecond));
        assert_eq!(apart.stacks.len(), 2 * base.stacks.len(), "{apart:#?}");
        assert!(apart.stacks.iter().all(|c| c.commands.len() == 1));
    }

    #[test]
    fn stacks_match_by_names_and_changes_beyond_the_noise_are_flagged() {
        let base = synthetic();
        let mut new = synthetic();
        // Another run: another pid and other addresses, the same names.
        new.processes[0].pid = 77;
        for stack in &mut new.stacks {
            stack.pid = 77;
            for frame in &mut stack.frames {
                frame.address += 0x1000;
            }
        }
        // The first stack allocates three times as much, the second as before.
        let first = new.stacks[0].alloc_bytes.estimate * 3.0;
        new.stacks[0].alloc_bytes = exact(first);
        let base_second = base.stacks[1].alloc_bytes.estimate;
        new.stacks[1].alloc_bytes = exact(base_second);
        let diff = diff(&base, &new, 0.95, false, Some(Basis::PerSecond));
        assert_eq!(diff.stacks.len(), 2, "matched: {diff:#?}");
        assert!(diff.stacks[0].alloc_change.significant, "{diff:#?}");
        assert!(diff.stacks[0].alloc_change.estimate > 0.0);
        assert!(!diff.stacks[1].alloc_change.significant, "{diff:#?}");
        assert!(
            diff.stacks[0].inuse_change.is_none(),
            "alloc-only recordings"
        );
        assert_eq!(
            grown_beyond(&diff, 50.0).len(),
            2,
            "the stack and its function"
        );
        assert!(grown_beyond(&diff, 1000.0).is_empty());
        // A stack only in the new recording is new: infinitely many percent.
        let mut only_new = synthetic();
        only_new.stacks[0].frames[0].function = Some("brand_new".into());
        let diff = super::diff(&base, &only_new, 0.95, false, Some(Basis::PerSecond));
        assert_eq!(diff.stacks.len(), 3);
        let brand_new = diff
            .stacks
            .iter()
            .find(|c| c.key[1] == "brand_new")
            .unwrap();
        assert_eq!(brand_new.base_alloc, 0.0);
        assert_eq!(brand_new.alloc_percent(), f64::INFINITY);
    }
}
