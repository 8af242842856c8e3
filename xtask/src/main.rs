//! Developer orchestration for the profiler: `cargo xtask setup | snapshot | test | protos | bench`.
//!
//! Each subcommand lives in its own module; this file only parses and maps errors to an exit
//! code once.

mod bench;
mod builds;
mod cli;
mod protos;
mod setup;
mod snapshot;
mod test;
mod workspace;

use std::process::ExitCode;

use clap::Parser;

use cli::Cli;

fn main() -> ExitCode {
    let result = match Cli::parse() {
        Cli::Setup { for_test } => {
            setup::run(setup::Needs { go: for_test, bench: false, privileges: false }).map(|()| ExitCode::SUCCESS)
        }
        Cli::Snapshot { args } => snapshot::run(&args),
        Cli::Test { unit, tests, args } => test::run(unit, &tests, &args),
        Cli::Protos { check } => protos::run(check),
        Cli::Bench(bench) => bench::run(bench),
    };
    result.unwrap_or_else(|err| {
        eprintln!("error: {err:#}");
        ExitCode::FAILURE
    })
}
