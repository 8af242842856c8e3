//! One interval's dump: for each selected process with data, `DIR/<name>-<pid>/<type>-<UTC
//! timestamp>.pb.gz` per enabled type, written atomically as one [`output::Batch`]; then
//! retention. Failures (disk full, permission denied, a vanished directory) are counted and
//! reported, never fatal: the next interval tries again.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use super::{
    render::{render, RenderSettings, Window},
    retention,
};
use crate::{
    aggregate::{Aggregate, Counts},
    config::{Config, ProfileKind},
    ebpf::Counters,
    output, pprof, profiles,
    symbolize::Symbolizer,
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

/// CPU time of the calling thread so far.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write to; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Writes the interval's profiles. Returns the last error, if any (already counted).
#[allow(clippy::too_many_arguments)]
pub fn write_interval(
    config: &Config,
    agg: &Aggregate,
    interval: &Counts,
    targets: &[(u32, Vec<ProfileKind>)],
    settings: RenderSettings,
    window: &Window,
    end: SystemTime,
    counters: &Counters,
    sym: &mut Symbolizer,
    stats: &mut DumpStats,
) -> Result<(), String> {
    stats.dumps += 1;
    stats.last_phases = DumpPhases::default();
    let cpu_start = thread_cpu_time();
    let mut phases = DumpPhases::default();
    let dir = &config.output_dir;
    let mut last_error = None;
    let files: usize = targets.iter().map(|(_, kinds)| kinds.len()).sum();
    match retention::free_space_ok(dir, config.retention.min_free_bytes) {
        Ok(true) => {}
        Ok(false) => {
            stats.skipped_low_space += files as u64;
            return Err(format!(
                "skipped {files} profiles: less than {} bytes free under {}",
                config.retention.min_free_bytes,
                dir.display()
            ));
        }
        // A vanished or unreadable directory: try the writes anyway, they recreate it.
        Err(err) => tracing::debug!(error = %err, "cannot check free space"),
    }
    let stamp = output::utc_timestamp(end);
    let mut batch = output::Batch::default();
    for (pid, kinds) in targets {
        let (Some(process), Some(counts)) = (agg.process(*pid), interval.process(*pid)) else { continue };
        for &kind in kinds {
            let comments = match kind {
                ProfileKind::Heap => {
                    profiles::heap_comments("at the end of the interval", counters, settings.heap_sample_bytes)
                }
                ProfileKind::Block => {
                    profiles::block_comments("daemon interval dump: values are for the interval", counters)
                }
                ProfileKind::Mutex => {
                    profiles::mutex_comments("daemon interval dump: values are for the interval", counters)
                }
                ProfileKind::ThreadCreate => {
                    profiles::threadcreate_comments("daemon interval dump: values are for the interval", counters)
                }
                ProfileKind::Cpu => {
                    profiles::cpu_comments("daemon interval dump: values are for the interval", counters)
                }
            };
            let started = Instant::now();
            let Some(profile) = render(agg, process, counts, kind, false, settings, window, comments, sym) else {
                continue;
            };
            let bytes = pprof::encode_gzip(&profile);
            phases.render += started.elapsed();
            let started = Instant::now();
            let path = unused_path(&dir.join(output::process_dir_name(&process.name, *pid)), kind, &stamp);
            if let Err(err) = batch.stage(&path, &bytes) {
                stats.write_errors += 1;
                last_error = Some(err.to_string());
            }
            if batch.is_full() {
                commit(&mut batch, stats, &mut last_error);
            }
            phases.write += started.elapsed();
        }
    }
    let started = Instant::now();
    commit(&mut batch, stats, &mut last_error);
    phases.write += started.elapsed();
    let started = Instant::now();
    let report = retention::enforce(dir, &config.retention, end);
    phases.retention = started.elapsed();
    phases.cpu = thread_cpu_time().saturating_sub(cpu_start);
    stats.last_phases = phases;
    stats.files_deleted += report.deleted_files;
    stats.retention_errors += report.errors;
    match last_error {
        Some(err) => Err(format!("failed to write some profiles of this interval: {err}")),
        None => Ok(()),
    }
}

/// Puts the staged files in place and counts them.
fn commit(batch: &mut output::Batch, stats: &mut DumpStats, last_error: &mut Option<String>) {
    let done = batch.commit();
    stats.files_written += done.written.len() as u64;
    stats.bytes_written += done.written.iter().map(|(_, bytes)| bytes).sum::<u64>();
    stats.write_errors += done.failed.len() as u64;
    if let Some(err) = done.failed.last() {
        *last_error = Some(err.to_string());
    }
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
