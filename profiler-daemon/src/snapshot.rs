//! `profiler snapshot`: attach, capture for a fixed time (draining every second so short-lived
//! processes are inspected while alive), then symbolize, encode and write one CPU profile per
//! process, and print a summary.

use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant, SystemTime},
};

use crate::{
    aggregate::CpuAggregate,
    cli::SnapshotArgs,
    ebpf::{CpuCounters, CpuSampler, CpuSamplerConfig},
    error::Result,
    output, pprof, preflight,
    resolve::{self, ResolvedProfile},
    symbolize::Symbolizer,
};

/// How often the maps are drained during a capture.
const DRAIN_INTERVAL: Duration = Duration::from_secs(1);

/// One written profile, for the summary.
#[derive(Debug, Clone)]
pub struct Written {
    pub pid: u32,
    pub name: String,
    pub samples: u64,
    pub hottest: String,
    pub path: PathBuf,
}

/// The outcome of a snapshot.
#[derive(Debug)]
pub struct Report {
    pub written: Vec<Written>,
    pub counters: CpuCounters,
    pub interrupted: bool,
}

/// Runs a snapshot and prints its summary to stdout.
pub fn run(args: &SnapshotArgs) -> Result<Report> {
    preflight::check_privileges()?;
    preflight::check_pids(&args.pids)?;
    output::ensure_writable_dir(&args.output)?;

    let config = CpuSamplerConfig { frequency_hz: args.frequency_hz, pids: args.pids.clone() };
    let mut sampler = CpuSampler::start(&config, args.bpf_stats)?;
    tracing::info!(frequency_hz = args.frequency_hz, pids = ?args.pids, "attached; capturing");
    let start = SystemTime::now();
    let (agg, interrupted) = capture(&mut sampler, args.duration)?;
    let duration = start.elapsed().unwrap_or(args.duration);
    let counters = sampler.counters()?;
    if args.bpf_stats {
        print_bpf_stats(&sampler)?;
    }
    drop(sampler);

    let meta = pprof::CpuProfileMeta {
        frequency_hz: args.frequency_hz,
        start,
        duration,
        comments: drop_comments(&counters, &agg),
    };
    let written = write_profiles(&agg, &meta, &args.output)?;
    print_summary(&written, &counters, &args.output);
    Ok(Report { written, counters, interrupted })
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Drains every [`DRAIN_INTERVAL`] until `duration` has passed or Ctrl-C is pressed (which
/// ends the capture early and still writes what was captured).
fn capture(sampler: &mut CpuSampler, duration: Duration) -> Result<(CpuAggregate, bool)> {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    let progress = std::io::stderr().is_terminal();
    let deadline = Instant::now() + duration;
    let mut agg = CpuAggregate::default();
    loop {
        let now = Instant::now();
        let interrupted = INTERRUPTED.load(Ordering::Relaxed);
        if now >= deadline || interrupted {
            agg.add(sampler.drain()?);
            if progress {
                eprint!("\r\x1b[K");
            }
            return Ok((agg, interrupted));
        }
        if progress {
            let left = deadline - now;
            let samples = sampler.counters()?.samples;
            eprint!("\r\x1b[Kcapturing: {:>4.1}s left, {samples} samples", left.as_secs_f64());
            let _ = std::io::stderr().flush();
        }
        sleep_until(deadline.min(now + DRAIN_INTERVAL));
        agg.add(sampler.drain()?);
    }
}

/// Sleeps in short steps so Ctrl-C is noticed promptly.
fn sleep_until(when: Instant) {
    while !INTERRUPTED.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= when {
            return;
        }
        std::thread::sleep((when - now).min(Duration::from_millis(100)));
    }
}

fn print_bpf_stats(sampler: &CpuSampler) -> Result<()> {
    let stats = sampler.program_stats()?;
    eprintln!(
        "bpf-stats: program=cpu_sample run_count={} run_time_ns={}",
        stats.run_count,
        stats.run_time.as_nanos()
    );
    Ok(())
}

/// Profile comment lines that say what was lost, machine-wide and for the process.
fn drop_comments(c: &CpuCounters, agg: &CpuAggregate) -> Vec<String> {
    vec![
        format!("profiler {} cpu profile (on-CPU samples of the CPU clock)", env!("CARGO_PKG_VERSION")),
        format!(
            "dropped samples (whole machine): counts map full {}; stacks without frames: stack map full {}, \
             user stack unreadable {}, kernel stack unreadable {}, stack missing at drain {}; \
             user stacks cut at {} frames {}",
            c.counts_map_full,
            c.stacks_map_full,
            c.user_stack_failed,
            c.kernel_stack_failed,
            agg.missing_stacks,
            profiler_common::MAX_STACK_DEPTH,
            c.user_stack_truncated
        ),
    ]
}

fn write_profiles(agg: &CpuAggregate, meta: &pprof::CpuProfileMeta, dir: &std::path::Path) -> Result<Vec<Written>> {
    let mut sym = Symbolizer::new();
    let mut written = Vec::new();
    for process in agg.processes() {
        let resolved = resolve::resolve(process, agg, &mut sym);
        let mut meta = meta.clone();
        if process.info.is_none() {
            meta.comments.push("process exited before its mappings could be read: user frames unsymbolized".into());
        }
        let profile = pprof::cpu_profile(&resolved, &meta);
        let path = dir.join(output::process_dir_name(&process.name, process.pid)).join("cpu.pb.gz");
        output::write_atomic(&path, &pprof::encode_gzip(&profile))?;
        written.push(Written {
            pid: process.pid,
            name: process.name.clone(),
            samples: process.total,
            hottest: hottest_function(&resolved),
            path,
        });
    }
    written.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.pid.cmp(&b.pid)));
    Ok(written)
}

/// The function with the most self samples (the leaf frame's innermost function).
fn hottest_function(resolved: &ResolvedProfile) -> String {
    let mut flat = std::collections::HashMap::<String, u64>::new();
    for sample in &resolved.samples {
        let Some(&leaf) = sample.locations.first() else { continue };
        let loc = &resolved.locations[leaf];
        let name = loc.frames.first().map_or_else(|| format!("{:#x}", loc.address), |f| f.function.clone());
        *flat.entry(name).or_default() += sample.count;
    }
    flat.into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
        .map_or_else(|| "-".into(), |(name, _)| name)
}

/// Rows shown before "... and N more".
const SUMMARY_ROWS: usize = 25;

fn print_summary(written: &[Written], counters: &CpuCounters, dir: &std::path::Path) {
    println!("{:<24} {:>8} {:>9}  hottest function", "process", "pid", "samples");
    for w in written.iter().take(SUMMARY_ROWS) {
        let hottest: String = w.hottest.chars().take(60).collect();
        println!("{:<24} {:>8} {:>9}  {}", truncate(&w.name, 24), w.pid, w.samples, hottest);
    }
    if written.len() > SUMMARY_ROWS {
        println!("... and {} more processes", written.len() - SUMMARY_ROWS);
    }
    let lost = counters.counts_map_full;
    println!(
        "wrote {} cpu profiles to {} ({} samples, {} lost to a full map)",
        written.len(),
        dir.display(),
        counters.samples,
        lost
    );
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
