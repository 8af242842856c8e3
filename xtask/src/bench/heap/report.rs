//! The heap bench's table: ns per malloc+free pair of each configuration (fastest, median and
//! slowest round), the ratios the targets are stated in, and what the profiler's BPF programs
//! cost per run. Pure (numbers in, text out),
//! so it is unit-tested without root.

use crate::bench::all::{Bar, Headline, Unit};
use crate::bench::report::{bpf_stats_of, target};

/// Every-allocation profiling may cost at most this much over bare uprobes.
const MAX_EVERY_VS_FLOOR: f64 = 1.3;
/// Sampled profiling (512 KiB) may cost at most this much over bare uprobes.
const MAX_SAMPLED_VS_FLOOR: f64 = 1.1;
/// An unselected process may be at most this much slower than with no profiler at all.
const MAX_UNSELECTED_VS_NONE: f64 = 1.02;

/// The heap programs whose `--bpf-stats` lines are shown.
const HEAP_PROGRAMS: [&str; 3] = ["malloc_enter", "free_enter", "alloc_exit"];

/// One configuration over all its runs: every round, and the tool's stderr of each run.
pub struct Measured {
    pub name: &'static str,
    /// ns per pair of each round, in the order they ran.
    pub rounds: Vec<f64>,
    pub stderrs: Vec<String>,
}

impl Measured {
    pub fn new(name: &'static str) -> Measured {
        Measured { name, rounds: Vec::new(), stderrs: Vec::new() }
    }

    /// Adds one run's rounds and stderr.
    pub fn add(&mut self, rounds: Vec<f64>, stderr: String) {
        self.rounds.extend(rounds);
        self.stderrs.push(stderr);
    }

    /// The fastest round: interference (a drain, another process, the host) only adds time,
    /// so this is the closest to the configuration's own cost. The targets use it.
    pub fn fastest(&self) -> f64 {
        self.rounds.iter().copied().fold(f64::INFINITY, f64::min)
    }

    pub fn median(&self) -> f64 {
        median(&self.rounds)
    }

    fn slowest(&self) -> f64 {
        self.rounds.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }

    /// `(run_count, run_time_ns)` of `program` summed over the runs that printed it.
    fn bpf_stats(&self, program: &str) -> Option<(u64, u64)> {
        self.stderrs
            .iter()
            .filter_map(|stderr| bpf_stats_of(stderr, program))
            .reduce(|(n1, t1), (n2, t2)| (n1 + n2, t1 + t2))
    }
}

/// The five configurations.
pub struct Runs {
    pub none: Measured,
    pub floor: Measured,
    pub every: Measured,
    pub sampled: Measured,
    pub unselected: Measured,
}

/// Prints the table, the profiler's per-program BPF cost, and one PASS/MISS line per target.
pub fn print(runs: &Runs) {
    let (none, floor) = (&runs.none, &runs.floor);
    println!();
    println!(
        "{:<38} {:>9} {:>13} {:>9} {:>9} {:>9} {:>9}",
        "ns per malloc+free pair", "fastest", "x no profiler", "x floor", "median", "x floor", "slowest"
    );
    for run in [&runs.none, &runs.floor, &runs.every, &runs.sampled, &runs.unselected] {
        println!(
            "{:<38} {:>9.1} {:>12.3}x {:>8.3}x {:>9.1} {:>8.3}x {:>9.1}",
            run.name,
            run.fastest(),
            run.fastest() / none.fastest(),
            run.fastest() / floor.fastest(),
            run.median(),
            run.median() / floor.median(),
            run.slowest()
        );
    }
    for run in [&runs.every, &runs.sampled] {
        print_bpf_stats(run, floor);
    }
    println!("targets (fastest rounds; medians in parentheses):");
    ratio_target("every allocation / floor", &runs.every, floor, MAX_EVERY_VS_FLOOR);
    ratio_target("512 KiB sampling / floor", &runs.sampled, floor, MAX_SAMPLED_VS_FLOOR);
    ratio_target("unselected / no profiler", &runs.unselected, none, MAX_UNSELECTED_VS_NONE);
}

/// The targets as `bench all --quick` rows: fastest rounds, as [`print`] judges them.
pub fn headlines(runs: &Runs) -> Vec<Headline> {
    let row = |figure: &str, run: &Measured, base: &Measured, max: f64| {
        Headline::new("heap", figure, Some(run.fastest() / base.fastest()), Bar::AtMost(max), Unit::Ratio)
    };
    vec![
        row("every allocation / uprobe floor (fastest)", &runs.every, &runs.floor, MAX_EVERY_VS_FLOOR),
        row("512 KiB sampling / uprobe floor (fastest)", &runs.sampled, &runs.floor, MAX_SAMPLED_VS_FLOOR),
        row("unselected / no profiler (fastest)", &runs.unselected, &runs.none, MAX_UNSELECTED_VS_NONE),
    ]
}

fn ratio_target(name: &str, run: &Measured, base: &Measured, max: f64) {
    let ratio = run.fastest() / base.fastest();
    let median_ratio = run.median() / base.median();
    target(&format!("{name} <= {max}"), &format!("{ratio:.3}x ({median_ratio:.3}x)"), Some(ratio <= max));
}

/// `bpf programs, NAME: malloc_enter N runs 150 ns/run; ...` when `--bpf-stats` printed,
/// then the programs' kernel-measured time per pair (one malloc_enter, alloc_exit and
/// free_enter each) against the floor: the part of the cost that host noise cannot blur.
fn print_bpf_stats(run: &Measured, floor: &Measured) {
    let stats: Vec<(&str, u64, u64)> = HEAP_PROGRAMS
        .iter()
        .filter_map(|&program| {
            let (count, time_ns) = run.bpf_stats(program)?;
            Some((program, count, time_ns))
        })
        .collect();
    if stats.is_empty() {
        return;
    }
    let parts: Vec<String> = stats
        .iter()
        .map(|&(program, count, time_ns)| {
            let per_run = time_ns as f64 / count.max(1) as f64;
            format!("{program} {count} runs {per_run:.0} ns/run")
        })
        .collect();
    println!("bpf programs, {}: {}", run.name, parts.join("; "));
    if let Some(&(_, pairs, _)) = stats.iter().find(|(p, _, _)| *p == "malloc_enter") {
        let total_ns: u64 = stats.iter().map(|&(_, _, t)| t).sum();
        let per_pair = total_ns as f64 / pairs.max(1) as f64;
        println!(
            "  = {per_pair:.0} ns of BPF run time per pair, {:.3}x the floor's fastest round",
            per_pair / floor.fastest()
        );
    }
}

/// The median of `values`; NaN if there are none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpf_stats_add_up_over_runs() {
        let mut run = Measured::new("x");
        run.add(vec![1.0], "bpf-stats: program=free_enter run_count=2 run_time_ns=10\n".into());
        run.add(vec![2.0], "bpf-stats: program=free_enter run_count=3 run_time_ns=20\n".into());
        run.add(vec![3.0], String::new());
        assert_eq!(run.bpf_stats("free_enter"), Some((5, 30)));
        assert_eq!(run.bpf_stats("alloc_exit"), None);
        assert_eq!((run.fastest(), run.median(), run.slowest()), (1.0, 2.0, 3.0));
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
