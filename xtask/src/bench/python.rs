//! `cargo xtask bench python`: what walking CPython's frames in the kernel costs per sample,
//! at 10, 50 and 200 Python frames deep. Two Python spinners (one per CPU, so nearly every
//! sample is theirs) recurse to the depth and spin; per depth, interleaved rounds run:
//! - ours, Python frames walked (Debian's `python3.11`, which the profiler registers);
//! - ours, Python unwinding off: the same interpreter copied under a name the profiler does
//!   not take for CPython's, so the same stacks are walked natively only;
//! - ours on two C spinners of the same native depth ([`NATIVE_FRAMES`], built without frame
//!   pointers as Debian's interpreter is), the baseline of the native part;
//! - py-spy (`record --nonblocking`, the reference Python profiler) on the same spinners at
//!   the same rate, its CPU time per sample.
//!
//! Ours is the BPF program's run time per sample (`--bpf-stats`), so the difference between
//! the first two is the Python walk; py-spy's is its whole process's CPU (it reads the
//! frames from userspace, one `process_vm_readv` per object). Judged on medians. Targets:
//! ours below py-spy at every depth, and the native part of a Python sample at most
//! [`MAX_NATIVE_VS_C`] times the C spinners', a ratio taken per round and judged on its
//! median. That ratio divides by the samples the profiles hold, not by the program's runs:
//! on a loaded machine most clock ticks find another process running and cost only the
//! filter, which would pull both figures towards it alike.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::all::{Bar, Headline, Unit};
use super::{bail_if_interrupted, fresh_dir, measure, report, unwind::median};
use crate::workspace;

/// Python frames of the spinners' stacks (the spinning function and its callers).
const DEPTHS: [u32; 3] = [10, 50, 200];
const SPINNERS: usize = 2;
/// Debian's interpreter, a static build (no libpython), so a copy of it runs on its own.
const PYTHON: &str = "/usr/bin/python3.11";
/// Native frames of a sample of the spinners in it, whatever their Python depth (3.11 calls
/// Python functions without a C frame each): `_start`, two of libc's, `Py_BytesMain` down to
/// `_PyEval_EvalFrameDefault` (ten, as eu-stack shows them), and the leaf it calls in about
/// half the samples.
const NATIVE_FRAMES: u32 = 13;
/// The bar for the native part of a Python sample, as a multiple of a C spinner's of the
/// same native depth.
const MAX_NATIVE_VS_C: f64 = 2.0;

/// `depth` Python frames: `<module>`, `down` × (depth − 2), `spin`.
const SPINNER_PY: &str = include_str!("../../programs/spin.py");

#[derive(clap::Args, Debug)]
pub struct PythonArgs {
    /// Length of each run.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Sampling frequency, for both tools.
    #[arg(long = "frequency", default_value_t = 99)]
    frequency_hz: u32,
    /// Interleaved rounds per depth.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

pub fn run(args: &PythonArgs) -> Result<()> {
    crate::setup::prepare_bench()?;
    let dir = workspace::target_dir().join("xtask-bench-python");
    let out = fresh_dir(&dir.join("out"))?;
    super::workload::catch_interrupt();
    let _stats = super::workload::BpfStats::enable();
    let workloads = Workloads::prepare(&dir)?;
    let (rows, mut ratios, mut loads) = measure_depths(&workloads, args, &out, &DEPTHS)?;
    print_table(&rows, args);
    print_native_vs_c(&mut ratios, &mut loads);
    print_walk_per_frame(&rows);
    println!("(profiles kept in {})", out.display());
    Ok(())
}

/// `bench all --quick`: one round at the shallowest depth, ours against py-spy and the
/// native part of a Python sample against the C spinners'.
pub fn quick() -> Result<Vec<Headline>> {
    let args = PythonArgs { seconds: 8, frequency_hz: 99, rounds: 1 };
    let dir = workspace::target_dir().join("xtask-bench-python");
    let out = fresh_dir(&dir.join("out"))?;
    let _stats = super::workload::BpfStats::enable();
    let workloads = Workloads::prepare(&dir)?;
    let depth = DEPTHS[0];
    let (rows, mut ratios, mut loads) = measure_depths(&workloads, &args, &out, &[depth])?;
    print_table(&rows, &args);
    print_native_vs_c(&mut ratios, &mut loads);
    let [python, _, peer] = rows.first().map_or([None; 3], |row| row.1);
    let native_vs_c = ratios.first_mut().and_then(|(_, ratios)| median(ratios));
    Ok(vec![
        Headline::new(
            "python",
            &format!("{depth} Python frames: ours / py-spy's CPU per sample"),
            python.zip(peer).map(|(ours, peer)| ours / peer),
            Bar::Below(1.0),
            Unit::Ratio,
        )
        .missing_because("no py-spy, or no bpf_stats"),
        Headline::new(
            "python",
            &format!("{depth} Python frames: native part / C spinners'"),
            native_vs_c,
            Bar::AtMost(MAX_NATIVE_VS_C),
            Unit::Ratio,
        )
        .missing_because("no bpf_stats, or no samples walked"),
    ])
}

/// Per depth: the medians of (ours with Python frames, ours without, py-spy), in ns.
type Row = (u32, [Option<f64>; 3]);

/// Per depth: the native part of each round's Python sample over the C spinner's.
type DepthRatios = (u32, Vec<f64>);

/// What each round runs.
struct Workloads {
    script: PathBuf,
    /// The interpreter under a name the profiler does not look for one in.
    unregistered: PathBuf,
    c_spinner: PathBuf,
    /// The C spinner's argument: its recursion depth.
    c_depth: String,
    py_spy: Option<PathBuf>,
}

impl Workloads {
    /// Writes the spinner script, copies the interpreter, compiles the C spinner and looks
    /// for py-spy, in `dir`.
    fn prepare(dir: &Path) -> Result<Self> {
        let script = dir.join("spin.py");
        std::fs::write(&script, SPINNER_PY).with_context(|| format!("failed to write {}", script.display()))?;
        // Not named python*: the profiler does not look for an interpreter in it.
        let unregistered = dir.join("interp-copy");
        std::fs::copy(PYTHON, &unregistered).with_context(|| format!("failed to copy {PYTHON}"))?;
        // Without frame pointers, as Debian builds the interpreter: both are walked by tables.
        let c_spinner = crate::bench::cc::compile_text(
            dir,
            "spin_nofp",
            super::workload::SPINNER_C,
            &["-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls"],
        )?;
        // `main`, libc's two start frames and `_start` under the recursion.
        let c_depth = (NATIVE_FRAMES - 4).to_string();
        let py_spy = workspace::target_dir().join("test-venv/bin/py-spy");
        let py_spy = py_spy.exists().then_some(py_spy);
        if py_spy.is_none() {
            println!("py-spy not found in the test venv: run `cargo xtask setup`; its column will be n/a");
        }
        Ok(Self { script, unregistered, c_spinner, c_depth, py_spy })
    }
}

/// Runs the interleaved rounds at each of `depths`. Returns the rows, the native-to-C ratios per
/// depth, and the load averages seen.
fn measure_depths(
    w: &Workloads,
    args: &PythonArgs,
    out: &Path,
    depths: &[u32],
) -> Result<(Vec<Row>, Vec<DepthRatios>, Vec<f64>)> {
    let mut rows = Vec::new();
    let mut ratios = Vec::new();
    let mut loads = Vec::new();
    for &depth in depths {
        let mut runs: [Vec<f64>; 3] = Default::default();
        let mut native_vs_c = Vec::new();
        for round in 1..=args.rounds {
            workspace::stage(&format!(
                "{depth} Python frames, round {round} of {}: ours with Python frames, ours without, ours on C \
                 spinners of {NATIVE_FRAMES} frames, py-spy",
                args.rounds
            ));
            loads.extend(load_average());
            let depth_arg = depth.to_string();
            let python = ours(Path::new(PYTHON), &[w.script.as_os_str(), depth_arg.as_ref()], args, out)?;
            let native = ours(&w.unregistered, &[w.script.as_os_str(), depth_arg.as_ref()], args, out)?;
            let c = ours(&w.c_spinner, &[w.c_depth.as_ref()], args, out)?;
            let peer = match &w.py_spy {
                Some(py_spy) => py_spy_ns(py_spy, &w.script, depth, args)?,
                None => None,
            };
            for (list, ns) in runs.iter_mut().zip([python.map(|o| o.per_run), native.map(|o| o.per_run), peer]) {
                list.extend(ns);
            }
            native_vs_c.extend(native.and_then(|n| Some(n.per_sample? / c?.per_sample?)));
            bail_if_interrupted()?;
        }
        rows.push((depth, runs.map(|mut v| median(&mut v))));
        ratios.push((depth, native_vs_c));
    }
    Ok((rows, ratios, loads))
}

/// The medians by depth, and ours against py-spy's CPU per sample.
fn print_table(rows: &[Row], args: &PythonArgs) {
    println!();
    println!("medians of {} interleaved rounds, {} s each at {} Hz:", args.rounds, args.seconds, args.frequency_hz);
    println!(
        "{:>14} {:>22} {:>22} {:>16} {:>22}",
        "Python frames", "ours, Python (ns)", "ours, native (ns)", "walk (ns)", "py-spy CPU (ns/sample)"
    );
    let show = |ns: Option<f64>| ns.map_or("n/a".to_string(), |ns| format!("{ns:.0}"));
    for (depth, [python, native, peer]) in rows {
        let walk = python.zip(*native).map(|(p, n)| p - n);
        println!("{:>14} {:>22} {:>22} {:>16} {:>22}", depth, show(*python), show(*native), show(walk), show(*peer));
    }
    for (depth, [python, _, peer]) in rows {
        match (python, peer) {
            (Some(ours), Some(peer)) => println!(
                "{depth} frames: ours {:.2}x py-spy's CPU per sample, target < 1: {}",
                ours / peer,
                if ours < peer { "PASS" } else { "MISS" }
            ),
            _ => println!("{depth} frames: n/a (no bpf_stats, or no py-spy)"),
        }
    }
}

/// How much each Python frame adds to the walk, between the shallowest and deepest depth.
fn print_walk_per_frame(rows: &[Row]) {
    let walks: Vec<(f64, f64)> =
        rows.iter().filter_map(|(d, [p, n, _])| Some((f64::from(*d), (*p)? - (*n)?))).collect();
    if let [first, .., last] = walks[..] {
        println!(
            "the Python walk: {:.1} ns per Python frame between {} and {} frames",
            (last.1 - first.1) / (last.0 - first.0),
            first.0,
            last.0
        );
    }
}

/// The native part of a Python sample against the C spinners', round by round, and the
/// machine's load meanwhile (the figures are per walked sample, but a loaded machine's cold
/// caches raise both).
fn print_native_vs_c(ratios: &mut [(u32, Vec<f64>)], loads: &mut [f64]) {
    println!(
        "the native part of a Python sample (ours, native) vs ours on C spinners of {NATIVE_FRAMES} native frames, \
         ns per walked sample:"
    );
    for (depth, ratios) in ratios.iter_mut() {
        let listed = ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" ");
        match median(ratios) {
            Some(mid) => println!(
                "{depth} frames: {mid:.2}x (median of rounds {listed}), target <= {MAX_NATIVE_VS_C}x: {}",
                if mid <= MAX_NATIVE_VS_C { "PASS" } else { "MISS" }
            ),
            None => println!("{depth} frames: n/a (no bpf_stats, or no samples walked)"),
        }
    }
    let busy = if Path::new("/tmp/ci-busy").exists() { ", /tmp/ci-busy present" } else { "" };
    if let (Some(low), Some(mid), Some(high)) =
        (loads.iter().copied().reduce(f64::min), median(loads), loads.iter().copied().reduce(f64::max))
    {
        println!("load average (1 min) at the rounds' starts: {low:.1} to {high:.1}, median {mid:.1}{busy}");
    }
}

/// The 1-minute load average, from `/proc/loadavg`.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// Starts [`SPINNERS`] copies of `program` with `args`.
fn spinners(program: &Path, args: &[&OsStr]) -> Result<Vec<std::process::Child>> {
    (0..SPINNERS)
        .map(|_| {
            Command::new(program).args(args).spawn().with_context(|| format!("failed to start {}", program.display()))
        })
        .collect()
}

fn stop(spinners: Vec<std::process::Child>) {
    for mut s in spinners {
        let _ = s.kill();
        let _ = s.wait();
    }
}

/// What a run of ours cost, in BPF ns.
#[derive(Clone, Copy)]
struct Ours {
    /// Per run of the sampling program: every clock tick of the CPUs, the spinners' or not.
    per_run: f64,
    /// Per sample the profiles hold: the spinners' ticks, each walked (`None` if none).
    per_sample: Option<f64>,
}

/// `profiler snapshot --bpf-stats` of [`SPINNERS`] copies of `program` with `spinner_args`.
fn ours(program: &Path, spinner_args: &[&OsStr], args: &PythonArgs, out: &Path) -> Result<Option<Ours>> {
    let spinners = spinners(program, spinner_args)?;
    // Let the interpreters reach their depth before sampling starts.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut cmd = Command::new(workspace::profiler_bin());
    cmd.args([
        "snapshot",
        "--duration",
        &format!("{}s", args.seconds),
        "--frequency",
        &args.frequency_hz.to_string(),
        "--profiles",
        "cpu",
        "--bpf-stats",
    ]);
    for s in &spinners {
        cmd.args(["--pid", &s.id().to_string()]);
    }
    cmd.arg("--output").arg(out);
    let result = measure::run(cmd);
    stop(spinners);
    let result = result?;
    let Some((runs, ns)) = report::bpf_stats(&result.stderr).filter(|&(n, _)| n > 0) else { return Ok(None) };
    let per_sample = cpu_samples(&result.stdout).filter(|&n| n > 0).map(|n| ns as f64 / n as f64);
    Ok(Some(Ours { per_run: ns as f64 / runs as f64, per_sample }))
}

/// The CPU samples `profiler snapshot` says it wrote (`wrote N profiles to DIR (S cpu samples, …`).
fn cpu_samples(stdout: &str) -> Option<u64> {
    let line = stdout.lines().find(|l| l.starts_with("wrote "))?;
    let before = &line[..line.find(" cpu samples")?];
    before[before.rfind('(')? + 1..].parse().ok()
}

/// py-spy's CPU ns per sample: one `py-spy record --nonblocking` per spinner at the same
/// rate, their CPU time summed over the samples they should have taken.
fn py_spy_ns(py_spy: &PathBuf, script: &Path, depth: u32, args: &PythonArgs) -> Result<Option<f64>> {
    let depth = depth.to_string();
    let spinners = spinners(Path::new(PYTHON), &[script.as_os_str(), depth.as_ref()])?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    let recorders: Vec<_> = spinners
        .iter()
        .map(|s| {
            let mut cmd = Command::new(py_spy);
            cmd.args([
                "record",
                "--nonblocking",
                "--pid",
                &s.id().to_string(),
                "--rate",
                &args.frequency_hz.to_string(),
                "--duration",
                &args.seconds.to_string(),
                "--format",
                "raw",
                "--output",
                "/dev/null",
            ]);
            std::thread::spawn(move || measure::run(cmd))
        })
        .collect();
    let mut cpu = std::time::Duration::ZERO;
    let mut failed = None;
    for recorder in recorders {
        match recorder.join().expect("the py-spy thread does not panic") {
            Ok(run) => cpu += run.cpu,
            Err(err) => failed = Some(err),
        }
    }
    stop(spinners);
    if let Some(err) = failed {
        println!("py-spy failed: {err:#}");
        return Ok(None);
    }
    let samples = (SPINNERS as u64 * args.seconds * u64::from(args.frequency_hz)) as f64;
    Ok(Some(cpu.as_nanos() as f64 / samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_cpu_samples_snapshot_wrote() {
        let stdout =
            "process pid samples\nwrote 2 profiles to /tmp/out (1583 cpu samples, 0 lost to a full map; 0 heap \
                      samples, 0 not tracked as live: map full)\n";
        assert_eq!(cpu_samples(stdout), Some(1583));
        assert_eq!(cpu_samples("wrote 0 profiles to /tmp/out (no figures)"), None);
        assert_eq!(cpu_samples("capturing 2 process(es) for 8s\n"), None);
    }
}
