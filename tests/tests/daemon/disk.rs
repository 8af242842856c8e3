//! An output file system that fills up or turns read-only under the daemon, or an output
//! directory removed under it: it keeps serving, counts what it could not write, and writes
//! again once the file system recovers.

use profiler_tests::daemon::{wait_for, Daemon, DaemonConfig};
use profiler_tests::tmpfs::Tmpfs;
use profiler_tests::{preflight, process_dir, Fixture, FixtureKind, Profile};

use super::{new_files, no_temporary_files, wait_for_files, CPU_SPLIT, FIXTURE_S, SOON};

/// Ground truth: a full file system (a 64 KiB tmpfs filled by dd) makes writes fail with
/// ENOSPC. The daemon keeps answering, counts `profile_write_errors`, reports `last_error`,
/// leaves no temporary file behind, and writes again once the space is freed.
#[test]
fn a_full_output_dir_does_not_stop_the_daemon() {
    if !preflight() {
        return;
    }
    let fs = Tmpfs::mount("full", "64k");
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let daemon = start_on(&fs, "0B");
    wait_for_files(&daemon, &fixture, 1);
    let fill = fs.fill();
    expect_counted_failure(&daemon, "/drops/profile_write_errors");
    no_temporary_files(&process_dir(daemon.output(), fixture.comm(), fixture.pid()));
    std::fs::remove_file(&fill).expect("failed to remove the fill file");
    expect_new_file(&daemon, &fixture);
}

/// Ground truth: with `min_free_bytes` above what a full tmpfs has left, the daemon skips
/// writing (and counts `profiles_skipped_low_disk_space`) instead of filling the disk, keeps
/// answering, and writes again once the space is freed. The space was filled by someone
/// else: retention keeps the profiles written before (the last hour's are never deleted
/// for free space), and says so in `/status`.
#[test]
fn low_free_space_skips_profiles() {
    if !preflight() {
        return;
    }
    let fs = Tmpfs::mount("lowspace", "256k");
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let daemon = start_on(&fs, "64KiB");
    let before = wait_for_files(&daemon, &fixture, 1);
    let fill = fs.fill();
    expect_counted_failure(&daemon, "/drops/profiles_skipped_low_disk_space");
    let held = wait_for(SOON, || daemon.status_u64("/output/retention_held_at_free_space_floor") > 0);
    assert!(held, "retention never reported holding at the floor: {:#}", daemon.status());
    let gone: Vec<_> = before.iter().filter(|f| !f.exists()).collect();
    assert!(gone.is_empty(), "retention deleted recent profiles for another writer's file: {gone:?}");
    std::fs::remove_file(&fill).expect("failed to remove the fill file");
    expect_new_file(&daemon, &fixture);
}

/// Ground truth: a read-only output file system (`mount -o remount,ro`) makes writes fail
/// with EROFS. The daemon keeps answering and counts the errors; remounted read-write, it
/// writes again.
#[test]
fn a_read_only_output_dir_does_not_stop_the_daemon() {
    if !preflight() {
        return;
    }
    let fs = Tmpfs::mount("readonly", "1m");
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let daemon = start_on(&fs, "0B");
    wait_for_files(&daemon, &fixture, 1);
    fs.remount("ro");
    expect_counted_failure(&daemon, "/drops/profile_write_errors");
    fs.remount("rw");
    expect_new_file(&daemon, &fixture);
}

/// Ground truth: the whole output directory removed under the running daemon (an operator's
/// `rm -rf`, a cleanup job). The next dump recreates it and writes a complete profile, and
/// nothing was counted as a write error.
#[test]
fn a_vanished_output_dir_is_recreated() {
    if !preflight() {
        return;
    }
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let daemon = Daemon::start(&DaemonConfig::new(&[CPU_SPLIT]));
    wait_for_files(&daemon, &fixture, 1);
    let errors = daemon.status_u64("/drops/profile_write_errors");
    std::fs::remove_dir_all(daemon.output()).expect("failed to remove the output directory");
    assert!(!daemon.output().exists());
    expect_new_file(&daemon, &fixture);
    assert_eq!(
        daemon.status_u64("/drops/profile_write_errors"),
        errors,
        "writes failed after the directory was removed"
    );
}

/// A daemon for cpu_split writing into `fs`, with the free-space floor `min_free`.
fn start_on(fs: &Tmpfs, min_free: &str) -> Daemon {
    let mut config = DaemonConfig::new(&[CPU_SPLIT]);
    config.output_dir = Some(fs.path().to_owned());
    config.min_free_bytes = min_free.into();
    Daemon::start(&config)
}

/// The counter at `pointer` goes up within a few intervals, `last_error` is set, and the
/// daemon still answers the index.
fn expect_counted_failure(daemon: &Daemon, pointer: &str) {
    let before = daemon.status_u64(pointer);
    let counted = wait_for(SOON, || daemon.status_u64(pointer) > before);
    let status = daemon.status();
    assert!(counted, "{pointer} did not go up within {SOON:?}: {status:#}");
    assert!(status["last_error"].as_str().is_some_and(|e| !e.is_empty()), "last_error is not set: {status:#}");
    daemon.get_ok("/debug/pprof/");
}

/// A CPU profile that was not there on entry appears, and decodes to samples of the
/// fixture (its format is `files_appear_every_interval_and_decode`'s business).
fn expect_new_file(daemon: &Daemon, fixture: &Fixture) {
    let file = new_files(daemon, fixture, 1).remove(0);
    let profile = Profile::decode(&file);
    assert!(
        profile.samples.iter().any(|s| s.contains("work_loop")),
        "{} has no sample in work_loop: {:?}",
        file.display(),
        profile.function_names()
    );
}
