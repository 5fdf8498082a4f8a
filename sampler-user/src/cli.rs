//! Command-line arguments as clap sees them; `config` validates them into a `Config`.

use std::{ffi::OsString, path::PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::export::Format;

const EXAMPLES: &str = "\
Examples:
  sudo allocscope record -p 4242 --duration 10 -o heap.json
  sudo allocscope record --interval 64KiB -o heap.json -- ./my-program --its-args
  sudo allocscope record -p 4242 -o heap.folded   # format from the extension";

/// Sampling allocation profiler: eBPF uprobes on the allocator of running processes,
/// per-stack estimates of allocated bytes with confidence bounds.
#[derive(Debug, Parser)]
#[command(name = "allocscope", version, after_help = EXAMPLES)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Record allocations of processes and write a profile.
    #[command(after_help = EXAMPLES)]
    Record(RecordArgs),
    /// Benchmark reference: a uprobe on malloc that only counts calls, until SIGINT/SIGTERM.
    #[command(hide = true)]
    ReferenceProbe {
        /// Process to probe.
        #[arg(short, long = "pid")]
        pid: u32,
    },
}

/// `allocscope record`.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Process to profile (repeat for several).
    #[arg(short, long = "pid", value_name = "PID", help_heading = "Targets")]
    pub pids: Vec<String>,

    /// Command to start and profile from its first allocation (after `--`).
    #[arg(last = true, value_name = "CMD", help_heading = "Targets")]
    pub command: Vec<OsString>,

    /// Stop after this long (e.g. 10, 30s, 500ms, 2m); default: until Ctrl-C, SIGTERM or
    /// the targets exit.
    #[arg(short, long, value_name = "DURATION", help_heading = "Recording")]
    pub duration: Option<String>,

    /// Mean sampling interval: on average one sample per this many allocated bytes
    /// (e.g. 512KiB, 64K, 4096).
    #[arg(
        short,
        long,
        value_name = "BYTES",
        default_value = "512KiB",
        help_heading = "Recording"
    )]
    pub interval: String,

    /// Count allocations only, without tracking frees (the only mode so far).
    #[arg(long, help_heading = "Recording")]
    pub alloc_only: bool,

    /// Confidence level of every lower/upper bound, in (0, 1).
    #[arg(
        long,
        value_name = "LEVEL",
        default_value_t = 0.95,
        help_heading = "Output"
    )]
    pub confidence: f64,

    /// Output file.
    #[arg(short, long, value_name = "FILE", help_heading = "Output")]
    pub output: PathBuf,

    /// Output format (default: from the file extension, else json).
    #[arg(short, long, value_enum, help_heading = "Output")]
    pub format: Option<Format>,

    /// Show probe points, eBPF-side log records and progress on stderr.
    #[arg(short, long, help_heading = "Output")]
    pub verbose: bool,
}
