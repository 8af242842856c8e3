//! `cargo xtask protos [--check]`: regenerates the daemon's vendored prost code from its
//! vendored `.proto` files, or with `--check` fails if the checked-in code is not current.
//!
//! The generator is `xtask/protos`, a package with a workspace of its own (the root
//! Cargo.toml says why); this only runs it with the cargo that runs us, in our target dir.

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::workspace;

/// The generator's manifest, from the workspace root.
const MANIFEST: &str = "xtask/protos/Cargo.toml";

/// Runs the generator; its exit code is ours.
pub fn run(check: bool) -> Result<ExitCode> {
    let mut cmd = crate::builds::outside_workspace("run");
    // Its own workspace would put its build in xtask/protos/target; ours keeps it with the rest.
    cmd.env("CARGO_TARGET_DIR", workspace::target_dir());
    cmd.args(["--quiet", "--manifest-path", MANIFEST, "--"]);
    if check {
        cmd.arg("--check");
    }
    workspace::stage(&workspace::shell_line(&cmd));
    let status = cmd.status().context("failed to run the proto generator (xtask/protos)")?;
    Ok(workspace::exit_code(status))
}
