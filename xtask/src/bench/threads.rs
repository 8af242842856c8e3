//! `cargo xtask bench threads`: what a thread dump costs, next to `eu-stack -p PID` on the
//! same process in the same run, at 10, 100 and 1,000 threads: wall and CPU time of
//! `profiler threads PID` (cold: it loads its program and builds tables each time), of a
//! `/debug/pprof/goroutine` query to a running daemon (warm), and of eu-stack; and the worst
//! pause of the process's own 1 ms watchdog while each dumps it (eu-stack ptrace-stops every
//! thread; the profiler stops none).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::all::{Bar, Headline, Unit};
use super::{bail_if_interrupted, daemon::sample, fresh_dir, measure, workload};
use crate::workspace;

/// N threads blocked 8 frames deep in a condition wait, a 1 ms watchdog that notes its late
/// wakeups, and a main thread that prints them when SIGUSR1 ends its wait.
const WORKLOAD_C: &str = include_str!("../../programs/thread_waiters.c");

/// The workload's name, which the daemon's `[processes]` selects.
const WORKLOAD: &str = "thr_bench";

#[derive(clap::Args, Debug)]
pub struct ThreadsArgs {
    /// Dumps per tool and size (the median is shown).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Thread counts of the process dumped.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    sizes: Vec<usize>,
}

/// One tool at one size: median wall and CPU per dump, worst watchdog pause while it ran.
struct Row {
    threads: usize,
    tool: &'static str,
    wall: Duration,
    cpu: Duration,
    worst_pause: Duration,
}

pub fn run(args: &ThreadsArgs) -> Result<()> {
    crate::setup::prepare_bench()?;
    dump_all(args).map(|_| ())
}

/// `bench all --quick`: one dump per tool of a process of 10 threads, and ours against
/// eu-stack's wall time.
pub fn quick() -> Result<Vec<Headline>> {
    let size = 10;
    let rows = dump_all(&ThreadsArgs { rounds: 1, sizes: vec![size] })?;
    let wall = |tool: &str| rows.iter().find(|r| r.tool.starts_with(tool)).map(|r| r.wall.as_secs_f64());
    let vs_eu_stack = |tool: &str| Some(wall(tool)? / wall("eu-stack")?);
    Ok([("profiler threads", "CLI, cold"), ("profiler daemon", "daemon query, warm")]
        .into_iter()
        .map(|(tool, what)| {
            let figure = format!("{size} threads, {what}: wall / eu-stack's");
            Headline::new("threads", &figure, vs_eu_stack(tool), Bar::Below(1.0), Unit::Ratio)
        })
        .collect())
}

/// Every size, `--rounds` dumps per tool; prints the table and returns its rows.
fn dump_all(args: &ThreadsArgs) -> Result<Vec<Row>> {
    if Command::new("eu-stack").arg("--version").output().is_err() {
        bail!("eu-stack is missing: apt-get install elfutils (cargo xtask setup --for-test installs it)");
    }
    let dir = workspace::target_dir().join("xtask-bench-threads");
    fresh_dir(&dir)?;
    workload::catch_interrupt();
    let bin = crate::bench::cc::compile_text(&dir, WORKLOAD, WORKLOAD_C, &["-O2", "-fomit-frame-pointer", "-pthread"])?;
    let daemon = Daemon::start(&dir, WORKLOAD)?;
    let mut rows = Vec::new();
    for &threads in &args.sizes {
        workspace::stage(&format!(
            "{threads} threads: {} dumps each by the profiler (CLI, daemon) and eu-stack",
            args.rounds
        ));
        rows.extend(measure_size(&bin, &daemon, threads, args.rounds)?);
        bail_if_interrupted()?;
    }
    print(&rows, &args.sizes);
    Ok(rows)
}

fn measure_size(bin: &Path, daemon: &Daemon, threads: usize, rounds: usize) -> Result<Vec<Row>> {
    let mut workload = Workload::start(bin, threads)?;
    let pid = workload.child.id();
    let out = workload.dir.join(format!("threads-{threads}.txt"));
    let mut runs: [Vec<Timed>; 3] = Default::default();
    for _ in 0..rounds {
        let mut cli = Command::new(workspace::profiler_bin());
        cli.args(["threads", &pid.to_string(), "--debug", "1", "--output"]).arg(&out);
        runs[0].push(timed(|| measure::run(cli).map(|r| (r.wall, r.cpu)))?);
        runs[1].push(timed(|| daemon.query(pid))?);
        let mut eu = Command::new("eu-stack");
        eu.args(["-p", &pid.to_string()]);
        runs[2].push(timed(|| measure::run(eu).map(|r| (r.wall, r.cpu)))?);
        bail_if_interrupted()?;
    }
    let pauses = workload.finish()?;
    let tools = ["profiler threads (CLI, cold)", "profiler daemon query (warm)", "eu-stack -p"];
    Ok(tools
        .into_iter()
        .zip(runs)
        .map(|(tool, runs)| {
            let windows: Vec<(i64, i64)> = runs.iter().map(|r| r.2).collect();
            Row {
                threads,
                tool,
                wall: median(runs.iter().map(|r| r.0).collect()),
                cpu: median(runs.iter().map(|r| r.1).collect()),
                worst_pause: Duration::from_nanos(worst_in(&pauses, &windows) as u64),
            }
        })
        .collect())
}

/// One dump: its wall and CPU time, and the CLOCK_MONOTONIC window (ns) it ran in.
type Timed = (Duration, Duration, (i64, i64));

/// Runs `f`, noting the CLOCK_MONOTONIC window it ran in.
fn timed(f: impl FnOnce() -> Result<(Duration, Duration)>) -> Result<Timed> {
    let start = monotonic_ns();
    let (wall, cpu) = f()?;
    Ok((wall, cpu, (start, monotonic_ns())))
}

fn print(rows: &[Row], sizes: &[usize]) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!();
    println!("{:>8}  {:<30} {:>12} {:>12} {:>24}", "threads", "tool", "wall ms", "cpu ms", "worst watchdog pause ms");
    for r in rows {
        println!(
            "{:>8}  {:<30} {:>12.1} {:>12.1} {:>24.1}",
            r.threads,
            r.tool,
            ms(r.wall),
            ms(r.cpu),
            ms(r.worst_pause)
        );
    }
    let at = |threads: usize, tool: &str| rows.iter().find(|r| r.threads == threads && r.tool.starts_with(tool));
    for tool in ["profiler threads", "profiler daemon"] {
        let faster = sizes.iter().all(|&n| match (at(n, tool), at(n, "eu-stack")) {
            (Some(ours), Some(theirs)) => ours.wall < theirs.wall,
            _ => false,
        });
        println!("{tool}: faster than eu-stack at every size: {}", if faster { "PASS" } else { "MISS" });
    }
    if let (Some(&small), Some(&large)) = (sizes.iter().rev().nth(1), sizes.last()) {
        for tool in ["profiler threads", "profiler daemon", "eu-stack"] {
            if let (Some(a), Some(b)) = (at(small, tool), at(large, tool)) {
                let per = |r: &Row| ms(r.wall) / r.threads as f64;
                println!(
                    "{tool}: {:.3} ms/thread at {small} threads, {:.3} at {large} (ratio {:.2}; linear is ≤ 1)",
                    per(a),
                    per(b),
                    per(b) / per(a)
                );
            }
        }
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// The largest late wakeup of the watchdog that overlaps one of `windows`.
fn worst_in(pauses: &[(i64, i64)], windows: &[(i64, i64)]) -> i64 {
    let inside = |at: i64, late: i64| windows.iter().any(|&(s, e)| at + 1_000_000 + late >= s && at <= e);
    pauses.iter().filter(|&&(at, late)| inside(at, late)).map(|&(_, late)| late).max().unwrap_or(0)
}

fn monotonic_ns() -> i64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec * 1_000_000_000 + t.tv_nsec
}

/// The process dumped: started, waited for, and asked (SIGUSR1) for its watchdog's record.
struct Workload {
    child: Child,
    dir: PathBuf,
}

impl Workload {
    fn start(bin: &Path, threads: usize) -> Result<Workload> {
        let mut child = Command::new(bin)
            .arg(threads.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("failed to start the workload")?;
        let mut ready = [0u8; 6];
        child.stdout.as_mut().context("piped")?.read_exact(&mut ready).context("the workload did not start")?;
        let dir = bin.parent().context("a directory")?.to_path_buf();
        Ok(Workload { child, dir })
    }

    /// Ends the workload and returns its late wakeups (start, lateness), in ns.
    fn finish(&mut self) -> Result<Vec<(i64, i64)>> {
        // SAFETY: kill has no memory-safety preconditions; the child is ours and unreaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGUSR1) };
        let mut text = String::new();
        self.child.stdout.as_mut().context("piped")?.read_to_string(&mut text)?;
        let _ = self.child.wait();
        Ok(text
            .lines()
            .filter_map(|l| {
                let mut f = l.strip_prefix("pause ")?.split(' ');
                Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
            })
            .collect())
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `profiler run` serving thread dumps of the workload (also `bench go`'s).
pub(super) struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    /// Starts `profiler run` in `dir`, selecting the processes called `workload`.
    pub(super) fn start(dir: &Path, workload: &str) -> Result<Daemon> {
        let socket = dir.join("profiler.sock");
        let config = dir.join("profiler.toml");
        let text = format!(
            "output_dir = {:?}\nprofiles = [\"threads\"]\n\n[socket]\npath = {socket:?}\n\n[retention]\n\
             min_free_bytes = \"0B\"\n\n[processes]\ninclude = [{{ name = \"{workload}\" }}]\n",
            dir.join("out")
        );
        std::fs::write(&config, text).with_context(|| format!("failed to write {}", config.display()))?;
        let log = std::fs::File::create(dir.join("profiler.log"))?;
        let child = Command::new(workspace::profiler_bin())
            .args(["run", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("failed to start profiler run")?;
        let daemon = Daemon { child, socket };
        let deadline = Instant::now() + Duration::from_secs(60);
        while sample::get(&daemon.socket, "/status").is_err() {
            if Instant::now() > deadline {
                bail!("profiler run did not answer within 60 s; see {}", dir.join("profiler.log").display());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(daemon)
    }

    /// One `goroutine?debug=1` query: its wall time and the daemon's CPU time for it.
    fn query(&self, pid: u32) -> Result<(Duration, Duration)> {
        self.query_text(pid).map(|(wall, cpu, _)| (wall, cpu))
    }

    /// [`Daemon::query`] with the answer's text.
    pub(super) fn query_text(&self, pid: u32) -> Result<(Duration, Duration, String)> {
        let cpu = sample::cpu_time(self.child.id())?;
        let started = Instant::now();
        let text = sample::get(&self.socket, &format!("/debug/pprof/goroutine?pid={pid}&debug=1"))?;
        let wall = started.elapsed();
        Ok((wall, sample::cpu_time(self.child.id())?.saturating_sub(cpu), text))
    }

    /// The daemon's pid (for its RSS).
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
