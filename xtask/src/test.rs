//! `cargo xtask test [ARGS…]`, the README's test command: setup (with `go tool pprof`), the
//! format and lint checks, the release build, then every test in the workspace against the
//! release `profiler` binary.

use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};

use crate::workspace;

/// ARGS go to the test harness (after `--`), e.g. a test name filter.
pub fn run(args: &[String]) -> Result<ExitCode> {
    workspace::prepare(true)?;
    check(
        "cargo fmt --all -- --check",
        workspace::cargo().args(["fmt", "--all", "--", "--check"]),
        "run `cargo fmt --all`",
    )?;
    // Release, like the build above, so the lints reuse its dependencies' metadata where they can.
    check(
        "cargo clippy --workspace --all-targets -- -D warnings",
        workspace::cargo().args(["clippy", "--release", "--workspace", "--all-targets", "--", "-D", "warnings"]),
        "fix the lints above",
    )?;
    let mut cmd = workspace::cargo();
    cmd.args(["test", "--release", "--no-fail-fast", "--workspace", "--exclude", "profiler-ebpf", "--"])
        // The end-to-end tests share the kernel (perf events, tracefs) and each profiles
        // system-wide, so running them in parallel would let them see each other.
        .arg("--test-threads=1")
        .args(args)
        .env("PROFILER_BIN", workspace::profiler_bin());
    workspace::stage(&workspace::shell_line(&cmd));
    let status = cmd.status().context("failed to run cargo test")?;
    if !status.success() {
        eprintln!("error: tests failed ({status}); rerun one with `cargo xtask test <name>`");
    }
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
