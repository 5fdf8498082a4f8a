//! What CI runs: set up, build the release binary the integration tests drive, check
//! formatting and lints (the eBPF crate's too, on nightly for the BPF target), run every
//! test. Integration tests need root; under `CI=true` they fail instead of skipping.

use std::process::Command;

use crate::run::{cargo, status, workspace};

pub fn run() -> anyhow::Result<()> {
    crate::setup::run()?;
    status(cargo().args(["build", "--release"]))?;
    status(cargo().args(["fmt", "--all", "--check"]))?;
    status(cargo().args([
        "clippy",
        "--release",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    status(
        Command::new("rustup")
            .current_dir(workspace())
            .args([
                "run",
                "nightly",
                "cargo",
                "clippy",
                "--package",
                "sampler-ebpf",
            ])
            .args([
                "--release",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
            ])
            .args(["--", "-D", "warnings"]),
    )?;
    status(cargo().args(["test", "--release"]))
}
