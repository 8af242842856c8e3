//! `cargo xtask test [ARGS…]`, the README's test command: setup (with `go tool pprof`), the
//! release build, then every test in the workspace against the release `profiler` binary.

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::workspace;

/// ARGS go to the test harness (after `--`), e.g. a test name filter.
pub fn run(args: &[String]) -> Result<ExitCode> {
    workspace::prepare(true)?;
    let mut cmd = workspace::cargo();
    cmd.args(["test", "--release", "--workspace", "--exclude", "profiler-ebpf", "--"])
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
