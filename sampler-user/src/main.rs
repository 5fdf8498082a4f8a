//! `allocscope`: parse → validate → prepare (checks, fork) → run on tokio → exit code.
//!
//! Exit codes: 0 success, 1 failure while recording, 2 bad input (reported before
//! anything is attached; clap's own usage errors also exit 2).

use std::process::ExitCode;

use sampler_user::{
    cli::{self, Command},
    commands::{agent, diff, generate, record, reference, report, top},
    config::BadInput,
    interrupted,
};

/// The stack allocscope's own work runs on (the estimates, the symbolizer's callers and
/// the exporters recurse over deep stacks and large profiles).
const STACK_BYTES: usize = 64 << 20;

/// Runs allocscope on a thread of its own with a fixed stack: the main thread's stack is
/// whatever `ulimit -s` the user had (64 KiB aborted allocscope with a stack overflow), and
/// that limit is the command's to inherit, not ours to raise. The commands allocscope
/// starts are forked from this thread, which lives until allocscope ends (their
/// `PR_SET_PDEATHSIG` is tied to it).
fn main() -> ExitCode {
    let worker = std::thread::Builder::new()
        .name("allocscope".into())
        .stack_size(STACK_BYTES)
        .spawn(allocscope);
    match worker.map(|w| w.join()) {
        Ok(Ok(code)) => code,
        Ok(Err(_)) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("allocscope: cannot start its main thread: {e}");
            ExitCode::FAILURE
        }
    }
}

fn allocscope() -> ExitCode {
    let matches = sampler_user::help::command().get_matches();
    let cli = match <cli::Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if let Err(e) = sampler_user::stacks::site::configure(&cli.wrapper) {
        eprintln!("allocscope: --wrapper: {e}");
        return ExitCode::from(2);
    }
    match cli.command {
        Command::Record(args) => {
            init_logging(args.sampling.verbose);
            log::debug!("allocscope {} starting", env!("CARGO_PKG_VERSION"));
            match run_record(args) {
                // The exit code of a command that ended on its own.
                Ok(code) => ExitCode::from(code),
                Err(err) => exit_code(Err(err)),
            }
        }
        Command::Top(args) => exit_code(run_top(args)),
        Command::Agent(args) => {
            init_logging(args.sampling.verbose);
            exit_code(run_agent(*args))
        }
        Command::Generate(args) => {
            init_logging(false);
            exit_code(generate::run(args))
        }
        Command::ReferenceProbe { pid, producer } => exit_code(reference::run(pid, producer)),
        Command::HoldLinks => {
            sampler_user::probe::attach::handoff::hold();
            ExitCode::SUCCESS
        }
        Command::Report(args) => {
            init_logging(false);
            exit_code(report::run(args))
        }
        Command::Diff(args) => {
            init_logging(false);
            match diff::run(args) {
                Ok(code) => ExitCode::from(code),
                Err(err) => exit_code(Err(err)),
            }
        }
    }
}

fn run_record(args: cli::RecordArgs) -> anyhow::Result<u8> {
    let started = std::time::Instant::now();
    let config = args.into_config()?;
    interrupted::watch();
    let prepared = record::prepare(&config)?;
    if let Some(code) = stopped_in_set_up() {
        return Ok(code);
    }
    log::debug!("checked and prepared in {:?}", started.elapsed());
    runtime()?.block_on(record::run(config, prepared))
}

/// Ctrl-C or SIGTERM during the set-up: said, with the exit status of that signal (the
/// prepared command, never run, dies with allocscope).
fn stopped_in_set_up() -> Option<u8> {
    let name = interrupted::received()?;
    eprintln!(
        "allocscope: {name} during the set-up: stopped before recording began, nothing was \
         recorded (a sampler loaded into a process stays there, dormant)"
    );
    interrupted::exit_status()
}

fn run_agent(args: cli::AgentArgs) -> anyhow::Result<()> {
    let config = args.into_config()?;
    interrupted::watch();
    let prepared = agent::prepare(&config)?;
    if stopped_in_set_up().is_some() {
        return Ok(());
    }
    runtime()?.block_on(agent::run(config, prepared))
}

fn run_top(args: cli::TopArgs) -> anyhow::Result<()> {
    let config = args.into_config()?;
    // Log records would scribble over the screen: they are kept and shown in the view's
    // status line, and printed once the terminal is restored.
    let log = top::LogBuffer::default();
    init_logging_to(config.sampling.verbose, Some(log.clone()));
    interrupted::watch();
    let prepared = top::prepare(&config)?;
    if stopped_in_set_up().is_some() {
        return Ok(());
    }
    let result = runtime()?.block_on(top::run(config, prepared, log.clone()));
    sampler_user::say_raw!("{}", log.take_all());
    result
}

/// The daemon side runs on one thread: intake, timers and signals are all I/O-bound.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Warnings only by default; `--verbose` adds our progress and the eBPF side's records.
fn init_logging(verbose: bool) {
    init_logging_to(verbose, None);
}

/// Like [`init_logging`], into `buffer` instead of stderr when given.
fn init_logging_to(verbose: bool, buffer: Option<top::LogBuffer>) {
    let ours = if verbose {
        log::LevelFilter::Debug
    } else {
        log::LevelFilter::Warn
    };
    env_logger::Builder::new()
        .filter_level(ours)
        // aya warns, with a page-long BTF dump, that the kernel rejects the object's BTF:
        // aya-log's globals carry type names the kernel refuses. The programs load and run
        // without it, so that is loader noise, and aya's debug output (relocations, BTF
        // fixups) is loader internals: only aya's errors are shown, even with --verbose.
        .filter_module("aya", log::LevelFilter::Error)
        .filter_module("aya_obj", log::LevelFilter::Error)
        .format_target(false)
        // --verbose is where a slow start or stop is looked into: its lines carry times.
        .format_timestamp(verbose.then_some(env_logger::fmt::TimestampPrecision::Millis))
        .target(match buffer {
            Some(buffer) => env_logger::Target::Pipe(Box::new(buffer)),
            None => env_logger::Target::Stderr,
        })
        .init();
}

fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            sampler_user::say!("allocscope: {err:#}");
            if err.downcast_ref::<BadInput>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
