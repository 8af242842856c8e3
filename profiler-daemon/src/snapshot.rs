//! `profiler snapshot`: attach, capture for a fixed time (draining every second so short-lived
//! processes are inspected while alive), then symbolize, encode and write one profile per
//! process and type, and print a summary.

use std::{
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant, SystemTime},
};

use crate::{
    aggregate::{Aggregate, Counts, KnownProcess},
    cli::SnapshotArgs,
    config::ProfileKind,
    ebpf::{Counters, HeapAttachment, Session, SessionConfig},
    error::{Error, Result},
    output, pprof, preflight, primitive, procs, profiles,
    resolve::{self, ResolvedProfile},
    symbolize::Symbolizer,
    unwind::{self, Unwinder},
};

/// How often the maps are drained during a capture.
const DRAIN_INTERVAL: Duration = Duration::from_secs(1);

/// When the first drain comes, see `capture`.
const FIRST_DRAIN: Duration = Duration::from_millis(200);

/// Time per drain spent registering newly seen processes with the unwinder (building their
/// tables); the rest wait for the next drain.
const UNWIND_SYNC_BUDGET: Duration = Duration::from_millis(250);

/// One written profile, for the summary.
#[derive(Debug, Clone)]
pub struct Written {
    pub kind: ProfileKind,
    pub pid: u32,
    pub name: String,
    /// CPU: samples. Heap: estimated live bytes.
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

/// Runs a snapshot and prints its summary to stdout.
pub fn run(args: &SnapshotArgs) -> Result<Report> {
    let (cpu, heap) = chosen_profiles(args)?;
    let futex_kinds: Vec<ProfileKind> = FUTEX_KINDS.into_iter().filter(|k| args.profiles.contains(k)).collect();
    let waits = futex_kinds.iter().any(|&k| k != ProfileKind::ThreadCreate);
    let threads = futex_kinds.contains(&ProfileKind::ThreadCreate);
    preflight::check_privileges()?;
    preflight::check_pids(&args.pids)?;
    output::ensure_writable_dir(&args.output)?;

    let mut session = Session::load(&SessionConfig {
        pids: args.pids.clone(),
        heap_sample_bytes: args.heap_sample_bytes,
        heap_max_live: args.heap_max_live,
        heap,
        futex: !futex_kinds.is_empty(),
        enable_stats: args.bpf_stats,
        unwind_rows: unwind::rows_for_budget(unwind::DEFAULT_TABLE_BYTES),
    })?;
    let mut unwinder = Unwinder::new(unwind::rows_for_budget(unwind::DEFAULT_TABLE_BYTES));
    // Chosen processes get their tables before the first sample, not a drain later.
    unwinder.sync(&mut session, args.pids.iter().map(|&p| (p, 0)), None)?;
    let mut agg = Aggregate::default();
    let mut counts = Counts::default();
    let mut attachments = Vec::new();
    if heap {
        for &pid in &args.pids {
            agg.track(pid);
            attachments.push(session.attach_heap(pid)?);
        }
    }
    if cpu {
        session.attach_cpu(args.frequency_hz)?;
    }
    if waits || threads {
        let attached = session.attach_futex(waits, threads)?;
        tracing::debug!(tracepoints = ?attached.attached, missing = ?attached.missing, "futex tracepoints");
    }
    tracing::info!(profiles = ?args.profiles, pids = ?args.pids, "attached; capturing");
    let start = SystemTime::now();
    let mut pipeline = Pipeline {
        session: &mut session,
        agg: &mut agg,
        counts: &mut counts,
        unwinder: &mut unwinder,
        pids: &args.pids,
    };
    let interrupted = capture(&mut pipeline, args.duration)?;
    if heap {
        // Read the live blocks, then drain once more: blocks sampled since the last drain
        // name stacks that are still in the kernel's active set.
        counts.set_live(&args.pids, &session.live_blocks()?);
        let batch = session.drain()?;
        agg.learn(&batch);
        counts.add(&batch);
    }
    let unwind_stats = unwinder.stats();
    let duration = start.elapsed().unwrap_or(args.duration);
    let counters = session.counters()?;
    if args.bpf_stats {
        print_bpf_stats(&session, cpu, heap, waits, threads)?;
    }
    drop(session);

    let meta = pprof::ProfileMeta { start, duration, comments: Vec::new() };
    let mut written = Vec::new();
    let mut sym = Symbolizer::new();
    if cpu {
        written.extend(write_cpu(&agg, &counts, &meta, &counters, args, &mut sym)?);
    }
    if heap {
        written.extend(write_heap(&agg, &counts, &meta, &counters, args, &attachments, &mut sym)?);
    }
    for &kind in &futex_kinds {
        written.extend(write_futex(kind, &agg, &counts, &meta, &counters, args, &mut sym)?);
    }
    print_summary(&written, &counters, &args.output);
    print_unwind_summary(&unwind_stats);
    Ok(Report { written, counters, interrupted })
}

/// The profile types fed by the futex and thread-creation tracepoints.
const FUTEX_KINDS: [ProfileKind; 3] = [ProfileKind::Block, ProfileKind::Mutex, ProfileKind::ThreadCreate];

/// Whether CPU and heap profiles were asked for, with the rules they come with.
fn chosen_profiles(args: &SnapshotArgs) -> Result<(bool, bool)> {
    let heap = args.profiles.contains(&ProfileKind::Heap);
    if heap && args.pids.is_empty() {
        return Err(Error::Usage(
            "heap profiling needs --pid: its probes slow every allocation of a probed process, \
             so it is attached to chosen processes only"
                .into(),
        ));
    }
    Ok((args.profiles.contains(&ProfileKind::Cpu), heap))
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Drains every [`DRAIN_INTERVAL`] until `duration` has passed or Ctrl-C is pressed (which
/// ends the capture early and still writes what was captured). True when interrupted.
fn capture(p: &mut Pipeline<'_>, duration: Duration) -> Result<bool> {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    let progress = std::io::stderr().is_terminal();
    let deadline = Instant::now() + duration;
    // The first drain comes early: processes are registered with the unwinder after the
    // drain that first shows them, and until then their stacks fall back to frame pointers.
    let mut interval = FIRST_DRAIN;
    loop {
        let now = Instant::now();
        let interrupted = INTERRUPTED.load(Ordering::Relaxed);
        if now >= deadline || interrupted {
            p.drain()?;
            if progress {
                eprint!("\r\x1b[K");
            }
            return Ok(interrupted);
        }
        if progress {
            let c = p.session.counters()?;
            eprint!(
                "\r\x1b[Kcapturing: {:>4.1}s left, {} cpu samples, {} heap samples",
                (deadline - now).as_secs_f64(),
                c.cpu.samples,
                c.heap.sampled
            );
            let _ = std::io::stderr().flush();
        }
        sleep_until(deadline.min(now + interval));
        interval = DRAIN_INTERVAL;
        p.drain()?;
    }
}

/// The capture's stages, drained together.
struct Pipeline<'a> {
    session: &'a mut Session,
    agg: &'a mut Aggregate,
    counts: &'a mut Counts,
    unwinder: &'a mut Unwinder,
    /// The `--pid` processes; empty: every process.
    pids: &'a [u32],
}

impl Pipeline<'_> {
    fn drain(&mut self) -> Result<()> {
        let batch = self.session.drain()?;
        self.agg.learn(&batch);
        self.counts.add(&batch);
        // New images are registered now, not after their first sample.
        for pid in self.unwinder.take_execs(self.session)? {
            if self.pids.is_empty() || self.pids.contains(&pid) {
                self.agg.exec_seen(pid);
            }
        }
        let seen = self.agg.processes().map(|p| (p.pid, p.maps_version));
        self.unwinder.sync(self.session, seen, Some(UNWIND_SYNC_BUDGET))
    }
}

/// Sleeps in short steps so Ctrl-C is noticed promptly.
fn sleep_until(when: Instant) {
    while !INTERRUPTED.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= when {
            return;
        }
        std::thread::sleep((when - now).min(Duration::from_millis(100)));
    }
}

fn print_bpf_stats(session: &Session, cpu: bool, heap: bool, waits: bool, threads: bool) -> Result<()> {
    let mut programs = Vec::new();
    if cpu {
        programs.push("cpu_sample");
    }
    if heap {
        programs.extend(["malloc_enter", "free_enter", "alloc_exit"]);
    }
    if waits {
        programs.extend(crate::ebpf::FUTEX_PROGRAMS);
    }
    if threads {
        programs.push(crate::ebpf::THREAD_PROGRAM);
    }
    for program in programs {
        let stats = session.program_stats(program)?;
        eprintln!(
            "bpf-stats: program={program} run_count={} run_time_ns={}",
            stats.run_count,
            stats.run_time.as_nanos()
        );
    }
    Ok(())
}

fn heap_comments(c: &Counters, args: &SnapshotArgs, attachment: Option<&HeapAttachment>, alive: bool) -> Vec<String> {
    let mut lines = profiles::heap_comments("at the end of the capture", c, args.heap_sample_bytes);
    if let Some(a) = attachment {
        lines.push(format!("probed {} in {}", a.functions.join(", "), a.library));
    }
    if !alive {
        lines.push("the process exited during the capture: inuse is what it had not freed when it exited".into());
    }
    lines
}

fn write_cpu(
    agg: &Aggregate,
    counts: &Counts,
    meta: &pprof::ProfileMeta,
    counters: &Counters,
    args: &SnapshotArgs,
    sym: &mut Symbolizer,
) -> Result<Vec<Written>> {
    let mut written = Vec::new();
    for (pid, process_counts) in counts.iter().filter(|(_, c)| c.cpu_total > 0) {
        let Some(process) = agg.process(pid) else { continue };
        let (shape, samples) = profiles::cpu(process_counts, args.frequency_hz);
        let resolved = resolve::resolve(process, agg, samples, sym);
        let mut meta = meta.clone();
        meta.comments = profiles::cpu_comments("snapshot", counters);
        if process.info.is_none() {
            meta.comments.push("process exited before its mappings could be read: user frames unsymbolized".into());
        }
        let path = write(&resolved, &shape, &meta, process, ProfileKind::Cpu, &args.output)?;
        written.push(Written {
            kind: ProfileKind::Cpu,
            pid,
            name: process.name.clone(),
            value: process_counts.cpu_total,
            hottest: hottest_function(&resolved, 0),
            path,
        });
    }
    Ok(written)
}

fn write_heap(
    agg: &Aggregate,
    counts: &Counts,
    meta: &pprof::ProfileMeta,
    counters: &Counters,
    args: &SnapshotArgs,
    attachments: &[HeapAttachment],
    sym: &mut Symbolizer,
) -> Result<Vec<Written>> {
    let mut written = Vec::new();
    let empty = Default::default();
    for &pid in &args.pids {
        let Some(process) = agg.process(pid) else { continue };
        let (shape, samples) = profiles::heap(counts.process(pid).unwrap_or(&empty), args.heap_sample_bytes);
        let inuse: i64 = samples.iter().map(|s| s.values[3]).sum();
        let resolved = resolve::resolve(process, agg, samples, sym);
        let mut meta = meta.clone();
        let attachment = attachments.iter().find(|a| a.pid == pid);
        meta.comments = heap_comments(counters, args, attachment, procs::exists(pid));
        let path = write(&resolved, &shape, &meta, process, ProfileKind::Heap, &args.output)?;
        written.push(Written {
            kind: ProfileKind::Heap,
            pid,
            name: process.name.clone(),
            value: inuse.max(0) as u64,
            hottest: hottest_function(&resolved, 3),
            path,
        });
    }
    Ok(written)
}

/// Block, mutex or threadcreate profiles of every process with data of that kind.
fn write_futex(
    kind: ProfileKind,
    agg: &Aggregate,
    counts: &Counts,
    meta: &pprof::ProfileMeta,
    counters: &Counters,
    args: &SnapshotArgs,
    sym: &mut Symbolizer,
) -> Result<Vec<Written>> {
    let mut written = Vec::new();
    for (pid, process_counts) in counts.iter() {
        let (shape, samples, comments) = match kind {
            ProfileKind::Block => {
                let (shape, samples) = profiles::block(process_counts);
                (shape, samples, profiles::block_comments("snapshot", counters))
            }
            ProfileKind::Mutex => {
                let (shape, samples) = profiles::mutex(process_counts);
                (shape, samples, profiles::mutex_comments("snapshot", counters))
            }
            _ => {
                let (shape, samples) = profiles::threadcreate(process_counts);
                (shape, samples, profiles::threadcreate_comments("snapshot", counters))
            }
        };
        // A chosen process gets its file even with nothing in it: zero is an answer.
        if samples.is_empty() && !args.pids.contains(&pid) {
            continue;
        }
        let Some(process) = agg.process(pid) else { continue };
        // Values: contentions / total delay / threads.
        let value_index = if kind == ProfileKind::ThreadCreate { 0 } else { 1 };
        let value: i64 = samples.iter().map(|s| s.values[value_index]).sum();
        let mut resolved = resolve::resolve(process, agg, samples, sym);
        if kind != ProfileKind::ThreadCreate {
            primitive::label(&mut resolved);
        }
        let mut meta = meta.clone();
        meta.comments = comments;
        let path = write(&resolved, &shape, &meta, process, kind, &args.output)?;
        written.push(Written {
            kind,
            pid,
            name: process.name.clone(),
            value: value.max(0) as u64,
            hottest: hottest_function(&resolved, value_index),
            path,
        });
    }
    Ok(written)
}

fn write(
    resolved: &ResolvedProfile,
    shape: &profiles::Shape,
    meta: &pprof::ProfileMeta,
    process: &KnownProcess,
    kind: ProfileKind,
    dir: &Path,
) -> Result<PathBuf> {
    let profile = pprof::encode(resolved, shape, meta);
    let path = dir.join(output::process_dir_name(&process.name, process.pid)).join(format!("{kind}.pb.gz"));
    output::write_atomic(&path, &pprof::encode_gzip(&profile))?;
    Ok(path)
}

/// The function with the largest self value at `value_index` (the leaf frame's innermost
/// function).
fn hottest_function(resolved: &ResolvedProfile, value_index: usize) -> String {
    let mut flat = std::collections::HashMap::<String, i64>::new();
    for sample in &resolved.samples {
        let Some(&leaf) = sample.locations.first() else { continue };
        let loc = &resolved.locations[leaf];
        let name = loc.frames.first().map_or_else(|| format!("{:#x}", loc.address), |f| f.function.clone());
        *flat.entry(name).or_default() += sample.values[value_index];
    }
    flat.into_iter()
        .filter(|(_, v)| *v > 0)
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
        .map_or_else(|| "-".into(), |(name, _)| name)
}

/// Rows shown before "... and N more".
const SUMMARY_ROWS: usize = 25;

fn print_summary(written: &[Written], counters: &Counters, dir: &Path) {
    let mut cpu: Vec<&Written> = written.iter().filter(|w| w.kind == ProfileKind::Cpu).collect();
    let heap: Vec<&Written> = written.iter().filter(|w| w.kind == ProfileKind::Heap).collect();
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
    if !heap.is_empty() {
        println!("{:<24} {:>8} {:>12}  top in-use allocation site", "process", "pid", "inuse bytes");
        for w in &heap {
            println!("{:<24} {:>8} {:>12}  {}", truncate(&w.name, 24), w.pid, w.value, truncate(&w.hottest, 60));
        }
    }
    let futex: Vec<&Written> = written.iter().filter(|w| FUTEX_KINDS.contains(&w.kind)).collect();
    if !futex.is_empty() {
        println!("{:<24} {:>8} {:<12} {:>16}  top leaf function", "process", "pid", "profile", "delay ns/threads");
        for w in futex.iter().take(SUMMARY_ROWS * 3) {
            println!(
                "{:<24} {:>8} {:<12} {:>16}  {}",
                truncate(&w.name, 24),
                w.pid,
                w.kind,
                w.value,
                truncate(&w.hottest, 60)
            );
        }
        let f = counters.futex;
        println!(
            "futex: {} waits, {} charged to a waker, {} threads created; dropped: in-flight map full {}, block map full {}, \
             mutex map full {}, threadcreate map full {}",
            f.waits, f.mutex_charged, f.threads_created, f.pending_map_full, f.block_map_full, f.mutex_map_full, f.thread_map_full
        );
    }
    println!(
        "wrote {} profiles to {} ({} cpu samples, {} lost to a full map; {} heap samples, {} not tracked as live: map full)",
        written.len(),
        dir.display(),
        counters.cpu.samples,
        counters.cpu.counts_map_full,
        counters.heap.sampled,
        counters.heap.live_map_full
    );
}

fn print_unwind_summary(s: &unwind::UnwinderStats) {
    const MIB: f64 = (1 << 20) as f64;
    println!(
        "unwind tables: {} files ({:.1} of {:.0} MiB), built in {:.0} ms; {} files without a table, {} too large, {} not loaded (memory full)",
        s.tables.len(),
        s.table_bytes as f64 / MIB,
        s.budget_bytes as f64 / MIB,
        s.build_time.as_secs_f64() * 1e3,
        s.build_failures,
        s.too_large,
        s.budget_full
    );
    for t in &s.tables {
        tracing::debug!(file = %t.name, rows = t.rows, bytes = t.bytes, build_ms = t.build_duration.as_secs_f64() * 1e3, "unwind table");
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
