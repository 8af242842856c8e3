//! Where profiles go on disk: `DIR/<name>-<pid>/<type>.pb.gz`, written atomically (a
//! temporary file in the same directory, made durable, then renamed) so no reader sees a
//! partial file, even after a crash. One file is [`write_atomic`]; a dump's many files are a
//! [`StagedFiles`], made durable together.
//!
//! The output directory `DIR` is trusted as configured (a symbolic link in its path is the
//! operator's choice). Below it, the daemon trusts nothing it did not create itself: it
//! opens `DIR` once, then creates and opens each component below it relative to the open
//! directory (`mkdirat`, `openat` with `O_NOFOLLOW`), so a symbolic link planted at a
//! process directory or at a file name (e.g. `DIR/bash-1234 -> /etc` in a shared
//! directory) is refused, never followed. Temporary names are random and created with
//! `O_CREAT|O_EXCL`, so nobody can plant one in advance. Modes are explicit, not left to
//! the umask: directories [`DIR_MODE`], files [`FILE_MODE`] (a stricter umask narrows them
//! further).
//!
//! The names and single writes are here; [`staged`] owns a dump's [`StagedFiles`], and [`at`]
//! the calls relative to an open directory that both use (no symbolic link below `DIR` followed,
//! random temporary names, explicit modes).

mod at;
mod staged;
#[cfg(test)]
mod tests;

use std::{ffi::OsStr, os::unix::io::AsFd, path::Path};

use self::at::{create_temp, install, open_parent, open_root, unlink_at, write_temp};
pub use self::staged::{Committed, StagedFiles, STAGED_MAX_OPEN};
use crate::error::{Error, Result};

/// The mode of every directory the daemon creates for profiles: owner and group may list
/// it, nobody else (profiles name every process's functions, executables and units).
pub const DIR_MODE: u32 = 0o750;
/// The mode of every profile file: owner writes, group reads, nobody else.
pub const FILE_MODE: u32 = 0o640;

/// The directory name of a process: its name (with `/`, whitespace and control characters
/// replaced by `_`) and its pid.
pub fn process_dir_name(name: &str, pid: u32) -> String {
    let clean: String =
        name.chars().map(|c| if c == '/' || c.is_whitespace() || c.is_control() { '_' } else { c }).collect();
    let clean = if clean.is_empty() || clean == "." || clean == ".." { "unknown".into() } else { clean };
    format!("{clean}-{pid}")
}

/// The directory `path` is written in, as [`write_atomic`]'s trusted root when a single
/// file is named on the command line: its parent, or `.` for a bare file name.
pub fn parent_dir(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Creates `dir` if needed (mode [`DIR_MODE`]) and proves it is writable by creating and
/// removing a file.
pub fn ensure_writable_dir(dir: &Path) -> Result<()> {
    let fail = |cause| Error::OutputDir { path: dir.to_path_buf(), cause };
    let root = open_root(dir).map_err(fail)?;
    let (_, probe) = create_temp(root.as_fd(), OsStr::new("profiler-probe"), dir).map_err(fail)?;
    unlink_at(root.as_fd(), &probe).map_err(fail)
}

/// Writes `bytes` to `path` atomically, creating the directories between `root` (trusted,
/// created if missing) and `path`, which must lie below `root`.
pub fn write_atomic(root: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let fail = |cause| Error::Write { path: path.to_path_buf(), cause };
    let (dir, name) = open_parent(root, path).map_err(fail)?;
    let (file, tmp) = write_temp(dir.as_fd(), name, path, bytes).map_err(fail)?;
    let result = file.sync_all().and_then(|()| install(dir.as_fd(), &tmp, name, path));
    if result.is_err() {
        let _ = unlink_at(dir.as_fd(), &tmp);
    }
    result.map_err(fail)
}

/// `SystemTime` as a compact UTC timestamp for file names: `20261201T071500Z`.
pub fn utc_timestamp(time: std::time::SystemTime) -> String {
    let secs = time.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's algorithm; no date library needed for one conversion).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}
