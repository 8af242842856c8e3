//! The processes the daemon watches during the bench: busy spinners (the CPU bench's, with a
//! 16-frame stack) and idle processes that wake once a second and work for about a
//! millisecond, like the daemons of a real machine. All are killed and reaped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

use crate::bench::workload::Spinners;

/// Sleeps a second, then spins ~1 ms under two frames of its own, forever: rarely on a CPU,
/// but sampled now and then, so the daemon keeps track of every one of them.
const IDLER_C: &str = r#"
#include <time.h>
#include <unistd.h>
static volatile unsigned long sink;
__attribute__((noinline)) static void chore(void) {
    for (unsigned long i = 0; i < 1000000; i++)
        sink += i;
}
__attribute__((noinline)) static void wake(void) {
    chore();
    sink++;
}
int main(void) {
    for (;;) {
        sleep(1);
        wake();
    }
}
"#;

/// Every process of the bench; dropping it ends them all.
pub struct Fleet {
    _spinners: Spinners,
    idlers: Vec<Child>,
}

impl Fleet {
    /// Compiles the programs into `dir` and starts `spinners` + `idlers` processes.
    pub fn start(dir: &Path, spinners: usize, idlers: usize) -> Result<Fleet> {
        let spinners = Spinners::start(dir, spinners)?;
        let bin = compile(dir)?;
        let mut fleet = Fleet { _spinners: spinners, idlers: Vec::with_capacity(idlers) };
        for _ in 0..idlers {
            let child = Command::new(&bin)
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
    crate::bench::workload::compile_c(dir, "idler", IDLER_C, &["-O1", "-fno-omit-frame-pointer"])
}
