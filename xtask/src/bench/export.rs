//! `cargo xtask bench export`: what `[[export]]` costs. Among the daemon bench's fleet (a
//! tenth spinning, the rest idle), two `profiler run` at 19 Hz with a 10 s interval run side
//! by side in one invocation: one without export, one pushing every interval to a local
//! stand-in backend ([`backend`]: accepts and counts, decodes nothing). Compared: each
//! daemon's own CPU time and steady RSS (the second half's median). Then the backend goes down for an outage: the
//! backlog the spool holds when it comes back, the RSS meanwhile, and how fast the backlog
//! drains (profiles and bytes per second of the exporter's own pushes).

mod backend;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::all::{Bar, Headline, Unit};
use super::daemon::{fleet::Fleet, sample, Daemon, INTERVAL};
use super::report::target;
use super::{bail_if_interrupted, workload};
use crate::workspace;

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// Processes running while the daemon is measured; a tenth of them spin.
    #[arg(long, default_value_t = 200)]
    processes: usize,
    /// Minutes of each measured run (export off, export on).
    #[arg(long, default_value_t = 5)]
    minutes: u64,
    /// Minutes the backend is down.
    #[arg(long, default_value_t = 10)]
    outage_minutes: u64,
}

const FREQUENCY_HZ: u32 = 19;
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Not measured: a daemon's first interval symbolizes every process it meets, whatever
/// the export does.
const WARMUP: Duration = Duration::from_secs(30);
/// Targets: export may cost a fifth more CPU and 8 MiB more resident memory.
const MAX_CPU_RATIO: f64 = 1.2;
const MAX_RSS_GROWTH_MIB: f64 = 8.0;
/// How long the drain may take before the bench gives up waiting.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

/// One measured run.
struct Run {
    cpu: Duration,
    length: Duration,
    rss_kib: Vec<u64>,
}

impl Run {
    fn cpu_percent(&self) -> f64 {
        100.0 * self.cpu.as_secs_f64() / self.length.as_secs_f64()
    }

    /// The median of the second half's samples: after start-up, before anything else.
    fn steady_rss_mib(&self) -> f64 {
        let mut late = self.rss_kib[self.rss_kib.len() / 2..].to_vec();
        late.sort_unstable();
        late.get(late.len() / 2).copied().unwrap_or(0) as f64 / 1024.0
    }
}

pub fn run(args: &ExportArgs) -> Result<()> {
    if args.minutes == 0 || args.processes == 0 {
        bail!("need at least one minute and one process");
    }
    crate::setup::prepare_bench()?;
    let (dir, _fleet, mut backend) = fleet_and_backend(args.processes)?;
    workload::catch_interrupt();
    let (quiet, daemon, [off, on]) = side_by_side(&dir, &backend, Duration::from_secs(args.minutes * 60))?;
    let pushed = backend.requests();
    bail_if_interrupted()?;

    let outage = Duration::from_secs(args.outage_minutes * 60);
    workspace::stage(&format!("backend down for {} min", args.outage_minutes));
    backend.stop();
    // The quiet daemon runs on as the reference: the machine's processes change meanwhile.
    let [quiet_during, during] = measure(&[&quiet, &daemon], outage)?;
    quiet.stop()?;
    let status = sample::get(&daemon.socket, "/status")?;
    let backlog = sample::json_number_in(&status, &["export", "queue_depth"]).unwrap_or(0);
    workspace::stage(&format!("backend back: draining {backlog} queued profiles"));
    let (before_requests, before_bytes) = (backend.requests(), backend.bytes());
    backend.restart()?;
    let restarted = Instant::now();
    let drained = wait_drained(&daemon)?;
    let done = Instant::now();
    // The sink finds the backend back at its next try (up to max_backoff later); the drain
    // rate is that of its pushes from then on.
    let first = backend.first_request().unwrap_or(restarted);
    let (found, drain) = (first.duration_since(restarted), done.duration_since(first));
    let (requests, bytes) = (backend.requests() - before_requests, backend.bytes() - before_bytes);
    daemon.stop()?;

    print(&[&off, &on, &quiet_during, &during], pushed, backlog, drained.then_some((found, drain)), requests, bytes);
    println!("(profiles and logs kept in {})", dir.display());
    Ok(())
}

/// `bench all --quick`: export off and on side by side among 200 processes for 30 s after
/// the warm-up, no outage; CPU and RSS with export on against without.
pub fn quick() -> Result<Vec<Headline>> {
    let (dir, _fleet, backend) = fleet_and_backend(200)?;
    let (quiet, daemon, [off, on]) = side_by_side(&dir, &backend, Duration::from_secs(30))?;
    quiet.stop()?;
    daemon.stop()?;
    println!(
        "export off: CPU {:.3}%, steady RSS {:.1} MiB; export on ({} pushes): CPU {:.3}%, steady RSS {:.1} MiB",
        off.cpu_percent(),
        off.steady_rss_mib(),
        backend.requests(),
        on.cpu_percent(),
        on.steady_rss_mib()
    );
    let ratio = on.cpu.as_secs_f64() / off.cpu.as_secs_f64().max(1e-9);
    let growth = on.steady_rss_mib() - off.steady_rss_mib();
    Ok(vec![
        Headline::new("export", "daemon CPU, export on / off", Some(ratio), Bar::AtMost(MAX_CPU_RATIO), Unit::Ratio),
        Headline::new(
            "export",
            "steady RSS, export on - off",
            Some(growth),
            Bar::AtMost(MAX_RSS_GROWTH_MIB),
            Unit::Mib,
        ),
    ])
}

/// A fresh bench directory, the fleet of `processes` (a tenth spinning) and the backend.
fn fleet_and_backend(processes: usize) -> Result<(PathBuf, Fleet, backend::Backend)> {
    let dir = workspace::target_dir().join("xtask-bench/export");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let spinners = (processes / 10).max(1);
    let idlers = processes - spinners.min(processes);
    workspace::stage(&format!("starting {spinners} spinners and {idlers} idle processes"));
    let fleet = Fleet::start(&dir, spinners, idlers, 1, 1)?;
    Ok((dir, fleet, backend::Backend::start()?))
}

/// Both daemons at once, on the same fleet at the same time: neither pays for the other's
/// page cache or the fleet's start, and each one's own CPU time is its own. Returns the
/// daemon without export, the one with, and their runs over `length` after [`WARMUP`].
fn side_by_side(dir: &Path, backend: &backend::Backend, length: Duration) -> Result<(Daemon, Daemon, [Run; 2])> {
    workspace::stage(&format!(
        "export off and on side by side (pyroscope to 127.0.0.1:{}), profiler run at {FREQUENCY_HZ} Hz for {} s \
         after {} s of warm-up",
        backend.port(),
        length.as_secs(),
        WARMUP.as_secs()
    ));
    let (off_dir, on_dir) = (dir.join("off"), dir.join("on"));
    for sub in [&off_dir, &on_dir] {
        std::fs::create_dir_all(sub).with_context(|| format!("failed to create {}", sub.display()))?;
    }
    let export = format!(
        "\n[[export]]\nname = \"bench\"\nprotocol = \"pyroscope\"\nurl = \"http://127.0.0.1:{}\"\n",
        backend.port()
    );
    let quiet = Daemon::start(&off_dir, &off_dir.join("out"), FREQUENCY_HZ, "")?;
    let daemon = Daemon::start(&on_dir, &on_dir.join("out"), FREQUENCY_HZ, &export)?;
    std::thread::sleep(WARMUP);
    let runs = measure(&[&quiet, &daemon], length)?;
    Ok((quiet, daemon, runs))
}

/// Each daemon's CPU time over `length` and its RSS every [`SAMPLE_EVERY`].
fn measure<const N: usize>(daemons: &[&Daemon; N], length: Duration) -> Result<[Run; N]> {
    let pids = daemons.map(|d| d.pid());
    let started = Instant::now();
    let mut cpu_start = [Duration::ZERO; N];
    let mut rss_kib: [Vec<u64>; N] = std::array::from_fn(|_| Vec::new());
    for (i, &pid) in pids.iter().enumerate() {
        cpu_start[i] = sample::cpu_time(pid)?;
        rss_kib[i].push(sample::rss_kib(pid)?);
    }
    while started.elapsed() < length {
        std::thread::sleep(SAMPLE_EVERY.min(length.saturating_sub(started.elapsed())));
        bail_if_interrupted()?;
        let mut line = format!("    t={:>4.0}s", started.elapsed().as_secs_f64());
        for (i, &pid) in pids.iter().enumerate() {
            rss_kib[i].push(sample::rss_kib(pid)?);
            let cpu = (sample::cpu_time(pid)? - cpu_start[i]).as_secs_f64();
            line += &format!("  [{i}] cpu={cpu:>6.2}s rss={:>6.1}MiB", *rss_kib[i].last().unwrap() as f64 / 1024.0);
        }
        println!("{line}");
    }
    let length = started.elapsed();
    let mut runs = Vec::with_capacity(N);
    for (i, &pid) in pids.iter().enumerate() {
        runs.push(Run { cpu: sample::cpu_time(pid)? - cpu_start[i], length, rss_kib: std::mem::take(&mut rss_kib[i]) });
    }
    Ok(runs.try_into().unwrap_or_else(|_| unreachable!("one run per daemon")))
}

/// Waits until the sink has nothing queued; false after [`DRAIN_TIMEOUT`].
fn wait_drained(daemon: &Daemon) -> Result<bool> {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while Instant::now() < deadline {
        let status = sample::get(&daemon.socket, "/status")?;
        if sample::json_number_in(&status, &["export", "queue_depth"]) == Some(0) {
            return Ok(true);
        }
        bail_if_interrupted()?;
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(false)
}

/// `runs`: export off and on side by side, then both again while the backend is down.
fn print(runs: &[&Run; 4], pushed: u64, backlog: u64, drain: Option<(Duration, Duration)>, requests: u64, bytes: u64) {
    let [off, on, quiet_during, during] = *runs;
    println!();
    println!("{:<40} {:>10} {:>14} {:>9}", "", "CPU %", "steady RSS MiB", "peak MiB");
    let row = |name: &str, run: &Run| {
        println!("{name:<40} {:>10.3} {:>14.1} {:>9.1}", run.cpu_percent(), run.steady_rss_mib(), peak(run));
    };
    row("export off", off);
    row(&format!("export on ({pushed} pushes)"), on);
    row("export off, while the backend is down", quiet_during);
    row("export on, while the backend is down", during);
    let ratio = on.cpu.as_secs_f64() / off.cpu.as_secs_f64().max(1e-9);
    let growth = on.steady_rss_mib() - off.steady_rss_mib();
    let outage_growth = during.steady_rss_mib() - quiet_during.steady_rss_mib();
    println!();
    println!("targets:");
    target(&format!("CPU on/off <= {MAX_CPU_RATIO}x"), &format!("{ratio:.2}x"), Some(ratio <= MAX_CPU_RATIO));
    target(
        &format!("RSS on - off <= {MAX_RSS_GROWTH_MIB} MiB"),
        &format!("{growth:+.1} MiB"),
        Some(growth <= MAX_RSS_GROWTH_MIB),
    );
    target(
        &format!("outage: RSS on - off <= {MAX_RSS_GROWTH_MIB} MiB"),
        &format!("{outage_growth:+.1} MiB"),
        Some(outage_growth <= MAX_RSS_GROWTH_MIB),
    );
    match drain {
        Some((found, drain)) => {
            let seconds = drain.as_secs_f64().max(1e-3);
            println!(
                "backlog of {backlog} profiles ({} intervals): the sink's next try came {:.1} s after the backend was back, \
                 then drained in {seconds:.1} s: {:.0} profiles/s, {:.2} MiB/s in {requests} requests",
                during.length.as_secs() / INTERVAL.as_secs(),
                found.as_secs_f64(),
                backlog as f64 / seconds,
                bytes as f64 / seconds / (1 << 20) as f64
            );
        }
        None => println!("backlog of {backlog} profiles not drained within {DRAIN_TIMEOUT:?}"),
    }
}

fn peak(run: &Run) -> f64 {
    run.rss_kib.iter().max().copied().unwrap_or(0) as f64 / 1024.0
}
