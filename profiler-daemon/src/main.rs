//! The `profiler` binary: parse the command line, set up logging, run, map errors to an exit
//! code. Everything else lives in the library.

use std::process::ExitCode;

use clap::Parser;
use profiler_daemon::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let result = match &cli.command {
        Command::Snapshot(args) => profiler_daemon::snapshot::run(args).map(|_| ()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", error_chain(&err));
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr, without colour unless stderr is a terminal; `RUST_LOG` overrides the
/// default level (warn).
fn init_tracing() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// The error and its sources, joined with ": ".
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
