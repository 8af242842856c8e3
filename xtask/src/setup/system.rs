//! Kernel-facing prerequisites: privileges for BPF and perf events, and the tracefs/debugfs
//! mounts (a fresh machine has neither; tracepoint attach reads event ids from tracefs).

use std::process::Command;

use super::{Host, Report, Status};

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Whether we can load BPF and open system-wide perf events; an error only if `required`.
pub fn privileges(host: &Host, required: bool) -> Status {
    let what = "root or CAP_BPF+CAP_PERFMON+CAP_SYS_ADMIN (loading eBPF, system-wide perf events)";
    if has_caps() {
        let who = if host.root { "root" } else { "CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN" };
        return Status::Ok(format!("privileges ({who})"));
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fix = format!("sudo -E env \"PATH=$PATH\" cargo xtask {}", args.join(" "));
    if required {
        Status::Missing { what: what.into(), fix }
    } else {
        Status::Warning(format!("not privileged: profiling needs {what}; run snapshot/test/bench as root"))
    }
}

/// Reads the effective capability set: uid 0 alone is not enough inside a container.
fn has_caps() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).map(str::trim);
    let bits = cap_eff.and_then(|hex| u64::from_str_radix(hex, 16).ok()).unwrap_or(0);
    [CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF].iter().all(|cap| bits & (1 << cap) != 0)
}

/// tracefs is required; debugfs only helps tools that use the legacy
/// /sys/kernel/debug/tracing path, so failing to mount it is a warning.
pub fn mounts(host: &Host, report: &mut Report) {
    report.add(mount(host, "tracefs", "/sys/kernel/tracing", true));
    report.add(mount(host, "debugfs", "/sys/kernel/debug", false));
}

fn mount(host: &Host, fstype: &str, dir: &str, required: bool) -> Status {
    let what = format!("{fstype} at {dir}");
    if is_mounted(fstype, dir) {
        return Status::Ok(what);
    }
    if host.root {
        let _ = Command::new("mount").args(["-t", fstype, fstype, dir]).status();
        if is_mounted(fstype, dir) {
            return Status::Installed(format!("{what} (mounted)"));
        }
    }
    let fix = format!("{}mount -t {fstype} {fstype} {dir}", host.sudo());
    if required {
        Status::Missing { what, fix }
    } else {
        Status::Warning(format!("{what} not mounted (optional; run: {fix})"))
    }
}

fn is_mounted(fstype: &str, dir: &str) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&dir) && fields.get(2) == Some(&fstype)
    })
}
