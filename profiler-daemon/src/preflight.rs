//! Checks done before loading anything, so that common mistakes get a clear error instead of
//! an `EPERM` from deep inside the loader.

use std::fs;

use crate::{
    error::{Error, Result},
    procs,
};

const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYSLOG: u32 = 34;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The oldest kernel the programs load on: `bpf_loop` came in 5.17, and hash maps
/// allocated on insert (the counts maps, `maps::COUNTS_MAP_FLAGS`) are refused to perf-event
/// programs before 6.1's BPF memory allocator.
pub const MIN_KERNEL: (u32, u32) = (6, 1);

/// Fails on a kernel older than [`MIN_KERNEL`], naming it, rather than with a verifier
/// error from the loader. A release that does not parse is let through (the loader then
/// says what is missing).
pub fn check_kernel() -> Result<()> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim();
    match kernel_version(release) {
        Some(version) if version < MIN_KERNEL => {
            Err(Error::KernelTooOld { release: release.to_string(), needed: MIN_KERNEL })
        }
        _ => Ok(()),
    }
}

/// The major and minor version of a kernel release string (`6.12.48+deb13-amd64`).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Fails unless the process may load BPF programs and open system-wide perf events:
/// CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN. Warns about capabilities whose absence only
/// degrades the result (reading other processes' mappings, kernel symbol addresses).
pub fn check_privileges() -> Result<()> {
    check_kernel()?;
    let caps = effective_caps();
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if !(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))) {
        let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
            .into_iter()
            .filter(|&(cap, _)| !has(cap))
            .map(|(_, name)| name)
            .collect();
        return Err(Error::Privileges { missing: missing.join(" and ") });
    }
    if !has(CAP_SYS_PTRACE) {
        tracing::warn!("without CAP_SYS_PTRACE other users' processes cannot be symbolized");
    }
    if !has(CAP_SYSLOG) {
        tracing::warn!("without CAP_SYSLOG kernel frames cannot be symbolized");
    }
    Ok(())
}

/// Fails with the first pid that does not name a live process.
pub fn check_pids(pids: &[u32]) -> Result<()> {
    match pids.iter().find(|&&pid| !procs::exists(pid)) {
        Some(&pid) => Err(Error::NoSuchProcess(pid)),
        None => Ok(()),
    }
}

/// The effective capability set of this process, from `/proc/self/status`.
fn effective_caps() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_parse_and_old_ones_are_named() {
        assert_eq!(kernel_version("6.12.48+deb13-amd64"), Some((6, 12)));
        assert_eq!(kernel_version("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(kernel_version("6.1"), Some((6, 1)));
        assert_eq!(kernel_version("garbage"), None);
        assert!(kernel_version("5.15.0").unwrap() < MIN_KERNEL);
        assert!(kernel_version("6.1.0-18-amd64").unwrap() >= MIN_KERNEL);
        let message = Error::KernelTooOld { release: "5.15.0-91-generic".into(), needed: MIN_KERNEL }.to_string();
        assert!(message.contains("Linux 5.15.0-91-generic") && message.contains("6.1 or newer"), "{message}");
        // This machine runs the tests, so it must pass its own check.
        check_kernel().expect("the test machine's kernel is new enough");
    }

    #[test]
    fn unknown_pid_is_named() {
        let err = check_pids(&[std::process::id(), 0x7fff_fff0]).unwrap_err();
        assert!(err.to_string().contains(&0x7fff_fff0u32.to_string()), "{err}");
        assert!(check_pids(&[std::process::id()]).is_ok());
    }
}
