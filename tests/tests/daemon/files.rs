//! The periodic files: one per interval, named by time, each a complete profile of the
//! interval; and retention by total size and by age.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use profiler_tests::daemon::{self, Daemon, DaemonConfig};
use profiler_tests::{expect, go_pprof, listing, preflight, process_dir};
use profiler_tests::{Fixture, FixtureKind, Profile};

use super::{assert_split, file_size, mtime_gaps, wait_for_files, CPU_SPLIT, FIXTURE_S, FREQUENCY_HZ};

/// Ground truth: the daemon cuts a profile every `interval` (2 s) for a process with samples.
/// After a few intervals `cpu_split-<pid>/` holds that many `cpu-<stamp>.pb.gz` files, their
/// stamps increase in write order about 2 s apart, each decodes (with our reader and with
/// `go tool pprof -raw`) as a 199 Hz CPU profile of that one thread, and each alone shows the
/// fixture's 75/25 hot_a/hot_b split. With nothing to delete, retention listed the directory
/// once (/status `retention_passes`).
#[test]
fn files_appear_every_interval_and_decode() {
    if !preflight() {
        return;
    }
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let daemon = Daemon::start(&DaemonConfig::new(&[CPU_SPLIT]));
    let files = wait_for_files(&daemon, &fixture, 3);
    let stamps: Vec<String> = files.iter().map(|f| daemon::stamp(f)).collect();
    assert!(stamps.windows(2).all(|w| w[0] < w[1]), "stamps do not increase: {stamps:?}");
    let mut by_time = files.clone();
    by_time.sort_by_key(|f| daemon::modified(f));
    assert_eq!(by_time, files, "name order is not write order");
    for gap in mtime_gaps(&files) {
        assert!((1.5..3.0).contains(&gap), "files {gap:.2} s apart at a 2 s interval: {files:?}");
    }
    for file in &files {
        let profile = Profile::decode(file);
        expect::single_thread_labels(&profile, fixture.pid(), fixture.comm());
        assert_split(&profile, file);
        go_pprof::raw(file);
    }
    // The default limits (a week, 1 GiB) leave nothing to delete for a week: the directory
    // is listed by the first dump's retention pass, not by every dump's.
    let (dumps, passes) = (daemon.status_u64("/output/dumps"), daemon.status_u64("/output/retention_passes"));
    assert!(dumps >= 3 && passes == 1, "{passes} retention passes in {dumps} dumps");
    // Last, so that a format slip does not hide the checks above.
    for file in &files {
        expect::cpu_profile_format(&Profile::decode(file), FREQUENCY_HZ);
    }
}

/// Ground truth: `max_total_bytes` caps the output directory. With a cap of about four
/// files and a file a second, the directory never holds more than the cap plus the one file
/// written before retention runs, the oldest names go while the newest stay, and /status
/// counts the deletions.
#[test]
fn retention_by_size_deletes_the_oldest() {
    if !preflight() {
        return;
    }
    const LIMIT_BYTES: u64 = 5 * 1024;
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let mut config = DaemonConfig::new(&[CPU_SPLIT]);
    config.interval = "1s".into();
    config.max_total_bytes = Some("5KiB".into());
    let daemon = Daemon::start(&config);
    let dir = process_dir(daemon.output(), fixture.comm(), fixture.pid());
    let mut seen = BTreeSet::new();
    let (mut peak_bytes, mut largest_file) = (0, 0);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(12) {
        let files = daemon::profile_files(&dir, "cpu");
        let sizes: Vec<u64> = files.iter().map(|f| file_size(f)).collect();
        peak_bytes = peak_bytes.max(sizes.iter().sum());
        largest_file = largest_file.max(sizes.iter().copied().max().unwrap_or(0));
        seen.extend(files.iter().map(|f| daemon::file_name(f)));
        std::thread::sleep(Duration::from_millis(100));
    }
    let remaining: Vec<String> = daemon::profile_files(&dir, "cpu").iter().map(|f| daemon::file_name(f)).collect();
    seen.extend(remaining.iter().cloned());
    assert!(seen.len() >= 8, "only {} files in 12 s at a 1 s interval: {seen:?}", seen.len());
    assert!(
        peak_bytes <= LIMIT_BYTES + largest_file,
        "the directory held {peak_bytes} bytes, over the {LIMIT_BYTES} B cap plus one file ({largest_file} B)"
    );
    let newest: Vec<String> = seen.iter().rev().take(remaining.len()).rev().cloned().collect();
    assert_eq!(remaining, newest, "retention should keep exactly the newest files; seen {seen:?}");
    assert!(remaining.len() < seen.len() - 2 && !remaining.is_empty(), "kept {remaining:?} of {seen:?}");
    let deleted = daemon.status_u64("/output/files_deleted_by_retention");
    assert!(deleted > 0, "/status counts no deletions");
}

/// Ground truth: `max_age` = 2 s at a 1 s interval. A file is deleted by the first dump at
/// which it is older than 2 s, so none is ever seen older than ~3 s, the first ones are gone,
/// and /status counts the deletions.
#[test]
fn retention_by_age_deletes_old_files() {
    if !preflight() {
        return;
    }
    /// 2 s of age plus one interval, plus slack for a slow dump and the poll.
    const MAX_SEEN_AGE_S: f64 = 3.5;
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let mut config = DaemonConfig::new(&[CPU_SPLIT]);
    config.interval = "1s".into();
    config.max_age = Some("2s".into());
    let daemon = Daemon::start(&config);
    let dir = process_dir(daemon.output(), fixture.comm(), fixture.pid());
    let mut seen = BTreeSet::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        for file in daemon::profile_files(&dir, "cpu") {
            let age = age_s(&file);
            assert!(
                age <= MAX_SEEN_AGE_S,
                "{} is {age:.2} s old, past max_age 2s + an interval; dir:\n{}",
                file.display(),
                listing(&dir)
            );
            seen.insert(daemon::file_name(&file));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let remaining: BTreeSet<String> = daemon::profile_files(&dir, "cpu").iter().map(|f| daemon::file_name(f)).collect();
    assert!(seen.len() >= 7, "only {} files in 10 s: {seen:?}", seen.len());
    let first: Vec<&String> = seen.iter().take(3).collect();
    assert!(
        first.iter().all(|name| !remaining.contains(*name)),
        "the first files {first:?} are still there: {remaining:?}"
    );
    assert!(remaining.len() <= 4, "{} files left with max_age 2s: {remaining:?}", remaining.len());
    assert!(daemon.status_u64("/output/files_deleted_by_retention") > 0);
}

fn age_s(file: &Path) -> f64 {
    // A file deleted between listing and stat has no age; 0 passes every check.
    std::fs::metadata(file).and_then(|m| m.modified()).map_or(0.0, |t| t.elapsed().unwrap_or_default().as_secs_f64())
}
