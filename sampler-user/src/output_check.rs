//! The output's destination checked before anything is attached, failing with a message
//! a user can act on (a recording's own checks are the engine's `preflight`).

use std::path::Path;

use crate::{
    config::{BadInput, Output},
    outfile,
};

/// Proves that the output can be written before anything is attached: a file's
/// destination must be absent or a regular file and its directory must accept a new file;
/// a snapshot directory is created if missing.
pub(crate) fn check_output(output: &Output) -> Result<(), BadInput> {
    match output {
        Output::File(path) => check_output_file(path),
        Output::Snapshots { dir, .. } => check_snapshot_dir(dir),
    }
}

/// Fails unless a profile can be written to `path` (see [`outfile::check_destination`]).
pub(crate) fn check_output_file(path: &Path) -> Result<(), BadInput> {
    let cannot =
        |e: std::io::Error| BadInput(format!("cannot write output {}: {e}", path.display()));
    outfile::check_destination(path).map_err(cannot)?;
    outfile::check_writable_dir(outfile::directory_of(path)).map_err(cannot)
}

/// Creates the snapshot directory `dir` if missing and proves it accepts files.
pub(crate) fn check_snapshot_dir(dir: &Path) -> Result<(), BadInput> {
    let pinned = outfile::create_directory(dir).map_err(|e| {
        BadInput(format!(
            "cannot create snapshot directory {}: {e}",
            dir.display()
        ))
    })?;
    outfile::check_writable_dir(&outfile::through(&pinned))
        .map_err(|e| BadInput(format!("cannot write into {}: {e}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritable_output_is_refused() {
        let err = check_output(&Output::File("/nonexistent-dir/x.json".into())).unwrap_err();
        // The directory is named, not the temporary file the check made up.
        assert!(
            err.to_string().ends_with(
                "cannot write output /nonexistent-dir/x.json: directory /nonexistent-dir: \
                 No such file or directory (os error 2)"
            ),
            "{err}"
        );
        assert!(check_output(&Output::File("/".into())).is_err());
        let err = check_output(&Output::File("/dev/null".into())).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let snapshots = Output::Snapshots {
            dir: "/dev/null/allocscope-test".into(),
            every: std::time::Duration::from_secs(1),
            keep: None,
        };
        assert!(check_output(&snapshots)
            .unwrap_err()
            .to_string()
            .contains("snapshot directory"));
    }
}
