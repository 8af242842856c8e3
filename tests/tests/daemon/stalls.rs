//! A file system that stops answering under the daemon: a local user mounts a FUSE file
//! system, runs a program from it, and stops answering, so every read of the program's files
//! (to build its unwind table, to name its functions) sleeps in the kernel for ever. The
//! daemon gives such a read up, skips the device, says so in `/status` and in the program's
//! profile, and goes on: `/status` answers within a second throughout, samples grow, dumps
//! go on, another process's profile stays right, and nothing is restarted.

use std::time::{Duration, Instant};

use profiler_tests::daemon::{wait_for, Daemon, DaemonConfig};
use profiler_tests::fuse::{HungFs, PROGRAM};
use profiler_tests::{preflight, Fixture, FixtureKind, Profile};

use super::{assert_split, new_files, CPU_SPLIT, FIXTURE_S};

/// What `/status` may take to answer, whatever the collector waits on.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);
/// How long the daemon is watched while it waits out the stalled reads: past its 5 s limit
/// for giving a read up, and a few dumps.
const WATCH: Duration = Duration::from_secs(15);

/// The server stops answering before the daemon starts: the unwinder's first read of the
/// program's file (its registration, at the program's first sample) is the one that hangs.
#[test]
fn a_file_system_that_stops_answering_before_the_first_read_does_not_stop_the_daemon() {
    if !preflight() {
        return;
    }
    // Declared first, so dropped last: a thread of the daemon stuck on the file system keeps
    // it from exiting until the server is gone.
    let daemon;
    let fs = HungFs::start(FixtureKind::CpuSplitNoFp, &[&FIXTURE_S.to_string()], None);
    fs.hang();
    let split = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    daemon = Daemon::start(&DaemonConfig::new(&[CPU_SPLIT, PROGRAM]));
    watch_while_stalled(&daemon);
    let status = daemon.status();
    assert!(status["unwind"]["stalled_files"].as_u64() >= Some(1), "the unwinder's read: {status:#}");
    assert_still_right(&daemon, &split);
    // The program's own profile is written, its frames unnamed, and it says why.
    let profile = program_profile(&daemon, &fs);
    assert_names_the_stall(&profile, &fs);
}

/// The server answers the unwinder (its table is built) but never the symbolizer, whose
/// worker thread it recognizes by name: the read that hangs is the one that names frames.
#[test]
fn a_file_system_that_stops_answering_the_symbolizer_does_not_stop_the_daemon() {
    if !preflight() {
        return;
    }
    let daemon; // dropped after the file system, as above
    let fs = HungFs::start(FixtureKind::CpuSplitNoFp, &[&FIXTURE_S.to_string()], Some("offload-symbols"));
    let split = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    daemon = Daemon::start(&DaemonConfig::new(&[CPU_SPLIT, PROGRAM]));
    watch_while_stalled(&daemon);
    let status = daemon.status();
    assert_eq!(status["unwind"]["stalled_files"], 0, "the unwinder was answered: {status:#}");
    assert_still_right(&daemon, &split);
    let profile = program_profile(&daemon, &fs);
    assert_names_the_stall(&profile, &fs);
    // Unwound from the table the unwinder built (a no-frame-pointer build): the chain
    // hot_a ← work_loop ← main ← the C library's start, by address.
    let full = profile.samples.iter().filter(|s| s.user_frames().len() >= 4).count();
    assert!(
        full * 2 > profile.samples.len(),
        "most samples should hold the full chain (4+ user frames): {:?}",
        profile.samples.iter().map(|s| s.user_frames().len()).collect::<Vec<_>>()
    );
}

/// For [`WATCH`]: `/status` answers within [`ANSWER_WITHIN`] every time, samples keep
/// growing, and a read is given up (counted) while dumps go on.
fn watch_while_stalled(daemon: &Daemon) {
    let started = Instant::now();
    let (samples_before, dumps_before) = (daemon.status_u64("/samples/cpu"), daemon.status_u64("/output/dumps"));
    let mut slowest = Duration::ZERO;
    while started.elapsed() < WATCH {
        let asked = Instant::now();
        let _ = daemon.status();
        slowest = slowest.max(asked.elapsed());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(slowest < ANSWER_WITHIN, "/status took {slowest:?} while a read was stuck");
    let status = daemon.status();
    assert!(status["stalled"]["reads_given_up"].as_u64() >= Some(1), "no read was given up: {status:#}");
    assert!(status["stalled"]["threads_stuck_now"].as_u64() >= Some(1), "{status:#}");
    assert!(daemon.status_u64("/samples/cpu") > samples_before, "samples stopped growing");
    assert!(daemon.status_u64("/output/dumps") >= dumps_before + 3, "dumps stopped: {status:#}");
    assert!(!daemon.log().contains("panicked"), "{}", daemon.log());
}

/// Another process's profiles are still written and right.
fn assert_still_right(daemon: &Daemon, split: &Fixture) {
    for file in new_files(daemon, split, 2) {
        assert_split(&Profile::decode(&file), &file);
    }
}

/// The latest interval profile of the program served from the stalled file system.
fn program_profile(daemon: &Daemon, fs: &HungFs) -> Profile {
    let pid = fs.program().pid();
    let written = wait_for(Duration::from_secs(10), || !daemon.profiles(PROGRAM, pid, "cpu").is_empty());
    assert!(written, "no profile of the program on the stalled file system");
    let files = daemon.profiles(PROGRAM, pid, "cpu");
    Profile::decode(files.last().expect("one at least"))
}

fn assert_names_the_stall(profile: &Profile, fs: &HungFs) {
    let path = fs.program_path().display().to_string();
    let comment = profile.comments.iter().find(|c| c.contains("file not fully read") && c.contains(&path));
    let comment = comment.unwrap_or_else(|| panic!("no comment names {path}: {:#?}", profile.comments));
    assert!(comment.contains("did not answer") || comment.contains("is stalled"), "{comment}");
    assert!(!profile.function_names().iter().any(|f| f.contains("hot_a")), "named from a file that never answered?");
}
