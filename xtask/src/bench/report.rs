//! Turns two measured runs into the side-by-side table and the target verdicts. Pure: parses
//! the tools' stderr summaries and formats, so it is unit-tested without root.

use super::measure::Run;

/// Targets the profiler is held to.
const MAX_NS_PER_SAMPLE: f64 = 2000.0;
const MAX_RSS_MIB: f64 = 64.0;

/// One table row: a tool's run plus what its stderr told us.
pub struct Row<'a> {
    pub name: &'a str,
    pub run: &'a Run,
    pub samples: Option<u64>,
    pub ns_per_sample: Option<f64>,
}

impl<'a> Row<'a> {
    /// The profiler with `--bpf-stats` prints `bpf-stats: program=cpu_sample run_count=N run_time_ns=T`.
    pub fn profiler(run: &'a Run) -> Row<'a> {
        let stats = bpf_stats(&run.stderr);
        let ns_per_sample = stats.filter(|&(n, _)| n > 0).map(|(n, t)| t as f64 / n as f64);
        Row { name: "profiler", run, samples: stats.map(|(n, _)| n), ns_per_sample }
    }

    /// perf ends with `[ perf record: Captured and wrote X MB FILE (N samples) ]`.
    pub fn perf(run: &'a Run) -> Row<'a> {
        Row { name: "perf", run, samples: perf_samples(&run.stderr), ns_per_sample: None }
    }

    fn rss_mib(&self) -> f64 {
        self.run.max_rss_kib as f64 / 1024.0
    }

    fn print(&self) {
        let cpu = self.run.cpu.as_secs_f64();
        let share = 100.0 * cpu / self.run.wall.as_secs_f64();
        println!(
            "{:<10} {:>10.3} {:>18.2} {:>13.1} {:>14} {:>9}",
            self.name,
            cpu,
            share,
            self.rss_mib(),
            self.ns_per_sample.map_or("n/a".into(), |ns| format!("{ns:.0}")),
            self.samples.map_or("n/a".into(), |n| n.to_string()),
        );
    }
}

/// Prints the table, the CPU ratio and one PASS/MISS line per target.
pub fn print(profiler: &Row, perf: &Row) {
    println!();
    println!(
        "{:<10} {:>10} {:>18} {:>13} {:>14} {:>9}",
        "", "cpu time s", "cpu % of one core", "peak RSS MiB", "bpf ns/sample", "samples"
    );
    profiler.print();
    perf.print();
    let ratio = profiler.run.cpu.as_secs_f64() / perf.run.cpu.as_secs_f64();
    println!("\nratio profiler/perf cpu time: {ratio:.2}");
    println!("targets:");
    let ns = profiler.ns_per_sample;
    let ns_shown = ns.map_or("n/a".into(), |ns| format!("{ns:.0}"));
    target(&format!("bpf ns/sample <= {MAX_NS_PER_SAMPLE}"), &ns_shown, ns.map(|ns| ns <= MAX_NS_PER_SAMPLE));
    target("profiler cpu < perf cpu", &format!("{ratio:.2}x"), Some(ratio < 1.0));
    let rss = profiler.rss_mib();
    target(&format!("profiler RSS <= {MAX_RSS_MIB} MiB"), &format!("{rss:.1}"), Some(rss <= MAX_RSS_MIB));
}

/// One `  NAME  VALUE  PASS|MISS|n/a` line under `targets:`.
pub(in crate::bench) fn target(name: &str, value: &str, pass: Option<bool>) {
    let verdict = match pass {
        Some(true) => "PASS",
        Some(false) => "MISS",
        None => "n/a",
    };
    println!("  {name:<34} {value:>16}  {verdict}");
}

/// `(run_count, run_time_ns)` of cpu_sample.
pub(super) fn bpf_stats(stderr: &str) -> Option<(u64, u64)> {
    bpf_stats_of(stderr, "cpu_sample")
}

/// `(run_count, run_time_ns)` of `program` from the profiler's `--bpf-stats` lines
/// (`bpf-stats: program=NAME run_count=N run_time_ns=T`); tolerant of a log prefix.
pub(in crate::bench) fn bpf_stats_of(stderr: &str, program: &str) -> Option<(u64, u64)> {
    let wanted = format!("program={program}");
    let line = stderr.lines().find_map(|l| {
        let line = &l[l.find("bpf-stats: ")?..];
        line.split_whitespace().any(|kv| kv == wanted).then_some(line)
    })?;
    let field =
        |key: &str| line.split_whitespace().find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok());
    Some((field("run_count")?, field("run_time_ns")?))
}

fn perf_samples(stderr: &str) -> Option<u64> {
    let line = stderr.lines().find(|l| l.contains("perf record: Captured and wrote"))?;
    let open = line.rfind('(')?;
    line[open + 1..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bpf_stats_line() {
        let stderr = "INFO starting\nbpf-stats: program=cpu_sample run_count=5940 run_time_ns=4752000\n";
        assert_eq!(bpf_stats(stderr), Some((5940, 4752000)));
    }

    #[test]
    fn bpf_stats_absent_or_other_program() {
        assert_eq!(bpf_stats("nothing here"), None);
        assert_eq!(bpf_stats("bpf-stats: program=other run_count=1 run_time_ns=2"), None);
    }

    #[test]
    fn finds_each_programs_line() {
        let stderr = "bpf-stats: program=malloc_enter run_count=3 run_time_ns=30\n\
                      bpf-stats: program=free_enter run_count=2 run_time_ns=10\n";
        assert_eq!(bpf_stats_of(stderr, "free_enter"), Some((2, 10)));
        assert_eq!(bpf_stats_of(stderr, "malloc_enter"), Some((3, 30)));
        assert_eq!(bpf_stats_of(stderr, "malloc"), None);
    }

    #[test]
    fn parses_perf_summary() {
        let stderr = "[ perf record: Woken up 3 times to write data ]\n\
                      [ perf record: Captured and wrote 1.234 MB /tmp/perf.data (5943 samples) ]\n";
        assert_eq!(perf_samples(stderr), Some(5943));
    }
}
