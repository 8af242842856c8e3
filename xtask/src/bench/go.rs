//! `cargo xtask bench go`: what the profiler costs a Go process, next to what Go's own
//! profiler costs it from inside.
//!
//! - **Per sample**: BPF ns per CPU sample of one Go goroutine spinning, under
//!   `pprof.Do(handler=checkout)` and without labels, in interleaved rounds (medians): what
//!   reading a goroutine's labels adds to a sample.
//! - **Goroutine dumps** of a process with 100, 10,000 and 100,000 goroutines parked four
//!   frames deep (half of them labelled): `profiler threads PID` (cold: it loads its programs
//!   each time), a `/debug/pprof/goroutine?debug=1` query to a running daemon (warm), and the
//!   process's own `pprof.Lookup("goroutine").WriteTo(w, 1)`; wall and CPU time, the
//!   longest gap of the process's own 1 ms ticker while each ran (Go's own dump stops the
//!   world; ours reads memory and stops nothing), and our peak memory. The dump is on
//!   demand, so there is no ratio target; 100,000 goroutines must dump in under a second.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::report::{bpf_stats, target};
use super::threads::Daemon;
use super::{bail_if_interrupted, daemon::sample, fresh_dir, measure, workload};
use crate::workspace;

/// The workload: `goroutines N` and `spin labels|plain` modes (see its header).
const WORKLOAD_GO: &str = include_str!("../../programs/go_bench.go");
/// Its name (and so its comm), which the daemon's `[processes]` selects.
const WORKLOAD: &str = "go_bench";
/// The dump that must take under a second.
const DUMP_TARGET: Duration = Duration::from_secs(1);

#[derive(clap::Args, Debug)]
pub struct GoArgs {
    /// Rounds of each measurement (medians are shown).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Goroutine counts of the process dumped.
    #[arg(long, value_delimiter = ',', default_value = "100,10000,100000")]
    sizes: Vec<usize>,
    /// Seconds of each per-sample capture.
    #[arg(long, default_value_t = 5)]
    seconds: u32,
    /// Sampling frequency of the per-sample captures.
    #[arg(long, default_value_t = 999)]
    frequency_hz: u32,
}

pub fn run(args: &GoArgs) -> Result<()> {
    crate::setup::run(crate::setup::Needs { go: true, bench: false, privileges: true })?;
    crate::builds::build_release()?;
    let dir = fresh_dir(&workspace::target_dir().join("xtask-bench-go"))?;
    workload::catch_interrupt();
    let bin = build(&dir)?;
    per_sample(&bin, &dir, args)?;
    dumps(&bin, &dir, args)
}

/// `go build` of the workload in `dir`, with its caches there too.
fn build(dir: &Path) -> Result<PathBuf> {
    let source = dir.join("go_bench.go");
    std::fs::write(&source, WORKLOAD_GO).with_context(|| format!("failed to write {}", source.display()))?;
    let bin = dir.join(WORKLOAD);
    let output = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(&source)
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GO111MODULE", "off")
        .output()
        .context("failed to run go (apt-get install golang-go)")?;
    if !output.status.success() {
        bail!("go build of the bench workload failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(bin)
}

/// The workload, started and ready, with its stdin and stdout.
struct Workload {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Workload {
    fn start(bin: &Path, args: &[&str]) -> Result<Workload> {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("failed to start {}", bin.display()))?;
        let stdin = child.stdin.take().context("piped")?;
        let stdout = BufReader::new(child.stdout.take().context("piped")?);
        let mut workload = Workload { child, stdin, stdout };
        let ready = workload.line()?;
        if ready != "ready" {
            bail!("the Go workload said {ready:?} instead of ready");
        }
        Ok(workload)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the Go workload exited");
        }
        Ok(line.trim_end().to_string())
    }

    /// Sends `command` and returns the numbers of its answer line.
    fn ask(&mut self, command: &str) -> Result<Vec<i64>> {
        writeln!(self.stdin, "{command}")?;
        let line = self.line()?;
        let fields = line.strip_prefix(command).with_context(|| format!("answer {line:?} to {command}"))?;
        fields.split_whitespace().map(|f| f.parse().with_context(|| format!("number in {line:?}"))).collect()
    }

    /// The ticker's longest gap since the last ask (and resets it).
    fn gap(&mut self) -> Result<Duration> {
        Ok(Duration::from_nanos(self.ask("gap")?.first().copied().unwrap_or(0).max(0) as u64))
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// BPF ns per sample of a spinning goroutine with and without labels, interleaved rounds.
fn per_sample(bin: &Path, dir: &Path, args: &GoArgs) -> Result<()> {
    workspace::stage(&format!(
        "per sample: a Go spinner with and without pprof labels, {} interleaved rounds of {} s at {} Hz",
        args.rounds, args.seconds, args.frequency_hz
    ));
    let modes = ["plain", "labels"];
    let mut ns: [Vec<f64>; 2] = Default::default();
    for round in 0..args.rounds {
        for (at, mode) in modes.iter().enumerate() {
            let spinner = Workload::start(bin, &["spin", mode])?;
            let out = dir.join(format!("spin-{mode}-{round}"));
            let mut cmd = Command::new(workspace::profiler_bin());
            cmd.args(["snapshot", "--pid", &spinner.pid().to_string(), "--duration", &format!("{}s", args.seconds)])
                .args(["--frequency", &args.frequency_hz.to_string(), "--bpf-stats", "--output"])
                .arg(&out);
            let run = measure::run(cmd)?;
            drop(spinner);
            let (samples, time_ns) = bpf_stats(&run.stderr).context("no bpf-stats line for cpu_sample")?;
            if samples == 0 {
                bail!("no CPU samples of the Go spinner ({mode})");
            }
            ns[at].push(time_ns as f64 / samples as f64);
            bail_if_interrupted()?;
        }
    }
    let [plain, labels] = ns.map(median_f64);
    println!();
    println!("{:<28} {:>14}", "Go spinner", "ns per sample");
    println!("{:<28} {:>14.0}", "no labels", plain);
    println!("{:<28} {:>14.0}", "pprof.Do(handler=checkout)", labels);
    println!("labels / no labels: {:.2}", labels / plain);
    Ok(())
}

/// One dumper at one size: medians, and the worst ticker gap of its rounds.
struct Row {
    goroutines: usize,
    tool: &'static str,
    wall: Duration,
    cpu: Duration,
    worst_gap: Duration,
    /// Peak RSS (CLI) or RSS after the dumps (daemon), KiB; `None` for Go's own.
    rss_kib: Option<u64>,
}

fn dumps(bin: &Path, dir: &Path, args: &GoArgs) -> Result<()> {
    let daemon = Daemon::start(dir, WORKLOAD)?;
    let mut rows = Vec::new();
    for &size in &args.sizes {
        workspace::stage(&format!(
            "{size} goroutines: {} dumps each by the profiler (CLI, daemon) and Go",
            args.rounds
        ));
        let mut workload = Workload::start(bin, &["goroutines", &size.to_string()])?;
        let pid = workload.pid();
        let out = dir.join(format!("goroutines-{size}.txt"));
        // wall, cpu, gap per round, per tool; the CLI's peak RSS.
        let mut runs: [Vec<(Duration, Duration, Duration)>; 3] = Default::default();
        let mut cli_rss = 0;
        for _ in 0..args.rounds {
            workload.gap()?;
            let mut cli = Command::new(workspace::profiler_bin());
            cli.args(["threads", &pid.to_string(), "--debug", "1", "--output"]).arg(&out);
            let run = measure::run(cli)?;
            cli_rss = cli_rss.max(run.max_rss_kib);
            check_total(&std::fs::read_to_string(&out)?, size, "profiler threads")?;
            runs[0].push((run.wall, run.cpu, workload.gap()?));

            let (wall, cpu, text) = daemon.query_text(pid)?;
            check_total(&text, size, "the daemon's goroutine query")?;
            runs[1].push((wall, cpu, workload.gap()?));

            let own = workload.ask("dump")?;
            let ns = |at: usize| Duration::from_nanos(own.get(at).copied().unwrap_or(0).max(0) as u64);
            runs[2].push((ns(0), ns(1), workload.gap()?));
            bail_if_interrupted()?;
        }
        let daemon_rss = sample::rss_kib(daemon.pid()).ok();
        let tools = ["profiler threads (CLI, cold)", "profiler daemon query (warm)", "Go's own WriteTo(w, 1)"];
        for ((tool, runs), rss_kib) in tools.into_iter().zip(runs).zip([Some(cli_rss), daemon_rss, None]) {
            rows.push(Row {
                goroutines: size,
                tool,
                wall: median(runs.iter().map(|r| r.0).collect()),
                cpu: median(runs.iter().map(|r| r.1).collect()),
                worst_gap: runs.iter().map(|r| r.2).max().unwrap_or_default(),
                rss_kib,
            });
        }
    }
    print(&rows);
    Ok(())
}

/// The dump's first line counts at least the workload's goroutines (`goroutine profile:
/// total N`); a dump that fell back to threads, or lost goroutines, measures something else.
fn check_total(text: &str, size: usize, what: &str) -> Result<()> {
    let total = text
        .lines()
        .find_map(|l| l.strip_prefix("goroutine profile: total ")?.trim().parse::<usize>().ok())
        .with_context(|| format!("{what}: no `goroutine profile: total` line in {:?}", first_line(text)))?;
    if total < size {
        bail!("{what}: dumped {total} goroutines of the workload's {size}+");
    }
    Ok(())
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

fn print(rows: &[Row]) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!();
    println!(
        "{:>10}  {:<30} {:>10} {:>10} {:>16} {:>10}",
        "goroutines", "dumper", "wall ms", "cpu ms", "worst tick gap ms", "RSS MiB"
    );
    for r in rows {
        let rss = r.rss_kib.map_or("-".to_string(), |k| format!("{:.1}", k as f64 / 1024.0));
        println!(
            "{:>10}  {:<30} {:>10.1} {:>10.1} {:>16.1} {:>10}",
            r.goroutines,
            r.tool,
            ms(r.wall),
            ms(r.cpu),
            ms(r.worst_gap),
            rss
        );
    }
    println!("targets:");
    if let Some(largest) = rows.iter().map(|r| r.goroutines).max() {
        for tool in ["profiler threads", "profiler daemon"] {
            if let Some(r) = rows.iter().find(|r| r.goroutines == largest && r.tool.starts_with(tool)) {
                target(
                    &format!("{tool}, {largest} goroutines < 1 s"),
                    &format!("{:.0} ms", ms(r.wall)),
                    Some(r.wall < DUMP_TARGET),
                );
            }
        }
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

fn median_f64(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}
