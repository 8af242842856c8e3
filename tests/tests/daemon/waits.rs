//! The daemon's block, mutex and threadcreate profiles against `lock_contention`
//! (tests/fixtures/lock_contention.c), which measures with CLOCK_MONOTONIC how long its
//! threads waited for a mutex, and creates exactly 3 threads from `main`; its off-CPU
//! profile against `offcpu_sleeper` (tests/fixtures/offcpu_sleeper.c), which measures its
//! sleeps.

use std::path::PathBuf;
use std::time::Duration;

use profiler_tests::daemon::{self, wait_for, Daemon, DaemonConfig};
use profiler_tests::lock_waits::LockWaits;
use profiler_tests::pprof::Sample;
use profiler_tests::{go_pprof, listing, preflight, process_dir, Fixture, FixtureKind, Profile};

use super::SOON;

const LOCK_CONTENTION: &str = "lock_contention";
const OFFCPU_SLEEPER: &str = "offcpu_sleeper";
const STACK_FLOOD: &str = "stack_flood";
/// Every switch recorded: as in tests/tests/offcpu.rs.
const OFFCPU_TOLERANCE: f64 = 0.10;
/// Seconds the fixture waits after `ready`, so its threads start after the daemon attached.
const DELAY_S: &str = "2";
const LINGER_S: &str = "60";
/// As in tests/tests/futex.rs: the block delay under the locking function, and the mutex
/// delay under the unlocking one, against the program's own total (at least: a sampled
/// estimate's 3.5σ where wider, see `LockWaits`).
const DELAY_TOLERANCE: f64 = 0.15;
const MUTEX_TOLERANCE: f64 = 0.25;
/// The daemon's default sampling (config/raw.rs): a block rate of 1ms (which the mutex
/// profile's wakes are sampled by too), and a mutex fraction of 1.
const BLOCK_RATE_NS: u64 = 1_000_000;
const MUTEX_FRACTION: u32 = 1;
/// One cond_waiter and two lockers.
const THREADS_CREATED: i64 = 3;

/// With block, mutex and threadcreate on, `/debug/pprof/{block,mutex,threadcreate}?pid=`
/// (totals since the daemon attached, before the fixture started) hold the fixture's lock
/// waits within 15% under contend_lock and within 25% charged to release_lock, and exactly
/// the 3 threads main created; `go tool pprof` reads all three; the interval dumps include
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
    let truth = LockWaits::read(&mut fixture);
    let _cond_truth = fixture.read_value("cond_wait_ns");
    fixture.expect_line("done");
    let pid = fixture.pid();

    let under_lock = |s: &Sample| s.has_chain(&["contend_lock", "locker"]);
    let block_tolerance = truth.block_tolerance(DELAY_TOLERANCE, BLOCK_RATE_NS);
    let block_floor = truth.least(block_tolerance);
    // The waits reach the daemon at its next drain (every second).
    let block = fetch_until(&daemon, "block", pid, |p| p.value_where("delay", under_lock) as f64 >= block_floor);
    within_runnable(
        block.1.value_where("delay", under_lock),
        &truth,
        block_tolerance,
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
    within_runnable(
        mutex.1.value_where("delay", under_unlock),
        &truth,
        truth.mutex_tolerance(MUTEX_TOLERANCE, BLOCK_RATE_NS, MUTEX_FRACTION),
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
        delay as f64 >= block_floor
    });
    assert!(dumped, "the block dumps do not add up to the fixture's lock waits within {SOON:?}:\n{}", listing(&dir));
}

/// With offcpu on at every switch, `/debug/pprof/offcpu?pid=&seconds=2` taken while the
/// fixture's threads run holds their sleeps; the totals since the daemon attached hold
/// sleep_long's time within 10% of its own clock; `go tool pprof -raw` reads it, `debug=1`
/// answers its text, and the interval dumps write `offcpu-<stamp>.pb.gz`.
#[test]
fn offcpu_endpoint_and_dumps_match_the_programs_own_clock() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&[OFFCPU_SLEEPER]);
    config.profiles = vec!["offcpu"];
    config.offcpu_sample_every = Some(1);
    let daemon = Daemon::start(&config);
    let mut fixture = Fixture::spawn_with_args(FixtureKind::OffCpuSleeper, &[DELAY_S, LINGER_S]);
    let pid = fixture.pid();
    // Once the threads' first sleeps are in (after the fixture's 2 s delay), they run ~4 s
    // more: a 2 s window falls inside their work.
    let started = fetch_until(&daemon, "offcpu", pid, |p| p.value_where("off_cpu", |s| s.contains("sleep_short")) > 0);
    assert!(
        started.1.value_where("off_cpu", |s| s.contains("sleep_short")) > 0,
        "the daemon never had sleep_short's off-CPU time, in {}",
        started.0.display()
    );
    let window = daemon.scratch().join("offcpu-window.pb.gz");
    std::fs::write(&window, daemon.get_ok(&format!("/debug/pprof/offcpu?pid={pid}&seconds=2"))).unwrap();
    let windowed = Profile::decode(&window);
    assert!(
        windowed.value_where("off_cpu", |s| s.contains("sleep_short")) > 0,
        "the seconds=2 window lacks sleep_short, in {}",
        window.display()
    );
    let truth = fixture.read_value("sleep_long_ns") as i64;
    for key in ["sleep_short_ns", "pipe_read_ns", "cond_wait_ns", "starved_wall_ns", "sleep_short_sq_us2"] {
        let _ = fixture.read_value(key);
    }
    fixture.expect_line("done");

    let under = |s: &Sample| s.contains("sleep_long") && s.label_str("state") == Some("blocked");
    // The main thread sleeps DELAY_S, then waits in pthread_join at least as long as
    // sleep_long ran: each one switch-out longer than the 2 s dump interval, its stack stored
    // before a dump and its time charged after. Both keep their frames.
    let delay_ns: i64 = DELAY_S.parse::<i64>().unwrap() * 1_000_000_000;
    let in_main = |s: &Sample| s.contains("main") && s.label_str("state") == Some("blocked");
    let main_floor = (delay_ns + truth) as f64 * (1.0 - OFFCPU_TOLERANCE);
    let offcpu = fetch_until(&daemon, "offcpu", pid, |p| {
        p.value_where("off_cpu", under) as f64 >= truth as f64 * (1.0 - OFFCPU_TOLERANCE)
            && p.value_where("off_cpu", in_main) as f64 >= main_floor
    });
    within(offcpu.1.value_where("off_cpu", under), truth, OFFCPU_TOLERANCE, "off-CPU ns under sleep_long", &offcpu.0);
    assert!(
        go_pprof::raw(&offcpu.0).contains("sleep_long"),
        "`go tool pprof -raw` of {} lacks sleep_long",
        offcpu.0.display()
    );
    let main_ns = offcpu.1.value_where("off_cpu", in_main);
    assert!(
        main_ns as f64 >= main_floor,
        "main's sleep and join off the CPU across dumps: {main_ns} ns under main, expected at least {} ns, in {}",
        delay_ns + truth,
        offcpu.0.display()
    );
    let text = String::from_utf8_lossy(&daemon.get_ok(&format!("/debug/pprof/offcpu?pid={pid}&debug=1"))).into_owned();
    assert!(text.contains("sleep_long"), "debug=1 lacks sleep_long:\n{text}");

    let dir = process_dir(daemon.output(), OFFCPU_SLEEPER, pid);
    let dumped = wait_for(SOON, || !daemon::profile_files(&dir, "offcpu").is_empty());
    assert!(dumped, "no offcpu interval dump within {SOON:?}:\n{}", listing(&dir));
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

/// A stack flood (stack_flood: ~30,000 waits a second from 65,536 call paths) under a
/// daemon whose stack table is cut to 20,000 (`PROFILER_TEST_MAX_STACKS`) and whose interval
/// is long, so no dump makes any stack evictable: the kernel lets the flood bring in half its
/// table every second, which fills the daemon's within seconds. lock_contention, whose
/// waits start once the table is full, still gets its frames (the flood holds at most its
/// share of the daemon's table too): its lock delay under contend_lock within 15% of its own
/// clock; `/status` counts the flood's refusals and names it, and its profile says so.
#[test]
fn a_stack_flood_does_not_take_the_daemons_stack_table() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&[LOCK_CONTENTION, STACK_FLOOD]);
    config.profiles = vec!["block"];
    config.interval = "1h".into();
    config.launcher = vec!["env".into(), "PROFILER_TEST_MAX_STACKS=20000".into()];
    let daemon = Daemon::start(&config);
    let mut flood = Fixture::spawn_with_args(FixtureKind::StackFlood, &["20"]);
    let full = wait_for(Duration::from_secs(15), || daemon.status_u64("/maps/userspace_stacks/entries") >= 9_000);
    assert!(full, "the flood did not bring 9,000 stacks in 15 s; status: {}", daemon.status());
    let mut fixture = Fixture::spawn_with_args(FixtureKind::LockContention, &[DELAY_S, LINGER_S]);
    let truth = LockWaits::read(&mut fixture);
    let _cond_truth = fixture.read_value("cond_wait_ns");
    fixture.expect_line("done");

    let under_lock = |s: &Sample| s.has_chain(&["contend_lock", "locker"]);
    let tolerance = truth.block_tolerance(DELAY_TOLERANCE, BLOCK_RATE_NS);
    let block_floor = truth.least(tolerance);
    let block =
        fetch_until(&daemon, "block", fixture.pid(), |p| p.value_where("delay", under_lock) as f64 >= block_floor);
    let got = block.1.value_where("delay", under_lock);
    within_runnable(got, &truth, tolerance, "block delay under contend_lock beside the flood", &block.0);
    let refused = daemon.status_u64("/drops/stacks_refused_over_share");
    let most = daemon.status_u64("/drops/stacks_refused_over_share_most/pid");
    assert!(
        refused > 0 && most == u64::from(flood.pid()),
        "refusals {refused}, most by pid {most}; status: {}",
        daemon.status()
    );
    let flood_block = fetch_until(&daemon, "block", flood.pid(), |_| true);
    assert!(
        flood_block.1.comments.iter().any(|c| c.contains("this process held its share")),
        "the flood's profile does not say it was refused: {:?}",
        flood_block.1.comments
    );
    let waits = flood.read_value("waits");
    eprintln!("flood: {waits} waits; {refused} stacks refused over its share");
}

/// Within `tolerance` of the lock calls' time less their runnable part (see [`LockWaits`]):
/// on a loaded machine a lock call's time is partly a wait for a CPU, which no futex wait holds.
fn within_runnable(got: i64, truth: &LockWaits, tolerance: f64, what: &str, file: &std::path::Path) {
    if let Err(message) = truth.check(got, tolerance, what) {
        panic!("{message} (ns, against the program's own clock), in {}", file.display());
    }
}

fn within(got: i64, truth: i64, tolerance: f64, what: &str, file: &std::path::Path) {
    if let Err(message) = profiler_tests::expect::check_within(got, truth, tolerance, what) {
        panic!("{message} (ns, against the program's own clock), in {}", file.display());
    }
}
