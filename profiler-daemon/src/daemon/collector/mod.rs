//! The collector thread: the one owner of the [`Capture`], the counts and the symbolizer. It
//! drains the kernel every second, writes a dump every interval, picks up heap targets, and
//! answers the front's [`Command`]s. Everything here is blocking work, so it runs on its own
//! thread with its own clock (one `ppoll` on the command bell and the kernel's process-event
//! rings, see [`Capture::wait`]), never on the async executor. What to write, list or answer is
//! decided in [`super::decide`]. This file owns the [`Collector`] and its loop, heap targets,
//! reloads and `/status`; its children add to it: `drain` (counting drained batches), `dump`
//! (the interval dump) and `queries` (the index, profiles, windows and thread dumps).

mod drain;
mod dump;
mod queries;

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use queries::PendingWindow;

use super::{
    decide::{self, Serving},
    file_closes::FileCloses,
    status::{self, Status},
    thread_dumps::ThreadDumps,
};
use crate::{
    capture::{log_slow, Capture, CaptureConfig, CaptureError, DRAIN_INTERVAL},
    config::{Config, ProcessFacts},
    control::{Command, Commands, Next, PublishedStatus, Refusals, ReloadError, Reloaded, StatusBoard},
    heartbeat::Heartbeat,
    ids::Pid,
    output, procs,
    profiles::{
        heap::{attachment_comment, TargetError},
        Counts, ProfileKind, Settings, Source,
    },
    resolve::Namers,
    sink::IntervalFiles,
};

/// A process younger than this that maps no C library yet is not refused heap profiling:
/// right after its exec it runs in ld.so, which maps the library a moment later.
const HEAP_TARGET_GRACE: Duration = Duration::from_secs(10);

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

/// The collector's state, with one owner: this thread. `drain`, `dump` and `queries` add its
/// methods for each concern.
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
    /// Where interval dumps are written (and, through the spool, what exporters send).
    files: IntervalFiles,
    last_error: Option<String>,
    /// Times the symbol caches were dropped for being over the memory budget.
    symbol_cache_resets: u64,
    /// Times the symbolizer's files were closed for being over the files budget.
    symbol_file_closes: u64,
    /// Files closed for being idle ([`dump::SYMBOLIZER_IDLE_FILE`]).
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
    /// Windows refused because their uid had [`queries::MAX_WINDOWS_PER_UID`] open.
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
            settings: Settings::from(&config),
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
            files: IntervalFiles::new(&config.output_dir, &config.retention, &config.exports),
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
            let deadlines =
                [self.next_drain, next_dump, next_scan].into_iter().chain(self.windows.iter().map(|w| w.deadline));
            self.wait(commands, loop_wait(queued, Instant::now(), deadlines));
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
            self.timed_work(commands, &mut next_scan, &mut next_dump);
        }
    }

    /// Waits up to `wait` for process events, a command or a walk's end; follows the events
    /// at once.
    fn wait(&mut self, commands: &Commands, wait: Duration) {
        let woken = self.capture.wait(Some(commands.bell()), wait);
        if woken.records {
            // Followed before any command, so a short-lived process is registered while it
            // runs.
            let started = Instant::now();
            let reused = self.capture.follow();
            self.forget_reused(&reused);
            log_slow("follow", started);
        }
        if woken.other {
            // Before the queue is read, so a command sent meanwhile rings it again.
            commands.silence();
        }
    }

    /// What the clock calls for: the heap-target scan, a drain, the interval's dump, the
    /// windows whose time is up, and `/status` (see [`publish_due`]).
    fn timed_work(&mut self, commands: &Commands, next_scan: &mut Instant, next_dump: &mut Instant) {
        let now = Instant::now();
        if now >= *next_scan {
            self.scan_heap_targets();
            *next_scan = now + HEAP_SCAN_INTERVAL;
            log_slow("heap target scan", now);
        }
        if now >= self.next_drain {
            let started = Instant::now();
            self.drain();
            log_slow("drain and presymbolize", started);
        }
        if now >= *next_dump {
            let started = Instant::now();
            self.dump();
            *next_dump = now + self.config.interval;
            // What the dump counted (files written, files refused) shows with its files, not
            // up to a loop turn later: a quiet loop turns once a second.
            self.publish_status(&commands.status);
            log_slow("dump", started);
        }
        let started = Instant::now();
        self.finish_windows();
        log_slow("finish windows", started);
        if publish_due(self.published.elapsed(), commands.status.was_read()) {
            let started = Instant::now();
            self.publish_status(&commands.status);
            log_slow("publish status", started);
        }
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
                Err(err) if heap_target_later(&err, || procs::age(pid.0)) => {
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
        let files = &mut self.files;
        files.reconfigure(&config.output_dir, &config.retention, &config.exports);
        self.capture.select(&config.processes);
        // The kernel keeps sampling at the rates it was loaded with: scale by those (the
        // reply names the keys that wait for a restart).
        config.cpu.frequency_hz = self.config.cpu.frequency_hz;
        config.heap.sample_bytes = self.config.heap.sample_bytes;
        config.offcpu = self.config.offcpu.clone();
        config.contention = self.config.contention.clone();
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
        let files = &self.files;
        Status {
            uptime: self.started_at.elapsed(),
            settings: Settings::from(&self.config),
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
            names_by_source: self.sym.symbols.names_by_source,
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

/// How long the loop waits for its next turn: not at all while commands are left queued
/// (one is taken per turn), else until the earliest of `deadlines` (none: a drain interval).
fn loop_wait(queued: bool, now: Instant, deadlines: impl Iterator<Item = Instant>) -> Duration {
    if queued {
        return Duration::ZERO;
    }
    deadlines.min().map_or(DRAIN_INTERVAL, |t| t.saturating_duration_since(now))
}

/// Whether `/status` is published again, `since` its last publication: at most every
/// [`PUBLISH_EVERY`] while someone reads it, and every [`PUBLISH_UNREAD_EVERY`] while nobody
/// does (process events wake the loop often).
fn publish_due(since: Duration, read: bool) -> bool {
    since >= PUBLISH_EVERY && (read || since >= PUBLISH_UNREAD_EVERY)
}

/// Whether a heap target that failed with `err` is looked at again at the next scan rather
/// than refused for good: a process that maps no C library yet (or whose library could not
/// be opened through its mapping: it may be mid-exec) and is younger than
/// [`HEAP_TARGET_GRACE`] (`age`, read only then) may still be in ld.so.
fn heap_target_later(err: &CaptureError, age: impl FnOnce() -> Option<Duration>) -> bool {
    matches!(err, CaptureError::HeapTarget { source: TargetError::NoAllocator(_) | TargetError::Unopened { .. }, .. })
        && age().is_some_and(|age| age < HEAP_TARGET_GRACE)
}

/// Extra comment lines for a profile of `pid`: what was probed, for heap profiles.
fn notes(capture: &Capture, pid: Pid, kind: ProfileKind) -> Vec<String> {
    match (kind, capture.heap_attachment(pid)) {
        (ProfileKind::Heap, Some(attachment)) => vec![attachment_comment(attachment)],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_waits_for_its_earliest_deadline_and_not_while_commands_wait() {
        let now = Instant::now();
        let (soon, later) = (now + Duration::from_millis(30), now + Duration::from_secs(3));
        assert_eq!(loop_wait(false, now, [later, soon].into_iter()), Duration::from_millis(30));
        assert_eq!(loop_wait(true, now, [later, soon].into_iter()), Duration::ZERO);
        // A deadline past is no wait; none at all is a drain interval.
        assert_eq!(loop_wait(false, now + Duration::from_secs(1), [soon].into_iter()), Duration::ZERO);
        assert_eq!(loop_wait(false, now, std::iter::empty()), DRAIN_INTERVAL);
    }

    #[test]
    fn status_is_published_often_while_read_and_seldom_while_not() {
        assert!(!publish_due(PUBLISH_EVERY - Duration::from_millis(1), true));
        assert!(publish_due(PUBLISH_EVERY, true));
        assert!(!publish_due(PUBLISH_EVERY, false));
        assert!(!publish_due(PUBLISH_UNREAD_EVERY - Duration::from_millis(1), false));
        assert!(publish_due(PUBLISH_UNREAD_EVERY, false));
    }

    #[test]
    fn a_young_process_without_a_c_library_is_looked_at_again_and_others_refused() {
        let no_libc = CaptureError::HeapTarget { pid: Pid(9), source: TargetError::NoAllocator(Pid(9)) };
        let young = || Some(HEAP_TARGET_GRACE - Duration::from_secs(1));
        let old = || Some(HEAP_TARGET_GRACE);
        assert!(heap_target_later(&no_libc, young));
        assert!(!heap_target_later(&no_libc, old));
        // Gone (no age): refused, as any other error.
        assert!(!heap_target_later(&no_libc, || None));
        let other = CaptureError::NoProcess(Pid(9));
        assert!(!heap_target_later(&other, || panic!("the age is read only for a process without a C library")));
    }
}
