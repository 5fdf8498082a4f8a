//! Validated configuration: every flag checked once, with an error a user can act on.

use std::{ffi::OsString, path::PathBuf, time::Duration};

pub use crate::units::{parse_duration, parse_size};

use sampler_common::geometric::MAX_INTERVAL;

// The validated settings the engine takes, under the names the command line has always used.
pub use allocscope_engine::settings::{
    BadInput, LoadIntoRunning, Pattern, PythonFrames, SamplingConfig, Targets, Unwind,
};

use crate::{
    cli::{RecordArgs, SamplingArgs, TargetArgs, UnwindArg},
    export::{Format, Value},
};

/// Where a recording goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// One file, written when recording stops.
    File(PathBuf),
    /// Snapshots into a directory every `every`, keeping at most `keep` files.
    Snapshots {
        /// The directory.
        dir: PathBuf,
        /// Period.
        every: Duration,
        /// Most files kept.
        keep: Option<usize>,
    },
}

impl From<crate::cli::PythonFramesArg> for PythonFrames {
    fn from(arg: crate::cli::PythonFramesArg) -> PythonFrames {
        use crate::cli::PythonFramesArg as Arg;
        match arg {
            Arg::Auto => PythonFrames::Auto,
            Arg::On => PythonFrames::Merged,
            Arg::All => PythonFrames::MergedAll,
            Arg::Off => PythonFrames::Off,
        }
    }
}

/// The mean sampling interval when `--interval` is not given.
pub const DEFAULT_INTERVAL: &str = "512KiB";

/// The throttle's target when neither `--max-samples-per-sec` nor `--interval` is given.
pub const DEFAULT_MAX_SAMPLES_PER_SEC: u32 = 5000;

/// The band's lower end when neither `--min-samples-per-sec` nor `--interval` is given:
/// 2,000 samples in 10 s, about 100 on a site with 5% of the bytes (bounds near ±20%).
pub const DEFAULT_MIN_SAMPLES_PER_SEC: u32 = 200;

/// Range of `--stack-bytes`: at least a page, at most the kernel's scratch payload.
const STACK_BYTES_RANGE: std::ops::RangeInclusive<u64> =
    sampler_common::STACK_PAGE as u64..=sampler_common::MAX_STACK_COPY as u64;

/// A validated `record` invocation.
#[derive(Clone, Debug)]
pub struct RecordConfig {
    /// What to profile.
    pub targets: Targets,
    /// How to sample.
    pub sampling: SamplingConfig,
    /// Recording length limit.
    pub duration: Option<Duration>,
    /// Age beyond which live sampled allocations are leak candidates.
    pub leaks_older_than: Option<Duration>,
    /// Where the profile goes.
    pub output: Output,
    /// Output format.
    pub format: Format,
    /// What folded and SVG output show (`None`: the profile's default).
    pub value: Option<Value>,
}

/// Checks that `--front-end` fits `targets`: it chooses how running processes are
/// counted; a command allocscope starts carries the sampler already (`--no-preload`:
/// uprobes).
pub fn front_end_fits(targets: &Targets, sampling: &SamplingConfig) -> Result<(), BadInput> {
    if sampling.load_into_running == LoadIntoRunning::Always && !targets.command.is_empty() {
        return Err(BadInput(
            "--front-end is for running processes (-p, --comm, --all): a command allocscope \
             starts is counted in-process already (--no-preload probes it with uprobes)"
                .into(),
        ));
    }
    Ok(())
}

impl TargetArgs {
    /// Validates the targets.
    pub fn into_targets(self) -> Result<Targets, BadInput> {
        let pids: Vec<u32> = self
            .pids
            .iter()
            .map(|p| parse_pid(p))
            .collect::<Result<_, _>>()?;
        let exclude_pids: Vec<u32> = self
            .exclude_pids
            .iter()
            .map(|p| parse_pid(p))
            .collect::<Result<_, _>>()?;
        let comm = self
            .comm
            .as_deref()
            .map(|c| Pattern::parse("--comm", c))
            .transpose()?;
        let exclude_comm = self
            .exclude_comm
            .as_deref()
            .map(|c| Pattern::parse("--exclude-comm", c))
            .transpose()?;
        let cgroup = self
            .cgroup
            .as_deref()
            .map(|c| Pattern::parse("--cgroup", c))
            .transpose()?;
        if cgroup.is_some() && !self.all && comm.is_none() {
            return Err(BadInput(
                "--cgroup selects among the processes of --all or --comm: add one".into(),
            ));
        }
        let selected = !pids.is_empty() || comm.is_some();
        let command = !self.command.is_empty();
        if command && (selected || self.all) {
            return Err(BadInput(
                "give either -p PID / --comm / --all or -- CMD, not both".into(),
            ));
        }
        if self.all && selected {
            return Err(BadInput(
                "--all already profiles every process: drop -p and --comm".into(),
            ));
        }
        if !(selected || command || self.all) {
            return Err(BadInput(
                "nothing to profile: give -p PID, --comm REGEX, --all or -- CMD ARGS".into(),
            ));
        }
        if let Some(&own) = pids.iter().find(|&&p| p == std::process::id()) {
            return Err(BadInput(format!(
                "pid {own} is allocscope itself: it never profiles itself"
            )));
        }
        if let Some(both) = pids.iter().find(|p| exclude_pids.contains(p)) {
            return Err(BadInput(format!(
                "pid {both} is both asked for (-p) and left out (--exclude-pid): give one"
            )));
        }
        if self.no_follow && !command {
            return Err(BadInput(
                "--no-follow is for -- CMD (whose children are followed by default)".into(),
            ));
        }
        Ok(Targets {
            pids,
            comm,
            all: self.all,
            children: !self.command.is_empty() && !self.no_follow,
            command: self.command,
            follow: self.follow,
            cgroup,
            exclude_comm,
            exclude_pids,
        })
    }
}

impl SamplingArgs {
    /// Validates the sampling parameters.
    pub fn into_config(self) -> Result<SamplingConfig, BadInput> {
        let text = self.interval.as_deref().unwrap_or(DEFAULT_INTERVAL);
        let interval = parse_size(text)
            .map_err(|why| BadInput(format!("invalid --interval {text:?}: {why}")))?;
        if interval == 0 || interval > MAX_INTERVAL {
            return Err(BadInput(format!(
                "invalid --interval {text:?}: must be between 1 byte and 4GiB"
            )));
        }
        let (min_samples_per_sec, max_samples_per_sec) = self.throttle_band();
        if !(self.confidence > 0.0 && self.confidence < 1.0) {
            return Err(BadInput(format!(
                "invalid --confidence {}: must be strictly between 0 and 1",
                self.confidence
            )));
        }
        // Each entry costs the kernel ~100 bytes.
        count_flag("--max-tracked", self.max_tracked, MAX_TRACKED_LIMIT)?;
        count_flag("--max-stacks", self.max_stacks, MAX_STACKS_LIMIT)?;
        if let Some(available) = crate::sys::host::memory_available() {
            stacks_fit("--max-stacks", self.max_stacks, available)?;
        }
        if let Some(dir) = self.debug_dirs.iter().find(|dir| !dir.is_dir()) {
            return Err(BadInput(format!(
                "invalid --debug-dir {}: not a directory",
                dir.display()
            )));
        }
        let unwind = self.unwind()?;
        let ring_buffer = self.ring_buffer(unwind, interval)?;
        let max_overhead = self.max_overhead()?;
        if max_overhead.is_some() && self.front_end == Some(crate::cli::FrontEndArg::InProcess) {
            return Err(BadInput(
                "--max-overhead duty-cycles uprobes: it cannot go with --front-end in-process \
                 (whose cost is a few ns per call already)"
                    .into(),
            ));
        }
        let tick = duration_flag("--tick", &self.tick, Duration::from_millis(10))?;
        Ok(SamplingConfig {
            interval,
            alloc_only: self.alloc_only,
            max_tracked: self.max_tracked,
            ring_buffer,
            max_stacks: self.max_stacks as usize,
            unwind,
            debug_dirs: self.debug_dirs.clone(),
            python_frames: self.python_frames.into(),
            sessions: !self.no_sessions,
            usdt_nop5: self.usdt_nop5,
            preload: !self.no_preload && max_overhead.is_none(),
            load_into_running: match self.front_end {
                // Duty cycling counts with the probes it detaches.
                _ if max_overhead.is_some() => LoadIntoRunning::Never,
                None | Some(crate::cli::FrontEndArg::Auto) => LoadIntoRunning::WherePossible,
                Some(crate::cli::FrontEndArg::InProcess) => LoadIntoRunning::Always,
                Some(crate::cli::FrontEndArg::Uprobes) => LoadIntoRunning::Never,
            },
            confidence: self.confidence,
            tick,
            verbose: self.verbose,
            max_samples_per_sec,
            min_samples_per_sec,
            max_overhead,
        })
    }

    /// The throttle's band, samples per second: `--min-samples-per-sec` and
    /// `--max-samples-per-sec`. An interval the user typed wins: the throttle changes it
    /// only if asked to too.
    fn throttle_band(&self) -> (u32, u32) {
        let typed = self.interval.is_some();
        let default = |value: u32| if typed { 0 } else { value };
        let max = self
            .max_samples_per_sec
            .unwrap_or(default(DEFAULT_MAX_SAMPLES_PER_SEC));
        let min = self
            .min_samples_per_sec
            .unwrap_or(default(DEFAULT_MIN_SAMPLES_PER_SEC));
        (min.min(max), max)
    }

    /// `--unwind`, with `--stack-bytes` checked for `dwarf`.
    fn unwind(&self) -> Result<Unwind, BadInput> {
        Ok(match self.unwind {
            UnwindArg::Fp => Unwind::FramePointers,
            UnwindArg::Dwarf => Unwind::Cfi {
                stack_bytes: parse_size(&self.stack_bytes)
                    .ok()
                    .filter(|bytes| STACK_BYTES_RANGE.contains(bytes))
                    .ok_or_else(|| {
                        BadInput(format!(
                            "invalid --stack-bytes {:?}: from 4KiB to 64KiB",
                            self.stack_bytes
                        ))
                    })? as u32,
            },
        })
    }

    /// `--ring-buffer`, or its default for `unwind` and `interval`: a stack copy makes a
    /// sample's record up to ~30 times larger, so room for more in flight, the more the
    /// smaller the interval. Its pages are the kernel's from the start and mapped twice into
    /// allocscope, so its size is twice over in allocscope's RSS whatever the work: 32 MiB
    /// was 64 of the 134 MiB a shell loop's recording peaked at. At the default interval
    /// (throttled to 5,000 samples/s) 8 MiB holds ~0.1 s of the largest records at that
    /// rate; a burst of every block sampled (1 MiB blocks, ~60,000 samples/s of ~8 KB
    /// stacks) lost nothing even at 4 MiB: the reader's thread only copies them out.
    fn ring_buffer(&self, unwind: Unwind, interval: u64) -> Result<u32, BadInput> {
        Ok(match (&self.ring_buffer, unwind) {
            (Some(text), _) => parse_size(text)
                .ok()
                .filter(|&bytes| RING_BUFFER_RANGE.contains(&bytes) && bytes.is_power_of_two())
                .ok_or_else(|| {
                    BadInput(format!(
                        "invalid --ring-buffer {text:?}: a power of two from 64KiB to 256MiB"
                    ))
                })? as u32,
            (None, Unwind::FramePointers) => 4 << 20,
            (None, Unwind::Cfi { .. }) => {
                let scale = (512 << 10) / interval.max(1);
                ((8u64 << 20) * scale.max(1))
                    .next_power_of_two()
                    .min(32 << 20) as u32
            }
        })
    }

    /// `--max-overhead`, which needs `--alloc-only`.
    fn max_overhead(&self) -> Result<Option<f64>, BadInput> {
        let Some(text) = &self.max_overhead else {
            return Ok(None);
        };
        let budget = parse_percent(text).ok_or_else(|| {
            BadInput(format!(
                "invalid --max-overhead {text:?}: a percentage from 0.1% to 100% (e.g. 2%)"
            ))
        })?;
        if !self.alloc_only {
            return Err(BadInput(
                "--max-overhead needs --alloc-only: with the probes detached between slots, \
                 frees would be missed and live numbers would be wrong"
                    .into(),
            ));
        }
        Ok(Some(budget))
    }
}

/// A share given as a percentage ("2%", "2", "0.5%") as a fraction, from 0.1% to 100%.
pub fn parse_percent(text: &str) -> Option<f64> {
    let number = text.trim().trim_end_matches('%').trim();
    let percent: f64 = number.parse().ok()?;
    (0.1..=100.0).contains(&percent).then_some(percent / 100.0)
}

/// Most sampled blocks `--max-tracked` may ask the kernel to track (~100 MiB of kernel
/// memory).
pub const MAX_TRACKED_LIMIT: u32 = 1 << 20;

/// Most distinct stacks `--max-stacks` may keep (each costs ~1-10 KiB in memory and in a
/// JSON file).
pub const MAX_STACKS_LIMIT: u32 = 1 << 20;

/// Checks that the count given to `flag` lies in `1..=limit`, naming the flag in the error.
/// What one kept stack costs at the most, measured: ~5 KiB with 38 frames (100,000
/// stacks of `tests/fixtures/paths`, frames shared between stacks), so 16 KiB for the
/// deepest stacks and the profile built from them at the end.
pub const BYTES_PER_STACK: u64 = 16 << 10;

/// `--max-stacks` must fit in half of the memory available now (`available` bytes): a cap
/// reached would otherwise end the recording in the OOM killer, its profile lost.
fn stacks_fit(flag: &str, stacks: u32, available: u64) -> Result<(), BadInput> {
    let needed = u64::from(stacks) * BYTES_PER_STACK;
    if needed <= available / 2 {
        return Ok(());
    }
    let fits = available / 2 / BYTES_PER_STACK;
    Err(BadInput(format!(
        "{flag} {stacks} may need {} of memory (up to {} KiB a stack), more than half of \
         the {} available here: at most {fits}",
        crate::format::bytes(needed as f64),
        BYTES_PER_STACK >> 10,
        crate::format::bytes(available as f64)
    )))
}

fn count_flag(flag: &str, value: u32, limit: u32) -> Result<(), BadInput> {
    if (1..=limit).contains(&value) {
        Ok(())
    } else {
        Err(BadInput(format!(
            "invalid {flag} {value}: between 1 and {limit}"
        )))
    }
}

/// Sizes `--ring-buffer` takes (the kernel wants a power-of-two number of pages).
const RING_BUFFER_RANGE: std::ops::RangeInclusive<u64> = (64 << 10)..=(256 << 20);

/// Shortest duration any flag takes.
pub const MIN_DURATION: Duration = Duration::from_millis(1);
/// Longest duration any flag takes (a year: timers beyond overflow the clock's arithmetic).
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses the duration given to `flag`, naming the flag in the error; it must lie within
/// `[at_least, a year]`.
pub fn duration_flag(flag: &str, text: &str, at_least: Duration) -> Result<Duration, BadInput> {
    let bad = |why: String| BadInput(format!("invalid {flag} {text:?}: {why}"));
    let duration = parse_duration(text).map_err(bad)?;
    if duration < at_least.max(MIN_DURATION) || duration > MAX_DURATION {
        return Err(bad(format!(
            "must be between {} and 365 days",
            humantime::format_duration(at_least.max(MIN_DURATION))
        )));
    }
    Ok(duration)
}

impl RecordArgs {
    /// Validates the arguments.
    pub fn into_config(self) -> Result<RecordConfig, BadInput> {
        let targets = self.targets.into_targets()?;
        let sampling = self.sampling.into_config()?;
        front_end_fits(&targets, &sampling)?;
        let duration = self
            .duration
            .as_deref()
            .map(|d| duration_flag("--duration", d, MIN_DURATION))
            .transpose()?;
        let every = self
            .every
            .as_deref()
            // A snapshot is a whole file: more than ten a second is a mistake.
            .map(|d| duration_flag("--every", d, Duration::from_millis(100)))
            .transpose()?;
        let leaks_older_than = self
            .leaks_older_than
            .as_deref()
            .map(|d| duration_flag("--leaks-older-than", d, MIN_DURATION))
            .transpose()?;
        if sampling.alloc_only && leaks_older_than.is_some() {
            return Err(BadInput(
                "--leaks-older-than needs free tracking: drop --alloc-only".into(),
            ));
        }
        if sampling.alloc_only && self.value.is_some_and(Value::needs_frees) {
            return Err(BadInput(
                "--value inuse-* needs free tracking: drop --alloc-only (or show alloc-bytes)"
                    .into(),
            ));
        }
        if sampling.max_overhead.is_some()
            && (targets.all || targets.follow || targets.comm.is_some())
        {
            return Err(BadInput(
                "--max-overhead works with -p and -- CMD: --all, --follow and --comm probe \
                 allocator files for every process, which one duty cycle cannot share out"
                    .into(),
            ));
        }
        if sampling.max_overhead.is_some() && every.is_some() {
            return Err(BadInput(
                "--every with --max-overhead is not supported: a period shorter than a \
                 stratum of slots may hold no on slot at all; record to one file"
                    .into(),
            ));
        }
        if self.keep == Some(0) {
            return Err(BadInput(
                "invalid --keep 0: keep at least one snapshot".into(),
            ));
        }
        let path = self
            .output
            .ok_or_else(|| missing_output(&targets.command))?;
        let (output, format) = output_and_format(path, every, self.keep, self.format)?;
        Ok(RecordConfig {
            targets,
            sampling,
            duration,
            leaks_older_than,
            output,
            format,
            value: self.value,
        })
    }
}

/// Where `record` writes (`path`: a file, or with `every` a directory of snapshots, `keep`
/// of them) and in which format (`format`, else from the file's extension; JSON snapshots).
fn output_and_format(
    path: PathBuf,
    every: Option<Duration>,
    keep: Option<usize>,
    format: Option<Format>,
) -> Result<(Output, Format), BadInput> {
    Ok(match every {
        Some(every) => (
            Output::Snapshots {
                dir: path,
                every,
                keep,
            },
            format.unwrap_or(Format::Json),
        ),
        None => {
            let format = match format {
                Some(format) => format,
                None => Format::for_path(&path).map_err(BadInput)?,
            };
            (Output::File(path), format)
        }
    })
}

/// `record` without `-o`; when the command's own words hold one, said that words after
/// `--` are the command's.
fn missing_output(command: &[OsString]) -> BadInput {
    let misplaced = command.iter().skip(1).any(|word| {
        let word = word.to_string_lossy();
        word == "-o" || word == "--output" || word.starts_with("--output=")
    });
    BadInput(if misplaced {
        "--output (-o) is required before `--`: the words after `--` are the command's own, \
         so the `-o` there goes to the command"
            .into()
    } else {
        "--output (-o) is required: the file to write the profile to, e.g. -o profile.json".into()
    })
}

fn parse_pid(text: &str) -> Result<u32, BadInput> {
    match text.parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err(BadInput(format!(
            "invalid pid {text:?}: expected a positive number"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[test]
    fn max_stacks_must_fit_in_half_of_the_memory_available() {
        let gib = 1u64 << 30;
        assert!(stacks_fit("--max-stacks", 8192, gib).is_ok());
        // 1 GiB available: half of it holds 32768 stacks of 16 KiB.
        assert!(stacks_fit("--max-stacks", 32768, gib).is_ok());
        let refused = stacks_fit("--max-stacks", 32769, gib).unwrap_err().0;
        assert!(refused.contains("at most 32768"), "{refused}");
        assert!(stacks_fit("--max-stacks", MAX_STACKS_LIMIT, 64 * gib).is_ok());
    }
    use crate::cli::{Cli, Command};

    fn record(args: &[&str]) -> Result<RecordConfig, String> {
        let cli = Cli::try_parse_from(["allocscope", "record"].iter().chain(args))
            .map_err(|e| e.to_string())?;
        match cli.command {
            Command::Record(args) => args.into_config().map_err(|e| e.to_string()),
            other => panic!("parsed as {other:?}"),
        }
    }

    /// An interval the user typed is kept: the throttle is off unless asked for too (a
    /// default throttle once raised `-i 64KiB` to 483 KiB).
    #[test]
    fn a_typed_interval_is_not_throttled_unless_asked() {
        let max = |args: &[&str]| record(args).unwrap().sampling.max_samples_per_sec;
        let min = |args: &[&str]| record(args).unwrap().sampling.min_samples_per_sec;
        let interval = |args: &[&str]| record(args).unwrap().sampling.interval;
        let base = ["-p", "1", "-o", "/tmp/x.json"];
        assert_eq!(max(&base), DEFAULT_MAX_SAMPLES_PER_SEC);
        assert_eq!(min(&base), DEFAULT_MIN_SAMPLES_PER_SEC);
        assert_eq!(interval(&base), 512 * 1024);
        let typed = [&base[..], &["-i", "64KiB"]].concat();
        assert_eq!(max(&typed), 0);
        assert_eq!(min(&typed), 0);
        assert_eq!(interval(&typed), 64 * 1024);
        let both = [&typed[..], &["--max-samples-per-sec", "100"]].concat();
        assert_eq!(max(&both), 100);
    }

    #[test]
    fn front_end_is_for_running_processes_and_not_duty_cycled() {
        let command = record(&["--front-end", "in-process", "-o", "x", "--", "true"]);
        assert!(command.unwrap_err().contains("for running processes"));
        let duty = record(&[
            "-p",
            "1",
            "-o",
            "x",
            "--alloc-only",
            "--max-overhead",
            "2%",
            "--front-end",
            "in-process",
        ]);
        assert!(duty
            .unwrap_err()
            .contains("cannot go with --front-end in-process"));
        let fleet = record(&["--all", "--front-end", "in-process", "-o", "x"]).unwrap();
        assert_eq!(fleet.sampling.load_into_running, LoadIntoRunning::Always);
        let auto = record(&["--comm", "x", "-o", "x"]).unwrap();
        assert_eq!(
            auto.sampling.load_into_running,
            LoadIntoRunning::WherePossible
        );
    }

    #[test]
    fn a_missing_output_says_where_it_goes() {
        let err = record(&["--", "python3", "s.py", "-o", "p.json"]).unwrap_err();
        assert!(err.contains("required before `--`"), "{err}");
        let err = record(&["--", "true"]).unwrap_err();
        assert!(err.contains("-o profile.json"), "{err}");
        assert!(record(&["-o", "p.json", "--", "true", "-o"]).is_ok());
    }

    #[test]
    fn a_pid_both_asked_for_and_excluded_is_refused() {
        let both = record(&["-p", "4242", "--exclude-pid", "4242", "-o", "/tmp/x.json"]);
        assert!(both.unwrap_err().contains("both asked for"));
    }

    #[test]
    fn max_overhead_is_a_percentage_and_needs_alloc_only() {
        let config = record(&["-p", "1", "-o", "x", "--alloc-only", "--max-overhead", "2%"]);
        assert_eq!(config.unwrap().sampling.max_overhead, Some(0.02));
        let config = record(&[
            "-p",
            "1",
            "-o",
            "x",
            "--alloc-only",
            "--max-overhead",
            "0.5",
        ]);
        assert_eq!(config.unwrap().sampling.max_overhead, Some(0.005));
        assert_eq!(
            record(&["-p", "1", "-o", "x"])
                .unwrap()
                .sampling
                .max_overhead,
            None
        );
        for silly in ["0", "0.01%", "101%", "lots", "NaN"] {
            let err = record(&[
                "-p",
                "1",
                "-o",
                "x",
                "--alloc-only",
                "--max-overhead",
                silly,
            ])
            .unwrap_err();
            assert!(err.contains("invalid --max-overhead"), "{silly}: {err}");
        }
        let err = record(&["-p", "1", "-o", "x", "--max-overhead", "2%"]).unwrap_err();
        assert!(err.contains("needs --alloc-only"), "{err}");
        let both = [
            "-p",
            "1",
            "-o",
            "d",
            "--alloc-only",
            "--max-overhead",
            "2%",
            "--every",
            "1s",
        ];
        assert!(record(&both).unwrap_err().contains("--every"));
        let host = ["--all", "-o", "x", "--alloc-only", "--max-overhead", "2%"];
        assert!(record(&host).unwrap_err().contains("-p and -- CMD"));
        let follow = [
            "-p",
            "1",
            "--follow",
            "-o",
            "x",
            "--alloc-only",
            "--max-overhead",
            "2%",
        ];
        assert!(record(&follow).unwrap_err().contains("-p and -- CMD"));
        let top = [
            "allocscope",
            "top",
            "-p",
            "1",
            "--alloc-only",
            "--max-overhead",
            "2%",
        ];
        match Cli::try_parse_from(top).unwrap().command {
            Command::Top(args) => {
                let err = args.into_config().unwrap_err().to_string();
                assert!(err.contains("is for record"), "{err}");
            }
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn record_validates_targets_interval_and_format() {
        let config = record(&["-p", "1", "-o", "x.folded"]).unwrap();
        assert_eq!(config.targets.pids, vec![1]);
        assert_eq!(config.format, Format::Folded);
        assert_eq!(config.sampling.interval, 512 * 1024);
        let config = record(&["-p", "1", "-o", "d/", "--every", "1m", "--keep", "3"]).unwrap();
        assert_eq!(
            config.output,
            Output::Snapshots {
                dir: "d/".into(),
                every: Duration::from_secs(60),
                keep: Some(3)
            }
        );
        assert_eq!(config.format, Format::Json);
        assert!(
            record(&["-p", "1", "-o", "d", "--keep", "3"]).is_err(),
            "--keep needs --every"
        );
        assert!(record(&["-p", "1", "-o", "d", "--every", "1m", "--keep", "0"]).is_err());
        assert!(record(&["-p", "1", "-o", "d", "--every", "never"])
            .unwrap_err()
            .contains("--every"));
        for silly in ["0.0000000001", "10000000000000000000", "50ms", "9000h"] {
            let err = record(&["-p", "1", "-o", "d", "--every", silly]).unwrap_err();
            assert!(
                err.contains("must be between 100ms and 365 days"),
                "{silly}: {err}"
            );
        }
        assert!(record(&["-p", "1", "-o", "x", "-d", "0.0000001"])
            .unwrap_err()
            .contains("between 1ms"));
        assert!(
            record(&["-p", "1", "-o", "x", "--max-tracked", "4294967295"])
                .unwrap_err()
                .contains("--max-tracked")
        );
        let ring_buffer = |args: &[&str]| record(args).unwrap().sampling.ring_buffer;
        assert_eq!(ring_buffer(&["-p", "1", "-o", "x"]), 8 << 20);
        // Smaller intervals, more samples in flight: up to the 32 MiB it always was.
        assert_eq!(
            ring_buffer(&["-p", "1", "-o", "x", "-i", "256KiB"]),
            16 << 20
        );
        assert_eq!(
            ring_buffer(&["-p", "1", "-o", "x", "-i", "64KiB"]),
            32 << 20
        );
        assert_eq!(ring_buffer(&["-p", "1", "-o", "x", "-i", "1"]), 32 << 20);
        assert_eq!(ring_buffer(&["-p", "1", "-o", "x", "-i", "4MiB"]), 8 << 20);
        assert_eq!(
            ring_buffer(&["-p", "1", "-o", "x", "--ring-buffer", "64KiB"]),
            64 << 10
        );
        assert_eq!(
            record(&["-p", "1", "-o", "x", "--unwind", "fp"])
                .unwrap()
                .sampling
                .ring_buffer,
            4 << 20
        );
        assert!(record(&["-p", "1", "-o", "x", "--stack-bytes", "128KiB"])
            .unwrap_err()
            .contains("--stack-bytes"));
        assert!(
            record(&["-p", "1", "-o", "x", "--debug-dir", "/nonexistent"])
                .unwrap_err()
                .contains("--debug-dir")
        );
        assert!(record(&[
            "-p",
            "1",
            "-o",
            "x.svg",
            "--alloc-only",
            "--value",
            "inuse-bytes"
        ])
        .unwrap_err()
        .contains("needs free tracking"));
        for bad in ["100KiB", "32KiB", "1GiB", "lots"] {
            let err = record(&["-p", "1", "-o", "x", "--ring-buffer", bad]).unwrap_err();
            assert!(err.contains("--ring-buffer"), "{bad}: {err}");
        }
        assert_eq!(
            record(&["-p", "1", "-o", "h.pb.gz"]).unwrap().format,
            Format::Pprof
        );
        let config = record(&["-o", "x", "--interval", "64KiB", "--", "ls", "-l"]).unwrap();
        assert_eq!(
            config.targets.command,
            vec![OsString::from("ls"), OsString::from("-l")]
        );
        assert_eq!(config.format, Format::Json);
        assert_eq!(config.sampling.interval, 65536);
        assert!(record(&["-o", "x"])
            .unwrap_err()
            .contains("nothing to profile"));
        assert!(record(&["-p", "0", "-o", "x"])
            .unwrap_err()
            .contains("invalid pid"));
        assert!(record(&["-p", "1", "-o", "x", "-i", "0"])
            .unwrap_err()
            .contains("between 1 byte"));
        assert!(record(&["-p", "1", "-o", "x", "-i", "lots"])
            .unwrap_err()
            .contains("invalid --interval"));
        assert!(record(&["-p", "1", "-o", "x", "--confidence", "1"])
            .unwrap_err()
            .contains("confidence"));
        assert!(record(&["-p", "1", "-o", "x", "-f", "json", "--", "ls"])
            .unwrap_err()
            .contains("not both"));
    }
}
