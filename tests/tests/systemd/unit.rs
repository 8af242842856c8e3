//! The unit's life as systemd sees it with the shipped files: enabled, started at boot,
//! active only once the daemon is ready, its socket and directories as the unit and config
//! name them, and a clean stop that leaves a final dump.

use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use profiler_tests::nspawn::Container;
use profiler_tests::{daemon, go_pprof, listing, FixtureKind, Profile};

use super::{
    fixture_dir, get_ok, machine_fit, only_cpu_file, replace_once, shipped, status, wait_active, wait_for_samples,
    with_unit, ENOUGH_SAMPLES, FIXTURE_S, OUTPUT, READY_STATUS, SHIPPED_HZ, SHIPPED_INTERVAL_S, SOCKET, SOON, UNIT,
};

/// syscall_heavy is >95% system time; half leaves room for samples taken as it enters or
/// leaves the kernel without accepting a dump that lost kernel stacks (~45 samples: 7σ).
const MIN_KERNEL_SHARE: f64 = 0.5;

/// Ground truth: the unit is enabled and started at boot with the shipped files, unchanged.
/// systemd counts it active only once the daemon said so (Type=notify), i.e. after the socket
/// was created and the programs attached, and shows the daemon's status line. The socket and
/// directories have the modes the unit and config name, and systemd applies the unit's
/// memory, descriptor and start limits. A CPU-bound fixture started inside
/// the container is sampled, beside syscall_heavy (almost all of its time inside read(2));
/// `systemctl stop` makes the daemon write a final dump of both that both readers decode, with
/// syscall_heavy's kernel frames present and named (/proc/kallsyms is readable under the
/// sandbox), and the unit deactivates with exit status 0.
#[test]
fn systemd_runs_the_shipped_unit_and_stop_leaves_a_final_dump() {
    if !machine_fit() {
        return;
    }
    let mut container = with_unit(&shipped("profiler.toml"));
    container.boot();
    wait_active(&container);
    assert_eq!(container.show(UNIT, "UnitFileState"), "enabled");
    assert_eq!(container.show(UNIT, "Type"), "notify");
    assert_eq!(container.show(UNIT, "StatusText"), READY_STATUS);
    // The resource bounds the unit states are the ones systemd applies.
    let limits = ["MemoryHigh", "MemoryMax", "LimitNOFILE", "StartLimitBurst", "StartLimitIntervalUSec"];
    let applied = container.properties(UNIT, &limits);
    let expected = [(384u64 << 20).to_string(), (768u64 << 20).to_string(), "65536".into(), "5".into(), "10min".into()];
    for (name, want) in limits.iter().zip(&expected) {
        assert_eq!(applied[*name].as_str(), want.as_str(), "{name}: {applied:?}");
    }
    check_ready_after_socket(&container);
    check_socket_and_directories(&container, 0);
    let status = status(&container);
    assert_eq!(status["programs"]["cpu"], true, "{status:#}");
    assert_eq!(status["programs"]["cpu_frequency_hz"], SHIPPED_HZ, "{status:#}");
    assert_eq!(status["output"]["interval_seconds"], SHIPPED_INTERVAL_S, "{status:#}");
    assert_eq!(status["output"]["dir"], OUTPUT, "{status:#}");
    assert!(status["last_error"].is_null(), "{status:#}");

    check_go_endpoints_of_an_idle_process(&container);

    let fixture = container.spawn_fixture(FixtureKind::CpuSplitC, &[FIXTURE_S]);
    let kernel = container.spawn_fixture(FixtureKind::SyscallHeavy, &[FIXTURE_S]);
    wait_for_samples(&container, ENOUGH_SAMPLES);
    let stop = Instant::now();
    container.systemctl(&["stop", UNIT]);
    let took = stop.elapsed();
    let unit = container.properties(UNIT, &["ActiveState", "Result", "ExecMainCode", "ExecMainStatus"]);
    let journal = container.journal(UNIT);
    assert_eq!(unit["ActiveState"], "inactive", "{unit:?}\n{journal}");
    assert_eq!(unit["Result"], "success", "{unit:?}\n{journal}");
    // CLD_EXITED with status 0: the daemon exited by itself, not by a signal.
    assert_eq!((unit["ExecMainCode"].as_str(), unit["ExecMainStatus"].as_str()), ("1", "0"), "{journal}");
    for line in ["stopping: writing a final dump", "stopped", "profiler.service: Deactivated successfully"] {
        assert!(journal.contains(line), "the journal lacks {line:?}:\n{journal}");
    }
    assert!(took < Duration::from_secs(30), "systemctl stop took {took:?}");

    let output = container.path(OUTPUT);
    let file = only_cpu_file(&fixture_dir(&output, fixture.comm(), fixture.ns_pid(), fixture.host_pid()));
    let profile = Profile::decode(&file);
    assert!(!profile.samples.is_empty(), "the final dump {} has no samples", file.display());
    go_pprof::raw(&file);
    check_whole_dump(&output);
    let kernel_file = only_cpu_file(&fixture_dir(&output, kernel.comm(), kernel.ns_pid(), kernel.host_pid()));
    check_kernel_names(&Profile::decode(&kernel_file));
}

/// Go's endpoints under the shipped configuration, for a live process that has slept since
/// it started (lock_contention in its first minute): its page lists its thread dump and a
/// CPU profile before anything of it was sampled, and `goroutine?debug=2` answers with its
/// one thread, asleep in `main`.
fn check_go_endpoints_of_an_idle_process(container: &Container) {
    let idle = container.spawn_fixture(FixtureKind::LockContention, &["60", "1"]);
    let pid = idle.ns_pid();
    let page = String::from_utf8_lossy(&get_ok(container, &format!("/debug/pprof/?pid={pid}"))).into_owned();
    for link in [format!("goroutine?pid={pid}"), format!("profile?pid={pid}")] {
        assert!(page.contains(&link), "the idle process's page lacks {link}:\n{page}");
    }
    let dump =
        String::from_utf8_lossy(&get_ok(container, &format!("/debug/pprof/goroutine?pid={pid}&debug=2"))).into_owned();
    // Named in the container's pid namespace: the thread is the process's own pid there.
    let header = format!("thread {pid} \"");
    assert!(dump.starts_with(&header) && dump.contains("main"), "goroutine?debug=2 of pid {pid}:\n{dump}");
    assert_eq!(dump.matches("\nthread ").count() + 1, 1, "one thread expected:\n{dump}");
}

/// Ground truth: `[socket] group = "profiler"` (the config's commented example) with a
/// `profiler` group in the container's /etc/group: the socket is root's, of that group, mode
/// 0660, and the daemon still starts under the unit's capabilities (CAP_CHOWN).
#[test]
fn systemd_socket_gets_the_group_the_config_names() {
    if !machine_fit() {
        return;
    }
    let config = replace_once(&shipped("profiler.toml"), "# group = \"profiler\"", "group = \"profiler\"");
    let mut container = with_unit(&config);
    let mut groupadd = std::process::Command::new("groupadd");
    groupadd.arg("--root").arg(container.root()).args(["--system", "profiler"]);
    let added = profiler_tests::run::run_with_timeout(&mut groupadd, SOON);
    assert!(added.status.success(), "{groupadd:?}: {}", String::from_utf8_lossy(&added.stderr));
    let gid = group_id(&container.root().join("etc/group"), "profiler");
    container.boot();
    wait_active(&container);
    check_socket_and_directories(&container, gid);
}

/// Type=notify: systemd moved the unit to active only after the daemon had created its socket
/// (and given it its mode), not when it forked the process. Compared on CLOCK_MONOTONIC, which
/// the container shares with the host. File times come from the coarse clock, up to a tick
/// behind; hence the slack on the lower bound only.
fn check_ready_after_socket(container: &Container) {
    let times = container.properties(UNIT, &["ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic"]);
    let us = |key: &str| -> i128 { times[key].parse().unwrap_or_else(|_| panic!("{key} is not a number: {times:?}")) };
    let (started, active) = (us("ExecMainStartTimestampMonotonic"), us("ActiveEnterTimestampMonotonic"));
    let socket = std::fs::metadata(container.path(SOCKET)).expect("the socket exists");
    let created = monotonic_us(socket.mtime(), socket.mtime_nsec());
    let changed = monotonic_us(socket.ctime(), socket.ctime_nsec());
    let tick_us = 20_000;
    assert!(
        started - tick_us <= created && changed <= active,
        "expected process start ({started} µs) <= socket creation ({created} µs) <= its last chmod/chown \
         ({changed} µs) <= systemd's active ({active} µs): systemd did not wait for READY=1"
    );
}

/// The socket is `root:<gid>` mode 0660 under the unit's RuntimeDirectory= (0755), and the
/// profiles' directory is StateDirectory= with its 0750.
fn check_socket_and_directories(container: &Container, gid: u32) {
    let socket = std::fs::metadata(container.path(SOCKET)).expect("the socket exists");
    assert!(socket.file_type().is_socket(), "{SOCKET} is not a socket");
    assert_eq!(socket.mode() & 0o7777, 0o660, "mode of {SOCKET}: {:o}", socket.mode());
    assert_eq!((socket.uid(), socket.gid()), (0, gid), "owner and group of {SOCKET}");
    for (dir, mode) in [("/run/profiler", 0o755), (OUTPUT, 0o750)] {
        let meta = std::fs::metadata(container.path(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
        assert!(meta.is_dir(), "{dir} is not a directory");
        assert_eq!(meta.mode() & 0o7777, mode, "mode of {dir}: {:o}", meta.mode());
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "owner of {dir}");
    }
}

/// A file time (realtime) on CLOCK_MONOTONIC, in µs.
fn monotonic_us(secs: i64, nsecs: i64) -> i128 {
    let realtime_now = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_nanos() as i128;
    let mut mono = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to the valid pointer it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut mono) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    let mono_now = i128::from(mono.tv_sec) * 1_000_000_000 + i128::from(mono.tv_nsec);
    let file = i128::from(secs) * 1_000_000_000 + i128::from(nsecs);
    (file - realtime_now + mono_now) / 1000
}

/// The gid of `group` in the group file at `path`.
fn group_id(path: &Path, group: &str) -> u32 {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("failed to read {}: {e}", path.display()));
    text.lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&group)).then(|| fields.get(2)?.parse().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("no group {group} in {}", path.display()))
}

/// Every file of the dump decodes, none is a leftover temporary, and every kernel frame in it
/// has a name.
fn check_whole_dump(output: &Path) {
    let mut kernel_names = BTreeSet::new();
    let mut files = 0;
    for dir in
        std::fs::read_dir(output).unwrap_or_else(|e| panic!("failed to list {}: {e}", output.display())).flatten()
    {
        for file in std::fs::read_dir(dir.path()).into_iter().flatten().flatten() {
            let name = daemon::file_name(&file.path());
            assert!(name.ends_with(".pb.gz") && !name.contains(".tmp"), "unexpected file {}", file.path().display());
            let profile = Profile::decode(&file.path());
            kernel_names.extend(profile.samples.iter().flat_map(|s| s.kernel_frames().map(|f| f.function.clone())));
            files += 1;
        }
    }
    assert!(files > 0, "the final dump wrote nothing:\n{}", listing(output));
    let unnamed: Vec<&String> = kernel_names.iter().filter(|n| n.is_empty() || n.starts_with("0x")).collect();
    assert!(unnamed.is_empty(), "unnamed kernel frames in the final dump: {unnamed:?} among {kernel_names:?}");
}

/// syscall_heavy's samples are nearly all in the kernel: most of them carry kernel frames, and
/// the read path is named among them (an unreadable /proc/kallsyms under the sandbox would
/// leave none, or hex).
fn check_kernel_names(profile: &Profile) {
    assert!(!profile.samples.is_empty(), "syscall_heavy has no samples in the final dump");
    let share = profile.fraction_where("samples", |s| s.kernel_frames().next().is_some());
    let names: BTreeSet<&str> =
        profile.samples.iter().flat_map(|s| s.kernel_frames().map(|f| f.function.as_str())).collect();
    assert!(
        share >= MIN_KERNEL_SHARE,
        "only {:.0}% of syscall_heavy's samples have kernel frames (is /proc/kallsyms readable under the unit?): {names:?}",
        share * 100.0
    );
    assert!(
        names.iter().any(|n| n.contains("read") || n.to_lowercase().contains("syscall")),
        "no kernel frame of syscall_heavy names the read path: {names:?}"
    );
}
