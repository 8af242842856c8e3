//! `[processes]` cgroup matchers applied in the kernel: a process outside the selected
//! cgroups costs no stack walk, and is counted as such.

use std::path::PathBuf;
use std::time::Duration;

use profiler_tests::daemon::{wait_for, Daemon, DaemonConfig};
use profiler_tests::{preflight, Fixture, FixtureKind, Profile};

use super::{assert_split, wait_for_files, FIXTURE_S, FREQUENCY_HZ};

/// A cgroup of the unified hierarchy made for one test, removed on drop (after its
/// processes are gone).
struct Cgroup {
    dir: PathBuf,
    path: String,
}

impl Cgroup {
    fn new(name: &str) -> Self {
        let root = profiler_daemon::cgroups::cgroup2_root().expect("a cgroup2 mount");
        let path = format!("/{name}-{}", std::process::id());
        let dir = root.join(&path[1..]);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self { dir, path }
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("move into the cgroup");
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Its processes were killed just before (declared after it): wait for them to leave.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Ground truth: two busy processes, cpu_split in a cgroup the configuration includes and
/// cpu_split_rs outside it. Only the first is profiled (with its 75/25 split), and the
/// kernel counts the second's samples as not selected without walking them: over a few
/// seconds, at least half of one busy thread's samples are counted so, and the samples
/// walked grow like one busy thread's, not two.
#[test]
fn a_cgroup_include_is_applied_in_the_kernel() {
    if !preflight() {
        return;
    }
    let cgroup = Cgroup::new("profiler-test-cgroup");
    let inside = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    cgroup.add(inside.pid());
    let outside = Fixture::spawn(FixtureKind::CpuSplitRust, FIXTURE_S);
    let mut config = DaemonConfig::new(&[]);
    config.include_cgroups = vec![cgroup.path.clone()];
    let daemon = Daemon::start(&config);
    let files = wait_for_files(&daemon, &inside, 2);
    let last = files.last().expect("files");
    assert_split(&Profile::decode(last), last);
    let (filtered, walked) = (daemon.status_u64("/drops/cpu_cgroup_not_selected"), daemon.status_u64("/samples/cpu"));
    let window = Duration::from_secs(4);
    std::thread::sleep(window);
    let filtered = daemon.status_u64("/drops/cpu_cgroup_not_selected") - filtered;
    let walked = daemon.status_u64("/samples/cpu") - walked;
    let one_thread = FREQUENCY_HZ as f64 * window.as_secs_f64();
    assert!(filtered as f64 >= one_thread * 0.5, "{filtered} samples filtered in the kernel, of ~{one_thread:.0}");
    assert!((walked as f64) < one_thread * 1.5, "{walked} samples walked: more than the one selected process");
    let none = wait_for(Duration::from_secs(3), || !daemon.profiles(outside.comm(), outside.pid(), "cpu").is_empty());
    assert!(!none, "a profile of the process outside the cgroup");
}
