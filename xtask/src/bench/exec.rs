//! `cargo xtask bench exec`: what following a machine that runs hundreds of short programs a
//! second costs. A pacer runs `/bin/true` at a fixed rate (500 a second by default) while,
//! in interleaved rounds of the same length, `profiler run` (19 Hz, every process selected)
//! and `perf record -a -e dummy` (perf's own side band: the same fork, exec, mmap and exit
//! records, written to a file) follow it. Reports each one's CPU per second, the daemon's RSS
//! over the run (first third vs last third, after a warm-up) and the records the daemon's
//! rings lost.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::daemon::{sample, Daemon};
use super::{bail_if_interrupted, measure, workload};
use crate::workspace;

#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    /// Programs started per second.
    #[arg(long, default_value_t = 500)]
    rate: u32,
    /// Seconds each tool follows the load, per round, after the warm-up.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Seconds of load before the RSS thirds are taken (one dump interval: by then the
    /// daemon has met every program the load runs, symbolized them and dumped once). CPU
    /// is measured over the warm-up too, for both tools.
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    /// Interleaved rounds (daemon, then perf, each round).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
}

/// What one tool cost in one round.
struct Round {
    cpu_per_s: f64,
    execs: u64,
}

pub fn run(args: &ExecArgs) -> Result<()> {
    workspace::prepare_bench()?;
    let dir = workspace::target_dir().join("xtask-bench/exec");
    std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    workload::catch_interrupt();
    let (mut ours, mut perf) = (Vec::new(), Vec::new());
    let mut rss_thirds = Vec::new();
    let mut lost = 0;
    for round in 1..=args.rounds {
        workspace::stage(&format!(
            "round {round}: profiler run for {} s at {} execs/s",
            args.warmup + args.seconds,
            args.rate
        ));
        let (result, thirds, round_lost) = daemon_round(&dir, args)?;
        ours.push(result);
        rss_thirds.push(thirds);
        lost += round_lost;
        bail_if_interrupted()?;
        workspace::stage(&format!("round {round}: perf record -a -e dummy for {} s", args.warmup + args.seconds));
        perf.push(perf_round(&dir, args)?);
        bail_if_interrupted()?;
    }
    print(&ours, &perf, &rss_thirds, lost, args);
    Ok(())
}

/// The daemon following the load: its CPU over the window, its RSS in thirds, lost records.
fn daemon_round(dir: &Path, args: &ExecArgs) -> Result<(Round, (u64, u64), u64)> {
    let out = dir.join("out");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let daemon = Daemon::start(dir, &out, 19, "")?;
    let pid = daemon.pid();
    let load = Pacer::start(args.rate);
    let started = Instant::now();
    let cpu_before = sample::cpu_time(pid)?;
    let (warmup, length) = (Duration::from_secs(args.warmup), Duration::from_secs(args.warmup + args.seconds));
    let mut rss = Vec::new();
    while started.elapsed() < length {
        std::thread::sleep(Duration::from_secs(1).min(length.saturating_sub(started.elapsed())));
        let kib = sample::rss_kib(pid)?;
        if started.elapsed() > warmup {
            rss.push(kib);
        }
    }
    let cpu = sample::cpu_time(pid)? - cpu_before;
    let wall = started.elapsed();
    let execs = load.stop();
    let status = sample::get(&daemon.socket, "/status")?;
    let lost = sample::json_number_in(&status, &["process_events", "lost"]).unwrap_or(0);
    daemon.stop()?;
    let third = rss.len() / 3;
    let mean = |xs: &[u64]| xs.iter().sum::<u64>() / xs.len().max(1) as u64;
    let thirds = (mean(&rss[..third.max(1)]), mean(&rss[rss.len() - third.max(1)..]));
    Ok((Round { cpu_per_s: cpu.as_secs_f64() / wall.as_secs_f64(), execs }, thirds, lost))
}

/// `perf record` recording only the side band (a dummy event) for the same window.
fn perf_round(dir: &Path, args: &ExecArgs) -> Result<Round> {
    let mut cmd = Command::new("perf");
    cmd.args(["record", "-a", "-e", "dummy", "-o"]).arg(dir.join("perf.data")).args([
        "--",
        "sleep",
        &(args.warmup + args.seconds).to_string(),
    ]);
    let load = Pacer::start(args.rate);
    let run = measure::run(cmd).context("perf record (cargo xtask setup installs linux-perf)")?;
    let execs = load.stop();
    // The `sleep` perf waits for is reaped by perf and counted in its rusage: a millisecond.
    Ok(Round { cpu_per_s: run.cpu.as_secs_f64() / run.wall.as_secs_f64(), execs })
}

/// Runs `/bin/true` `rate` times a second on a thread until stopped.
struct Pacer {
    stop: Arc<AtomicBool>,
    started: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Pacer {
    fn start(rate: u32) -> Self {
        let (stop, started) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (thread_stop, thread_started) = (Arc::clone(&stop), Arc::clone(&started));
        let thread = std::thread::spawn(move || {
            let period = Duration::from_secs(1) / rate.max(1);
            let mut next = Instant::now();
            while !thread_stop.load(Ordering::Relaxed) {
                if let Ok(mut child) = Command::new("/bin/true").spawn() {
                    let _ = child.wait();
                    thread_started.fetch_add(1, Ordering::Relaxed);
                }
                next += period;
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
        });
        Self { stop, started, thread }
    }

    /// Stops it; returns how many programs ran.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        self.started.load(Ordering::Relaxed)
    }
}

fn print(ours: &[Round], perf: &[Round], rss_thirds: &[(u64, u64)], lost: u64, args: &ExecArgs) {
    let median = |rounds: &[Round]| {
        let mut v: Vec<f64> = rounds.iter().map(|r| r.cpu_per_s).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let rate = |rounds: &[Round]| {
        rounds.iter().map(|r| r.execs).sum::<u64>() as f64 / (rounds.len() as f64 * (args.warmup + args.seconds) as f64)
    };
    println!();
    println!("{:<28} {:>14} {:>14}", "", "profiler run", "perf record");
    println!("{:<28} {:>14.0} {:>14.0}", "programs run per second", rate(ours), rate(perf));
    println!("{:<28} {:>13.2}% {:>13.2}%", "CPU, % of a core (median)", median(ours) * 100.0, median(perf) * 100.0);
    let ratio = median(ours) / median(perf).max(f64::MIN_POSITIVE);
    let verdict = if ratio <= 1.0 { "PASS" } else { "MISS" };
    println!("daemon CPU / perf's: {ratio:.2} (target at most 1.00): {verdict}");
    for (round, (first, last)) in rss_thirds.iter().enumerate() {
        let growth = *last as f64 / (*first).max(1) as f64 - 1.0;
        let verdict = if growth.abs() <= 0.05 { "PASS" } else { "MISS" };
        println!(
            "round {}: daemon RSS after {} s of warm-up: first third {:.1} MiB, last third {:.1} MiB ({:+.1}%, target \
             within 5%): {verdict}",
            round + 1,
            args.warmup,
            *first as f64 / 1024.0,
            *last as f64 / 1024.0,
            growth * 100.0
        );
    }
    let verdict = if lost == 0 { "PASS" } else { "MISS" };
    println!("process event records lost by the daemon's rings: {lost} (target 0 on a quiet machine): {verdict}");
}
