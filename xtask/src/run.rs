//! Running commands with their full command line in every error.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context as _};

/// Runs `command`, failing with the command line when it fails.
pub fn status(command: &mut Command) -> anyhow::Result<()> {
    eprintln!("xtask: {command:?}");
    let status = command
        .status()
        .with_context(|| format!("starting {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}

/// Runs `command` and returns its stdout, or `None` if it cannot run or fails.
pub fn output(command: &mut Command) -> Option<String> {
    let output = command.output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The workspace root (xtask lives one level below it).
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_owned()
}

/// `cargo`, as invoked by the user (respects the toolchain cargo was started with).
pub fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(workspace());
    command
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_some_and(|uid| uid.trim() == "0")
}

/// Compiles `tests/fixtures/NAME.c` into `target/fixtures/NAME` with the flags the tests use
/// (`tests/fixtures/cflags`).
pub fn fixture(name: &str) -> anyhow::Result<PathBuf> {
    let root = workspace();
    let out_dir = root.join("target/fixtures");
    std::fs::create_dir_all(&out_dir)?;
    let binary = out_dir.join(name);
    let cflags = std::fs::read_to_string(root.join("tests/fixtures/cflags"))?;
    status(
        Command::new("gcc")
            .args(cflags.split_whitespace())
            .arg("-o")
            .arg(&binary)
            .arg(root.join("tests/fixtures").join(format!("{name}.c"))),
    )?;
    Ok(binary)
}
