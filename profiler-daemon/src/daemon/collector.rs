//! The collector thread: the one owner of the BPF session, the aggregate, the counts and the
//! symbolizer. It drains the kernel every second, writes a dump every interval, picks up
//! heap targets, and answers the front's [`Command`]s. Everything here is blocking work, so
//! it runs on its own thread, never on the async executor.

use std::{
    collections::{BTreeMap, HashSet},
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

use tokio::{runtime::Handle, sync::mpsc};

use super::{
    command::{Command, IndexEntry, ProfileBody, ProfileQuery, QueryError, QueryKind, Viewer},
    dump::{self, DumpStats},
    render::{render, RenderSettings, Window},
    status,
};
use crate::{
    aggregate::{Aggregate, Counts, KnownProcess},
    config::{Config, ProcessFacts, ProfileKind},
    ebpf::{Batch, HeapAttachment, Session, SessionConfig},
    error::Result,
    pprof, procs, profiles,
    resolve::{self, StackSample},
    symbolize::Symbolizer,
    unwind::{self, Unwinder},
};

/// How often the kernel maps are drained.
const DRAIN_INTERVAL: Duration = Duration::from_secs(1);
/// How long a process that exited without any data is kept (see `KnownProcess::sampled`):
/// a few drains, so a sample taken just before its exit still finds it.
const UNSAMPLED_GRACE: Duration = Duration::from_secs(3);
/// How often `/proc` is scanned for new heap targets.
const HEAP_SCAN_INTERVAL: Duration = Duration::from_secs(5);
/// Distinct stacks kept in memory; past it new stacks are counted and dropped.
pub const MAX_STACKS: usize = 200_000;
/// On-demand captures (`seconds=S`) in flight at once.
const MAX_WINDOWS: usize = 16;
/// Time per drain spent registering new processes with the unwinder (building tables).
const UNWIND_SYNC_BUDGET: Duration = Duration::from_millis(250);
/// Capacity of the live heap block map.
const HEAP_MAX_LIVE: u32 = profiler_common::maps::HEAP_LIVE_MAX_ENTRIES;

/// A `seconds=S` query waiting for its window to end.
struct PendingWindow {
    query: ProfileQuery,
    start: SystemTime,
    deadline: Instant,
    counts: Counts,
    reply: tokio::sync::oneshot::Sender<std::result::Result<ProfileBody, QueryError>>,
}

pub(super) struct Collector {
    pub(super) config: Config,
    session: Session,
    pub(super) agg: Aggregate,
    interval: Counts,
    interval_start: SystemTime,
    pub(super) total: Counts,
    pub(super) started: SystemTime,
    pub(super) started_at: Instant,
    windows: Vec<PendingWindow>,
    pub(super) heap_pids: BTreeMap<u32, HeapAttachment>,
    heap_failed: HashSet<u32>,
    pub(super) live_blocks: usize,
    sym: Symbolizer,
    pub(super) unwinder: Unwinder,
    pub(super) dumps: DumpStats,
    pub(super) last_error: Option<String>,
    /// Times the symbol caches were dropped for being over the memory budget.
    pub(super) symbol_cache_resets: u64,
    /// Times the symbolizer's files were closed for being over the files budget.
    pub(super) symbol_file_closes: u64,
    cpu_attached: bool,
    /// The futex programs (block and mutex profiles) are attached.
    waits_attached: bool,
    /// The thread-creation program (threadcreate profile) is attached.
    threads_attached: bool,
}

/// Loads and attaches on a new thread; returns once attached (or with the error), leaving
/// the thread running until `Shutdown` or until every handle is dropped.
pub fn spawn(config: Config, rx: mpsc::Receiver<Command>, rt: Handle) -> Result<std::thread::JoinHandle<()>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name("collector".into())
        .spawn(move || match Collector::start(config) {
            Ok(mut collector) => {
                let _ = ready_tx.send(Ok(()));
                collector.run(rx, &rt);
            }
            Err(err) => {
                let _ = ready_tx.send(Err(err));
            }
        })
        .map_err(|source| crate::Error::Io { action: "start the collector thread".into(), source })?;
    match ready_rx.recv() {
        Ok(result) => result.map(|()| thread),
        Err(_) => Err(crate::Error::Usage("the collector thread died while starting".into())),
    }
}

impl Collector {
    fn start(config: Config) -> Result<Self> {
        let mut session = Session::load(&SessionConfig {
            pids: Vec::new(),
            heap_sample_bytes: config.heap.sample_bytes,
            heap_max_live: HEAP_MAX_LIVE,
            // A reload may opt processes in later: keep the heap maps whenever heap is on.
            heap: config.is_enabled(ProfileKind::Heap),
            futex: FUTEX_KINDS.iter().any(|&k| config.is_enabled(k)),
            enable_stats: false,
            unwind_rows: unwind::rows_for_budget(unwind::DEFAULT_TABLE_BYTES),
        })?;
        let cpu_attached = config.is_enabled(ProfileKind::Cpu);
        if cpu_attached {
            session.attach_cpu(config.cpu.frequency_hz)?;
        }
        let waits_attached = config.is_enabled(ProfileKind::Block) || config.is_enabled(ProfileKind::Mutex);
        let threads_attached = config.is_enabled(ProfileKind::ThreadCreate);
        if waits_attached || threads_attached {
            let attached = session.attach_futex(waits_attached, threads_attached)?;
            tracing::info!(tracepoints = ?attached.attached, missing = ?attached.missing, "futex tracepoints attached");
        }
        let now = SystemTime::now();
        Ok(Self {
            config,
            session,
            agg: Aggregate::with_max_stacks(MAX_STACKS),
            interval: Counts::default(),
            interval_start: now,
            total: Counts::default(),
            started: now,
            started_at: Instant::now(),
            windows: Vec::new(),
            heap_pids: BTreeMap::new(),
            heap_failed: HashSet::new(),
            live_blocks: 0,
            sym: Symbolizer::new(),
            unwinder: Unwinder::new(unwind::rows_for_budget(unwind::DEFAULT_TABLE_BYTES)),
            dumps: DumpStats::default(),
            last_error: None,
            symbol_cache_resets: 0,
            symbol_file_closes: 0,
            cpu_attached,
            waits_attached,
            threads_attached,
        })
    }

    /// Why execs are not tracked by the kernel, if they are not.
    pub(super) fn session_exec_tracking_error(&self) -> Option<String> {
        self.session.exec_tracking_error().map(str::to_string)
    }

    fn run(&mut self, mut rx: mpsc::Receiver<Command>, rt: &Handle) {
        let mut next_drain = Instant::now() + DRAIN_INTERVAL;
        let mut next_dump = Instant::now() + self.config.interval;
        let mut next_scan = Instant::now();
        loop {
            let wake =
                [next_drain, next_dump, next_scan].into_iter().chain(self.windows.iter().map(|w| w.deadline)).min();
            let wait = wake.map_or(DRAIN_INTERVAL, |t| t.saturating_duration_since(Instant::now()));
            match rt.block_on(async { tokio::time::timeout(wait, rx.recv()).await }) {
                Ok(Some(Command::Shutdown { reply })) => {
                    self.drain();
                    self.dump();
                    let _ = reply.send(());
                    return;
                }
                Ok(Some(command)) => self.handle(command),
                // Every handle is gone: the front has stopped. Leave a final dump.
                Ok(None) => {
                    self.drain();
                    self.dump();
                    return;
                }
                Err(_elapsed) => {}
            }
            let now = Instant::now();
            if now >= next_scan {
                self.scan_heap_targets();
                next_scan = now + HEAP_SCAN_INTERVAL;
            }
            if now >= next_drain {
                self.drain();
                next_drain = now + DRAIN_INTERVAL;
            }
            if now >= next_dump {
                self.dump();
                next_dump = now + self.config.interval;
            }
            self.finish_windows();
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Index { viewer, reply } => {
                let _ = reply.send(self.index(viewer));
            }
            Command::Profile { query, reply } => self.query(query, reply),
            Command::Status { reply } => {
                let _ = reply.send(status::render(self));
            }
            Command::Dump { reply } => {
                self.drain();
                self.dump();
                let _ = reply.send(());
            }
            Command::Reload { config, reply } => {
                let _ = reply.send(self.reload(*config));
            }
            Command::Shutdown { .. } => unreachable!("handled by the loop"),
        }
    }

    /// Drains one map set into the aggregate and every open window.
    fn drain(&mut self) {
        let batch = match self.session.drain() {
            Ok(batch) => batch,
            Err(err) => return self.record_error(format!("failed to drain the BPF maps: {err}")),
        };
        let new_stacks = self.agg.learn(&batch);
        self.interval.add(&batch);
        self.total.add(&batch);
        for window in &mut self.windows {
            window.counts.add(&batch);
        }
        match self.unwinder.take_execs(&mut self.session) {
            // A new image is registered now, not after its first sample: until then its
            // stacks would be walked with frame pointers only.
            Ok(pids) => pids.into_iter().for_each(|pid| self.agg.exec_seen(pid)),
            Err(err) => self.record_error(format!("failed to read the processes that called execve: {err}")),
        }
        let gone = self.agg.prune_unsampled(UNSAMPLED_GRACE);
        self.forget_processes(&gone);
        let seen = self.agg.processes().map(|p| (p.pid, p.maps_version));
        if let Err(err) = self.unwinder.sync(&mut self.session, seen, Some(UNWIND_SYNC_BUDGET)) {
            self.record_error(format!("failed to load unwind tables: {err}"));
        }
        self.presymbolize(&batch, &new_stacks);
    }

    /// Symbolizes the addresses of stacks first seen in this drain, so that the dump finds
    /// them in the symbol cache: the cost of reading a file's symbols is paid a little per
    /// drain as stacks appear, and a dump (or a query) only encodes. Only processes the
    /// output selects are symbolized.
    fn presymbolize(&mut self, batch: &Batch, new_stacks: &HashSet<u64>) {
        if new_stacks.is_empty() {
            return;
        }
        let mut by_pid: BTreeMap<u32, Vec<StackSample>> = BTreeMap::new();
        for (pid, sample) in profiles::batch_stacks(batch, new_stacks) {
            by_pid.entry(pid).or_default().push(sample);
        }
        for (pid, samples) in by_pid {
            let Some(process) = self.agg.process(pid) else { continue };
            if self.config.processes.matches(&facts(process)) {
                // The result is dropped: what is kept is the symbolizer's cache.
                let _ = resolve::resolve(process, &self.agg, samples, &mut self.sym);
            }
        }
    }

    /// Reads the live heap blocks into `counts` (then drains, so the stacks they name are
    /// known).
    fn refresh_live(&mut self) {
        if self.heap_pids.is_empty() {
            return;
        }
        let blocks = match self.session.live_blocks() {
            Ok(blocks) => blocks,
            Err(err) => return self.record_error(format!("failed to read the live heap: {err}")),
        };
        self.live_blocks = blocks.len();
        let pids: Vec<u32> = self.heap_pids.keys().copied().collect();
        self.interval.set_live(&pids, &blocks);
        self.total.set_live(&pids, &blocks);
        for window in &mut self.windows {
            window.counts.set_live(&pids, &blocks);
        }
        self.drain();
    }

    /// Writes the interval's profiles, applies retention, forgets exited processes.
    fn dump(&mut self) {
        self.refresh_live();
        let end = SystemTime::now();
        let window = Window {
            start: self.interval_start,
            duration: end.duration_since(self.interval_start).unwrap_or_default(),
        };
        let interval = std::mem::take(&mut self.interval);
        let started = Instant::now();
        let targets = self.dump_targets(&interval);
        let settings = self.settings();
        let counters = self.counters().unwrap_or_default();
        let result = dump::write_interval(
            &self.config,
            &self.agg,
            &interval,
            &targets,
            settings,
            &window,
            end,
            &counters,
            &mut self.sym,
            &mut self.dumps,
        );
        if let Err(message) = result {
            self.record_error(message);
        }
        self.dumps.last_duration = started.elapsed();
        self.interval_start = end;
        self.bound_symbol_caches();
        let grace = self.config.interval.max(Duration::from_secs(60));
        let keep: Vec<&Counts> = std::iter::once(&self.total).chain(self.windows.iter().map(|w| &w.counts)).collect();
        let gone = self.agg.prune(grace, &keep);
        self.total.forget(&gone);
        self.forget_processes(&gone);
    }

    /// Drops what the session and the collector hold for exited processes.
    fn forget_processes(&mut self, gone: &[u32]) {
        if gone.is_empty() {
            return;
        }
        if let Err(err) = self.unwinder.forget(&mut self.session, gone) {
            self.record_error(format!("failed to forget the unwind mappings of exited processes: {err}"));
        }
        let heap_gone: Vec<u32> = gone.iter().copied().filter(|pid| self.heap_pids.contains_key(pid)).collect();
        if let Err(err) = self.session.forget_processes(&heap_gone) {
            self.record_error(format!("failed to clear the heap maps of exited processes: {err}"));
        }
        if self.waits_attached {
            if let Err(err) = self.session.forget_futex_waits(gone) {
                self.record_error(format!("failed to clear the futex waits of exited processes: {err}"));
            }
        }
        for pid in gone {
            self.heap_pids.remove(pid);
            self.heap_failed.remove(pid);
        }
    }

    /// (pid, kinds) to write for the interval: selected processes with data.
    fn dump_targets(&self, interval: &Counts) -> Vec<(u32, Vec<ProfileKind>)> {
        interval
            .iter()
            .filter_map(|(pid, counts)| {
                let process = self.agg.process(pid)?;
                if !self.config.processes.matches(&facts(process)) {
                    return None;
                }
                let mut kinds = Vec::new();
                if self.cpu_attached && counts.cpu_total > 0 {
                    kinds.push(ProfileKind::Cpu);
                }
                if self.heap_pids.contains_key(&pid) {
                    kinds.push(ProfileKind::Heap);
                }
                kinds.extend(FUTEX_KINDS.into_iter().filter(|&k| self.futex_enabled(k) && futex_count(counts, k) > 0));
                (!kinds.is_empty()).then_some((pid, kinds))
            })
            .collect()
    }

    /// Bounds the symbolizer's memory after a dump, in two steps. Past
    /// [`SYMBOLIZER_FILES_BUDGET`] it closes its files (their mapped pages and parsed debug
    /// info are most of its memory, and they include the files of processes long gone) but
    /// keeps the symbols found, so only files with new addresses are opened again. Closing
    /// them after every dump instead cost 2.3x the CPU (each file re-parsed each interval).
    /// Past [`SYMBOLIZER_RSS_BUDGET`] the results go too, and the next dump re-reads what it
    /// needs. Both are counted in /status.
    fn bound_symbol_caches(&mut self) {
        // JITs keep appending to their perf maps: read them afresh for each dump.
        self.sym.forget_perf_maps();
        let rss = resident_bytes().unwrap_or(0);
        if rss > SYMBOLIZER_RSS_BUDGET {
            tracing::debug!("resident memory over budget; dropping the symbol caches");
            self.sym = Symbolizer::new();
            self.symbol_cache_resets += 1;
        } else if rss > SYMBOLIZER_FILES_BUDGET {
            tracing::debug!("resident memory over the files budget; closing the symbolizer's files");
            self.sym.close_files();
            self.symbol_file_closes += 1;
        } else {
            return;
        }
        // Give the freed parsers (and caches) back to the system.
        // SAFETY: malloc_trim only releases free heap memory.
        unsafe { libc::malloc_trim(0) };
    }

    fn settings(&self) -> RenderSettings {
        RenderSettings { frequency_hz: self.config.cpu.frequency_hz, heap_sample_bytes: self.config.heap.sample_bytes }
    }

    fn index(&self, viewer: Viewer) -> Vec<IndexEntry> {
        self.total
            .iter()
            .filter_map(|(pid, counts)| {
                let process = self.agg.process(pid)?;
                let uid = process.info.as_ref().map(|i| i.uid)?;
                if !viewer.may_see(uid) || !self.config.processes.matches(&facts(process)) {
                    return None;
                }
                let mut profiles = Vec::new();
                if self.cpu_attached {
                    profiles.push((ProfileKind::Cpu, counts.cpu_total));
                }
                if self.heap_pids.contains_key(&pid) {
                    profiles.push((ProfileKind::Heap, counts.heap_samples()));
                }
                for kind in FUTEX_KINDS.into_iter().filter(|&k| self.futex_enabled(k)) {
                    profiles.push((kind, futex_count(counts, kind)));
                }
                Some(IndexEntry { pid, name: process.name.clone(), uid, profiles })
            })
            .collect()
    }

    fn query(
        &mut self,
        query: ProfileQuery,
        reply: tokio::sync::oneshot::Sender<std::result::Result<ProfileBody, QueryError>>,
    ) {
        if let Err(err) = self.check_query(&query) {
            let _ = reply.send(Err(err));
            return;
        }
        match query.window {
            Some(_) if self.windows.len() >= MAX_WINDOWS => {
                let _ = reply.send(Err(QueryError::Unavailable(format!(
                    "{MAX_WINDOWS} profile captures are already running; retry later"
                ))));
            }
            Some(duration) => self.windows.push(PendingWindow {
                query,
                start: SystemTime::now(),
                deadline: Instant::now() + duration,
                counts: Counts::default(),
                reply,
            }),
            None => {
                if query.kind.profile_kind() == ProfileKind::Heap {
                    self.refresh_live();
                }
                let window = Window { start: self.started, duration: self.started_at.elapsed() };
                let counts = self.total.process(query.pid).cloned().unwrap_or_default();
                let _ = reply.send(self.answer(&query, &counts, &window));
            }
        }
    }

    /// Whether the viewer may have this profile, and whether it exists.
    fn check_query(&self, query: &ProfileQuery) -> std::result::Result<(), QueryError> {
        let process = self.agg.process(query.pid).ok_or(QueryError::UnknownPid(query.pid))?;
        let uid = process.info.as_ref().map(|i| i.uid);
        if !uid.is_some_and(|uid| query.viewer.may_see(uid)) && query.viewer != Viewer::ROOT {
            return Err(QueryError::Forbidden(query.pid));
        }
        if !self.config.processes.matches(&facts(process)) {
            return Err(QueryError::UnknownPid(query.pid));
        }
        let kind = query.kind.profile_kind();
        let enabled = match kind {
            ProfileKind::Cpu => self.cpu_attached,
            ProfileKind::Heap => self.heap_pids.contains_key(&query.pid),
            ProfileKind::Block | ProfileKind::Mutex | ProfileKind::ThreadCreate => self.futex_enabled(kind),
        };
        if enabled {
            Ok(())
        } else {
            Err(QueryError::NotEnabled(kind))
        }
    }

    fn answer(
        &mut self,
        query: &ProfileQuery,
        counts: &crate::aggregate::ProcessCounts,
        window: &Window,
    ) -> std::result::Result<ProfileBody, QueryError> {
        let process = self.agg.process(query.pid).ok_or(QueryError::UnknownPid(query.pid))?.clone();
        let counters = self.counters().unwrap_or_default();
        let comments = match query.kind.profile_kind() {
            ProfileKind::Heap => {
                profiles::heap_comments("when this profile was taken", &counters, self.config.heap.sample_bytes)
            }
            ProfileKind::Block => profiles::block_comments("daemon query", &counters),
            ProfileKind::Mutex => profiles::mutex_comments("daemon query", &counters),
            ProfileKind::ThreadCreate => profiles::threadcreate_comments("daemon query", &counters),
            ProfileKind::Cpu => profiles::cpu_comments("daemon query", &counters),
        };
        let alloc_default = query.kind == QueryKind::Allocs;
        let profile = render(
            &self.agg,
            &process,
            counts,
            query.kind.profile_kind(),
            alloc_default,
            self.settings(),
            window,
            comments,
            &mut self.sym,
        )
        .ok_or(QueryError::NotEnabled(query.kind.profile_kind()))?;
        let bytes = if query.text { pprof::legacy_text(&profile).into_bytes() } else { pprof::encode_gzip(&profile) };
        Ok(ProfileBody { bytes, text: query.text })
    }

    /// Answers the windows whose time is up.
    fn finish_windows(&mut self) {
        let now = Instant::now();
        let (due, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.windows).into_iter().partition(|w| w.deadline <= now);
        self.windows = waiting;
        if due.is_empty() {
            return;
        }
        self.drain();
        if due.iter().any(|w| w.query.kind.profile_kind() == ProfileKind::Heap) {
            // Updates the open windows' live state; the due ones take it below.
            self.refresh_live();
        }
        for w in due {
            let window = Window { start: w.start, duration: w.start.elapsed().unwrap_or_default() };
            let mut counts = w.counts.process(w.query.pid).cloned().unwrap_or_default();
            if let Some(total) = self.total.process(w.query.pid) {
                // inuse is the state at the end of the window, whenever the block was made.
                counts.heap_live.clone_from(&total.heap_live);
            }
            let _ = w.reply.send(self.answer(&w.query, &counts, &window));
        }
    }

    fn scan_heap_targets(&mut self) {
        if !self.config.is_enabled(ProfileKind::Heap) || self.config.heap.include.is_empty() {
            return;
        }
        for pid in procs::list_pids() {
            if self.heap_pids.contains_key(&pid) || self.heap_failed.contains(&pid) || pid == std::process::id() {
                continue;
            }
            let Ok(name) = procs::read_comm(pid) else { continue };
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            let cgroup = procs::read_cgroup(pid);
            let facts = ProcessFacts { pid, name: &name, exe: exe.as_deref(), cgroup: cgroup.as_deref() };
            if !self.config.heap_profiles(&facts) {
                continue;
            }
            self.agg.track(pid);
            match self.session.attach_heap(pid) {
                Ok(attachment) => {
                    tracing::info!(pid, name, library = attachment.library, "heap probes attached");
                    self.heap_pids.insert(pid, attachment);
                }
                Err(err) => {
                    tracing::warn!(pid, name, error = %err, "cannot heap-profile this process");
                    self.heap_failed.insert(pid);
                }
            }
        }
    }

    /// Applies a new configuration. What the loaded programs fix (CPU frequency, heap
    /// sampling rate, whether CPU sampling runs) needs a restart; everything else applies now.
    fn reload(&mut self, config: Config) -> std::result::Result<(), String> {
        let mut restart_needed = Vec::new();
        if config.cpu.frequency_hz != self.config.cpu.frequency_hz {
            restart_needed.push("cpu.frequency_hz");
        }
        if config.heap.sample_bytes != self.config.heap.sample_bytes {
            restart_needed.push("heap.sample_bytes");
        }
        if config.is_enabled(ProfileKind::Cpu) != self.cpu_attached {
            restart_needed.push("profiles (cpu)");
        }
        let waits = config.is_enabled(ProfileKind::Block) || config.is_enabled(ProfileKind::Mutex);
        if waits && !self.waits_attached {
            restart_needed.push("profiles (block, mutex)");
        }
        if config.is_enabled(ProfileKind::ThreadCreate) && !self.threads_attached {
            restart_needed.push("profiles (threadcreate)");
        }
        if !restart_needed.is_empty() {
            tracing::warn!(keys = ?restart_needed, "these settings take effect after a restart");
        }
        self.config = config;
        self.heap_failed.clear();
        tracing::info!("configuration reloaded");
        Ok(())
    }

    /// Whether a futex-fed profile type is both enabled now and attached since start (a reload
    /// can turn one off, but turning one on needs a restart).
    pub(super) fn futex_enabled(&self, kind: ProfileKind) -> bool {
        let attached = match kind {
            ProfileKind::Block | ProfileKind::Mutex => self.waits_attached,
            ProfileKind::ThreadCreate => self.threads_attached,
            ProfileKind::Cpu | ProfileKind::Heap => false,
        };
        attached && self.config.is_enabled(kind)
    }

    pub(super) fn record_error(&mut self, message: String) {
        tracing::error!("{message}");
        self.last_error = Some(message);
    }

    pub(super) fn counters(&self) -> Option<crate::ebpf::Counters> {
        self.session.counters().ok()
    }

    pub(super) fn output_dir(&self) -> PathBuf {
        self.config.output_dir.clone()
    }
}

/// Resident memory above which the symbolizer's open files are closed after a dump (their
/// symbols found are kept).
const SYMBOLIZER_FILES_BUDGET: u64 = 40 << 20;
/// Resident memory above which the symbol caches are dropped after a dump.
const SYMBOLIZER_RSS_BUDGET: u64 = 96 << 20;

/// This process's resident set size, from `/proc/self/statm`.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The profile types fed by the futex and thread-creation tracepoints.
const FUTEX_KINDS: [ProfileKind; 3] = [ProfileKind::Block, ProfileKind::Mutex, ProfileKind::ThreadCreate];

/// The number of events a futex-fed profile of `counts` holds: waits or threads.
fn futex_count(counts: &crate::aggregate::ProcessCounts, kind: ProfileKind) -> u64 {
    match kind {
        ProfileKind::Block => counts.block_waits(),
        ProfileKind::Mutex => counts.mutex_waits(),
        ProfileKind::ThreadCreate => counts.threads_total(),
        ProfileKind::Cpu | ProfileKind::Heap => 0,
    }
}

/// What the process matchers look at.
fn facts(process: &KnownProcess) -> ProcessFacts<'_> {
    let info = process.info.as_ref();
    ProcessFacts {
        pid: process.pid,
        name: &process.name,
        exe: info.and_then(|i| i.exe.as_deref()),
        cgroup: info.and_then(|i| i.cgroup.as_deref()),
    }
}
