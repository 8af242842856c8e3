//! The daemon bench's table: per frequency, the daemon's CPU share, its BPF programs' CPU
//! share, peak and steady RSS and whether RSS stays flat, and the slowest dump; then the
//! targets. Pure (samples in, text out), so it is unit-tested without root.

use std::time::Duration;

use crate::bench::all::{Bar, Headline, Unit};
use crate::bench::report::target;

/// The continuous-profiling budget, at the default 19 Hz.
const MAX_CPU_PERCENT_AT_19_HZ: f64 = 1.0;
/// Peak RSS with the default few hundred processes, and with thousands (issue #18's 2,000).
const MAX_RSS_MIB: f64 = 64.0;
const MAX_RSS_MIB_THOUSANDS: f64 = 96.0;
const THOUSANDS: usize = 1000;
/// RSS is flat when the last third's median is within this of the first third's...
const FLAT_GROWTH_RATIO: f64 = 1.05;
/// ...plus this much, so allocator noise on a small heap is not read as a leak.
const FLAT_SLACK_MIB: f64 = 1.0;
const MAX_DUMP_MS: u64 = 1000;

/// One measurement of the running daemon.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Since the daemon answered its first /status (after loading its programs).
    pub at: Duration,
    /// The daemon's user + system CPU time so far.
    pub cpu: Duration,
    /// Run time of its BPF programs so far (charged to the sampled tasks, not to it).
    pub bpf: Duration,
    pub rss_kib: u64,
    /// How long the last interval's dump took, from /status.
    pub last_dump_ms: u64,
    /// Of that dump: the CPU time of the thread that wrote it, and the wall time spent in
    /// writing files (temporary files, syncfs, renames), from /status.
    pub last_dump_cpu_ms: u64,
    pub last_dump_write_ms: u64,
    /// Distinct stacks the daemon holds, and processes it tracks, from /status.
    pub stacks: u64,
    pub processes: u64,
    /// Unwind-table memory in use (bytes of kernel row memory) and tables loaded, from
    /// /status.
    pub unwind_table_bytes: u64,
    pub unwind_tables: u64,
}

/// One daemon run at one frequency.
pub struct Run {
    pub frequency_hz: u32,
    pub samples: Vec<Sample>,
    pub files_written: u64,
}

/// What the table shows of a run.
#[derive(Debug, PartialEq)]
struct Summary {
    cpu_percent: f64,
    bpf_percent: f64,
    peak_rss_mib: f64,
    /// Medians of the first and the last third of the RSS samples.
    first_rss_mib: f64,
    steady_rss_mib: f64,
    /// `None` with fewer than three samples.
    flat: Option<bool>,
    max_dump_ms: u64,
    /// The typical dump; the first one (cold symbol caches) is usually the slowest.
    median_dump_ms: f64,
    /// The most CPU one dump used: what the dump costs, whatever the wait for a core.
    max_dump_cpu_ms: u64,
}

impl Summary {
    fn of(samples: &[Sample]) -> Option<Summary> {
        let (first, last) = (samples.first()?, samples.last()?);
        let wall = last.at.checked_sub(first.at)?.as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        let percent = |a: Duration, b: Duration| 100.0 * b.saturating_sub(a).as_secs_f64() / wall;
        // The samples before the first dump show 0 ms.
        let dumps: Vec<f64> = samples.iter().filter(|s| s.last_dump_ms > 0).map(|s| s.last_dump_ms as f64).collect();
        let rss: Vec<f64> = samples.iter().map(|s| s.rss_kib as f64 / 1024.0).collect();
        let third = rss.len() / 3;
        let (first_rss, steady) = if third == 0 {
            (rss[0], rss[rss.len() - 1])
        } else {
            (median(&rss[..third]), median(&rss[rss.len() - third..]))
        };
        Some(Summary {
            cpu_percent: percent(first.cpu, last.cpu),
            bpf_percent: percent(first.bpf, last.bpf),
            peak_rss_mib: rss.iter().copied().fold(0.0, f64::max),
            first_rss_mib: first_rss,
            steady_rss_mib: steady,
            flat: (third > 0).then_some(steady <= first_rss * FLAT_GROWTH_RATIO + FLAT_SLACK_MIB),
            max_dump_ms: samples.iter().map(|s| s.last_dump_ms).max().unwrap_or(0),
            median_dump_ms: median(&dumps),
            max_dump_cpu_ms: samples.iter().map(|s| s.last_dump_cpu_ms).max().unwrap_or(0),
        })
    }
}

/// The median; 0 for no values.
fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    }
}

fn max_rss_mib(processes: usize) -> f64 {
    if processes >= THOUSANDS {
        MAX_RSS_MIB_THOUSANDS
    } else {
        MAX_RSS_MIB
    }
}

/// Prints the table and, per frequency, one PASS/MISS line per target.
pub fn print(runs: &[Run], processes: usize, threads: usize) {
    let max_rss_mib = max_rss_mib(processes);
    println!();
    println!("{processes} processes (idle ones with {threads} threads), one dump every 10 s");
    println!(
        "{:>9} {:>9} {:>9} {:>9} {:>17} {:>6} {:>9} {:>11} {:>13} {:>7}",
        "frequency",
        "cpu %",
        "bpf %",
        "peak RSS",
        "RSS first→last",
        "flat",
        "max dump",
        "median dump",
        "max dump cpu",
        "files"
    );
    let summaries: Vec<Option<Summary>> = runs.iter().map(|r| Summary::of(&r.samples)).collect();
    for (run, summary) in runs.iter().zip(&summaries) {
        let Some(s) = summary else {
            println!("{:>6} Hz  too few samples", run.frequency_hz);
            continue;
        };
        println!(
            "{:>6} Hz {:>9.3} {:>9.3} {:>5.1} MiB {:>7.1}→{:<5.1} MiB {:>6} {:>6} ms {:>8.0} ms {:>10} ms {:>7}",
            run.frequency_hz,
            s.cpu_percent,
            s.bpf_percent,
            s.peak_rss_mib,
            s.first_rss_mib,
            s.steady_rss_mib,
            s.flat.map_or("n/a", |f| if f { "yes" } else { "NO" }),
            s.max_dump_ms,
            s.median_dump_ms,
            s.max_dump_cpu_ms,
            run.files_written,
        );
    }
    println!("(cpu % and bpf % are of one core; bpf % is the programs' run time in the sampled tasks)");
    for run in runs {
        if let Some(last) = run.samples.last() {
            println!(
                "{:>6} Hz: unwind tables for {} processes: {:.1} MiB of kernel memory in {} tables (peak over the run {:.1} MiB)",
                run.frequency_hz,
                last.processes,
                last.unwind_table_bytes as f64 / (1 << 20) as f64,
                last.unwind_tables,
                run.samples.iter().map(|s| s.unwind_table_bytes).max().unwrap_or(0) as f64 / (1 << 20) as f64,
            );
        }
    }
    println!("targets:");
    for (run, summary) in runs.iter().zip(&summaries) {
        let Some(s) = summary else { continue };
        let hz = run.frequency_hz;
        if hz == 19 {
            target(
                &format!("19 Hz, {processes} processes: cpu <= {MAX_CPU_PERCENT_AT_19_HZ}% of a core"),
                &format!("{:.3}%", s.cpu_percent),
                Some(s.cpu_percent <= MAX_CPU_PERCENT_AT_19_HZ),
            );
        }
        target(
            &format!("{hz} Hz, {processes} processes: peak RSS <= {max_rss_mib} MiB"),
            &format!("{:.1} MiB", s.peak_rss_mib),
            Some(s.peak_rss_mib <= max_rss_mib),
        );
        target(&format!("{hz} Hz: RSS flat"), &format!("{:+.1} MiB", s.steady_rss_mib - s.first_rss_mib), s.flat);
        target(
            &format!("{hz} Hz: dump < {MAX_DUMP_MS} ms"),
            &format!("{} ms", s.max_dump_ms),
            Some(s.max_dump_ms < MAX_DUMP_MS),
        );
    }
}

/// The targets as `bench all --quick` rows: at 19 Hz, the CPU share; at each frequency, the
/// peak RSS. Flatness and dump time are left to the full bench: a minute shows neither.
pub fn headlines(runs: &[Run], processes: usize) -> Vec<Headline> {
    let mut rows = Vec::new();
    for run in runs {
        let summary = Summary::of(&run.samples);
        let hz = run.frequency_hz;
        if hz == 19 {
            let figure = format!("19 Hz, {processes} processes: daemon CPU");
            let cpu = summary.as_ref().map(|s| s.cpu_percent);
            rows.push(Headline::new("daemon", &figure, cpu, Bar::AtMost(MAX_CPU_PERCENT_AT_19_HZ), Unit::CoreShare));
        }
        let figure = format!("{hz} Hz, {processes} processes: daemon peak RSS");
        let rss = summary.as_ref().map(|s| s.peak_rss_mib);
        rows.push(
            Headline::new("daemon", &figure, rss, Bar::AtMost(max_rss_mib(processes)), Unit::Mib)
                .missing_because("too few samples"),
        );
    }
    rows
}

/// The cost of 1,000 more processes, per frequency, between the first and the last table
/// (nothing with one table).
pub fn print_slope(tables: &[(usize, Vec<Run>)]) {
    let (Some((low, low_runs)), Some((high, high_runs))) = (tables.first(), tables.last()) else { return };
    if high <= low {
        return;
    }
    println!();
    println!("slope from {low} to {high} processes, per 1,000 more:");
    for low_run in low_runs {
        let Some(high_run) = high_runs.iter().find(|r| r.frequency_hz == low_run.frequency_hz) else { continue };
        let (Some(a), Some(b)) = (Summary::of(&low_run.samples), Summary::of(&high_run.samples)) else { continue };
        let per = |x: f64, y: f64| slope(x, y, *low, *high);
        println!(
            "{:>6} Hz: cpu {:+.3} % of a core, bpf {:+.3} %, peak RSS {:+.1} MiB, max dump {:+.0} ms",
            low_run.frequency_hz,
            per(a.cpu_percent, b.cpu_percent),
            per(a.bpf_percent, b.bpf_percent),
            per(a.peak_rss_mib, b.peak_rss_mib),
            per(a.max_dump_ms as f64, b.max_dump_ms as f64),
        );
    }
}

/// Change from `a` at `low` processes to `b` at `high`, per 1,000 processes.
fn slope(a: f64, b: f64, low: usize, high: usize) -> f64 {
    (b - a) * THOUSANDS as f64 / (high - low) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_s: u64, cpu_ms: u64, rss_mib: u64, dump_ms: u64) -> Sample {
        Sample {
            at: Duration::from_secs(at_s),
            cpu: Duration::from_millis(cpu_ms),
            bpf: Duration::from_millis(cpu_ms / 10),
            rss_kib: rss_mib * 1024,
            last_dump_ms: dump_ms,
            last_dump_cpu_ms: dump_ms / 2,
            last_dump_write_ms: dump_ms / 4,
            stacks: 0,
            processes: 0,
            unwind_table_bytes: 0,
            unwind_tables: 0,
        }
    }

    #[test]
    fn shares_are_of_the_measured_span() {
        // 600 ms of CPU over 60 s is 1% of a core.
        let samples: Vec<Sample> = (0..=12).map(|i| sample(i * 5, i * 50, 30, i)).collect();
        let s = Summary::of(&samples).unwrap();
        assert!((s.cpu_percent - 1.0).abs() < 1e-9, "{s:?}");
        assert!((s.bpf_percent - 0.1).abs() < 1e-9, "{s:?}");
        assert_eq!(s.max_dump_ms, 12);
        assert_eq!(s.median_dump_ms, 6.5);
        assert_eq!(s.max_dump_cpu_ms, 6);
        assert_eq!(s.flat, Some(true));
    }

    #[test]
    fn growing_rss_is_not_flat() {
        let samples: Vec<Sample> = (0..9).map(|i| sample(i * 5, 0, 30 + 2 * i, 0)).collect();
        let s = Summary::of(&samples).unwrap();
        assert_eq!((s.first_rss_mib, s.steady_rss_mib, s.peak_rss_mib), (32.0, 44.0, 46.0));
        assert_eq!(s.flat, Some(false));
    }

    #[test]
    fn slope_is_per_thousand_processes() {
        assert!((slope(0.5, 2.3, 200, 2000) - 1.0).abs() < 1e-9);
        assert_eq!(max_rss_mib(200), MAX_RSS_MIB);
        assert_eq!(max_rss_mib(2000), MAX_RSS_MIB_THOUSANDS);
    }

    #[test]
    fn too_few_samples() {
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[sample(0, 0, 1, 0)]).is_none());
        let s = Summary::of(&[sample(0, 0, 1, 0), sample(5, 0, 1, 0)]).unwrap();
        assert_eq!(s.flat, None);
    }
}
