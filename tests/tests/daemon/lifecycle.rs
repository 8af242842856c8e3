//! The daemon's life: SIGHUP reloads (a bad file keeps the old configuration), the final
//! dump on SIGTERM, and `profiler check-config`.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use profiler_tests::daemon::{self, wait_for, Daemon, DaemonConfig};
use profiler_tests::{go_pprof, listing, preflight, process_dir, run_profiler};
use profiler_tests::{Fixture, FixtureKind, Profile};

use super::{file_size, mtime_gaps, new_files, no_temporary_files, wait_for_files, CPU_SPLIT, FIXTURE_S, SOON};

/// Ground truth: the old configuration's interval. After SIGHUP with garbage in the file the
/// daemon logs "invalid configuration, keeping the old one", still answers, and still cuts
/// files 2 s apart; after SIGHUP with a valid file at 4 s it logs "configuration reloaded",
/// reports the new interval and cuts files 4 s apart.
#[test]
fn sighup_with_a_bad_config_keeps_the_old_one() {
    if !preflight() {
        return;
    }
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let mut config = DaemonConfig::new(&[CPU_SPLIT]);
    let daemon = Daemon::start(&config);
    wait_for_files(&daemon, &fixture, 1);
    daemon.rewrite_config("interval = [this is not toml\n");
    daemon.signal(libc::SIGHUP);
    daemon.wait_for_log("invalid configuration, keeping the old one", SOON);
    assert_eq!(daemon.status_u64("/output/interval_seconds"), 2);
    let old = new_files(&daemon, &fixture, 3);
    for gap in mtime_gaps(&old) {
        assert!((1.5..3.0).contains(&gap), "files {gap:.2} s apart after a bad reload: {old:?}");
    }

    // The frequency is fixed when the program is loaded: the reload says so, and the
    // profiles keep the period the kernel samples at.
    let loaded_hz = config.frequency_hz;
    config.interval = "4s".into();
    config.frequency_hz = loaded_hz * 2;
    daemon.rewrite_config(&config.toml(daemon.output(), daemon.socket()));
    daemon.signal(libc::SIGHUP);
    daemon.wait_for_log("configuration reloaded", SOON);
    daemon.wait_for_log("cpu.frequency_hz", SOON);
    assert_eq!(daemon.status_u64("/output/interval_seconds"), 4);
    // The first dump after the reload may still be on the old schedule; the next two are not.
    let new = new_files(&daemon, &fixture, 3);
    let gap = mtime_gaps(&new)[1];
    assert!((3.5..5.0).contains(&gap), "files {gap:.2} s apart after reloading a 4 s interval: {new:?}");
    let period = Profile::decode(new.last().expect("three files")).period;
    assert_eq!(
        period,
        1_000_000_000 / i64::from(loaded_hz),
        "the period after a reload that asked for {} Hz must stay the loaded {loaded_hz} Hz's",
        config.frequency_hz
    );
}

/// Ground truth: nothing collected is lost at shutdown. SIGTERM sent right after a dump (0.2 s,
/// usually within the same second) makes the daemon exit 0 within 5 s, leaving one more file
/// than before (the final dump, which decodes with both readers), every earlier file
/// untouched, and no temporary file.
#[test]
fn sigterm_leaves_a_final_complete_dump() {
    if !preflight() {
        return;
    }
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let mut daemon = Daemon::start(&DaemonConfig::new(&[CPU_SPLIT]));
    wait_for_files(&daemon, &fixture, 1);
    let written = daemon.status_u64("/output/files_written");
    let dumped = wait_for(SOON, || daemon.status_u64("/output/files_written") > written);
    assert!(dumped, "no dump within {SOON:?}");
    // Enough for the final dump to have samples (199 Hz), little enough that it usually
    // lands in the same second as the dump just seen.
    std::thread::sleep(Duration::from_millis(200));
    let before: Vec<(PathBuf, SystemTime, u64)> = daemon
        .profiles(fixture.comm(), fixture.pid(), "cpu")
        .into_iter()
        .map(|f| (f.clone(), daemon::modified(&f), file_size(&f)))
        .collect();
    daemon.signal(libc::SIGTERM);
    let sent = Instant::now();
    let status = daemon.wait_exit(Duration::from_secs(20));
    let took = sent.elapsed();
    assert!(status.is_some(), "the daemon did not exit within 20 s of SIGTERM; log:\n{}", daemon.log());
    assert!(status.unwrap().success(), "the daemon exited with {status:?}; log:\n{}", daemon.log());
    assert!(took <= Duration::from_secs(5), "the daemon took {took:?} to exit after SIGTERM");
    daemon.wait_for_log("stopped", Duration::from_secs(1));

    let dir = process_dir(daemon.output(), fixture.comm(), fixture.pid());
    let after = daemon::profile_files(&dir, "cpu");
    for (file, mtime, size) in &before {
        assert!(
            daemon::modified(file) == *mtime && file_size(file) == *size,
            "{} was overwritten by the final dump (mtime {mtime:?} -> {:?}, {size} -> {} bytes); the interval it held is lost",
            file.display(),
            daemon::modified(file),
            file_size(file)
        );
    }
    assert_eq!(after.len(), before.len() + 1, "expected one more file after SIGTERM:\n{}", listing(&dir));
    let last = after.last().expect("files");
    let profile = Profile::decode(last);
    assert!(!profile.samples.is_empty(), "the final dump {} has no samples", last.display());
    go_pprof::raw(last);
    no_temporary_files(&dir);
}

/// Ground truth: the documented default file is valid, and validation names the bad key.
#[test]
fn check_config_accepts_the_shipped_file_and_names_bad_keys() {
    if !preflight() {
        return;
    }
    let shipped = profiler_tests::workspace_root().join("config/profiler.toml");
    let output = run_profiler(&["check-config", shipped.to_str().expect("UTF-8 path")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "check-config {}: {output:?}", shipped.display());
    assert!(stdout.starts_with("ok: "), "check-config should print ok: {stdout}");

    let scratch = profiler_tests::TempDir::new("check-config");
    let cases = [
        ("[cpu]\nfrequency_hz = 0\n", "cpu.frequency_hz"),
        ("[retention]\nmax_agee = \"1d\"\n", "max_agee"),
        ("interval = \"0s\"\n", "interval"),
        ("[processes]\ninclude = [{ name = \"a\", pid = 1 }]\n", "processes.include[0]"),
    ];
    for (text, key) in cases {
        let file = scratch.path().join("bad.toml");
        std::fs::write(&file, text).expect("write the bad config");
        let output = run_profiler(&["check-config", file.to_str().expect("UTF-8 path")]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "check-config accepted {text:?}");
        assert!(stderr.contains(key), "check-config of {text:?} should name {key}: {stderr}");
    }
}

/// Ground truth: 300 `true` commands, each exec'd and gone within milliseconds. The daemon
/// tracks every exec'd process before its first sample (to unwind it from the start), so
/// each is briefly in `processes_tracked`; one that exited with no data must be forgotten
/// within seconds (now at the first drain after its exit; once, they stayed for the 60 s
/// grace: a machine running thousands of short commands a second would pile them up). At
/// 19 Hz a few may be sampled and rightly kept for the grace, hence the slack.
#[test]
fn short_lived_processes_without_data_are_forgotten_soon() {
    if !preflight() {
        return;
    }
    const COMMANDS: u64 = 300;
    const SLACK: u64 = 40;
    // Every process: the commands must be selected to be tracked at all.
    let mut config = DaemonConfig::new(&[]);
    config.frequency_hz = 19;
    let daemon = Daemon::start(&config);
    // Each exec'd process is known from its events at once (counted registered or exited
    // before it was), and forgotten at the first drain after its exit.
    let execs = || {
        daemon.status_u64("/process_events/registered_after_exec/processes")
            + daemon.status_u64("/process_events/registered_after_exec/exited_unregistered")
    };
    let execs_before = execs();
    for _ in 0..COMMANDS {
        let status = std::process::Command::new("true").status().expect("failed to run true");
        assert!(status.success());
    }
    let followed = wait_for(SOON, || execs() >= execs_before + COMMANDS);
    // Judged against the processes alive, not a count taken before: other jobs on a loaded
    // machine start and end processes meanwhile, and those alive are rightly tracked.
    let forgotten = wait_for(SOON, || daemon.status_u64("/processes_tracked") <= live_processes() + SLACK);
    let (after, alive) = (daemon.status_u64("/processes_tracked"), live_processes());
    assert!(
        forgotten,
        "{after} processes tracked {SOON:?} after {COMMANDS} short commands ended, {alive} alive: \
         exited processes without data are kept"
    );
    // The test means something only if the commands were tracked at all, which needs exec
    // tracking: every kernel this runs on has the tracepoint, so its absence is a failure.
    let exec_tracking = &daemon.status()["unwind"]["exec_tracking_error"];
    assert!(exec_tracking.is_null(), "exec tracking is off, so execs are not tracked: {exec_tracking}");
    assert!(followed, "the daemon followed {} of the {COMMANDS} commands' execs", execs() - execs_before);
}

/// The processes alive on the machine now (its `/proc`'s numeric entries).
fn live_processes() -> u64 {
    let entries = std::fs::read_dir("/proc").expect("read /proc");
    entries.flatten().filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))).count()
        as u64
}
