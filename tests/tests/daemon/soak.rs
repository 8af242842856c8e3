//! F18's soak, accelerated: a process making a new distinct stack every fraction of a
//! millisecond fills a stack table cut to 2,000 entries (`PROFILER_TEST_MAX_STACKS`, a test
//! hook; the daemon keeps 200,000) within seconds, and the since-start totals keep naming
//! every one of them. A process started afterwards with known stacks still gets its frames:
//! history is evicted (counted), new stacks are not refused for it, and the totals' entries
//! of evicted stacks are folded together, so they stay bounded too.

use std::time::Duration;

use profiler_tests::daemon::{wait_for, Daemon, DaemonConfig};
use profiler_tests::{preflight, Fixture, FixtureKind, Profile};

use super::{assert_split, new_files, CPU_SPLIT, FIXTURE_S};

const STACK_CHURN: &str = "stack_churn";
const THREAD_CHURN: &str = "thread_churn";

/// Ground truth: stack_churn's sampled stacks never repeat (a few hundred per 2 s interval),
/// so 2,000 slots are full of them within seconds, more than any one interval holds; every
/// later dump leaves the older ones named only by the since-start totals. cpu_split, started once stacks have been evicted, must then show its
/// hot_a/hot_b split in a fresh interval file, and nothing may be refused after the first
/// dump for lack of room.
#[test]
fn new_stacks_are_kept_when_history_fills_the_table() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&[CPU_SPLIT, STACK_CHURN]);
    config.launcher = vec!["env".into(), "PROFILER_TEST_MAX_STACKS=2000".into()];
    let daemon = Daemon::start(&config);
    let _churn = Fixture::spawn(FixtureKind::StackChurn, FIXTURE_S);
    let evicting = wait_for(Duration::from_secs(60), || daemon.status_u64("/drops/userspace_stacks_evicted") > 0);
    assert!(evicting, "no stack evicted within 60 s; status: {}", daemon.status());
    let refused = daemon.status_u64("/drops/userspace_stack_table_full");

    let split = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let files = new_files(&daemon, &split, 3);
    let last = files.last().expect("three files");
    assert_split(&Profile::decode(last), last);
    let evicted = daemon.status_u64("/drops/userspace_stacks_evicted");
    assert!(evicted >= 125, "only {evicted} stacks evicted while stack_churn ran");
    // A refusal needs a table full of stacks seen since the last dump: more than an
    // interval's worth, which stack_churn does not make.
    let refused_now = daemon.status_u64("/drops/userspace_stack_table_full");
    eprintln!("stacks evicted {evicted}, refused before eviction began {refused}, after {}", refused_now - refused);
    assert!(refused_now - refused <= 20, "{} stacks refused after eviction began", refused_now - refused);
    // The since-start totals kept an entry per stack ever seen, named by nothing once its
    // frames were evicted: they are folded after each dump, so they stay bounded.
    let folded = daemon.status_u64("/output/evicted_stack_rows_folded");
    assert!(folded >= 125, "only {folded} since-start rows of evicted stacks folded; status: {}", daemon.status());
}

/// F18's per-thread growth, accelerated: thread_churn's two children each run 20,032
/// short-lived threads, so their since-start CPU counts would keep an entry per sampled
/// thread for good. After a dump, each child's counts past 256 threads have their exited
/// threads folded under `(exited threads)`, which `/status` counts: more than the 256
/// thread ids a process keeps (sampled at 999 Hz, each child's threads number thousands).
#[test]
fn exited_threads_are_folded_in_the_since_start_totals() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&[THREAD_CHURN]);
    config.frequency_hz = 999;
    let daemon = Daemon::start(&config);
    let mut churn = Fixture::spawn_with_args(FixtureKind::ThreadChurn, &["1", "30"]);
    let waits = churn.read_value("waits");
    let folded = wait_for(Duration::from_secs(30), || daemon.status_u64("/output/exited_threads_folded") > 256);
    assert!(folded, "no more than 256 threads folded after {waits} thread exits; status: {}", daemon.status());
    eprintln!("threads folded: {}", daemon.status_u64("/output/exited_threads_folded"));
}
