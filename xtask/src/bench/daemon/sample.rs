//! Reading the running daemon from outside: its CPU time and RSS from `/proc`, the run time
//! of the BPF programs it holds from their fdinfo, and `/status` over its socket with a
//! one-request HTTP/1.1 client (the xtask has no HTTP or JSON crate, and needs neither).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// User + system CPU time of process `pid` (all its threads).
pub fn cpu_time(pid: u32) -> Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("failed to read {path}"))?;
    let ticks = stat_ticks(&stat).with_context(|| format!("unexpected format of {path}"))?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = u64::try_from(per_second).ok().filter(|&t| t > 0).unwrap_or(100);
    Ok(Duration::from_nanos(ticks * 1_000_000_000 / per_second))
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line, in clock ticks. The fields
/// are counted after the `)` that ends the command name, which may itself hold spaces.
fn stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The resident set size of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("failed to read {path}"))?;
    status_kib(&status, "VmRSS:").with_context(|| format!("no VmRSS in {path}"))
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// Total `run_time_ns` of the BPF programs whose fds process `pid` holds: zero unless
/// `kernel.bpf_stats_enabled` is on. Unreadable entries count as zero.
pub fn bpf_run_time(pid: u32) -> Duration {
    let entries = std::fs::read_dir(format!("/proc/{pid}/fdinfo")).into_iter().flatten();
    let total: u64 = entries
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .filter(|info| info.contains("prog_type:"))
        .filter_map(|info| fdinfo_number(&info, "run_time_ns:"))
        .sum();
    Duration::from_nanos(total)
}

fn fdinfo_number(info: &str, key: &str) -> Option<u64> {
    let line = info.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].trim().parse().ok()
}

/// `GET path` on the daemon's socket; the body of a 200 answer, else an error.
pub fn get(socket: &Path, path: &str) -> Result<String> {
    let mut stream =
        UnixStream::connect(socket).with_context(|| format!("failed to connect to {}", socket.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response).with_context(|| format!("failed to read the answer to GET {path}"))?;
    let (head, body) = response.split_once("\r\n\r\n").with_context(|| format!("malformed answer to GET {path}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_owned())
}

/// The first `"key": N` in a JSON text. Enough for the daemon's `/status`, whose keys are
/// unique apart from the top-level sections, without a JSON crate.
pub fn json_number(json: &str, key: &str) -> Option<u64> {
    json_number_in(json, &[key])
}

/// The number at `path` (`["userspace_stacks", "entries"]`): each key is looked for after
/// the previous one, which is how `/status` nests its few repeated names.
pub fn json_number_in(json: &str, path: &[&str]) -> Option<u64> {
    let mut start = 0;
    for key in path {
        let quoted = format!("\"{key}\":");
        start += json[start..].find(&quoted)? + quoted.len();
    }
    let digits: String = json[start..].trim_start().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_name_with_spaces() {
        let stat = "42 (tokio rt) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 1 1 1";
        assert_eq!(stat_ticks(stat), Some(325));
        assert_eq!(stat_ticks("garbage"), None);
    }

    #[test]
    fn status_and_fdinfo_numbers() {
        let status = "Name:\tprofiler\nVmHWM:\t  40000 kB\nVmRSS:\t   31176 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(31176));
        let info = "pos:\t0\nprog_type:\t7\nrun_time_ns:\t123456\nrun_cnt:\t10\n";
        assert_eq!(fdinfo_number(info, "run_time_ns:"), Some(123456));
    }

    #[test]
    fn json_numbers_by_key() {
        let json = "{\n  \"output\": {\n    \"dumps\": 12,\n    \"last_dump_ms\": 7\n  }\n}";
        assert_eq!(json_number(json, "last_dump_ms"), Some(7));
        assert_eq!(json_number(json, "dumps"), Some(12));
        assert_eq!(json_number(json, "output"), None);
        assert_eq!(json_number(json, "absent"), None);
        let nested = "{\"heap_live\": {\"entries\": 1}, \"userspace_stacks\": {\"entries\": 22}}";
        assert_eq!(json_number_in(nested, &["userspace_stacks", "entries"]), Some(22));
        assert_eq!(json_number_in(nested, &["entries"]), Some(1));
    }
}
