//! `allocscope`: parse → validate → prepare (checks, fork) → run on tokio → exit code.
//!
//! Exit codes: 0 success, 1 failure while recording, 2 bad input (reported before
//! anything is attached; clap's own usage errors also exit 2).

use std::process::ExitCode;

use clap::Parser as _;
use sampler_user::{
    cli::{self, Command},
    config::BadInput,
    record, reference,
};

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let args = match cli.command {
        Command::Record(args) => args,
        Command::ReferenceProbe { pid } => return exit_code(reference::run(pid)),
    };
    let verbose = args.verbose;
    env_logger::Builder::new()
        .filter_level(if verbose {
            log::LevelFilter::Debug
        } else {
            log::LevelFilter::Warn
        })
        // aya warns (with a BTF dump) that the kernel rejects the object's BTF: aya-log's
        // globals carry type names the kernel refuses. The programs load and run without
        // it; the noise is only useful when debugging the loader.
        .filter_module(
            "aya",
            if verbose {
                log::LevelFilter::Debug
            } else {
                log::LevelFilter::Error
            },
        )
        .format_target(false)
        .format_timestamp(None)
        .init();
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
