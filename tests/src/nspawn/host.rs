//! What the container guard does on the host itself: the mount table, processes found
//! through `/proc` (nspawn's children, a fixture's pid in the container), signals, and the
//! clean-up of an earlier run that was killed before its guard dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::{COMMAND_TIMEOUT, NSPAWN_RUN, NSPAWN_RUN_MARKER, SCRATCH};
use crate::daemon::wait_for;

/// Undoes what a run killed before its guard dropped left behind: its systemd-nspawn (found
/// by its exact `-D` argument) and the container in it, then every mount under [`SCRATCH`],
/// and the tmpfs on [`NSPAWN_RUN`] if it carries this module's marker.
pub(super) fn clean_stale() {
    let root = Path::new(SCRATCH).join("root");
    for pid in stale_nspawns(&root) {
        eprintln!("killing systemd-nspawn {pid} left over from an earlier run on {}", root.display());
        for leader in children(pid) {
            signal(leader, libc::SIGKILL);
        }
        signal(pid, libc::SIGKILL);
        let gone = wait_for(Duration::from_secs(10), || !alive(pid));
        if !gone {
            eprintln!("systemd-nspawn {pid} is still alive after SIGKILL");
        }
    }
    let mut stale: Vec<PathBuf> = mount_points().into_iter().filter(|m| m.starts_with(SCRATCH)).collect();
    // Deepest first: the overlay before the tmpfs under it.
    stale.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for mount in stale {
        eprintln!("unmounting {} left over from an earlier run", mount.display());
        unmount(&mount);
    }
    if Path::new(NSPAWN_RUN_MARKER).exists() {
        eprintln!("unmounting {NSPAWN_RUN} left over from an earlier run");
        unmount(Path::new(NSPAWN_RUN));
    }
    // Empty once unmounted; `prepare` creates it again.
    let _ = std::fs::remove_dir(SCRATCH);
}

/// Processes whose argv is `systemd-nspawn ... -D ROOT ...`.
pub(super) fn stale_nspawns(root: &Path) -> Vec<u32> {
    let root = root.to_string_lossy();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<String> = raw.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            args.first().is_some_and(|a| a.ends_with("systemd-nspawn"))
                && args.windows(2).any(|w| w[0] == "-D" && w[1] == root)
        })
        .collect()
}

/// Unmounts `target`; lazily (detached now, freed when its last user goes) if it is busy.
/// Never panics: it runs in `drop`.
pub(super) fn unmount(target: &Path) {
    let plain = output_within(Command::new("umount").arg(target), COMMAND_TIMEOUT);
    if plain.is_some_and(|o| o.status.success()) {
        return;
    }
    let lazy = output_within(Command::new("umount").arg("-l").arg(target), COMMAND_TIMEOUT);
    match lazy {
        Some(out) if out.status.success() => {
            eprintln!("{} was busy; detached it (umount -l)", target.display())
        }
        Some(out) => {
            eprintln!("failed to unmount {}: {}", target.display(), String::from_utf8_lossy(&out.stderr).trim())
        }
        None => eprintln!("umount -l {} did not finish", target.display()),
    }
}

/// The mount points of this mount namespace (`/proc/self/mountinfo`, field 5; these paths
/// have no characters that mountinfo escapes).
pub(super) fn mount_points() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("failed to read /proc/self/mountinfo");
    text.lines().filter_map(|line| line.split(' ').nth(4)).map(PathBuf::from).collect()
}

pub(super) fn is_mount_point(path: &Path) -> bool {
    mount_points().iter().any(|m| m == path)
}

/// The children of every thread of `pid`.
pub(super) fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|text| text.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

pub(super) fn comm(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(text.trim_end().to_owned())
}

/// The pid in the innermost pid namespace: the last field of `NSpid:` in `/proc/PID/status`.
pub(super) fn ns_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// Exists and is not a zombie.
pub(super) fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesized comm, which may itself contain ") ".
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z'))
}

pub(super) fn signal(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill has no memory-safety preconditions. Every pid passed here is a child of
    // ours, a child of one of our children that has not been reaped (so not reused), or a
    // leftover systemd-nspawn just identified by its command line.
    unsafe { libc::kill(pid, signal) };
}

/// Runs `cmd` to completion, or kills it after `timeout` and returns `None`. Never panics,
/// unlike [`run_with_timeout`]: for clean-up in `drop`.
pub(super) fn output_within(cmd: &mut Command, timeout: Duration) -> Option<Output> {
    let child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().ok()?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    // wait_with_output drains both pipes while it waits, so a chatty command cannot block.
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(output) => output.ok(),
        Err(_) => {
            // Not reaped yet (the thread is still waiting for it), so the pid is still its own.
            signal(pid, libc::SIGKILL);
            let _ = rx.recv();
            None
        }
    }
}
