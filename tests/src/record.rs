//! "Record this and give me the profile": one builder for the tests that run `allocscope
//! record` to completion, with the profile read into allocscope's own types
//! ([`Profile`]) rather than looked up by untyped JSON paths.

use std::{
    ffi::{OsStr, OsString},
    io::Write as _,
    path::PathBuf,
    process::{Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
};

pub use allocscope_model::schema::{ProcessProfile, Profile, StackProfile};

use crate::{allocscope, TempDir};

/// A recording to run: `allocscope record FLAGS -o FILE (-- COMMAND | -p PID)`.
#[derive(Debug, Clone)]
pub struct Record {
    flags: Vec<OsString>,
    target: Vec<OsString>,
    input: Vec<u8>,
    env: Vec<(OsString, OsString)>,
}

/// What a recording left: its profile, its stderr (the summary and the log) and its exit
/// code.
#[derive(Debug)]
pub struct Recorded {
    pub profile: Profile,
    pub stderr: String,
    /// The command's stdout (allocscope passes it through).
    pub stdout: String,
    pub code: Option<i32>,
    /// The file allocscope wrote (kept until this is dropped).
    pub file: PathBuf,
    _dir: TempDir,
}

impl Record {
    /// Records `program ARGS` from its start.
    pub fn command(program: impl AsRef<OsStr>, args: &[&str]) -> Record {
        let mut target = vec!["--".into(), program.as_ref().to_owned()];
        target.extend(args.iter().map(OsString::from));
        Record {
            flags: Vec::new(),
            target,
            input: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Records running process `pid` (until it exits, or `--duration`).
    pub fn pid(pid: u32) -> Record {
        Record {
            flags: Vec::new(),
            target: vec!["-p".into(), pid.to_string().into()],
            input: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Adds `record` flags (`--interval`, `--alloc-only`, …).
    pub fn flags(mut self, flags: &[&str]) -> Record {
        self.flags.extend(flags.iter().map(OsString::from));
        self
    }

    /// Sets an environment variable of allocscope (and so of the command).
    pub fn env(mut self, name: &str, value: &str) -> Record {
        self.env.push((name.into(), value.into()));
        self
    }

    /// What the command reads on its stdin (allocscope passes its stdin on).
    pub fn input(mut self, bytes: &[u8]) -> Record {
        self.input = bytes.to_vec();
        self
    }

    /// Runs the recording to completion; panics, showing its stderr, unless it succeeded
    /// (the command's own exit code passes through: `exit_code` for another) and wrote a
    /// profile.
    pub fn run(self) -> Recorded {
        let recorded = self.run_allowing_exit_code();
        assert_eq!(
            recorded.code,
            Some(0),
            "allocscope failed:\n{}",
            recorded.stderr
        );
        recorded
    }

    /// Runs the recording to completion, whatever its exit code, and reads its profile.
    pub fn run_allowing_exit_code(self) -> Recorded {
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let dir = TempDir::new(&format!("record-{}", RUNS.fetch_add(1, Ordering::Relaxed)));
        let out = dir.path("profile.json");
        let mut child = Command::new(allocscope())
            .arg("record")
            .args(&self.flags)
            .arg("-o")
            .arg(&out)
            .args(&self.target)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        // A command that never reads it is not an error here.
        let _ = stdin.write_all(&self.input);
        drop(stdin);
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let text = std::fs::read_to_string(&out)
            .unwrap_or_else(|e| panic!("no profile written ({e}):\n{stderr}"));
        let profile = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("the profile does not read as allocscope/v1: {e}"));
        Recorded {
            profile,
            stderr,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            code: output.status.code(),
            file: out,
            _dir: dir,
        }
    }
}

impl Recorded {
    /// Process `pid` (panics, listing them, if it is missing).
    pub fn process(&self, pid: u32) -> &ProcessProfile {
        process_of(&self.profile, pid)
    }

    /// The one process recorded (panics if there are several).
    pub fn only_process(&self) -> &ProcessProfile {
        let processes = &self.profile.processes;
        assert_eq!(processes.len(), 1, "{processes:#?}");
        &processes[0]
    }

    /// The stacks of `pid` whose leaf frame is `function`.
    pub fn site(&self, pid: u32, function: &str) -> Vec<&StackProfile> {
        site_of(&self.profile, pid, function)
    }
}

/// Process `pid` of `profile` (panics, listing them, if it is missing).
pub fn process_of(profile: &Profile, pid: u32) -> &ProcessProfile {
    profile
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .unwrap_or_else(|| {
            let pids: Vec<u32> = profile.processes.iter().map(|p| p.pid).collect();
            panic!("pid {pid} missing from the profile's processes {pids:?}")
        })
}

/// The stacks of `pid` in `profile` whose leaf frame (the allocator's direct caller) is
/// `function`.
pub fn site_of<'a>(profile: &'a Profile, pid: u32, function: &str) -> Vec<&'a StackProfile> {
    profile
        .stacks
        .iter()
        .filter(|s| s.pid == pid && leaf_is(s, function))
        .collect()
}

/// Whether frame 0 of `stack` is `function`.
pub fn leaf_is(stack: &StackProfile, function: &str) -> bool {
    frame_is(stack, 0, function)
}

/// Whether frame `index` of `stack` is `function`.
pub fn frame_is(stack: &StackProfile, index: usize, function: &str) -> bool {
    stack.frames.get(index).and_then(|f| f.function.as_deref()) == Some(function)
}

/// Asserts that `estimate`'s bounds hold `truth` (`what` names it; `context`, allocscope's
/// stderr, is shown if not).
pub fn assert_holds(
    estimate: &allocscope_model::stats::Estimate,
    truth: f64,
    what: &str,
    context: &str,
) {
    assert!(
        estimate.lower <= truth && truth <= estimate.upper,
        "{what}: {truth} outside [{}, {}] (estimate {})\n{context}",
        estimate.lower,
        estimate.upper,
        estimate.estimate
    );
}

/// A profile read as JSON, typed.
pub fn typed(profile: &serde_json::Value) -> Profile {
    serde_json::from_value(profile.clone()).expect("the profile reads as allocscope/v1")
}
