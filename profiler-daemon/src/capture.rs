//! The capture pipeline's head, the one both drivers run (`snapshot` and the daemon's
//! collector): the BPF [`Session`], the [`Catalog`] of processes and stacks, and the
//! [`Unwinder`] that feeds the kernel walker the catalogue's mappings. [`Capture::drain`]
//! flips and reads the kernel's maps, learns what the batch names, registers new and exec'd
//! processes with the unwinder and forgets those that exited without data; what to count and
//! what to write is the caller's business (see `profiles` and `sink`).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::fd::{AsFd, BorrowedFd},
    time::{Duration, Instant},
};

use profiler_common::{maps::STACKS_MAX_ENTRIES, RegisterAsk};

use crate::{
    catalog::{Catalog, Sighting},
    cgroups::{self, CgroupFilter},
    config::{ProcessSelection, StackShares},
    declined::{Declined, DeclinedStats, Seen},
    ebpf::{
        self, Batch, Counters, FutexAttachment, HeapAttachment, LiveBlock, ProgramStats, Session, SessionConfig,
        ShareCaps,
    },
    ids::{Pid, StackId},
    offload::{Heartbeat, Offload, OffloadStats},
    procs::{self, own_pid_namespace, PidNamespace},
    profiles::{self, heap::TargetError, ProfileKind, Settings, Source},
    runtimes::{DumpReader, Readers},
    sideband::{self, FollowLatency, ProcessEvent, Sideband, SidebandStats},
    threads::{DumpJob, DumpOutcome, ThreadDump},
    unwind::{self, HeldTables, Unwinder, UnwinderStats},
};

/// Time per drain spent registering newly seen processes with the unwinder (building their
/// tables); the rest wait for the next drain.
const UNWIND_SYNC_BUDGET: Duration = Duration::from_millis(250);
/// Names from the walkers' asks kept at most until a drain uses them (an ask is made once
/// per process, and its samples come at the next drain or two).
const ASKED_NAMES_KEPT: usize = 4_096;
/// Drains an ask's name waits for its process at most.
const ASKED_NAME_DRAINS: u8 = 2;

/// (tgid, thread name) of one `REGISTER_ASKS` record.
fn parse_ask(bytes: &[u8]) -> Option<(Pid, String)> {
    if bytes.len() < size_of::<RegisterAsk>() {
        return None;
    }
    // SAFETY: at least a record's bytes, read unaligned; every bit pattern is a valid record.
    let ask: RegisterAsk = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let len = ask.comm.iter().position(|&b| b == 0).unwrap_or(ask.comm.len());
    Some((Pid(ask.tgid), String::from_utf8_lossy(&ask.comm[..len]).into_owned()))
}

/// How the catalogue, the selection and a snapshot's pid scope see process `pid`, for
/// [`Declined`].
fn seen(catalog: &Catalog, selection: &ProcessSelection, scope: &[Pid], pid: Pid) -> Seen {
    match catalog.process(pid) {
        None => Seen::Unknown,
        Some(process) if process.exited => Seen::Exited,
        Some(process) if (scope.is_empty() || scope.contains(&pid)) && selection.matches(&process.facts()) => {
            Seen::Selected
        }
        Some(_) => Seen::LeftOut,
    }
}

/// How long a drain registers backlog processes before it follows new ones again.
const UNWIND_SYNC_SLICE: Duration = Duration::from_millis(10);

/// Time at start spent registering the processes already running with the unwinder
/// (building their tables), so their first samples are unwound from tables; the rest are
/// registered at the next drains.
const START_SYNC_BUDGET: Duration = Duration::from_secs(3);

/// Time per batch of process events spent registering what they changed.
const FOLLOW_BUDGET: Duration = Duration::from_millis(100);

/// A batch of process events read this long after its oldest event is logged (debug), with
/// how long it waited: the collector was busy with something else meanwhile.
const LATE_EVENTS: Duration = Duration::from_millis(10);

/// A step of a driver's loop that takes longer than this is logged (debug, [`log_slow`]):
/// process events wait meanwhile unless the step follows them itself.
const SLOW_STEP: Duration = Duration::from_millis(10);

/// Logs (debug) a step that started at `started` if it took longer than [`SLOW_STEP`].
pub fn log_slow(step: &str, started: Instant) {
    let took = started.elapsed();
    if took >= SLOW_STEP {
        tracing::debug!(step, took_ms = took.as_millis() as u64, "slow step");
    }
}

/// How long a process that exited without any data is kept (see `KnownProcess::sampled`): a
/// few drains, so a sample taken just before its exit still finds it.
const UNSAMPLED_GRACE: Duration = Duration::from_secs(3);

/// What to capture, fixed at start.
#[derive(Clone, Debug)]
pub struct CaptureConfig {
    /// Only these processes; empty: every process.
    pub pids: Vec<Pid>,
    /// The kinds whose programs are loaded. The sources of all but the heap are attached at
    /// start; heap probes are attached per process ([`Capture::attach_heap`]).
    pub kinds: Vec<ProfileKind>,
    pub settings: Settings,
    /// Capacity of the live heap block map.
    pub heap_max_live: u32,
    /// Distinct stacks the catalogue keeps, and their frames in all.
    pub max_stacks: usize,
    pub max_frames: usize,
    /// Turn on the kernel's BPF run-time statistics (for benchmarks).
    pub enable_stats: bool,
    /// Beaten while a file read is waited for (the daemon's watchdog follows it).
    pub heartbeat: Option<Heartbeat>,
    /// The processes whose unwind tables are built (the configuration's `[processes]`).
    pub selection: ProcessSelection,
    /// Each process's and uid's share of the kernel's stack table. Not applied when one
    /// process is chosen: it has the table to itself.
    pub shares: StackShares,
    /// Where the unwinder remembers files refused for their cost across restarts (the
    /// daemon's output directory); `None`: in memory only.
    pub state_dir: Option<std::path::PathBuf>,
}

/// Why capturing failed, or what went wrong in a drain without stopping it.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("failed to load the eBPF programs")]
    Load(#[source] ebpf::Error),
    #[error("failed to attach the {0} programs")]
    Attach(&'static str, #[source] ebpf::Error),
    #[error("failed to drain the BPF maps")]
    Drain(#[source] ebpf::Error),
    #[error("failed to read the processes that called execve")]
    Execs(#[source] ebpf::Error),
    #[error("failed to load unwind tables")]
    UnwindTables(#[source] ebpf::Error),
    #[error("failed to forget the kernel state of exited processes")]
    Forget(#[source] ebpf::Error),
    #[error("failed to tell the walkers which processes the selection leaves out; they ask for them again")]
    Decline(#[source] ebpf::Error),
    #[error("failed to read the off-CPU switches still pending; stacks of threads asleep across this dump may be left unnamed")]
    PendingStacks(#[source] ebpf::Error),
    #[error("failed to read the live heap")]
    LiveHeap(#[source] ebpf::Error),
    #[error("cannot heap-profile pid {pid}")]
    HeapTarget {
        pid: Pid,
        #[source]
        source: TargetError,
    },
    #[error("failed to probe the allocator of pid {pid}")]
    HeapAttach {
        pid: Pid,
        #[source]
        source: ebpf::Error,
    },
    #[error("failed to read the BPF counters")]
    Counters(#[source] ebpf::Error),
    #[error("no process {0}: it is not running (or not in the profiler's pid namespace)")]
    NoProcess(Pid),
    #[error("failed to dump the threads of pid {pid}")]
    ThreadDump {
        pid: Pid,
        #[source]
        source: ebpf::Error,
    },
    #[error("failed to find the pid namespace from /proc/self/ns/pid")]
    PidNamespace(#[source] std::io::Error),
}

/// One drain's result.
#[derive(Debug, Default)]
pub struct Drained {
    pub batch: Batch,
    /// Stacks the catalogue stored for the first time.
    pub new_stacks: HashSet<StackId>,
    /// Processes forgotten: they exited without any data.
    pub gone: Vec<Pid>,
    /// Pids reused by a new process since the last drain (see [`Capture::follow`]).
    pub reused: Vec<Pid>,
    /// What went wrong without stopping the drain (already logged; the caller may count it).
    pub problems: Vec<CaptureError>,
}

/// A thread dump begun ([`Capture::start_thread_dump`]): the walk, to run on any thread,
/// and the ticket to end it with ([`Capture::finish_thread_dump`]).
pub struct DumpStarted {
    pub job: DumpJob<'static>,
    pub ticket: DumpTicket,
}

/// What the capture holds for a dump in flight: the tables its walk reads.
#[derive(Debug)]
#[must_use = "a dump's tables stay held until it is finished or abandoned"]
pub struct DumpTicket {
    pid: Pid,
    held: HeldTables,
}

/// The live heap now: the sampled blocks of the probed processes, and a drain after the read
/// (the blocks name stacks still in the kernel's active set).
#[derive(Debug)]
pub struct Live {
    pub pids: Vec<Pid>,
    pub blocks: Vec<LiveBlock>,
    pub drained: Drained,
}

/// The loaded programs, the catalogue and the unwinder, drained together.
pub struct Capture {
    session: Session,
    catalog: Catalog,
    unwinder: Unwinder,
    /// The chosen processes; empty: every process.
    scope: Vec<Pid>,
    sources: HashSet<Source>,
    heap: BTreeMap<Pid, HeapAttachment>,
    futex: Option<FutexAttachment>,
    /// The pid namespace profiled, when it is not the initial one.
    pid_namespace: Option<PidNamespace>,
    /// The processes whose unwind tables are built (the configuration's `[processes]`);
    /// the others are walked with frame pointers only, and cost no table.
    selection: ProcessSelection,
    /// A handle on the stall state the unwinder's file worker shares, for the symbolizer's.
    files: Offload,
    /// The kernel's process events (forks, execs, mappings, exits); `None` when they could
    /// not be opened (then `/proc` is read at each exec and first sample, as before).
    sideband: Option<Sideband>,
    /// Why the side band is not open, if it is not.
    sideband_error: Option<String>,
    /// The walkers' asks to register a process they met unregistered: the side band is read
    /// at once when one comes, even while a storm of records is read at a slower pace.
    asks: Option<aya::maps::RingBuf<aya::maps::MapData>>,
    /// Asks read since start.
    asks_read: u64,
    /// The names the walkers' asks gave (see [`RegisterAsk`]), for processes nothing else
    /// names, with the drains each may still wait for its process: an ask comes with a
    /// walk, whose sample the next drain or the one after learns; kept no longer, so a pid
    /// reused later never takes an old name. Bounded by [`ASKED_NAMES_KEPT`].
    asked_names: HashMap<Pid, (String, u8)>,
    /// The processes asked for that the selection leaves out, told to the kernel so that
    /// their walks stop asking (see [`crate::declined`]).
    declined: Declined,
    /// What the kernel filters by cgroup (from `selection`).
    cgroup_filter: CgroupFilter,
    /// Pids reused while a drain followed events after taking its batch: reported with the
    /// next drain.
    reused_since_drain: Vec<Pid>,
    /// Thread dumps' readers of interpreted frames (what each process runs, its code objects).
    runtimes: Readers,
    /// Processes followed since their `exec` (its time, `CLOCK_MONOTONIC` ns) whose new
    /// image is not registered with the unwinder yet.
    unregistered_execs: HashMap<Pid, u64>,
    /// How long each exec'd process waited for its registration.
    follow_latency: FollowLatency,
}

impl Capture {
    /// Loads the programs for `config.kinds`, registers the chosen processes with the
    /// unwinder (so their first samples are unwound from tables, not frame pointers), and
    /// attaches every source but the heap probes.
    pub fn start(config: &CaptureConfig) -> Result<Self, CaptureError> {
        let sources: HashSet<Source> = config.kinds.iter().map(|k| k.source()).collect();
        let pid_namespace = own_pid_namespace().map_err(CaptureError::PidNamespace)?;
        let pid_namespace = (!pid_namespace.is_initial()).then_some(pid_namespace);
        if let Some(ns) = pid_namespace {
            tracing::info!(
                inode = ns.ino,
                "running in a pid namespace of its own: profiling the processes of this namespace only, under \
                 their pids here; to profile the whole machine, share the host's pid namespace (e.g. docker \
                 --pid=host, Kubernetes hostPID)"
            );
        }
        let mut session = Session::load(&SessionConfig {
            pids: config.pids.clone(),
            heap_sample_bytes: config.settings.heap_sample_bytes,
            heap_max_live: config.heap_max_live,
            heap: sources.contains(&Source::HeapProbes),
            waits: sources.contains(&Source::FutexWaits),
            threads: sources.contains(&Source::ThreadCreation),
            offcpu: sources.contains(&Source::Switches),
            thread_dumps: sources.contains(&Source::TaskIterator),
            enable_stats: config.enable_stats,
            unwind_rows: unwind::rows_for_budget(unwind::DEFAULT_TABLE_BYTES),
            pid_namespace,
            share_caps: {
                let shares = if config.pids.len() == 1 { StackShares::NONE } else { config.shares };
                ShareCaps::of_table(STACKS_MAX_ENTRIES, shares.process_percent, shares.uid_percent)
            },
        })
        .map_err(CaptureError::Load)?;
        let files = Offload::new("offload-unwind", config.heartbeat.clone());
        let unwinder = Unwinder::new(&session, files.sibling("offload-unwind"), config.state_dir.as_deref());
        // Opened before `/proc` is read: a process started meanwhile is in one or the other.
        let (sideband, sideband_error) = match Sideband::open() {
            Ok(sideband) => {
                // Costs a little more to follow execs without it, nothing worse.
                if let Err(err) = session.take_failed_execs_only() {
                    tracing::warn!("every exec is read from the kernel twice: {}", crate::error::chain(&err));
                }
                (Some(sideband), None)
            }
            Err(err) => {
                let reason = crate::error::chain(&err);
                tracing::warn!("process events unavailable; short-lived processes may lose their symbols: {reason}");
                (None, Some(reason))
            }
        };
        // Without it a walker's ask goes unheard: the process is registered at the next drain.
        let asks = match session.take_register_asks() {
            Ok(asks) => Some(asks),
            Err(err) => {
                tracing::warn!(
                    "processes first sampled during a storm of process events may be registered late: {}",
                    crate::error::chain(&err)
                );
                None
            }
        };
        let mut catalog = Catalog::with_limits(config.max_stacks, config.max_frames);
        if sideband.is_some() {
            catalog.follow_exits();
        }
        let mut capture = Self {
            session,
            catalog,
            unwinder,
            scope: config.pids.clone(),
            sources: HashSet::new(),
            heap: BTreeMap::new(),
            futex: None,
            pid_namespace,
            selection: config.selection.clone(),
            files,
            sideband,
            sideband_error,
            asks,
            asks_read: 0,
            asked_names: HashMap::new(),
            declined: Declined::default(),
            reused_since_drain: Vec::new(),
            cgroup_filter: CgroupFilter::default(),
            runtimes: Readers::default(),
            unregistered_execs: HashMap::new(),
            follow_latency: FollowLatency::default(),
        };
        capture.filter_cgroups();
        // Processes running now are read from `/proc` and registered with the unwinder before
        // anything is sampled, within a budget (the rest at the next drains): their first
        // samples are unwound from tables, not frame pointers. The profiler too: its own
        // table (140,000 rows) built at the first drain that samples it would hold back the
        // registration of every process started meanwhile by its 25 ms or more.
        let running: Vec<Pid> = if config.pids.is_empty() {
            procs::list_pids().into_iter().map(Pid).collect()
        } else {
            config.pids.clone()
        };
        for pid in running {
            capture.catalog.track(pid);
        }
        let budget = if config.pids.is_empty() { Some(START_SYNC_BUDGET) } else { None };
        capture.sync_unwinder(budget, false).map_err(CaptureError::UnwindTables)?;
        for source in
            [Source::CpuClock, Source::FutexWaits, Source::ThreadCreation, Source::TaskIterator, Source::Switches]
        {
            if sources.contains(&source) {
                capture.attach(source, &config.settings)?;
            }
        }
        if sources.contains(&Source::HeapProbes) {
            capture.sources.insert(Source::HeapProbes);
        }
        Ok(capture)
    }

    fn attach(&mut self, source: Source, settings: &Settings) -> Result<(), CaptureError> {
        match source {
            Source::CpuClock => {
                self.session.attach_cpu(settings.frequency_hz).map_err(|e| CaptureError::Attach("cpu", e))?
            }
            Source::FutexWaits => {
                let attached = self
                    .session
                    .attach_waits(settings.block_rate_ns, settings.mutex_fraction)
                    .map_err(|e| CaptureError::Attach("futex", e))?;
                tracing::info!(tracepoints = ?attached.attached, missing = ?attached.missing, "futex tracepoints attached");
                self.futex = Some(attached);
            }
            Source::ThreadCreation => {
                self.session.attach_threads().map_err(|e| CaptureError::Attach("thread-creation", e))?
            }
            Source::Switches => self
                .session
                .attach_offcpu(settings.offcpu_sample_every, settings.offcpu_rate_ns)
                .map_err(|e| CaptureError::Attach("off-cpu", e))?,
            // Loaded with the session; nothing to attach until a dump reads it.
            Source::HeapProbes | Source::TaskIterator => {}
        }
        self.sources.insert(source);
        Ok(())
    }

    /// Whether the programs of `source` were loaded at start (heap: whether probes may be
    /// attached; which processes have them is [`Capture::heap_attachment`]).
    pub fn has(&self, source: Source) -> bool {
        self.sources.contains(&source)
    }

    /// Probes the C library of `pid` (heap profiling). A process already probed keeps its
    /// probes.
    pub fn attach_heap(&mut self, pid: Pid) -> Result<&HeapAttachment, CaptureError> {
        if !self.heap.contains_key(&pid) {
            let target = profiles::heap::target(pid).map_err(|source| CaptureError::HeapTarget { pid, source })?;
            self.catalog.track(pid);
            let attachment =
                self.session.attach_heap(&target).map_err(|source| CaptureError::HeapAttach { pid, source })?;
            self.heap.insert(pid, attachment);
        }
        Ok(&self.heap[&pid])
    }

    /// What was probed in `pid`, if it is heap-profiled.
    pub fn heap_attachment(&self, pid: Pid) -> Option<&HeapAttachment> {
        self.heap.get(&pid)
    }

    /// The heap-profiled processes.
    pub fn heap_pids(&self) -> Vec<Pid> {
        self.heap.keys().copied().collect()
    }

    /// Waits until process events arrive (then [`Capture::follow`] them), `other` is
    /// readable, or `timeout` passes. Without a side band (it failed to open) only `other`
    /// and the timeout end the wait; events are then read from `/proc` at drains.
    pub fn wait(&mut self, other: Option<BorrowedFd<'_>>, timeout: Duration) -> sideband::Woken {
        let urgent = self.asks.as_ref().map(AsFd::as_fd);
        let woken = match &self.sideband {
            Some(sideband) => sideband.wait(other, urgent, timeout),
            None => {
                let callers = sideband::Callers::new(other, urgent);
                callers.woken(&sideband::poll(callers.fds(), timeout), false)
            }
        };
        if woken.urgent {
            self.read_asks();
        }
        woken
    }

    /// Empties the walkers' asks: what they ask for (the side band read now) is the caller's
    /// next step; the ring must be empty for the next ask to wake the loop again.
    fn read_asks(&mut self) {
        let Some(asks) = &mut self.asks else { return };
        while let Some(ask) = asks.next() {
            if let Some((pid, name)) = parse_ask(&ask) {
                tracing::trace!(%pid, name, "a walker asked for a registration");
                if self.asked_names.len() >= ASKED_NAMES_KEPT {
                    self.asked_names.clear();
                }
                if !name.is_empty() {
                    self.asked_names.insert(pid, (name, ASKED_NAME_DRAINS));
                }
                self.declined.asked(pid);
            }
            self.asks_read += 1;
        }
    }

    /// Applies the kernel's process events since the last call (forks, execs, mappings,
    /// exits) to the catalogue and registers what they changed with the unwinder at once:
    /// a process that lives 20 ms is known, and unwound from tables, before it exits.
    /// Returns the pids a new process reused after the old one exited: what the old one
    /// left in the kernel (its registration, heap probes and blocks, waits) is dropped here,
    /// and the caller drops what it counted for it, so none of it shows under the new one.
    pub fn follow(&mut self) -> Vec<Pid> {
        let Some(sideband) = &mut self.sideband else { return Vec::new() };
        let mut events = sideband.read();
        if !self.scope.is_empty() {
            let scope = &self.scope;
            events.retain(|event| event.pid().is_none_or(|pid| scope.contains(&pid)));
        }
        // A process outside the profiler's pid namespace is reported with pid 0.
        events.retain(|event| event.pid() != Some(Pid(0)));
        if events.is_empty() {
            return Vec::new();
        }
        let read_at = sideband::now_ns();
        let oldest = events.iter().map(ProcessEvent::time).filter(|&t| t != 0).min().unwrap_or(read_at);
        if read_at.saturating_sub(oldest) >= LATE_EVENTS.as_nanos() as u64 {
            let waited_ms = read_at.saturating_sub(oldest) / 1_000_000;
            tracing::debug!(waited_ms, events = events.len(), "process events read late");
        }
        let applied = self.catalog.apply(&events);
        for event in &events {
            if let ProcessEvent::Exec { pid, time, .. } = event {
                self.unregistered_execs.insert(*pid, *time);
                self.unwinder.execed([*pid]);
            }
        }
        self.filter_new_cgroups(&applied.cgroups);
        if !applied.reused.is_empty() {
            tracing::debug!(pids = ?applied.reused, "pids reused by new processes");
            let mut problems = self.forget(&applied.reused);
            // Now, not when due: the new process must not be walked with the old one's
            // mappings even if it is never registered.
            if let Err(err) = self.session.flush_unwind_removals() {
                problems.push(CaptureError::Forget(err));
            }
            for problem in problems {
                tracing::warn!("{}", crate::error::chain(&problem));
            }
        }
        if applied.lost > 0 {
            tracing::debug!(lost = applied.lost, "process event records lost (a ring was full)");
        }
        // An exited process's registration is of no more use to the walker: it leaves the
        // kernel's process maps now, not when the catalogue forgets the process (a snapshot
        // keeps every process it sampled until its end; a daemon, until its next dump), or
        // a machine running hundreds of programs a second would fill them.
        let exited: Vec<Pid> =
            applied.exited.iter().copied().filter(|&pid| self.catalog.process(pid).is_some_and(|p| p.exited)).collect();
        self.unwinder.forget(&mut self.session, &exited);
        if self.session.unwind_removals_due() {
            if let Err(err) = self.session.flush_unwind_removals() {
                tracing::warn!("{}", crate::error::chain(&CaptureError::Forget(err)));
            }
        }
        // A process whose exit is in this same batch (most of a shell's short commands) is
        // not registered: every sample it will ever have was already walked, so its tables
        // would be written only to be removed (a 776 B or 6 KiB map entry each, most of what
        // following 500 execs a second cost).
        for &(child, parent) in &applied.forked {
            // Registered as its parent is, at once; `sync_changed` then finds it up to date.
            let selected = self.catalog.process(child).filter(|p| !p.exited && self.selection.matches(&p.facts()));
            let parent_version = self.catalog.process(parent).map(|p| p.maps_version);
            if let (Some(process), Some(parent_version)) = (selected, parent_version) {
                let version = process.maps_version;
                if let Err(err) = self.unwinder.inherit(&mut self.session, child, version, parent, parent_version) {
                    tracing::warn!("{}", crate::error::chain(&CaptureError::UnwindTables(err)));
                }
            }
        }
        if !applied.changed.is_empty() {
            if let Err(err) = self.sync_changed(&applied.changed, FOLLOW_BUDGET) {
                tracing::warn!("{}", crate::error::chain(&CaptureError::UnwindTables(err)));
            }
        }
        self.count_registered_execs();
        if self.declined.has_pending() {
            let (catalog, selection, scope) = (&self.catalog, &self.selection, &self.scope);
            let settled = self.declined.settle_asks(&mut self.session, |pid| seen(catalog, selection, scope, pid));
            if let Err(err) = settled {
                tracing::warn!("{}", crate::error::chain(&CaptureError::Decline(err)));
            }
        }
        applied.reused
    }

    /// Counts how long after its exec each process just registered waited; forgets those
    /// that exited, or that the selection leaves out, unregistered.
    fn count_registered_execs(&mut self) {
        if self.unregistered_execs.is_empty() {
            return;
        }
        let now = sideband::now_ns();
        let (catalog, unwinder, selection) = (&self.catalog, &self.unwinder, &self.selection);
        let latency = &mut self.follow_latency;
        self.unregistered_execs.retain(|&pid, &mut exec_time| {
            let Some(process) = catalog.process(pid).filter(|p| selection.matches(&p.facts())) else {
                return false;
            };
            if process.exited {
                latency.exited_unregistered += 1;
                tracing::trace!(pid = pid.0, "exec'd process exited before it was registered with the unwinder");
                return false;
            }
            if unwinder.registered_version(pid) != Some(process.maps_version) {
                return true;
            }
            let latency_us = now.saturating_sub(exec_time) / 1_000;
            tracing::trace!(pid = pid.0, latency_us, "exec'd process registered with the unwinder");
            latency.record(latency_us);
            false
        });
    }

    /// How long exec'd processes waited for their registration with the unwinder.
    pub fn follow_latency(&self) -> FollowLatency {
        self.follow_latency
    }

    /// What the side band delivered, and why it is closed if it is.
    pub fn sideband_stats(&self) -> (Option<SidebandStats>, Option<&str>) {
        let stats = self.sideband.as_ref().map(|s| SidebandStats { asks: self.asks_read, ..s.stats() });
        (stats, self.sideband_error.as_deref())
    }

    /// Flips the map sets and drains the idle one: learns the processes and stacks it names,
    /// registers the processes that called `execve` (before their first sample) and the new
    /// ones with the unwinder, and forgets processes that exited without data.
    pub fn drain(&mut self) -> Result<Drained, CaptureError> {
        // Before the samples: the processes they name are known with their mappings.
        let mut reused = std::mem::take(&mut self.reused_since_drain);
        reused.extend(self.follow());
        let exited_unsampled = self.catalog.exited_unsampled();
        let started = Instant::now();
        let settled = self.session.flip().map_err(CaptureError::Drain)?;
        // Until the old set settles, process events are followed as they come.
        while let Some(left) = settled.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            if self.wait(None, left).records {
                reused.extend(self.follow());
            }
        }
        let batch = self.session.drain_flipped().map_err(CaptureError::Drain)?;
        log_slow("drain: read the maps", started);
        self.read_asks();
        let new_stacks = self.catalog.learn(&batch.stacks, &profiles::sightings(&batch));
        // A process whose fork's record was lost (the side band's rings overflow under a
        // storm of thread events while this thread is busy) and that exited before `/proc`
        // was read has no name but the one its walker's ask gave.
        self.asked_names.retain(|&pid, (name, drains)| {
            *drains -= 1;
            !self.catalog.name_if_unnamed(pid, name) && *drains > 0
        });
        self.catalog.note_over_share(&batch.over_share);
        let mut problems = Vec::new();
        let (catalog, selection, scope) = (&self.catalog, &self.selection, &self.scope);
        if let Err(err) = self.declined.settle(&mut self.session, |pid| seen(catalog, selection, scope, pid)) {
            problems.push(CaptureError::Decline(err));
        }
        match self.unwinder.take_execs(&mut self.session) {
            // A new image is registered now, not after its first sample: until then its
            // stacks would be walked with frame pointers only.
            // With the side band, the exec's events already told its new mappings (and the
            // unwinder, told of the exec above, registers it again); what the kernel lists
            // then are the failed execs, whose process the unwinder just forgot and
            // registers again below with the mappings it still has.
            Ok(_) if self.sideband.is_some() => {}
            Ok(pids) => {
                for pid in pids {
                    if self.in_scope(pid) {
                        self.catalog.exec_seen(pid);
                    }
                }
            }
            Err(err) => problems.push(CaptureError::Execs(err)),
        }
        // Probes of an exited process go now, not after the catalogue's grace: each holds
        // descriptors, and a pool of short-lived workers would exhaust them. What they
        // counted was drained above.
        let exited: Vec<Pid> = self.heap.keys().copied().filter(|pid| !procs::exists(pid.0)).collect();
        if let Err(err) = self.session.detach_heap(&exited) {
            problems.push(CaptureError::Forget(err));
        }
        let scope = self.scope.clone();
        let mut gone = self.catalog.prune_unsampled(UNSAMPLED_GRACE);
        gone.extend(self.catalog.forget_unsampled(&exited_unsampled));
        gone.retain(|pid| !scope.contains(pid));
        problems.extend(self.forget(&gone));
        if let Err(err) = self.session.flush_unwind_removals() {
            problems.push(CaptureError::Forget(err));
        }
        // The backlog (processes seen in /proc, not yet registered) goes in slices, the side
        // band's new processes between them: a program started now must not wait the whole
        // budget behind processes that have run for hours.
        let started = Instant::now();
        let deadline = Instant::now() + UNWIND_SYNC_BUDGET;
        loop {
            // Events that came while the maps were read, or while the last slice ran.
            if self.sideband.as_ref().is_some_and(Sideband::has_records) {
                // Reported with the next drain: this batch was taken before the reuse, so
                // its samples are the old process's.
                let more = self.follow();
                self.reused_since_drain.extend(more);
            }
            match self.sync_unwinder(Some(UNWIND_SYNC_SLICE), true) {
                Ok(true) => break,
                Ok(false) if Instant::now() < deadline => {}
                Ok(false) => break,
                Err(err) => {
                    problems.push(CaptureError::UnwindTables(err));
                    break;
                }
            }
        }
        log_slow("drain: sync the unwinder", started);
        self.count_registered_execs();
        for problem in &problems {
            tracing::warn!("{}", crate::error::chain(problem));
        }
        Ok(Drained { batch, new_stacks, gone, reused, problems })
    }

    /// Dumps every thread of `pid` now, on this thread: [`Capture::start_thread_dump`], the
    /// walk, [`Capture::finish_thread_dump`].
    pub fn thread_dump(&mut self, pid: Pid) -> Result<ThreadDump, CaptureError> {
        let DumpStarted { job, ticket } = self.start_thread_dump(pid)?;
        let walked = job.run();
        self.finish_thread_dump(ticket, walked)
    }

    /// Begins a dump of every thread of `pid` (see [`crate::threads`]): registers the process
    /// with the unwinder if it is not yet (so that its frames are stepped with tables), holds
    /// its tables loaded, and takes what the walk needs. The walk ([`DumpJob::run`]) may run
    /// on another thread; its outcome goes back to [`Capture::finish_thread_dump`] with the
    /// ticket. One dump at a time: the interpreters' code caches go with the walk.
    pub fn start_thread_dump(&mut self, pid: Pid) -> Result<DumpStarted, CaptureError> {
        if !procs::exists(pid.0) {
            return Err(CaptureError::NoProcess(pid));
        }
        self.catalog.track(pid);
        if let Some(process) = self.catalog.process(pid) {
            let registration = [(pid, process.maps_version, process.maps())];
            self.unwinder.sync(&mut self.session, registration, None, &|| false).map_err(CaptureError::UnwindTables)?;
        }
        let runtime = self.catalog.process(pid).and_then(|process| self.runtimes.begin_dump(process));
        let held = self.unwinder.hold(pid);
        match DumpJob::prepare(&self.session, pid, runtime) {
            Ok(job) => Ok(DumpStarted { job, ticket: DumpTicket { pid, held } }),
            Err(unprepared) => {
                let (source, runtime) = *unprepared;
                self.abandon_thread_dump(DumpTicket { pid, held }, runtime);
                Err(CaptureError::ThreadDump { pid, source })
            }
        }
    }

    /// Ends a dump begun by [`Capture::start_thread_dump`] with its walk's outcome: lets go
    /// of the tables, takes the code caches back, and learns the dump's stacks so that
    /// they resolve like any other.
    pub fn finish_thread_dump(
        &mut self,
        ticket: DumpTicket,
        (walked, runtime): DumpOutcome<'static>,
    ) -> Result<ThreadDump, CaptureError> {
        let pid = ticket.pid;
        let read = runtime.map(|runtime| self.runtimes.take_back(runtime));
        self.abandon_thread_dump(ticket, None);
        let mut dump = walked.map_err(|source| CaptureError::ThreadDump { pid, source })?;
        if let Some(read) = read {
            dump.apply_runtime(read);
        }
        let stacks: HashMap<StackId, Vec<u64>> =
            dump.stacks().filter(|(id, _)| id.is_some()).map(|(id, frames)| (id, frames.to_vec())).collect();
        let seen: Vec<Sighting<'_>> = dump
            .threads
            .iter()
            .map(|t| Sighting {
                pid,
                user_stack: dump.stack_id(&t.user),
                kernel_stack: dump.stack_id(&t.kernel),
                user_leaf_is_return: false,
                main_thread_name: None,
            })
            .collect();
        self.catalog.learn(&stacks, &seen);
        Ok(dump)
    }

    /// Ends a dump whose walk gave nothing (it failed to start, or its thread died): lets
    /// go of the tables, and takes the code caches back if they came back.
    pub fn abandon_thread_dump(&mut self, ticket: DumpTicket, runtime: Option<DumpReader<'static>>) {
        self.unwinder.release_held(ticket.held);
        if let Some(runtime) = runtime {
            self.runtimes.take_back(runtime);
        }
    }

    /// Reads the live heap blocks, then drains (see [`Live`]).
    pub fn live(&mut self) -> Result<Live, CaptureError> {
        let blocks = self.session.live_blocks().map_err(CaptureError::LiveHeap)?;
        let drained = self.drain()?;
        Ok(Live { pids: self.heap_pids(), blocks, drained })
    }

    /// Forgets processes not seen for `grace` that have exited, and stacks not in `keep`.
    /// Returns the pids forgotten, and what could not be cleared in the kernel.
    pub fn prune(&mut self, grace: Duration, keep: &HashSet<StackId>) -> (Vec<Pid>, Vec<CaptureError>) {
        let mut problems = Vec::new();
        let mut keep = std::borrow::Cow::Borrowed(keep);
        if self.has(Source::Switches) {
            // A thread still asleep since a sampled switch-out whose stacks were walked then:
            // its time is charged (and names these stacks) only when it runs again.
            if let Err(err) = self.session.pending_offcpu_stacks(keep.to_mut()) {
                problems.push(CaptureError::PendingStacks(err));
            }
        }
        let gone = self.catalog.prune(grace, &keep);
        problems.extend(self.forget(&gone));
        (gone, problems)
    }

    /// Drops what the unwinder, the kernel maps and the heap attachments hold for `gone`.
    fn forget(&mut self, gone: &[Pid]) -> Vec<CaptureError> {
        let mut problems = Vec::new();
        if gone.is_empty() {
            return problems;
        }
        self.unwinder.forget(&mut self.session, gone);
        let heap_gone: Vec<Pid> = gone.iter().copied().filter(|pid| self.heap.contains_key(pid)).collect();
        if let Err(err) = self.session.detach_heap(&heap_gone) {
            problems.push(CaptureError::Forget(err));
        }
        if let Err(err) = self.session.forget_heap(&heap_gone) {
            problems.push(CaptureError::Forget(err));
        }
        for pid in gone {
            self.heap.remove(pid);
        }
        problems
    }

    fn in_scope(&self, pid: Pid) -> bool {
        self.scope.is_empty() || self.scope.contains(&pid)
    }

    fn sync_unwinder(&mut self, budget: Option<Duration>, give_way: bool) -> ebpf::Result<bool> {
        let selection = &self.selection;
        let processes = self
            .catalog
            .processes()
            .filter(move |p| !p.exited && selection.matches(&p.facts()))
            .map(|p| (p.pid, p.maps_version, p.maps()));
        // The backlog at a drain gives way as soon as process events wait, so that a process
        // started now is registered before the next old one.
        let sideband = self.sideband.as_ref().filter(|_| give_way);
        let events_waiting = || sideband.is_some_and(Sideband::has_records);
        self.unwinder.sync(&mut self.session, processes, budget, &events_waiting)
    }

    /// Registers `pids` (the processes a batch of events changed) with the unwinder, and
    /// nothing else: they run now, and a short-lived one must not wait behind a backlog of
    /// older processes (those are registered at the drains).
    fn sync_changed(&mut self, pids: &[Pid], budget: Duration) -> ebpf::Result<()> {
        let (selection, catalog) = (&self.selection, &self.catalog);
        let processes = pids
            .iter()
            .filter_map(|pid| catalog.process(*pid))
            .filter(move |p| !p.exited && selection.matches(&p.facts()))
            .map(|p| (p.pid, p.maps_version, p.maps()));
        self.unwinder.sync(&mut self.session, processes, Some(budget), &|| false).map(|_| ())
    }

    /// Caps each process's share of the catalogue's stacks (see [`Catalog::set_process_share`]).
    pub fn set_process_share(&mut self, percent: u32) {
        self.catalog.set_process_share(percent);
    }

    /// Builds unwind tables only for the processes `selection` matches from now on (a
    /// process already registered keeps its tables until it exits).
    pub fn select(&mut self, selection: &ProcessSelection) {
        self.selection = selection.clone();
        self.filter_cgroups();
        // Any process may be selected now: each asks again at its next walk.
        if let Err(err) = self.declined.clear(&mut self.session) {
            tracing::warn!("{}", crate::error::chain(&CaptureError::Decline(err)));
        }
    }

    /// The processes whose walks were told not to ask for a registration.
    pub fn declined_stats(&self) -> DeclinedStats {
        self.declined.stats()
    }

    /// Tells the kernel which cgroups the selection's cgroup and unit matchers select, from
    /// the hierarchy as it is now (new cgroups are added as the side band reports them).
    fn filter_cgroups(&mut self) {
        let root = cgroups::cgroup2_root();
        let filter = match root {
            Some(root) if CgroupFilter::applies(&self.selection) => {
                CgroupFilter::for_selection(&self.selection, &cgroups::scan(&root))
            }
            _ => CgroupFilter::default(),
        };
        self.set_cgroup_filter(filter);
    }

    fn set_cgroup_filter(&mut self, filter: CgroupFilter) {
        if filter == self.cgroup_filter {
            return;
        }
        let mode = filter.mode.unwrap_or(ebpf::CgroupFilterMode::Off);
        match self.session.set_cgroup_filter(mode, &filter.ids) {
            Ok(()) => self.cgroup_filter = filter,
            Err(err) => tracing::warn!(
                "cgroup and unit matchers are applied in userspace only (every process is walked): {}",
                crate::error::chain(&err)
            ),
        }
    }

    /// Adds the cgroups just created that the selection's matchers select (or exclude).
    fn filter_new_cgroups(&mut self, created: &[(u64, String)]) {
        if created.is_empty() || self.cgroup_filter.mode.is_none() {
            return;
        }
        let fresh = CgroupFilter::for_selection(&self.selection, created);
        let mut filter = self.cgroup_filter.clone();
        filter.ids.extend(fresh.ids);
        self.set_cgroup_filter(filter);
    }

    /// A symbolizer whose file reads skip the devices the unwinder found stalled, and the
    /// other way round.
    pub fn symbolizer(&self) -> crate::symbolize::Symbolizer {
        crate::symbolize::Symbolizer::with_offload(self.files.sibling("offload-symbols"))
    }

    /// What the file workers (the unwinder's and the symbolizers') did.
    pub fn offload_stats(&self) -> OffloadStats {
        self.files.stats()
    }

    /// What is known of the processes and stacks captured so far.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Registers a process before it has data (a heap target found by a scan).
    pub fn track(&mut self, pid: Pid) {
        self.catalog.track(pid);
    }

    /// Reads the owner of a process known from events only (see [`Catalog::inspect`]).
    pub fn inspect(&mut self, pid: Pid) {
        self.catalog.inspect(pid);
    }

    /// The kernel's counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters, CaptureError> {
        self.session.counters().map_err(CaptureError::Counters)
    }

    /// What the unwinder did so far.
    pub fn unwinder_stats(&self) -> UnwinderStats {
        self.unwinder.stats()
    }

    /// Why execs are not tracked by the kernel, if they are not.
    pub fn exec_tracking_error(&self) -> Option<&str> {
        self.session.exec_tracking_error()
    }

    /// The pid namespace profiled, when it is not the initial one.
    pub fn pid_namespace(&self) -> Option<PidNamespace> {
        self.pid_namespace
    }

    /// The futex tracepoints attached and missing, if the futex programs are.
    pub fn futex_attachment(&self) -> Option<&FutexAttachment> {
        self.futex.as_ref()
    }

    /// The kernel's run-time statistics of a program (with `enable_stats`); `None` if it was
    /// not loaded.
    pub fn program_stats(&self, program: &'static str) -> ebpf::Result<Option<ProgramStats>> {
        self.session.program_stats(program)
    }
}
