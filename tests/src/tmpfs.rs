//! A small tmpfs mounted on a scratch directory, to give the daemon an output file system
//! that can be filled or made read-only on demand. Unmounted on drop, so a failing test never
//! leaves a mount behind.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::run::{run_with_timeout, TempDir};

/// A mounted tmpfs. Drop it after the daemon that writes into it (declare it first).
pub struct Tmpfs {
    mount_point: PathBuf,
    // Dropped after `drop` has unmounted, which removes the (by then empty) directory.
    _dir: TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (mount's syntax: "64k") on a new scratch directory.
    pub fn mount(label: &str, size: &str) -> Self {
        let dir = TempDir::new(label);
        let mount_point = dir.path().join("mnt");
        std::fs::create_dir(&mount_point).unwrap_or_else(|e| panic!("failed to create {}: {e}", mount_point.display()));
        let options = format!("size={size},mode=0755");
        run(Command::new("mount").args(["-t", "tmpfs", "-o", &options, "tmpfs"]).arg(&mount_point));
        Self { mount_point, _dir: dir }
    }

    pub fn path(&self) -> &Path {
        &self.mount_point
    }

    /// `mount -o remount,OPTION` (`ro` or `rw`).
    pub fn remount(&self, option: &str) {
        let options = format!("remount,{option}");
        run(Command::new("mount").args(["-o", &options]).arg(&self.mount_point));
    }

    /// Fills the file system with one file of zeros (dd stops at ENOSPC); returns its path.
    pub fn fill(&self) -> PathBuf {
        let file = self.mount_point.join("fill");
        let mut cmd = Command::new("dd");
        cmd.args(["if=/dev/zero", "bs=4k"]).arg(format!("of={}", file.display()));
        // dd exits 1 when the device fills up, which is the point.
        run_with_timeout(&mut cmd, Duration::from_secs(30));
        let free = profiler_daemon::sink::retention::available_bytes(&self.mount_point)
            .unwrap_or_else(|e| panic!("failed to read the free space of the tmpfs: {e}"));
        assert_eq!(free, 0, "dd left {free} bytes free on the tmpfs");
        file
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let status = Command::new("umount").arg(&self.mount_point).status();
        if !status.is_ok_and(|s| s.success()) {
            // Still busy: detach it now; the kernel frees it when the last user goes.
            let _ = Command::new("umount").arg("-l").arg(&self.mount_point).status();
        }
    }
}

fn run(cmd: &mut Command) {
    let output = run_with_timeout(cmd, Duration::from_secs(30));
    assert!(
        output.status.success(),
        "{cmd:?} failed ({}): {}; the tests need root with CAP_SYS_ADMIN to mount a tmpfs",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}
