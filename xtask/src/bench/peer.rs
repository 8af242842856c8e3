//! bpftrace as a peer doing the profiler's kernel job (`profile:hz:N { @[kstack, ustack] =
//! count(); }`), so the profiler's BPF ns/sample is shown next to another eBPF tool's on the
//! same machine and load. Its programs' cost is read from their fdinfo (`run_time_ns`,
//! `run_cnt`) while it runs, which needs kernel.bpf_stats_enabled (the bench turns it on).
//! The same way, trivial bpftrace programs measure the machine's floor: what an empty
//! program and a single map update cost per run here (on a VM, far more than on metal).

use std::{
    process::{Command, Stdio},
    time::Duration,
};

/// Average ns per run of bpftrace's profile probe over `seconds`, or `None` when bpftrace
/// is missing or reported nothing.
pub fn bpftrace_ns_per_sample(frequency_hz: u32, seconds: u64) -> Option<f64> {
    bpftrace_ns_per_run(&format!("profile:hz:{frequency_hz} {{ @[kstack, ustack] = count(); }}"), seconds)
}

/// The floor at `frequency_hz`: ns per run of an empty profile program and of one that does
/// a single map update (`@[pid] = count()`).
pub fn bpftrace_floor_ns(frequency_hz: u32, seconds: u64) -> (Option<f64>, Option<f64>) {
    (
        bpftrace_ns_per_run(&format!("profile:hz:{frequency_hz} {{ }}"), seconds),
        bpftrace_ns_per_run(&format!("profile:hz:{frequency_hz} {{ @[pid] = count(); }}"), seconds),
    )
}

/// ns per run of the bpftrace `program` over `seconds` (kernel bpf_stats of its programs).
pub fn bpftrace_ns_per_run(program: &str, seconds: u64) -> Option<f64> {
    let mut child =
        Command::new("bpftrace").args(["-e", program]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().ok()?;
    std::thread::sleep(Duration::from_secs(seconds));
    let (runs, ns) = prog_stats(child.id());
    // SAFETY: kill with a valid pid and signal; SIGINT lets bpftrace detach cleanly.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let _ = child.wait();
    (runs > 0).then(|| ns as f64 / runs as f64)
}

/// Sums `run_cnt` and `run_time_ns` over the BPF program fds of process `pid`.
fn prog_stats(pid: u32) -> (u64, u64) {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return (0, 0) };
    let (mut runs, mut ns) = (0, 0);
    for entry in dir.flatten() {
        let Ok(info) = std::fs::read_to_string(entry.path()) else { continue };
        if !info.contains("prog_type:") {
            continue;
        }
        let field = |name: &str| {
            info.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
        };
        runs += field("run_cnt:");
        ns += field("run_time_ns:");
    }
    (runs, ns)
}
