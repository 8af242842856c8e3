//! Local users attacking the daemon through the files their processes map (security review
//! 3, N1, N2 and N4): each attack runs as `nobody`, with no privilege, beside a root process whose
//! profiles must stay right. The daemon must keep collecting (its collector's uptime in
//! `/status` keeps pace with the clock, dumps go on), stay under the unit's `MemoryHigh`,
//! and keep naming the root process's functions.

use std::time::{Duration, Instant};

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use profiler_tests::daemon::{wait_for, Daemon, DaemonConfig};
use profiler_tests::fuse::HungFs;
use profiler_tests::{preflight, Fixture, FixtureKind, Profile, TempDir};

use super::{assert_split, new_files, CPU_SPLIT, FIXTURE_S};

/// The unit's `MemoryHigh=` (config/profiler.service).
const MEMORY_HIGH_BYTES: u64 = 384 << 20;
/// How long the daemon is watched after an attack: past the offload's 5 s stall limit, and
/// several 2 s dumps.
const WATCH: Duration = Duration::from_secs(12);

/// N1: a file swapped for a FIFO between the daemon's look at a mapped path and its open
/// of it. The daemon opens each mapped file once, through the mapping itself, so it never
/// opens the FIFO (an open of a FIFO for reading waits for a writer for ever).
#[test]
fn a_fifo_swapped_in_for_a_mapped_file_does_not_stop_the_collector() {
    if !preflight() {
        return;
    }
    let scratch = TempDir::new("fifo-swap");
    let home = nobody_home(&scratch);
    let daemon = Daemon::start(&DaemonConfig::new(&[CPU_SPLIT, "fifo_swap"]));
    let split = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    // An ELF file any user can read, copied and mapped by the attacker.
    let elf = FixtureKind::CpuSplitC.build();
    let (home_arg, elf_arg) = (home.to_string_lossy().into_owned(), elf.to_string_lossy().into_owned());
    // Each copy flips for 300 ms, longer than the daemon takes to see the mapping and
    // register it, so a daemon that looks the path up twice meets the FIFO within a few.
    let mut attacker =
        Fixture::spawn_as_nobody_with_args(FixtureKind::FifoSwap, &[&home_arg, &elf_arg, "20", "300"], scratch.path());
    let attempts = attacker.read_value("attempts");
    attacker.expect_line("done");
    assert_eq!(attempts, 20);
    watch_collector(&daemon, WATCH);
    for file in new_files(&daemon, &split, 2) {
        let profile = Profile::decode(&file);
        assert_split(&profile, &file);
        assert!(profile.function_names().contains(&"hot_a"), "root's functions unnamed in {file:?}");
    }
}

/// N2: a user maps a 60 KB file whose compressed `.debug_frame` holds one FDE of 40 MiB of
/// `DW_CFA_advance_loc` (40 M rows): a builder that checks its row cap after building the
/// rows needs 2 GB for it (measured: `profiler unwind-table` peaked at 1.97 GB before the
/// budget). The daemon refuses it while reading its CFI, stays small, and remembers the
/// refusal in `.unwind-refused`, so a restart does not build it again.
#[test]
fn a_library_whose_cfi_would_take_gigabytes_is_refused_before_it_is_built() {
    if !preflight() {
        return;
    }
    let scratch = TempDir::new("cfi-bomb");
    let home = nobody_home(&scratch);
    let bomb = home.join("bomb.so");
    let script = profiler_tests::workspace_root().join("tests/fixtures/cfi_bomb.py");
    let base = FixtureKind::CpuSplitC.build();
    let made = Command::new("python3").arg(&script).arg(&bomb).arg(&base).arg("40").status().unwrap();
    assert!(made.success(), "cfi_bomb.py failed");
    let daemon = Daemon::start(&DaemonConfig::new(&[CPU_SPLIT, "fifo_swap"]));
    let split = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let (home_arg, bomb_arg) = (home.to_string_lossy().into_owned(), bomb.to_string_lossy().into_owned());
    // One copy, mapped and left so (no flipping).
    let mut attacker =
        Fixture::spawn_as_nobody_with_args(FixtureKind::FifoSwap, &[&home_arg, &bomb_arg, "1", "0"], scratch.path());
    attacker.read_value("attempts");
    attacker.expect_line("done");
    watch_collector(&daemon, WATCH);
    let record = daemon.output().join(".unwind-refused");
    let refused = std::fs::read_to_string(&record).unwrap_or_default();
    assert!(refused.contains("one FDE would pass the cap"), "no refusal in {}: {refused:?}", record.display());
    for file in new_files(&daemon, &split, 2) {
        let profile = Profile::decode(&file);
        assert_split(&profile, &file);
        assert!(profile.function_names().contains(&"hot_a"), "root's functions unnamed in {file:?}");
    }
}

/// N4: a user swaps the directory of a running program of theirs for a symlink into a
/// FUSE mount that never answers. Whoever looks the program's path up again sleeps for
/// ever; the daemon does not look it up while the program lives (it opens the file through
/// the mapping), and once it has exited a walk that hangs is charged to no device: the
/// root file system, where the path began and where every other process's files are, is
/// never skipped.
#[test]
fn a_symlink_into_a_hung_mount_does_not_blind_the_root_file_system() {
    if !preflight() {
        return;
    }
    // Declared first, so dropped last: a daemon thread stuck in the file system keeps the
    // daemon from exiting until the server is gone.
    let daemon;
    let fs = HungFs::start(FixtureKind::CpuSplitNoFp, &[&FIXTURE_S.to_string()], None);
    fs.hang();
    let scratch = TempDir::new("symlink-swap");
    let home = scratch.path().join("nobody");
    let dir = home.join("d");
    std::fs::create_dir_all(&dir).unwrap();
    let program = dir.join("cpu_split");
    std::fs::copy(FixtureKind::CpuSplitC.build(), &program).unwrap();
    for path in [&home, &dir, &program] {
        std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap();
    }
    daemon = Daemon::start(&DaemonConfig::new(&[CPU_SPLIT]));
    let split = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(&program).arg(FIXTURE_S.to_string());
    let attacker = Fixture::from_command(FixtureKind::CpuSplitC, cmd);
    // The attacker's own profile, written once: its files were read while the path held.
    new_files(&daemon, &attacker, 1);
    let swap = format!("mv d d.old && ln -s {} d", fs.mountpoint().display());
    let swapped = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c", &swap])
        .current_dir(&home)
        .status()
        .unwrap();
    assert!(swapped.success(), "the swap failed");
    watch_collector(&daemon, WATCH);
    // Gone: from now on only its path leads to its file, into the hung mount.
    drop(attacker);
    watch_collector(&daemon, WATCH);
    let root_fs = std::fs::metadata(FixtureKind::CpuSplitC.build()).unwrap().dev();
    let root_fs = format!("{}:{}", libc::major(root_fs), libc::minor(root_fs));
    let status = daemon.status();
    let skipped = status["stalled"]["devices_skipped_now"].as_array().cloned().unwrap_or_default();
    assert!(!skipped.iter().any(|d| d == &*root_fs), "the root file system {root_fs} is skipped: {status:#}");
    for file in new_files(&daemon, &split, 2) {
        let profile = Profile::decode(&file);
        assert_split(&profile, &file);
        assert!(profile.function_names().contains(&"hot_a"), "root's functions unnamed in {file:?}");
    }
}

/// N15: a crowd of busy processes the selection leaves out, more of them than the walkers'
/// LRU of processes already asked about holds (1,024). Each walk of one the LRU had evicted
/// asked for its registration again and woke the collector; now each is declined once the
/// catalogue knows it, and its walks stop asking. The window starts once 99% are declined
/// and is counted in CPU samples (20 per member), not in time, so that a loaded machine only
/// makes it longer. Measured here over such a window: ~1,650 asks before the declines (the
/// members outside the LRU ask at every walk), ~60 with them (the last 1% once each, and
/// the programs the machine started meanwhile).
#[test]
fn a_crowd_the_selection_leaves_out_stops_asking_for_registrations() {
    if !preflight() {
        return;
    }
    const CROWD: u64 = 1_500;
    let scratch = TempDir::new("crowd");
    let mut config = DaemonConfig::new(&[CPU_SPLIT]);
    config.frequency_hz = 999;
    let daemon = Daemon::start(&config);
    let crowd = Fixture::spawn_as_nobody_with_args(FixtureKind::SpinnerCrowd, &[&CROWD.to_string()], scratch.path());
    let held = || daemon.status_u64("/process_events/registrations_declined/held");
    let declined = wait_for(Duration::from_secs(120), || held() >= CROWD * 99 / 100);
    assert!(declined, "{} of {CROWD} left-out processes declined: {:#}", held(), daemon.status());
    let asks = || daemon.status_u64("/process_events/registration_asks");
    let samples = || daemon.status_u64("/samples/cpu");
    let (asks_before, samples_before) = (asks(), samples());
    let walked = wait_for(Duration::from_secs(120), || samples() >= samples_before + 20 * CROWD);
    assert!(walked, "the crowd was not sampled: {:#}", daemon.status());
    let (asked, sampled) = (asks() - asks_before, samples() - samples_before);
    eprintln!("{asked} registration asks in {sampled} CPU samples of {CROWD} left-out processes");
    assert!(
        asked < CROWD / 5,
        "{asked} registration asks in {sampled} CPU samples of {CROWD} processes the selection leaves out: {:#}",
        daemon.status()
    );
    assert_eq!(daemon.status_u64("/process_events/registrations_declined/full"), 0);
    // The crowd gone, its declines are withdrawn at the next drains.
    drop(crowd);
    let withdrawn = wait_for(Duration::from_secs(60), || held() < CROWD / 10);
    assert!(withdrawn, "{} declines left after the crowd exited: {:#}", held(), daemon.status());
    watch_collector(&daemon, Duration::from_secs(8));
}

/// For `watch`: `/status` answers, the collector's uptime there keeps pace with the clock
/// (the board is the collector's: a stuck collector freezes it), dumps go on, and the
/// daemon's resident memory never reached the unit's `MemoryHigh` (its high-water mark).
pub fn watch_collector(daemon: &Daemon, watch: Duration) {
    let started = Instant::now();
    let (uptime_before, dumps_before) = (daemon.status_u64("/uptime_seconds"), daemon.status_u64("/output/dumps"));
    while started.elapsed() < watch {
        std::thread::sleep(Duration::from_millis(250));
    }
    // The kernel's own high-water mark: a peak between two looks is not missed.
    let peak_rss = rss_bytes(daemon.pid(), "VmHWM:");
    let status = daemon.status();
    let uptime = status["uptime_seconds"].as_u64().unwrap_or(0);
    let advanced = uptime.saturating_sub(uptime_before);
    assert!(
        advanced + 3 >= watch.as_secs(),
        "the collector's uptime advanced {advanced} s in {watch:?}: it stopped; {status:#}"
    );
    let dumps = status["output"]["dumps"].as_u64().unwrap_or(0);
    assert!(dumps >= dumps_before + 3, "dumps stopped ({dumps_before} → {dumps}): {status:#}");
    assert!(peak_rss < MEMORY_HIGH_BYTES, "the daemon's RSS reached {} MiB", peak_rss >> 20);
    assert!(!daemon.log().contains("panicked"), "{}", daemon.log());
}

/// `SCRATCH/nobody`, a directory nobody owns: where the attacker works.
fn nobody_home(scratch: &TempDir) -> std::path::PathBuf {
    let home = scratch.path().join("nobody");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
    home
}

/// A process's resident set as `field` of its status (`VmRSS:`, `VmHWM:`), 0 when unreadable.
fn rss_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.split_whitespace().next());
    kib.and_then(|k| k.parse::<u64>().ok()).unwrap_or(0) * 1024
}
