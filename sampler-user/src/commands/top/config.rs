//! A `top` invocation, validated: `record`'s targets and sampling, the view's window and
//! leak age, and where its output goes (`-o` as for record: a file written when the view
//! ends, snapshots beside it; or a directory for the snapshots alone).

use std::{path::PathBuf, time::Duration};

use crate::{
    cli::TopArgs,
    config::{duration_flag, front_end_fits, BadInput, SamplingConfig, Targets, MIN_DURATION},
    export::Format,
};

/// A validated `top` invocation.
#[derive(Clone, Debug)]
pub struct TopConfig {
    /// What to profile.
    pub targets: Targets,
    /// How to sample.
    pub sampling: SamplingConfig,
    /// Window of the rates shown.
    pub window: Duration,
    /// Age beyond which live sampled allocations are leak candidates (leak view).
    pub leaks_older_than: Duration,
    /// Where the snapshot key writes (and a started command's log).
    pub snapshot_dir: PathBuf,
    /// Where the recording is written when the view ends (`-o FILE`).
    pub output: Option<PathBuf>,
    /// Format of the output file and the snapshots.
    pub format: Format,
}

impl TopArgs {
    /// Validates the arguments.
    pub fn into_config(self) -> Result<TopConfig, BadInput> {
        let targets = self.targets.into_targets()?;
        let sampling = self.sampling.into_config()?;
        front_end_fits(&targets, &sampling)?;
        if sampling.max_overhead.is_some() {
            return Err(BadInput(
                "--max-overhead is for record: top shows rates over a sliding window, which \
                 time-sampled slots would leave mostly empty"
                    .into(),
            ));
        }
        // The view refreshes every second.
        let window = duration_flag("--window", &self.window, Duration::from_secs(1))?;
        let leaks_older_than =
            duration_flag("--leaks-older-than", &self.leaks_older_than, MIN_DURATION)?;
        // `-o` names a file as for record; a directory keeps only the snapshots.
        let (snapshot_dir, output) = match self.output {
            Some(dir) if dir.is_dir() => (dir, None),
            Some(file) => (
                crate::outfile::directory_of(&file).to_path_buf(),
                Some(file),
            ),
            None => (PathBuf::from("."), None),
        };
        let format = match (self.format, &output) {
            (Some(format), _) => format,
            (None, Some(file)) => Format::for_path(file).map_err(BadInput)?,
            (None, None) => Format::Json,
        };
        Ok(TopConfig {
            targets,
            sampling,
            window,
            leaks_older_than,
            snapshot_dir,
            output,
            format,
        })
    }
}
