//! `profiler run` end to end: the daemon against fixtures with known CPU splits and known
//! allocation sites, one module per concern: the periodic files and retention (`files`),
//! full and read-only output file systems (`disk`), the socket's endpoints, refusals and
//! per-uid visibility (`api`), a client flooding the socket (`flood`), the block, mutex and threadcreate profiles against a program's
//! own lock-wait clock (`waits`), perf maps planted by a process's owner (`untrusted`), SIGHUP, SIGTERM and `check-config` (`lifecycle`), processes that come and go (`processes`), cgroup matchers applied in the kernel (`cgroups`), heap probes of exited processes
//! released (`resources`), a stack table full of history (`soak`), thread dumps on the socket and in interval dumps (`threads`), their per-uid budget and who may take them (`dumps`),
//! the systemd unit's capability set (`capabilities`), and pushing profiles to Pyroscope and
//! OTLP backends (`export`, and when they fail, `export_delivery`).
//!
//! Intervals are 1-4 s and every wait is bounded, so a hung daemon fails a test rather than
//! hanging it. Run with `--test-threads=1`: the tests share the machine's CPUs and each
//! daemon samples all of them.

mod api;
mod attacks;
mod capabilities;
mod cgroups;
mod disk;
mod dumps;
mod export;
mod export_delivery;
mod files;
mod flood;
mod go_text;
mod lifecycle;
mod processes;
mod resources;
mod soak;
mod stalls;
mod threads;
mod untrusted;
mod waits;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use profiler_tests::daemon::{self, wait_for, Daemon};
use profiler_tests::{listing, Fixture, Profile};

/// `DaemonConfig::new`'s rate; also the period every CPU profile must state.
const FREQUENCY_HZ: i64 = 199;
/// Longer than any test; the guards kill the fixtures at the end.
const FIXTURE_S: u32 = 120;
/// hot_a's share of hot_a + hot_b in cpu_split, by construction.
const HOT_A_SHARE: f64 = 0.75;
/// ±10 points: over 4 standard deviations at the ~400 samples of one 2 s interval (3.5 at
/// 230 samples; [`assert_split`] widens it to 3.5σ for files with fewer).
const SHARE_TOLERANCE: f64 = 0.10;
/// How long a test waits for something that should happen within an interval or two.
const SOON: Duration = Duration::from_secs(15);

/// How long a new heap target may wait for its probes: the daemon looks every 5 s, so three
/// of its scans.
const HEAP_SCAN: Duration = Duration::from_secs(15);
const CPU_SPLIT: &str = "cpu_split";
const HEAP_SITES: &str = "heap_sites";

/// Waits (up to [`HEAP_SCAN`]) until the daemon has put heap probes on `heap_sites`, started
/// with `usr1` for its delay, then tells it to allocate (SIGUSR1): none of its allocations
/// comes before the probes.
fn allocate_once_probed(daemon: &Daemon, heap: &Fixture) {
    let probed = wait_for(HEAP_SCAN, || daemon.heap_processes().contains(&u64::from(heap.pid())));
    assert!(probed, "heap probes not attached to heap_sites within {HEAP_SCAN:?}: {:#}", daemon.status());
    heap.signal(libc::SIGUSR1);
}

/// Waits until the fixture's directory holds at least `n` CPU profiles; returns them.
fn wait_for_files(daemon: &Daemon, fixture: &Fixture, n: usize) -> Vec<PathBuf> {
    let enough = wait_for(SOON, || daemon.profiles(fixture.comm(), fixture.pid(), "cpu").len() >= n);
    assert!(enough, "fewer than {n} cpu profiles within {SOON:?}; output holds:\n{}", listing(daemon.output()));
    daemon.profiles(fixture.comm(), fixture.pid(), "cpu")
}

/// Waits until `n` CPU profiles that were not there on entry have appeared; returns them in
/// name order.
fn new_files(daemon: &Daemon, fixture: &Fixture, n: usize) -> Vec<PathBuf> {
    let old: BTreeSet<PathBuf> = daemon.profiles(fixture.comm(), fixture.pid(), "cpu").into_iter().collect();
    let fresh = || -> Vec<PathBuf> {
        let files = daemon.profiles(fixture.comm(), fixture.pid(), "cpu");
        files.into_iter().filter(|f| !old.contains(f)).collect()
    };
    let timeout = Duration::from_secs(30);
    assert!(
        wait_for(timeout, || fresh().len() >= n),
        "fewer than {n} new profiles within {timeout:?}:\n{}",
        listing(daemon.output())
    );
    fresh().into_iter().take(n).collect()
}

/// Seconds between consecutive files' modification times.
fn mtime_gaps(files: &[PathBuf]) -> Vec<f64> {
    let times: Vec<SystemTime> = files.iter().map(|f| daemon::modified(f)).collect();
    times.windows(2).map(|w| w[1].duration_since(w[0]).unwrap_or_default().as_secs_f64()).collect()
}

fn file_size(file: &Path) -> u64 {
    std::fs::metadata(file).map_or(0, |m| m.len())
}

/// hot_a / (hot_a + hot_b) by sample count is 0.75 ± 0.10, or ± 3.5σ of the binomial share
/// when the file has fewer than the 230 samples that make 0.10 that wide (a short first
/// interval, a 1 s one). 50 samples at least: 3.5σ is then 0.21, so the check is weaker
/// there (hot_a and hot_b swapped still fail it; an even split does not always).
fn assert_split(profile: &Profile, file: &Path) {
    let in_fn = |f: &str| profile.value_where("samples", |s| s.contains(f)) as f64;
    let (a, b) = (in_fn("hot_a"), in_fn("hot_b"));
    assert!(a + b >= 50.0, "{} has only {a} + {b} samples in hot_a/hot_b", file.display());
    let share = a / (a + b);
    let sigma = (HOT_A_SHARE * (1.0 - HOT_A_SHARE) / (a + b)).sqrt();
    let tolerance = SHARE_TOLERANCE.max(3.5 * sigma);
    assert!(
        (share - HOT_A_SHARE).abs() <= tolerance,
        "{}: hot_a share {share:.3} ({a} of {}), expected {HOT_A_SHARE} ± {tolerance:.3}",
        file.display(),
        a + b
    );
}

fn no_temporary_files(dir: &Path) {
    let leftovers: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left in {}: {leftovers:?}", dir.display());
}

/// The pids of an index (`/debug/pprof/`): each process row links to `?pid=N`.
fn index_pids(body: &[u8]) -> Vec<u32> {
    let text = String::from_utf8_lossy(body);
    text.split("href='?pid=").skip(1).filter_map(|rest| rest.split('\'').next()?.parse().ok()).collect()
}
