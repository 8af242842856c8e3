//! `profiler snapshot`: a thin driver of the capture pipeline. Start a [`Capture`], drain it
//! every second for the duration (so short-lived processes are inspected while alive), then
//! render each process's kinds and write them as [`SnapshotFiles`], and print a summary.

use std::{
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant, SystemTime},
};

use crate::{
    capture::{Capture, CaptureConfig, CaptureError, DRAIN_INTERVAL},
    cli::SnapshotArgs,
    config::ConfigError,
    ebpf::Counters,
    error::Error,
    ids::Pid,
    output, preflight,
    profiles::{heap::attachment_comment, Context, Counts, ProfileKind, Settings, Source, View},
    render::{Renderer, Window},
    resolve::Namers,
    sideband::{
        latency::BOUNDS_US,
        pace::{STORM_EVENTS_PER_S, STORM_GAP},
        FollowLatency, SidebandStats,
    },
    sink::SnapshotFiles,
    unwind::UnwinderStats,
};

/// When the first drain comes: processes are registered with the unwinder after the drain
/// that first shows them, and until then their stacks fall back to frame pointers.
const FIRST_DRAIN: Duration = Duration::from_millis(200);

/// Resident memory past which the symbolizer's files are closed while the profiles are
/// written (see [`crate::symbolize::FilesBudget`]): every process seen is named at the end,
/// and the files of them all, parsed at once, were most of a snapshot's peak (197 MiB with
/// rustc, node, a JVM and an unstripped Rust binary running). The capture itself holds
/// 13-18 MiB (its executable's pages included): a lower budget only closes files more often
/// (16 MiB doubled the snapshot's CPU time for the same peak). The peak is this budget (or
/// what a close left plus [`crate::symbolize::budget::REGROWTH_BYTES`]) plus the largest
/// one file's parse: its symbol tables (libLLVM's: about 30 MiB) and at most
/// [`MAX_DEBUG_INFO_BYTES`] of DWARF.
const FILES_BUDGET_BYTES: u64 = 24 << 20;

/// Files with more DWARF than this are named from their symbol tables in a system-wide
/// snapshot: an unstripped Rust release binary's 50 MiB, read at once, was 30 MiB of the peak
/// on its own. CPython's 16 MiB (pyenv's build) still gets source lines. A snapshot of chosen
/// processes (`--pid`) names only them, so their files get their lines and inlined frames
/// whatever their size: that is what the user asked for.
const MAX_DEBUG_INFO_BYTES: u64 = 16 << 20;

/// One written profile, for the summary.
#[derive(Debug, Clone)]
pub struct Written {
    pub kind: ProfileKind,
    pub pid: Pid,
    pub name: String,
    /// The kind's headline value (CPU samples, live bytes, delay, threads).
    pub value: u64,
    pub hottest: String,
    pub path: PathBuf,
}

/// The outcome of a snapshot.
#[derive(Debug)]
pub struct Report {
    pub written: Vec<Written>,
    pub counters: Counters,
    pub interrupted: bool,
}

/// Why a snapshot failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Setup(#[from] Error),
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// A flag out of what its config key allows.
    #[error(transparent)]
    Flag(#[from] ConfigError),
}

type Result<T, E = SnapshotError> = std::result::Result<T, E>;

/// Runs a snapshot and prints its summary to stdout.
pub fn run(args: &SnapshotArgs) -> Result<Report> {
    let config = args.config()?;
    if config.is_enabled(ProfileKind::Heap) && args.pids.is_empty() {
        return Err(SnapshotError::Setup(Error::Usage(
            "heap profiling needs --pid: its probes slow every allocation of a probed process, \
             so it is attached to chosen processes only"
                .into(),
        )));
    }
    preflight::check_privileges()?;
    preflight::check_pids(&args.pids)?;
    output::ensure_writable_dir(&args.output)?;

    let pids: Vec<Pid> = args.pids.iter().copied().map(Pid).collect();
    let settings = Settings::from(&config);
    let mut capture = Capture::start(&CaptureConfig {
        pids: pids.clone(),
        kinds: config.profiles.clone(),
        settings,
        heap_max_live: args
            .heap_max_live
            .unwrap_or(profiler_common::maps::heap_live_entries(settings.heap_sample_bytes)),
        max_stacks: usize::MAX,
        max_frames: usize::MAX,
        enable_stats: args.bpf_stats,
        heartbeat: None,
        selection: Default::default(),
        shares: config.limits,
        state_dir: None,
    })?;
    if capture.has(Source::HeapProbes) {
        for &pid in &pids {
            capture.attach_heap(pid)?;
        }
    }
    tracing::info!(profiles = ?config.profiles, pids = ?args.pids, "attached; capturing");
    // One line on stderr once everything is attached: what is measured starts here (a
    // script can start its workload on it).
    let whom = if pids.is_empty() { "every process".to_string() } else { format!("{} process(es)", pids.len()) };
    // Before the line: a Ctrl-C sent once it is seen ends the capture, it does not kill it.
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    eprintln!("capturing {whom} for {:?}", args.duration);
    let start = SystemTime::now();
    let mut counts = Counts::default();
    let interrupted = capture_for(&mut capture, &mut counts, args.duration)?;
    if capture.has(Source::HeapProbes) {
        let live = capture.live()?;
        counts.set_live(&live.pids, &live.blocks);
        counts.add(&live.drained.batch);
    }
    if capture.has(Source::TaskIterator) {
        dump_threads(&mut capture, &mut counts, &pids);
    }
    let duration = start.elapsed().unwrap_or(args.duration);
    let counters = capture.counters()?;
    if args.bpf_stats {
        print_bpf_stats(&capture, &config.profiles)?;
    }
    let unwind_stats = capture.unwinder_stats();
    let follow_latency = capture.follow_latency();
    let process_events = capture.sideband_stats().0;
    let written = write(&capture, &counts, &config.profiles, settings, Window { start, duration }, &counters, args)?;
    // Detaches every program (uprobes take ~100 ms each) before the summary is printed.
    drop(capture);
    print_summary(&written, &counters, &args.output);
    print_unwind_summary(&unwind_stats);
    print_follow_latency(&follow_latency);
    if let Some(events) = process_events {
        print_process_events(&events);
    }
    Ok(Report { written, counters, interrupted })
}

/// Renders and writes every kind of every process that has it: a kind's file for each
/// process with data of that kind, and for each chosen process (`--pid`) even without: zero
/// is an answer. Heap: the probed processes.
fn write(
    capture: &Capture,
    counts: &Counts,
    kinds: &[ProfileKind],
    settings: Settings,
    window: Window,
    counters: &Counters,
    args: &SnapshotArgs,
) -> Result<Vec<Written>> {
    let renderer = Renderer {
        catalog: capture.catalog(),
        settings,
        context: Context::Snapshot,
        window,
        counters,
        kernel_addresses: true,
    };
    let mut files = SnapshotFiles::new(&args.output);
    let mut sym = Namers::new(capture.symbolizer());
    sym.symbols.set_files_budget(FILES_BUDGET_BYTES);
    if args.pids.is_empty() {
        sym.symbols.set_max_debug_info(MAX_DEBUG_INFO_BYTES);
    }
    let empty = Default::default();
    let mut written = Vec::new();
    for &kind in kinds {
        let chosen = |pid: Pid| match kind {
            ProfileKind::Heap => capture.heap_attachment(pid).is_some(),
            _ => args.pids.contains(&pid.0),
        };
        let mut pids: Vec<Pid> = counts
            .iter()
            .filter(|(pid, c)| kind.events(c) > 0 && kind != ProfileKind::Heap || chosen(*pid))
            .map(|(p, _)| p)
            .collect();
        pids.extend(args.pids.iter().map(|&p| Pid(p)).filter(|&p| chosen(p)));
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            let Some(process) = capture.catalog().process(pid) else { continue };
            let mut notes = Vec::new();
            if let (ProfileKind::Heap, Some(attachment)) = (kind, capture.heap_attachment(pid)) {
                notes.push(attachment_comment(attachment));
                if !crate::procs::exists(pid.0) {
                    notes.push(
                        "the process exited during the capture: inuse is what it had not freed when it exited".into(),
                    );
                }
            }
            let rendered =
                renderer.render(process, counts.process(pid).unwrap_or(&empty), View::of(kind), notes, &mut sym);
            let path = files.put(&rendered).map_err(SnapshotError::Setup)?;
            if args.flamegraph {
                files.put_flamegraph(&rendered).map_err(SnapshotError::Setup)?;
            }
            written.push(Written {
                kind,
                pid,
                name: rendered.name,
                value: rendered.value,
                hottest: rendered.hottest,
                path,
            });
        }
    }
    if let Some(budget) = sym.symbols.files_budget() {
        tracing::debug!(closes = budget.closes, "symbolizer files closed over the files budget");
    }
    Ok(written)
}

/// Dumps the threads of the chosen processes (`--pid`), or of every process seen, at the
/// end of the capture. A process that exited by then has no dump (said in the log).
fn dump_threads(capture: &mut Capture, counts: &mut Counts, chosen: &[Pid]) {
    let pids: Vec<Pid> = if chosen.is_empty() { counts.iter().map(|(pid, _)| pid).collect() } else { chosen.to_vec() };
    for pid in pids {
        match capture.thread_dump(pid) {
            Ok(dump) => counts.set_thread_dump(pid, std::sync::Arc::new(dump)),
            Err(CaptureError::NoProcess(_)) => tracing::info!(pid = pid.0, "exited before its threads were dumped"),
            Err(err) => tracing::warn!("{}", crate::error::chain(&err)),
        }
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Drains every [`DRAIN_INTERVAL`] until `duration` has passed or Ctrl-C is pressed (which
/// ends the capture early and still writes what was captured; its handler is installed
/// before `capturing` is printed). True when interrupted.
fn capture_for(capture: &mut Capture, counts: &mut Counts, duration: Duration) -> Result<bool> {
    let progress = std::io::stderr().is_terminal();
    let deadline = Instant::now() + duration;
    let mut interval = FIRST_DRAIN;
    loop {
        let now = Instant::now();
        let interrupted = INTERRUPTED.load(Ordering::Relaxed);
        if now >= deadline || interrupted {
            add(counts, capture.drain()?);
            if progress {
                eprint!("\r\x1b[K");
            }
            return Ok(interrupted);
        }
        if progress {
            let c = capture.counters()?;
            eprint!(
                "\r\x1b[Kcapturing: {:>4.1}s left, {} cpu samples, {} heap samples",
                (deadline - now).as_secs_f64(),
                c.cpu.samples,
                c.heap.sampled
            );
            let _ = std::io::stderr().flush();
        }
        wait_until(deadline.min(now + interval), capture, counts);
        interval = DRAIN_INTERVAL;
        add(counts, capture.drain()?);
    }
}

/// Counts a drained batch, after forgetting what was counted under pids reused since.
fn add(counts: &mut Counts, drained: crate::capture::Drained) {
    counts.forget(&drained.reused);
    counts.add(&drained.batch);
}

/// Waits in short steps so Ctrl-C is noticed promptly, following process events as they
/// come (see `Capture::follow`).
fn wait_until(when: Instant, capture: &mut Capture, counts: &mut Counts) {
    while !INTERRUPTED.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= when {
            return;
        }
        if capture.wait(None, (when - now).min(Duration::from_millis(100))).records {
            let reused = capture.follow();
            counts.forget(&reused);
        }
    }
}

/// `bpf-stats: program=... run_count=N run_time_ns=T` for each program of the kinds captured.
fn print_bpf_stats(capture: &Capture, kinds: &[ProfileKind]) -> Result<()> {
    for &program in Source::of_kinds(kinds).flat_map(Source::programs) {
        let Some(stats) = capture.program_stats(program).map_err(CaptureError::Counters)? else { continue };
        eprintln!(
            "bpf-stats: program={program} run_count={} run_time_ns={} verified_insns={}",
            stats.run_count,
            stats.run_time.as_nanos(),
            stats.verified_insns.map_or_else(|| "unknown".to_string(), |n| n.to_string())
        );
    }
    Ok(())
}

/// Rows shown before "... and N more".
const SUMMARY_ROWS: usize = 25;

fn print_summary(written: &[Written], counters: &Counters, dir: &Path) {
    let of = |kind: ProfileKind| written.iter().filter(move |w| w.kind == kind);
    let mut cpu: Vec<&Written> = of(ProfileKind::Cpu).collect();
    if !cpu.is_empty() {
        cpu.sort_by(|a, b| b.value.cmp(&a.value).then(a.pid.cmp(&b.pid)));
        println!("{:<24} {:>8} {:>9}  hottest function", "process", "pid", "samples");
        for w in cpu.iter().take(SUMMARY_ROWS) {
            println!("{:<24} {:>8} {:>9}  {}", truncate(&w.name, 24), w.pid, w.value, truncate(&w.hottest, 60));
        }
        if cpu.len() > SUMMARY_ROWS {
            println!("... and {} more processes", cpu.len() - SUMMARY_ROWS);
        }
    }
    let heap: Vec<&Written> = of(ProfileKind::Heap).collect();
    if !heap.is_empty() {
        println!("{:<24} {:>8} {:>12}  top in-use allocation site", "process", "pid", "inuse bytes");
        for w in &heap {
            println!("{:<24} {:>8} {:>12}  {}", truncate(&w.name, 24), w.pid, w.value, truncate(&w.hottest, 60));
        }
    }
    let waits: Vec<&Written> =
        written.iter().filter(|w| matches!(w.kind.source(), Source::Futex | Source::ThreadCreation)).collect();
    if !waits.is_empty() {
        println!("{:<24} {:>8} {:<12} {:>16}  top leaf function", "process", "pid", "profile", "delay ns/threads");
        for w in waits.iter().take(SUMMARY_ROWS * 3) {
            println!(
                "{:<24} {:>8} {:<12} {:>16}  {}",
                truncate(&w.name, 24),
                w.pid,
                w.kind,
                w.value,
                truncate(&w.hottest, 60)
            );
        }
        let (f, t) = (counters.futex, counters.threadcreate);
        println!(
            "futex: {} waits, {} charged to a waker, {} threads created; dropped: in-flight map full {}, block map full {}, \
             mutex map full {}, threadcreate map full {}",
            f.waits, f.mutex_charged, t.created, f.pending_map_full, f.block_map_full, f.mutex_map_full, t.map_full
        );
    }
    println!(
        "wrote {} profiles to {} ({} cpu samples, {} lost to a full map; {} heap samples, {} not tracked as live: map full, \
         {} not counted: totals map full)",
        written.len(),
        dir.display(),
        counters.cpu.samples,
        counters.cpu.counts_map_full,
        counters.heap.sampled,
        counters.heap.live_map_full,
        counters.heap.totals_map_full
    );
    let cpu = &counters.cpu;
    if cpu.ticks_due > 0 {
        println!(
            "cpu clock: {} of {} ticks missed ({:.1}%: the sampler never ran, because another BPF program or a \
             bpf() call was running on that CPU, or the timer ran late)",
            cpu.ticks_missed,
            cpu.ticks_due,
            100.0 * cpu.ticks_missed as f64 / cpu.ticks_due as f64
        );
    }
}

fn print_unwind_summary(s: &UnwinderStats) {
    const MIB: f64 = (1 << 20) as f64;
    println!(
        "unwind tables: {} files ({:.1} of {:.0} MiB), built in {:.0} ms; {} files without a table, {} too large, {} not loaded (memory full); {} process registrations refused (process maps full)",
        s.tables.len(),
        s.table_bytes as f64 / MIB,
        s.budget_bytes as f64 / MIB,
        s.build_time.as_secs_f64() * 1e3,
        s.build_failures,
        s.too_large,
        s.budget_full,
        s.process_maps_full
    );
    for t in &s.tables {
        tracing::debug!(file = %t.name, rows = t.rows, bytes = t.bytes, build_ms = t.build_duration.as_secs_f64() * 1e3, "unwind table");
    }
}

/// How long exec'd processes waited for their unwind tables (the samples they had meanwhile
/// were walked with frame pointers only); printed when any process exec'd.
fn print_follow_latency(l: &FollowLatency) {
    if l.count() == 0 && l.exited_unregistered == 0 {
        return;
    }
    let buckets: Vec<String> = BOUNDS_US
        .iter()
        .zip(&l.buckets)
        .map(|(bound, count)| format!("{count} ≤{}ms", *bound as f64 / 1e3))
        .chain(std::iter::once(format!("{} above", l.buckets[BOUNDS_US.len()])))
        .collect();
    println!(
        "exec'd processes registered with the unwinder: {} ({}), slowest {:.1} ms; {} exited before they were",
        l.count(),
        buckets.join(", "),
        l.max_us as f64 / 1e3,
        l.exited_unregistered
    );
}

/// What the side band delivered: a lost record is a process or mapping not followed, and
/// under storm pacing a new process waits for its registration until it is first walked
/// (the walker asks for it) or the gap is over.
fn print_process_events(events: &SidebandStats) {
    println!(
        "process events: {} read, {} lost (rings full); {:.1} s at over {} a second (read every {} ms); \
         {} registrations asked by walkers",
        events.events,
        events.lost,
        events.storm_time.as_secs_f64(),
        STORM_EVENTS_PER_S,
        STORM_GAP.as_millis(),
        events.asks
    );
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
