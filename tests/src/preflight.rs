//! Checks every end-to-end test makes before it starts: root (a failure, never a skip) and the
//! kernel features the profiler cannot work without (the only allowed reason to skip).

use std::path::Path;

/// Panics unless running as root; returns `false` (after printing why) if the kernel lacks a
/// feature the profiler needs, in which case the caller returns early and the test skips:
/// every test starts with `if !preflight() { return; }`.
pub fn preflight() -> bool {
    require_root();
    match missing_kernel_feature() {
        Some(why) => {
            eprintln!("skipping: the kernel lacks {why}");
            false
        }
        None => true,
    }
}

/// Panics with the way to run the tests if the effective uid is not 0.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "these tests load eBPF programs and need root (euid is {euid}): \
         run the tests with `cargo xtask test` as root"
    );
}

/// The first missing kernel feature, named for a human, or `None` if all are present.
fn missing_kernel_feature() -> Option<String> {
    let probes: [(&str, &str); 3] = [
        ("/proc/sys/kernel/perf_event_paranoid", "perf events (CONFIG_PERF_EVENTS)"),
        ("/proc/sys/kernel/unprivileged_bpf_disabled", "the bpf syscall (CONFIG_BPF_SYSCALL)"),
        ("/proc/kallsyms", "kernel symbols (CONFIG_KALLSYMS)"),
    ];
    probes
        .iter()
        .find(|(path, _)| !Path::new(path).exists())
        .map(|(path, what)| format!("{what}: {path} does not exist"))
}
