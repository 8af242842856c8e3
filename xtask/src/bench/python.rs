//! `cargo xtask bench python`: what walking CPython's frames in the kernel costs per sample,
//! at 10, 50 and 200 Python frames deep. Two Python spinners (one per CPU, so nearly every
//! sample is theirs) recurse to the depth and spin; per depth, interleaved rounds run:
//! - ours, Python frames walked (Debian's `python3.11`, which the profiler registers);
//! - ours, Python unwinding off: the same interpreter copied under a name the profiler does
//!   not take for CPython's, so the same stacks are walked natively only;
//! - py-spy (`record --nonblocking`, the reference Python profiler) on the same spinners at
//!   the same rate, its CPU time per sample.
//!
//! Ours is the BPF program's run time per sample (`--bpf-stats`), so the difference between
//! the first two is the Python walk; py-spy's is its whole process's CPU (it reads the
//! frames from userspace, one `process_vm_readv` per object). Judged on medians. Target:
//! ours below py-spy at every depth.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::{bail_if_interrupted, fresh_dir, measure, report, unwind::median};
use crate::workspace;

/// Python frames of the spinners' stacks (the spinning function and its callers).
const DEPTHS: [u32; 3] = [10, 50, 200];
const SPINNERS: usize = 2;
/// Debian's interpreter, a static build (no libpython), so a copy of it runs on its own.
const PYTHON: &str = "/usr/bin/python3.11";

/// `depth` Python frames: `<module>`, `down` × (depth − 2), `spin`.
const SPINNER_PY: &str = r#"import sys


def spin():
    acc = 0
    while True:
        for i in range(10000):
            acc = (acc * 31 + i) & 0xFFFFFFFF


def down(n):
    if n <= 0:
        spin()
    down(n - 1)


down(int(sys.argv[1]) - 2)
"#;

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
    let script = dir.join("spin.py");
    std::fs::write(&script, SPINNER_PY).with_context(|| format!("failed to write {}", script.display()))?;
    // Not named python*: the profiler does not look for an interpreter in it.
    let unregistered = dir.join("interp-copy");
    std::fs::copy(PYTHON, &unregistered).with_context(|| format!("failed to copy {PYTHON}"))?;
    let py_spy = workspace::target_dir().join("test-venv/bin/py-spy");
    let py_spy = py_spy.exists().then_some(py_spy);
    if py_spy.is_none() {
        println!("py-spy not found in the test venv: run `cargo xtask setup`; its column will be n/a");
    }
    let mut rows = Vec::new();
    for depth in DEPTHS {
        let mut runs: [Vec<f64>; 3] = Default::default();
        for round in 1..=args.rounds {
            workspace::stage(&format!(
                "{depth} Python frames, round {round} of {}: ours with Python frames, ours without, py-spy",
                args.rounds
            ));
            let measured = [
                ours_ns(Path::new(PYTHON), &script, depth, args, &out)?,
                ours_ns(&unregistered, &script, depth, args, &out)?,
                match &py_spy {
                    Some(py_spy) => py_spy_ns(py_spy, &script, depth, args)?,
                    None => None,
                },
            ];
            for (list, ns) in runs.iter_mut().zip(measured) {
                list.extend(ns);
            }
            bail_if_interrupted()?;
        }
        rows.push((depth, runs.map(|mut v| median(&mut v))));
    }
    println!();
    println!("medians of {} interleaved rounds, {} s each at {} Hz:", args.rounds, args.seconds, args.frequency_hz);
    println!(
        "{:>14} {:>22} {:>22} {:>16} {:>22}",
        "Python frames", "ours, Python (ns)", "ours, native (ns)", "walk (ns)", "py-spy CPU (ns/sample)"
    );
    let show = |ns: Option<f64>| ns.map_or("n/a".to_string(), |ns| format!("{ns:.0}"));
    for (depth, [python, native, peer]) in &rows {
        let walk = python.zip(*native).map(|(p, n)| p - n);
        println!("{:>14} {:>22} {:>22} {:>16} {:>22}", depth, show(*python), show(*native), show(walk), show(*peer));
    }
    for (depth, [python, _, peer]) in &rows {
        match (python, peer) {
            (Some(ours), Some(peer)) => println!(
                "{depth} frames: ours {:.2}x py-spy's CPU per sample, target < 1: {}",
                ours / peer,
                if ours < peer { "PASS" } else { "MISS" }
            ),
            _ => println!("{depth} frames: n/a (no bpf_stats, or no py-spy)"),
        }
    }
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
    println!("(profiles kept in {})", out.display());
    Ok(())
}

/// Starts [`SPINNERS`] spinners of `script` under `python`, `depth` Python frames deep.
fn spinners(python: &Path, script: &Path, depth: u32) -> Result<Vec<std::process::Child>> {
    (0..SPINNERS)
        .map(|_| {
            Command::new(python)
                .arg(script)
                .arg(depth.to_string())
                .spawn()
                .with_context(|| format!("failed to start {}", python.display()))
        })
        .collect()
}

fn stop(spinners: Vec<std::process::Child>) {
    for mut s in spinners {
        let _ = s.kill();
        let _ = s.wait();
    }
}

/// BPF ns per sample of `profiler snapshot --bpf-stats` of the spinners.
fn ours_ns(python: &Path, script: &Path, depth: u32, args: &PythonArgs, out: &Path) -> Result<Option<f64>> {
    let spinners = spinners(python, script, depth)?;
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
    Ok(report::bpf_stats(&result?.stderr).filter(|&(n, _)| n > 0).map(|(n, t)| t as f64 / n as f64))
}

/// py-spy's CPU ns per sample: one `py-spy record --nonblocking` per spinner at the same
/// rate, their CPU time summed over the samples they should have taken.
fn py_spy_ns(py_spy: &PathBuf, script: &Path, depth: u32, args: &PythonArgs) -> Result<Option<f64>> {
    let spinners = spinners(Path::new(PYTHON), script, depth)?;
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
