//! One interval's dump: for each selected process with data, `DIR/<name>-<pid>/<type>-<UTC
//! timestamp>.pb.gz` per enabled type, written atomically; then retention. Failures (disk
//! full, permission denied, a vanished directory) are counted and reported, never fatal: the
//! next interval tries again.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
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
    for (pid, kinds) in targets {
        let (Some(process), Some(counts)) = (agg.process(*pid), interval.process(*pid)) else { continue };
        for &kind in kinds {
            let comments = match kind {
                ProfileKind::Heap => profiles::heap_comments("at the end of the interval", counters, settings.heap_sample_bytes),
                ProfileKind::Block => profiles::block_comments("daemon interval dump: values are for the interval", counters),
                ProfileKind::Mutex => profiles::mutex_comments("daemon interval dump: values are for the interval", counters),
                ProfileKind::ThreadCreate => {
                    profiles::threadcreate_comments("daemon interval dump: values are for the interval", counters)
                }
                ProfileKind::Cpu => profiles::cpu_comments("daemon interval dump: values are for the interval", counters),
            };
            let Some(profile) = render(agg, process, counts, kind, false, settings, window, comments, sym) else { continue };
            let bytes = pprof::encode_gzip(&profile);
            let path = unused_path(&dir.join(output::process_dir_name(&process.name, *pid)), kind, &stamp);
            match output::write_atomic(&path, &bytes) {
                Ok(()) => {
                    stats.files_written += 1;
                    stats.bytes_written += bytes.len() as u64;
                }
                Err(err) => {
                    stats.write_errors += 1;
                    last_error = Some(err.to_string());
                }
            }
        }
    }
    let report = retention::enforce(dir, &config.retention, end);
    stats.files_deleted += report.deleted_files;
    stats.retention_errors += report.errors;
    match last_error {
        Some(err) => Err(format!("failed to write some profiles of this interval: {err}")),
        None => Ok(()),
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
