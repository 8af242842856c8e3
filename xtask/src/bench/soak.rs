//! `cargo xtask bench soak`: issue #18's soak at full length. Two `stack_churn` processes,
//! one per CPU, each making a new distinct stack every fraction of a millisecond (24 levels
//! of two-way branches: 16 M paths, so samples hardly ever repeat one), run under `profiler
//! run` with its real 200,000-entry stack table at 999 Hz until the daemon has learnt a
//! million distinct stacks (`/status`: held plus evicted). Then `cpu_split`, a known stack
//! with a known 75/25 split, starts beside the churn: its next full interval file must hold
//! that split (read by `go tool pprof`), though every stack before it is history.
//!
//! Printed against targets: stacks learnt; the known split; stacks refused once eviction
//! began (history makes room, new stacks are not refused); peak RSS and whether RSS stays
//! flat once the table is full. The accelerated form, with the table cut to 2,000, is the
//! test `daemon soak::new_stacks_are_kept_when_history_fills_the_table`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::daemon::{sample, Daemon};
use super::report::target;
use super::{bail_if_interrupted, fresh_dir, workload};
use crate::workspace;

#[derive(clap::Args, Debug)]
pub struct SoakArgs {
    /// Distinct stacks the daemon must learn before the known stack starts.
    #[arg(long, default_value_t = 1_000_000)]
    stacks: u64,
    /// Give up on reaching `--stacks` after this many minutes (and say so).
    #[arg(long, default_value_t = 20)]
    max_minutes: u64,
    /// CPU sampling frequency: at 999 Hz two churners give ~2,000 new stacks a second.
    #[arg(long = "frequency", default_value_t = 999)]
    frequency_hz: u32,
}

/// Branch levels of each churner's stacks: 2^24 paths, so a million samples are nearly all
/// distinct (about 3% repeats by the birthday bound).
const LEVELS: u32 = 24;
const CHURNERS: usize = 2;
/// Between two measurements: RSS swings by 20 MiB within a dump interval (rendering a dump
/// of 20,000 new stacks), so it is read often and judged on medians.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// Every this many measurements, one is printed.
const PRINT_EVERY: usize = 5;
/// How long the known process runs: three intervals, so one whole interval is its own.
const KNOWN_SECONDS: u64 = 35;
/// cpu_split's own split (thread CPU time it measures): hot_a 75%, hot_b 25%.
const KNOWN_SHARE: f64 = 0.75;
/// Tolerance on the share, in standard deviations of a binomial share of n samples.
const SIGMAS: f64 = 3.5;
/// The bound on RSS: the daemon bench's with thousands of processes (96 MiB), plus the
/// stack table's frames (32 MiB), which the churn keeps full; and "flat", as the daemon
/// bench has it (the last third's median within 5% of the first third's, plus 1 MiB of
/// allocator noise).
const MAX_RSS_MIB: f64 = 96.0 + 32.0;
const FLAT_GROWTH_RATIO: f64 = 1.05;
const FLAT_SLACK_MIB: f64 = 1.0;
/// As the accelerated test: a refusal or two may race the first eviction.
const MAX_REFUSED_AFTER_EVICTION: u64 = 20;

const CHURN_C: &str = include_str!("../../../tests/fixtures/stack_churn.c");
const SPLIT_C: &str = include_str!("../../../tests/fixtures/cpu_split.c");
/// The tests' flags for both fixtures (`tests/src/fixture.rs`, `CFLAGS`).
const CFLAGS: &[&str] = &[
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-fno-optimize-sibling-calls",
    "-fno-inline",
];

/// One measurement of the daemon during the churn.
struct Point {
    at: Duration,
    rss_mib: f64,
    held: u64,
    evicted: u64,
    refused: u64,
}

impl Point {
    fn learnt(&self) -> u64 {
        self.held + self.evicted
    }
}

pub fn run(args: &SoakArgs) -> Result<()> {
    workspace::stage("setup (including go tool pprof, the reference reader)");
    crate::setup::run(crate::setup::Needs { go: true, bench: true, privileges: true })?;
    crate::builds::build_release()?;
    let dir = workspace::target_dir().join("xtask-bench-soak");
    std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let out = fresh_dir(&dir.join("out"))?;
    workload::catch_interrupt();
    let churn_bin = crate::bench::cc::compile_text(&dir, "stack_churn", CHURN_C, CFLAGS)?;
    let split_bin = crate::bench::cc::compile_text(&dir, "cpu_split", SPLIT_C, CFLAGS)?;

    workspace::stage(&format!(
        "profiler run at {} Hz, {CHURNERS} churners ({LEVELS} levels), until {} stacks are learnt (at most {} min)",
        args.frequency_hz, args.stacks, args.max_minutes
    ));
    let daemon = Daemon::start(&dir, &out, args.frequency_hz, "")?;
    let churn_seconds = args.max_minutes * 60 + KNOWN_SECONDS + 60;
    let mut churners = workload::Children::default();
    for _ in 0..CHURNERS {
        churners.spawn(&churn_bin, &[&churn_seconds.to_string(), &LEVELS.to_string()])?;
    }
    let started = Instant::now();
    let mut points = Vec::new();
    loop {
        std::thread::sleep(SAMPLE_EVERY);
        bail_if_interrupted()?;
        let point = measure(&daemon, started)?;
        if points.len() % PRINT_EVERY == PRINT_EVERY - 1 {
            println!(
                "    t={:>5.0}s rss={:>6.1}MiB stacks held={:>7} evicted={:>8} learnt={:>8} refused={}",
                point.at.as_secs_f64(),
                point.rss_mib,
                point.held,
                point.evicted,
                point.learnt(),
                point.refused
            );
        }
        let (done, late) = (point.learnt() >= args.stacks, point.at.as_secs() >= args.max_minutes * 60);
        points.push(point);
        if done || late {
            break;
        }
    }

    workspace::stage(&format!("cpu_split (hot_a 75%, hot_b 25%) for {KNOWN_SECONDS} s beside the churn"));
    let mut known = workload::Children::default();
    let split_pid = known.spawn(&split_bin, &[&KNOWN_SECONDS.to_string()])?;
    let split_dir = out.join(format!("cpu_split-{split_pid}"));
    let file = second_file(&split_dir, Duration::from_secs(KNOWN_SECONDS + 20))?;
    points.push(measure(&daemon, started)?);
    let status = sample::get(&daemon.socket, "/status")?;
    daemon.stop()?;
    drop(known);
    drop(churners);

    let (a, b) = hot_samples(&file)?;
    report(args, &points, &status, (a, b), &file);
    println!("(profiles and the daemon's log kept in {})", dir.display());
    Ok(())
}

fn measure(daemon: &Daemon, started: Instant) -> Result<Point> {
    let status = sample::get(&daemon.socket, "/status")?;
    let number = |path: &[&str]| sample::json_number_in(&status, path).unwrap_or(0);
    Ok(Point {
        at: started.elapsed(),
        rss_mib: sample::rss_kib(daemon.pid())? as f64 / 1024.0,
        held: number(&["userspace_stacks", "entries"]),
        evicted: number(&["userspace_stacks_evicted"]),
        refused: number(&["userspace_stack_table_full"]),
    })
}

/// The second CPU profile written for the process whose directory is `dir`: the first one
/// whose interval the process ran all of.
fn second_file(dir: &Path, timeout: Duration) -> Result<PathBuf> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("cpu-") && n.ends_with(".pb.gz"))
            })
            .collect();
        files.sort();
        if let Some(file) = files.get(1) {
            return Ok(file.clone());
        }
        if Instant::now() > deadline {
            bail!("fewer than two CPU profiles in {} within {timeout:?}", dir.display());
        }
        bail_if_interrupted()?;
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Flat samples in hot_a and hot_b, as `go tool pprof -top` reads them.
fn hot_samples(file: &Path) -> Result<(f64, f64)> {
    let output = Command::new("go")
        .args(["tool", "pprof", "-top", "-nodefraction=0", "-sample_index=samples", "-symbolize=none"])
        .arg(file)
        .stderr(Stdio::null())
        .output()
        .context("failed to run go tool pprof; run `cargo xtask setup --for-test` to install golang-go")?;
    if !output.status.success() {
        bail!("go tool pprof could not read {} ({})", file.display(), output.status);
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok((flat(&text, "hot_a"), flat(&text, "hot_b")))
}

/// The flat value of `function` in `go tool pprof -top` text (its first column), 0 if absent.
fn flat(top: &str, function: &str) -> f64 {
    top.lines()
        .find(|line| line.split_whitespace().last() == Some(function))
        .and_then(|line| line.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

fn report(args: &SoakArgs, points: &[Point], status: &str, (a, b): (f64, f64), file: &Path) {
    let last = points.last().expect("at least one measurement");
    println!();
    println!(
        "soak: {:.0} s of churn at {} Hz, the known stack in {}",
        last.at.as_secs_f64(),
        args.frequency_hz,
        file.display()
    );
    target(
        "distinct stacks learnt",
        &format!("{} (≥ {})", last.learnt(), args.stacks),
        Some(last.learnt() >= args.stacks),
    );

    let n = a + b;
    let share = if n > 0.0 { a / n } else { 0.0 };
    let tolerance = if n > 0.0 { SIGMAS * (KNOWN_SHARE * (1.0 - KNOWN_SHARE) / n).sqrt() } else { 0.0 };
    target(
        "known stack: hot_a share",
        &format!("{:.3} ± {tolerance:.3} (n {n:.0})", share),
        Some(n >= 100.0 && (share - KNOWN_SHARE).abs() <= tolerance),
    );

    // Refusals from the first measurement that saw an eviction on.
    let full_from = points.iter().position(|p| p.evicted > 0);
    let refused = full_from.map(|i| last.refused - points[i].refused);
    target(
        "stacks refused once evicting",
        &refused.map_or("no eviction".into(), |r| format!("{r} (≤ {MAX_REFUSED_AFTER_EVICTION})")),
        refused.map(|r| r <= MAX_REFUSED_AFTER_EVICTION),
    );

    let peak = points.iter().map(|p| p.rss_mib).fold(0.0, f64::max);
    target("peak RSS", &format!("{peak:.1} MiB (≤ {MAX_RSS_MIB})"), Some(peak <= MAX_RSS_MIB));
    // Flat once the table is full: the first and last thirds of the measurements after it.
    let full: Vec<f64> = full_from.map(|i| points[i..].iter().map(|p| p.rss_mib).collect()).unwrap_or_default();
    let third = full.len() / 3;
    let flat = (third > 0).then(|| {
        let (first, last) = (median(&full[..third]), median(&full[full.len() - third..]));
        (first, last, last <= first * FLAT_GROWTH_RATIO + FLAT_SLACK_MIB)
    });
    target(
        "RSS flat once the table is full",
        &flat.map_or("too few samples".into(), |(f, l, _)| format!("{f:.1} → {l:.1} MiB")),
        flat.map(|(_, _, ok)| ok),
    );
    let kernel_full = sample::json_number(status, "cpu_stacks_map_full").unwrap_or(0);
    println!("  (kernel: {kernel_full} samples lost to a full stack map)");
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
