//! Where finished profiles go. `profiler snapshot` writes [`SnapshotFiles`]; the daemon's
//! interval dumps go to its [`Sink`]s: files today, with retention ([`IntervalFiles`]), and
//! exporters (Pyroscope, OTLP) later, as variants. Socket answers are not a sink: the
//! collector sends each back on its query's reply channel.

mod files;
pub mod retention;

use std::path::{Path, PathBuf};

pub use files::{DumpError, DumpPhases, DumpStats, IntervalDump, IntervalFiles};

use crate::{error::Result, output, render::Rendered};

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
        output::write_atomic(&path, &profile.encoded.gzip())?;
        Ok(path)
    }
}

/// Where the daemon's interval profiles go.
#[derive(Debug)]
pub enum Sink {
    /// Timestamped files in the output directory, with retention.
    Files(IntervalFiles),
}
