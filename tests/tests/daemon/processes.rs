//! Processes as they come and go under the daemon: short-lived ones, one running before the
//! daemon started, a binary replaced on disk between two runs, and a process that execs
//! another program in place. Each is named and unwound from its first sample.

use std::path::{Path, PathBuf};
use std::process::Command;

use profiler_tests::daemon::{profile_files, wait_for, Daemon, DaemonConfig};
use profiler_tests::{Fixture, FixtureKind, Profile, TempDir};

use super::{allocate_once_probed, assert_split, wait_for_files, FIXTURE_S, SOON};

/// Of the samples in a process's own code, the share unwound to main and named (see
/// `tests/processes.rs`).
const MIN_CHAINED_SHARE: f64 = 0.95;

/// Ground truth: `short_lived` (no frame pointers) runs spin ← work ← main for 60 ms of CPU,
/// 40 times in a row from a shell. The daemon writes every one's interval profiles, and at
/// least 95% of their samples (over 1,000) have that chain, symbolized.
#[test]
fn short_lived_processes_are_named_and_unwound() {
    if !profiler_tests::preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&["short_lived"]);
    config.frequency_hz = 999;
    let daemon = Daemon::start(&config);
    let script = "for i in $(seq 40); do \"$0\" 60; done";
    let program = FixtureKind::ShortLived.build();
    let status = Command::new("sh").args(["-c", script]).arg(&program).status().expect("sh");
    assert!(status.success());
    // Their last samples are written at the next dump.
    let dumps = daemon.status_u64("/output/dumps");
    assert!(wait_for(SOON, || daemon.status_u64("/output/dumps") >= dumps + 2), "no dump");
    let files = files_of(daemon.output(), "short_lived");
    let processes = dirs_of(daemon.output(), "short_lived");
    assert_eq!(processes, 40, "one directory per process");
    let (total, chained) = profiler_tests::pprof::tally_chain(&files, &["spin", "work", "main"]);
    assert!(total >= 1000, "only {total} samples of ~2400");
    // How long each process waited for its tables, and, if short, whether the loss is
    // spread over every process (each registered late) or is a few processes registered
    // long after they started (while the collector was busy elsewhere).
    let latency = daemon.status().pointer("/process_events/registered_after_exec").cloned();
    let missed = latency.as_ref().and_then(|l| l["exited_unregistered"].as_u64()).expect("exited_unregistered");
    let processes = per_process_chains(daemon.output(), "short_lived");
    // A process the collector did not get to within its 60 ms (beside CPU hogs it can wait
    // that long for a CPU, or be in the middle of a dump) is walked with frame pointers
    // only and has no chain at all: the daemon counts those (`exited_unregistered`), and as
    // many chainless processes as it counted are left out of the share. Every other process
    // must be unwound, and missing more than a tenth of them is a failure however loaded.
    let mut chainless: Vec<i64> = processes.iter().filter(|(_, _, chained)| *chained == 0).map(|p| p.1).collect();
    chainless.sort_unstable_by(|a, b| b.cmp(a));
    let excused: i64 = chainless.iter().take(missed as usize).sum();
    let share = chained as f64 / (total - excused).max(1) as f64;
    eprintln!(
        "{chained} of {total} samples ({share:.4} without the {excused} of {missed} processes the daemon says exited \
         unregistered) have spin ← work ← main; registered after exec: {latency:?}"
    );
    assert!(missed <= 4, "{missed} of 40 processes exited before they were registered: {latency:?}");
    let short: Vec<String> = processes
        .into_iter()
        .filter(|(_, total, chained)| chained < total)
        .map(|(dir, total, chained)| format!("{dir}: {} of {total}", total - chained))
        .collect();
    assert!(
        share >= MIN_CHAINED_SHARE,
        "{chained} of {total} samples ({share:.3}, {excused} of {missed} unregistered processes' left out) have \
         spin ← work ← main; without it, by process: {short:?}"
    );
}

/// Ground truth: cpu_split built without frame pointers runs before the daemon starts. The
/// daemon reads it from `/proc` and loads its table before it samples anything: its very
/// first interval profile has the 75/25 split and at least 95% of its samples on
/// hot_a|hot_b ← work_loop ← main.
#[test]
fn a_process_running_before_the_daemon_is_unwound_from_its_first_sample() {
    if !profiler_tests::preflight() {
        return;
    }
    let fixture = Fixture::spawn(FixtureKind::CpuSplitNoFp, FIXTURE_S);
    let mut config = DaemonConfig::new(&[FixtureKind::CpuSplitNoFp.comm()]);
    config.interval = "1s".into();
    let daemon = Daemon::start(&config);
    let first = wait_for_files(&daemon, &fixture, 1).into_iter().next().expect("one file");
    let profile = Profile::decode(&first);
    assert_split(&profile, &first);
    let samples = profile.value_index("samples");
    let total: i64 = profile.samples.iter().map(|s| s.values[samples]).sum();
    let chained: i64 = profile
        .samples
        .iter()
        .filter(|s| s.has_chain(&["hot_a", "work_loop", "main"]) || s.has_chain(&["hot_b", "work_loop", "main"]))
        .map(|s| s.values[samples])
        .sum();
    let share = chained as f64 / total as f64;
    assert!(share >= MIN_CHAINED_SHARE, "first interval: {chained} of {total} samples ({share:.3}) reach main");
}

/// Ground truth: a program at one path runs, is profiled, and exits; a rebuild with other
/// function names (`alpha_a`, `alpha_b` for `hot_a`, `hot_b`) is renamed over the same path,
/// as a build or a package upgrade does, and runs. The daemon names each run's functions
/// from its own file: the second run's profile has alpha_a and no hot_a.
#[test]
fn a_binary_replaced_on_disk_gets_its_own_symbols() {
    if !profiler_tests::preflight() {
        return;
    }
    let scratch = TempDir::new("replaced");
    let app = scratch.path().join("cpu_split");
    std::fs::copy(FixtureKind::CpuSplitC.build(), &app).unwrap();
    let daemon = Daemon::start(&DaemonConfig::new(&["cpu_split"]));
    let first = run_from(&app);
    let old = wait_for_files(&daemon, &first, 1);
    assert!(Profile::decode(&old[0]).function_names().contains(&"hot_a"));
    drop(first);
    let rebuilt = scratch.path().join("rebuilt");
    let source = profiler_tests::workspace_root().join("tests/fixtures/cpu_split.c");
    let flags = ["-O1", "-g", "-fno-omit-frame-pointer", "-fno-inline", "-Dhot_a=alpha_a", "-Dhot_b=alpha_b"];
    profiler_tests::cc::compile(&flags, &source, &rebuilt).unwrap_or_else(|e| panic!("{e}"));
    std::fs::rename(&rebuilt, &app).unwrap();
    let second = run_from(&app);
    let new = wait_for_files(&daemon, &second, 1);
    let names = Profile::decode(&new[0]).function_names().into_iter().map(str::to_string).collect::<Vec<_>>();
    assert!(names.iter().any(|n| n == "alpha_a"), "the new file's names: {names:?}");
    assert!(!names.iter().any(|n| n == "hot_a"), "the old file's names for the new file: {names:?}");
}

/// Ground truth: `sh` sleeps 1 s, then execs cpu_split in the same process (same pid). The
/// daemon files its profiles under what it became (`cpu_split-PID`, selected by that name),
/// with cpu_split's functions.
#[test]
fn a_process_that_execs_in_place_is_profiled_as_what_it_became() {
    if !profiler_tests::preflight() {
        return;
    }
    let daemon = Daemon::start(&DaemonConfig::new(&["cpu_split"]));
    let mut fixture = Fixture::spawn_exec_later(FixtureKind::CpuSplitC, "1", FIXTURE_S);
    fixture.expect_line("ready");
    let files = wait_for_files(&daemon, &fixture, 2);
    let last = files.last().expect("two files");
    assert_split(&Profile::decode(last), last);
    let sh_dir = profiler_tests::process_dir(daemon.output(), "sh", fixture.pid());
    assert!(!sh_dir.exists(), "filed under the shell it was: {}", sh_dir.display());
}

/// Runs a copy of cpu_split from `path`.
fn run_from(path: &Path) -> Fixture {
    let mut cmd = Command::new(path);
    cmd.arg(FIXTURE_S.to_string());
    Fixture::from_command(FixtureKind::CpuSplitC, cmd)
}

/// The processes named `comm` the daemon wrote a directory for.
fn dirs_of(out: &Path, comm: &str) -> usize {
    let prefix = format!("{comm}-");
    let entries = std::fs::read_dir(out).expect("output directory");
    entries.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)).count()
}

/// Per process named `comm`: its directory, its samples in spin, work or main, and those
/// with the whole chain.
fn per_process_chains(out: &Path, comm: &str) -> Vec<(String, i64, i64)> {
    let prefix = format!("{comm}-");
    let entries = std::fs::read_dir(out).expect("output directory");
    let dirs = entries.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().starts_with(&prefix));
    dirs.map(|d| {
        let files = profile_files(&d.path(), "cpu");
        let (total, chained) = profiler_tests::pprof::tally_chain(&files, &["spin", "work", "main"]);
        (d.file_name().to_string_lossy().into_owned(), total, chained)
    })
    .collect()
}

/// Every CPU profile of the processes named `comm`.
fn files_of(out: &Path, comm: &str) -> Vec<PathBuf> {
    let prefix = format!("{comm}-");
    let entries = std::fs::read_dir(out).expect("output directory");
    let dirs = entries.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().starts_with(&prefix));
    dirs.flat_map(|d| profile_files(&d.path(), "cpu")).collect()
}

/// Ground truth: heap_sites (heap-profiled: its probes attached, its sampled blocks live)
/// exits, and its pid is handed on purpose to a new process, cpu_split (the init
/// namespace's `ns_last_pid` set to one below it just before the fork). The new process is
/// filed as cpu_split with cpu_split's functions only, is no longer heap-profiled (the old
/// one's probes and blocks are gone), and has no heap profile.
#[test]
fn a_reused_pid_never_shows_the_old_process() {
    if !profiler_tests::preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&["heap_sites", "cpu_split"]);
    config.profiles = vec!["cpu", "heap"];
    config.heap_include = vec!["heap_sites"];
    config.sample_bytes = Some("1B".into());
    let daemon = Daemon::start(&config);
    // It allocates when told, once its probes are on (the daemon looks every 5 s).
    let mut old = Fixture::spawn_with_args(FixtureKind::HeapSites, &["usr1", "60"]);
    let pid = old.pid();
    allocate_once_probed(&daemon, &old);
    old.expect_line("allocated");
    assert!(wait_for(SOON, || !daemon.profiles("heap_sites", pid, "heap").is_empty()), "no heap profile of it");
    drop(old);
    // Past a drain: what the kernel counted for the old process is read before the new one
    // (the kernel's counts name processes by pid; see ARCHITECTURE.md, "Not built yet").
    std::thread::sleep(std::time::Duration::from_secs(2));
    let new = spawn_with_pid(pid).unwrap_or_else(|| panic!("pid {pid} was never handed out again"));
    let files = wait_for_files(&daemon, &new, 2);
    let last = Profile::decode(files.last().expect("files"));
    let names = last.function_names();
    assert!(names.contains(&"hot_a"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("site_")), "the old process's functions: {names:?}");
    assert!(!daemon.heap_processes().contains(&u64::from(pid)), "the old process's heap probes are kept");
    assert!(daemon.profiles("cpu_split", pid, "heap").is_empty(), "a heap profile of the new process");
    let (status, body) = daemon.get(&format!("/debug/pprof/heap?pid={pid}&debug=1"));
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
}

/// Starts cpu_split with pid `pid`, by setting the next pid the kernel hands out; retries
/// while other processes on the machine take it first.
fn spawn_with_pid(pid: u32) -> Option<Fixture> {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).expect("write ns_last_pid (as root)");
        let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
        if fixture.pid() == pid {
            return Some(fixture);
        }
    }
    None
}
