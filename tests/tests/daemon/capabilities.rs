//! The systemd unit's capability set is enough. The daemon is started the way the unit
//! starts it, with exactly the `CapabilityBoundingSet=` of `config/profiler.service` and no
//! new privileges, and must still do its whole job on processes it does not own, exporting
//! included.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use std::time::Duration;

use profiler_tests::backend::Backend;
use profiler_tests::daemon::{wait_for, Daemon, DaemonConfig};
use profiler_tests::{preflight, workspace_root, Fixture, FixtureKind, Profile, TempDir};

use super::{assert_split, wait_for_files, FIXTURE_S};

/// The uid and gid of `nobody`, whose process the daemon profiles.
const NOBODY: u32 = 65534;

/// Ground truth: `cpu_split_nofp` runs as `nobody` from a 0700 directory of nobody's, so the
/// daemon reads its maps only with CAP_SYS_PTRACE and its binary only with
/// CAP_DAC_READ_SEARCH (or through `map_files`); it has no frame pointers, so a full stack
/// needs that binary's CFI. `syscall_heavy` spends its time in `read(2)`, whose frames are
/// named only with CAP_SYSLOG. Under the unit's set: the daemon's effective capabilities are
/// that set (so the test means something), the futex and thread programs are attached,
/// the 75/25 split and the `hot → work_loop → main` chains are there, kernel frames have
/// names, and nothing was unreadable.
#[test]
fn the_units_capabilities_are_enough() {
    if !preflight() {
        return;
    }
    let caps = unit_values("CapabilityBoundingSet");
    let mut ambient = unit_values("AmbientCapabilities");
    let mut bounding = caps.clone();
    ambient.sort();
    bounding.sort();
    assert_eq!(ambient, bounding, "the unit's AmbientCapabilities= and CapabilityBoundingSet= differ");

    let home = TempDir::new("caps-home");
    std::os::unix::fs::chown(home.path(), Some(NOBODY), Some(NOBODY)).expect("chown the fixture's directory");
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod 0700");
    let user = Fixture::spawn_as_nobody(FixtureKind::CpuSplitNoFp, FIXTURE_S, home.path());
    let kernel = Fixture::spawn(FixtureKind::SyscallHeavy, FIXTURE_S);

    let mut config = DaemonConfig::new(&[user.comm(), kernel.comm()]);
    config.profiles = vec!["cpu", "block", "mutex", "threadcreate"];
    let names = setpriv_names();
    config.launcher = unit_launcher(&caps, &names);
    let daemon = Daemon::start(&config);
    let mask = caps.iter().fold(0u64, |m, c| m | 1 << cap_number(c, &names));
    assert_eq!(
        effective_caps(daemon.pid()),
        mask,
        "the daemon does not run with exactly the unit's capabilities {caps:?}"
    );

    let status = daemon.status();
    for program in ["cpu", "block", "mutex", "threadcreate"] {
        assert_eq!(status["programs"][program], true, "{program} not attached under the unit's capabilities: {status}");
    }
    let user_file = wait_for_files(&daemon, &user, 2).pop().expect("two files");
    let profile = Profile::decode(&user_file);
    assert_split(&profile, &user_file);
    for hot in ["hot_a", "hot_b"] {
        let chain = [hot, "work_loop", "main"];
        let (all, chained) = (
            profile.value_where("samples", |s| s.contains(hot)),
            profile.value_where("samples", |s| s.has_chain(&chain)),
        );
        assert!(
            chained as f64 >= 0.9 * all as f64,
            "{}: only {chained} of {all} samples in {hot} carry {chain:?}: the binary's CFI was not read",
            user_file.display()
        );
    }
    let kernel_file = wait_for_files(&daemon, &kernel, 1).remove(0);
    let profile = Profile::decode(&kernel_file);
    let mut kernel_names: Vec<&str> =
        profile.samples.iter().flat_map(|s| s.kernel_frames().map(|f| f.function.as_str())).collect();
    kernel_names.sort_unstable();
    kernel_names.dedup();
    assert!(
        !kernel_names.is_empty() && kernel_names.iter().all(|n| !n.is_empty() && !n.starts_with("0x")),
        "{}: kernel frames are missing or unnamed (CAP_SYSLOG?): {kernel_names:?}",
        kernel_file.display()
    );
    let status = daemon.status();
    assert_eq!(status["unwind"]["unreadable_files"], 0, "files unreadable under the unit's capabilities: {status}");
    assert!(status["last_error"].is_null(), "error under the unit's capabilities: {status}");
}

/// `setpriv` with exactly the unit's capability bounding set and no new privileges.
fn unit_launcher(caps: &[String], names: &[String]) -> Vec<String> {
    let set: Vec<String> = caps.iter().map(|c| format!("+{}", setpriv_name(c, names))).collect();
    ["setpriv", "--bounding-set", &format!("-all,{}", set.join(",")), "--inh-caps", "-all", "--no-new-privs", "--"]
        .map(String::from)
        .to_vec()
}

/// The unit keeps sockets to `AF_UNIX`, and its comments show the drop-in that opens
/// `AF_INET`/`AF_INET6` for `[[export]]`. With the unit's capabilities (no more), the daemon
/// pushes its profiles to a backend on 127.0.0.1: exporting needs the drop-in's address
/// families and no capability. (The address-family filter itself is systemd's seccomp
/// filter, applied only under a real systemd: the `systemd` tests' territory.)
#[test]
fn export_needs_the_documented_drop_in_and_no_capability() {
    if !preflight() {
        return;
    }
    assert_eq!(unit_values("RestrictAddressFamilies"), ["AF_UNIX"], "the unit must stay closed by default");
    let path = workspace_root().join("config/profiler.service");
    let text = std::fs::read_to_string(&path).expect("read the unit");
    let drop_in: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim_start_matches('#').trim().strip_prefix("RestrictAddressFamilies="))
        .filter(|families| families.contains("AF_INET"))
        .collect();
    let [families] = drop_in[..] else { panic!("{} shows no drop-in opening AF_INET: {drop_in:?}", path.display()) };
    let families: Vec<&str> = families.split_whitespace().collect();
    assert_eq!(families, ["AF_UNIX", "AF_INET", "AF_INET6"], "the documented drop-in");

    let backend = Backend::start(None);
    let cpu = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let mut config = DaemonConfig::new(&[cpu.comm()]);
    config.launcher = unit_launcher(&unit_values("CapabilityBoundingSet"), &setpriv_names());
    config.exports = vec![format!("protocol = \"otlp\"\nurl = {:?}", backend.url())];
    let daemon = Daemon::start(&config);
    let arrived = wait_for(Duration::from_secs(30), || !backend.received().is_empty());
    assert!(arrived, "nothing exported under the unit's capabilities: {}", daemon.status()["export"]);
    assert_eq!(daemon.status_u64("/export/otlp/failed"), 0);
}

/// The values of every `KEY=` line of the shipped unit, split on whitespace.
fn unit_values(key: &str) -> Vec<String> {
    let path = workspace_root().join("config/profiler.service");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("failed to read {}: {e}", path.display()));
    let prefix = format!("{key}=");
    let values: Vec<String> = text
        .lines()
        .filter_map(|line| line.trim().strip_prefix(&prefix))
        .flat_map(str::split_whitespace)
        .map(String::from)
        .collect();
    assert!(!values.is_empty(), "{} has no {key}= line", path.display());
    values
}

/// The capability names `setpriv` knows, in capability-number order.
fn setpriv_names() -> Vec<String> {
    let out = Command::new("setpriv").arg("--list-caps").output().expect("failed to run setpriv --list-caps");
    String::from_utf8_lossy(&out.stdout).lines().map(|l| l.trim().to_string()).collect()
}

/// `CAP_SYS_PTRACE` → `sys_ptrace`, checked against what setpriv knows.
fn setpriv_name(cap: &str, names: &[String]) -> String {
    let name = cap.strip_prefix("CAP_").unwrap_or(cap).to_lowercase();
    assert!(names.contains(&name), "setpriv does not know {cap} (knows {names:?})");
    name
}

fn cap_number(cap: &str, names: &[String]) -> u32 {
    let name = setpriv_name(cap, names);
    names.iter().position(|n| *n == name).expect("checked by setpriv_name") as u32
}

/// `CapEff` of a process, from `/proc/PID/status`.
fn effective_caps(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon's /proc status");
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:")).expect("a CapEff line").trim();
    u64::from_str_radix(hex, 16).expect("CapEff is hex")
}
