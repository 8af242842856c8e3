//! Runs one child to completion and measures it the way the kernel accounts it: CPU time
//! (user + sys) and peak RSS from `wait4`'s rusage, which also covers reaped descendants
//! (perf's `sleep`), so nothing the tool spawns escapes the measurement. What it prints is
//! kept for the caller to read its own figures from.

use std::io::{self, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// What one measured run cost.
pub struct Run {
    /// User + system CPU time of the child and its reaped descendants.
    pub cpu: Duration,
    pub wall: Duration,
    /// Peak resident set size (`ru_maxrss`, which Linux reports in KiB).
    pub max_rss_kib: u64,
    /// Everything the child wrote to stderr, where both tools print their summaries.
    pub stderr: String,
    /// Everything it wrote to stdout (`profiler snapshot`'s summary of what it wrote).
    pub stdout: String,
}

/// Runs `cmd`, failing with its stderr if it exits unsuccessfully.
pub fn run(mut cmd: Command) -> Result<Run> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("failed to start {cmd:?}"))?;
    let stderr = drain(child.stderr.take().context("stderr was piped")?);
    let stdout = drain(child.stdout.take().context("stdout was piped")?);
    let (status, usage) = wait4(child.id()).with_context(|| format!("failed to wait for {cmd:?}"))?;
    let wall = start.elapsed();
    let (stderr, stdout) = (stderr.join().unwrap_or_default(), stdout.join().unwrap_or_default());
    if !status.success() {
        bail!("{cmd:?} failed ({status}); its stderr:\n{stderr}");
    }
    let cpu = timeval(usage.ru_utime) + timeval(usage.ru_stime);
    Ok(Run { cpu, wall, max_rss_kib: u64::try_from(usage.ru_maxrss).unwrap_or(0), stderr, stdout })
}

/// Reads `pipe` to its end on a thread, so a chatty child never blocks on a full pipe while
/// we wait for it.
fn drain(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

/// Reaps `pid` ourselves (instead of `Child::wait`) because only wait4 returns its rusage.
fn wait4(pid: u32) -> io::Result<(ExitStatus, libc::rusage)> {
    let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
    let mut status = 0;
    // SAFETY: rusage is plain integers; all-zero is a valid value that wait4 overwrites.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: pid is our own unreaped child, and both pointers are valid for the call.
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if reaped == pid {
            return Ok((ExitStatus::from_raw(status), usage));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn timeval(tv: libc::timeval) -> Duration {
    let secs = u64::try_from(tv.tv_sec).unwrap_or(0);
    let micros = u64::try_from(tv.tv_usec).unwrap_or(0);
    Duration::from_secs(secs) + Duration::from_micros(micros)
}
