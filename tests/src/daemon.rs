//! The daemon under test: `profiler run` with a scratch config file, output directory and
//! socket, behind a guard that stops it (SIGTERM, then SIGKILL) on drop and keeps everything
//! it logged for assertions. It talks to the daemon with the crate's own client; the other
//! clients are in [`crate::http`].
//!
//! Owns: writing the config file, starting and stopping the daemon, reading its stderr, and
//! listing the timestamped profiles it writes. Does not own: what a test expects of them.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::run::{profiler_bin, TempDir};

/// Loading and verifying the eBPF programs takes a few seconds on a busy two-CPU VM.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the guard waits after SIGTERM before it sends SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often bounded waits look again.
const POLL: Duration = Duration::from_millis(100);

/// What goes into the daemon's config file. [`DaemonConfig::new`] gives short intervals and
/// a sampling rate high enough for shares to be meaningful within one interval.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// `interval`, as written in the file ("2s").
    pub interval: String,
    pub frequency_hz: u32,
    pub profiles: Vec<&'static str>,
    /// `[processes] include`, as `{ name = ... }` matchers; empty means every process.
    pub include: Vec<&'static str>,
    /// `[processes] include`, as `{ cgroup = ... }` matchers (with those of `include`).
    pub include_cgroups: Vec<String>,
    /// `[heap] include`, as `{ name = ... }` matchers.
    pub heap_include: Vec<&'static str>,
    /// `[heap] sample_bytes`, as written ("1B").
    pub sample_bytes: Option<String>,
    pub max_age: Option<String>,
    pub max_total_bytes: Option<String>,
    /// Default "0B": the default 512 MiB floor would make every dump depend on how full the
    /// test machine's disk is; only the low-space test sets one.
    pub min_free_bytes: String,
    pub socket_group: Option<&'static str>,
    /// Where profiles go; default `<scratch>/out`. Set for a tmpfs mount.
    pub output_dir: Option<PathBuf>,
    /// A command the daemon is started under, which must exec it (e.g. `setpriv ... --`);
    /// empty: started directly.
    pub launcher: Vec<String>,
    /// `[threads] interval_dumps`.
    pub thread_interval_dumps: bool,
    /// `[[export]]` tables, each as TOML key lines (`protocol = "otlp"\nurl = "..."`).
    pub exports: Vec<String>,
    /// `[offcpu] sample_every`; the default when `None`. `Some(1)` records every switch, so
    /// it also sets `rate = "1ns"` (the sampling on kernels with `sched_exit_tp`).
    pub offcpu_sample_every: Option<u32>,
}

impl DaemonConfig {
    /// CPU only at 199 Hz every 2 s (~400 samples of a busy thread per file), for the
    /// processes named `include`.
    pub fn new(include: &[&'static str]) -> Self {
        Self {
            interval: "2s".into(),
            frequency_hz: 199,
            profiles: vec!["cpu"],
            include: include.to_vec(),
            include_cgroups: Vec::new(),
            heap_include: Vec::new(),
            sample_bytes: None,
            max_age: None,
            max_total_bytes: None,
            min_free_bytes: "0B".into(),
            socket_group: None,
            output_dir: None,
            launcher: Vec::new(),
            thread_interval_dumps: false,
            exports: Vec::new(),
            offcpu_sample_every: None,
        }
    }

    /// The TOML text, writing to `output` and serving on `socket`.
    pub fn toml(&self, output: &Path, socket: &Path) -> String {
        let quoted = |items: &[&str]| {
            let items: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
            items.join(", ")
        };
        let names = |names: &[&str]| {
            let items: Vec<String> = names.iter().map(|n| format!("{{ name = {n:?} }}")).collect();
            items.join(", ")
        };
        let mut text = format!(
            "output_dir = {:?}\ninterval = {:?}\nprofiles = [{}]\n\n[socket]\npath = {:?}\n",
            output.display().to_string(),
            self.interval,
            quoted(&self.profiles),
            socket.display().to_string(),
        );
        if let Some(group) = self.socket_group {
            text += &format!("group = {group:?}\n");
        }
        text += &format!("\n[retention]\nmin_free_bytes = {:?}\n", self.min_free_bytes);
        if let Some(max_age) = &self.max_age {
            text += &format!("max_age = {max_age:?}\n");
        }
        if let Some(max_total) = &self.max_total_bytes {
            text += &format!("max_total_bytes = {max_total:?}\n");
        }
        text += &format!("\n[cpu]\nfrequency_hz = {}\n", self.frequency_hz);
        let mut include: Vec<String> = self.include.iter().map(|n| format!("{{ name = {n:?} }}")).collect();
        include.extend(self.include_cgroups.iter().map(|c| format!("{{ cgroup = {c:?} }}")));
        text += &format!("\n[processes]\ninclude = [{}]\n", include.join(", "));
        text += &format!("\n[heap]\ninclude = [{}]\n", names(&self.heap_include));
        if let Some(bytes) = &self.sample_bytes {
            text += &format!("sample_bytes = {bytes:?}\n");
        }
        text += &format!("\n[threads]\ninterval_dumps = {}\n", self.thread_interval_dumps);
        if let Some(every) = self.offcpu_sample_every {
            text += &format!("\n[offcpu]\nsample_every = {every}\n");
            if every == 1 {
                text += "rate = \"1ns\"\n";
            }
        }
        for export in &self.exports {
            text += &format!("\n[[export]]\n{export}\n");
        }
        text
    }
}

/// A running `profiler run --config FILE`. Dropping it stops the daemon and reaps it; on a
/// failing test it prints the daemon's log.
pub struct Daemon {
    child: Child,
    scratch: TempDir,
    config_path: PathBuf,
    output: PathBuf,
    socket: PathBuf,
    log: Arc<Mutex<Vec<u8>>>,
    exit: Option<ExitStatus>,
}

impl Daemon {
    /// Writes `config` to a scratch file, starts the daemon on it and returns once its socket
    /// answers `/status` with 200 (the signal handlers are installed by then too).
    pub fn start(config: &DaemonConfig) -> Self {
        let scratch = TempDir::new("daemon");
        let output = config.output_dir.clone().unwrap_or_else(|| scratch.path().join("out"));
        let socket = scratch.path().join("s.sock");
        let config_path = scratch.path().join("profiler.toml");
        write_file(&config_path, &config.toml(&output, &socket));
        let mut command = match config.launcher.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(profiler_bin());
                command
            }
            None => Command::new(profiler_bin()),
        };
        let mut child = command
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start profiler run: {e}"));
        let log = Arc::new(Mutex::new(Vec::new()));
        collect(child.stderr.take().expect("stderr is piped"), Arc::clone(&log));
        let mut daemon = Self { child, scratch, config_path, output, socket, log, exit: None };
        daemon.wait_ready();
        daemon
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.try_exit() {
                panic!("profiler run exited with {status} while starting; log:\n{}", self.log());
            }
            if matches!(profiler_daemon::client::get(&self.socket, "/status"), Ok((200, _))) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "profiler run did not answer /status within {START_TIMEOUT:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(POLL);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The output directory the config names.
    pub fn output(&self) -> &Path {
        &self.output
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The daemon's own scratch directory (world-readable), for files a test writes.
    pub fn scratch(&self) -> &Path {
        self.scratch.path()
    }

    /// Everything the daemon has logged so far.
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&self.log.lock().expect("log lock")).into_owned()
    }

    /// `GET path` with the crate's client; panics (with the log) if the exchange fails.
    pub fn get(&self, path: &str) -> (u16, Vec<u8>) {
        profiler_daemon::client::get(&self.socket, path)
            .unwrap_or_else(|e| panic!("GET {path} failed: {e}; daemon log:\n{}", self.log()))
    }

    /// `GET path`, which must answer 200; returns the body.
    pub fn get_ok(&self, path: &str) -> Vec<u8> {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {}; daemon log:\n{}", String::from_utf8_lossy(&body), self.log());
        body
    }

    /// `/status`, parsed.
    pub fn status(&self) -> serde_json::Value {
        let body = self.get_ok("/status");
        serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("/status is not JSON ({e}):\n{}", String::from_utf8_lossy(&body)))
    }

    /// The pids whose heap probes are attached (`/status`'s `programs.heap_processes`).
    pub fn heap_processes(&self) -> Vec<u64> {
        let status = self.status();
        status["programs"]["heap_processes"]
            .as_array()
            .map(|pids| pids.iter().filter_map(serde_json::Value::as_u64).collect())
            .unwrap_or_default()
    }

    /// The number at JSON pointer `pointer` of `/status` (`/output/files_written`).
    pub fn status_u64(&self, pointer: &str) -> u64 {
        let status = self.status();
        status
            .pointer(pointer)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_else(|| panic!("/status has no number at {pointer}: {status:#}"))
    }

    /// Waits until the log contains `needle`; panics with the log after `timeout`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) {
        let found = wait_for(timeout, || self.log().contains(needle));
        assert!(found, "the daemon did not log {needle:?} within {timeout:?}; log:\n{}", self.log());
    }

    /// Replaces the config file (the daemon reads it again on SIGHUP).
    pub fn rewrite_config(&self, text: &str) {
        write_file(&self.config_path, text);
    }

    pub fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.pid()).expect("pids fit pid_t");
        // SAFETY: kill has no memory-safety preconditions; the child is ours and unreaped, so
        // the pid cannot have been reused.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "failed to send signal {signal} to the daemon: {}", std::io::Error::last_os_error());
    }

    /// Waits up to `timeout` for the daemon to exit; returns its status if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().expect("failed to poll the daemon");
        }
        self.exit
    }

    /// The daemon's profiles of type `kind` for process `comm`/`pid`, oldest name first.
    pub fn profiles(&self, comm: &str, pid: u32, kind: &str) -> Vec<PathBuf> {
        profile_files(&crate::run::process_dir(&self.output, comm, pid), kind)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            self.signal(libc::SIGTERM);
            if self.wait_exit(STOP_TIMEOUT).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!("daemon log:\n{}", self.log());
        }
    }
}

fn collect(mut pipe: impl Read + Send + 'static, log: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = pipe.read(&mut buf) {
            log.lock().expect("log lock").extend_from_slice(&buf[..n]);
        }
    });
}

fn write_file(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("failed to write {}: {e}", path.display()));
}

/// Polls `condition` every 100 ms until it holds (true) or `timeout` passes (false).
pub fn wait_for(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// The `<kind>-<stamp>.pb.gz` files in `dir`, sorted by name (= by time stamp); none if
/// `dir` does not exist.
pub fn profile_files(dir: &Path, kind: &str) -> Vec<PathBuf> {
    let prefix = format!("{kind}-");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            let name = file_name(path);
            name.starts_with(&prefix) && name.ends_with(".pb.gz")
        })
        .collect();
    files.sort();
    files
}

/// The final path component as text.
pub fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The file's modification time.
pub fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("failed to stat {}: {e}", path.display()))
}

/// The `YYYYMMDDTHHMMSSZ` part of `cpu-YYYYMMDDTHHMMSSZ.pb.gz`.
pub fn stamp(path: &Path) -> String {
    let name = file_name(path);
    let stem = name.strip_suffix(".pb.gz").unwrap_or(&name);
    stem.split_once('-').map_or(stem, |(_, s)| s).to_owned()
}
