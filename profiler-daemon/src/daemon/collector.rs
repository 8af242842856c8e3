//! The collector thread: the one owner of the [`Capture`], the counts and the symbolizer. It
//! drains the kernel every second, writes a dump every interval, picks up heap targets, and
//! answers the front's [`Command`]s. Everything here is blocking work, so it runs on its own
//! thread with its own clock (one `ppoll` on the command bell and the kernel's process-event
//! rings, see [`Capture::wait`]), never on the async executor. What to write, list or answer is decided in [`super::decide`].

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::oneshot;

use super::{
    decide::{self, Serving},
    file_closes::FileCloses,
    status::{self, Status},
    thread_dumps::{DumpQuery, ThreadDumps, Walked},
};
use crate::{
    capture::{log_slow, Capture, CaptureConfig, CaptureError, Drained},
    config::{Config, ProcessFacts},
    control::{
        Command, Commands, IndexEntry, Next, ProfileBody, ProfileQuery, PublishedStatus, QueryError, Refusals,
        ReloadError, Reloaded, StatusBoard, Viewer,
    },
    ids::{Pid, StackId},
    offload::Heartbeat,
    output, procs,
    profiles::{
        heap::{attachment_comment, TargetError},
        Context, Counts, ProcessCounts, ProfileKind, Settings, Source, View,
    },
    render::{Renderer, Window},
    resolve::{self, Namers, StackSample},
    sink::{IntervalFiles, Sink},
    threads::ThreadDump,
};

/// How often the kernel maps are drained.
/// A process younger than this that maps no C library yet is not refused heap profiling:
/// right after its exec it runs in ld.so, which maps the library a moment later.
const HEAP_TARGET_GRACE: Duration = Duration::from_secs(10);

const DRAIN_INTERVAL: Duration = Duration::from_secs(1);
/// How often `/proc` is scanned for new heap targets.
const HEAP_SCAN_INTERVAL: Duration = Duration::from_secs(5);
/// Distinct stacks kept in memory, and their frames in all (32 MiB of them: 200,000 stacks
/// of 20 frames, 80,000 of 50); past either, history is evicted for new stacks (counted), and
/// new stacks are dropped (counted) only when the table is full of stacks seen since the
/// last dump.
const MAX_STACKS: usize = 200_000;
const MAX_FRAMES: usize = 4 << 20;
/// How often the loop publishes `/status` at most while someone reads it (commands that
/// change it, and dumps, publish at once)...
const PUBLISH_EVERY: Duration = Duration::from_millis(250);
/// ...and while nobody does: rendering it (and reading the kernel's counters for it) four
/// times a second was a twentieth of what following 500 execs a second cost.
const PUBLISH_UNREAD_EVERY: Duration = Duration::from_secs(2);
/// On-demand captures (`seconds=S`) in flight at once.
const MAX_WINDOWS: usize = 16;
/// Of those, the ones one uid other than root may have open; more get a 429.
const MAX_WINDOWS_PER_UID: usize = 4;
/// Of those, the ones only root may open, so that other users cannot lock root out.
const ROOT_WINDOWS: usize = 4;
/// How often the collector follows process events while a dump's files are made durable.
const FOLLOW_WHILE_FINISHING: Duration = Duration::from_millis(2);
/// Resident memory above which the symbolizer's open files are closed after a dump (their
/// symbols found are kept). Two thirds of the daemon's 96 MiB target: at 2,000 processes the
/// daemon's own tables hold it near 48 MiB, and a budget below that closed (and re-parsed,
/// inflating compressed debug info) every file after every dump, a sixth of its CPU. When the
/// files in use need more, closes back off ([`FileCloses`]).
const SYMBOLIZER_FILES_BUDGET: u64 = 64 << 20;
/// Resident memory above which the symbol caches are dropped after a dump.
const SYMBOLIZER_RSS_BUDGET: u64 = 96 << 20;
/// A file the symbolizer has not been asked new addresses of for this long is closed at the
/// next dump (its symbols found are kept). A program that ran once otherwise held its parsed
/// files until the files budget: a pyenv Python's, with debug info, put 14 MiB on the daemon
/// for good. Files of programs that keep producing new stacks stay open; a file closed too
/// early costs one parse when a new address shows up, at most once a minute.
const SYMBOLIZER_IDLE_FILE: Duration = Duration::from_secs(60);

/// Why the collector could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error("failed to start the collector thread")]
    Thread(#[source] std::io::Error),
    #[error("the collector thread died while starting")]
    Died,
}

/// A dump query (none for an interval's dump) and its dump.
type DumpAnswer = (Option<DumpQuery>, Result<Arc<ThreadDump>, QueryError>);

/// A `seconds=S` query waiting for its window to end.
struct PendingWindow {
    query: ProfileQuery,
    start: SystemTime,
    deadline: Instant,
    counts: Counts,
    reply: oneshot::Sender<Result<ProfileBody, QueryError>>,
}

struct Collector {
    config: Config,
    capture: Capture,
    interval: Counts,
    interval_start: SystemTime,
    total: Counts,
    started: SystemTime,
    started_at: Instant,
    windows: Vec<PendingWindow>,
    /// Heap targets that could not be probed, and why (not retried until a reload).
    heap_failed: BTreeMap<Pid, String>,
    live_blocks: usize,
    sym: Namers,
    sink: Sink,
    last_error: Option<String>,
    /// Times the symbol caches were dropped for being over the memory budget.
    symbol_cache_resets: u64,
    /// Times the symbolizer's files were closed for being over the files budget.
    symbol_file_closes: u64,
    /// Files closed for being idle ([`SYMBOLIZER_IDLE_FILE`]).
    symbol_idle_file_closes: u64,
    /// When they are closed (not at every dump when the files in use need more).
    file_closes: FileCloses,
    /// Exited threads whose since-start counts were folded together (see
    /// `profiles::Counts::fold_exited_threads`).
    threads_folded: u64,
    /// Entries of since-start totals and windows whose stacks the catalogue evicted, folded
    /// together (see `profiles::Counts::fold_evicted_stacks`).
    evicted_rows_folded: u64,
    /// What the socket server refused (it counts; `/status` shows).
    front: Arc<Refusals>,
    /// Windows refused because their uid had [`MAX_WINDOWS_PER_UID`] open.
    windows_over_uid_share: u64,
    /// Beaten once per loop, per profile rendered, and while a file read is waited for.
    heartbeat: Heartbeat,
    /// When the next drain is due (a long dump drains between its profiles).
    next_drain: Instant,
    /// When `/status` was last published.
    published: Instant,
    /// Thread dumps waiting, and the one whose walk runs off this thread.
    dumps: ThreadDumps,
}

/// Loads and attaches on a new thread; returns once attached (or with the error), leaving
/// the thread running until `Shutdown` or until every handle is dropped.
pub fn spawn(
    config: Config,
    commands: Commands,
    heartbeat: Heartbeat,
) -> Result<std::thread::JoinHandle<()>, StartError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name("collector".into())
        .spawn(move || match Collector::start(config, &commands, heartbeat) {
            Ok(mut collector) => {
                collector.publish_status(&commands.status);
                let _ = ready_tx.send(Ok(()));
                collector.run(&commands);
            }
            Err(err) => {
                let _ = ready_tx.send(Err(err));
            }
        })
        .map_err(StartError::Thread)?;
    match ready_rx.recv() {
        Ok(result) => result.map(|()| thread).map_err(StartError::Capture),
        Err(_) => Err(StartError::Died),
    }
}

/// The stack table's capacity: [`MAX_STACKS`], or `PROFILER_TEST_MAX_STACKS`, a test hook
/// with which a soak test fills the table in seconds rather than days.
fn max_stacks() -> usize {
    std::env::var("PROFILER_TEST_MAX_STACKS").ok().and_then(|v| v.parse().ok()).unwrap_or(MAX_STACKS)
}

impl Collector {
    fn start(config: Config, commands: &Commands, heartbeat: Heartbeat) -> Result<Self, CaptureError> {
        let front = Arc::clone(&commands.refusals);
        let mut capture = Capture::start(&CaptureConfig {
            pids: Vec::new(),
            // A reload may opt processes in to heap profiling later: its maps are kept
            // whenever heap is on.
            kinds: config.profiles.clone(),
            settings: settings(&config),
            heap_max_live: profiler_common::maps::heap_live_entries(config.heap.sample_bytes),
            max_stacks: max_stacks(),
            max_frames: MAX_FRAMES,
            enable_stats: false,
            heartbeat: Some(heartbeat.clone()),
            selection: config.processes.clone(),
            shares: config.limits,
            state_dir: Some(config.output_dir.clone()),
        })?;
        capture.select(&config.processes);
        capture.set_process_share(config.limits.process_percent);
        let mut sym = Namers::new(capture.symbolizer());
        // Otherwise the first drain with a kernel stack parses it, and processes that start
        // meanwhile wait that long to be registered with the unwinder (their samples lose
        // their chains).
        sym.symbols.load_kernel_symbols();
        let now = SystemTime::now();
        Ok(Self {
            sink: Sink::Files(IntervalFiles::new(&config.output_dir, &config.retention, &config.exports)),
            config,
            capture,
            interval: Counts::default(),
            interval_start: now,
            total: Counts::default(),
            started: now,
            started_at: Instant::now(),
            windows: Vec::new(),
            heap_failed: BTreeMap::new(),
            live_blocks: 0,
            sym,
            last_error: None,
            symbol_cache_resets: 0,
            symbol_file_closes: 0,
            symbol_idle_file_closes: 0,
            file_closes: FileCloses::default(),
            threads_folded: 0,
            evicted_rows_folded: 0,
            front,
            windows_over_uid_share: 0,
            heartbeat,
            next_drain: Instant::now() + DRAIN_INTERVAL,
            published: Instant::now(),
            dumps: ThreadDumps::new(commands.bell()),
        })
    }

    fn run(&mut self, commands: &Commands) {
        let mut next_dump = Instant::now() + self.config.interval;
        let mut next_scan = Instant::now();
        let mut queued = false;
        loop {
            self.heartbeat.beat();
            let wake = [self.next_drain, next_dump, next_scan]
                .into_iter()
                .chain(self.windows.iter().map(|w| w.deadline))
                .min();
            // Commands left queued (one is taken per turn) mean no waiting.
            let wait = if queued {
                Duration::ZERO
            } else {
                wake.map_or(DRAIN_INTERVAL, |t| t.saturating_duration_since(Instant::now()))
            };
            let woken = self.capture.wait(Some(commands.bell()), wait);
            if woken.records {
                // Followed before any command, so a short-lived process is registered while
                // it runs.
                let started = Instant::now();
                let reused = self.capture.follow();
                self.forget_reused(&reused);
                log_slow("follow", started);
            }
            if woken.other {
                // Before the queue is read, so a command sent meanwhile rings it again.
                commands.silence();
            }
            let started = Instant::now();
            queued = false;
            match commands.next() {
                Next::Empty => {}
                Next::Command(Command::Shutdown { reply }) => {
                    self.final_dump();
                    let _ = reply.send(());
                    return;
                }
                Next::Command(command) => {
                    queued = true;
                    self.handle(command);
                    // What the command changed (a refused capture, a reload) shows at once.
                    self.publish_status(&commands.status);
                    log_slow("command", started);
                }
                // Every handle is gone: the front has stopped. Leave a final dump.
                Next::Disconnected => return self.final_dump(),
            }
            // A dump's walk ended (its thread rang the bell), or the next one may begin.
            if self.serve_dumps() {
                self.publish_status(&commands.status);
            }
            let now = Instant::now();
            if now >= next_scan {
                self.scan_heap_targets();
                next_scan = now + HEAP_SCAN_INTERVAL;
                log_slow("heap target scan", now);
            }
            if now >= self.next_drain {
                let started = Instant::now();
                self.drain();
                log_slow("drain and presymbolize", started);
            }
            if now >= next_dump {
                let started = Instant::now();
                self.dump();
                next_dump = now + self.config.interval;
                // What the dump counted (files written, files refused) shows with its files,
                // not up to a loop turn later: a quiet loop turns once a second.
                self.publish_status(&commands.status);
                log_slow("dump", started);
            }
            let started = Instant::now();
            self.finish_windows();
            log_slow("finish windows", started);
            // At most a few times a second: process events wake the loop often.
            let since = self.published.elapsed();
            if since >= PUBLISH_EVERY && (commands.status.was_read() || since >= PUBLISH_UNREAD_EVERY) {
                let started = Instant::now();
                self.publish_status(&commands.status);
                log_slow("publish status", started);
            }
        }
    }

    /// The last interval's files, then a moment for the exporters to send them.
    fn final_dump(&mut self) {
        self.dump();
        let Sink::Files(files) = &mut self.sink;
        files.close();
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Index { viewer, pid, reply } => {
                let _ = reply.send(self.index(viewer, pid));
            }
            Command::Profile { query, reply } => self.query(query, reply),
            Command::Reload { config, reply } => {
                let _ = reply.send(self.reload(*config));
            }
            Command::Shutdown { .. } => unreachable!("handled by the loop"),
        }
    }

    /// Drains one map set into every open window and symbolizes what is new. Returns the
    /// pids reused meanwhile, already forgotten in the collector's counts (a dump forgets
    /// them in the interval it is writing too).
    fn drain(&mut self) -> Vec<Pid> {
        self.next_drain = Instant::now() + DRAIN_INTERVAL;
        match self.capture.drain() {
            Ok(drained) => self.take(drained),
            Err(err) => {
                self.record_error(&err);
                Vec::new()
            }
        }
    }

    /// Counts a drained batch in every window, and forgets what the capture forgot. Returns
    /// the pids reused (see [`Collector::drain`]).
    fn take(&mut self, drained: Drained) -> Vec<Pid> {
        let Drained { batch, new_stacks, gone, mut reused, problems } = drained;
        self.forget_reused(&reused);
        self.interval.add(&batch);
        self.total.add(&batch);
        for window in &mut self.windows {
            // A window answers for one process: keep only its counts, not the machine's.
            window.counts.add(&batch);
            window.counts.retain_only(window.query.pid);
        }
        for pid in &gone {
            self.heap_failed.remove(pid);
        }
        if let Some(problem) = problems.last() {
            self.record_error(problem);
        }
        let started = Instant::now();
        reused.extend(self.presymbolize(&batch, &new_stacks));
        log_slow("presymbolize", started);
        reused
    }

    /// Drops what was counted under pids a new process now has (the old process exited):
    /// its profiles would otherwise carry the old process's samples under the new name.
    fn forget_reused(&mut self, pids: &[Pid]) {
        if pids.is_empty() {
            return;
        }
        self.interval.forget(pids);
        self.total.forget(pids);
        for window in &mut self.windows {
            window.counts.forget(pids);
        }
        for pid in pids {
            self.heap_failed.remove(pid);
        }
    }

    /// Symbolizes the addresses of stacks first seen in this drain, so that the dump finds
    /// them in the symbol cache: the cost of reading a file's symbols is paid a little per
    /// drain as stacks appear, and a dump (or a query) only encodes. Only processes the
    /// output selects are symbolized. Returns the pids reused meanwhile (forgotten).
    fn presymbolize(&mut self, batch: &crate::ebpf::Batch, new_stacks: &HashSet<StackId>) -> Vec<Pid> {
        let mut reused = Vec::new();
        if new_stacks.is_empty() {
            return reused;
        }
        let mut by_pid: BTreeMap<Pid, Vec<StackSample>> = BTreeMap::new();
        for seen in crate::profiles::sightings(batch) {
            if new_stacks.contains(&seen.user_stack) || new_stacks.contains(&seen.kernel_stack) {
                by_pid.entry(seen.pid).or_default().push(StackSample {
                    user_stack: seen.user_stack,
                    kernel_stack: seen.kernel_stack,
                    user_leaf_is_return: seen.user_leaf_is_return,
                    values: Vec::new(),
                    unscaled: Vec::new(),
                    labels: Vec::new(),
                });
            }
        }
        for (pid, samples) in by_pid {
            // A process's first files take tens of ms to read (libc's symbols: ~60 ms): new
            // processes are registered with the unwinder between processes, not after all.
            let more = self.capture.follow();
            self.forget_reused(&more);
            reused.extend(more);
            if reused.contains(&pid) {
                continue;
            }
            let catalog = self.capture.catalog();
            let Some(process) = catalog.process(pid) else { continue };
            if self.config.processes.matches(&process.facts()) {
                // The result is dropped: what is kept is the symbolizer's cache.
                let _ = resolve::resolve(process, catalog, samples, &mut self.sym);
            }
        }
        reused
    }

    /// Reads the live heap blocks into every window (then drains, so the stacks they name
    /// are known).
    fn refresh_live(&mut self) {
        if self.capture.heap_pids().is_empty() {
            return;
        }
        let live = match self.capture.live() {
            Ok(live) => live,
            Err(err) => return self.record_error(&err),
        };
        self.live_blocks = live.blocks.len();
        self.interval.set_live(&live.pids, &live.blocks);
        self.total.set_live(&live.pids, &live.blocks);
        for window in &mut self.windows {
            window.counts.set_live(&live.pids, &live.blocks);
        }
        self.take(live.drained);
    }

    /// Writes the interval's profiles, applies retention, forgets exited processes.
    fn dump(&mut self) {
        let started = Instant::now();
        // The cut: what was sampled until now belongs to this interval, not the next.
        self.drain();
        self.refresh_live();
        let end = SystemTime::now();
        let window = Window {
            start: self.interval_start,
            duration: end.duration_since(self.interval_start).unwrap_or_default(),
        };
        let mut interval = std::mem::take(&mut self.interval);
        self.interval_start = end;
        let serving = self.serving();
        let targets = decide::dump_targets(&serving, &self.config.processes, self.capture.catalog(), &interval);
        for (pid, _) in targets.iter().filter(|(_, kinds)| kinds.contains(&ProfileKind::Threads)) {
            // A process that exited or cannot be dumped is written without it (logged).
            if let Ok(dump) = self.thread_dump(*pid) {
                interval.set_thread_dump(*pid, dump);
            }
        }
        let counters = self.capture.counters().unwrap_or_default();
        let files = targets.iter().map(|(_, kinds)| kinds.len()).sum();
        let Sink::Files(sink) = &mut self.sink;
        let begun = sink.begin(end, files);
        log_slow("dump: live heap, thread dumps", started);
        let result = match begun {
            Ok(mut dump) => {
                for (pid, kinds) in &targets {
                    for &kind in kinds {
                        // A dump of many processes takes a while: the kernel's map sets are
                        // still drained every second meanwhile (into the next interval), so
                        // they do not fill up, and the watchdog sees the collector work.
                        self.heartbeat.beat();
                        if Instant::now() >= self.next_drain {
                            let reused = self.drain();
                            interval.forget(&reused);
                        }
                        // Processes started meanwhile are registered while they run.
                        let reused = self.capture.follow();
                        interval.forget(&reused);
                        self.forget_reused(&reused);
                        let renderer = Renderer {
                            catalog: self.capture.catalog(),
                            settings: settings(&self.config),
                            context: Context::Interval,
                            window,
                            counters: &counters,
                            // Files in the output directory are root's (see `crate::output`).
                            kernel_addresses: true,
                        };
                        let (Some(process), Some(counts)) = (renderer.catalog.process(*pid), interval.process(*pid))
                        else {
                            continue;
                        };
                        let started = Instant::now();
                        let notes = notes(&self.capture, *pid, kind);
                        let rendered = renderer.render(process, counts, View::of(kind), notes, &mut self.sym);
                        dump.rendered_in(started.elapsed());
                        dump.put(&rendered, &process.facts());
                        log_slow("dump: one profile", started);
                    }
                }
                // Finishing makes the files durable (a syncfs that waits for the disk, often
                // 100 ms or more): meanwhile processes keep starting, and one not registered
                // before it runs is unwound without its tables. The collector follows them
                // while another thread waits for the disk.
                let Sink::Files(sink) = &mut self.sink;
                let capture = &mut self.capture;
                let mut reused = Vec::new();
                dump.leave_thread();
                let started = Instant::now();
                let finished = std::thread::scope(|scope| {
                    let finishing = scope.spawn(move || sink.finish(dump));
                    while !finishing.is_finished() {
                        reused.extend(capture.follow());
                        std::thread::sleep(FOLLOW_WHILE_FINISHING);
                    }
                    finishing.join()
                });
                log_slow("dump: make the files durable (following meanwhile)", started);
                self.forget_reused(&reused);
                match finished {
                    Ok(result) => result,
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            Err(err) => Err(err),
        };
        if let Err(err) = result {
            self.record_error(&err);
        }
        self.bound_symbol_caches();
        self.prune();
        // Give back what the interval's counts, the encoders and the pruned processes freed:
        // glibc keeps freed heap, so resident memory would stay at the highest any interval
        // reached (one with a burst of short-lived processes, say) instead of following what
        // the daemon holds. A few milliseconds a dump.
        let started = Instant::now();
        // SAFETY: malloc_trim only releases free heap memory.
        unsafe { libc::malloc_trim(0) };
        log_slow("dump: give freed memory back", started);
    }

    /// Forgets the processes gone for a while and the stacks nothing references any more.
    fn prune(&mut self) {
        let grace = self.config.interval.max(Duration::from_secs(60));
        // History whose frames the stack table evicted: one entry per thread and kind, not
        // one per stack ever seen (a process making new stacks all day grew them for good).
        let catalog = self.capture.catalog();
        let held = |id| catalog.stack(id).is_some();
        self.evicted_rows_folded += self.total.fold_evicted_stacks(held);
        for window in &mut self.windows {
            self.evicted_rows_folded += window.counts.fold_evicted_stacks(held);
        }
        let mut keep = HashSet::new();
        self.total.stacks(&mut keep);
        for window in &self.windows {
            window.counts.stacks(&mut keep);
        }
        let (gone, problems) = self.capture.prune(grace, &keep);
        self.total.forget(&gone);
        self.threads_folded += self.total.fold_exited_threads(|pid, tid| procs::thread_exists(pid.0, tid.0));
        for pid in &gone {
            self.heap_failed.remove(pid);
        }
        if let Some(problem) = problems.last() {
            self.record_error(problem);
        }
    }

    /// Bounds the symbolizer's memory after a dump, in three steps. Under the budgets, the
    /// files idle for [`SYMBOLIZER_IDLE_FILE`] are closed, one by one. Past
    /// [`SYMBOLIZER_FILES_BUDGET`] it closes all its files (their mapped pages and parsed debug
    /// info are most of its memory, and they include the files of processes long gone) but
    /// keeps the symbols found, so only files with new addresses are opened again. Closing
    /// them all after every dump instead cost 2.3x the CPU (each file re-parsed each
    /// interval). Past [`SYMBOLIZER_RSS_BUDGET`] the results go too, and the next dump re-reads
    /// what it needs. All are counted in /status.
    fn bound_symbol_caches(&mut self) {
        // JITs keep appending to their perf maps: read them afresh for each dump.
        self.sym.symbols.forget_perf_maps();
        let rss = resident_bytes().unwrap_or(0);
        let close = self.file_closes.at_dump(rss > SYMBOLIZER_FILES_BUDGET);
        if rss > SYMBOLIZER_RSS_BUDGET {
            tracing::debug!("resident memory over budget; dropping the symbol caches");
            self.sym.symbols.forget_files();
            self.symbol_cache_resets += 1;
        } else if close {
            tracing::debug!("resident memory over the files budget; closing the symbolizer's files");
            self.sym.symbols.close_files();
            self.symbol_file_closes += 1;
        } else {
            let closed = self.sym.symbols.close_idle_files(SYMBOLIZER_IDLE_FILE);
            if closed > 0 {
                tracing::debug!("closed {closed} idle files of the symbolizer");
                self.symbol_idle_file_closes += closed as u64;
            }
        }
        // The freed parsers (and caches) go back to the system at the end of the dump.
    }

    /// The kinds served now, and the processes with heap probes.
    fn serving(&self) -> Serving {
        Serving {
            kinds: ProfileKind::ALL
                .into_iter()
                .filter(|&kind| self.config.is_enabled(kind) && self.capture.has(kind.source()))
                .collect(),
            heap_pids: self.capture.heap_pids().into_iter().collect(),
            heap_refused: self.heap_failed.clone(),
            interval_thread_dumps: self.config.threads.interval_dumps,
        }
    }

    fn index(&mut self, viewer: Viewer, pid: Option<Pid>) -> Vec<IndexEntry> {
        if let Some(pid) = pid {
            // A process's own page is what a dump of it would see: one not known yet (idle
            // since the daemon started) is read first, and listed with what it can give now.
            self.read_before(ProfileKind::Threads, pid);
        }
        let catalog = self.capture.catalog();
        let mut entries = decide::index(
            &self.serving(),
            &self.config.processes,
            catalog,
            &self.total,
            viewer,
            pid,
            &mut credentials_now,
        );
        // A dump is taken when asked for: the index shows how many threads there are now,
        // as Go's shows how many goroutines.
        for entry in &mut entries {
            for (kind, count) in &mut entry.profiles {
                if *kind == ProfileKind::Threads {
                    *count = procs::thread_count(entry.pid.0).unwrap_or(0);
                }
            }
        }
        entries
    }

    /// Reads what a query of `kind` about `pid` needs of the process first (see
    /// [`decide::before_query`]).
    fn read_before(&mut self, kind: ProfileKind, pid: Pid) {
        match decide::before_query(kind, self.capture.catalog().process(pid)) {
            decide::BeforeQuery::Track if procs::exists(pid.0) => self.capture.track(pid),
            decide::BeforeQuery::Inspect => self.capture.inspect(pid),
            decide::BeforeQuery::Track | decide::BeforeQuery::Nothing => {}
        }
    }

    fn query(&mut self, query: ProfileQuery, reply: oneshot::Sender<Result<ProfileBody, QueryError>>) {
        if reply.is_closed() {
            // The client hung up while the query was queued (the front let it go): a thread
            // dump nobody waits for would cost the collector for nothing.
            return;
        }
        // Credentials read now are judged by `check_query` as for any process.
        self.read_before(query.view.kind, query.pid);
        let catalog = self.capture.catalog();
        if let Err(err) = decide::check_query(&self.serving(), &self.config, catalog, &query, &mut credentials_now) {
            let _ = reply.send(Err(err));
            return;
        }
        match query.window {
            Some(_) if self.windows.len() >= MAX_WINDOWS => {
                let _ = reply.send(Err(QueryError::Unavailable(format!(
                    "{MAX_WINDOWS} profile captures are already running; retry later"
                ))));
            }
            Some(_)
                if query.viewer != Viewer::ROOT
                    && self.windows.iter().filter(|w| w.query.viewer != Viewer::ROOT).count()
                        >= MAX_WINDOWS - ROOT_WINDOWS =>
            {
                let _ = reply.send(Err(QueryError::Unavailable(format!(
                    "{} profile captures of other users are already running; retry later",
                    MAX_WINDOWS - ROOT_WINDOWS
                ))));
            }
            Some(_)
                if query.viewer != Viewer::ROOT
                    && self.windows.iter().filter(|w| w.query.viewer == query.viewer).count()
                        >= MAX_WINDOWS_PER_UID =>
            {
                self.windows_over_uid_share += 1;
                let _ = reply.send(Err(QueryError::Limited(format!(
                    "uid {} already has {MAX_WINDOWS_PER_UID} profile captures running; wait for one to finish",
                    query.viewer.uid
                ))));
            }
            Some(duration) => {
                // Samples taken before the window opens are counted before it exists, not
                // in it (F19: up to a drain interval of them landed in a `seconds=S` window).
                self.drain();
                self.windows.push(PendingWindow {
                    query,
                    start: SystemTime::now(),
                    deadline: Instant::now() + duration,
                    counts: Counts::default(),
                    reply,
                });
            }
            // Answered when its walk ends (see `serve_dumps`).
            None if query.view.kind == ProfileKind::Threads => self.dumps.push(DumpQuery { query, reply }),
            None => {
                if query.view.kind == ProfileKind::Heap {
                    self.refresh_live();
                }
                let window = Window { start: self.started, duration: self.started_at.elapsed() };
                let counts = self.total.process(query.pid).cloned().unwrap_or_default();
                let _ = reply.send(self.answer(&query, &counts, window));
            }
        }
    }

    fn answer(
        &mut self,
        query: &ProfileQuery,
        counts: &ProcessCounts,
        window: Window,
    ) -> Result<ProfileBody, QueryError> {
        let counters = self.capture.counters().unwrap_or_default();
        let catalog = self.capture.catalog();
        let process = catalog.process(query.pid).ok_or(QueryError::UnknownPid(query.pid))?;
        // Checked again at the end of a window: the process may have changed uid meanwhile.
        if !decide::visible(query.viewer, process, &mut credentials_now) {
            return Err(QueryError::NotVisible(query.pid));
        }
        let renderer = Renderer {
            catalog,
            settings: settings(&self.config),
            context: Context::Query,
            window,
            counters: &counters,
            kernel_addresses: query.viewer == Viewer::ROOT,
        };
        let bytes = if query.debug > 0 {
            renderer.text(process, counts, query.view, query.debug, &mut self.sym).into_bytes()
        } else {
            let notes = notes(&self.capture, query.pid, query.view.kind);
            renderer.render(process, counts, query.view, notes, &mut self.sym).encoded.gzip()
        };
        Ok(ProfileBody { bytes, text: query.debug > 0 })
    }

    /// Answers the windows whose time is up.
    fn finish_windows(&mut self) {
        // A client that hung up needs no answer, and must not hold a window until its end.
        self.windows.retain(|w| !w.reply.is_closed());
        let now = Instant::now();
        let (due, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.windows).into_iter().partition(|w| w.deadline <= now);
        self.windows = waiting;
        if due.is_empty() {
            return;
        }
        self.drain();
        if due.iter().any(|w| w.query.view.kind == ProfileKind::Heap) {
            // Updates the open windows' live state; the due ones take it below.
            self.refresh_live();
        }
        for w in due {
            let window = Window { start: w.start, duration: w.start.elapsed().unwrap_or_default() };
            let mut counts = w.counts.process(w.query.pid).cloned().unwrap_or_default();
            if let Some(total) = self.total.process(w.query.pid) {
                counts = counts.with_live_from(total);
            }
            let _ = w.reply.send(self.answer(&w.query, &counts, window));
        }
    }

    /// Answers the dump whose walk ended, if one did, and begins the next queued one.
    /// Returns whether a dump was answered.
    fn serve_dumps(&mut self) -> bool {
        let ended = self.dumps.ended().map(|walked| self.end_dump(walked));
        let answered = ended.is_some();
        if let Some((Some(waiter), dump)) = ended {
            self.answer_dump(waiter, dump);
        }
        while let Some(waiter) = self.dumps.next_query() {
            let pid = waiter.query.pid;
            match self.begin_dump(pid, Some(waiter)) {
                Ok(()) => break,
                Err((waiter, err)) => {
                    if let Some(waiter) = waiter {
                        let _ = waiter.reply.send(Err(err));
                    }
                }
            }
        }
        answered
    }

    /// Begins a dump of `pid` and launches its walk.
    fn begin_dump(&mut self, pid: Pid, waiter: Option<DumpQuery>) -> Result<(), (Option<DumpQuery>, QueryError)> {
        let started = match self.capture.start_thread_dump(pid) {
            Ok(started) => started,
            Err(err) => return Err((waiter, self.dump_error(err))),
        };
        match self.dumps.launch(started, waiter) {
            Ok(()) => Ok(()),
            Err(unlaunched) => {
                let (started, waiter, err) = *unlaunched;
                self.capture.abandon_thread_dump(started.ticket, None);
                let message = format!("failed to start a thread for the dump of pid {pid}: {err}");
                self.record(message.clone());
                Err((waiter, QueryError::Unavailable(message)))
            }
        }
    }

    /// Ends a walk: what the capture learns from it, and the dump.
    fn end_dump(&mut self, walked: Walked) -> DumpAnswer {
        let Walked { ticket, waiter, outcome } = walked;
        let dump = match outcome {
            Ok(outcome) => {
                self.capture.finish_thread_dump(ticket, outcome).map(Arc::new).map_err(|e| self.dump_error(e))
            }
            Err(_panic) => {
                self.capture.abandon_thread_dump(ticket, None);
                let message = "a thread dump's walk panicked; see the log".to_string();
                self.record(message.clone());
                Err(QueryError::Unavailable(message))
            }
        };
        (waiter, dump)
    }

    /// Answers a dump query with its dump, rendered with the process's counts as they are now.
    fn answer_dump(&mut self, waiter: DumpQuery, dump: Result<Arc<ThreadDump>, QueryError>) {
        let DumpQuery { query, reply } = waiter;
        let answer = dump.and_then(|dump| {
            let window = Window { start: dump.taken, duration: dump.duration };
            let mut counts = self.total.process(query.pid).cloned().unwrap_or_default();
            counts.threads.dump = Some(dump);
            self.answer(&query, &counts, window)
        });
        let _ = reply.send(answer);
    }

    /// Dumps the threads of `pid` for an interval's files: after the walk in flight (its query
    /// answered), the walk runs off this thread while this one follows process events.
    fn thread_dump(&mut self, pid: Pid) -> Result<Arc<ThreadDump>, QueryError> {
        if let Some((Some(waiter), dump)) = self.await_walk() {
            self.answer_dump(waiter, dump);
        }
        self.begin_dump(pid, None).map_err(|(_, err)| err)?;
        match self.await_walk() {
            Some((_, dump)) => dump,
            None => Err(QueryError::Unavailable(format!("the dump of pid {pid} was lost"))),
        }
    }

    /// Waits for the walk in flight, if any, following process events meanwhile.
    fn await_walk(&mut self) -> Option<DumpAnswer> {
        while self.dumps.busy() {
            if let Some(walked) = self.dumps.ended() {
                return Some(self.end_dump(walked));
            }
            self.heartbeat.beat();
            let reused = self.capture.follow();
            self.forget_reused(&reused);
            std::thread::sleep(FOLLOW_WHILE_FINISHING);
        }
        None
    }

    /// A dump's error as its query's: a process that exited meanwhile is answered as one.
    fn dump_error(&mut self, err: CaptureError) -> QueryError {
        match err {
            CaptureError::NoProcess(pid) => QueryError::UnknownPid(pid),
            err => {
                let message = crate::error::chain(&err);
                self.record(message.clone());
                QueryError::Unavailable(message)
            }
        }
    }

    /// Looks for new heap targets ([`HEAP_TARGET_GRACE`]: how long a process without a C
    /// library mapped yet is looked at again).
    fn scan_heap_targets(&mut self) {
        if !self.config.is_enabled(ProfileKind::Heap) || self.config.heap.include.is_empty() {
            return;
        }
        for pid in procs::list_pids().into_iter().map(Pid) {
            if self.capture.heap_attachment(pid).is_some()
                || self.heap_failed.contains_key(&pid)
                || pid.0 == std::process::id()
            {
                continue;
            }
            let Ok(name) = procs::read_comm(pid.0) else { continue };
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            let cgroup = procs::read_cgroup(pid.0);
            let facts = ProcessFacts { pid: pid.0, name: &name, exe: exe.as_deref(), cgroup: cgroup.as_deref() };
            if !self.config.heap_profiles(&facts) {
                continue;
            }
            match self.capture.attach_heap(pid) {
                Ok(attachment) => {
                    tracing::info!(pid = pid.0, name, library = attachment.library, "heap probes attached")
                }
                // Just exec'd, it may still be in ld.so, which maps the C library a moment
                // later: looked at again at the next scan, not refused for good.
                Err(CaptureError::HeapTarget { source: TargetError::NoAllocator(_), .. })
                    if procs::age(pid.0).is_some_and(|age| age < HEAP_TARGET_GRACE) =>
                {
                    tracing::debug!(pid = pid.0, name, "no C library mapped yet; heap target looked at again later");
                }
                Err(err) => {
                    // The configuration asked for this process's heap profile: an error, and the
                    // reason is kept for /status and for queries of it.
                    let reason = crate::error::chain(&err);
                    self.record(format!("cannot heap-profile {name} (pid {pid}): {reason}"));
                    self.heap_failed.insert(pid, reason);
                }
            }
        }
    }

    /// Applies a new configuration. What the loaded programs fix (CPU frequency, heap
    /// sampling rate, which programs run) needs a restart, and the reply names those keys;
    /// everything else applies now. A new output directory must be writable, or nothing
    /// changes.
    fn reload(&mut self, mut config: Config) -> Result<Reloaded, ReloadError> {
        if config.output_dir != self.config.output_dir {
            output::ensure_writable_dir(&config.output_dir).map_err(ReloadError::OutputDir)?;
        }
        let loaded: Vec<Source> = Source::ALL.into_iter().filter(|&source| self.capture.has(source)).collect();
        let restart_needed = decide::restart_needed(&self.config, &config, &loaded);
        if !restart_needed.is_empty() {
            tracing::warn!(keys = ?restart_needed, "these settings take effect after a restart");
        }
        let Sink::Files(files) = &mut self.sink;
        files.reconfigure(&config.output_dir, &config.retention, &config.exports);
        self.capture.select(&config.processes);
        // The kernel keeps sampling at the rates it was loaded with: scale by those (the
        // reply names the keys that wait for a restart).
        config.cpu.frequency_hz = self.config.cpu.frequency_hz;
        config.heap.sample_bytes = self.config.heap.sample_bytes;
        config.offcpu = self.config.offcpu.clone();
        config.waits = self.config.waits.clone();
        self.config = config;
        self.heap_failed.clear();
        Ok(Reloaded { restart_needed })
    }

    fn record_error(&mut self, err: &dyn std::error::Error) {
        self.record(crate::error::chain(err));
    }

    /// Logs an error and keeps it as `/status`'s `last_error`.
    fn record(&mut self, message: String) {
        tracing::error!("{message}");
        self.last_error = Some(message);
    }

    /// Renders `/status` for the front to serve without asking.
    fn publish_status(&mut self, board: &StatusBoard) {
        self.published = Instant::now();
        let status = self.status();
        board.publish(PublishedStatus {
            full: status::render(&status, true),
            counters_only: status::render(&status, false),
        });
    }

    fn status(&self) -> Status {
        let catalog = self.capture.catalog();
        let Sink::Files(files) = &self.sink;
        Status {
            uptime: self.started_at.elapsed(),
            frequency_hz: self.config.cpu.frequency_hz,
            offcpu_sample_every: self.config.offcpu.sample_every,
            serving: self.serving().kinds.into_iter().collect(),
            heap_pids: self.capture.heap_pids(),
            counters: self.capture.counters().unwrap_or_default(),
            live_blocks: self.live_blocks,
            stacks: catalog.stack_count(),
            max_stacks: max_stacks(),
            stack_frames: catalog.frames_held(),
            max_stack_frames: MAX_FRAMES,
            stacks_dropped: catalog.dropped_stacks,
            stacks_evicted: catalog.evicted_stacks,
            stacks_over_share: catalog.stacks_over_share,
            stacks_over_share_most: catalog
                .processes()
                .filter(|p| p.stacks_over_share > 0)
                .max_by_key(|p| p.stacks_over_share)
                .map(|p| (p.pid, p.stacks_over_share)),
            processes: catalog.processes().count(),
            unwinder: self.capture.unwinder_stats(),
            exec_tracking_error: self.capture.exec_tracking_error().map(str::to_string),
            pid_namespace: self.capture.pid_namespace(),
            output_dir: files.dir().to_path_buf(),
            interval: self.config.interval,
            dumps: files.stats().clone(),
            exports: files.export_status(),
            symbol_cache_resets: self.symbol_cache_resets,
            symbol_file_closes: self.symbol_file_closes,
            symbol_idle_file_closes: self.symbol_idle_file_closes,
            threads_folded: self.threads_folded,
            evicted_rows_folded: self.evicted_rows_folded,
            perf_maps_refused: self.sym.symbols.perf_maps_refused,
            front: self.front.read(),
            windows_over_uid_share: self.windows_over_uid_share,
            truncated_pages: crate::sigbus::recovered(),
            offload: self.capture.offload_stats(),
            process_events: self.capture.sideband_stats().0,
            process_events_error: self.capture.sideband_stats().1.map(str::to_string),
            follow_latency: self.capture.follow_latency(),
            declined: self.capture.declined_stats(),
            last_error: self.last_error.clone(),
        }
    }
}

/// The settings that shape profiles.
fn settings(config: &Config) -> Settings {
    Settings {
        frequency_hz: config.cpu.frequency_hz,
        heap_sample_bytes: config.heap.sample_bytes,
        offcpu_rate_ns: config.offcpu.rate.as_nanos().min(u128::from(u64::MAX)) as u64,
        offcpu_sample_every: config.offcpu.sample_every,
        block_rate_ns: config.waits.block_rate.as_nanos().min(u128::from(u64::MAX)) as u64,
        mutex_fraction: config.waits.mutex_fraction,
    }
}

/// Extra comment lines for a profile of `pid`: what was probed, for heap profiles.
fn notes(capture: &Capture, pid: Pid, kind: ProfileKind) -> Vec<String> {
    match (kind, capture.heap_attachment(pid)) {
        (ProfileKind::Heap, Some(attachment)) => vec![attachment_comment(attachment)],
        _ => Vec::new(),
    }
}

/// This process's resident set size, from `/proc/self/statm`.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// A process's credentials as they are now, for [`decide::visible`].
fn credentials_now(pid: Pid) -> Option<procs::Credentials> {
    procs::read_credentials(pid.0).ok()
}
