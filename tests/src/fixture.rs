//! Fixture programs: built from `tests/fixtures/` into `<target>/fixtures/` on first use (and
//! again whenever the source is newer than the binary), and run behind a guard that kills and
//! reaps them on drop so a failing test never leaves a spinning process behind.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};

/// The C compiler flags every C fixture is built with: frame pointers everywhere (leaf
/// functions included), no inlining and no tail calls, so each function is its own frame.
const CFLAGS: &[&str] = &[
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-fno-optimize-sibling-calls",
    "-fno-inline",
];

/// The Rust fixture flags. `opt-level=1` keeps `#[inline(never)]` functions as real frames.
const RUSTFLAGS: &[&str] = &[
    "-C",
    "opt-level=1",
    "-C",
    "force-frame-pointers=yes",
    "-g",
    "--edition",
    "2021",
];

/// The fixture programs. Each takes its run time in seconds as argv[1] and prints `ready`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FixtureKind {
    /// `cpu_split.c`: main → work_loop → hot_a (75% of CPU time) / hot_b (25%).
    CpuSplitC,
    /// `cpu_split.rs`: the same in Rust, crate `cpu_split_rs`.
    CpuSplitRust,
    /// `syscall_heavy.c`: main → kernel_work → read(2) of /dev/zero; mostly kernel time.
    SyscallHeavy,
}

impl FixtureKind {
    /// The binary's file name, which is also the process comm (all are < 16 bytes).
    pub fn comm(self) -> &'static str {
        match self {
            Self::CpuSplitC => "cpu_split",
            Self::CpuSplitRust => "cpu_split_rs",
            Self::SyscallHeavy => "syscall_heavy",
        }
    }

    fn source_name(self) -> &'static str {
        match self {
            Self::CpuSplitC => "cpu_split.c",
            Self::CpuSplitRust => "cpu_split.rs",
            Self::SyscallHeavy => "syscall_heavy.c",
        }
    }

    /// Builds the fixture if it is missing or older than its source; returns the binary path.
    pub fn build(self) -> PathBuf {
        let source = crate::workspace_root()
            .join("tests/fixtures")
            .join(self.source_name());
        let out_dir = crate::target_dir().join("fixtures");
        let binary = out_dir.join(self.comm());
        if is_fresh(&binary, &source) {
            return binary;
        }
        std::fs::create_dir_all(&out_dir)
            .unwrap_or_else(|e| panic!("failed to create {}: {e}", out_dir.display()));
        // Build under a temporary name and rename, so an interrupted build never leaves a
        // truncated binary that looks fresh.
        let partial = out_dir.join(format!("{}.partial-{}", self.comm(), std::process::id()));
        let mut cmd = self.compiler_command(&source, &partial);
        let output = cmd.output().unwrap_or_else(|e| {
            panic!("failed to run {cmd:?} (is it installed? cargo xtask setup installs it): {e}")
        });
        assert!(
            output.status.success(),
            "failed to build fixture {}: {cmd:?} exited with {}\n{}",
            source.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::rename(&partial, &binary)
            .unwrap_or_else(|e| panic!("failed to move {} into place: {e}", partial.display()));
        binary
    }

    fn compiler_command(self, source: &Path, output: &Path) -> Command {
        let mut cmd;
        if self == Self::CpuSplitRust {
            cmd = Command::new("rustc");
            cmd.args(RUSTFLAGS).args(["--crate-name", self.comm()]);
        } else {
            cmd = Command::new("gcc");
            cmd.args(CFLAGS);
        }
        cmd.arg("-o").arg(output).arg(source);
        cmd
    }
}

fn is_fresh(binary: &Path, source: &Path) -> bool {
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified());
    match (mtime(binary), mtime(source)) {
        (Ok(built), Ok(written)) => built >= written,
        _ => false,
    }
}

/// A running fixture. Dropping it kills the process (SIGKILL) and reaps it.
pub struct Fixture {
    kind: FixtureKind,
    child: Child,
    /// Kept open so the fixture never sees a closed stdout.
    _stdout: BufReader<ChildStdout>,
    reaped: bool,
}

impl Fixture {
    /// Builds (if needed) and starts `kind` to run for `seconds`, and returns once it has
    /// printed `ready`, i.e. once it is executing its own code.
    pub fn spawn(kind: FixtureKind, seconds: u32) -> Self {
        let binary = kind.build();
        let mut child = Command::new(&binary)
            .arg(seconds.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start fixture {}: {e}", binary.display()));
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let mut line = String::new();
        let read = stdout.read_line(&mut line);
        let fixture = Self {
            kind,
            child,
            _stdout: stdout,
            reaped: false,
        };
        assert!(
            matches!(read, Ok(n) if n > 0) && line.trim() == "ready",
            "fixture {} did not print `ready` (read {read:?}, got {line:?})",
            kind.comm()
        );
        fixture
    }

    /// The fixture's pid (its only thread's tid too).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The fixture's process name, as the profiler names its output directory.
    pub fn comm(&self) -> &'static str {
        self.kind.comm()
    }

    /// Waits for the fixture to exit by itself and reaps it.
    pub fn wait(&mut self) -> ExitStatus {
        let status = self.child.wait().expect("failed to wait for fixture");
        self.reaped = true;
        status
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // Either may fail if the fixture already exited; the wait still reaps it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
