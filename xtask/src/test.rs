//! `cargo xtask test [--unit] [ARGS…]`, the README's test command: the module layering check
//! ([`layers`]), setup (with `go tool pprof`), the format and lint checks, the release build,
//! then every test in the workspace against the release `profiler` binary, one test binary
//! after another, with each binary's wall time and the slowest tests printed at the end
//! ([`timing`]).
//!
//! `--unit` is the quick tier: the unit tests of every crate (no end-to-end binaries, no
//! root, no set-up beyond the build), in parallel.

mod layers;
mod timing;

use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};

use crate::workspace;

/// ARGS go to the test harness (after `--`), e.g. a test name filter.
pub fn run(unit: bool, args: &[String]) -> Result<ExitCode> {
    // First: it reads the sources only, so a cycle fails in a second, before any build.
    workspace::stage("module layers: no import cycle between a crate's top-level modules; size limits");
    layers::check(&workspace::root())?;
    if unit {
        return run_unit(args);
    }
    crate::setup::prepare(true)?;
    check(
        "cargo fmt --all -- --check",
        workspace::cargo().args(["fmt", "--all", "--", "--check"]),
        "run `cargo fmt --all`",
    )?;
    check(
        "cargo clippy --workspace --all-targets -- -D warnings",
        crate::builds::clippy().args(["--", "-D", "warnings"]),
        "fix the lints above",
    )?;
    let binaries = timing::test_binaries()?;
    // The end-to-end tests share the kernel (perf events, tracefs) and each profiles
    // system-wide, so running them in parallel would let them see each other.
    let mut harness = vec!["--test-threads=1".to_string()];
    harness.extend(args.iter().cloned());
    let report = timing::run_all(&binaries, &harness, &[("PROFILER_BIN", workspace::profiler_bin())])?;
    report.print();
    if report.failed_binaries() > 0 {
        eprintln!("error: tests failed; rerun one with `cargo xtask test <name>`");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The unit tier: every crate's library and binary tests, in parallel, as whoever runs it.
fn run_unit(args: &[String]) -> Result<ExitCode> {
    workspace::stage("unit tests (no set-up, no root; end-to-end binaries left out)");
    let mut cmd = crate::builds::unit_tests();
    cmd.arg("--");
    cmd.args(args);
    workspace::stage(&workspace::shell_line(&cmd));
    let status = cmd.status().context("failed to run cargo test")?;
    Ok(workspace::exit_code(status))
}

/// Runs one check stage; fails with `fix` as the advice.
fn check(what: &str, cmd: &mut Command, fix: &str) -> Result<()> {
    workspace::stage(what);
    let status = cmd.status().with_context(|| format!("failed to run {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status}); {fix}");
    }
    Ok(())
}
