//! The benchmark's environment: CPU spinners that give both tools the same stacks to sample,
//! and `kernel.bpf_stats_enabled` switched on for the run. Both undo themselves on drop, so
//! an early error or panic leaves no spinner burning CPU and no sysctl changed.

use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};

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
    Ok(crate::bench::cc::compile_text(dir, "spin", SPINNER_C, &["-O1", "-fno-omit-frame-pointer", "-fno-shrink-wrap"])?)
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    fn programs() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("programs")
    }

    fn files_ending(suffix: &str) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(programs())
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.to_str().unwrap().ends_with(suffix))
            .collect();
        files.sort();
        files
    }

    /// Every program in `xtask/programs/` builds from its file with the shared helper: each
    /// whole `*.c` as it is, and each `*.inc.c` fragment inside the two-player template.
    #[test]
    fn every_program_compiles_from_its_file() {
        let dir = std::env::temp_dir().join(format!("xtask-programs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let whole: Vec<PathBuf> =
            files_ending(".c").into_iter().filter(|p| !p.to_str().unwrap().ends_with(".inc.c")).collect();
        let fragments = files_ending(".inc.c");
        assert!(whole.len() >= 5 && fragments.len() >= 2, "{whole:?} {fragments:?}");
        for path in &whole {
            let name = path.file_stem().unwrap().to_str().unwrap();
            let text = std::fs::read_to_string(path).unwrap();
            crate::bench::cc::compile_text(&dir, name, &text, &["-O1", "-pthread"]).unwrap_or_else(|e| panic!("{e}"));
        }
        for path in &fragments {
            let name = path.file_stem().unwrap().to_str().unwrap().replace(".inc", "");
            let text = super::two_player_rounds_c(&std::fs::read_to_string(path).unwrap(), "1", r#""done\n""#);
            crate::bench::cc::compile_text(&dir, &name, &text, &["-O1", "-pthread"]).unwrap_or_else(|e| panic!("{e}"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Each marker of the template is there once, so each argument lands in one place.
    #[test]
    fn the_template_has_each_marker_once() {
        for marker in ["@PLAYERS@", "@SETUP@", "@DONE@"] {
            assert_eq!(super::TWO_PLAYER_ROUNDS_C.matches(marker).count(), 1, "{marker}");
        }
        let program = super::two_player_rounds_c("P", "S", "D");
        assert!(!program.contains('@'), "a marker left in:\n{program}");
    }
}
