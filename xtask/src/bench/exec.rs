//! `cargo xtask bench exec`: what following a machine that runs hundreds of short programs a
//! second costs. A pacer (a small C program) runs `/bin/true` at a fixed rate (500 a second
//! by default) while, in interleaved rounds of the same length, `profiler run` (19 Hz, every
//! process selected) and `perf record -a -e dummy` (perf's own side band: the same fork,
//! exec, mmap and exit records, written to a file) follow it. Reports each one's CPU per
//! second, the daemon's RSS over the run (first third vs last third, after a warm-up) and the
//! records the daemon's rings lost.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::all::{Bar, Headline, Unit};
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
    crate::setup::prepare_bench()?;
    follow(args).map(|_| ())
}

/// `bench all --quick`: one round of 5 s of warm-up and 10 s at 500 programs a second; the
/// daemon's CPU against perf's, and the records lost.
pub fn quick() -> Result<Vec<Headline>> {
    let (ratio, lost) = follow(&ExecArgs { rate: 500, seconds: 10, warmup: 5, rounds: 1 })?;
    Ok(vec![
        Headline::new("exec", "daemon CPU / perf record -e dummy's", Some(ratio), Bar::AtMost(1.0), Unit::Ratio),
        Headline::new("exec", "process event records lost", Some(lost as f64), Bar::AtMost(0.0), Unit::Count),
    ])
}

/// Every round, daemon then perf; prints the table. Returns the daemon's CPU over perf's
/// (medians) and the records its rings lost.
fn follow(args: &ExecArgs) -> Result<(f64, u64)> {
    let dir = workspace::target_dir().join("xtask-bench/exec");
    std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let pacer = crate::bench::cc::compile_text(&dir, "exec_pacer", PACER_C, &["-O2"])?;
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
        let (result, thirds, round_lost) = daemon_round(&dir, &pacer, args)?;
        ours.push(result);
        rss_thirds.push(thirds);
        lost += round_lost;
        bail_if_interrupted()?;
        workspace::stage(&format!("round {round}: perf record -a -e dummy for {} s", args.warmup + args.seconds));
        perf.push(perf_round(&dir, &pacer, args)?);
        bail_if_interrupted()?;
    }
    print(&ours, &perf, &rss_thirds, lost, args);
    Ok((cpu_ratio(&ours, &perf), lost))
}

/// The daemon following the load: its CPU over the window, its RSS in thirds, lost records.
fn daemon_round(dir: &Path, pacer: &Path, args: &ExecArgs) -> Result<(Round, (u64, u64), u64)> {
    let out = dir.join("out");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    // This debug-built xtask is the bench's driver, not its load: unexcluded, the daemon took
    // in its 12-14 MiB of mapped debug info at whichever dump first named its frames (it
    // mostly sleeps), and the RSS line measured when that happened.
    let xtask = std::env::current_exe().context("failed to find the xtask binary")?;
    let exclude = format!("\n[processes]\nexclude = [{{ exe = {:?} }}]\n", xtask.display().to_string());
    let daemon = Daemon::start(dir, &out, 19, &exclude)?;
    let pid = daemon.pid();
    let load = Pacer::start(pacer, args.rate)?;
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
    let execs = load.stop()?;
    let status = sample::get(&daemon.socket, "/status")?;
    let lost = sample::json_number_in(&status, &["process_events", "lost"]).unwrap_or(0);
    daemon.stop()?;
    let third = rss.len() / 3;
    let mean = |xs: &[u64]| xs.iter().sum::<u64>() / xs.len().max(1) as u64;
    let thirds = (mean(&rss[..third.max(1)]), mean(&rss[rss.len() - third.max(1)..]));
    Ok((Round { cpu_per_s: cpu.as_secs_f64() / wall.as_secs_f64(), execs }, thirds, lost))
}

/// `perf record` recording only the side band (a dummy event) for the same window.
fn perf_round(dir: &Path, pacer: &Path, args: &ExecArgs) -> Result<Round> {
    let mut cmd = Command::new("perf");
    cmd.args(["record", "-a", "-e", "dummy", "-o"]).arg(dir.join("perf.data")).args([
        "--",
        "sleep",
        &(args.warmup + args.seconds).to_string(),
    ]);
    let load = Pacer::start(pacer, args.rate)?;
    let run = measure::run(cmd).context("perf record (cargo xtask setup installs linux-perf)")?;
    let execs = load.stop()?;
    // The `sleep` perf waits for is reaped by perf and counted in its rusage: a millisecond.
    Ok(Round { cpu_per_s: run.cpu.as_secs_f64() / run.wall.as_secs_f64(), execs })
}

/// Runs `/bin/true` RATE times a second (`posix_spawn` and wait, on a fixed schedule)
/// until SIGTERM, then prints how many it started.
const PACER_C: &str = include_str!("../../programs/exec_pacer.c");

/// The pacer process, running until stopped; killed and reaped on drop if never stopped
/// (a round that fails midway must not leave it spawning programs after the bench ends).
struct Pacer(Option<Child>);

impl Pacer {
    fn start(bin: &Path, rate: u32) -> Result<Self> {
        let child = Command::new(bin)
            .arg(rate.max(1).to_string())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("failed to start {}", bin.display()))?;
        Ok(Self(Some(child)))
    }

    /// Stops it; returns how many programs it ran.
    fn stop(mut self) -> Result<u64> {
        let child = self.0.take().context("the pacer was stopped already")?;
        // SAFETY: kill(2) on our own child, which has not been waited for yet.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let output = child.wait_with_output().context("failed to wait for the pacer")?;
        let text = String::from_utf8_lossy(&output.stdout);
        text.trim().parse().with_context(|| format!("the pacer printed {text:?}, not a count ({})", output.status))
    }
}

impl Drop for Pacer {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The median round's CPU per second (the upper one of an even count).
fn median(rounds: &[Round]) -> f64 {
    let mut v: Vec<f64> = rounds.iter().map(|r| r.cpu_per_s).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The daemon's median CPU over perf's: the target.
fn cpu_ratio(ours: &[Round], perf: &[Round]) -> f64 {
    median(ours) / median(perf).max(f64::MIN_POSITIVE)
}

fn print(ours: &[Round], perf: &[Round], rss_thirds: &[(u64, u64)], lost: u64, args: &ExecArgs) {
    let rate = |rounds: &[Round]| {
        rounds.iter().map(|r| r.execs).sum::<u64>() as f64 / (rounds.len() as f64 * (args.warmup + args.seconds) as f64)
    };
    println!();
    println!("{:<28} {:>14} {:>14}", "", "profiler run", "perf record");
    println!("{:<28} {:>14.0} {:>14.0}", "programs run per second", rate(ours), rate(perf));
    println!("{:<28} {:>13.2}% {:>13.2}%", "CPU, % of a core (median)", median(ours) * 100.0, median(perf) * 100.0);
    let ratio = cpu_ratio(ours, perf);
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
