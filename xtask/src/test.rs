//! `cargo xtask test [--unit | --test NAME…] [ARGS…]`, the README's test command: the module
//! layering check ([`layers`]), setup (with `go tool pprof`), the format and lint checks, that
//! the generated prost code is current (`cargo xtask protos --check`), the release build, then every test in the workspace against the release `profiler` binary, one
//! test binary after another, with each binary's wall time and the slowest tests printed at the
//! end ([`timing`]).
//!
//! The tiers are selected by structure, not by test name:
//! - `--unit` is the quick tier: the unit tests of every crate (no end-to-end binaries, no
//!   root, no set-up beyond the build), in parallel;
//! - `--test NAME` (repeatable) runs only those end-to-end binaries (`tests/tests/NAME.rs`,
//!   `tests/tests/NAME/`), e.g. `--test systemd`, and no unit or doc tests.
//!
//! ARGS still go to every harness run, so a name filter (`cargo xtask test python`) works as
//! before, alone or within a `--test` selection.

mod layers;
mod timing;

use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};

use crate::workspace;

/// `only`: the end-to-end binaries to run (none: every test binary). ARGS go to the test
/// harness (after `--`), e.g. a test name filter.
pub fn run(unit: bool, only: &[String], args: &[String]) -> Result<ExitCode> {
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
    if crate::protos::run(true)? != ExitCode::SUCCESS {
        bail!("the generated prost code is not current; run `cargo xtask protos` and commit the result");
    }
    let binaries = timing::test_binaries(only)?;
    // The end-to-end tests share the kernel (perf events, tracefs) and each profiles
    // system-wide, so running them in parallel would let them see each other.
    let mut harness = vec!["--test-threads=1".to_string()];
    harness.extend(args.iter().cloned());
    let envs = [("PROFILER_BIN", workspace::profiler_bin())];
    let report = timing::run_all(&binaries, &harness, &envs, only.is_empty())?;
    report.print();
    if report.failed_binaries() > 0 {
        eprintln!("error: tests failed; rerun one with `cargo xtask test --test BINARY <name>`");
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
