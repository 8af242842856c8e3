//! The daemon's interval files: for each selected process with data, `DIR/<name>-<pid>/
//! <kind>-<UTC timestamp>.pb.gz` per enabled kind, written atomically as one
//! [`output::StagedFiles`]; then retention. Failures (disk full, permission denied, a vanished
//! directory) are counted and reported, never fatal: the next interval tries again.
//!
//! With `[[export]]` tables, the directory is also the exporters' spool: a dump's files
//! that reached the disk are listed in a manifest ([`super::spool`]) and the [`Exporter`]
//! is woken to send them.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use super::{
    export::{ExportStatus, Exporter},
    retention,
    spool::{self, Entry, Manifest},
};
use crate::{
    config::{ExportConfig, ProcessFacts, Retention},
    output, procs,
    profiles::ProfileKind,
    render::Rendered,
};

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
    /// Retention passes run (see [`retention::Schedule`] for when one is due).
    pub retention_passes: u64,
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
    /// Writing them: temporary files, one `syncfs`, renames (see [`output::StagedFiles`]).
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
    #[error("failed to write the export manifest of this interval: its profiles will not be exported")]
    Manifest(#[source] crate::Error),
}

/// The output directory and its retention, the exporters that read it, and what was
/// written so far.
pub struct IntervalFiles {
    dir: PathBuf,
    retention: Retention,
    /// When retention's next pass is due.
    schedule: retention::Schedule,
    stats: DumpStats,
    exports: Vec<ExportConfig>,
    /// Running when `exports` is not empty.
    exporter: Option<Exporter>,
    /// The number of the next manifest.
    next_seq: u64,
}

impl IntervalFiles {
    pub fn new(dir: &Path, retention: &Retention, exports: &[ExportConfig]) -> Self {
        let mut files = Self {
            dir: dir.to_path_buf(),
            retention: retention.clone(),
            schedule: retention::Schedule::default(),
            stats: DumpStats::default(),
            exports: Vec::new(),
            exporter: None,
            next_seq: 0,
        };
        files.start_exports(exports);
        files
    }

    /// A reload's new directory, limits and exports. The exporter is restarted when its
    /// directory or exports changed (each export resumes from its cursor).
    pub fn reconfigure(&mut self, dir: &Path, retention: &Retention, exports: &[ExportConfig]) {
        let restart = dir != self.dir || exports != self.exports;
        self.dir = dir.to_path_buf();
        self.retention = retention.clone();
        // New limits, or a new directory: what the last pass found says nothing of them.
        self.schedule = retention::Schedule::default();
        if restart {
            if let Some(exporter) = self.exporter.take() {
                exporter.stop();
            }
            self.start_exports(exports);
        }
    }

    fn start_exports(&mut self, exports: &[ExportConfig]) {
        self.exports = exports.to_vec();
        if exports.is_empty() {
            return;
        }
        self.next_seq = super::export::next_seq(&self.dir);
        match Exporter::start(exports, &self.dir) {
            Ok(exporter) => self.exporter = Some(exporter),
            Err(err) => tracing::error!("failed to start the exporter thread, nothing will be exported: {err}"),
        }
    }

    /// Each export's counts, for `/status`.
    pub fn export_status(&self) -> Vec<ExportStatus> {
        self.exporter.as_ref().map(Exporter::status).unwrap_or_default()
    }

    /// Stops the exporters, giving them a moment to send what is queued (the final dump);
    /// the rest stays in the spool for the next start.
    pub fn close(&mut self) {
        if let Some(exporter) = self.exporter.take() {
            exporter.stop();
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn stats(&self) -> &DumpStats {
        &self.stats
    }

    /// Applies retention as of `end`, if a pass is due or `now`, and counts what it did.
    fn retain(&mut self, end: SystemTime, now: bool) {
        if !now && !self.schedule.due(end) {
            return;
        }
        let report = retention::enforce(&self.dir, &self.retention, end);
        self.schedule.passed(&report, &self.retention, end);
        let stats = &mut self.stats;
        stats.retention_passes += 1;
        stats.files_deleted += report.deleted_files;
        stats.retention_errors += report.errors;
        stats.retention_held_at_floor += u64::from(report.kept_for_floor);
    }

    /// Starts the dump of an interval ending at `end`, which will hold about `files` files;
    /// refused (and counted) when free space is below the floor.
    pub fn begin(&mut self, end: SystemTime, files: usize) -> Result<IntervalDump, DumpError> {
        self.stats.dumps += 1;
        self.stats.last_phases = DumpPhases::default();
        let cpu_start = thread_cpu_time();
        match retention::free_space_ok(&self.dir, self.retention.min_free_bytes) {
            Ok(true) => {}
            Ok(false) => {
                self.stats.skipped_low_space += files as u64;
                // Old profiles may make room; the last hour's stay (see `retention`).
                self.retain(end, true);
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
            cpu_start: Some(cpu_start),
            dir: self.dir.clone(),
            written: DumpStats::default(),
            files: output::StagedFiles::default(),
            phases: DumpPhases::default(),
            last_error: None,
            exporting: self.exporter.is_some(),
            staged: Vec::new(),
            spooled: Vec::new(),
        })
    }

    /// Makes the staged files of `dump` durable and in place, counts them, then applies
    /// retention.
    pub fn finish(&mut self, mut dump: IntervalDump) -> Result<(), DumpError> {
        let own_cpu_start = thread_cpu_time();
        let started = Instant::now();
        dump.commit();
        dump.phases.write += started.elapsed();
        let spooled = self.spool(&mut dump);
        let started = Instant::now();
        self.schedule.wrote(dump.written.bytes_written);
        self.retain(dump.end, false);
        dump.phases.retention = started.elapsed();
        // On the thread that began the dump its clock still runs; on another, this call's own
        // time adds to what the first thread counted when it let go.
        dump.phases.cpu += thread_cpu_time().saturating_sub(dump.cpu_start.unwrap_or(own_cpu_start));
        let stats = &mut self.stats;
        stats.files_written += dump.written.files_written;
        stats.bytes_written += dump.written.bytes_written;
        stats.write_errors += dump.written.write_errors;
        stats.last_phases = dump.phases;
        stats.last_duration = dump.started.elapsed();
        match (dump.last_error.take(), spooled) {
            (Some(err), _) => Err(DumpError::Write(err)),
            (None, Err(err)) => Err(DumpError::Manifest(err)),
            (None, Ok(())) => Ok(()),
        }
    }

    /// Lists the files of `dump` that are in place in its manifest, and wakes the exporters.
    fn spool(&mut self, dump: &mut IntervalDump) -> Result<(), crate::Error> {
        let Some(exporter) = &self.exporter else { return Ok(()) };
        if dump.spooled.is_empty() {
            return Ok(());
        }
        let end_unix_ns = dump.end.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let files = std::mem::take(&mut dump.spooled);
        let count = files.len();
        spool::write(&self.dir, &Manifest { seq: self.next_seq, end_unix_ns, files })?;
        self.next_seq += 1;
        exporter.spooled(count);
        Ok(())
    }
}

/// One interval's dump in progress: files staged as they are rendered, made durable
/// together by [`IntervalFiles::finish`]. It holds no borrow of its [`IntervalFiles`], so the
/// collector can go on draining between two profiles.
pub struct IntervalDump {
    dir: PathBuf,
    /// What this dump wrote so far (added to the files' stats when it finishes).
    written: DumpStats,
    stamp: String,
    end: SystemTime,
    started: Instant,
    /// The CPU clock of the thread that began the dump, while that thread works on it.
    cpu_start: Option<Duration>,
    files: output::StagedFiles,
    phases: DumpPhases,
    last_error: Option<crate::Error>,
    /// Whether the files are to be exported (listed in a manifest).
    exporting: bool,
    /// Spool entries of the staged files (when exporting), by path.
    staged: Vec<(PathBuf, Entry)>,
    /// Spool entries of the files in place, in the order written.
    spooled: Vec<Entry>,
}

impl IntervalDump {
    /// Stops counting the CPU time of the thread that began the dump: call it before
    /// `finish` runs on another thread (a thread's CPU clock means nothing on another).
    pub fn leave_thread(&mut self) {
        if let Some(start) = self.cpu_start.take() {
            self.phases.cpu += thread_cpu_time().saturating_sub(start);
        }
    }

    /// Counts time spent rendering (the caller renders).
    pub fn rendered_in(&mut self, took: Duration) {
        self.phases.render += took;
    }

    /// Stages one profile of the process `facts` describes.
    pub fn put(&mut self, profile: &Rendered, facts: &ProcessFacts<'_>) {
        let started = Instant::now();
        let dir = self.dir.join(output::process_dir_name(&profile.name, profile.pid.0));
        let path = unused_path(&dir, profile.kind, &self.stamp);
        match self.files.stage(&self.dir, &path, &profile.encoded.gzip()) {
            Ok(()) if self.exporting => {
                let entry = spool_entry(&self.dir, &path, profile, facts);
                self.staged.push((path, entry));
            }
            Ok(()) => {}
            Err(err) => {
                self.written.write_errors += 1;
                self.last_error = Some(err);
            }
        }
        if self.files.is_full() {
            self.commit();
        }
        self.phases.write += started.elapsed();
    }

    /// Puts the staged files in place and counts them.
    fn commit(&mut self) {
        let done = self.files.commit();
        for (path, _) in &done.written {
            if let Some(at) = self.staged.iter().position(|(staged, _)| staged == path) {
                self.spooled.push(self.staged.swap_remove(at).1);
            }
        }
        self.staged.clear();
        let stats = &mut self.written;
        stats.files_written += done.written.len() as u64;
        stats.bytes_written += done.written.iter().map(|(_, bytes)| bytes).sum::<u64>();
        stats.write_errors += done.failed.len() as u64;
        if let Some(err) = done.failed.into_iter().last() {
            self.last_error = Some(err);
        }
    }
}

/// The spool entry of a profile written to `path`: what its labels need, captured now.
fn spool_entry(dir: &Path, path: &Path, profile: &Rendered, facts: &ProcessFacts<'_>) -> Entry {
    let cgroup = facts.cgroup.unwrap_or_default();
    Entry {
        path: path.strip_prefix(dir).unwrap_or(path).to_string_lossy().into_owned(),
        kind: profile.kind.as_str().to_owned(),
        pid: profile.pid.0,
        name: profile.name.clone(),
        exe: facts.exe.map(|exe| exe.to_string_lossy().into_owned()),
        unit: procs::unit_of(cgroup).map(str::to_owned),
        container: procs::container_of(cgroup).map(str::to_owned),
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
