//! `cargo xtask bench cpu` (module `cpu`): what continuous CPU profiling costs, next to
//! `perf record` and bpftrace doing the same job, in interleaved rounds.
//! `cargo xtask bench heap` (module `heap`): what heap profiling costs an allocating process,
//! next to bare uprobes.
//! `cargo xtask bench futex` (module `futex`): what the block, mutex and threadcreate
//! tracepoints cost a lock-heavy process, next to empty programs on the same tracepoints.
//! `cargo xtask bench offcpu` (module `offcpu`): what the off-CPU profile costs a process
//! that does nothing but switch, next to an empty program on `sched_switch`.
//! `cargo xtask bench daemon` (module `daemon`): what `profiler run` costs over minutes
//! among a few hundred processes: CPU, RSS and its growth, dump time.
//! `cargo xtask bench exec` (module `exec`): what following hundreds of short programs a
//! second costs the daemon, next to `perf record` doing the same side-band job.
//! `cargo xtask bench export` (module `export`): what pushing to a backend costs the daemon,
//! and how fast a backlog drains after an outage.
//! `cargo xtask bench unwind` (module `unwind`): the `.eh_frame` unwinder's cost per sample
//! across stack depths, and table sizes.
//! `cargo xtask bench threads` (module `threads`): a thread dump's time and CPU at 10-1,000
//! threads, and the pause it causes, next to `eu-stack`.
//! `cargo xtask bench go` (module `go`): a Go spinner's BPF cost per sample with pprof labels
//! on and off, and goroutine dumps at 100-100,000 goroutines next to Go's own.
//! `cargo xtask bench memory` (module `memory`): the kernel memory of every BPF map, measured
//! here and priced from the kernel's formula at 64 and 256 possible CPUs.
//! `cargo xtask bench python` (module `python`): the kernel's walk of CPython frames per
//! sample at 10-200 Python frames, with Python unwinding off, and py-spy's CPU.
//! `cargo xtask bench soak` (module `soak`): a million distinct stacks through the daemon's
//! stack table, then a known stack, and the daemon's memory meanwhile.
//! `cargo xtask bench all --quick` (module `all`): every bench's headline figures from one
//! short round each, in one table.
//!
//! Benchmarks, not tests: they report PASS/MISS against targets and exit 0 unless a run
//! itself fails. Tools run one after the other so none measures another.

// The C compile helper, shared with the end-to-end tests: its doc says why it is included
// rather than a crate. Only the benches compile C, so it sits under them.
mod all;
#[path = "../../tests/src/cc.rs"]
mod cc;
mod cpu;
mod daemon;
mod exec;
mod export;
mod futex;
mod go;
mod heap;
mod measure;
mod memory;
mod offcpu;
mod peer;
mod python;
mod report;
mod soak;
mod threads;
mod unwind;
mod workload;

use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

/// The available benchmarks.
#[derive(clap::Subcommand, Debug)]
pub enum Bench {
    /// Sampling overhead of the profiler vs `perf record -a -g` on a loaded machine.
    Cpu(cpu::CpuArgs),
    /// ns per malloc+free pair: no profiler, bare uprobes, the profiler at 1 B and 512 KiB
    /// sampling, and a process the profiler does not probe.
    Heap(heap::HeapArgs),
    /// ns per futex handoff of two threads (mutex + condvar): no profiler, empty programs on
    /// the same tracepoints (the floor), the profiler on the process and system-wide.
    Futex(futex::FutexArgs),
    /// ns per pipe handoff of two threads on one CPU (a context switch each): no profiler,
    /// an empty program on sched_switch (the floor), the off-CPU profile at 1 in 50, at 1 in
    /// 1,000,000 and at every switch.
    Offcpu(offcpu::OffCpuArgs),
    /// `profiler run` among ~200 processes for minutes per frequency: CPU, RSS (peak,
    /// steady, flat?) and dump time.
    Daemon(daemon::DaemonArgs),
    /// `profiler run` following 500 short programs a second, next to `perf record -a -e
    /// dummy` (perf's side band): CPU, RSS over the run, records lost.
    Exec(exec::ExecArgs),
    /// `profiler run` among ~200 processes with `[[export]]` off vs on (CPU, RSS), then a
    /// backend outage: the backlog, RSS meanwhile, and the drain rate.
    Export(export::ExportArgs),
    /// BPF ns per sample with the .eh_frame unwinder at stack depths 12–124, no frame
    /// pointers vs frame pointers, and unwind table sizes for libc and the profiler.
    Unwind(unwind::UnwindArgs),
    /// Thread dumps of processes with 10, 100 and 1,000 threads: `profiler threads`, a
    /// daemon's goroutine query and `eu-stack -p`, wall and CPU time and the pause each
    /// causes.
    Threads(threads::ThreadsArgs),
    /// A Go spinner's BPF ns per sample with and without pprof labels, and goroutine dumps of
    /// 100, 10,000 and 100,000 goroutines (CLI, daemon, Go's own in-process): wall, CPU, the
    /// process's longest 1 ms tick gap, our memory.
    Go(go::GoArgs),
    /// Kernel memory of every BPF map with every profile kind on: as the kernel accounts it
    /// here, and from its formula at 64 and 256 possible CPUs, next to the 96 MiB target.
    Memory(memory::MemoryArgs),
    /// BPF ns per sample of Python spinners 10, 50 and 200 Python frames deep: with Python
    /// frames, with Python unwinding off, and py-spy's CPU per sample at the same rate.
    Python(python::PythonArgs),
    /// A million distinct stacks through `profiler run`'s stack table (two churners at
    /// 999 Hz), then a known 75/25 split beside them: stacks learnt, the split, refusals,
    /// peak RSS and whether it stays flat once the table is full.
    Soak(soak::SoakArgs),
    /// With --quick: every bench's headline figures (ratios against its peers and floors, the
    /// issues' MiB budgets) from one short round each, in one table with PASS/MISS and the
    /// command that runs each bench in full; a few minutes in all. Soak is left out.
    All(all::AllArgs),
}

pub fn run(bench: Bench) -> Result<ExitCode> {
    match bench {
        Bench::Cpu(args) => cpu::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Heap(args) => heap::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Futex(args) => futex::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Offcpu(args) => offcpu::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Daemon(args) => daemon::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Unwind(args) => unwind::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Threads(args) => threads::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Export(args) => export::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Exec(args) => exec::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Go(args) => go::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Memory(args) => memory::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Python(args) => python::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::Soak(args) => soak::run(&args).map(|()| ExitCode::SUCCESS),
        Bench::All(args) => all::run(&args).map(|()| ExitCode::SUCCESS),
    }
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
