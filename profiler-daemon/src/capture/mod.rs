//! The capture pipeline's head, the one both drivers run (`snapshot` and the daemon's
//! collector): the BPF [`Session`], the [`Catalog`] of processes and stacks, and the
//! [`Unwinder`] that feeds the kernel walker the catalogue's mappings. This file owns the
//! [`Capture`] (its start, its sources, heap probes and thread dumps); its children add to it:
//! `follow` (the kernel's process events and the walkers' asks), `drain` (reading the maps,
//! and forgetting what exited) and `scope` (which processes are selected and registered with
//! the unwinder). What to count and what to write is the caller's business (see `profiles`
//! and `sink`).

mod drain;
mod follow;
mod scope;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, Instant},
};

use profiler_common::{maps::STACKS_MAX_ENTRIES, sampling::MUTEX_OFF};

use crate::{
    catalog::{Catalog, Sighting},
    cgroups::CgroupFilter,
    config::{ProcessSelection, StackShares},
    declined::Declined,
    ebpf::{
        self, Batch, Counters, HeapAttachment, LiveBlock, ProgramStats, RegisterAsks, Session, SessionConfig, ShareCaps,
    },
    heartbeat::Heartbeat,
    ids::{Pid, StackId},
    offload::{Offload, OffloadStats},
    procs::{self, own_pid_namespace, PidNamespace},
    profiles::{self, heap::TargetError, ProfileKind, Settings, Source},
    runtimes::{DumpReader, Readers},
    sideband::{FollowLatency, Sideband},
    thread_dump::{DumpJob, DumpOutcome, ThreadDump},
    unwind::{self, HeldTables, Unwinder, UnwinderStats},
};

/// Time at start spent registering the processes already running with the unwinder
/// (building their tables), so their first samples are unwound from tables; the rest are
/// registered at the next drains.
const START_SYNC_BUDGET: Duration = Duration::from_secs(3);

/// How often both drivers drain the kernel's maps: often enough that a short-lived process
/// is inspected while it is alive, and its stacks are read before the maps fill.
pub const DRAIN_INTERVAL: Duration = Duration::from_secs(1);

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
    asks: Option<RegisterAsks>,
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
        let sources: HashSet<Source> = Source::of_kinds(&config.kinds).collect();
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
        let mut session =
            Session::load(&session_config(config, &sources, pid_namespace)).map_err(CaptureError::Load)?;
        let files = Offload::new("offload-unwind", config.heartbeat.clone());
        let unwinder = Unwinder::new(&session, files.sibling("offload-unwind"), config.state_dir.as_deref());
        // Opened before `/proc` is read: a process started meanwhile is in one or the other.
        let (sideband, sideband_error) = open_sideband(&mut session);
        let asks = open_asks(&mut session);
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
        capture.register_running(&config.pids)?;
        capture.attach_all(&sources, &config.settings, config.kinds.contains(&ProfileKind::Mutex))?;
        Ok(capture)
    }

    /// Reads the processes running now from `/proc` and registers them with the unwinder
    /// before anything is sampled, within a budget (the rest at the next drains, see
    /// [`start_budget`]): their first samples are unwound from tables, not frame pointers.
    /// The profiler too: its own table (140,000 rows) built at the first drain that samples
    /// it would hold back the registration of every process started meanwhile by its 25 ms or
    /// more.
    fn register_running(&mut self, pids: &[Pid]) -> Result<(), CaptureError> {
        let running: Vec<Pid> =
            if pids.is_empty() { procs::list_pids().into_iter().map(Pid).collect() } else { pids.to_vec() };
        for pid in running {
            self.catalog.track(pid);
        }
        self.sync_unwinder(start_budget(pids), false).map_err(CaptureError::UnwindTables)?;
        Ok(())
    }

    /// Attaches every source of `sources`, in [`Source::ALL`]'s order, but the heap probes
    /// (attached per process); `mutex`: whether the mutex profile is captured (see
    /// [`MUTEX_OFF`]).
    fn attach_all(&mut self, sources: &HashSet<Source>, settings: &Settings, mutex: bool) -> Result<(), CaptureError> {
        for source in Source::ALL.into_iter().filter(|source| sources.contains(source)) {
            self.attach(source, settings, mutex)?;
        }
        Ok(())
    }

    /// Attaches one source at start: the one place a source becomes the session's calls.
    fn attach(&mut self, source: Source, settings: &Settings, mutex: bool) -> Result<(), CaptureError> {
        match source {
            Source::CpuClock => {
                self.session.attach_cpu(settings.frequency_hz).map_err(|e| CaptureError::Attach("cpu", e))?
            }
            Source::Futex => {
                // Without the mutex profile the wakes are still followed (a waiter's wait ends
                // at one), but none is walked for a waker's stack nobody reads.
                let fraction = if mutex { settings.mutex_fraction } else { MUTEX_OFF as u32 };
                let attached = self
                    .session
                    .attach_futex(settings.block_rate_ns, fraction)
                    .map_err(|e| CaptureError::Attach("futex", e))?;
                tracing::info!(tracepoints = ?attached.attached, missing = ?attached.missing, "futex tracepoints attached");
            }
            Source::ThreadCreation => {
                self.session.attach_threadcreate().map_err(|e| CaptureError::Attach("threadcreate", e))?
            }
            Source::Switches => self
                .session
                .attach_offcpu(settings.offcpu_sample_every, settings.offcpu_rate_ns)
                .map_err(|e| CaptureError::Attach("off-cpu", e))?,
            // Loaded with the session: the heap probes are attached per process
            // ([`Capture::attach_heap`]), the task iterator is read by each dump.
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

    /// Dumps every thread of `pid` now, on this thread: [`Capture::start_thread_dump`], the
    /// walk, [`Capture::finish_thread_dump`].
    pub fn thread_dump(&mut self, pid: Pid) -> Result<ThreadDump, CaptureError> {
        let DumpStarted { job, ticket } = self.start_thread_dump(pid)?;
        let walked = job.run();
        self.finish_thread_dump(ticket, walked)
    }

    /// Begins a dump of every thread of `pid` (see [`crate::thread_dump`]): registers the process
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

    /// The kernel's run-time statistics of a program (with `enable_stats`); `None` if it was
    /// not loaded.
    pub fn program_stats(&self, program: &'static str) -> ebpf::Result<Option<ProgramStats>> {
        self.session.program_stats(program)
    }
}

/// What the session loads for `config`: the programs of `sources`, and the kernel's tables
/// sized for them.
fn session_config(
    config: &CaptureConfig,
    sources: &HashSet<Source>,
    pid_namespace: Option<PidNamespace>,
) -> SessionConfig {
    let shares = stack_shares(&config.pids, config.shares);
    SessionConfig {
        pids: config.pids.clone(),
        heap_sample_bytes: config.settings.heap_sample_bytes,
        heap_max_live: config.heap_max_live,
        heap: sources.contains(&Source::HeapProbes),
        futex: sources.contains(&Source::Futex),
        threadcreate: sources.contains(&Source::ThreadCreation),
        offcpu: sources.contains(&Source::Switches),
        thread_dumps: sources.contains(&Source::TaskIterator),
        enable_stats: config.enable_stats,
        unwind_rows: unwind::rows_for_budget(unwind::DEFAULT_TABLE_BYTES),
        pid_namespace,
        share_caps: ShareCaps::of_table(STACKS_MAX_ENTRIES, shares.process_percent, shares.uid_percent),
    }
}

/// Opens the kernel's process events; without them (the reason is kept for `/status`),
/// `/proc` is read at each exec and first sample.
fn open_sideband(session: &mut Session) -> (Option<Sideband>, Option<String>) {
    match Sideband::open() {
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
    }
}

/// Takes the walkers' asks' ring. Without it a walker's ask goes unheard: the process is
/// registered at the next drain.
fn open_asks(session: &mut Session) -> Option<RegisterAsks> {
    match session.take_register_asks() {
        Ok(asks) => Some(asks),
        Err(err) => {
            tracing::warn!(
                "processes first sampled during a storm of process events may be registered late: {}",
                crate::error::chain(&err)
            );
            None
        }
    }
}

/// Each process's and uid's share of the kernel's stack table: none when one process is
/// chosen (it has the table to itself), else `shares`.
fn stack_shares(pids: &[Pid], shares: StackShares) -> StackShares {
    if pids.len() == 1 {
        StackShares::NONE
    } else {
        shares
    }
}

/// How long start registers the running processes with the unwinder: [`START_SYNC_BUDGET`]
/// for the whole machine; every one of them when processes are chosen (they are few, and a
/// snapshot of them wants every sample unwound from tables).
fn start_budget(pids: &[Pid]) -> Option<Duration> {
    if pids.is_empty() {
        Some(START_SYNC_BUDGET)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_chosen_process_has_the_stack_table_to_itself() {
        let shares = StackShares { process_percent: 10, uid_percent: 30 };
        assert_eq!(stack_shares(&[Pid(5)], shares), StackShares::NONE);
        assert_eq!(stack_shares(&[], shares), shares);
        assert_eq!(stack_shares(&[Pid(5), Pid(6)], shares), shares);
    }

    #[test]
    fn start_registers_chosen_processes_without_a_budget() {
        assert_eq!(start_budget(&[]), Some(START_SYNC_BUDGET));
        assert_eq!(start_budget(&[Pid(5)]), None);
    }
}
