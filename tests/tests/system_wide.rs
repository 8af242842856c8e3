//! A system-wide snapshot (no --pid) with two known busy processes running: each gets its own
//! `<comm>-<pid>/cpu.pb.gz`, every directory written holds a profile that decodes, and the
//! fixtures' profiles hold only their own thread and their hot function.

use profiler_tests::{assert_success, expect, listing, preflight, run_profiler};
use profiler_tests::{Fixture, FixtureKind, Profile, TempDir};

/// Both fixtures by name and pid, and every other directory well-formed.
#[test]
fn system_wide_snapshot_profiles_every_busy_process() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("system");
    let c = Fixture::spawn(FixtureKind::CpuSplitC, 10);
    let rust = Fixture::spawn(FixtureKind::CpuSplitRust, 10);
    let output = run_profiler(&["snapshot", "--duration", "3s", "--output", &out.path_arg()]);
    assert_success(&output, "system-wide snapshot");

    let dirs: Vec<_> = std::fs::read_dir(out.path())
        .expect("output directory exists")
        .map(|e| e.expect("readable output directory").path())
        .collect();
    assert!(dirs.len() >= 2, "expected at least 2 profile directories:\n{}", listing(out.path()));
    for dir in &dirs {
        let path = dir.join("cpu.pb.gz");
        assert!(path.is_file(), "{} has no cpu.pb.gz:\n{}", dir.display(), listing(out.path()));
        let profile = Profile::decode(&path);
        assert!(!profile.samples.is_empty(), "{} holds no samples", path.display());
    }
    for fixture in [&c, &rust] {
        let path = expect::profile_written(out.path(), fixture.comm(), fixture.pid());
        let profile = Profile::decode(&path);
        let tid = i64::from(fixture.pid());
        assert!(
            profile.samples.iter().all(|s| s.label_num("tid") == Some(tid)),
            "{} holds samples of other threads than {tid}",
            path.display()
        );
        assert!(
            profile.samples.iter().any(|s| s.contains("hot_a")),
            "{} has no hot_a; functions: {:?}",
            path.display(),
            profile.function_names()
        );
    }
}
