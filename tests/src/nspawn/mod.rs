//! A real systemd, as PID 1 of a `systemd-nspawn` container booted from an overlay of the
//! machine's own root file system, for testing `config/profiler.service` where PID 1 is not
//! systemd. The [`Container`] guard owns everything it sets up: the tmpfs under
//! `/run/systemd/nspawn` (nspawn refuses to clean its propagation directory on a disk file
//! system), a scratch tmpfs holding the overlay's upper and work directories, the overlay
//! itself, and the `systemd-nspawn` process. Dropping it powers the container off (killing it
//! if it does not stop in time) and unmounts everything it mounted, whether the test passed or
//! not; a run that was killed before its guard dropped is cleaned up by the next one.
//!
//! The container shares the host's kernel (BPF, perf events, tracefs bound in), user namespace
//! and clock, and has its own pid, mount, network, IPC and UTS namespaces. Commands run inside
//! through `nsenter -t <its systemd> -a`; its files, including the ones under its private
//! `/run` and `/tmp` mounts, are reachable from the host as `/proc/<its systemd>/root/...`.
//!
//! Owns: the mounts, the container's life, running commands and fixtures inside it. Does not
//! own: what is installed in it (the tests decide) nor what a test expects of systemd.

mod host;
mod inside;

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::daemon::wait_for;
use crate::fixture::FixtureKind;
use crate::run::run_with_timeout;
use host::{children, clean_stale, comm, is_mount_point, output_within, signal, unmount};
pub use inside::InsideFixture;

/// Where the scratch tmpfs is mounted: `up/` and `work/` of the overlay, and `root/`, the
/// container's root directory. A fixed path, so that a later run finds a killed run's leftovers.
const SCRATCH: &str = "/run/profiler-tests-nspawn";
/// systemd-nspawn's own runtime directory on the host.
const NSPAWN_RUN: &str = "/run/systemd/nspawn";
/// A file this module writes into the tmpfs it mounts on [`NSPAWN_RUN`], so that a later run
/// can tell its own leftover mount from one somebody else made (which it leaves alone).
const NSPAWN_RUN_MARKER: &str = "/run/systemd/nspawn/.profiler-tests";
/// The container's name (its hostname is the host's, from the overlaid /etc/hostname).
const MACHINE: &str = "profiler-test";
/// Booting takes about a second here; the rest is slack for a loaded two-CPU VM.
const BOOT_TIMEOUT: Duration = Duration::from_secs(90);
/// systemd powers the container off in a few seconds (its default stop timeouts are 90 s, but
/// nothing in it lingers); after this the guard kills it.
const POWEROFF_TIMEOUT: Duration = Duration::from_secs(45);
/// Any one command: mount, systemctl, journalctl, kill.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Only one container at a time: they share the fixed scratch paths (the test harness may run
/// the tests of one binary on several threads).
static ONE_CONTAINER: Mutex<()> = Mutex::new(());

/// Whether `systemd-nspawn` can be run at all; prints why not. The only reason the systemd
/// tests skip: `cargo xtask test` installs it (package `systemd-container`).
pub fn available() -> bool {
    match Command::new("systemd-nspawn").arg("--version").output() {
        Ok(out) if out.status.success() => true,
        Ok(out) => {
            eprintln!(
                "skipping: `systemd-nspawn --version` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            false
        }
        Err(e) => {
            eprintln!(
                "skipping: systemd-nspawn cannot run ({e}); install the package systemd-container \
                 (`cargo xtask test` does)"
            );
            false
        }
    }
}

/// A container being prepared ([`Container::root`] is writable), then booted
/// ([`Container::boot`]). Dropping it stops and unmounts everything.
pub struct Container {
    _one: MutexGuard<'static, ()>,
    /// What this guard mounted, in mount order; unmounted in reverse.
    mounts: Vec<PathBuf>,
    nspawn: Option<Child>,
    /// The host pid of the container's PID 1 (systemd), once booted.
    leader: Option<u32>,
    /// systemd-nspawn's stdout and stderr: the container's console.
    console: Arc<Mutex<Vec<u8>>>,
}

impl Container {
    /// Cleans up after any killed earlier run, then mounts the scratch tmpfs and an overlay
    /// of `/` on [`Container::root`] (writes go to the tmpfs; the host's files are untouched).
    pub fn prepare() -> Self {
        let one = ONE_CONTAINER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        clean_stale();
        let mut container = Self {
            _one: one,
            mounts: Vec::new(),
            nspawn: None,
            leader: None,
            console: Arc::new(Mutex::new(Vec::new())),
        };
        if !is_mount_point(Path::new(NSPAWN_RUN)) {
            container.mount(&["-t", "tmpfs", "-o", "mode=0755", "tmpfs"], Path::new(NSPAWN_RUN));
            write(Path::new(NSPAWN_RUN_MARKER), "mounted by profiler-tests (tests/src/nspawn)\n");
        }
        container.mount(&["-t", "tmpfs", "-o", "mode=0755", "tmpfs"], Path::new(SCRATCH));
        for dir in ["up", "work", "root"] {
            create_dir(&Path::new(SCRATCH).join(dir));
        }
        let options = format!("lowerdir=/,upperdir={SCRATCH}/up,workdir={SCRATCH}/work");
        container.mount(&["-t", "overlay", "-o", &options, "overlay"], &container.root());
        container
    }

    /// The container's root directory on the host: an overlay of `/`. Files written here
    /// before or after boot are the container's (except under its own `/run` and `/tmp`
    /// mounts; see [`Container::path`]).
    pub fn root(&self) -> PathBuf {
        Path::new(SCRATCH).join("root")
    }

    /// Copies the host file `from` to `to` (absolute, as the container sees it) with `mode`.
    pub fn install(&self, from: &Path, to: &str, mode: u32) {
        let dest = self.inside_root(to);
        create_dir(dest.parent().expect("an absolute path has a parent"));
        std::fs::copy(from, &dest)
            .unwrap_or_else(|e| panic!("failed to copy {} to {}: {e}", from.display(), dest.display()));
        set_mode(&dest, mode);
    }

    /// Writes `text` to `to` (absolute, as the container sees it), mode 0644.
    pub fn write(&self, to: &str, text: &str) {
        let dest = self.inside_root(to);
        create_dir(dest.parent().expect("an absolute path has a parent"));
        write(&dest, text);
        set_mode(&dest, 0o644);
    }

    /// `systemctl --root=ROOT enable UNIT` from the host: the unit's `[Install]` section
    /// decides what pulls it in at boot.
    pub fn enable(&self, unit: &str) {
        let mut cmd = Command::new("systemctl");
        cmd.arg(format!("--root={}", self.root().display())).args(["enable", unit]);
        let output = run_with_timeout(&mut cmd, COMMAND_TIMEOUT);
        assert!(
            output.status.success(),
            "{cmd:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Boots systemd in the container and returns once it has finished starting up (every
    /// job of the boot transaction is done: `systemctl is-system-running` says `running` or
    /// `degraded`).
    pub fn boot(&mut self) {
        assert!(self.nspawn.is_none(), "the container is already booted");
        let root = self.root();
        let mut cmd = Command::new("systemd-nspawn");
        cmd.arg("-D")
            .arg(&root)
            .arg(format!("--machine={MACHINE}"))
            // No system bus on a host whose PID 1 is not systemd: no machined to register with,
            // and no scope unit to create; the container stays in the caller's cgroup.
            .args(["--register=no", "--keep-unit"])
            // The daemon runs as root with a bounding set of its own (the unit's); the container
            // must hold those capabilities to hand them on.
            .arg("--capability=all")
            // nspawn's seccomp filter forbids both by default; the profiler exists for them.
            .arg("--system-call-filter=bpf perf_event_open")
            // The unit expects the system to have mounted tracefs (sys-kernel-tracing.mount);
            // nspawn mounts /sys read-only without it.
            .arg("--bind=/sys/kernel/tracing")
            // Only loopback: services of the host's image that start at boot (a database, say)
            // must not listen on the host's network.
            .arg("--private-network")
            .arg("--console=read-only")
            .arg("--boot")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("failed to start {cmd:?}: {e}"));
        collect(child.stdout.take().expect("stdout is piped"), Arc::clone(&self.console));
        collect(child.stderr.take().expect("stderr is piped"), Arc::clone(&self.console));
        let nspawn_pid = child.id();
        self.nspawn = Some(child);
        let deadline = Instant::now() + BOOT_TIMEOUT;
        loop {
            if let Some(status) = self.nspawn.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("systemd-nspawn exited with {status} while booting; console:\n{}", self.console());
            }
            if self.leader.is_none() {
                self.leader = children(nspawn_pid).into_iter().find(|&pid| comm(pid).as_deref() == Some("systemd"));
            }
            if self.leader.is_some() {
                let state = self.run(&["systemctl", "is-system-running"]);
                let state = String::from_utf8_lossy(&state.stdout).trim().to_owned();
                if state == "running" || state == "degraded" {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the container did not finish booting within {BOOT_TIMEOUT:?}; console:\n{}",
                self.console()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The host pid of the container's systemd; panics before boot.
    pub fn leader(&self) -> u32 {
        self.leader.expect("the container is not booted")
    }

    /// `path` (absolute, as the container sees it, including its private `/run` and `/tmp`)
    /// as the host reaches it: `/proc/<its systemd>/root/<path>`.
    pub fn path(&self, path: &str) -> PathBuf {
        Path::new(&format!("/proc/{}/root", self.leader())).join(path.trim_start_matches('/'))
    }

    /// Runs `args` inside the container (all of its namespaces), with a timeout.
    pub fn run(&self, args: &[&str]) -> Output {
        run_with_timeout(&mut self.nsenter(args), COMMAND_TIMEOUT)
    }

    /// Runs `args` inside the container; panics unless it exits 0. Returns stdout.
    pub fn run_ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "{args:?} inside the container failed ({}):\nstdout:\n{}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `systemctl ARGS...` inside; panics unless it exits 0. Returns stdout.
    pub fn systemctl(&self, args: &[&str]) -> String {
        let mut all = vec!["systemctl", "--no-pager"];
        all.extend_from_slice(args);
        self.run_ok(&all)
    }

    /// One property of `unit` (`systemctl show -p PROPERTY --value UNIT`).
    pub fn show(&self, unit: &str, property: &str) -> String {
        self.systemctl(&["show", "-p", property, "--value", unit]).trim().to_owned()
    }

    /// Several properties of `unit` at one instant (`systemctl show -p A -p B UNIT`).
    pub fn properties(&self, unit: &str, properties: &[&str]) -> BTreeMap<String, String> {
        let mut args = vec!["show"];
        for property in properties {
            args.extend(["-p", property]);
        }
        args.push(unit);
        self.systemctl(&args)
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect()
    }

    /// Everything the journal holds for `unit` this boot: systemd's lines about it and the
    /// unit's own output, one message a line.
    pub fn journal(&self, unit: &str) -> String {
        self.run_ok(&["journalctl", "--no-pager", "-o", "cat", "-u", unit])
    }

    /// The same with timestamps and senders, for failure messages.
    pub fn journal_verbose(&self, unit: &str) -> String {
        self.run_ok(&["journalctl", "--no-pager", "-o", "short-monotonic", "-u", unit])
    }

    /// Waits until the journal of `unit` holds `needle` at least `count` times; panics with the
    /// journal after `timeout`.
    pub fn wait_for_journal(&self, unit: &str, needle: &str, count: usize, timeout: Duration) {
        let found = wait_for(timeout, || self.journal(unit).matches(needle).count() >= count);
        assert!(
            found,
            "the journal of {unit} did not hold {needle:?} {count} time(s) within {timeout:?}:\n{}",
            self.journal_verbose(unit)
        );
    }

    /// Installs fixture `kind` as `/usr/local/bin/<comm>` and runs it inside the container
    /// with `args`, as a process of the container (its pid namespace, mounts and root) but
    /// not of any unit. Returns once it has printed `ready`.
    pub fn spawn_fixture(&self, kind: FixtureKind, args: &[&str]) -> InsideFixture {
        let path = format!("/usr/local/bin/{}", kind.comm());
        self.install(&kind.build(), &path, 0o755);
        let mut all = vec![path.as_str()];
        all.extend_from_slice(args);
        InsideFixture::start(kind, self.nsenter(&all))
    }

    /// systemd-nspawn's output so far.
    pub fn console(&self) -> String {
        String::from_utf8_lossy(&self.console.lock().expect("console lock")).into_owned()
    }

    fn nsenter(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args(["-t", &self.leader().to_string(), "-a", "--"]).args(args);
        cmd
    }

    fn inside_root(&self, path: &str) -> PathBuf {
        assert!(path.starts_with('/'), "{path} is not absolute");
        self.root().join(path.trim_start_matches('/'))
    }

    fn mount(&mut self, args: &[&str], target: &Path) {
        create_dir(target);
        let mut cmd = Command::new("mount");
        cmd.args(args).arg(target);
        let output = run_with_timeout(&mut cmd, COMMAND_TIMEOUT);
        assert!(
            output.status.success(),
            "{cmd:?} failed ({}): {}; the systemd tests need root with CAP_SYS_ADMIN and overlayfs",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        self.mounts.push(target.to_path_buf());
    }

    /// Powers the container off (SIGTERM to nspawn makes it ask systemd to), and kills it if
    /// that takes too long. Never panics: it runs in `drop`.
    fn stop(&mut self) {
        let Some(mut nspawn) = self.nspawn.take() else {
            return;
        };
        if nspawn.try_wait().ok().flatten().is_none() {
            signal(nspawn.id(), libc::SIGTERM);
            let deadline = Instant::now() + POWEROFF_TIMEOUT;
            while nspawn.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        if nspawn.try_wait().ok().flatten().is_none() {
            eprintln!("the container did not power off within {POWEROFF_TIMEOUT:?}; killing it");
            // Killing a pid namespace's init kills every process in it.
            if let Some(leader) = self.leader {
                signal(leader, libc::SIGKILL);
            }
            let _ = nspawn.kill();
            let _ = nspawn.wait();
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() && self.leader.is_some() {
            let mut journal = self.nsenter(&["journalctl", "--no-pager", "-o", "short-monotonic", "-n", "300"]);
            if let Some(out) = output_within(&mut journal, Duration::from_secs(30)) {
                eprintln!("the container's journal (last 300 lines):\n{}", String::from_utf8_lossy(&out.stdout));
            }
        }
        self.stop();
        if std::thread::panicking() {
            eprintln!("the container's console:\n{}", self.console());
        }
        for target in self.mounts.drain(..).rev() {
            unmount(&target);
            // The mount points this guard created (nspawn recreates its own directory).
            let _ = std::fs::remove_dir(&target);
        }
    }
}

fn collect(mut pipe: impl Read + Send + 'static, log: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = pipe.read(&mut buf) {
            log.lock().expect("console lock").extend_from_slice(&buf[..n]);
        }
    });
}

fn create_dir(path: &Path) {
    std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("failed to create {}: {e}", path.display()));
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("failed to write {}: {e}", path.display()));
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("failed to chmod {}: {e}", path.display()));
}
