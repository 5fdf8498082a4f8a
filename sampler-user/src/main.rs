//! `allocscope`: parse → validate → prepare (checks, fork) → run on tokio → exit code.
//!
//! Exit codes: 0 success, 1 failure while recording, 2 bad input (reported before
//! anything is attached; clap's own usage errors also exit 2).

use std::process::ExitCode;

use clap::Parser as _;
use sampler_user::{
    cli::{self, Command},
    config::BadInput,
    record, reference, report,
};

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let args = match cli.command {
        Command::Record(args) => args,
        Command::ReferenceProbe { pid } => return exit_code(reference::run(pid)),
        Command::Report(args) => {
            init_logging(false);
            return exit_code(report::run(args));
        }
    };
    let verbose = args.verbose;
    init_logging(verbose);
    let result = args
        .into_config()
        .map_err(anyhow::Error::from)
        .and_then(|config| record::prepare(config).map_err(anyhow::Error::from))
        .and_then(|prepared| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(record::run(prepared))
        });
    exit_code(result)
}

/// Warnings only by default; `--verbose` adds our progress and the eBPF side's records.
fn init_logging(verbose: bool) {
    let (ours, aya) = if verbose {
        (log::LevelFilter::Debug, log::LevelFilter::Warn)
    } else {
        (log::LevelFilter::Warn, log::LevelFilter::Error)
    };
    env_logger::Builder::new()
        .filter_level(ours)
        // aya warns (with a BTF dump) that the kernel rejects the object's BTF: aya-log's
        // globals carry type names the kernel refuses. The programs load and run without it,
        // so that is loader noise, shown with --verbose only; aya's debug output (relocations,
        // BTF fixups) is loader internals and never shown.
        .filter_module("aya", aya)
        .filter_module("aya_obj", aya)
        .format_target(false)
        .format_timestamp(None)
        .init();
}

fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("allocscope: {err:#}");
            if err.downcast_ref::<BadInput>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
