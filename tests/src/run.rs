//! Running the `profiler` binary under test (with a timeout, so a hung profiler fails the test
//! instead of hanging it), and the scratch directories it writes into.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long any one profiler run may take. The longest capture in these tests is the 10 s
/// default; the rest is startup (loading eBPF, reading /proc) and writing files.
pub const PROFILER_TIMEOUT: Duration = Duration::from_secs(120);

/// The binary under test: `$PROFILER_BIN`, else `<target>/release/profiler`.
pub fn profiler_bin() -> PathBuf {
    let bin = match std::env::var_os("PROFILER_BIN") {
        Some(path) => PathBuf::from(path),
        None => crate::target_dir().join("release/profiler"),
    };
    assert!(
        bin.is_file(),
        "profiler binary {} does not exist: build it with `cargo build --release` or set PROFILER_BIN",
        bin.display()
    );
    bin
}

/// Runs `profiler ARGS...` to completion and returns its exit status and output.
pub fn run_profiler(args: &[&str]) -> Output {
    run_profiler_with_env(args, &[])
}

/// [`run_profiler`] with these variables added to its environment.
pub fn run_profiler_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(profiler_bin());
    cmd.args(args).envs(env.iter().copied());
    run_with_timeout(&mut cmd, PROFILER_TIMEOUT)
}

/// `profiler ARGS...` started, not waited for: [`Running::wait_capturing`] returns once it
/// has attached (its `capturing` line on stderr), so a workload started then is measured
/// from its beginning.
pub struct Running {
    child: Child,
    stderr: std::io::BufReader<std::process::ChildStderr>,
    seen: String,
}

impl Running {
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    /// [`Running::start`] with extra environment variables (`RUST_LOG` to keep a log).
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(profiler_bin())
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start the profiler: {e}"));
        let stderr = std::io::BufReader::new(child.stderr.take().expect("stderr is piped"));
        Self { child, stderr, seen: String::new() }
    }

    /// Waits for the `capturing` line (panics if the profiler ends before it).
    pub fn wait_capturing(&mut self) {
        use std::io::BufRead;
        loop {
            let mut line = String::new();
            match self.stderr.read_line(&mut line) {
                Ok(0) | Err(_) => panic!("the profiler ended before it was capturing; stderr:\n{}", self.seen),
                Ok(_) if line.starts_with("capturing") => return,
                Ok(_) => self.seen.push_str(&line),
            }
        }
    }

    /// Sends SIGINT (Ctrl-C): a snapshot ends its capture early and writes what it has.
    pub fn interrupt(&self) {
        self.signal(libc::SIGINT);
    }

    /// Sends `signal` (SIGSTOP and SIGCONT hold the profiler's userspace while the kernel
    /// goes on counting).
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory effects; the child is ours and not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Waits for the end (within [`PROFILER_TIMEOUT`]) and returns all it printed.
    pub fn finish(self) -> Output {
        let rest = drain(self.stderr);
        let mut output = wait_with_timeout(self.child, "the profiler", PROFILER_TIMEOUT);
        let mut stderr = self.seen.into_bytes();
        stderr.extend(rest.join().expect("stderr reader panicked"));
        output.stderr = stderr;
        output
    }
}

/// Runs `profiler ARGS...` (with `env` added), and continues `fixture`, started with `stop`
/// for its delay, once the profiler is capturing (see [`crate::Fixture::resume`]): none of
/// the fixture's work comes before. Returns all the profiler printed.
pub fn run_profiler_resuming(args: &[&str], env: &[(&str, &str)], fixture: &crate::Fixture) -> Output {
    let mut profiler = Running::start_with_env(args, env);
    profiler.wait_capturing();
    fixture.resume();
    profiler.finish()
}

/// [`run_profiler_resuming`] for a snapshot whose `--duration` is only a cap: once the
/// fixture has printed `last` (its work is over: on a loaded machine it may run many times
/// as long as on a quiet one) the profiler is interrupted (Ctrl-C), and writes what it has.
/// The fixture's lines up to `last` are held for the test to read.
pub fn run_profiler_until(args: &[&str], fixture: &mut crate::Fixture, last: &str) -> Output {
    let mut profiler = Running::start_with_env(args, &[]);
    profiler.wait_capturing();
    fixture.resume();
    fixture.hold_through(last);
    profiler.interrupt();
    profiler.finish()
}

/// Runs `profiler ARGS...` as the unprivileged user `nobody` (uid/gid 65534, no groups, no
/// capabilities), from a copy of the binary in `scratch` so directory permissions on the
/// workspace cannot make the exec itself fail.
pub fn run_profiler_as_nobody(scratch: &TempDir, args: &[&str]) -> Output {
    let copy = scratch.path().join("profiler");
    std::fs::copy(profiler_bin(), &copy).expect("failed to copy the profiler binary");
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(&copy).args(args);
    run_with_timeout(&mut cmd, PROFILER_TIMEOUT)
}

/// Runs `cmd` with piped stdout/stderr; kills it and panics if it outlives `timeout`.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("failed to run {cmd:?}: {e}"));
    wait_with_timeout(child, &format!("{cmd:?}"), timeout)
}

/// Waits for `child`, draining the pipes it still has; kills it and panics if it outlives
/// `timeout`.
pub fn wait_with_timeout(mut child: Child, what: &str, timeout: Duration) -> Output {
    // Drain both pipes while waiting, so a chatty child never blocks on a full pipe.
    let stdout = child.stdout.take().map(drain);
    let stderr = child.stderr.take().map(drain);
    let status = wait_until(&mut child, Instant::now() + timeout);
    let joined = |pipe: Option<JoinHandle<Vec<u8>>>| pipe.map(|p| p.join().expect("pipe reader panicked"));
    let output = Output {
        status: status.unwrap_or_else(|| {
            let _ = child.kill();
            child.wait().expect("failed to reap timed-out child")
        }),
        stdout: joined(stdout).unwrap_or_default(),
        stderr: joined(stderr).unwrap_or_default(),
    };
    assert!(
        status.is_some(),
        "{what} did not finish within {timeout:?}; killed it.\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        buf
    })
}

fn wait_until(child: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    loop {
        if let Some(status) = child.try_wait().expect("failed to poll child") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where `profiler snapshot --output DIR` writes the CPU profile of process `comm`/`pid`.
pub fn profile_path(out_dir: &Path, comm: &str, pid: u32) -> PathBuf {
    process_dir(out_dir, comm, pid).join("cpu.pb.gz")
}

/// Where `profiler snapshot --profiles heap --output DIR` writes the heap profile.
pub fn heap_profile_path(out_dir: &Path, comm: &str, pid: u32) -> PathBuf {
    process_dir(out_dir, comm, pid).join("heap.pb.gz")
}

/// The directory of process `comm`/`pid` under `out_dir`: `<comm>-<pid>`.
pub fn process_dir(out_dir: &Path, comm: &str, pid: u32) -> PathBuf {
    out_dir.join(format!("{comm}-{pid}"))
}

/// A fresh directory under the system temp dir, removed on drop. On a failing test it is kept
/// (and its path printed) so the profile that failed can be inspected.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<tmp>/profiler-tests-<pid>-<n>-<label>`, world-accessible (0755) so that the
    /// unprivileged run can reach a binary copied into it.
    pub fn new(label: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("profiler-tests-{}-{n}-{label}", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("failed to create {}: {e}", path.display()));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("failed to chmod {}: {e}", path.display()));
        Self { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory itself, as a `String` for use in argument lists.
    pub fn path_arg(&self) -> String {
        self.path.to_str().expect("temp paths are UTF-8").to_owned()
    }

    /// `self.path()` joined with `name`, as a `String` for use in argument lists.
    pub fn arg(&self, name: &str) -> String {
        self.path.join(name).to_str().expect("temp paths are UTF-8").to_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("keeping {} for inspection", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Panics unless `output` is a zero exit, showing both streams.
pub fn assert_success(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what}: profiler exited with {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Every path under `dir`, one a line, for failure messages.
pub fn listing(dir: &Path) -> String {
    let mut lines = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries.flatten() {
            lines.push(entry.path().display().to_string());
            pending.push(entry.path());
        }
    }
    lines.sort();
    if lines.is_empty() {
        format!("{} is empty", dir.display())
    } else {
        lines.join("\n")
    }
}
