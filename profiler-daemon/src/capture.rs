//! The capture pipeline's head, the one both drivers run (`snapshot` and the daemon's
//! collector): the BPF [`Session`], the [`Catalog`] of processes and stacks, and the
//! [`Unwinder`] that feeds the kernel walker the catalogue's mappings. [`Capture::drain`]
//! flips and reads the kernel's maps, learns what the batch names, registers new and exec'd
//! processes with the unwinder and forgets those that exited without data; what to count and
//! what to write is the caller's business (see `profiles` and `sink`).

use std::{
    collections::{BTreeMap, HashSet},
    time::Duration,
};

use crate::{
    catalog::Catalog,
    config::ProcessSelection,
    ebpf::{self, Batch, Counters, FutexAttachment, HeapAttachment, LiveBlock, ProgramStats, Session, SessionConfig},
    ids::{Pid, StackId},
    procs::{self, own_pid_namespace, PidNamespace},
    profiles::{self, heap::TargetError, ProfileKind, Settings, Source},
    unwind::{self, Unwinder, UnwinderStats},
};

/// Time per drain spent registering newly seen processes with the unwinder (building their
/// tables); the rest wait for the next drain.
const UNWIND_SYNC_BUDGET: Duration = Duration::from_millis(250);

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
    /// Distinct stacks the catalogue keeps.
    pub max_stacks: usize,
    /// Turn on the kernel's BPF run-time statistics (for benchmarks).
    pub enable_stats: bool,
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
    /// What went wrong without stopping the drain (already logged; the caller may count it).
    pub problems: Vec<CaptureError>,
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
        let session = Session::load(&SessionConfig {
            pids: config.pids.clone(),
            heap_sample_bytes: config.settings.heap_sample_bytes,
            heap_max_live: config.heap_max_live,
            heap: sources.contains(&Source::HeapProbes),
            waits: sources.contains(&Source::FutexWaits),
            threads: sources.contains(&Source::ThreadCreation),
            enable_stats: config.enable_stats,
            unwind_rows: unwind::rows_for_budget(unwind::DEFAULT_TABLE_BYTES),
            pid_namespace,
        })
        .map_err(CaptureError::Load)?;
        let unwinder = Unwinder::new(&session);
        let mut capture = Self {
            session,
            catalog: Catalog::with_max_stacks(config.max_stacks),
            unwinder,
            scope: config.pids.clone(),
            sources: HashSet::new(),
            heap: BTreeMap::new(),
            futex: None,
            pid_namespace,
            selection: ProcessSelection::default(),
        };
        for &pid in &config.pids {
            capture.catalog.track(pid);
        }
        capture.sync_unwinder(None).map_err(CaptureError::UnwindTables)?;
        for source in [Source::CpuClock, Source::FutexWaits, Source::ThreadCreation] {
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
                let attached = self.session.attach_waits().map_err(|e| CaptureError::Attach("futex", e))?;
                tracing::info!(tracepoints = ?attached.attached, missing = ?attached.missing, "futex tracepoints attached");
                self.futex = Some(attached);
            }
            Source::ThreadCreation => {
                self.session.attach_threads().map_err(|e| CaptureError::Attach("thread-creation", e))?
            }
            Source::HeapProbes => {}
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

    /// Flips the map sets and drains the idle one: learns the processes and stacks it names,
    /// registers the processes that called `execve` (before their first sample) and the new
    /// ones with the unwinder, and forgets processes that exited without data.
    pub fn drain(&mut self) -> Result<Drained, CaptureError> {
        let batch = self.session.drain().map_err(CaptureError::Drain)?;
        let new_stacks = self.catalog.learn(&batch.stacks, &profiles::sightings(&batch));
        let mut problems = Vec::new();
        match self.unwinder.take_execs(&mut self.session) {
            // A new image is registered now, not after its first sample: until then its
            // stacks would be walked with frame pointers only.
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
        let gone: Vec<Pid> =
            self.catalog.prune_unsampled(UNSAMPLED_GRACE).into_iter().filter(|pid| !scope.contains(pid)).collect();
        problems.extend(self.forget(&gone));
        if let Err(err) = self.sync_unwinder(Some(UNWIND_SYNC_BUDGET)) {
            problems.push(CaptureError::UnwindTables(err));
        }
        for problem in &problems {
            tracing::warn!("{}", crate::error::chain(problem));
        }
        Ok(Drained { batch, new_stacks, gone, problems })
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
        let gone = self.catalog.prune(grace, keep);
        let problems = self.forget(&gone);
        (gone, problems)
    }

    /// Drops what the unwinder, the kernel maps and the heap attachments hold for `gone`.
    fn forget(&mut self, gone: &[Pid]) -> Vec<CaptureError> {
        let mut problems = Vec::new();
        if gone.is_empty() {
            return problems;
        }
        if let Err(err) = self.unwinder.forget(&mut self.session, gone) {
            problems.push(CaptureError::Forget(err));
        }
        let heap_gone: Vec<Pid> = gone.iter().copied().filter(|pid| self.heap.contains_key(pid)).collect();
        if let Err(err) = self.session.detach_heap(&heap_gone) {
            problems.push(CaptureError::Forget(err));
        }
        if let Err(err) = self.session.forget_heap(&heap_gone) {
            problems.push(CaptureError::Forget(err));
        }
        if self.has(Source::FutexWaits) {
            if let Err(err) = self.session.forget_waits(gone) {
                problems.push(CaptureError::Forget(err));
            }
        }
        for pid in gone {
            self.heap.remove(pid);
        }
        problems
    }

    fn in_scope(&self, pid: Pid) -> bool {
        self.scope.is_empty() || self.scope.contains(&pid)
    }

    fn sync_unwinder(&mut self, budget: Option<Duration>) -> ebpf::Result<()> {
        let selection = &self.selection;
        let processes = self
            .catalog
            .processes()
            .filter(move |p| selection.matches(&p.facts()))
            .map(|p| (p.pid, p.maps_version, p.maps()));
        self.unwinder.sync(&mut self.session, processes, budget)
    }

    /// Builds unwind tables only for the processes `selection` matches from now on (a
    /// process already registered keeps its tables until it exits).
    pub fn select(&mut self, selection: &ProcessSelection) {
        self.selection = selection.clone();
    }

    /// What is known of the processes and stacks captured so far.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Registers a process before it has data (a heap target found by a scan).
    pub fn track(&mut self, pid: Pid) {
        self.catalog.track(pid);
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

    /// The kernel's run-time statistics of a program (with `enable_stats`).
    pub fn program_stats(&self, program: &'static str) -> ebpf::Result<ProgramStats> {
        self.session.program_stats(program)
    }
}
