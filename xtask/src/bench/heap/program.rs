//! The measured program: a malloc(64) + free loop timed with `clock_gettime`, started paused
//! so probes can be attached before the timed part, and killed and reaped on drop.
//!
//! Its protocol: `malloc_bench PAIRS ROUNDS` warms up, prints `ready`, waits for a line on
//! stdin, then runs ROUNDS rounds of PAIRS / ROUNDS pairs, printing `round NS_PER_PAIR` after
//! each and `done` at the end. Never released, it just sleeps in `read`: the unselected
//! process of the last run is a second copy of it left waiting.

use std::io::{BufRead, BufReader, Lines, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{bail, Context, Result};

/// Every block is written and its address folded into a global that main prints, so the
/// allocation cannot be optimised away; -fno-builtin-malloc/free (see `compile`) stop GCC from
/// deleting the malloc/free pair outright.
const MALLOC_BENCH_C: &str = include_str!("../../../programs/malloc_bench.c");

/// Compiles the program into `dir`; returns the binary.
pub fn compile(dir: &Path) -> Result<PathBuf> {
    Ok(crate::bench::cc::compile_text(
        dir,
        "malloc_bench",
        MALLOC_BENCH_C,
        &["-O1", "-fno-builtin-malloc", "-fno-builtin-free"],
    )?)
}

/// One paused copy of the program.
pub struct MallocBench {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl MallocBench {
    /// Starts `bin` for `pairs` pairs in `rounds` rounds; returns once it is `ready`.
    pub fn start(bin: &Path, pairs: u64, rounds: u32) -> Result<MallocBench> {
        let mut child = Command::new(bin)
            .args([pairs.to_string(), rounds.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("failed to start {}", bin.display()))?;
        let stdin = child.stdin.take().context("stdin was piped")?;
        let stdout = child.stdout.take().context("stdout was piped")?;
        let mut bench = MallocBench { child, stdin, lines: BufReader::new(stdout).lines() };
        let first = bench.next_line()?;
        if first != "ready" {
            bail!("{} printed {first:?} instead of `ready`", bin.display());
        }
        Ok(bench)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Releases the timed loop and returns each round's ns per malloc+free pair.
    pub fn run(mut self) -> Result<Vec<f64>> {
        writeln!(self.stdin, "go").context("failed to release the malloc bench")?;
        let mut rounds = Vec::new();
        loop {
            let line = self.next_line()?;
            if let Some(ns) = line.strip_prefix("round ") {
                rounds.push(ns.trim().parse().with_context(|| format!("bad line {line:?}"))?);
            } else if line.starts_with("done") {
                return Ok(rounds);
            } else {
                bail!("unexpected line {line:?} from the malloc bench");
            }
        }
    }

    fn next_line(&mut self) -> Result<String> {
        match self.lines.next() {
            Some(line) => line.context("failed to read the malloc bench's stdout"),
            None => bail!("the malloc bench exited early ({:?})", self.child.try_wait()),
        }
    }
}

impl Drop for MallocBench {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The C library the process maps, from /proc/PID/maps: the file the probes must go on.
pub fn libc_path(pid: u32) -> Result<String> {
    let maps_path = format!("/proc/{pid}/maps");
    let maps = std::fs::read_to_string(&maps_path).with_context(|| format!("failed to read {maps_path}"))?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| is_libc(path))
        .map(str::to_owned)
        .with_context(|| format!("no libc mapping in {maps_path}"))
}

/// `.../libc.so.6` or `.../libc-2.31.so`, not `libcap.so` or `libcrypt.so`.
fn is_libc(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libc.so") || (name.starts_with("libc-") && name.ends_with(".so"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_libc_by_file_name() {
        assert!(is_libc("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(is_libc("/lib/x86_64-linux-gnu/libc-2.31.so"));
        assert!(!is_libc("/usr/lib/x86_64-linux-gnu/libcap.so.2"));
        assert!(!is_libc("/usr/lib/x86_64-linux-gnu/libcrypt.so.1"));
    }
}
