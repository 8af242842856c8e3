//! Where things are in the workspace and how to run cargo on it.
//!
//! Owns the paths every command shares (workspace root, target dir, the release `profiler`
//! binary) and the release build. It does not decide what to run afterwards.

use std::path::PathBuf;
use std::process::{Command, ExitCode, ExitStatus};

/// The workspace root: xtask lives one level below it.
pub fn root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().expect("xtask sits inside the workspace").to_path_buf()
}

/// Cargo's target dir, honouring `CARGO_TARGET_DIR` so we look where cargo built.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root().join(dir),
        None => root().join("target"),
    }
}

/// The `profiler` binary commands run: `PROFILER_BIN` when set (as the tests take it: another
/// build, say the one before a change, for a bench to compare), else the release build that
/// `builds::build_release` produces.
pub fn profiler_bin() -> PathBuf {
    match std::env::var_os("PROFILER_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => target_dir().join("release/profiler"),
    }
}

/// The cargo that runs us (`cargo xtask` sets `CARGO`), so nested builds use the same one.
pub fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root());
    cmd
}

/// A command as a shell line (`PROFILER_BIN=… cargo test …`), for stage banners.
pub fn shell_line(cmd: &Command) -> String {
    let envs = cmd
        .get_envs()
        .filter_map(|(key, value)| Some(format!("{}={}", key.to_string_lossy(), value?.to_string_lossy())));
    let program = std::iter::once(cmd.get_program().to_string_lossy().into_owned());
    let args = cmd.get_args().map(|arg| arg.to_string_lossy().into_owned());
    envs.chain(program).chain(args).collect::<Vec<_>>().join(" ")
}

/// Prints the stage banner so a long log shows where it is.
pub fn stage(what: &str) {
    println!("==> {what}");
}

/// Maps a child's status to our exit code; a signal death becomes 128 + signal like a shell.
pub fn exit_code(status: ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().or_else(|| status.signal().map(|sig| 128 + sig)).unwrap_or(1);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
