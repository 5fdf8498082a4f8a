//! What CI runs: set up, build the release binary the integration tests drive (and the
//! Debian package the packaging test installs), check
//! formatting and lints (the eBPF crate's too, on nightly for the BPF target), run every
//! test, then the torture campaign (xtask/torture/run.py). Integration tests need root; under `CI=true` they fail instead of skipping.
//!
//! cargo prints one `test result:` line per test binary, the last often a doc-test run with
//! nothing in it; the closing `tests: N passed, N failed` line sums them all.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _};

use crate::run::{cargo, status, workspace};

pub fn run() -> anyhow::Result<()> {
    crate::setup::run()?;
    status(cargo().args(["build", "--release"]))?;
    // The package the packaging test installs.
    crate::dist::run()?;
    status(cargo().args(["fmt", "--all", "--check"]))?;
    shape()?;
    status(cargo().args(["test", "--release", "-p", "xtask"]))?;
    // Every host crate, xtask included (it is not a default member), and the calibration
    // example behind its feature.
    let host_crates = [
        "--workspace",
        "--exclude",
        "sampler-ebpf",
        "--all-targets",
        "--features",
        "sampler-user/simulation",
    ];
    status(
        cargo()
            .args(["clippy", "--release"])
            .args(host_crates)
            .args(["--", "-D", "warnings"]),
    )?;
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
    let mut tests = cargo();
    tests.args(["test", "--release"]).stdout(Stdio::piped());
    eprintln!("xtask: {tests:?}");
    let mut child = tests.spawn().context("starting cargo test")?;
    let stdout = child.stdout.take().context("cargo test's stdout")?;
    let (mut passed, mut failed) = (0u64, 0u64);
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some((p, f)) = counts(&line) {
            passed += p;
            failed += f;
        }
    }
    let outcome = child.wait()?;
    println!("tests: {passed} passed, {failed} failed");
    if !outcome.success() {
        bail!("cargo test failed: {outcome}");
    }
    // The hostile user's campaign against the release binary (`cargo xtask torture`):
    // each case compares a target's output, status and timing with a native run.
    crate::torture(&[])
}

/// Every crate's folder.
const CRATES: [&str; 9] = [
    "crates/engine",
    "crates/model",
    "crates/outputs",
    "crates/target",
    "sampler-common",
    "sampler-ebpf",
    "sampler-preload",
    "sampler-user",
    "xtask",
];

/// The user side's crates: each one's modules import one way, /proc only through `sys`.
const USER_SIDE: [&str; 5] = [
    "crates/engine",
    "crates/model",
    "crates/outputs",
    "crates/target",
    "sampler-user",
];

/// The shape checks: one-way imports, sizes.
pub fn shape() -> anyhow::Result<()> {
    let src = |c: &str| workspace().join(c).join("src");
    for user_crate in USER_SIDE {
        let self_contained: &[&str] = if user_crate == "crates/model" {
            &["schema"]
        } else {
            &[]
        };
        crate::cycles::check(&src(user_crate), self_contained)?;
    }
    let folders = crate::cycles::check_folders(&CRATES.map(src))?;
    println!("xtask: no circle of files inside any of {folders} folders");
    crate::layout::check(&workspace())?;
    crate::os_layer::check(&src("crates/target").join("sys"), &USER_SIDE.map(src))?;
    crate::contract::check(
        &workspace().join("sampler-common/src/kernel.rs"),
        &[
            "crates/engine",
            "crates/target",
            "sampler-user",
            "sampler-preload",
        ]
        .map(src),
    )?;
    crate::sizes::check(&CRATES.map(src))?;
    crate::history::check(&workspace())
}

/// Passed and failed counts of a `test result: ok. 3 passed; 0 failed; …` line.
fn counts(line: &str) -> Option<(u64, u64)> {
    let rest = line.strip_prefix("test result: ")?;
    let number = |word: &str| -> Option<u64> {
        rest.split(';')
            .find_map(|part| part.trim().strip_suffix(word))
            .and_then(|n| n.trim().rsplit(' ').next()?.parse().ok())
    };
    Some((number("passed")?, number("failed")?))
}
