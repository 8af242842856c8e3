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
