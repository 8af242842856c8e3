//! Where finished profiles go. `profiler snapshot` writes [`SnapshotFiles`]; the daemon's
//! interval dumps go to files, with retention ([`IntervalFiles`]). The exports (each
//! `[[export]]`: Pyroscope, OTLP; [`export`]) are not destinations beside those files but
//! readers of them: the dump directory is their spool ([`spool`]), so what they send is what
//! was written, in order, across restarts, and a backend that is down costs disk that
//! retention bounds, not memory. Socket answers do not come here: the collector sends each
//! back on its query's reply channel.

pub mod export;
mod files;
pub mod retention;
pub mod spool;

use std::path::{Path, PathBuf};

pub use files::{DumpError, DumpPhases, DumpStats, IntervalDump, IntervalFiles};

use crate::{error::Result, flame::FlameError, output, render::Rendered};

/// A snapshot's files: `DIR/<name>-<pid>/<kind>.pb.gz`, each written atomically (and made
/// durable on its own: a snapshot writes each file once).
#[derive(Debug)]
pub struct SnapshotFiles {
    dir: PathBuf,
}

impl SnapshotFiles {
    pub fn new(dir: &Path) -> Self {
        Self { dir: dir.to_path_buf() }
    }

    /// Writes `profile`; returns where.
    pub fn put(&mut self, profile: &Rendered) -> Result<PathBuf> {
        let path = self
            .dir
            .join(output::process_dir_name(&profile.name, profile.pid.0))
            .join(format!("{}.pb.gz", profile.kind));
        output::write_atomic(&self.dir, &path, &profile.encoded.gzip())?;
        Ok(path)
    }

    /// Writes `profile`'s flame graph, `<kind>.svg`, next to its file; `None` when there is
    /// nothing to draw (no sample has a value).
    pub fn put_flamegraph(&mut self, profile: &Rendered) -> Result<Option<PathBuf>> {
        let path =
            self.dir.join(output::process_dir_name(&profile.name, profile.pid.0)).join(format!("{}.svg", profile.kind));
        let title = format!("{} (pid {}) {}", profile.name, profile.pid, profile.kind);
        let svg = match profile.encoded.fold(None).map_err(FlameError::from).and_then(|f| crate::flame::svg(&f, &title))
        {
            Ok(svg) => svg,
            Err(FlameError::Empty(_)) => return Ok(None),
            Err(err) => {
                let action = format!("draw the flame graph {}", path.display());
                return Err(crate::error::Error::Io {
                    action,
                    source: std::io::Error::other(crate::error::chain(&err)),
                });
            }
        };
        output::write_atomic(&self.dir, &path, &svg)?;
        Ok(Some(path))
    }
}
