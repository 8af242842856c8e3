//! `cargo xtask bench cpu`: what continuous CPU profiling costs, the profiler next to
//! `perf record` at the same frequency under the same load, printed as one table.
//! `cargo xtask bench heap` (module `heap`): what heap profiling costs an allocating process,
//! next to bare uprobes.
//! `cargo xtask bench futex` (module `futex`): what the block, mutex and threadcreate
//! tracepoints cost a lock-heavy process, next to empty programs on the same tracepoints.
//! `cargo xtask bench daemon` (module `daemon`): what `profiler run` costs over minutes
//! among a few hundred processes: CPU, RSS and its growth, dump time.
//! `cargo xtask bench unwind` (module `unwind`): the `.eh_frame` unwinder's cost per sample
//! across stack depths, and table sizes.
//!
//! Benchmarks, not tests: they report PASS/MISS against targets and exit 0 unless a run
//! itself fails. Tools run one after the other so none measures another.

mod daemon;
mod futex;
mod heap;
mod measure;
mod peer;
mod report;
mod unwind;
mod workload;

use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};

use crate::workspace;

/// The available benchmarks.
#[derive(clap::Subcommand, Debug)]
pub enum Bench {
    /// Sampling overhead of the profiler vs `perf record -a -g` on a loaded machine.
    Cpu(CpuArgs),
    /// ns per malloc+free pair: no profiler, bare uprobes, the profiler at 1 B and 512 KiB
    /// sampling, and a process the profiler does not probe.
    Heap(heap::HeapArgs),
    /// ns per futex handoff of two threads (mutex + condvar): no profiler, empty programs on
    /// the same tracepoints (the floor), the profiler on the process and system-wide.
    Futex(futex::FutexArgs),
    /// `profiler run` among ~200 processes for minutes per frequency: CPU, RSS (peak,
    /// steady, flat?) and dump time.
    Daemon(daemon::DaemonArgs),
    /// BPF ns per sample with the .eh_frame unwinder at stack depths 12–124, no frame
    /// pointers vs frame pointers, and unwind table sizes for libc and the profiler.
    Unwind(unwind::UnwindArgs),
}

#[derive(clap::Args, Debug)]
pub struct CpuArgs {
    /// Length of each tool's run.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Sampling frequency for both tools.
    #[arg(long = "frequency", default_value_t = 99)]
    frequency_hz: u32,
}

/// Busy processes on top of the machine's own, enough to keep 2-4 CPUs sampled on-CPU.
const SPINNERS: usize = 4;

pub fn run(bench: Bench) -> Result<ExitCode> {
    match bench {
        Bench::Cpu(args) => cpu(&args).map(|()| ExitCode::SUCCESS),
        Bench::Heap(args) => heap::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Futex(args) => futex::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Daemon(args) => daemon::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Unwind(args) => unwind::run(&args).map(|()| ExitCode::SUCCESS),
    }
}

fn cpu(args: &CpuArgs) -> Result<()> {
    workspace::prepare(false)?;
    let dir = workspace::target_dir().join("xtask-bench");
    let out = fresh_dir(&dir.join("out"))?;
    workload::catch_interrupt();
    let _spinners = workload::Spinners::start(&dir, SPINNERS)?;
    let _stats = workload::BpfStats::enable();
    let (secs, hz) = (args.seconds, args.frequency_hz);
    workspace::stage(&format!("profiler snapshot for {secs} s at {hz} Hz ({SPINNERS} spinners running)"));
    let profiler = measure::run(profiler_cmd(args, &out))?;
    bail_if_interrupted()?;
    workspace::stage(&format!("perf record for {secs} s at {hz} Hz"));
    let perf = measure::run(perf_cmd(args, &out))?;
    bail_if_interrupted()?;
    workspace::stage(&format!("bpftrace profile:hz:{hz} with kstack+ustack for {secs} s (peer for ns/sample)"));
    let bpftrace_ns = peer::bpftrace_ns_per_sample(hz, secs);
    bail_if_interrupted()?;
    let floor_secs = secs.min(10);
    workspace::stage(&format!(
        "bpftrace: empty program, then one map update, {floor_secs} s each (the machine's floor)"
    ));
    let (empty_ns, one_update_ns) = peer::bpftrace_floor_ns(hz, floor_secs);
    bail_if_interrupted()?;
    let profiler_row = report::Row::profiler(&profiler);
    report::print(&profiler_row, &report::Row::perf(&perf));
    match (profiler_row.ns_per_sample, bpftrace_ns) {
        (Some(ours), Some(theirs)) => println!(
            "bpf ns/sample: profiler {ours:.0}, bpftrace doing the same job {theirs:.0} (ratio {:.2})",
            ours / theirs
        ),
        _ => println!("bpf ns/sample of bpftrace: n/a (bpftrace missing or no bpf_stats)"),
    }
    let show = |ns: Option<f64>| ns.map_or("n/a".to_string(), |ns| format!("{ns:.0}"));
    println!(
        "floor on this machine (bpftrace ns/run): empty program {}, one map update (@[pid] = count()) {}",
        show(empty_ns),
        show(one_update_ns)
    );
    println!("(outputs kept in {})", out.display());
    Ok(())
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

/// A run cut short by Ctrl-C measures nothing comparable, so stop instead of printing it.
fn bail_if_interrupted() -> Result<()> {
    if workload::interrupted() {
        bail!("interrupted; spinners stopped and kernel.bpf_stats_enabled restored");
    }
    Ok(())
}

fn fresh_dir(dir: &Path) -> Result<std::path::PathBuf> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    Ok(dir.to_path_buf())
}
