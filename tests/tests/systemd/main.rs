//! `config/profiler.service` under a real systemd: PID 1 of these machines is not systemd, so
//! each test boots a container (`profiler_tests::nspawn`) from an overlay of the machine's own
//! root file system, installs the freshly built release binary, the shipped unit and config
//! where the README's install steps put them, enables the unit, and checks what systemd
//! (`systemctl show`, the journal) and the daemon's socket say. The unit file is always the
//! shipped one, unchanged; the config is the shipped one except where a test is about
//! changing it. One module per concern: start, status, socket and the final dump (`unit`),
//! `systemctl reload` (`reload`), the watchdog and Restart= (`watchdog`), the heap drop-in
//! (`heap`), and what the daemon sees of the container's pid namespace (`pid_namespace`,
//! ignored until the daemon handles it).
//!
//! `cargo xtask test --test systemd` runs exactly these (this binary; their names also all
//! contain `systemd`, so the older `cargo xtask test systemd` still finds them).
//! Each container boots in about a second; the watchdog test waits out `WatchdogSec=30s`.

mod heap;
mod pid_namespace;
mod reload;
mod unit;
mod watchdog;

use std::path::{Path, PathBuf};
use std::time::Duration;

use profiler_tests::daemon::{self, wait_for};
use profiler_tests::nspawn::{self, Container};
use profiler_tests::run::profiler_bin;
use profiler_tests::{listing, preflight, workspace_root};

const UNIT: &str = "profiler.service";
/// Where the unit's ExecStart= and the README's install steps put the binary and config.
const BINARY: &str = "/usr/local/bin/profiler";
const CONFIG: &str = "/etc/profiler/profiler.toml";
const UNIT_PATH: &str = "/etc/systemd/system/profiler.service";
/// `systemctl edit profiler` writes here.
const DROP_IN: &str = "/etc/systemd/system/profiler.service.d/override.conf";
/// The shipped config's socket and output directory (also the unit's RuntimeDirectory= and
/// StateDirectory=).
const SOCKET: &str = "/run/profiler/profiler.sock";
const OUTPUT: &str = "/var/lib/profiler";
/// The shipped config's rate and interval.
const SHIPPED_HZ: u64 = 19;
const SHIPPED_INTERVAL_S: u64 = 60;
/// What the daemon tells systemd once it is ready (`systemctl status` shows it).
const READY_STATUS: &str = "profiling; writing to /var/lib/profiler";
/// Samples of the whole container's CPU clock to wait for before looking at a fixture's
/// profile: about 5 s of one busy CPU at the shipped 19 Hz.
const ENOUGH_SAMPLES: u64 = 95;
/// Longer than any test; the guards kill the fixtures.
const FIXTURE_S: &str = "300";
/// Anything that should happen within a couple of seconds, with room for a loaded VM.
const SOON: Duration = Duration::from_secs(30);

// --- Setting up the container.

/// Root, the kernel features, and systemd-nspawn (the one allowed reason to skip).
fn machine_fit() -> bool {
    preflight() && nspawn::available()
}

/// A prepared container with the binary, the shipped unit (unchanged) and `config` installed
/// where the README puts them, and the unit enabled.
fn with_unit(config: &str) -> Container {
    let container = Container::prepare();
    container.install(&profiler_bin(), BINARY, 0o755);
    container.write(UNIT_PATH, &shipped("profiler.service"));
    container.write(CONFIG, config);
    container.enable(UNIT);
    container
}

/// `config/NAME` as shipped.
fn shipped(name: &str) -> String {
    let path = workspace_root().join("config").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("failed to read {}: {e}", path.display()))
}

fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "expected {from:?} exactly once in the shipped file");
    text.replacen(from, to, 1)
}

// --- What systemd and the socket say.

/// Waits until the unit is active and running; panics with its journal if it failed or did
/// not get there within a minute.
fn wait_active(container: &Container) {
    let timeout = Duration::from_secs(60);
    let mut last = Default::default();
    let active = wait_for(timeout, || {
        last = container.properties(UNIT, &["ActiveState", "SubState"]);
        assert_ne!(last["ActiveState"], "failed", "{UNIT} failed:\n{}", container.journal_verbose(UNIT));
        last["ActiveState"] == "active" && last["SubState"] == "running"
    });
    assert!(active, "{UNIT} not active within {timeout:?} ({last:?}):\n{}", container.journal_verbose(UNIT));
}

/// `GET path` on the container's socket, from the host through `/proc/<its systemd>/root`.
fn get(container: &Container, path: &str) -> (u16, Vec<u8>) {
    profiler_daemon::client::get(&container.path(SOCKET), path).unwrap_or_else(|e| {
        panic!("GET {path} on the container's socket failed: {e}\n{}", container.journal_verbose(UNIT))
    })
}

fn get_ok(container: &Container, path: &str) -> Vec<u8> {
    let (code, body) = get(container, path);
    assert_eq!(code, 200, "GET {path}: {}", String::from_utf8_lossy(&body));
    body
}

fn status(container: &Container) -> serde_json::Value {
    let body = get_ok(container, "/status");
    serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("/status is not JSON ({e}): {}", String::from_utf8_lossy(&body)))
}

/// Waits until the daemon has counted `n` more CPU samples (of the whole container) than now.
fn wait_for_samples(container: &Container, n: u64) {
    let samples = || status(container)["samples"]["cpu"].as_u64().unwrap_or(0);
    let start = samples();
    let timeout = Duration::from_secs(60);
    assert!(wait_for(timeout, || samples() >= start + n), "fewer than {n} CPU samples within {timeout:?}");
}

// --- The files it wrote.

/// The fixture's directory in the output: named after its pid in the container or, as the
/// daemon names it while it reports the kernel's pids, on the host.
fn fixture_dir(output: &Path, comm: &str, ns_pid: u32, host_pid: u32) -> PathBuf {
    [ns_pid, host_pid]
        .iter()
        .map(|pid| profiler_tests::process_dir(output, comm, *pid))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| {
            panic!(
                "no directory for {comm} (pid {ns_pid} in the container, {host_pid} on the host):\n{}",
                listing(output)
            )
        })
}

/// The one CPU profile in `dir`: the final dump (the 60 s interval never came).
fn only_cpu_file(dir: &Path) -> PathBuf {
    let files = daemon::profile_files(dir, "cpu");
    assert_eq!(files.len(), 1, "expected only the final dump in {}:\n{}", dir.display(), listing(dir));
    files[0].clone()
}
