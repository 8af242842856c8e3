//! A tracing tool (bpftrace or the profiler) running alongside the measured program: started,
//! waited on until it says its probes are attached, stopped with SIGINT once the measurement
//! is done (both tools end a capture cleanly on SIGINT and print their summaries), and killed
//! on drop if anything failed in between.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Loading BPF programs and attaching ten uprobes takes well under a second; the rest is slack.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);

/// How a stopped tool ended, and what it printed on stderr.
pub struct Stopped {
    pub status: ExitStatus,
    pub stderr: String,
}

pub struct Tracer {
    name: String,
    child: Child,
    stderr_lines: Receiver<String>,
    stderr: JoinHandle<String>,
    stdout: JoinHandle<String>,
}

impl Tracer {
    /// Starts `cmd` and returns once a line of its stdout or stderr contains `marker`.
    pub fn start(name: &str, mut cmd: Command, marker: &str) -> Result<Tracer> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("failed to start {name}: {cmd:?}"))?;
        let (tx_err, stderr_lines) = mpsc::channel();
        let (tx_out, stdout_lines) = mpsc::channel();
        let stderr = collect(child.stderr.take().context("stderr was piped")?, tx_err);
        let stdout = collect(child.stdout.take().context("stdout was piped")?, tx_out);
        let mut tracer = Tracer { name: name.to_owned(), child, stderr_lines, stderr, stdout };
        tracer.wait_for(marker, &stdout_lines)?;
        Ok(tracer)
    }

    /// The tool's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_for(&mut self, marker: &str, stdout_lines: &Receiver<String>) -> Result<()> {
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        let mut seen = Vec::new();
        loop {
            for lines in [&self.stderr_lines, stdout_lines] {
                while let Ok(line) = lines.try_recv() {
                    if line.contains(marker) {
                        return Ok(());
                    }
                    seen.push(line);
                }
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited ({status}) before printing {marker:?}; it printed:\n{}", self.name, seen.join("\n"));
            }
            if Instant::now() >= deadline {
                bail!("{} did not print {marker:?} within {ATTACH_TIMEOUT:?}", self.name);
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends SIGINT, waits for the tool to exit, and returns what it printed.
    pub fn stop(mut self) -> Result<Stopped> {
        let pid = libc::pid_t::try_from(self.child.id()).context("pid out of range")?;
        // SAFETY: kill has no memory-safety preconditions; pid is our own unreaped child.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let status = self.child.wait().context("failed to wait for the tracer")?;
        let stderr = std::mem::replace(&mut self.stderr, thread::spawn(String::new));
        let stdout = std::mem::replace(&mut self.stdout, thread::spawn(String::new));
        // stdout (bpftrace's empty maps, the profiler's summary) is drained but not needed.
        let _ = stdout.join();
        Ok(Stopped { status, stderr: stderr.join().unwrap_or_default() })
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        // After `stop` the child is reaped and both calls fail harmlessly.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads `pipe` to the end on a thread, sending each line on `lines` as it comes and
/// returning the whole text.
fn collect(pipe: impl Read + Send + 'static, lines: mpsc::Sender<String>) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            text.push_str(&line);
            text.push('\n');
            let _ = lines.send(line);
        }
        text
    })
}
