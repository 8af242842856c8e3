//! The one way the workspace's tooling compiles a C program: `gcc FLAGS -o OUTPUT SOURCE`,
//! its output captured, and on failure an error that names the command and carries gcc's
//! stderr. Used by the end-to-end fixtures (`fixture.rs`), by the tests that build a program
//! of their own, and by `cargo xtask bench`'s workloads (`xtask/src/bench/workload.rs`).
//!
//! This file is compiled into two crates: here as `profiler_tests::cc`, and into xtask as
//! `bench::cc` (`#[path = "../../tests/src/cc.rs"] mod cc;` in `xtask/src/bench.rs`). That is
//! the least bad of the homes:
//! - xtask cannot depend on `profiler-tests`: it depends on `profiler-daemon`, whose build
//!   script builds the eBPF object with nightly, and `cargo xtask setup` is what installs
//!   that toolchain;
//! - `profiler-common` is the kernel/userspace ABI crate (built for the bpf target too), not a
//!   place for a host tool;
//! - a crate of its own would be a member, a manifest and a lock entry for some 80 lines.
//!
//! So it uses `std` only (no `thiserror`, no `anyhow`: neither crate can assume the other's
//! dependencies), and everything in it is used by xtask's benches, which would otherwise warn
//! about dead code. `profiler-daemon`'s `unwind/ground_truth.rs` can include it the same way.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

/// The C compiler: what `cargo xtask setup` installs and CI has.
pub const COMPILER: &str = "gcc";

/// A C program (or another compiler's run, see [`run`]) that did not build.
#[derive(Debug)]
pub enum CompileError {
    /// The source could not be written out.
    Write { path: PathBuf, source: io::Error },
    /// The compiler could not be started: most likely it is not installed.
    Spawn { command: String, source: io::Error },
    /// The compiler ran and rejected the program.
    Failed { command: String, status: ExitStatus, stderr: String },
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Write { path, source } => write!(f, "failed to write {}: {source}", path.display()),
            Self::Spawn { command, source } => {
                write!(f, "failed to run {command} (is it installed? `cargo xtask setup` installs it): {source}")
            }
            Self::Failed { command, status, stderr } => write!(f, "{command} exited with {status}:\n{stderr}"),
        }
    }
}

impl std::error::Error for CompileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Write { source, .. } | Self::Spawn { source, .. } => Some(source),
            Self::Failed { .. } => None,
        }
    }
}

/// `gcc FLAGS -o OUTPUT SOURCE`, for a caller that adds to it before [`run`].
pub fn command(flags: &[&str], source: &Path, output: &Path) -> Command {
    let mut cmd = Command::new(COMPILER);
    cmd.args(flags).arg("-o").arg(output).arg(source);
    cmd
}

/// Runs a compiler command to completion, its output captured: gcc from [`command`], or
/// another compiler (the fixtures' rustc) so that every build reports failure the same way.
pub fn run(cmd: &mut Command) -> Result<(), CompileError> {
    let output = cmd.output().map_err(|source| CompileError::Spawn { command: format!("{cmd:?}"), source })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    Err(CompileError::Failed { command: format!("{cmd:?}"), status: output.status, stderr })
}

/// Compiles `source` with `flags` into `output`.
pub fn compile(flags: &[&str], source: &Path, output: &Path) -> Result<(), CompileError> {
    run(&mut command(flags, source, output))
}

/// Writes `text` to `dir/<name>.c` and compiles it with `flags` into `dir/<name>`; returns
/// the binary. For programs kept as text in the tool itself (xtask's `include_str!`s).
pub fn compile_text(dir: &Path, name: &str, text: &str, flags: &[&str]) -> Result<PathBuf, CompileError> {
    let (source, binary) = (dir.join(format!("{name}.c")), dir.join(name));
    std::fs::write(&source, text).map_err(|e| CompileError::Write { path: source.clone(), source: e })?;
    compile(flags, &source, &binary)?;
    Ok(binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own under the system's temporary one, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("profiler-cc-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create a scratch directory");
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The built program is the source's: it exits with the code its source computes from
    /// a flag given on the command line, so both the text and the flags reached gcc.
    #[test]
    fn compiles_the_text_with_the_flags() {
        let scratch = Scratch::new("ok");
        let text = "int main(void) { return ANSWER + 1; }\n";
        let binary = compile_text(&scratch.0, "answer", text, &["-O1", "-DANSWER=41"]).unwrap();
        assert_eq!(binary, scratch.0.join("answer"));
        let status = Command::new(&binary).status().unwrap();
        assert_eq!(status.code(), Some(42));
        assert_eq!(std::fs::read_to_string(scratch.0.join("answer.c")).unwrap(), text);
    }

    /// A program gcc rejects is an error that names the command and carries gcc's own
    /// complaint about the undeclared name.
    #[test]
    fn a_rejected_program_carries_the_compilers_stderr() {
        let scratch = Scratch::new("bad");
        let err = compile_text(&scratch.0, "bad", "int main(void) { return undeclared_name; }\n", &[]).unwrap_err();
        let CompileError::Failed { command, stderr, .. } = &err else { panic!("not a compile failure: {err}") };
        assert!(command.contains(COMPILER) && command.contains("bad.c"), "{command}");
        assert!(stderr.contains("undeclared_name"), "{stderr}");
        assert!(err.to_string().contains("undeclared_name"), "{err}");
    }

    #[test]
    fn a_missing_compiler_says_how_to_install_it() {
        let err = run(&mut Command::new("/nonexistent/cc")).unwrap_err();
        assert!(matches!(err, CompileError::Spawn { .. }), "{err}");
        assert!(err.to_string().contains("cargo xtask setup"), "{err}");
    }
}
