//! `cargo xtask setup`: checks, and where it can installs, what building and running the
//! profiler needs.
//!
//! Idempotent: every item is probed first and only acted on when missing. Prints one line per
//! item (`ok:`, `installed:`, `missing: … (run: …)`, or `warning:` for optional items) and
//! fails when a required item is still missing. It never updates the nightly toolchain: a
//! newer nightly ships LLVM 23, which bpf-linker built for LLVM 22 cannot link.

mod apt;
mod go_toolchains;
mod python;
mod system;
mod toolchain;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Result};

use crate::workspace;

/// What the calling command needs on top of the build tools.
#[derive(Clone, Copy, Debug)]
pub struct Needs {
    /// `go tool pprof`, which the end-to-end tests use as the reference pprof reader.
    pub go: bool,
    /// The benches' peers and floors: `perf`, `bpftrace`, `eu-stack`.
    pub bench: bool,
    /// Root or CAP_BPF+CAP_PERFMON+CAP_SYS_ADMIN; a warning when false, an error when true.
    pub privileges: bool,
}

/// The outcome of one item; `Missing` carries the exact command that fixes it.
pub enum Status {
    Ok(String),
    Installed(String),
    Missing { what: String, fix: String },
    Warning(String),
}

impl Status {
    fn print(&self) {
        match self {
            Status::Ok(what) => println!("ok: {what}"),
            Status::Installed(what) => println!("installed: {what}"),
            Status::Missing { what, fix } => println!("missing: {what} (run: {fix})"),
            Status::Warning(what) => println!("warning: {what}"),
        }
    }
}

/// Facts about the machine that decide whether we may install or only advise.
pub struct Host {
    /// Effective uid 0: needed for apt-get and mount.
    pub root: bool,
    /// `apt-get` is on PATH, i.e. a Debian-like system we know how to install on.
    pub apt: bool,
}

impl Host {
    fn detect() -> Host {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        Host { root, apt: which("apt-get").is_some() }
    }

    /// Prefix for commands we print for the user: `sudo ` unless already root.
    pub fn sudo(&self) -> &'static str {
        if self.root {
            ""
        } else {
            "sudo "
        }
    }
}

/// Prints each item as soon as it is decided (a bpf-linker build takes minutes) and counts
/// the required ones still missing.
#[derive(Default)]
pub struct Report {
    missing: usize,
}

impl Report {
    pub fn add(&mut self, status: Status) {
        status.print();
        self.missing += matches!(status, Status::Missing { .. }) as usize;
    }
}

/// Runs every check in dependency order (apt before the bpf-linker build that needs LLVM).
pub fn run(needs: Needs) -> Result<()> {
    let host = Host::detect();
    let mut report = Report::default();
    report.add(system::privileges(&host, needs.privileges));
    apt::check(&host, &apt::packages(needs.go, needs.bench), &mut report);
    toolchain::check(&mut report);
    if needs.go {
        // The test command checks formatting and lints first.
        toolchain::lint_tools(&mut report);
        python::check(&host, &mut report);
        go_toolchains::check(&mut report);
    }
    system::mounts(&host, &mut report);
    let missing = report.missing;
    if missing > 0 {
        bail!("{missing} required item(s) missing: run the command(s) printed above, then `cargo xtask setup` again");
    }
    Ok(())
}

/// The set-up every command starts with: check or install the toolchain and system
/// (`go` adds golang-go for the tests), then build the release binary.
pub fn prepare(go: bool) -> anyhow::Result<()> {
    if go {
        workspace::stage("setup (including golang-go and Go 1.21-1.24 toolchains for the end-to-end tests)");
    } else {
        workspace::stage("setup");
    }
    run(Needs { go, bench: false, privileges: true })?;
    crate::builds::build_release()
}

/// [`prepare`] for a bench: also installs what its peers and floors run (perf, bpftrace,
/// eu-stack), so a fresh machine's figures are not `n/a`.
pub fn prepare_bench() -> anyhow::Result<()> {
    workspace::stage("setup (including the benches' peers: perf, bpftrace, eu-stack)");
    run(Needs { go: false, bench: true, privileges: true })?;
    crate::builds::build_release()
}

/// Finds `program` on PATH, like `command -v`.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs a probe command and returns its stdout when it succeeds; `None` if absent or failing.
pub fn probe(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
