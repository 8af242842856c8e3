//! The daemon's interval files: for each selected process with data, `DIR/<name>-<pid>/
//! <kind>-<UTC timestamp>.pb.gz` per enabled kind, written atomically as one
//! [`output::Batch`]; then retention. Failures (disk full, permission denied, a vanished
//! directory) are counted and reported, never fatal: the next interval tries again.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use super::retention;
use crate::{config::Retention, output, profiles::ProfileKind, render::Rendered};

/// Totals over the daemon's life, for `/status`.
#[derive(Clone, Debug, Default)]
pub struct DumpStats {
    pub dumps: u64,
    pub files_written: u64,
    pub bytes_written: u64,
    pub write_errors: u64,
    /// Profiles not written because free space was below the floor.
    pub skipped_low_space: u64,
    pub files_deleted: u64,
    pub retention_errors: u64,
    /// Retention passes that left free space low rather than delete the last hour's
    /// profiles ([`super::retention::FREE_SPACE_FLOOR`]).
    pub retention_held_at_floor: u64,
    /// How long the last dump took.
    pub last_duration: Duration,
    /// Where the last dump's time went.
    pub last_phases: DumpPhases,
}

/// One dump's wall time per phase, and the CPU time of the thread that ran it: on a busy
/// machine a dump that needs little CPU can still take long in wall time, waiting for a core.
#[derive(Clone, Copy, Debug, Default)]
pub struct DumpPhases {
    /// Building and encoding the profiles (symbolizing what the cache lacks).
    pub render: Duration,
    /// Writing them: temporary files, one `syncfs`, renames (see [`output::Batch`]).
    pub write: Duration,
    /// Deleting by age and size.
    pub retention: Duration,
    /// CPU time the dumping thread used over the whole dump.
    pub cpu: Duration,
}

/// Why (part of) a dump was not written. Already counted in [`DumpStats`].
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("skipped {files} profiles: less than {min_free_bytes} bytes free under {}", dir.display())]
    LowSpace { files: usize, min_free_bytes: u64, dir: PathBuf },
    #[error("failed to write some profiles of this interval")]
    Write(#[source] crate::Error),
}

/// The output directory and its retention, and what was written so far.
#[derive(Debug)]
pub struct IntervalFiles {
    dir: PathBuf,
    retention: Retention,
    stats: DumpStats,
}

impl IntervalFiles {
    pub fn new(dir: &Path, retention: &Retention) -> Self {
        Self { dir: dir.to_path_buf(), retention: retention.clone(), stats: DumpStats::default() }
    }

    /// A reload's new directory and limits.
    pub fn reconfigure(&mut self, dir: &Path, retention: &Retention) {
        self.dir = dir.to_path_buf();
        self.retention = retention.clone();
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn stats(&self) -> &DumpStats {
        &self.stats
    }

    /// Applies retention as of `end` and counts what it did.
    fn retain(&mut self, end: SystemTime) {
        let report = retention::enforce(&self.dir, &self.retention, end);
        let stats = &mut self.stats;
        stats.files_deleted += report.deleted_files;
        stats.retention_errors += report.errors;
        stats.retention_held_at_floor += u64::from(report.kept_for_floor);
    }

    /// Starts the dump of an interval ending at `end`, which will hold about `files` files;
    /// refused (and counted) when free space is below the floor.
    pub fn begin(&mut self, end: SystemTime, files: usize) -> Result<IntervalDump<'_>, DumpError> {
        self.stats.dumps += 1;
        self.stats.last_phases = DumpPhases::default();
        let cpu_start = thread_cpu_time();
        match retention::free_space_ok(&self.dir, self.retention.min_free_bytes) {
            Ok(true) => {}
            Ok(false) => {
                self.stats.skipped_low_space += files as u64;
                // Old profiles may make room; the last hour's stay (see `retention`).
                self.retain(end);
                return Err(DumpError::LowSpace {
                    files,
                    min_free_bytes: self.retention.min_free_bytes,
                    dir: self.dir.clone(),
                });
            }
            // A vanished or unreadable directory: try the writes anyway, they recreate it.
            Err(err) => tracing::debug!(error = %err, "cannot check free space"),
        }
        Ok(IntervalDump {
            stamp: output::utc_timestamp(end),
            end,
            started: Instant::now(),
            cpu_start,
            files: self,
            batch: output::Batch::default(),
            phases: DumpPhases::default(),
            last_error: None,
        })
    }
}

/// One interval's dump in progress: files staged as they are rendered, made durable
/// together by [`IntervalDump::finish`].
pub struct IntervalDump<'a> {
    files: &'a mut IntervalFiles,
    stamp: String,
    end: SystemTime,
    started: Instant,
    cpu_start: Duration,
    batch: output::Batch,
    phases: DumpPhases,
    last_error: Option<crate::Error>,
}

impl IntervalDump<'_> {
    /// Counts time spent rendering (the caller renders).
    pub fn rendered_in(&mut self, took: Duration) {
        self.phases.render += took;
    }

    /// Stages one profile.
    pub fn put(&mut self, profile: &Rendered) {
        let started = Instant::now();
        let dir = self.files.dir.join(output::process_dir_name(&profile.name, profile.pid.0));
        let path = unused_path(&dir, profile.kind, &self.stamp);
        if let Err(err) = self.batch.stage(&path, &profile.encoded.gzip()) {
            self.files.stats.write_errors += 1;
            self.last_error = Some(err);
        }
        if self.batch.is_full() {
            self.commit();
        }
        self.phases.write += started.elapsed();
    }

    /// Makes the staged files durable and in place, then applies retention.
    pub fn finish(mut self) -> Result<(), DumpError> {
        let started = Instant::now();
        self.commit();
        self.phases.write += started.elapsed();
        let started = Instant::now();
        self.files.retain(self.end);
        self.phases.retention = started.elapsed();
        self.phases.cpu = thread_cpu_time().saturating_sub(self.cpu_start);
        let stats = &mut self.files.stats;
        stats.last_phases = self.phases;
        stats.last_duration = self.started.elapsed();
        match self.last_error.take() {
            Some(err) => Err(DumpError::Write(err)),
            None => Ok(()),
        }
    }

    /// Puts the staged files in place and counts them.
    fn commit(&mut self) {
        let done = self.batch.commit();
        let stats = &mut self.files.stats;
        stats.files_written += done.written.len() as u64;
        stats.bytes_written += done.written.iter().map(|(_, bytes)| bytes).sum::<u64>();
        stats.write_errors += done.failed.len() as u64;
        if let Some(err) = done.failed.into_iter().last() {
            self.last_error = Some(err);
        }
    }
}

/// CPU time of the calling thread so far.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write to; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `DIR/<type>-<stamp>.pb.gz`, or with `-1`, `-2`… when that name is taken: two dumps in the
/// same second (a final dump right after a regular one) must not replace each other.
fn unused_path(dir: &Path, kind: ProfileKind, stamp: &str) -> PathBuf {
    let first = dir.join(format!("{kind}-{stamp}.pb.gz"));
    if !first.exists() {
        return first;
    }
    (1..)
        .map(|n| dir.join(format!("{kind}-{stamp}-{n}.pb.gz")))
        .find(|path| !path.exists())
        .expect("some suffix is free")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dumps_in_the_same_second_get_distinct_names() {
        let dir = std::env::temp_dir().join(format!("profiler-dump-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = unused_path(&dir, ProfileKind::Cpu, "20261201T000000Z");
        std::fs::write(&first, b"x").unwrap();
        let second = unused_path(&dir, ProfileKind::Cpu, "20261201T000000Z");
        assert_ne!(first, second);
        assert!(second.to_string_lossy().ends_with("cpu-20261201T000000Z-1.pb.gz"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
