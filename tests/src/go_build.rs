//! The Go fixture `tests/fixtures/go_split.go` built the ways Go programs are shipped (plain,
//! `-ldflags=-s -w`, `-buildmode=pie`, and with cgo, its `go_split_cgo.go` beside it), and the
//! labels fixture `go_labels.go` (static, and cgo linked externally), into a test's scratch
//! directory, and run behind a guard that kills and reaps it on drop (both take the same
//! arguments and print the same lines).
//!
//! Builds need no module proxy and no home directory: GOPATH mode (`GO111MODULE=off`, the
//! fixture uses the standard library only) with `GOCACHE` and `GOPATH` under the scratch
//! directory.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use crate::go_pprof::INSTALL_GO;

/// How the fixture is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoBuild {
    Plain,
    /// `-ldflags=-s -w`: no symbol table, no DWARF.
    Stripped,
    /// `-buildmode=pie`.
    Pie,
    /// cgo on, with `go_split_cgo.go`: main.hotB's work is the C function `c_spin_b`.
    Cgo,
}

/// A `go build` gets this long (a cold cache compiles runtime/cgo).
const BUILD_TIMEOUT: Duration = Duration::from_secs(300);

impl GoBuild {
    /// The binary's name, which is the process's `comm` (15 bytes at most).
    pub fn comm(self) -> &'static str {
        match self {
            Self::Plain => "gosplit-plain",
            Self::Stripped => "gosplit-strip",
            Self::Pie => "gosplit-pie",
            Self::Cgo => "gosplit-cgo",
        }
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            Self::Plain | Self::Cgo => &[],
            Self::Stripped => &["-ldflags=-s -w"],
            Self::Pie => &["-buildmode=pie"],
        }
    }

    /// Builds the fixture into `scratch` (sources copied to a directory of their own);
    /// returns the binary. Panics with what to do when Go is missing or the build fails.
    pub fn build(self, scratch: &Path) -> PathBuf {
        let mut sources = vec!["go_split.go"];
        if self == Self::Cgo {
            sources.push("go_split_cgo.go");
        }
        go_build(scratch, self.comm(), &sources, self.flags(), self == Self::Cgo)
    }
}

/// How the labels fixture (`tests/fixtures/go_labels.go`) is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoLabelsBuild {
    /// Static, internally linked: no TLS segment, Go sets the thread pointer itself.
    Plain,
    /// cgo, linked externally, with C thread-local data beside `runtime.tlsg`
    /// (`go_labels_cgo.go`): `g` is not at Go's usual -8 from the thread pointer.
    Cgo,
}

impl GoLabelsBuild {
    /// The binary's name, which is the process's `comm`.
    pub fn comm(self) -> &'static str {
        match self {
            Self::Plain => "golabels-plain",
            Self::Cgo => "golabels-cgo",
        }
    }

    /// Builds the fixture into `scratch`; returns the binary.
    pub fn build(self, scratch: &Path) -> PathBuf {
        match self {
            Self::Plain => go_build(scratch, self.comm(), &["go_labels.go"], &[], false),
            Self::Cgo => go_build(
                scratch,
                self.comm(),
                &["go_labels.go", "go_labels_cgo.go"],
                &["-ldflags=-linkmode=external"],
                true,
            ),
        }
    }
}

/// `go build FLAGS` of the fixtures `sources` (copied to a directory of their own in
/// `scratch`) into `scratch/NAME`; returns the binary. Panics with what to do when Go is
/// missing or the build fails.
fn go_build(scratch: &Path, name: &str, sources: &[&str], flags: &[&str], cgo: bool) -> PathBuf {
    let fixtures = crate::workspace_root().join("tests/fixtures");
    let src = scratch.join(format!("src-{name}"));
    std::fs::create_dir_all(&src).unwrap_or_else(|e| panic!("failed to create {}: {e}", src.display()));
    for source in sources {
        std::fs::copy(fixtures.join(source), src.join(source))
            .unwrap_or_else(|e| panic!("failed to copy {source} into {}: {e}", src.display()));
    }
    let binary = scratch.join(name);
    let mut cmd = Command::new("go");
    cmd.arg("build")
        .args(flags)
        .arg("-o")
        .arg(&binary)
        .arg(".")
        .current_dir(&src)
        .env("GO111MODULE", "off")
        .env("GOCACHE", scratch.join("gocache"))
        .env("GOPATH", scratch.join("gopath"))
        .env("CGO_ENABLED", if cgo { "1" } else { "0" });
    if Command::new("go").arg("version").output().is_err() {
        panic!("`go` cannot be run: {INSTALL_GO}");
    }
    let output = crate::run::run_with_timeout(&mut cmd, BUILD_TIMEOUT);
    assert!(
        output.status.success(),
        "{cmd:?} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

/// The running fixture, killed and reaped on drop.
pub struct GoProcess {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl GoProcess {
    /// Starts `binary SECONDS PROFILE` and returns once it printed `ready`.
    pub fn spawn(binary: &Path, seconds: u32, profile: &Path) -> Self {
        let mut child = Command::new(binary)
            .arg(seconds.to_string())
            .arg(profile)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start {}: {e}", binary.display()));
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let mut process = Self { child, stdout };
        assert_eq!(process.line(), "ready", "{} did not start", binary.display());
        process
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the line `KEY N` and returns N.
    pub fn read_value(&mut self, key: &str) -> u64 {
        let line = self.line();
        line.strip_prefix(key)
            .and_then(|rest| rest.trim().parse().ok())
            .unwrap_or_else(|| panic!("the Go fixture printed {line:?}, not `{key} N`"))
    }

    /// Waits for the line `wanted`.
    pub fn expect_line(&mut self, wanted: &str) {
        assert_eq!(self.line(), wanted, "the Go fixture's output");
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(n) if n > 0 => line.trim().to_string(),
            read => panic!("the Go fixture ended its output ({read:?})"),
        }
    }
}

impl Drop for GoProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
