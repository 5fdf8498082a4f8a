//! Command-line arguments as clap sees them; `config` validates them into a `Config`.

use std::{ffi::OsString, path::PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::export::{Format, Value};

const EXAMPLES: &str = "\
Examples:
  sudo allocscope record -p 4242 --duration 10 -o heap.json
  sudo allocscope record --interval 64KiB -o heap.json -- ./my-program --its-args
  sudo allocscope record -p 4242 -o heap.pb.gz          # format from the extension
  sudo allocscope record -p 4242 --every 60s --keep 24 -o snapshots/
  allocscope report heap.json -o heap.svg               # convert a recording
  sudo allocscope top -p 4242                           # watch it live";

const REPORT_EXAMPLES: &str = "\
Examples:
  allocscope report heap.json                         # the summary and top stacks
  allocscope report heap.json -o heap.html            # the offline HTML report
  allocscope report heap.json -o heap.svg --value alloc-bytes
  allocscope report heap.json -o heap.pb.gz && go tool pprof -http :8080 heap.pb.gz";

const TOP_KEYS: &str = "\
Keys:
  q quit · ↑↓/j k move · Enter expand/collapse the stack · s cycle the sort column
  p pause · / filter by function or module (regex) · l leak view (live longer than
  --leaks-older-than) · r growth view (in-use bytes' slope) · t temporary view (freed
  within 1 ms) · T thread view · w write a snapshot · ? help

Examples:
  sudo allocscope top -p 4242
  sudo allocscope top --interval 64KiB -- ./my-program --its-args";

/// Sampling allocation profiler: eBPF uprobes on the allocator of running processes,
/// per-stack estimates of allocated bytes with confidence bounds.
#[derive(Debug, Parser)]
#[command(name = "allocscope", version, after_help = EXAMPLES)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// A function of the program's own that only passes allocations on (a regex on
    /// demangled names, e.g. '^my_alloc$'; repeat for several): stacks are named by their
    /// site, the first frame past the allocator, the runtimes' allocation machinery and
    /// these (the built-in list is in docs/manual.md, Sites)
    #[arg(long, global = true, value_name = "REGEX", hide_short_help = true)]
    pub wrapper: Vec<String>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Record allocations of processes and write a profile.
    #[command(after_help = EXAMPLES)]
    Record(RecordArgs),
    /// Watch allocations live in a full-screen, top-style view.
    #[command(after_help = TOP_KEYS)]
    Top(TopArgs),
    /// Print the top stacks of a saved JSON profile, or convert it to another format.
    #[command(after_help = REPORT_EXAMPLES)]
    Report(ReportArgs),
    /// Compare two saved JSON profiles: what changed beyond the sampling noise.
    #[command(after_help = DIFF_EXAMPLES)]
    Diff(DiffArgs),
    /// Run as a service: every period, send each process's profile to Pyroscope, an
    /// OpenTelemetry Collector (OTLP profiles) or Parca, and/or write it to a directory.
    #[command(after_help = AGENT_EXAMPLES)]
    Agent(Box<AgentArgs>),
    /// Write the man pages, a shell's completions, or the in-process sampler library.
    Generate(GenerateArgs),
    /// Holds the descriptors it inherited until its standard input ends: the last links of a
    /// finished recording, released in its exit rather than in allocscope's.
    #[command(name = "hold-links", hide = true)]
    HoldLinks,
    /// Benchmark reference: a uprobe on malloc that only counts calls, until SIGINT/SIGTERM.
    #[command(hide = true)]
    ReferenceProbe {
        /// Process to probe.
        #[arg(short, long = "pid")]
        pid: u32,
        /// Probe where `record` would probe the process's own sampler (a Go runtime's
        /// sampled blocks and frees) instead of malloc: the Go benchmark's yardstick.
        #[arg(long)]
        producer: bool,
    },
}

/// What to profile: shared by `record` and `top`.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Process to profile (repeat for several).
    #[arg(short, long = "pid", value_name = "PID", help_heading = "Targets")]
    pub pids: Vec<String>,

    /// Processes whose name (/proc/PID/comm) matches this regex, now and as they start
    /// (counted from their exec). Like --follow, probes the allocator libraries for every
    /// process: while it records, each allocation of any other process using them pays the
    /// uprobe trap (~0.7 µs), though it is neither counted nor sampled.
    #[arg(long, value_name = "REGEX", help_heading = "Targets")]
    pub comm: Option<String>,

    /// Every process on the host (each allocator file probed once, for all).
    #[arg(long, help_heading = "Targets")]
    pub all: bool,

    /// Also profile the processes the targets start (fork, exec), and theirs, each counted
    /// from its fork. The default for `-- CMD` when allocscope's in-process sampler is
    /// loaded into it: its children carry it too, and nothing else is probed. Otherwise
    /// (-p, --no-preload, a static or set-user-ID command) this probes the allocator
    /// libraries for every process: while it records, each allocation of any other process
    /// using them pays the uprobe trap (~0.7 µs), though it is neither counted nor sampled.
    #[arg(long, help_heading = "Targets", conflicts_with = "no_follow")]
    pub follow: bool,

    /// With `-- CMD`: profile the command's own process only, not the processes it starts.
    #[arg(long, help_heading = "Targets")]
    pub no_follow: bool,

    /// Only processes whose cgroup (v2 path: a systemd unit's, a container's, e.g.
    /// 'nginx\.service$' or '/kubepods') matches this regex (with --all, --comm).
    #[arg(long, value_name = "REGEX", help_heading = "Targets")]
    pub cgroup: Option<String>,

    /// Leave processes whose name matches this regex alone (with --all, --comm, --follow).
    #[arg(long, value_name = "REGEX", help_heading = "Targets")]
    pub exclude_comm: Option<String>,

    /// Leave this process alone (repeat for several).
    #[arg(long = "exclude-pid", value_name = "PID", help_heading = "Targets")]
    pub exclude_pids: Vec<String>,

    /// Command to start and profile from its first allocation (after `--`).
    #[arg(last = true, value_name = "CMD", help_heading = "Targets")]
    pub command: Vec<OsString>,
}

/// How to sample: shared by `record` and `top`.
#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// Mean sampling interval: on average one sample per this many allocated bytes
    /// (e.g. 512KiB, 64K, 4096) [default: 512KiB, then kept between 200 and 5000 samples a
    /// second: --min-samples-per-sec, --max-samples-per-sec]. An interval you give is kept:
    /// the throttle then acts only if asked to too.
    #[arg(short, long, value_name = "BYTES", help_heading = "Sampling")]
    pub interval: Option<String>,

    /// Most samples per second: above it, the interval is raised (for all targets, at each
    /// thread's next sample) and lowered back when the rate falls, never below
    /// `--interval`; every sample carries the interval it was drawn at, so estimates stay
    /// unbiased. 0: never raised. [default: 5000, or 0 when --interval is given]
    #[arg(long, value_name = "N", help_heading = "Sampling")]
    pub max_samples_per_sec: Option<u32>,

    /// Fewest samples per second: below it, the interval is lowered (down to 4KiB, at most
    /// 16× a second), so a quiet process gets enough samples for bounds worth reading; a
    /// second with nothing allocated changes nothing. Samples cost microseconds each: 200
    /// a second is ~0.1% of a core. 0: never below --interval. [default: 200, or 0 when
    /// --interval is given]
    #[arg(long, value_name = "N", help_heading = "Sampling")]
    pub min_samples_per_sec: Option<u32>,

    /// Most CPU time the probes may add to the targets, as a share of their own (e.g. 2%):
    /// above it the probes are duty-cycled, attached in one randomly drawn 50 ms slot of
    /// every few; exact counts then cover those slots, and estimates weigh each by its
    /// share of the target's work (bounds widened by the spread between slots, with no
    /// upper end where too little was seen). Needs --alloc-only (frees in the off slots
    /// would be missed); -p and -- CMD only.
    #[arg(long, value_name = "PCT", help_heading = "Sampling")]
    pub max_overhead: Option<String>,

    /// Count allocations only: no free tracking, no live-heap numbers, the lowest overhead
    /// (no return probes, no probe on free).
    #[arg(long, help_heading = "Sampling")]
    pub alloc_only: bool,

    /// With `-- CMD`: probe the command's allocator with uprobes (a trap on every call)
    /// instead of loading allocscope's in-process sampler into it, which counts and samples
    /// in the process and traps only on sampled blocks (the default for dynamically linked
    /// commands, without --max-overhead, --comm or --all).
    #[arg(long, help_heading = "Sampling")]
    pub no_preload: bool,

    /// How running processes are counted. With -p: `in-process` loads allocscope's sampler
    /// into it (one thread stopped well under a millisecond), which counts there and traps
    /// only on sampled blocks; the library stays loaded after allocscope leaves, costing a
    /// few ns per call (docs/attach.md). `uprobes` traps on every allocator call (~0.7 µs)
    /// and leaves nothing behind. `auto` loads where it can, uprobes elsewhere, each said.
    /// With --comm or --all, `in-process` counts only the processes that carry the sampler
    /// (a service started with it preloaded, docs/agent.md) and loads it into --comm's
    /// matches; nothing else is probed, so no process pays a trap per call (`auto` there
    /// means uprobes on every allocator file, for every process). [default: auto; uprobes
    /// for `agent`]
    #[arg(long, value_enum, value_name = "HOW", help_heading = "Sampling")]
    pub front_end: Option<FrontEndArg>,

    /// Observe returns with a classic return probe on every allocation even where the kernel
    /// has uprobe sessions (for benchmarking the difference).
    #[arg(long, hide = true)]
    pub no_sessions: bool,

    /// Probe USDT sites at their 5-byte nop, which Linux 6.18 optimises into a call to a
    /// trampoline (~0.4–1 µs less per sample than the int3 trap at the 1-byte nop), for
    /// benchmarking only: on that kernel a process forked after a site was optimised
    /// crashes when it reaches the site (its copy of the code calls a trampoline mapping
    /// the fork did not copy).
    #[arg(long, hide = true)]
    pub usdt_nop5: bool,

    /// Most sampled allocations tracked as live at once (the kernel's live map); beyond it,
    /// samples are counted as untracked and live numbers say they are incomplete.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 65536,
        help_heading = "Sampling"
    )]
    pub max_tracked: u32,

    /// Most distinct call stacks kept whole; beyond it, a new stack is cut to its leaf
    /// frame (the allocation site), counted, and marked in the profile.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 8192,
        help_heading = "Sampling"
    )]
    pub max_stacks: u32,

    /// Size of the kernel's ring buffer carrying samples to allocscope (a power of two,
    /// 64KiB to 256MiB; default with `--unwind dwarf` 8MiB, up to 32MiB for intervals below
    /// 512KiB; 4MiB with `fp`). Samples that find it full lose their stack but stay in the
    /// totals.
    #[arg(long, value_name = "BYTES", help_heading = "Sampling")]
    pub ring_buffer: Option<String>,

    /// How stacks are unwound: `dwarf` copies the top of the user stack of each sampled call
    /// and unwinds it with the modules' CFI (.eh_frame), through code built without frame
    /// pointers; `fp` lets the kernel walk frame pointers (cheaper, stops where code has
    /// none).
    #[arg(
        long,
        value_name = "MODE",
        default_value = "dwarf",
        help_heading = "Sampling"
    )]
    pub unwind: UnwindArg,

    /// Bytes of user stack copied per sampled call with `--unwind dwarf` (4KiB to 64KiB);
    /// a stack deeper than this is cut, and the profile says so per stack.
    #[arg(
        long,
        value_name = "BYTES",
        default_value = "32KiB",
        help_heading = "Sampling"
    )]
    pub stack_bytes: String,

    /// Python frames in the stacks of CPython 3.11–3.13 processes: `on` replaces each
    /// evaluator frame with the Python functions it ran (file and line) and leaves out the
    /// interpreter's call machinery between them; `all` keeps every native frame too; `off`
    /// keeps native frames only; `auto` is `on` when a target is or may be CPython (a `-p`
    /// process mapping an interpreter, a command naming python or a script whose `#!` does,
    /// `--all`, `--comm`, `--follow`), else `off` (which spares the reading code: a few ms
    /// of verifying at start, and its lookup on each sample).
    #[arg(
        long,
        value_name = "MODE",
        default_value = "auto",
        help_heading = "Sampling"
    )]
    pub python_frames: PythonFramesArg,

    /// Also look for separate debug files here (by build id under DIR/.build-id/, or by
    /// the name in a file's .gnu_debuglink), before /usr/lib/debug and /lib/debug: names
    /// for stripped programs and libraries (repeat for several).
    #[arg(long = "debug-dir", value_name = "DIR", help_heading = "Sampling")]
    pub debug_dirs: Vec<PathBuf>,

    /// Time between the points of the in-use bytes' series, and the ticks growth is
    /// measured on (`1s`, `250ms`, …; at least 10ms). A series keeps at most 64 points:
    /// past them neighbours merge, so a long recording's points stand for longer.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "1s",
        help_heading = "Sampling"
    )]
    pub tick: String,

    /// Confidence level of every lower/upper bound, in (0, 1).
    #[arg(
        long,
        value_name = "LEVEL",
        default_value_t = 0.95,
        help_heading = "Sampling"
    )]
    pub confidence: f64,

    /// Show probe points, eBPF-side log records and progress on stderr (`top`: after it
    /// exits).
    #[arg(short, long, help_heading = "Output")]
    pub verbose: bool,
}

/// `--unwind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UnwindArg {
    /// CFI unwinding in user space of a copied stack window.
    Dwarf,
    /// The kernel's frame-pointer walk.
    Fp,
}

/// `--front-end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FrontEndArg {
    /// In-process where it can be loaded, uprobes elsewhere.
    Auto,
    /// In-process, or an error.
    InProcess,
    /// Uprobes only.
    Uprobes,
}

/// `--python-frames`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PythonFramesArg {
    /// `on` when a target is or may be CPython, else `off`.
    Auto,
    /// Python frames merged, the interpreter's call machinery left out.
    On,
    /// Python frames merged, every native frame kept.
    All,
    /// Native frames only.
    Off,
}

/// `allocscope record`.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// What to profile.
    #[command(flatten)]
    pub targets: TargetArgs,

    /// How to sample.
    #[command(flatten)]
    pub sampling: SamplingArgs,

    /// Stop after this long (e.g. 10, 30s, 500ms, 2m); default: until Ctrl-C, SIGTERM or
    /// the targets exit.
    #[arg(short, long, value_name = "DURATION", help_heading = "Recording")]
    pub duration: Option<String>,

    /// List stacks whose sampled allocations have been live longer than DURATION (leak
    /// candidates), e.g. 30s.
    #[arg(long, value_name = "DURATION", help_heading = "Output")]
    pub leaks_older_than: Option<String>,

    /// Output file (required), or with --every a directory for the snapshots.
    #[arg(short, long, value_name = "PATH", help_heading = "Output")]
    pub output: Option<PathBuf>,

    /// Output format (default: from the file extension: .pb.gz pprof, .folded folded, .svg
    /// svg, .html the HTML report, .speedscope.json speedscope, else json; json for
    /// snapshots).
    #[arg(short, long, value_enum, help_heading = "Output")]
    pub format: Option<Format>,

    /// What folded and SVG output show, and what the HTML report and speedscope open on
    /// (default: inuse-bytes when frees are tracked and something is still live at the
    /// end, else alloc-bytes).
    #[arg(long, value_enum, help_heading = "Output")]
    pub value: Option<Value>,

    /// Write a snapshot every DURATION into the --output directory (file names carry the
    /// UTC time; values since start and in the period); the last, partial period is
    /// written when recording stops.
    #[arg(long, value_name = "DURATION", help_heading = "Output")]
    pub every: Option<String>,

    /// With --every: keep at most N snapshot files in the directory, deleting the oldest.
    #[arg(long, value_name = "N", requires = "every", help_heading = "Output")]
    pub keep: Option<usize>,
}

const AGENT_EXAMPLES: &str = "\
Examples:
  sudo allocscope agent --all --pyroscope http://pyroscope:4040
  sudo allocscope agent --comm 'nginx|redis' --otlp-grpc http://otel-collector:4317
  sudo allocscope agent -p 4242 --period 10s --otlp-http https://collector.example:4318 \\
       --headers-file /etc/allocscope/headers --status /run/allocscope/status.json
  sudo allocscope agent --all --out-dir /var/lib/allocscope/profiles --keep 1440

Headers (Authorization, X-Scope-OrgID) come from --headers-file (`Name: value` lines) or
ALLOCSCOPE_HEADERS (`Name=value,Name=value`), never from the command line.";

/// `allocscope agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// What to profile.
    #[command(flatten)]
    pub targets: TargetArgs,

    /// How to sample.
    #[command(flatten)]
    pub sampling: SamplingArgs,

    /// Length of a period: each process's profile of the period is sent when it ends
    /// (allocations in the period; in-use memory at its end).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "60s",
        help_heading = "Agent"
    )]
    pub period: String,

    /// Push to Grafana Pyroscope (or Grafana Alloy's pyroscope.receive_http) at this URL
    /// (e.g. http://pyroscope:4040); repeat for several.
    #[arg(long, value_name = "URL", help_heading = "Sinks")]
    pub pyroscope: Vec<String>,

    /// Export OTLP profiles over HTTP (protobuf) to this URL (e.g.
    /// http://otel-collector:4318; /v1development/profiles added when no path is given).
    #[arg(long, value_name = "URL", help_heading = "Sinks")]
    pub otlp_http: Vec<String>,

    /// Export OTLP profiles over gRPC to this endpoint (http://host:4317 plaintext,
    /// https:// with TLS and the system's roots).
    #[arg(long, value_name = "URL", help_heading = "Sinks")]
    pub otlp_grpc: Vec<String>,

    /// Also write every period's profile into this directory (as `record --every` does).
    #[arg(long, value_name = "DIR", help_heading = "Sinks")]
    pub out_dir: Option<PathBuf>,

    /// Format of the --out-dir files (default json).
    #[arg(short, long, value_enum, help_heading = "Sinks")]
    pub format: Option<Format>,

    /// With --out-dir: keep at most N files, deleting the oldest.
    #[arg(long, value_name = "N", requires = "out_dir", help_heading = "Sinks")]
    pub keep: Option<usize>,

    /// `service_name` (Pyroscope) / `service.name` (OTLP) of every profile; default: each
    /// process's command.
    #[arg(long, value_name = "NAME", help_heading = "Sinks")]
    pub service_name: Option<String>,

    /// An extra label on every profile (e.g. env=prod); repeat for several.
    #[arg(long = "label", value_name = "KEY=VALUE", help_heading = "Sinks")]
    pub labels: Vec<String>,

    /// HTTP headers for every sink, a `Name: value` per line (not writable by others).
    #[arg(long, value_name = "FILE", help_heading = "Sinks")]
    pub headers_file: Option<PathBuf>,

    /// Time limit of each push.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10s",
        help_heading = "Sinks"
    )]
    pub push_timeout: String,

    /// Longest wait between tries of a failing sink (the waits double from 1 s up to it,
    /// with jitter).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "60s",
        help_heading = "Sinks"
    )]
    pub retry_max: String,

    /// Where undelivered profiles wait (a subdirectory per sink, root only).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/allocscope/spool",
        help_heading = "Sinks"
    )]
    pub spool_dir: PathBuf,

    /// Most bytes waiting per sink; beyond, the oldest are dropped (counted).
    #[arg(
        long,
        value_name = "BYTES",
        default_value = "64MiB",
        help_heading = "Sinks"
    )]
    pub spool_bytes: String,

    /// Keep undelivered profiles in memory (same bound) instead of --spool-dir.
    #[arg(long, help_heading = "Sinks")]
    pub spool_in_memory: bool,

    /// Write the agent's status (last push per sink, drops, losses, own RSS and CPU) to
    /// this JSON file, replaced after every period and push.
    #[arg(long, value_name = "FILE", help_heading = "Agent")]
    pub status: Option<PathBuf>,

    /// At shutdown, how long to keep trying to deliver the last periods.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10s",
        help_heading = "Agent"
    )]
    pub flush_timeout: String,
}

/// `allocscope generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// What to write.
    #[arg(value_enum)]
    pub what: GenerateWhat,
    /// Directory to write into.
    pub dir: PathBuf,
}

/// What `generate` writes.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum GenerateWhat {
    /// Man pages (allocscope.1, allocscope-record.1, …).
    Man,
    /// Completions for bash, zsh and fish.
    Completions,
    /// The in-process sampler (libsampler_preload.so, the very library `record -- CMD`
    /// loads), for services started with it preloaded (docs/agent.md).
    Library,
}

/// `allocscope top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// What to profile.
    #[command(flatten)]
    pub targets: TargetArgs,

    /// How to sample.
    #[command(flatten)]
    pub sampling: SamplingArgs,

    /// Length of the window the RATE column and the header's rates cover (e.g. 10s, 1m).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10s",
        help_heading = "View"
    )]
    pub window: String,

    /// Age beyond which a live sampled allocation counts as a leak candidate in the leak
    /// view (key l).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "30s",
        help_heading = "View"
    )]
    pub leaks_older_than: String,

    /// Output file, as for record: the recording is written there when the view ends
    /// (format from the extension, or --format); the snapshots key w writes beside it, and a
    /// command started under the view logs there. A directory instead: only the snapshots
    /// and the log go into it. [default: nothing written at the end; snapshots in .]
    #[arg(short, long, value_name = "PATH", help_heading = "Output")]
    pub output: Option<PathBuf>,

    /// Format of the output file and of the snapshots (default: from the output file's
    /// extension, else json).
    #[arg(short, long, value_enum, help_heading = "Output")]
    pub format: Option<Format>,
}

/// `allocscope diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The earlier recording (`allocscope/v1` JSON).
    #[arg(value_name = "BASE.json")]
    pub base: PathBuf,

    /// The later recording.
    #[arg(value_name = "NEW.json")]
    pub new: PathBuf,

    /// Also write the diff to FILE, by extension: .json (every comparison), .folded
    /// (`stack base new`, bytes allocated per run or per second, for inferno-flamegraph or
    /// flamegraph.pl), .pb.gz (a pprof whose values are the changes), .html (a differential
    /// flame graph, coloured where a change is significant). Repeat for several.
    #[arg(short, long, value_name = "FILE")]
    pub output: Vec<PathBuf>,

    /// Simultaneous confidence of the bounds over all comparisons, in (0, 1) [default: the
    /// recordings' confidence].
    #[arg(long, value_name = "LEVEL")]
    pub confidence: Option<f64>,

    /// Exit with status 1 when a stack or function grew significantly (bytes allocated per
    /// run or per second, or in use at the end) by more than PCT percent: a memory gate for
    /// CI.
    #[arg(long, value_name = "PCT")]
    pub fail_on_growth: Option<f64>,

    /// Match a stack within its command only (by default stacks are matched by their
    /// frames whatever the command's name: the same program under another file name).
    #[arg(long)]
    pub by_command: bool,

    /// Compare the bytes each recording allocated: the default when both are whole runs
    /// of a command (`record -- CMD`, each from its start to its end), which a slower run
    /// on a busy machine does not change.
    #[arg(long, conflicts_with = "per_second")]
    pub per_run: bool,

    /// Compare bytes allocated per second: the default when either recording is a window
    /// of running processes (`-p`, `--all`, an agent's period), whose lengths differ.
    #[arg(long)]
    pub per_second: bool,
}

/// Examples after `allocscope diff --help`.
const DIFF_EXAMPLES: &str = "Examples:
  allocscope diff before.json after.json
  allocscope diff before.json after.json -o changes.json -o changes.folded -o changes.pb.gz
  allocscope diff main.json branch.json --fail-on-growth 10      # exit 1 on a significant 10% growth
  allocscope diff monday.json today.json --per-second              # two windows of a running service";

/// `allocscope report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A profile written by `allocscope record` in JSON.
    #[arg(value_name = "FILE.json")]
    pub input: PathBuf,

    /// Convert to this file (format from the extension or --format).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Output format of --output.
    #[arg(short, long, value_enum)]
    pub format: Option<Format>,

    /// What folded and SVG output show, and what the HTML report and speedscope open on
    /// (default: inuse-bytes when the recording tracked frees and something was still live
    /// at its end, else alloc-bytes).
    #[arg(long, value_enum)]
    pub value: Option<Value>,

    /// Stacks in each printed table (as `record` prints them).
    #[arg(long, default_value_t = 10)]
    pub top: usize,

    /// List every process in the printed summary (above 8 processes it shows them by
    /// command, and each kind of note once).
    #[arg(long)]
    pub processes: bool,
}
