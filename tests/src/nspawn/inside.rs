//! A fixture program running inside the container, as a process of the container (its pid
//! namespace, mounts and root) but of no unit, behind a guard that kills it on drop.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};

use super::host::{children, comm, ns_pid, signal};
use crate::fixture::FixtureKind;

/// A fixture running inside the container. Dropping it kills the fixture and reaps nsenter.
pub struct InsideFixture {
    kind: FixtureKind,
    nsenter: Child,
    stdout: BufReader<ChildStdout>,
    host_pid: Option<u32>,
    ns_pid: u32,
}

impl InsideFixture {
    /// Starts `nsenter` (which runs fixture `kind` inside the container) and waits for the
    /// fixture's `ready`.
    pub(super) fn start(kind: FixtureKind, mut nsenter: Command) -> Self {
        let mut child = nsenter
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start {nsenter:?}: {e}"));
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let mut fixture = Self { kind, nsenter: child, stdout, host_pid: None, ns_pid: 0 };
        fixture.expect_line("ready");
        // nsenter forks once to enter the pid namespace; its child execs the fixture.
        let host_pid = children(fixture.nsenter.id())
            .into_iter()
            .find(|&pid| comm(pid).as_deref() == Some(kind.comm()))
            .unwrap_or_else(|| panic!("fixture {} printed ready but is not nsenter's child", kind.comm()));
        fixture.host_pid = Some(host_pid);
        fixture.ns_pid = ns_pid(host_pid)
            .unwrap_or_else(|| panic!("no NSpid in /proc/{host_pid}/status of fixture {}", kind.comm()));
        fixture
    }

    /// Its pid on the host (the initial pid namespace, as BPF programs see it).
    pub fn host_pid(&self) -> u32 {
        self.host_pid.expect("set at spawn")
    }

    /// Its pid inside the container, as the container's /proc and systemd see it.
    pub fn ns_pid(&self) -> u32 {
        self.ns_pid
    }

    pub fn comm(&self) -> &'static str {
        self.kind.comm()
    }

    /// Sends `sig` to the fixture (by its host pid).
    pub fn signal(&self, sig: libc::c_int) {
        signal(self.host_pid(), sig);
    }

    /// Reads the fixture's next stdout line and panics unless it is `wanted` (waits for it).
    pub fn expect_line(&mut self, wanted: &str) {
        let mut line = String::new();
        let read = self.stdout.read_line(&mut line);
        assert!(
            matches!(read, Ok(n) if n > 0) && line.trim() == wanted,
            "fixture {} inside the container did not print `{wanted}` (read {read:?}, got {line:?})",
            self.kind.comm()
        );
    }
}

impl Drop for InsideFixture {
    fn drop(&mut self) {
        // The fixture is nsenter's child, not ours: kill it by its pid, which cannot have been
        // reused while nsenter, its parent, has not reaped it.
        if let Some(pid) = self.host_pid {
            signal(pid, libc::SIGKILL);
        }
        let _ = self.nsenter.kill();
        let _ = self.nsenter.wait();
    }
}
