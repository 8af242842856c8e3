//! `cargo xtask bench cpu`: what continuous CPU profiling costs, next to the tools doing the
//! same job under the same load, in interleaved rounds judged on their medians (#51):
//! - `profiler snapshot` at N Hz for S seconds: its CPU time and peak RSS (`wait4`), and its
//!   BPF ns per sample (kernel `bpf_stats` of `cpu_sample`);
//! - `perf record -e cpu-clock -F N -a -g` for the same S seconds: its CPU time;
//! - bpftrace's `profile:hz:N { @[kstack, ustack] = count(); }` for S seconds: its BPF ns per
//!   run, the per-sample peer (another eBPF tool walking the same stacks);
//!
//! and, once, the machine's floor: an empty bpftrace profile program and one doing a single
//! map update. Each round runs the three in a rotated order, so a load that drifts over the
//! bench does not always fall on the same tool; the targets are ratios taken per round.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use super::{
    all::{Bar, Headline, Unit},
    bail_if_interrupted, fresh_dir, measure,
    measure::Run,
    peer,
    report::{bpf_stats, target},
    unwind::median,
    workload,
};
use crate::workspace;

/// Busy processes on top of the machine's own, enough to keep 2-4 CPUs sampled on-CPU.
const SPINNERS: usize = 4;

/// The snapshot's peak RSS the profiler is held to (#51): whatever else the machine runs.
const MAX_RSS_MIB: f64 = 48.0;

#[derive(clap::Args, Debug)]
pub struct CpuArgs {
    /// Length of each tool's run, in seconds.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Sampling frequency of every tool.
    #[arg(long = "frequency", default_value_t = 99)]
    frequency_hz: u32,
    /// Interleaved rounds; the targets are judged on the medians of the rounds' ratios.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
}

/// One round's figures.
struct Round {
    profiler: Run,
    perf: Run,
    /// The profiler's BPF ns per sample, and its sample count.
    ns: Option<(f64, u64)>,
    /// bpftrace's BPF ns per run of the same job.
    bpftrace_ns: Option<f64>,
}

impl Round {
    fn cpu_ratio(&self) -> f64 {
        self.profiler.cpu.as_secs_f64() / self.perf.cpu.as_secs_f64()
    }

    fn ns_ratio(&self) -> Option<f64> {
        Some(self.ns?.0 / self.bpftrace_ns?)
    }

    fn rss_mib(&self) -> f64 {
        self.profiler.max_rss_kib as f64 / 1024.0
    }
}

pub fn run(args: &CpuArgs) -> Result<()> {
    crate::setup::prepare_bench()?;
    medians(args).map(|_| ())
}

/// `bench all --quick`: one round of 10 s at 99 Hz, its three targets.
pub fn quick() -> Result<Vec<Headline>> {
    let medians = medians(&CpuArgs { seconds: 10, frequency_hz: 99, rounds: 1 })?;
    Ok(vec![
        Headline::new("cpu", "BPF ns/sample / bpftrace's", medians.ns, Bar::Below(1.0), Unit::Ratio)
            .missing_because("bpftrace or bpf_stats missing"),
        Headline::new("cpu", "snapshot CPU time / perf record's", medians.cpu, Bar::Below(1.0), Unit::Ratio),
        Headline::new("cpu", "snapshot peak RSS", medians.rss, Bar::AtMost(MAX_RSS_MIB), Unit::Mib),
    ])
}

/// The rounds, printed as they end, and their medians, printed and returned.
fn medians(args: &CpuArgs) -> Result<Medians> {
    let dir = workspace::target_dir().join("xtask-bench");
    let out = fresh_dir(&dir.join("out"))?;
    workload::catch_interrupt();
    let _spinners = workload::Spinners::start(&dir, SPINNERS)?;
    let _stats = workload::BpfStats::enable();
    let mut rounds = Vec::new();
    for index in 0..args.rounds {
        let round = measure_round(args, index, &out.join(format!("round-{}", index + 1)))?;
        print_round(index, &round);
        rounds.push(round);
    }
    let floor_secs = args.seconds.min(10);
    workspace::stage(&format!(
        "bpftrace: empty program, then one map update, {floor_secs} s each (the machine's floor)"
    ));
    let floor = peer::bpftrace_floor_ns(args.frequency_hz, floor_secs);
    bail_if_interrupted()?;
    let medians = print_summary(&rounds, floor);
    println!("(outputs kept in {})", out.display());
    Ok(medians)
}

/// The three runs of round `index`, in an order rotated by the round.
fn measure_round(args: &CpuArgs, index: u32, out: &Path) -> Result<Round> {
    let out = fresh_dir(out)?;
    let (secs, hz) = (args.seconds, args.frequency_hz);
    let (mut profiler, mut perf, mut bpftrace_ns) = (None, None, None);
    for step in 0..3 {
        match (step + index) % 3 {
            0 => {
                stage(index, args, &format!("profiler snapshot, {secs} s at {hz} Hz ({SPINNERS} spinners running)"));
                profiler = Some(measure::run(profiler_cmd(args, &out))?);
            }
            1 => {
                stage(index, args, &format!("perf record -g -a, {secs} s at {hz} Hz"));
                perf = Some(measure::run(perf_cmd(args, &out))?);
            }
            _ => {
                stage(index, args, &format!("bpftrace profile:hz:{hz} with kstack+ustack, {secs} s"));
                bpftrace_ns = peer::bpftrace_ns_per_sample(hz, secs);
            }
        }
        bail_if_interrupted()?;
    }
    let (profiler, perf) = (profiler.expect("run in the loop"), perf.expect("run in the loop"));
    let ns = bpf_stats(&profiler.stderr).filter(|&(n, _)| n > 0).map(|(n, t)| (t as f64 / n as f64, n));
    Ok(Round { profiler, perf, ns, bpftrace_ns })
}

fn stage(index: u32, args: &CpuArgs, what: &str) {
    workspace::stage(&format!("round {} of {}: {what}", index + 1, args.rounds));
}

fn profiler_cmd(args: &CpuArgs, out: &Path) -> Command {
    let mut cmd = Command::new(workspace::profiler_bin());
    cmd.args(["snapshot", "--duration", &format!("{}s", args.seconds)])
        .args(["--frequency", &args.frequency_hz.to_string(), "--bpf-stats", "--output"])
        .arg(out);
    cmd
}

/// `-e cpu-clock` is the software event the profiler samples: the same event on machines
/// with a PMU too, where perf would otherwise default to hardware cycles.
fn perf_cmd(args: &CpuArgs, out: &Path) -> Command {
    let mut cmd = Command::new("/usr/bin/perf");
    cmd.args(["record", "-e", "cpu-clock", "-F", &args.frequency_hz.to_string(), "-a", "-g", "-o"])
        .arg(out.join("perf.data"))
        .args(["--", "sleep", &args.seconds.to_string()]);
    cmd
}

fn shown(value: Option<f64>, precision: usize) -> String {
    value.map_or("n/a".into(), |v| format!("{v:.precision$}"))
}

fn print_round(index: u32, round: &Round) {
    println!(
        "round {}: CPU s profiler {:.3} perf {:.3} ({:.2}x); BPF ns/sample profiler {} ({} samples), \
         bpftrace {} ({}x); profiler peak RSS {:.1} MiB",
        index + 1,
        round.profiler.cpu.as_secs_f64(),
        round.perf.cpu.as_secs_f64(),
        round.cpu_ratio(),
        shown(round.ns.map(|(ns, _)| ns), 0),
        round.ns.map_or("no".into(), |(_, n)| n.to_string()),
        shown(round.bpftrace_ns, 0),
        shown(round.ns_ratio(), 2),
        round.rss_mib(),
    );
}

/// The medians the targets judge: CPU time and BPF ns per sample as ratios against the peers
/// run beside the profiler, and the peak RSS in MiB.
struct Medians {
    cpu: Option<f64>,
    ns: Option<f64>,
    rss: Option<f64>,
}

/// The medians and the targets, as ratios against the peers run beside the profiler.
fn print_summary(rounds: &[Round], (empty_ns, one_update_ns): (Option<f64>, Option<f64>)) -> Medians {
    let median_of = |f: &dyn Fn(&Round) -> Option<f64>| median(&mut rounds.iter().filter_map(f).collect::<Vec<_>>());
    let cpu = median_of(&|r| Some(r.cpu_ratio()));
    let ns = median_of(&|r| r.ns_ratio());
    let rss = median_of(&|r| Some(r.rss_mib()));
    let rss_max = rounds.iter().map(Round::rss_mib).fold(0.0, f64::max);
    println!("\nmedians of {} interleaved rounds:", rounds.len());
    println!(
        "  profiler CPU time / perf record's: {}; BPF ns per sample / bpftrace's: {}; peak RSS {} MiB (max {rss_max:.1})",
        shown(cpu, 2),
        shown(ns, 2),
        shown(rss, 1),
    );
    println!(
        "  floor on this machine (bpftrace ns per run): empty program {}, one map update {}; the profiler's median {}",
        shown(empty_ns, 0),
        shown(one_update_ns, 0),
        shown(median_of(&|r| r.ns.map(|(ns, _)| ns)), 0),
    );
    println!("targets:");
    target("BPF ns/sample < 1.0x bpftrace's", &format!("{}x", shown(ns, 2)), ns.map(|r| r < 1.0));
    target("CPU time < 1.0x perf record's", &format!("{}x", shown(cpu, 2)), cpu.map(|r| r < 1.0));
    target(&format!("peak RSS <= {MAX_RSS_MIB} MiB"), &shown(rss, 1), rss.map(|r| r <= MAX_RSS_MIB));
    Medians { cpu, ns, rss }
}
