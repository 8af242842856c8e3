//! `cargo xtask bench offcpu`: what the off-CPU profile costs a program that does nothing
//! but switch, in ns per handoff of two threads passing one byte back and forth over two
//! pipes (each handoff a sleep in `read` and a context switch), in configurations measured in
//! one invocation: (a) no profiler; (b) the floor, empty programs on the profiler's two BTF
//! tracepoints (`sched_switch` and `sched_exit_tp`), loaded and attached by the profiler
//! itself in place of its real ones (`PROFILER_BENCH_OFFCPU_EMPTY`); (c) the profiler on that
//! process at its default sampling (by length, rate 1ms: a handoff's interval of a few µs is
//! walked about 1 in 300 times); (d) the profiler with nothing sampled in practice (rate
//! 10s: the per-switch cost of the programs alone, two timestamps and a slot); (e) the
//! profiler recording every switch (rate 1ns, and 1 in 1 on kernels without
//! `sched_exit_tp`); (f) bpftrace with an empty program on `sched:sched_switch`,
//! reported beside the floor: bpftrace 0.17 has no raw or BTF tracepoints, so it attaches to
//! the perf tracepoint and cannot reach `sched_exit_tp` (the floor before (b) existed).
//!
//! The floor's process is the profiler's, idle but for its usual userspace (drains, side
//! band), as bpftrace's process is bpftrace's.
//!
//! The program speaks the heap bench's protocol and reuses its runner; configurations run in
//! interleaved, rotated passes, judged on the median round. `--pin-cpu N` (default 1) puts
//! both threads on CPU N, so every handoff is the same context switch.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Result};

use super::all::{Bar, Headline, Unit};
use super::heap::program::MallocBench;
use super::heap::report::Measured;
use super::heap::tracer::Tracer;
use super::{bail_if_interrupted, fresh_dir, report::target, workload};
use crate::workspace;

#[derive(clap::Args, Debug)]
pub struct OffCpuArgs {
    /// Handoffs per configuration, spread over the passes.
    #[arg(long, default_value_t = 300_000)]
    iterations: u64,
    /// Passes over the configurations (interleaved, rotated).
    #[arg(long, default_value_t = 3)]
    rounds: u64,
    /// Pin both threads to this CPU.
    #[arg(long, default_value_t = 1)]
    pin_cpu: u32,
}

const ROUNDS: u32 = 5;
const SETTLE: Duration = Duration::from_secs(3);
const QUIESCE: Duration = Duration::from_secs(1);
const PROFILER_ATTACHED: &str = "attached; capturing";
/// The issue's target at the default sampling: at most this much over the floor.
const MAX_OURS_VS_FLOOR: f64 = 1.10;

/// Two threads pass a byte over two pipes PAIRS / ROUNDS times per round; main times each
/// round and prints the wall time per handoff (see `workload::two_player_rounds_c`).
const OFFCPU_PLAYERS_C: &str = include_str!("../../programs/offcpu_players.inc.c");

#[derive(Clone, Copy)]
enum Probe {
    None,
    Bpftrace,
    /// The profiler on the measured process, with these sampling flags (none: the defaults).
    Profiler(&'static [&'static str]),
    /// The profiler with empty programs on its tracepoints.
    EmptyPrograms,
}

const CONFIGS: [(&str, Probe); 6] = [
    ("(a) no profiler", Probe::None),
    ("(b) floor (empty programs, both tracepoints)", Probe::EmptyPrograms),
    ("(c) profiler --pid, rate 1ms (default)", Probe::Profiler(&[])),
    ("(d) profiler --pid, rate 10s", Probe::Profiler(&["--offcpu-rate", "10s", "--offcpu-every", "1000000"])),
    ("(e) profiler --pid, every switch", Probe::Profiler(&["--offcpu-rate", "1ns", "--offcpu-every", "1"])),
    ("(f) bpftrace, empty sched_switch", Probe::Bpftrace),
];

pub fn run(args: &OffCpuArgs) -> Result<()> {
    crate::setup::prepare_bench()?;
    measure(args).map(|_| ())
}

/// `bench all --quick`: one pass of 100,000 handoffs per configuration on CPU 1, and the
/// default sampling against the floor.
pub fn quick() -> Result<Vec<Headline>> {
    let runs = measure(&OffCpuArgs { iterations: 100_000, rounds: 1, pin_cpu: 1 })?;
    let ratio = runs[2].median() / runs[1].median();
    Ok(vec![Headline::new(
        "offcpu",
        "default sampling (1 ms) / floor (median)",
        Some(ratio),
        Bar::AtMost(MAX_OURS_VS_FLOOR),
        Unit::Ratio,
    )])
}

/// Every configuration in `--rounds` interleaved passes; prints the table and returns the
/// runs, in [`CONFIGS`] order.
fn measure(args: &OffCpuArgs) -> Result<Vec<Measured>> {
    // Read by the program's threads; set while this process has one thread.
    std::env::set_var("OFFCPU_BENCH_CPU", args.pin_cpu.to_string());
    let dir = workspace::target_dir().join("xtask-bench");
    std::fs::create_dir_all(&dir)?;
    let bin = crate::bench::cc::compile_text(
        &dir,
        "offcpu_bench",
        &workload::two_player_rounds_c(OFFCPU_PLAYERS_C, "pipe(ping) == 0 && pipe(pong) == 0", r#""done\n""#),
        &["-O1", "-pthread"],
    )?;
    let out = fresh_dir(&dir.join("offcpu-out"))?;
    let passes = args.rounds.max(1);
    let pairs = (args.iterations / passes).max(u64::from(ROUNDS) * 4);
    workload::catch_interrupt();
    let _stats = workload::BpfStats::enable();
    let mut measured: Vec<Measured> = CONFIGS.iter().map(|&(name, _)| Measured::new(name)).collect();
    for pass in 0..passes {
        workspace::stage(&format!("pass {}/{passes}: {pairs} handoffs per configuration", pass + 1));
        for k in 0..CONFIGS.len() {
            let i = (pass as usize + k) % CONFIGS.len();
            let (rounds, stderr) = run_once(&bin, &out, pairs, CONFIGS[i].1)?;
            bail_if_interrupted()?;
            println!(
                "    {:<44} {:>10.1} ns/handoff (median round)",
                CONFIGS[i].0,
                super::heap::report::median(&rounds)
            );
            measured[i].add(rounds, stderr);
        }
    }
    print(&measured, pairs * passes);
    println!("(profiles kept in {})", out.display());
    Ok(measured)
}

fn run_once(bin: &Path, out: &Path, pairs: u64, probe: Probe) -> Result<(Vec<f64>, String)> {
    let program = MallocBench::start(bin, pairs, ROUNDS)?;
    let pid = program.pid();
    let tracer = match probe {
        Probe::None => {
            std::thread::sleep(SETTLE);
            return Ok((program.run()?, String::new()));
        }
        Probe::Bpftrace => {
            let mut cmd = Command::new("bpftrace");
            cmd.args(["-e", "tracepoint:sched:sched_switch {}"]);
            Tracer::start("bpftrace", cmd, "Attaching")?
        }
        Probe::Profiler(sampling) => Tracer::start("profiler", profiler_cmd(out, pid, sampling), PROFILER_ATTACHED)?,
        Probe::EmptyPrograms => {
            let mut cmd = profiler_cmd(out, pid, &[]);
            cmd.env("PROFILER_BENCH_OFFCPU_EMPTY", "1");
            Tracer::start("profiler (empty programs)", cmd, PROFILER_ATTACHED)?
        }
    };
    std::thread::sleep(SETTLE);
    let rounds = program.run()?;
    let stopped = tracer.stop()?;
    std::thread::sleep(QUIESCE);
    if !stopped.status.success() {
        bail!("the tracer failed ({}); its stderr:\n{}", stopped.status, stopped.stderr);
    }
    Ok((rounds, stopped.stderr))
}

/// `profiler snapshot` of the off-CPU profile with `sampling` flags (none: the defaults).
fn profiler_cmd(out: &Path, pid: u32, sampling: &[&str]) -> Command {
    let mut cmd = Command::new(workspace::profiler_bin());
    cmd.env("RUST_LOG", "info").args(["snapshot", "--profiles", "offcpu", "--pid", &pid.to_string()]);
    cmd.args(sampling).args(["--duration", "3600s", "--bpf-stats", "--output"]);
    cmd.arg(out.join(if sampling.is_empty() { "default".to_string() } else { sampling.join("_") }));
    cmd
}

/// `pairs`: handoffs each configuration ran in all.
fn print(runs: &[Measured], pairs: u64) {
    let (none, floor) = (&runs[0], &runs[1]);
    println!();
    println!("{:<44} {:>9} {:>13} {:>9} {:>9}", "ns per handoff", "median", "x no profiler", "x floor", "fastest");
    for run in runs {
        println!(
            "{:<44} {:>9.1} {:>12.3}x {:>8.3}x {:>9.1}",
            run.name,
            run.median(),
            run.median() / none.median(),
            run.median() / floor.median(),
            run.fastest()
        );
    }
    for run in &runs[1..5] {
        for program in ["offcpu_switch", "offcpu_switch_in", "offcpu_empty_switch", "offcpu_empty_switch_in"] {
            let stats = run.stderrs.iter().filter_map(|s| super::report::bpf_stats_of(s, program));
            let (count, ns) = stats.fold((0u64, 0u64), |(c, t), (c2, t2)| (c + c2, t + t2));
            if count > 0 {
                println!(
                    "bpf program, {}: {program} {count} runs ({:.2} per handoff, machine-wide) {:.0} ns/run",
                    run.name,
                    count as f64 / pairs.max(1) as f64,
                    ns as f64 / count as f64
                );
            }
        }
    }
    let ratio = runs[2].median() / floor.median();
    target(
        &format!("(c) default sampling / floor <= {MAX_OURS_VS_FLOOR} (median)"),
        &format!("{ratio:.3}x"),
        Some(ratio <= MAX_OURS_VS_FLOOR),
    );
    println!("reported: every switch / floor {:.3}x (median)", runs[4].median() / floor.median());
    println!("reported: bpftrace's empty sched_switch / floor {:.3}x (median)", runs[5].median() / floor.median());
}
