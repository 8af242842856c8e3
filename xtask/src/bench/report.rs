//! What the benches share to report: the target verdict lines and the profiler's
//! `--bpf-stats` lines read back. Pure, so it is unit-tested without root.

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
}
