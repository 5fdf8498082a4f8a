//! Project tasks: `cargo xtask setup | demo | test | check | bench | dist | torture |
//! soak`. This file only dispatches; each task is a module.

mod bench;
mod contract;
mod cycles;
mod demo;
mod dist;
mod history;
mod layout;
mod os_layer;
mod run;
mod setup;
mod sizes;
mod soak;
mod test;

use clap::{Parser, Subcommand};

/// allocscope's project tasks.
#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need (idempotent): nightly rust-src, bpf-linker
    /// 0.10.0, and the Debian packages and tools the tests use.
    Setup {
        /// Only what building allocscope needs: rust-src, bpf-linker and a C compiler.
        #[arg(long)]
        build_only: bool,
    },
    /// Build, record the bundled workload with known call sites, print the summary and write
    /// target/demo/heap.json (installs only what building needs: `setup --build-only`).
    Demo,
    /// Set up, build, then run formatting and lint checks and every test (what CI runs).
    Test,
    /// Run the shape checks alone: no import cycle among each user-side crate's modules nor
    /// among a folder's files, /proc read only by the target side's sys layer, maps named
    /// by their constants, docs/layout.md's entries exist, no file or function over its size
    /// limit without a reason at the site, commit subjects of at most 72 characters.
    Check,
    /// Measure allocscope's cost per malloc against a bare counting uprobe, in one run.
    Bench(bench::BenchArgs),
    /// Build the Debian package (target/dist/allocscope_VERSION_amd64.deb): the binary,
    /// the in-process library, the agent's systemd unit, man pages and completions.
    Dist,
    /// Run the agent (`--all`) for a long time beside a shell starting processes without
    /// end, and report its CPU and memory over time (a benchmark, not in CI).
    Soak(soak::SoakArgs),
    /// Run the hostile and clumsy user's campaign (xtask/torture/run.py) against the
    /// release build and print a pass/fail table; names select cases by substring.
    Torture {
        /// Only the cases whose name contains one of these.
        names: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Setup { build_only: false } => setup::run(),
        Task::Setup { build_only: true } => setup::build_only(),
        Task::Demo => demo::run(),
        Task::Test => test::run(),
        Task::Check => test::shape(),
        Task::Bench(args) => bench::run(args),
        Task::Dist => dist::run().map(drop),
        Task::Torture { names } => torture(&names),
        Task::Soak(args) => soak::run(args),
    }
}

/// Builds the release binary, then runs the campaign script with `names`.
pub(crate) fn torture(names: &[String]) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask has no parent directory")?;
    let built = std::process::Command::new("cargo")
        .args(["build", "--release"])
        .current_dir(root)
        .status()?;
    anyhow::ensure!(built.success(), "cargo build --release failed");
    let status = std::process::Command::new("python3")
        .arg(root.join("xtask/torture/run.py"))
        .args(names)
        .current_dir(root)
        .status()
        .context("running python3")?;
    anyhow::ensure!(status.success(), "some cases did not hold (see the table)");
    Ok(())
}
