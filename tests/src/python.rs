//! CPython for the thread dumps' Python tests: the interpreters on the machine (Debian's
//! static `/usr/bin/python3.11` and pyenv's shared builds under `~/.pyenv/versions`), the
//! Python fixtures in `tests/fixtures/*.py` with the lines their `# at: NAME` markers name,
//! a guard that runs one and kills it on drop, and py-spy (the Python CPU profiles'
//! reference) from the test venv.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

/// One interpreter to run fixtures under.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// (major, minor).
    pub version: (u8, u8),
    /// What it is, for messages: `3.12 (pyenv 3.12.1, shared)`.
    pub label: String,
    pub path: PathBuf,
}

/// The interpreters of `versions` found on the machine, printing each one that is absent
/// (a skip of that version, said out loud). pyenv's builds link `libpython3.X.so`; Debian's
/// `/usr/bin/python3.11` is a static build (its executable exports `_PyRuntime`).
pub fn interpreters(versions: &[(u8, u8)]) -> Vec<Interpreter> {
    let home = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv"));
    let mut found = Vec::new();
    for &(major, minor) in versions {
        let before = found.len();
        let debian = PathBuf::from(format!("/usr/bin/python{major}.{minor}"));
        if debian.exists() && std::fs::symlink_metadata(&debian).is_ok_and(|m| m.file_type().is_file()) {
            found.push(Interpreter {
                version: (major, minor),
                label: format!("{major}.{minor} (Debian)"),
                path: debian,
            });
        }
        let prefix = format!("{major}.{minor}.");
        let mut pyenv: Vec<PathBuf> = std::fs::read_dir(home.join("versions"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .collect();
        pyenv.sort();
        if let Some(dir) = pyenv.last() {
            let path = dir.join(format!("bin/python{major}.{minor}"));
            if path.exists() {
                let name = dir.file_name().unwrap().to_string_lossy().to_string();
                found.push(Interpreter {
                    version: (major, minor),
                    label: format!("{major}.{minor} (pyenv {name})"),
                    path,
                });
            }
        }
        if found.len() == before {
            eprintln!(
                "skipping CPython {major}.{minor}: no /usr/bin/python{major}.{minor} nor {}/versions/{prefix}*",
                home.display()
            );
        }
    }
    found
}

/// `py-spy` from the venv `cargo xtask setup --for-test` fills
/// (`target/test-venv/bin/py-spy`), if it is there.
pub fn py_spy() -> Option<PathBuf> {
    let path = crate::target_dir().join("test-venv/bin/py-spy");
    path.is_file().then_some(path)
}

/// The absolute path of `tests/fixtures/NAME`.
pub fn fixture_path(name: &str) -> PathBuf {
    crate::workspace_root().join("tests/fixtures").join(name)
}

/// The line of each `# at: NAME` marker of the source at `path`, by name.
pub fn marked_lines(path: &Path) -> HashMap<String, i64> {
    let source = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("failed to read {}: {e}", path.display()));
    source
        .lines()
        .enumerate()
        .filter_map(|(i, line)| Some((line.split_once("# at: ")?.1.trim().to_string(), i as i64 + 1)))
        .collect()
}

/// A Python fixture running under one interpreter; killed on drop.
pub struct PythonFixture {
    child: Child,
    /// The interpreter's pid when it is not `child` (run under `unshare`).
    interpreter: Option<u32>,
}

impl PythonFixture {
    /// Runs `script` under `python` with `args` and returns once it printed `ready`.
    pub fn spawn(python: &Path, script: &Path, args: &[&str]) -> Self {
        let mut cmd = Command::new(python);
        cmd.arg(script).args(args);
        Self::start(cmd, false)
    }

    /// [`PythonFixture::spawn`] as the unprivileged user `nobody` (uid/gid 65534, no
    /// groups); `setpriv` execs the interpreter, so the pid is its own. `python` and
    /// `script` must be readable by nobody (a script copied to a 0755 directory, an
    /// interpreter outside `/root`).
    pub fn spawn_as_nobody(python: &Path, script: &Path, args: &[&str]) -> Self {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(python).arg(script).args(args);
        Self::start(cmd, false)
    }

    /// [`PythonFixture::spawn`] in a new pid namespace (`unshare --pid --fork`), as in a
    /// container: the interpreter is pid 1 there and knows its threads by the ids they have
    /// there. [`PythonFixture::pid`] is its pid as the host sees it.
    pub fn spawn_in_new_pid_namespace(python: &Path, script: &Path, args: &[&str]) -> Self {
        let mut cmd = Command::new("unshare");
        cmd.args(["--pid", "--fork", "--kill-child"]).arg(python).arg(script).args(args);
        Self::start(cmd, true)
    }

    fn start(mut cmd: Command, forks: bool) -> Self {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("failed to start {cmd:?}: {e}"));
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let mut line = String::new();
        let read = stdout.read_line(&mut line);
        let mut fixture = Self { child, interpreter: None };
        assert!(line.trim() == "ready", "{cmd:?} did not print `ready` (read {read:?}, got {line:?})");
        if forks {
            let parent = fixture.child.id();
            let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
                .unwrap_or_else(|e| panic!("failed to read the children of {cmd:?}: {e}"));
            let pid = children.split_whitespace().next().and_then(|p| p.parse().ok());
            fixture.interpreter = Some(pid.unwrap_or_else(|| panic!("{cmd:?} has no child: {children:?}")));
        }
        // Kept open by a thread so the fixture never writes to a closed pipe.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        fixture
    }

    pub fn pid(&self) -> u32 {
        self.interpreter.unwrap_or(self.child.id())
    }
}

impl Drop for PythonFixture {
    fn drop(&mut self) {
        if let Some(pid) = self.interpreter {
            // SAFETY: a signal to the fixture's own interpreter (our child's child, not
            // reaped while `child` lives, so the pid is still its).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        // Either may fail if it already exited; the wait still reaps it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
