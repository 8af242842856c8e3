//! `cargo xtask bench heap`: what heap profiling costs a process that allocates a lot, in ns
//! per malloc(64) + free pair of one program, in five configurations measured in one
//! invocation: (a) no profiler; (b) the bare uprobe floor, bpftrace with empty programs on
//! the same probes (malloc entry and return, free entry) filtered to the same process; (c)
//! the profiler recording every allocation; (d) the profiler at its default 512 KiB
//! sampling; (e) the program unprobed while the profiler probes another (sleeping) process.
//!
//! The program starts paused and is released only once the tool says its probes are in (and
//! a settling pause), so the timed loop runs entirely probed. Runs never overlap. A trapped
//! malloc costs microseconds and varies by ±15% over seconds (more on a shared VM), so one
//! run per configuration would compare noise: the configurations run in interleaved passes,
//! each pass in a rotated order. Interference only ever adds time, so the targets are judged
//! on each configuration's fastest round; the medians are shown too.

pub(super) mod program;
pub(super) mod report;
pub(super) mod tracer;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Result};

use self::program::MallocBench;
use self::report::Measured;
use self::tracer::Tracer;
use super::all::Headline;
use super::{bail_if_interrupted, fresh_dir, workload};
use crate::workspace;

#[derive(clap::Args, Debug)]
pub struct HeapArgs {
    /// malloc(64) + free pairs per configuration, spread over the passes.
    #[arg(long, default_value_t = 2_000_000)]
    iterations: u64,
}

/// Interleaved passes over all configurations (one in `bench all --quick`).
const PASSES: u64 = 4;
/// Timed rounds per run; each configuration gets PASSES × ROUNDS rounds.
const ROUNDS: u32 = 5;
const SAMPLED_BYTES: u64 = 512 * 1024;
/// Between a tool's "attached" and the release of the program. bpftrace prints `Attaching N
/// probes...` before attaching; and both tools keep working for a moment after attaching
/// (measured: the first seconds of trapped mallocs run up to 50% slower), which is not the
/// steady cost the targets are about.
const SETTLE: Duration = Duration::from_secs(3);
/// After a tool stops: the kernel frees its maps and programs in the background.
const QUIESCE: Duration = Duration::from_secs(1);
/// The profiler logs this (at info level) right before its capture starts.
const PROFILER_ATTACHED: &str = "attached; capturing";

/// The configurations, in table order.
const CONFIGS: [(&str, Probe); 5] = [
    ("(a) no profiler", Probe::None),
    ("(b) uprobe floor (bpftrace, empty)", Probe::Bpftrace),
    ("(c) profiler, every allocation", Probe::Profiler(1)),
    ("(d) profiler, 512 KiB sampling", Probe::Profiler(SAMPLED_BYTES)),
    ("(e) unselected, profiler on another", Probe::Other),
];

pub fn run(args: &HeapArgs) -> Result<()> {
    crate::setup::prepare_bench()?;
    workload::catch_interrupt();
    measure(args.iterations, PASSES).map(|_| ())
}

/// `bench all --quick`: one pass of 100,000 pairs per configuration, and the three targets.
pub fn quick() -> Result<Vec<Headline>> {
    Ok(report::headlines(&measure(100_000, 1)?))
}

/// `iterations` pairs per configuration over `passes` interleaved passes; prints the table.
fn measure(iterations: u64, passes: u64) -> Result<report::Runs> {
    let dir = workspace::target_dir().join("xtask-bench");
    std::fs::create_dir_all(&dir)?;
    let bench = Bench {
        bin: program::compile(&dir)?,
        out: fresh_dir(&dir.join("heap-out"))?,
        pairs: (iterations / passes).max(u64::from(ROUNDS)),
        passes,
    };
    let _stats = workload::BpfStats::enable();
    let measured = bench.passes()?;
    let [none, floor, every, sampled, unselected] =
        <[Measured; 5]>::try_from(measured).unwrap_or_else(|_| unreachable!("five configurations"));
    let runs = report::Runs { none, floor, every, sampled, unselected };
    report::print(&runs);
    println!("(profiles kept in {})", bench.out.display());
    Ok(runs)
}

/// What probes the measured process during a run.
#[derive(Clone, Copy)]
enum Probe {
    None,
    Bpftrace,
    /// The profiler on the measured process, at this many sample bytes.
    Profiler(u64),
    /// The profiler (every allocation) on a second, sleeping copy of the program.
    Other,
}

struct Bench {
    bin: PathBuf,
    out: PathBuf,
    /// Pairs per run.
    pairs: u64,
    /// Interleaved passes over every configuration.
    passes: u64,
}

impl Bench {
    /// Every configuration once per pass, each pass starting one configuration later, so a
    /// slow stretch of the machine does not land on one configuration only.
    fn passes(&self) -> Result<Vec<Measured>> {
        let mut measured: Vec<Measured> = CONFIGS.iter().map(|&(name, _)| Measured::new(name)).collect();
        for pass in 0..self.passes {
            workspace::stage(&format!("pass {}/{}: {} pairs per configuration", pass + 1, self.passes, self.pairs));
            for k in 0..CONFIGS.len() {
                let i = (pass as usize + k) % CONFIGS.len();
                let (rounds, stderr) = self.run_once(CONFIGS[i].1)?;
                bail_if_interrupted()?;
                println!("    {:<40} {:>10.1} ns/pair (median round)", CONFIGS[i].0, report::median(&rounds));
                measured[i].add(rounds, stderr);
            }
        }
        Ok(measured)
    }

    /// One run of the program under `probe`: its rounds, and the tool's stderr.
    fn run_once(&self, probe: Probe) -> Result<(Vec<f64>, String)> {
        let program = MallocBench::start(&self.bin, self.pairs, ROUNDS)?;
        let pid = program.pid();
        match probe {
            Probe::None => {
                // Paused as long as under a tool, so every configuration starts alike.
                std::thread::sleep(SETTLE);
                Ok((program.run()?, String::new()))
            }
            Probe::Bpftrace => {
                let cmd = bpftrace_cmd(&program::libc_path(pid)?, pid);
                traced(Tracer::start("bpftrace", cmd, "Attaching")?, program)
            }
            Probe::Profiler(sample_bytes) => {
                let tracer = Tracer::start("profiler", self.profiler_cmd(pid, sample_bytes), PROFILER_ATTACHED)?;
                traced(tracer, program)
            }
            Probe::Other => {
                let sleeper = MallocBench::start(&self.bin, self.pairs, ROUNDS)?;
                let tracer = Tracer::start("profiler", self.profiler_cmd(sleeper.pid(), 1), PROFILER_ATTACHED)?;
                traced(tracer, program)
            }
        }
    }

    /// A capture far longer than the run: it is ended by SIGINT once the program is done.
    fn profiler_cmd(&self, pid: u32, sample_bytes: u64) -> Command {
        let mut cmd = Command::new(workspace::profiler_bin());
        cmd.env("RUST_LOG", "info")
            .args(["snapshot", "--profiles", "heap", "--pid", &pid.to_string()])
            .args(["--heap-sample-bytes", &sample_bytes.to_string()])
            .args(["--duration", "3600s", "--bpf-stats", "--output"])
            .arg(self.out.join(format!("sample-{sample_bytes}")));
        cmd
    }
}

/// Runs `program` under the already attached `tracer` once it has settled, then stops the
/// tracer; fails if either failed. Returns the rounds and the tool's stderr.
fn traced(tracer: Tracer, program: MallocBench) -> Result<(Vec<f64>, String)> {
    std::thread::sleep(SETTLE);
    let rounds = program.run()?;
    let stopped = tracer.stop()?;
    std::thread::sleep(QUIESCE);
    if !stopped.status.success() {
        bail!("the tracer failed ({}); its stderr:\n{}", stopped.status, stopped.stderr);
    }
    Ok((rounds, stopped.stderr))
}

/// Empty programs on the probes the profiler needs for malloc + free. bpftrace attaches them
/// for every process and filters by pid inside the program: the measured process pays the
/// same traps either way.
fn bpftrace_cmd(libc: &str, pid: u32) -> Command {
    let filter = format!("/pid == {pid}/ {{}}");
    let script = format!(
        "uprobe:{libc}:malloc {filter} uretprobe:{libc}:malloc {filter} \
         uprobe:{libc}:free {filter}"
    );
    let mut cmd = Command::new("bpftrace");
    cmd.args(["-e", &script]);
    cmd
}
