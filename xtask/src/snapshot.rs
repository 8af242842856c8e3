//! `cargo xtask snapshot [ARGS…]`, the README's run command: setup, release build, then the
//! profiler itself with `snapshot --output <workspace>/profiles ARGS…`.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result};

use crate::workspace;

/// Never returns on success: the profiler replaces this process, so its exit code is ours
/// and Ctrl-C reaches it alone (it needs the chance to write the profile before exiting).
pub fn run(args: &[String]) -> Result<ExitCode> {
    crate::setup::prepare(false)?;
    let mut cmd = Command::new(workspace::profiler_bin());
    cmd.arg("snapshot");
    if !has_output(args) {
        // Anchored at the root (where .gitignore lists /profiles), not the caller's cwd.
        cmd.arg("--output").arg(workspace::root().join("profiles"));
    }
    cmd.args(args);
    workspace::stage(&workspace::shell_line(&cmd));
    let err = cmd.exec();
    Err(err).with_context(|| format!("failed to exec {}", workspace::profiler_bin().display()))
}

fn has_output(args: &[String]) -> bool {
    args.iter().any(|a| a == "--output" || a.starts_with("--output="))
}
