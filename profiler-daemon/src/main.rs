//! The `profiler` binary: parse the command line, set up logging, run, map errors to an exit
//! code. Everything else lives in the library.

use std::process::ExitCode;

use clap::Parser;
use profiler_daemon::{
    cli::{Cli, Command},
    error::chain,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(matches!(cli.command, Command::Run(_)));
    // Before any file is mapped: a file truncated under a mapping must not kill us.
    if let Err(err) = profiler_daemon::sigbus::install() {
        tracing::warn!(
            "cannot install the SIGBUS handler ({err}); a file truncated while it is read will end the process"
        );
    }
    let result: Result<(), Box<dyn std::error::Error>> = match &cli.command {
        Command::Snapshot(args) => profiler_daemon::snapshot::run(args).map(|_| ()).map_err(Into::into),
        Command::Run(args) => profiler_daemon::daemon::run(args).map_err(Into::into),
        Command::CheckConfig(args) => print(profiler_daemon::config::check(&args.file)),
        Command::Status(args) => print(profiler_daemon::client::status(&args.socket, args.json)),
        Command::Ps(args) => print(profiler_daemon::client::ps(&args.socket, args.json)),
        Command::Flamegraph(args) => {
            print(profiler_daemon::flame::draw_file(&args.file, args.sample_index.as_deref(), args.output.as_deref()))
        }
        Command::UnwindTable(args) => print(profiler_daemon::unwind::report(&args.files)),
        Command::Threads(args) => profiler_daemon::threads_cmd::run(args).map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", chain(&*err));
            ExitCode::FAILURE
        }
    }
}

/// Prints a command's text result.
fn print<E: std::error::Error + 'static>(result: Result<String, E>) -> Result<(), Box<dyn std::error::Error>> {
    let text = result?;
    print!("{text}");
    if !text.ends_with('\n') {
        println!();
    }
    Ok(())
}

/// Logs to stderr, without colour unless stderr is a terminal (journald-friendly);
/// `RUST_LOG` overrides the default level (info for the daemon, warn otherwise).
fn init_tracing(daemon: bool) {
    use std::io::IsTerminal;
    let default = if daemon { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
