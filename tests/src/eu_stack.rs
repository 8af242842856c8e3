//! elfutils' `eu-stack -p PID`, the reference thread dump: it ptrace-stops every thread and
//! unwinds with the same `.eh_frame` CFI, so its stacks are the ground truth of the
//! profiler's, and its pause is the cost the profiler avoids.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::run::run_with_timeout;

/// One frame as eu-stack prints it: `#3  0x00005555ed16f459 cond_thread`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EuFrame {
    /// The frame's pc as eu-stack prints it: the interrupted pc (a syscall's return point)
    /// for the first frame, return addresses after.
    pub address: u64,
    pub function: String,
}

/// Runs `eu-stack -p PID`; returns each thread's frames (leaf first) by tid, and how long
/// it took. Panics when eu-stack is missing or fails.
pub fn dump(pid: u32) -> (BTreeMap<u32, Vec<EuFrame>>, Duration) {
    let started = Instant::now();
    let output = run_with_timeout(Command::new("eu-stack").args(["-p", &pid.to_string()]), Duration::from_secs(60));
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() || text.contains("TID"),
        "eu-stack -p {pid} failed (is elfutils installed? `cargo xtask setup` installs it): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (parse(&text), took)
}

/// Parses eu-stack's output: `TID N:` headers, then `#K  0xADDR function` lines.
pub fn parse(text: &str) -> BTreeMap<u32, Vec<EuFrame>> {
    let mut threads = BTreeMap::new();
    let mut current: Option<u32> = None;
    for line in text.lines() {
        if let Some(tid) = line.strip_prefix("TID ").and_then(|rest| rest.trim_end_matches(':').parse().ok()) {
            current = Some(tid);
            threads.insert(tid, Vec::new());
            continue;
        }
        let (Some(tid), Some(rest)) = (current, line.strip_prefix('#')) else { continue };
        let mut fields = rest.split_whitespace().skip(1);
        let Some(address) = fields.next().and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok()) else {
            continue;
        };
        let function = fields.next().unwrap_or("").to_string();
        threads.get_mut(&tid).expect("a TID line came first").push(EuFrame { address, function });
    }
    threads
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_threads_and_frames() {
        let text = "PID 7 - process\nTID 7:\n#0  0x00007f6c3500a545 clock_nanosleep@GLIBC_2.2.5\n#1  0x00005555ed16f65b main_wait\nTID 9:\n#0  0x0000000000401000\n";
        let threads = parse(text);
        assert_eq!(threads[&7].len(), 2);
        assert_eq!(threads[&7][1], EuFrame { address: 0x5555_ed16_f65b, function: "main_wait".into() });
        assert_eq!(threads[&9][0].function, "");
    }
}
