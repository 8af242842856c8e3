//! `cargo xtask bench unwind`: what the `.eh_frame` unwinder costs per sample across stack
//! depths. The same spinner is built twice: without frame pointers (every frame needs its
//! table row) and with them (the frame-pointer build, for the side-by-side baseline), each
//! run under `profiler snapshot --bpf-stats`. Then the table sizes and build times of libc
//! and of the profiler binary, from `profiler unwind-table`.

use std::process::Command;

use anyhow::{Context, Result};

use super::{bail_if_interrupted, fresh_dir, measure, report, workload};
use crate::workspace;

/// The bars: per sample with the unwinder, and with frame pointers.
const MAX_NS_UNWIND: f64 = 5000.0;
const MAX_NS_FRAME_POINTERS: f64 = 2000.0;
/// Spinner recursion depths: the user stack is this plus main, libc's two start frames and
/// `_start`. 16–32 covers typical native stacks; 120 is near the 127-frame limit.
const DEPTHS: [u32; 5] = [8, 16, 32, 64, 120];
const SPINNERS: usize = 2;

#[derive(clap::Args, Debug)]
pub struct UnwindArgs {
    /// Length of each run.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Sampling frequency.
    #[arg(long = "frequency", default_value_t = 99)]
    frequency_hz: u32,
}

/// Spinner frames, and ns per sample without and with frame pointers.
type Row = (u32, Option<f64>, Option<f64>);

pub fn run(args: &UnwindArgs) -> Result<()> {
    workspace::prepare(false)?;
    let dir = workspace::target_dir().join("xtask-bench-unwind");
    let out = fresh_dir(&dir.join("out"))?;
    workload::catch_interrupt();
    let _stats = workload::BpfStats::enable();
    let no_fp = workload::compile_c(
        &dir,
        "spin_nofp",
        workload::SPINNER_C,
        &["-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls"],
    )?;
    let fp = workload::compile_c(
        &dir,
        "spin_fp",
        workload::SPINNER_C,
        &["-O1", "-fno-omit-frame-pointer", "-fno-shrink-wrap"],
    )?;
    let mut rows: Vec<Row> = Vec::new();
    for depth in DEPTHS {
        let mut row: Row = (depth, None, None);
        for (bin, slot) in [(&no_fp, 1), (&fp, 2)] {
            workspace::stage(&format!(
                "{} s at {} Hz, {SPINNERS} spinners {depth} frames deep ({})",
                args.seconds,
                args.frequency_hz,
                bin.display()
            ));
            let mut spinners = Vec::new();
            for _ in 0..SPINNERS {
                spinners.push(Command::new(bin).arg(depth.to_string()).spawn().context("failed to start a spinner")?);
            }
            let mut cmd = Command::new(workspace::profiler_bin());
            cmd.args([
                "snapshot",
                "--duration",
                &format!("{}s", args.seconds),
                "--frequency",
                &args.frequency_hz.to_string(),
                "--bpf-stats",
            ]);
            for s in &spinners {
                cmd.args(["--pid", &s.id().to_string()]);
            }
            cmd.arg("--output").arg(&out);
            let result = measure::run(cmd);
            for mut s in spinners {
                let _ = s.kill();
                let _ = s.wait();
            }
            let ns = report::bpf_stats(&result?.stderr).filter(|&(n, _)| n > 0).map(|(n, t)| t as f64 / n as f64);
            if slot == 1 {
                row.1 = ns;
            } else {
                row.2 = ns;
            }
            bail_if_interrupted()?;
        }
        rows.push(row);
    }
    println!();
    println!("{:>6} {:>26} {:>24}", "depth", "ns/sample, no frame ptrs", "ns/sample, frame ptrs");
    let show = |ns: Option<f64>| ns.map_or("n/a".to_string(), |ns| format!("{ns:.0}"));
    for (depth, no_fp, fp) in &rows {
        println!("{:>6} {:>26} {:>24}", depth + 4, show(*no_fp), show(*fp));
    }
    // "Typical depths": 16–32 spinner frames (20–36 user frames); the bar is for those.
    let typical = rows.iter().filter(|r| r.0 <= 32);
    let worst = |pick: fn(&Row) -> Option<f64>| {
        typical.clone().filter_map(pick).fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    };
    verdict("unwinder, worst typical depth (≤ 36 frames)", worst(|r| r.1), MAX_NS_UNWIND);
    verdict("frame-pointer build, worst typical depth", worst(|r| r.2), MAX_NS_FRAME_POINTERS);

    workspace::stage("unwind tables: libc and the profiler binary");
    let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("/lib/x86_64-linux-gnu/libc.so.6");
    let status = Command::new(workspace::profiler_bin())
        .arg("unwind-table")
        .arg(libc)
        .arg(workspace::profiler_bin())
        .status()
        .context("failed to run profiler unwind-table")?;
    if !status.success() {
        anyhow::bail!("profiler unwind-table failed ({status})");
    }
    println!("(profiles kept in {})", out.display());
    Ok(())
}

fn verdict(what: &str, ns: Option<f64>, target: f64) {
    match ns {
        Some(ns) => {
            println!("{what}: {ns:.0} ns/sample, target ≤ {target:.0}: {}", if ns <= target { "PASS" } else { "MISS" })
        }
        None => println!("{what}: n/a (no bpf_stats)"),
    }
}
