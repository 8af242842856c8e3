//! `cargo xtask bench futex`: what the block, mutex and threadcreate profiles cost a program
//! whose threads wait on each other all the time, in ns per handoff of two threads passing a
//! turn under a pthread mutex and condition variable, in four configurations measured in one invocation: (a) no profiler;
//! (b) the floor, bpftrace with empty programs on the same tracepoints (futex enter/exit,
//! the futex2 ones, task_newtask); (c) the profiler on that process (`--pid`); (d) the
//! profiler system-wide.
//!
//! The program speaks the heap bench's protocol (`ready`, a line on stdin, `round NS`…,
//! `done`), so it reuses its runner; configurations run in interleaved, rotated passes and
//! are judged on their fastest round, as there. Unpinned, rounds differ by whether the two
//! threads happened to share a CPU; `--pin-cpu N` makes every handoff the same context switch
//! on CPU N, and then ours − floor per handoff equals the programs' run time per handoff
//! (bpf stats line) to within a few percent.

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
pub struct FutexArgs {
    /// Handoffs per configuration, spread over the passes.
    #[arg(long, default_value_t = 300_000)]
    iterations: u64,
    /// Pin both threads to this CPU. Unpinned, a round's time depends on whether the two
    /// threads share a CPU (a context switch per handoff) or not (a cross-CPU wakeup), which
    /// varies between rounds more than the probes cost; pinned, every handoff is the same
    /// context switch, and the ratios show the probes' cost against the cheapest handoff.
    #[arg(long)]
    pin_cpu: Option<u32>,
    /// Sampling flags passed to the profiler, e.g. `--block-rate 1ns --mutex-fraction 1`
    /// (default: its defaults).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    sampling: String,
}

const PASSES: u64 = 3;
const ROUNDS: u32 = 5;
/// After a tool is attached, before the program is released (see the heap bench).
const SETTLE: Duration = Duration::from_secs(3);
const QUIESCE: Duration = Duration::from_secs(1);
const PROFILER_ATTACHED: &str = "attached; capturing";
/// The issue's target at the default sampling (block rate 1ms, mutex fraction 1): ours at
/// most this much over the floor, median rounds.
const MAX_OURS_VS_FLOOR: f64 = 1.10;

/// Two threads pass a turn back and forth PAIRS / ROUNDS times per round, each handoff a
/// pthread_mutex_lock, a pthread_cond_wait until it is their turn, a pthread_cond_signal and
/// an unlock; main times each round and prints the wall time per handoff. Every handoff
/// sleeps in FUTEX_WAIT and is woken by FUTEX_WAKE whatever the machine's load (plain
/// lock+unlock loops hardly contend: a thread keeps the lock for its whole time slice), and
/// the mutex is contended whenever both threads run. The BPF stats line shows the futex
/// calls per handoff (see `workload::two_player_rounds_c`).
const FUTEX_PLAYERS_C: &str = include_str!("../../programs/futex_players.inc.c");

#[derive(Clone, Copy)]
enum Probe {
    None,
    Bpftrace,
    /// The profiler, on the measured process only (true) or system-wide (false).
    Profiler(bool),
}

const CONFIGS: [(&str, Probe); 4] = [
    ("(a) no profiler", Probe::None),
    ("(b) floor (bpftrace, empty programs)", Probe::Bpftrace),
    ("(c) profiler --pid", Probe::Profiler(true)),
    ("(d) profiler, system-wide", Probe::Profiler(false)),
];

/// The tracepoints the profiler attaches for block, mutex and threadcreate (futex2 ones only
/// where the kernel has them, as the profiler does).
const TRACEPOINTS: [&str; 10] = [
    "syscalls:sys_enter_futex",
    "syscalls:sys_exit_futex",
    "syscalls:sys_enter_futex_wait",
    "syscalls:sys_exit_futex_wait",
    "syscalls:sys_enter_futex_waitv",
    "syscalls:sys_exit_futex_waitv",
    "syscalls:sys_enter_futex_wake",
    "syscalls:sys_enter_futex_requeue",
    "sched:sched_process_exit",
    "task:task_newtask",
];

pub fn run(args: &FutexArgs) -> Result<()> {
    crate::setup::prepare_bench()?;
    measure(args, PASSES).map(|_| ())
}

/// `bench all --quick`: one pass of 100,000 handoffs per configuration, unpinned, at the
/// profiler's default sampling; ours on the process and system-wide against the floor.
pub fn quick() -> Result<Vec<Headline>> {
    let runs = measure(&FutexArgs { iterations: 100_000, pin_cpu: None, sampling: String::new() }, 1)?;
    let floor = &runs[1];
    Ok(runs[2..]
        .iter()
        .map(|run| {
            let figure = format!("{} / floor (median)", run.name);
            let ratio = Some(run.median() / floor.median());
            Headline::new("futex", &figure, ratio, Bar::AtMost(MAX_OURS_VS_FLOOR), Unit::Ratio)
        })
        .collect())
}

/// Every configuration in `passes` interleaved passes; prints the table and returns the runs,
/// in [`CONFIGS`] order.
fn measure(args: &FutexArgs, passes: u64) -> Result<Vec<Measured>> {
    match args.pin_cpu {
        // Read by the program's threads; set while this process has one thread and before
        // the program is started.
        Some(cpu) => std::env::set_var("FUTEX_BENCH_CPU", cpu.to_string()),
        None => std::env::remove_var("FUTEX_BENCH_CPU"),
    }
    let dir = workspace::target_dir().join("xtask-bench");
    std::fs::create_dir_all(&dir)?;
    let bin = crate::bench::cc::compile_text(
        &dir,
        "futex_bench",
        &workload::two_player_rounds_c(FUTEX_PLAYERS_C, "1", r#""done %d\n", turn"#),
        &["-O1", "-pthread"],
    )?;
    let out = fresh_dir(&dir.join("futex-out"))?;
    let pairs = (args.iterations / passes).max(u64::from(ROUNDS) * 4);
    workload::catch_interrupt();
    let _stats = workload::BpfStats::enable();
    let mut measured: Vec<Measured> = CONFIGS.iter().map(|&(name, _)| Measured::new(name)).collect();
    for pass in 0..passes {
        workspace::stage(&format!("pass {}/{passes}: {pairs} handoffs per configuration", pass + 1));
        for k in 0..CONFIGS.len() {
            let i = (pass as usize + k) % CONFIGS.len();
            let (rounds, stderr) = run_once(&bin, &out, pairs, CONFIGS[i].1, &args.sampling)?;
            bail_if_interrupted()?;
            println!(
                "    {:<40} {:>10.1} ns/handoff (median round)",
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

fn run_once(bin: &Path, out: &Path, pairs: u64, probe: Probe, sampling: &str) -> Result<(Vec<f64>, String)> {
    let program = MallocBench::start(bin, pairs, ROUNDS)?;
    let pid = program.pid();
    let tracer = match probe {
        Probe::None => {
            std::thread::sleep(SETTLE);
            return Ok((program.run()?, String::new()));
        }
        Probe::Bpftrace => Tracer::start("bpftrace", bpftrace_cmd(), "Attaching")?,
        Probe::Profiler(only_pid) => {
            Tracer::start("profiler", profiler_cmd(out, only_pid.then_some(pid), sampling), PROFILER_ATTACHED)?
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

/// Empty programs on every tracepoint the profiler uses that this kernel has.
fn bpftrace_cmd() -> Command {
    let probes: Vec<String> = TRACEPOINTS
        .iter()
        .filter(|tp| {
            let (category, name) = tp.split_once(':').unwrap_or_default();
            std::path::Path::new("/sys/kernel/tracing/events").join(category).join(name).is_dir()
        })
        .map(|tp| format!("tracepoint:{tp}"))
        .collect();
    let mut cmd = Command::new("bpftrace");
    cmd.args(["-e", &format!("{} {{}}", probes.join(","))]);
    cmd
}

fn profiler_cmd(out: &std::path::Path, pid: Option<u32>, sampling: &str) -> Command {
    let mut cmd = Command::new(workspace::profiler_bin());
    cmd.env("RUST_LOG", "info").args(["snapshot", "--profiles", "block,mutex,threadcreate"]);
    cmd.args(sampling.split_whitespace());
    if let Some(pid) = pid {
        cmd.args(["--pid", &pid.to_string()]);
    }
    let name = if pid.is_some() { "pid" } else { "system" };
    cmd.args(["--duration", "3600s", "--bpf-stats", "--output"]).arg(out.join(name));
    cmd
}

/// `pairs`: handoffs each configuration ran in all.
fn print(runs: &[Measured], pairs: u64) {
    let (none, floor) = (&runs[0], &runs[1]);
    println!();
    println!(
        "{:<40} {:>9} {:>13} {:>9} {:>9} {:>9}",
        "ns per handoff", "fastest", "x no profiler", "x floor", "median", "x floor"
    );
    for run in runs {
        println!(
            "{:<40} {:>9.1} {:>12.3}x {:>8.3}x {:>9.1} {:>8.3}x",
            run.name,
            run.fastest(),
            run.fastest() / none.fastest(),
            run.fastest() / floor.fastest(),
            run.median(),
            run.median() / floor.median()
        );
    }
    for run in &runs[2..] {
        print_bpf_stats(run, pairs);
    }
    println!("targets (median rounds; fastest in parentheses):");
    for run in &runs[2..] {
        let (ratio, median_ratio) = (run.fastest() / floor.fastest(), run.median() / floor.median());
        target(
            &format!("{} / floor <= {MAX_OURS_VS_FLOOR}", &run.name[..3]),
            &format!("{median_ratio:.3}x ({ratio:.3}x)"),
            Some(median_ratio <= MAX_OURS_VS_FLOOR),
        );
    }
}

/// The profiler's programs' kernel-measured runs and ns per run, summed over its runs.
fn print_bpf_stats(run: &Measured, pairs: u64) {
    let mut parts = Vec::new();
    for program in ["futex_enter", "futex_exit", "thread_create"] {
        let stats = run.stderrs.iter().filter_map(|s| super::report::bpf_stats_of(s, program));
        let (count, ns) = stats.fold((0u64, 0u64), |(c, t), (c2, t2)| (c + c2, t + t2));
        if count > 0 {
            parts.push(format!(
                "{program} {count} runs ({:.2} per handoff) {:.0} ns/run",
                count as f64 / pairs.max(1) as f64,
                ns as f64 / count as f64
            ));
        }
    }
    if !parts.is_empty() {
        println!("bpf programs, {}: {}", run.name, parts.join("; "));
    }
}
