//! `cargo xtask bench daemon`: what `profiler run` costs over minutes on a machine with a few
//! hundred, or thousands of, processes. For each process count, starts a fleet (20 busy
//! spinners with a 16-frame stack, the rest idle processes with `--threads-per-process`
//! threads that wake for a millisecond, together ~200 times a second whatever their number),
//! then runs the daemon at each frequency in turn with a 10 s interval, sampling every 5 s its CPU time
//! (`/proc/PID/stat`), its RSS (`/proc/PID/status`), the run time of its BPF programs
//! (`/proc/PID/fdinfo`, with `kernel.bpf_stats_enabled`) and its last dump time (`/status`).
//!
//! The BPF programs run in the context of the sampled tasks, so their cost is not in the
//! daemon's own CPU time; it is shown in its own column rather than added silently. With two
//! process counts, the table ends with the slope: what each 1,000 more processes cost.

pub(super) mod fleet;
mod report;
/// Also the thread-dump bench's socket client and CPU clock.
pub(super) mod sample;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use self::fleet::Fleet;
use self::report::{Run, Sample};
use super::{bail_if_interrupted, workload};
use crate::workspace;

#[derive(clap::Args, Debug)]
pub struct DaemonArgs {
    /// Processes running while the daemon is measured, one fleet (and one table) per count,
    /// e.g. `200,2000`.
    #[arg(long, value_delimiter = ',', default_value = "200")]
    processes: Vec<usize>,
    /// Threads of each idle process (the spinners have one).
    #[arg(long, default_value_t = 1)]
    threads_per_process: usize,
    /// Of the processes, how many spin (at most all of them).
    #[arg(long, default_value_t = 20)]
    spinners: usize,
    /// Minutes the daemon runs at each frequency.
    #[arg(long, default_value_t = 10)]
    minutes: u64,
    /// CPU sampling frequencies to measure, one daemon run each.
    #[arg(long, value_delimiter = ',', default_value = "19,99")]
    frequencies: Vec<u32>,
}

/// The dump interval of every run.
pub(super) const INTERVAL: Duration = Duration::from_secs(10);
/// Time between two measurements.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Loading and verifying the BPF programs takes seconds on a busy machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// Idle processes wake, together, about this often a second, whatever their number.
const FLEET_WAKES_PER_SECOND: usize = 200;

pub fn run(args: &DaemonArgs) -> Result<()> {
    if args.frequencies.is_empty() || args.minutes == 0 || args.processes.contains(&0) || args.processes.is_empty() {
        bail!("need at least one frequency, one minute and one process");
    }
    if args.threads_per_process == 0 {
        bail!("--threads-per-process must be at least 1");
    }
    crate::setup::prepare_bench()?;
    let dir = bench_dir()?;
    workload::catch_interrupt();
    let _stats = workload::BpfStats::enable();
    let mut tables = Vec::new();
    for &processes in &args.processes {
        tables.push((processes, table(&dir, args, processes)?));
    }
    report::print_slope(&tables);
    println!("(profiles and logs kept in {})", dir.display());
    Ok(())
}

/// `bench all --quick`: 200 processes, the daemon at the default 19 Hz for one minute (the
/// shortest the bench takes); its CPU share and peak RSS against the targets.
pub fn quick() -> Result<Vec<super::all::Headline>> {
    let args =
        DaemonArgs { processes: vec![200], threads_per_process: 1, spinners: 20, minutes: 1, frequencies: vec![19] };
    let dir = bench_dir()?;
    let _stats = workload::BpfStats::enable();
    let runs = table(&dir, &args, args.processes[0])?;
    Ok(report::headlines(&runs, args.processes[0]))
}

fn bench_dir() -> Result<PathBuf> {
    let dir = workspace::target_dir().join("xtask-bench/daemon");
    std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    Ok(dir)
}

/// A fleet of `processes`, the daemon at each frequency among it in turn; prints the table
/// and returns the runs.
fn table(dir: &Path, args: &DaemonArgs, processes: usize) -> Result<Vec<Run>> {
    let spinners = args.spinners.min(processes);
    let idlers = processes - spinners;
    let wake_every = (idlers / FLEET_WAKES_PER_SECOND).max(1) as u64;
    workspace::stage(&format!(
        "starting {spinners} spinners and {idlers} idle processes of {} threads, waking every {wake_every} s",
        args.threads_per_process
    ));
    let fleet = Fleet::start(dir, spinners, idlers, args.threads_per_process, wake_every)?;
    let stale = set_aside_old_outputs(dir, &args.frequencies)?;
    let mut runs = Vec::new();
    for &frequency_hz in &args.frequencies {
        workspace::stage(&format!(
            "profiler run at {frequency_hz} Hz for {} min, interval {} s, {processes} processes",
            args.minutes,
            INTERVAL.as_secs()
        ));
        runs.push(measure(dir, frequency_hz, args.minutes)?);
        bail_if_interrupted()?;
    }
    drop(fleet);
    for old in stale {
        let _ = std::fs::remove_dir_all(old);
    }
    report::print(&runs, processes, args.threads_per_process);
    Ok(runs)
}

/// Moves the previous invocation's profiles aside (`out-<f>hz.old`), to be deleted once every
/// run is measured. Deleting thousands of files right before a run made its first dumps pay
/// for it: their `syncfs` wrote the freed metadata back, and ext4 without a journal passes
/// over inodes freed in the last seconds while allocating (first 99 Hz dumps of 1.0-1.9 s
/// after deleting 6600 files, against ~0.3 s after).
fn set_aside_old_outputs(dir: &Path, frequencies: &[u32]) -> Result<Vec<PathBuf>> {
    let mut stale = Vec::new();
    for hz in frequencies {
        let (out, old) = (dir.join(format!("out-{hz}hz")), dir.join(format!("out-{hz}hz.old")));
        if out.exists() {
            // A set-aside directory left by an interrupted invocation goes now.
            let _ = std::fs::remove_dir_all(&old);
            std::fs::rename(&out, &old).with_context(|| format!("failed to move {} aside", out.display()))?;
            stale.push(old);
        }
    }
    Ok(stale)
}

/// One daemon run at `frequency_hz`, measured every [`SAMPLE_EVERY`] for `minutes`.
fn measure(dir: &Path, frequency_hz: u32, minutes: u64) -> Result<Run> {
    let out = dir.join(format!("out-{frequency_hz}hz"));
    std::fs::create_dir_all(&out).with_context(|| format!("failed to create {}", out.display()))?;
    let daemon = Daemon::start(dir, &out, frequency_hz, "")?;
    let started = Instant::now();
    let length = Duration::from_secs(minutes * 60);
    let mut samples = vec![daemon.sample(started)?];
    while started.elapsed() < length {
        std::thread::sleep(SAMPLE_EVERY.min(length.saturating_sub(started.elapsed())));
        bail_if_interrupted()?;
        let sample = daemon.sample(started)?;
        print_progress(&sample);
        samples.push(sample);
    }
    let status = sample::get(&daemon.socket, "/status")?;
    daemon.stop()?;
    Ok(Run { frequency_hz, samples, files_written: sample::json_number(&status, "files_written").unwrap_or(0) })
}

fn print_progress(s: &Sample) {
    println!(
        "    t={:>4.0}s cpu={:>7.2}s bpf={:>7.3}s rss={:>6.1}MiB last_dump={}ms (cpu {}ms, writing {}ms) stacks={} processes={} unwind={:.1}MiB",
        s.at.as_secs_f64(),
        s.cpu.as_secs_f64(),
        s.bpf.as_secs_f64(),
        s.rss_kib as f64 / 1024.0,
        s.last_dump_ms,
        s.last_dump_cpu_ms,
        s.last_dump_write_ms,
        s.stacks,
        s.processes,
        s.unwind_table_bytes as f64 / (1 << 20) as f64
    );
}

/// `profiler run` on a config written for the bench; SIGTERM, then SIGKILL, on drop.
pub(super) struct Daemon {
    child: Child,
    pub(super) socket: PathBuf,
}

impl Daemon {
    /// `extra` is appended to the config (e.g. `[[export]]` tables).
    pub(super) fn start(dir: &Path, out: &Path, frequency_hz: u32, extra: &str) -> Result<Daemon> {
        let socket = dir.join("profiler.sock");
        let config = dir.join(format!("profiler-{frequency_hz}hz.toml"));
        // min_free_bytes 0: the bench measures the daemon, not how full the build disk is.
        let text = format!(
            "output_dir = {out:?}\ninterval = \"{}s\"\n\n[socket]\npath = {socket:?}\n\n\
             [retention]\nmin_free_bytes = \"0B\"\n\n[cpu]\nfrequency_hz = {frequency_hz}\n{extra}",
            INTERVAL.as_secs()
        );
        std::fs::write(&config, text).with_context(|| format!("failed to write {}", config.display()))?;
        let log = dir.join(format!("profiler-{frequency_hz}hz.log"));
        let stderr = std::fs::File::create(&log).with_context(|| format!("failed to create {}", log.display()))?;
        let child = Command::new(workspace::profiler_bin())
            .arg("run")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("failed to start profiler run")?;
        let mut daemon = Daemon { child, socket };
        daemon.wait_ready(&log)?;
        Ok(daemon)
    }

    fn wait_ready(&mut self, log: &Path) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        while sample::get(&self.socket, "/status").is_err() {
            if let Some(status) = self.child.try_wait()? {
                bail!("profiler run exited with {status} while starting; see {}", log.display());
            }
            if Instant::now() > deadline {
                bail!(
                    "profiler run did not answer on {} within {START_TIMEOUT:?}; see {}",
                    self.socket.display(),
                    log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    fn sample(&self, started: Instant) -> Result<Sample> {
        let pid = self.child.id();
        let status = sample::get(&self.socket, "/status")?;
        Ok(Sample {
            at: started.elapsed(),
            cpu: sample::cpu_time(pid)?,
            bpf: sample::bpf_run_time(pid),
            rss_kib: sample::rss_kib(pid)?,
            last_dump_ms: sample::json_number(&status, "last_dump_ms").context("/status has no output.last_dump_ms")?,
            last_dump_cpu_ms: sample::json_number_in(&status, &["last_dump", "cpu_ms"]).unwrap_or(0),
            last_dump_write_ms: sample::json_number_in(&status, &["last_dump", "write_ms"]).unwrap_or(0),
            stacks: sample::json_number_in(&status, &["userspace_stacks", "entries"]).unwrap_or(0),
            processes: sample::json_number(&status, "processes_tracked").unwrap_or(0),
            unwind_table_bytes: sample::json_number_in(&status, &["unwind", "table_bytes"]).unwrap_or(0),
            unwind_tables: sample::json_number_in(&status, &["unwind", "tables_loaded"]).unwrap_or(0),
        })
    }

    /// SIGTERM and a clean exit (the final dump included), or an error.
    pub(super) fn stop(mut self) -> Result<()> {
        signal_term(self.child.id());
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("profiler run exited with {status} after SIGTERM");
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("profiler run did not exit within {STOP_TIMEOUT:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            signal_term(self.child.id());
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn signal_term(pid: u32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill has no memory-safety preconditions; the child is ours and unreaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
}
