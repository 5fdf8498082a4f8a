//! Project tasks: `cargo xtask setup | demo | test | bench`. This file only dispatches; each
//! task is a module.

mod bench;
mod cycles;
mod demo;
mod run;
mod setup;
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
    /// 0.10.0, and the Debian packages the tests use.
    Setup,
    /// Build, record the bundled workload with known call sites, print the summary and write
    /// target/demo/heap.json and heap.folded.
    Demo,
    /// Set up, build, then run formatting and lint checks and every test (what CI runs).
    Test,
    /// Measure allocscope's cost per malloc against a bare counting uprobe, in one run.
    Bench(bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Setup => setup::run(),
        Task::Demo => demo::run(),
        Task::Test => test::run(),
        Task::Bench(args) => bench::run(args),
    }
}
