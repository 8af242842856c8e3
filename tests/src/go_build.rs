//! The Go fixture `tests/fixtures/go_split.go` built the ways Go programs are shipped (plain,
//! `-ldflags=-s -w`, `-buildmode=pie`, and with cgo, its `go_split_cgo.go` beside it), and the
//! labels fixture `go_labels.go` (static, and cgo linked externally), into a test's scratch
//! directory, and run behind a guard that kills and reaps it on drop (both take the same
//! arguments and print the same lines).
//!
//! Builds need no module proxy and no home directory: GOPATH mode (`GO111MODULE=off`, the
//! fixture uses the standard library only) with `GOCACHE` and `GOPATH` under the scratch
//! directory.
//!
//! The Go toolchain is a [`Toolchain`]: the machine's `go` (Debian's 1.19 on the test
//! machines), or one of [`FETCHED_VERSIONS`], which `cargo xtask setup --for-test` (run by
//! `cargo xtask test`) fetches into `<target>/go-toolchains/go-1.2x/`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use crate::go_pprof::INSTALL_GO;

/// The Go versions the test set-up fetches (xtask/src/setup/go_toolchains.rs's list).
pub const FETCHED_VERSIONS: [&str; 4] = ["1.21", "1.22", "1.23", "1.24"];

/// A Go toolchain to build fixtures with.
#[derive(Clone, Debug)]
pub struct Toolchain {
    /// `machine` or the fetched version (`1.22`), for messages.
    pub name: String,
    /// Its `go` command.
    pub go: PathBuf,
    /// A build cache kept across tests (fetched toolchains: their standard library is built
    /// once), or `None` for a cache in each test's scratch directory.
    cache: Option<PathBuf>,
}

impl Toolchain {
    /// The machine's `go`, on PATH.
    pub fn machine() -> Self {
        Toolchain { name: "machine".into(), go: PathBuf::from("go"), cache: None }
    }

    /// A fetched toolchain (`1.21`); panics with what to run when it is not there.
    pub fn fetched(version: &str) -> Self {
        let root = crate::target_dir().join("go-toolchains");
        let dir = root.join(format!("go-{version}"));
        let go = dir.join(format!("usr/lib/go-{version}/bin/go"));
        assert!(
            dir.join(".complete").exists() && go.exists(),
            "the Go {version} toolchain is not at {}: run `cargo xtask setup --for-test` (as `cargo xtask test` \
             does), which fetches it from deb.debian.org",
            dir.display()
        );
        Toolchain { name: version.to_string(), go, cache: Some(root.join("gocache")) }
    }

    /// `go` with the environment every build here uses: no module proxy, no toolchain switch.
    pub fn command(&self, scratch: &Path) -> Command {
        let mut cmd = Command::new(&self.go);
        cmd.env("GO111MODULE", "off")
            .env("GOPROXY", "off")
            .env("GOTOOLCHAIN", "local")
            .env("GOCACHE", self.cache.clone().unwrap_or_else(|| scratch.join("gocache")))
            .env("GOPATH", scratch.join("gopath"));
        cmd
    }
}

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
    /// The cgo build with `-ldflags=-s -w`: its C function, and asmcgocall, have no symbol.
    CgoStripped,
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
            Self::CgoStripped => "gosplit-cgo-s",
        }
    }

    /// Whether C code is linked in (`go_split_cgo.go`).
    pub fn is_cgo(self) -> bool {
        matches!(self, Self::Cgo | Self::CgoStripped)
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            Self::Plain | Self::Cgo => &[],
            Self::Stripped | Self::CgoStripped => &["-ldflags=-s -w"],
            Self::Pie => &["-buildmode=pie"],
        }
    }

    /// Builds the fixture into `scratch` with the machine's Go; see [`GoBuild::build_with`].
    pub fn build(self, scratch: &Path) -> PathBuf {
        self.build_with(&Toolchain::machine(), scratch)
    }

    /// Builds the fixture into `scratch` (sources copied to a directory of their own) with
    /// `toolchain`; returns the binary. Panics with what to do when Go is missing or the
    /// build fails.
    pub fn build_with(self, toolchain: &Toolchain, scratch: &Path) -> PathBuf {
        let mut sources = vec!["go_split.go"];
        if self.is_cgo() {
            sources.push("go_split_cgo.go");
        }
        go_build(toolchain, scratch, self.comm(), &sources, self.flags(), self.is_cgo())
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

    /// Builds the fixture into `scratch` with the machine's Go; returns the binary.
    pub fn build(self, scratch: &Path) -> PathBuf {
        self.build_with(&Toolchain::machine(), scratch)
    }

    /// Builds the fixture into `scratch` with `toolchain`; returns the binary.
    pub fn build_with(self, toolchain: &Toolchain, scratch: &Path) -> PathBuf {
        match self {
            Self::Plain => go_build(toolchain, scratch, self.comm(), &["go_labels.go"], &[], false),
            Self::Cgo => go_build(
                toolchain,
                scratch,
                self.comm(),
                &["go_labels.go", "go_labels_cgo.go"],
                &["-ldflags=-linkmode=external"],
                true,
            ),
        }
    }
}

/// `go build FLAGS` with `toolchain` of the fixtures `sources` (copied to a directory of
/// their own in `scratch`) into `scratch/NAME`; returns the binary. Panics with what to do
/// when Go is missing or the build fails.
fn go_build(toolchain: &Toolchain, scratch: &Path, name: &str, sources: &[&str], flags: &[&str], cgo: bool) -> PathBuf {
    let fixtures = crate::workspace_root().join("tests/fixtures");
    let src = scratch.join(format!("src-{name}"));
    std::fs::create_dir_all(&src).unwrap_or_else(|e| panic!("failed to create {}: {e}", src.display()));
    for source in sources {
        std::fs::copy(fixtures.join(source), src.join(source))
            .unwrap_or_else(|e| panic!("failed to copy {source} into {}: {e}", src.display()));
    }
    let binary = scratch.join(name);
    let mut cmd = toolchain.command(scratch);
    cmd.arg("build")
        .args(flags)
        .arg("-o")
        .arg(&binary)
        .arg(".")
        .current_dir(&src)
        .env("CGO_ENABLED", if cgo { "1" } else { "0" });
    if Command::new(&toolchain.go).arg("version").output().is_err() {
        panic!("`{}` cannot be run: {INSTALL_GO}", toolchain.go.display());
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
