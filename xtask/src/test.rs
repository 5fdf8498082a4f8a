//! What CI runs: set up, build the release binary the integration tests drive, check
//! formatting and lints, run every test. Integration tests need root; under `CI=true` they
//! fail instead of skipping.

use crate::run::{cargo, status};

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
    status(cargo().args(["test", "--release"]))
}
