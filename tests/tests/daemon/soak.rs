//! F18's soak, accelerated: a process making a new distinct stack every fraction of a
//! millisecond fills a stack table cut to 2,000 entries (`PROFILER_TEST_MAX_STACKS`, a test
//! hook; the daemon keeps 200,000) within seconds, and the since-start totals keep naming
//! every one of them. A process started afterwards with known stacks still gets its frames:
//! history is evicted (counted), new stacks are not refused for it, and the totals' entries
//! of evicted stacks are folded together, so they stay bounded too.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use profiler_daemon::profiles::exited;
use profiler_tests::daemon::{self, wait_for, Daemon, DaemonConfig};
use profiler_tests::{listing, preflight, Fixture, FixtureKind, Profile};

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
/// threads folded under `(exited threads)`, which `/status` counts.
///
/// Ground truth: each worker spins 60 us of its own CPU time, less than one 1 ms period, so
/// each sample of a worker is a distinct thread: at least about one per ms of the workers'
/// CPU time (which the fixture measures), ~1,200 a child, far more than the 256 kept. Every
/// thread sampled in a child (the `tid` labels of its interval files) is folded once the
/// child has exited, except the at most 256 left when its last fold ran.
#[test]
fn exited_threads_are_folded_in_the_since_start_totals() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&[THREAD_CHURN]);
    config.frequency_hz = 999;
    let daemon = Daemon::start(&config);
    let mut churn = Fixture::spawn_with_args(FixtureKind::ThreadChurn, &["1", "30", "60"]);
    let waits = churn.read_value("waits");
    let mut line = String::new();
    churn.read_line(&mut line);
    let worker_cpu_ms: Vec<u64> = line
        .trim()
        .strip_prefix("worker_cpu_ms")
        .map(|rest| rest.split_whitespace().filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default();
    assert_eq!(worker_cpu_ms.len(), 2, "thread_churn printed {line:?}, not `worker_cpu_ms A B`");
    // The fixture's own claim: enough worker CPU time that a child's sampled threads, ~n
    // for n ms (sigma sqrt(n)), pass the bound at 3.5 sigma: n - 3.5 sqrt(n) > 256.
    let bound = exited::THREADS_KEPT as f64 + 1.0;
    let floor = ((3.5 + (3.5f64 * 3.5 + 4.0 * bound).sqrt()) / 2.0).powi(2).ceil() as u64;
    for (child, &ms) in worker_cpu_ms.iter().enumerate() {
        assert!(ms >= floor, "child {child}'s workers ran {ms} ms, fewer than the {floor} ms the bound needs");
    }
    churn.expect_line("done");
    // Both children have exited: two dumps later, their last intervals are written and folded.
    let dumps = daemon.status_u64("/output/dumps");
    let settled = wait_for(Duration::from_secs(30), || daemon.status_u64("/output/dumps") >= dumps + 2);
    assert!(settled, "no two dumps within 30 s; status: {}", daemon.status());

    let sampled = children_sampled_threads(&daemon, churn.pid());
    assert_eq!(sampled.len(), 2, "cpu profiles of two children; output holds:\n{}", listing(daemon.output()));
    let folded = daemon.status_u64("/output/exited_threads_folded");
    let total: usize = sampled.iter().map(BTreeMap::len).sum();
    let counts: Vec<usize> = sampled.iter().map(BTreeMap::len).collect();
    // A sample the kernel counted as the daemon swapped count sets arrives an interval
    // late: its thread may be folded at one dump and named again, and folded again, at the
    // next. At most once per interval file naming it.
    let namings: u64 = sampled.iter().flat_map(BTreeMap::values).sum();
    eprintln!(
        "{waits} thread exits; workers' CPU ms {worker_cpu_ms:?}; threads sampled {counts:?} \
         (named in {namings} interval files); folded {folded}"
    );
    for (child, threads) in sampled.iter().enumerate() {
        assert!(
            threads.len() > exited::THREADS_KEPT,
            "child {child}: {} threads sampled in {} ms of its workers' CPU time",
            threads.len(),
            worker_cpu_ms[child]
        );
    }
    let least = (total - 2 * exited::THREADS_KEPT) as u64;
    assert!(
        (least..=namings).contains(&folded),
        "{folded} threads folded; {total} were sampled, at most 256 a child may stay, and they were named in \
         {namings} files; status: {}",
        daemon.status()
    );
}

/// For each child (the `thread_churn` processes other than `parent`), the `tid` labels of
/// its CPU interval files, with the number of files naming each.
fn children_sampled_threads(daemon: &Daemon, parent: u32) -> Vec<BTreeMap<i64, u64>> {
    let parent_dir = format!("{THREAD_CHURN}-{parent}");
    let mut dirs: Vec<_> = std::fs::read_dir(daemon.output())
        .expect("output dir")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(&format!("{THREAD_CHURN}-")) && name != parent_dir
        })
        .collect();
    dirs.sort();
    dirs.iter()
        .map(|dir| {
            let mut threads = BTreeMap::new();
            for file in daemon::profile_files(dir, "cpu") {
                let tids: BTreeSet<i64> =
                    Profile::decode(&file).samples.iter().filter_map(|s| s.label_num("tid")).collect();
                for tid in tids {
                    *threads.entry(tid).or_default() += 1;
                }
            }
            threads
        })
        .collect()
}
