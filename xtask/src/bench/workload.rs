//! The benchmark's environment: CPU spinners that give both tools the same stacks to sample,
//! and `kernel.bpf_stats_enabled` switched on for the run. Both undo themselves on drop, so
//! an early error or panic leaves no spinner burning CPU and no sysctl changed.

use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context, Result};

/// Spins under a fixed-depth call chain built with frame pointers, so every sample walks a
/// real user stack of known depth rather than one frame of a shell loop. `-fno-shrink-wrap`
/// makes the spinning leaf set up its frame too, so the walk does not skip its caller.
pub const SPINNER_C: &str = include_str!("../../programs/spin.c");

const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Busy processes, killed and reaped on drop.
pub struct Spinners {
    _children: Children,
}

impl Spinners {
    /// Compiles the spinner into `dir` and starts `count` copies.
    pub fn start(dir: &Path, count: usize) -> Result<Spinners> {
        let bin = compile(dir)?;
        let mut spinners = Children::default();
        for _ in 0..count {
            spinners.spawn(&bin, &[])?;
        }
        Ok(Spinners { _children: spinners })
    }
}

/// Child processes of a bench's workload, killed and reaped on drop.
#[derive(Default)]
pub struct Children(Vec<Child>);

impl Children {
    /// Starts `bin` with `args`, its output discarded; returns its pid.
    pub fn spawn(&mut self, bin: &Path, args: &[&str]) -> Result<u32> {
        let child = Command::new(bin)
            .args(args)
            .stdout(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("failed to start {}", bin.display()))?;
        let pid = child.id();
        self.0.push(child);
        Ok(pid)
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn compile(dir: &Path) -> Result<std::path::PathBuf> {
    compile_c(dir, "spin", SPINNER_C, &["-O1", "-fno-omit-frame-pointer", "-fno-shrink-wrap"])
}

/// The C program of a two-thread round bench (`bench futex`, `bench offcpu`): `players`
/// defines `static void *player(void *arg)` (called with 0 and 1), which runs `rounds`
/// rounds of `per_thread` handoffs, each between `pthread_barrier_wait(&start)` and
/// `pthread_barrier_wait(&end)`. Main starts both players, prints `ready`, waits for a line
/// on stdin (the tool attached), then times each round and prints `round NS` (wall time per
/// handoff); `setup` is a C condition checked first (exit 2 when false), `done` the
/// arguments of the final `printf` (a use of the players' result keeps their work).
/// Usage: PROGRAM HANDOFFS ROUNDS.
pub fn two_player_rounds_c(players: &str, setup: &str, done: &str) -> String {
    TWO_PLAYER_ROUNDS_C.replace("@PLAYERS@", players).replace("@SETUP@", setup).replace("@DONE@", done)
}

/// The template of [`two_player_rounds_c`]: `@PLAYERS@`, `@SETUP@` and `@DONE@` mark where
/// its arguments go.
const TWO_PLAYER_ROUNDS_C: &str = include_str!("../../programs/two_player_rounds.c.in");

/// Writes `source` to `dir/<name>.c` and compiles it with gcc and `flags` into `dir/<name>`.
pub fn compile_c(dir: &Path, name: &str, source: &str, flags: &[&str]) -> Result<std::path::PathBuf> {
    let (src, bin) = (dir.join(format!("{name}.c")), dir.join(name));
    std::fs::write(&src, source).with_context(|| format!("failed to write {}", src.display()))?;
    let status = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .args([&bin, &src])
        .status()
        .context("failed to run gcc; run `cargo xtask setup`")?;
    if !status.success() {
        bail!("gcc failed to compile {} ({status})", src.display());
    }
    Ok(bin)
}

/// `kernel.bpf_stats_enabled=1` while alive, then the previous value again.
pub struct BpfStats {
    previous: String,
}

impl BpfStats {
    /// Without it the kernel keeps no run_time_ns; failing only costs the ns/sample column.
    pub fn enable() -> Option<BpfStats> {
        let previous = std::fs::read_to_string(STATS_SYSCTL).ok()?;
        if previous.trim() != "0" {
            // Found on, it stays on after the bench, and every BPF program on the machine has
            // been paying two clock reads a run: not the machine users have.
            eprintln!(
                "warning: {STATS_SYSCTL} was already {} before this bench (something left it on); \
                 it is restored to that at the end: `sysctl kernel.bpf_stats_enabled=0` turns it off",
                previous.trim()
            );
        }
        match std::fs::write(STATS_SYSCTL, "1") {
            Ok(()) => Some(BpfStats { previous }),
            Err(err) => {
                eprintln!("warning: cannot enable {STATS_SYSCTL} ({err}); bpf ns/sample will be n/a");
                None
            }
        }
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Err(err) = std::fs::write(STATS_SYSCTL, self.previous.trim()) {
            eprintln!("warning: failed to restore {STATS_SYSCTL} to {} ({err})", self.previous.trim());
        }
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Survives Ctrl-C so the guards above still run: the children (same process group) get the
/// SIGINT and exit, and the caller checks `interrupted()` after each run. A handler rather
/// than SIG_IGN, because exec resets handlers while an ignored SIGINT would be inherited.
pub fn catch_interrupt() {
    let handler = on_interrupt as extern "C" fn(libc::c_int);
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, handler as libc::sighandler_t) };
}

/// Whether Ctrl-C arrived since `catch_interrupt`.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}
