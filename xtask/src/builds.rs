//! The cargo invocations xtask runs that compile the workspace (`build`, `clippy`, `test`),
//! made in one place so that they share one profile, one feature set and one environment with
//! each other and with a developer's own `cargo build --release`.
//!
//! Cargo keeps one artifact per package, profile, feature set and flags, and rebuilds it when
//! an input it tracks changes. Two invocations that differ in any of these either build a
//! second daemon and eBPF object (features, profile: about 3 minutes here) or rebuild the same
//! one back and forth at every switch (a tracked environment variable). So every invocation:
//! - is `--release`: the binary, the lints and the tests alike;
//! - passes no `--features`, `--profile`, `--config` or `-Z`: the manifests give the one
//!   feature set (see `proptest` in the root Cargo.toml and `which` in profiler-ebpf's);
//! - sets no environment, and drops the package variables `cargo run` gave xtask
//!   ([`is_package_var`]), which a plain shell's cargo would not see.
//!
//! Arguments for the tool cargo runs (after `--`) are the callers'.

use anyhow::{bail, Context, Result};
use std::ffi::OsStr;
use std::process::Command;

use crate::workspace;

/// `cargo build --release`: the `profiler` binary (and, through its build script, the eBPF
/// object), exactly as the README tells a developer to build it.
pub fn build() -> Command {
    release("build")
}

/// `cargo build --release` at the root: builds `profiler`, whose build script builds the
/// eBPF object with nightly.
pub fn build_release() -> Result<()> {
    workspace::stage("cargo build --release");
    let status = build().status().context("failed to run cargo")?;
    if !status.success() {
        bail!("cargo build --release failed ({status}); fix the build errors above, or run `cargo xtask setup` if a tool is missing");
    }
    let bin = workspace::target_dir().join("release/profiler");
    if !bin.is_file() {
        bail!("cargo build --release did not produce {}", bin.display());
    }
    Ok(())
}

/// `cargo clippy --release --workspace --all-targets`: release, so that the dependencies'
/// build scripts and proc-macros it compiles are the build's own. The daemon's build script
/// is the exception: cargo counts clippy-driver (the workspace wrapper) in a workspace
/// member's units, so clippy runs it in an `OUT_DIR` of its own and builds the eBPF object
/// there too (about 10 s); the release build's copy is left alone.
pub fn clippy() -> Command {
    let mut cmd = release("clippy");
    cmd.args(["--workspace", "--all-targets"]);
    cmd
}

/// `cargo test --release --no-run` over the workspace, with cargo's JSON messages on stdout
/// to find the test executables: all of them, or only the test targets named in `only`
/// (`--test NAME` each; cargo lists the names there are when one is not).
pub fn test_binaries(only: &[String]) -> Command {
    let mut cmd = release("test");
    cmd.args(["--no-run", "--message-format=json-render-diagnostics"]).args(WORKSPACE);
    for name in only {
        cmd.args(["--test", name]);
    }
    cmd
}

/// `cargo test --release` of every crate's library and binaries (the unit tier).
pub fn unit_tests() -> Command {
    let mut cmd = release("test");
    cmd.args(WORKSPACE).args(["--lib", "--bins"]);
    cmd
}

/// `cargo test --release --doc` of the workspace.
pub fn doc_tests() -> Command {
    let mut cmd = release("test");
    cmd.arg("--doc").args(WORKSPACE);
    cmd
}

/// The packages tests cover: all but the kernel crate, which builds only for BPF.
const WORKSPACE: [&str; 3] = ["--workspace", "--exclude", "profiler-ebpf"];

/// `cargo SUBCOMMAND --release` at the workspace root, in the environment the caller of
/// `cargo xtask` had.
fn release(subcommand: &str) -> Command {
    let mut cmd = callers_cargo();
    cmd.args([subcommand, "--release"]);
    cmd
}

/// `cargo SUBCOMMAND` for a package with a workspace of its own (the caller adds its
/// `--manifest-path`), in the caller's environment like [`release`]. A debug build: it shares
/// no artifact with the workspace's builds (it has its own lock file), and builds quicker.
pub fn outside_workspace(subcommand: &str) -> Command {
    let mut cmd = callers_cargo();
    cmd.arg(subcommand);
    cmd
}

/// Cargo at the workspace root, in the environment the caller of `cargo xtask` had.
fn callers_cargo() -> Command {
    let mut cmd = workspace::cargo();
    for (name, _) in std::env::vars_os() {
        if is_package_var(&name) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// Whether `name` is one of the variables cargo sets for the package it runs (`cargo run`
/// sets them for xtask: `CARGO_MANIFEST_DIR=…/xtask`, `CARGO_PKG_NAME=xtask`, …). A nested
/// cargo passes them on to every build script, and ring's declares
/// `rerun-if-env-changed=CARGO_MANIFEST_DIR` (and `CARGO_PKG_NAME`, `CARGO_PKG_VERSION_*`):
/// inherited, they re-ran it, and so rebuilt ring, rustls, the daemon and `profiler`, after
/// every switch between `cargo build --release` and `cargo xtask …`. None of them is a cargo
/// setting, so a developer's own `CARGO_PROFILE_*`, `CARGO_BUILD_*` or `RUSTFLAGS` still apply.
fn is_package_var(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else { return false };
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || matches!(
            name,
            "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR" | "OUT_DIR"
        )
}

#[cfg(test)]
mod tests;
