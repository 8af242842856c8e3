//! The daemon's block, mutex and threadcreate profiles against `lock_contention`
//! (tests/fixtures/lock_contention.c), which measures with CLOCK_MONOTONIC how long its
//! threads waited for a mutex, and creates exactly 5 threads from `main`.

use std::path::PathBuf;

use profiler_tests::daemon::{self, wait_for, Daemon, DaemonConfig};
use profiler_tests::pprof::Sample;
use profiler_tests::{go_pprof, listing, preflight, process_dir, Fixture, FixtureKind, Profile};

use super::SOON;

const LOCK_CONTENTION: &str = "lock_contention";
/// Seconds the fixture waits after `ready`, so its threads start after the daemon attached.
const DELAY_S: &str = "2";
const LINGER_S: &str = "60";
/// As in tests/tests/futex.rs: the block delay under the locking function, and the mutex
/// delay under the unlocking one, against the program's own total.
const DELAY_TOLERANCE: f64 = 0.15;
const MUTEX_TOLERANCE: f64 = 0.25;
/// One cond_waiter and four lockers.
const THREADS_CREATED: i64 = 5;

/// With block, mutex and threadcreate on, `/debug/pprof/{block,mutex,threadcreate}?pid=`
/// (totals since the daemon attached, before the fixture started) hold the fixture's lock
/// waits within 15% under contend_lock and within 25% charged to release_lock, and exactly
/// the 5 threads main created; `go tool pprof` reads all three; the interval dumps include
/// block files with the same waits.
#[test]
fn block_mutex_and_threadcreate_endpoints_match_the_programs_own_clock() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&[LOCK_CONTENTION]);
    config.profiles = vec!["block", "mutex", "threadcreate"];
    let daemon = Daemon::start(&config);
    let mut fixture = Fixture::spawn_with_args(FixtureKind::LockContention, &[DELAY_S, LINGER_S]);
    let lock_truth = fixture.read_value("lock_wait_ns") as i64;
    let _cond_truth = fixture.read_value("cond_wait_ns");
    fixture.expect_line("done");
    let pid = fixture.pid();

    let under_lock = |s: &Sample| s.has_chain(&["contend_lock", "locker"]);
    // The waits reach the daemon at its next drain (every second).
    let block = fetch_until(&daemon, "block", pid, |p| {
        p.value_where("delay", under_lock) as f64 >= lock_truth as f64 * (1.0 - DELAY_TOLERANCE)
    });
    within(
        block.1.value_where("delay", under_lock),
        lock_truth,
        DELAY_TOLERANCE,
        "block delay under contend_lock",
        &block.0,
    );
    assert!(
        go_pprof::raw(&block.0).contains("contend_lock"),
        "`go tool pprof -raw` of {} lacks contend_lock",
        block.0.display()
    );

    let under_unlock = |s: &Sample| s.has_chain(&["release_lock", "locker"]);
    let mutex = fetch_until(&daemon, "mutex", pid, |p| p.value_where("delay", under_unlock) > 0);
    within(
        mutex.1.value_where("delay", under_unlock),
        lock_truth,
        MUTEX_TOLERANCE,
        "mutex delay charged to release_lock",
        &mutex.0,
    );
    assert!(
        go_pprof::raw(&mutex.0).contains("release_lock"),
        "`go tool pprof -raw` of {} lacks release_lock",
        mutex.0.display()
    );

    let threads = fetch_until(&daemon, "threadcreate", pid, |p| p.total("threadcreate") >= THREADS_CREATED);
    assert_eq!(threads.1.total("threadcreate"), THREADS_CREATED, "threads created, in {}", threads.0.display());
    assert_eq!(
        threads.1.value_where("threadcreate", |s| s.contains("main")),
        THREADS_CREATED,
        "every thread was created under main, in {}",
        threads.0.display()
    );
    assert!(go_pprof::raw(&threads.0).contains("main"), "`go tool pprof -raw` of {} lacks main", threads.0.display());

    // The interval files: the waits are spread over the intervals the fixture ran in.
    let dir = process_dir(daemon.output(), LOCK_CONTENTION, pid);
    let dumped = wait_for(SOON, || {
        let delay: i64 = daemon::profile_files(&dir, "block")
            .iter()
            .map(|f| Profile::decode(f).value_where("delay", under_lock))
            .sum();
        delay as f64 >= lock_truth as f64 * (1.0 - DELAY_TOLERANCE)
    });
    assert!(dumped, "the block dumps do not add up to the fixture's lock waits within {SOON:?}:\n{}", listing(&dir));
}

/// Fetches `/debug/pprof/KIND?pid=PID` until it answers and `done` holds for the profile
/// (or `SOON` has passed: the process is known from the drain after its first wait);
/// returns the last answer, saved, and decoded.
fn fetch_until(daemon: &Daemon, kind: &str, pid: u32, done: impl Fn(&Profile) -> bool) -> (PathBuf, Profile) {
    let path = daemon.scratch().join(format!("{kind}.pb.gz"));
    let url = format!("/debug/pprof/{kind}?pid={pid}");
    let fetch = || {
        let (code, body) = daemon.get(&url);
        (code == 200).then(|| {
            std::fs::write(&path, &body).unwrap_or_else(|e| panic!("failed to write {}: {e}", path.display()));
            Profile::decode(&path)
        })
    };
    wait_for(SOON, || fetch().is_some_and(|p| done(&p)));
    let body = daemon.get_ok(&url);
    std::fs::write(&path, &body).unwrap_or_else(|e| panic!("failed to write {}: {e}", path.display()));
    let profile = Profile::decode(&path);
    (path, profile)
}

fn within(got: i64, truth: i64, tolerance: f64, what: &str, file: &std::path::Path) {
    if let Err(message) = profiler_tests::expect::check_within(got, truth, tolerance, what) {
        panic!("{message} (ns, against the program's own clock), in {}", file.display());
    }
}
