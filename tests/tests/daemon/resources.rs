//! What the daemon holds for processes that come and go: heap probes are released when
//! their process exits, so a pool of short-lived workers cannot exhaust its descriptors.

use std::time::Duration;

use profiler_tests::daemon::{wait_for, Daemon, DaemonConfig};
use profiler_tests::{preflight, Fixture, FixtureKind};

use super::{HEAP_SITES, SOON};

/// Heap targets started at once per round.
const WORKERS: usize = 10;
const ROUNDS: usize = 3;
/// How long detaching every probe of a round may take: ~170 probes at up to 300 ms each.
const RELEASE_WITHIN: Duration = Duration::from_secs(60);
/// What a probed process holds at least: a perf-event descriptor per probe (about 8 on
/// this glibc, where functions alias).
const MIN_FDS_PER_TARGET: usize = 6;

/// Ground truth: the probe descriptors in `/proc/DAEMON/fd` (perf events and BPF links;
/// the symbolizer's files and the socket's connections come and go beside them and are not
/// counted). Rounds of 10 heap_sites workers, all matched by the heap include, attached,
/// then killed: while they run the daemon holds at least 6 probe descriptors for each (so
/// the count would show a leak), and once they have exited those are released: the count
/// after each round returns to the count before it, and dumps go on.
#[test]
fn heap_probes_are_released_when_their_process_exits() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&[HEAP_SITES]);
    config.profiles = vec!["cpu", "heap"];
    config.heap_include = vec![HEAP_SITES];
    let daemon = Daemon::start(&config);
    for round in 0..ROUNDS {
        let before = fds(daemon.pid());
        // They allocate after 60 s: long after they are killed; probing is what is tested.
        let workers: Vec<Fixture> =
            (0..WORKERS).map(|_| Fixture::spawn_with_args(FixtureKind::HeapSites, &["60", "60"])).collect();
        let pids: Vec<u64> = workers.iter().map(|w| u64::from(w.pid())).collect();
        // The daemon looks for new heap targets every 5 s.
        let attached = wait_for(SOON, || {
            let probed = daemon.heap_processes();
            pids.iter().all(|p| probed.contains(p))
        });
        assert!(attached, "round {round}: not every worker was probed: {:#}", daemon.status());
        let holding = fds(daemon.pid());
        assert!(
            holding >= before + WORKERS * MIN_FDS_PER_TARGET,
            "round {round}: {holding} descriptors with {WORKERS} targets probed, {before} before"
        );
        drop(workers);
        // Every target's descriptors go, all of them: detaching a uprobe takes the kernel
        // ~100 ms (more on a busy machine), and there are ~170 here.
        let released = wait_for(RELEASE_WITHIN, || fds(daemon.pid()) <= before);
        let after = fds(daemon.pid());
        assert!(
            released,
            "round {round}: {after} probe descriptors after the workers exited, {before} before they started, \
             {holding} while probed"
        );
    }
    let dumps = daemon.status_u64("/output/dumps");
    assert!(wait_for(Duration::from_secs(10), || daemon.status_u64("/output/dumps") > dumps), "dumps stopped");
}

/// The descriptors of `pid` that probes hold: perf events and BPF links.
fn fds(pid: u32) -> usize {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"));
    dir.filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| {
            let target = target.to_string_lossy();
            target == "anon_inode:[perf_event]" || target == "anon_inode:bpf_link"
        })
        .count()
}
