//! `profiler unwind-table FILE...`: builds each file's table the way the daemon would and
//! reports its size, build time and what CFI it could not express. A diagnostic for "why do
//! this binary's stacks stop?", and the bench's source for table sizes.

use std::{
    fmt::Write,
    fs::File,
    path::{Path, PathBuf},
};

use super::BuildError;
use crate::elf::MappedFile;

/// Why a file's table could not be reported.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("failed to read {} (is it an ELF file?)", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: no unwind table can be built", path.display())]
    Build {
        path: PathBuf,
        #[source]
        source: BuildError,
    },
}

/// One line per file: rows, bytes, FDEs, build time, unsupported rows per reason.
pub fn report(paths: &[impl AsRef<Path>]) -> Result<String, ReportError> {
    let mut out = String::new();
    for path in paths {
        let path = path.as_ref();
        let io = |source| ReportError::Read { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        let mapped = MappedFile::map(&file).map_err(io)?;
        let table =
            super::build(mapped.bytes()).map_err(|source| ReportError::Build { path: path.to_path_buf(), source })?;
        let s = table.stats();
        let unsupported: Vec<String> =
            s.unsupported.iter().filter(|(_, n)| *n > 0).map(|(r, n)| format!("{} {n}", r.name())).collect();
        let _ = writeln!(
            out,
            "{}: rows {} ({} before merging), {} bytes ({:.1} KiB), fdes {} (skipped {}), build {:.2} ms, unsupported rows: {}",
            path.display(),
            s.rows,
            s.rows_before_merge,
            s.bytes,
            s.bytes as f64 / 1024.0,
            s.fdes,
            s.skipped_fdes,
            s.build_duration.as_secs_f64() * 1e3,
            if unsupported.is_empty() { "none".into() } else { unsupported.join(", ") }
        );
    }
    Ok(out)
}
