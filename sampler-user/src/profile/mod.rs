//! ⑤ The profile: samples aggregated per stack, then resolved into the one model every
//! exporter and the summary read.
//!
//! [`Recorder`] takes samples as they arrive (normalize + intern + add to running sums:
//! O(1) per sample, nothing resolved); [`Recorder::finish`] symbolizes each distinct frame
//! once and computes the estimates into a [`Profile`].

use std::collections::{BTreeMap, HashMap};

use sampler_common::ProcessCounters;
use serde::{Deserialize, Serialize};

use crate::{
    collect::{Losses, Sample},
    stacks::{self, symbolize::FrameInfo, symbolize::Symbolizer, Frame, StackTable},
    stats::{
        estimate::{Posterior, Window},
        Estimate, SampleObs, SampleSet,
    },
};

/// Schema tag of the JSON export.
pub const SCHEMA: &str = "allocscope/v1";

/// Aggregates samples as they arrive.
#[derive(Debug, Default)]
pub struct Recorder {
    stacks: StackTable,
    /// Samples per stack since the start.
    per_stack: Vec<SampleSet>,
    /// Samples per stack since the last snapshot (`--every`).
    per_stack_period: Vec<SampleSet>,
    commands: BTreeMap<u32, String>,
    executables: BTreeMap<u32, String>,
}

impl Recorder {
    /// Starts tracking `pid`: remembers its command name and maps while it surely lives.
    pub fn track(&mut self, pid: u32) {
        let command = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim_end().to_owned())
            .unwrap_or_default();
        self.commands.insert(pid, command);
        if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
            self.executables.insert(pid, exe.display().to_string());
        }
        self.stacks.snapshot(pid);
    }

    /// Re-reads the maps of targets still alive (late-loaded libraries).
    pub fn refresh_maps(&mut self) {
        self.stacks.refresh_live();
    }

    /// Notes that `pid` exited: its frames resolve with the maps it last had.
    pub fn mark_exited(&mut self, pid: u32) {
        self.stacks.mark_gone(pid);
    }

    /// Adds one sample.
    pub fn add(&mut self, sample: &Sample) {
        let chain = stacks::caller_chain(sample.return_address, &sample.stack);
        let id = self.stacks.intern(sample.pid, &chain) as usize;
        if id >= self.per_stack.len() {
            self.per_stack.resize(id + 1, SampleSet::default());
            self.per_stack_period.resize(id + 1, SampleSet::default());
        }
        let obs = SampleObs {
            size: sample.size,
            offset: sample.offset,
            interval: sample.interval,
        };
        self.per_stack[id].add(obs);
        self.per_stack_period[id].add(obs);
    }

    /// Starts a new period: the next snapshot's period values count from here.
    pub fn start_period(&mut self) {
        self.per_stack_period.fill(SampleSet::default());
    }

    /// Resolves names and computes every estimate, since the start and, when `period_seconds`
    /// is given, over the current period. Symbolization is cached, so repeated snapshots
    /// only resolve new frames.
    pub async fn profile(
        &self,
        symbolizer: &Symbolizer,
        settings: Settings,
        counters: &BTreeMap<u32, ProcessCounters>,
        losses: Losses,
        period_seconds: Option<f64>,
    ) -> Profile {
        let resolved = self.resolve_frames(symbolizer).await;
        let window = Window::RECORDING;
        let estimate =
            |set: &SampleSet| set.estimate(settings.confidence, window, settings.interval);
        let mut per_pid: BTreeMap<u32, SampleSet> = self
            .commands
            .keys()
            .map(|&pid| (pid, SampleSet::default()))
            .collect();
        let mut stacks = Vec::with_capacity(self.per_stack.len());
        for (id, set) in self.per_stack.iter().enumerate() {
            let (pid, frames) = self.stacks.stack(id as stacks::StackId);
            per_pid.entry(pid).or_default().merge(set);
            let alloc = estimate(set);
            let period = period_seconds.map(|seconds| {
                let e = self.per_stack_period[id].estimate(
                    settings.confidence,
                    Window::SLIDING,
                    settings.interval,
                );
                PeriodValues {
                    seconds,
                    alloc_bytes: e.bytes,
                    alloc_objects: e.objects,
                }
            });
            stacks.push(StackProfile {
                pid,
                frames: frames
                    .iter()
                    .flat_map(|frame| resolved[frame].iter().cloned())
                    .collect(),
                samples: set.samples(),
                alloc_bytes: alloc.bytes,
                alloc_objects: alloc.objects,
                alloc_bytes_by_trials: alloc.bytes_by_trials,
                alloc_posterior: set.posterior(settings.interval),
                inuse_bytes: None,
                inuse_objects: None,
                period,
            });
        }
        stacks.sort_by(|a, b| b.alloc_bytes.estimate.total_cmp(&a.alloc_bytes.estimate));
        let processes = per_pid
            .iter()
            .map(|(&pid, set)| {
                let alloc = estimate(set);
                let exact = counters.get(&pid).copied().unwrap_or_default();
                ProcessProfile {
                    pid,
                    command: self.commands.get(&pid).cloned().unwrap_or_default(),
                    executable: self.executables.get(&pid).cloned().unwrap_or_default(),
                    exact: ExactCounts {
                        calls: exact.calls,
                        bytes: exact.bytes,
                    },
                    samples: set.samples(),
                    alloc_bytes: alloc.bytes,
                    alloc_objects: alloc.objects,
                }
            })
            .collect();
        let executables: Vec<&str> = self.executables.values().map(String::as_str).collect();
        let modules = modules_of(&stacks, &executables);
        Profile {
            schema: SCHEMA.to_owned(),
            sampling: settings.sampling(),
            duration_seconds: settings.duration_seconds,
            alloc_only: settings.alloc_only,
            processes,
            losses,
            modules,
            stacks,
        }
    }

    async fn resolve_frames(&self, symbolizer: &Symbolizer) -> HashMap<Frame, Vec<FrameInfo>> {
        let mut distinct: Vec<Frame> = self
            .stacks
            .iter()
            .flat_map(|(_, _, frames)| frames.iter().copied())
            .collect();
        distinct.sort_unstable();
        distinct.dedup();
        let files: Vec<(std::path::PathBuf, u64)> = distinct
            .iter()
            .filter_map(|frame| match *frame {
                Frame::File { module, offset } => {
                    Some((self.stacks.modules().path(module).to_owned(), offset))
                }
                Frame::Unknown { .. } => None,
            })
            .collect();
        let mut names = symbolizer.resolve(files).await.into_iter();
        distinct
            .into_iter()
            .map(|frame| {
                let infos = match frame {
                    Frame::File { .. } => names.next().unwrap_or_default(),
                    Frame::Unknown { address } => vec![FrameInfo {
                        address,
                        ..FrameInfo::default()
                    }],
                };
                (frame, infos)
            })
            .collect()
    }
}

/// The distinct modules of `stacks`, with build ids read from the files; the targets'
/// executables first (pprof takes the first mapping for the main binary).
fn modules_of(stacks: &[StackProfile], executables: &[&str]) -> Vec<Module> {
    let mut paths: Vec<&str> = stacks
        .iter()
        .flat_map(|stack| stack.frames.iter().filter_map(|f| f.module.as_deref()))
        .collect();
    paths.sort_unstable_by_key(|path| (!executables.contains(path), *path));
    paths.dedup();
    paths
        .into_iter()
        .map(|path| Module {
            path: path.to_owned(),
            build_id: build_id(std::path::Path::new(path)),
        })
        .collect()
}

/// The GNU build id of an ELF file, in hex.
pub fn build_id(path: &std::path::Path) -> Option<String> {
    use object::Object as _;
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let id = file.build_id().ok()??;
    Some(id.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// What the recording was asked to do (carried into every export).
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Mean sampling interval in bytes.
    pub interval: u64,
    /// Confidence of every interval.
    pub confidence: f64,
    /// Seconds recorded.
    pub duration_seconds: f64,
    /// Frees were not tracked.
    pub alloc_only: bool,
}

impl Settings {
    fn sampling(&self) -> Sampling {
        Sampling {
            mean_interval_bytes: self.interval,
            confidence: self.confidence,
            model: "each allocated byte is sampled with probability 1/mean_interval_bytes \
                    (per-thread geometric countdown); estimates are Horvitz-Thompson, bounds \
                    negative-binomial"
                .to_owned(),
        }
    }
}

/// Sampling parameters, as exported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Mean sampling interval in bytes (1/p).
    pub mean_interval_bytes: u64,
    /// Confidence level of every `lower`/`upper` pair.
    pub confidence: f64,
    /// One-line statement of the model.
    pub model: String,
}

/// Exact counts from the kernel's counters (every call, not sampled).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExactCounts {
    /// Allocation calls.
    pub calls: u64,
    /// Bytes requested.
    pub bytes: u64,
}

/// One process's totals.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessProfile {
    /// Process id.
    pub pid: u32,
    /// Command name (`/proc/PID/comm`).
    pub command: String,
    /// Path of the executable (`/proc/PID/exe`).
    pub executable: String,
    /// Exact counters.
    pub exact: ExactCounts,
    /// Samples received.
    pub samples: u64,
    /// Estimated allocated bytes (check against `exact.bytes`).
    pub alloc_bytes: Estimate,
    /// Estimated allocated objects (check against `exact.calls`).
    pub alloc_objects: Estimate,
}

/// One call stack's estimates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StackProfile {
    /// Process id.
    pub pid: u32,
    /// Frames, leaf (the allocator's caller) first.
    pub frames: Vec<FrameInfo>,
    /// Samples behind the estimates.
    pub samples: u64,
    /// Bytes allocated from this stack.
    pub alloc_bytes: Estimate,
    /// Objects allocated from this stack.
    pub alloc_objects: Estimate,
    /// The alternative (trials) estimate of `alloc_bytes`: `Σ q_i/p_i + Σ u_i`.
    pub alloc_bytes_by_trials: f64,
    /// jemalloc #1751 posterior parameters of `alloc_bytes`, for your own inference.
    pub alloc_posterior: Posterior,
    /// Bytes allocated here and still live at the end (`None`: frees not tracked).
    pub inuse_bytes: Option<Estimate>,
    /// Objects allocated here and still live at the end (`None`: frees not tracked).
    pub inuse_objects: Option<Estimate>,
    /// Values over the snapshot's period (`--every` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<PeriodValues>,
}

/// A stack's values over one snapshot period.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeriodValues {
    /// Length of the period.
    pub seconds: f64,
    /// Bytes allocated in the period.
    pub alloc_bytes: Estimate,
    /// Objects allocated in the period.
    pub alloc_objects: Estimate,
}

/// A mapped file that frames point into.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Module {
    /// Path as the process mapped it (the `module` of frames).
    pub path: String,
    /// GNU build id in hex, when the file has one.
    pub build_id: Option<String>,
}

/// A finished recording: the model all exporters and the summary read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// [`SCHEMA`].
    pub schema: String,
    /// Sampling parameters.
    pub sampling: Sampling,
    /// Seconds recorded.
    pub duration_seconds: f64,
    /// Whether frees were left untracked (then `inuse_*` are null).
    pub alloc_only: bool,
    /// Per process totals.
    pub processes: Vec<ProcessProfile>,
    /// Events the kernel side could not deliver or count.
    pub losses: Losses,
    /// Every module (executable or library) a frame points into, with its build id.
    pub modules: Vec<Module>,
    /// Per stack estimates, largest estimated bytes first.
    pub stacks: Vec<StackProfile>,
}
