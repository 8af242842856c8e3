//! The export tests' backend: `tests/backend/backend.py`, a stand-in for Pyroscope and an
//! OpenTelemetry Collector that decodes with the real schemas (see that file), run with the
//! Python of the venv `cargo xtask test` sets up, behind a guard that kills it on drop.
//!
//! Owns: starting, stopping and restarting it (on the same port: a backend that goes down
//! and comes back), telling it how to answer, and reading what it received.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::run::TempDir;
use crate::{target_dir, workspace_root};

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The venv `cargo xtask test` creates, with `opentelemetry-proto` and `grpcio-tools`.
pub fn python() -> PathBuf {
    let python = target_dir().join("test-venv/bin/python");
    assert!(python.is_file(), "{} is missing: run `cargo xtask setup --for-test`", python.display());
    python
}

/// TLS for the backend: a certificate for 127.0.0.1 signed by a CA of its own.
pub struct Tls {
    pub ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Tls {
    /// Makes the CA and the server certificate with `openssl` in `dir`.
    pub fn generate(dir: &Path) -> Self {
        let run = |args: &[&str]| {
            let out = Command::new("openssl").args(args).current_dir(dir).output().expect("failed to run openssl");
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=profiler test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
        ]);
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").expect("write ext.cnf");
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
            "-out",
            "server.pem",
        ]);
        Self { ca: dir.join("ca.pem"), cert: dir.join("server.pem"), key: dir.join("server.key") }
    }
}

/// A running backend; killed on drop.
pub struct Backend {
    child: Option<Child>,
    out: TempDir,
    port: u16,
    tls: bool,
    args: Vec<String>,
}

impl Backend {
    /// Starts a backend on a free port of 127.0.0.1, over TLS with `tls`.
    pub fn start(tls: Option<&Tls>) -> Self {
        let mut args = Vec::new();
        if let Some(tls) = tls {
            args.extend([
                "--cert".into(),
                tls.cert.display().to_string(),
                "--key".into(),
                tls.key.display().to_string(),
            ]);
        }
        let mut backend = Self { child: None, out: TempDir::new("backend"), port: 0, tls: tls.is_some(), args };
        backend.spawn();
        backend
    }

    fn spawn(&mut self) {
        let port_file = self.out.path().join("port");
        let _ = std::fs::remove_file(&port_file);
        let script = workspace_root().join("tests/backend/backend.py");
        let child = Command::new(python())
            .arg(script)
            .arg("--out")
            .arg(self.out.path())
            .arg("--proto")
            .arg(workspace_root().join("profiler-daemon/proto"))
            .args(["--port", &self.port.to_string()])
            .args(&self.args)
            .stdin(Stdio::null())
            .spawn()
            .expect("failed to start the test backend");
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while !port_file.exists() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("the test backend exited with {status} while starting");
            }
            assert!(Instant::now() < deadline, "the test backend did not start within {START_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let port = std::fs::read_to_string(&port_file).expect("read the port file");
        self.port = port.trim().parse().expect("a port number");
    }

    /// `http://127.0.0.1:PORT` (or https).
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", if self.tls { "https" } else { "http" }, self.port)
    }

    /// Stops it: connections are refused until [`Backend::restart`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, keeping what it received.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// How the next pushes are answered, e.g. `{"mode": "status", "status": 503, "count": 2}`,
    /// `{"mode": "slow", "delay": 5}`, `{"mode": "close"}` or `{"mode": "ok"}`; `count` (-1 by
    /// default: until changed) pushes, then ok again.
    pub fn set_mode(&self, mode: &serde_json::Value) {
        let (status, _) = self.admin("POST", "/admin/mode", &mode.to_string());
        assert_eq!(status, 200, "the backend refused the mode {mode}");
    }

    /// Pushes seen (answered or not), pushes accepted, profiles received.
    pub fn stats(&self) -> serde_json::Value {
        let (_, body) = self.admin("GET", "/admin/stats", "");
        serde_json::from_str(&body).expect("stats are JSON")
    }

    /// Every profile received so far, one JSON object each, in the order received.
    pub fn received(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.out.path().join("received.jsonl")).unwrap_or_default();
        text.lines().map(|line| serde_json::from_str(line).expect("a JSON line")).collect()
    }

    /// A received Pyroscope profile's file (`file` of its record).
    pub fn profile_path(&self, record: &serde_json::Value) -> PathBuf {
        self.out.path().join(record["file"].as_str().expect("a pyroscope record has a file"))
    }

    /// A one-request HTTP/1.0 exchange with the admin endpoints (plain HTTP only; a TLS
    /// backend is not told to change mode).
    fn admin(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        assert!(!self.tls, "the admin endpoints of a TLS backend are not reachable from the tests");
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to the backend");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("set a timeout");
        let request = format!("{method} {path} HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        stream.write_all(request.as_bytes()).expect("send to the backend");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        let status = answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
        (status, body)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}
