//! Where profiles go on disk: `DIR/<name>-<pid>/<type>.pb.gz`, written atomically (a
//! temporary file in the same directory, fsync, rename) so no reader sees a partial file.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use crate::error::{Error, Result};

/// The directory name of a process: its name (with `/`, whitespace and control characters
/// replaced by `_`) and its pid.
pub fn process_dir_name(name: &str, pid: u32) -> String {
    let clean: String = name
        .chars()
        .map(|c| if c == '/' || c.is_whitespace() || c.is_control() { '_' } else { c })
        .collect();
    let clean = if clean.is_empty() || clean == "." || clean == ".." { "unknown".into() } else { clean };
    format!("{clean}-{pid}")
}

/// Creates `dir` if needed and proves it is writable by creating and removing a file.
pub fn ensure_writable_dir(dir: &Path) -> Result<()> {
    let fail = |cause| Error::OutputDir { path: dir.to_path_buf(), cause };
    fs::create_dir_all(dir).map_err(fail)?;
    let probe = dir.join(format!(".profiler-probe-{}", std::process::id()));
    fs::write(&probe, b"").map_err(fail)?;
    fs::remove_file(&probe).map_err(fail)
}

/// Writes `bytes` to `path` atomically, creating the parent directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let fail = |cause| Error::Write { path: path.to_path_buf(), cause };
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(fail)?;
    let tmp = temp_path(path);
    let result = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
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

fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_names_are_safe() {
        assert_eq!(process_dir_name("cpu_split", 42), "cpu_split-42");
        assert_eq!(process_dir_name("kworker/0:1", 7), "kworker_0:1-7");
        assert_eq!(process_dir_name("a b\n", 1), "a_b_-1");
        assert_eq!(process_dir_name("..", 1), "unknown-1");
        assert_eq!(process_dir_name("", 1), "unknown-1");
    }

    #[test]
    fn utc_timestamps() {
        use std::time::{Duration, UNIX_EPOCH};
        assert_eq!(utc_timestamp(UNIX_EPOCH), "19700101T000000Z");
        assert_eq!(utc_timestamp(UNIX_EPOCH + Duration::from_secs(951_782_400)), "20000229T000000Z");
        assert_eq!(utc_timestamp(UNIX_EPOCH + Duration::from_secs(1_796_109_296)), "20261201T071456Z");
    }

    #[test]
    fn writes_atomically_and_reports_bad_dirs() {
        let dir = std::env::temp_dir().join(format!("profiler-output-test-{}", std::process::id()));
        let file = dir.join("p-1/cpu.pb.gz");
        write_atomic(&file, b"abc").unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"abc");
        assert_eq!(fs::read_dir(file.parent().unwrap()).unwrap().count(), 1, "no temp left");
        let blocked = file.join("sub");
        assert!(matches!(ensure_writable_dir(&blocked), Err(Error::OutputDir { .. })));
        fs::remove_dir_all(&dir).unwrap();
    }
}
