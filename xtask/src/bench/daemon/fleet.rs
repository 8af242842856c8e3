//! The processes the daemon watches during the bench: busy spinners (the CPU bench's, with a
//! 16-frame stack) and idle processes that wake now and then and work for about a
//! millisecond, like the daemons of a real machine, each with as many threads as asked (the
//! others wake as often and work a tenth as long). All are killed and reaped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

use crate::bench::workload::Spinners;

/// Sleeps `argv[2]` seconds, then spins ~1 ms under two frames of its own, forever: rarely
/// on a CPU, but sampled now and then, so the daemon keeps track of every one of them. Its
/// `argv[1] - 1` other threads do the same with a tenth of the work (the daemon keeps state per
/// thread, so they are what makes a process with threads cost more).
const IDLER_C: &str = include_str!("../../../programs/idler.c");

/// Every process of the bench; dropping it ends them all.
pub struct Fleet {
    _spinners: Spinners,
    idlers: Vec<Child>,
}

impl Fleet {
    /// Compiles the programs into `dir` and starts `spinners` + `idlers` processes, each idler
    /// with `threads` threads waking every `wake_every` seconds.
    pub fn start(dir: &Path, spinners: usize, idlers: usize, threads: usize, wake_every: u64) -> Result<Fleet> {
        let spinners = Spinners::start(dir, spinners)?;
        let bin = compile(dir)?;
        let mut fleet = Fleet { _spinners: spinners, idlers: Vec::with_capacity(idlers) };
        for _ in 0..idlers {
            let child = Command::new(&bin)
                .arg(threads.to_string())
                .arg(wake_every.to_string())
                .stdin(Stdio::null())
                .spawn()
                .with_context(|| format!("failed to start {}", bin.display()))?;
            fleet.idlers.push(child);
        }
        Ok(fleet)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.idlers {
            let _ = child.kill();
        }
        for child in &mut self.idlers {
            let _ = child.wait();
        }
    }
}

fn compile(dir: &Path) -> Result<PathBuf> {
    Ok(crate::bench::cc::compile_text(dir, "idler", IDLER_C, &["-O1", "-fno-omit-frame-pointer", "-pthread"])?)
}
