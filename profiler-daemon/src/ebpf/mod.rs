//! The only module that touches aya: loads the embedded eBPF object, attaches the CPU sampler
//! ([`cpu`]), the allocator probes ([`heap`]), the futex tracepoints ([`waits`]) and the
//! thread-creation tracepoint ([`threads`]), drains their maps ([`drain`]), feeds the
//! unwinder's maps ([`unwind`]) and reads thread dumps ([`task_iter`], with the `task_struct`
//! layout from the kernel's BTF, [`btf`]). Errors are [`Error`], which alone carries aya's types.
//!
//! Ownership: one [`Session`] owns the loaded object; dropping it detaches everything. Read
//! what you need (counters, live heap) before dropping it.

mod btf;
mod cpu;
mod drain;
mod error;
mod heap;
mod live;
mod offcpu;
mod task_iter;
mod threads;
mod tracefs;
mod unwind;
mod waits;

use std::{
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    Ebpf, EbpfLoader,
};
pub use cpu::{CpuCounters, RawCpuSample};
pub use drain::Batch;
use error::{map_error, missing, program_error};
pub use error::{Error, Result};
pub use heap::{HeapAttachment, HeapCounters, HeapTarget, LiveBlock, RawHeapTotals, HEAP_FUNCTIONS};
pub use offcpu::{OffCpuCounters, RawOffCpu};
use profiler_common::{
    globals, maps, TaskOffsets, ThreadRecord, UnwindProcess, UnwindRow, UnwindTableInfo, UprobeOffsets,
};
pub use profiler_common::{CgroupFilterMode, ShareCaps};
pub use task_iter::ThreadIterator;
pub use threads::{RawThreadCount, ThreadCounters};
pub use unwind::{RuntimeCounters, UnwindCounters, UnwindView, Where as UnwindMap};
pub use waits::{FutexAttachment, FutexCounters, RawWaitTotals};

use crate::{
    ids::{Pid, StackId},
    procs::PidNamespace,
};

/// How long after a flip of the map sets the old set is read: a program that read the set
/// index just before the flip is still writing to it, and BPF programs run to completion in
/// microseconds.
const FLIP_SETTLE: Duration = Duration::from_millis(5);

/// The eBPF object built by `build.rs` (aya-build) from the `profiler-ebpf` crate.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

/// Load-time choices (globals and map sizes cannot change after load).
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Processes the programs record; empty means every process. (Heap probes are attached
    /// per process and need no filter.)
    pub pids: Vec<Pid>,
    /// Mean bytes between heap samples; 1 records every allocation.
    pub heap_sample_bytes: u64,
    /// Capacity of the live-block map.
    pub heap_max_live: u32,
    /// Whether heap probes may be attached; without them the heap maps are created with one
    /// entry, since preallocating them costs start-up time and kernel memory for nothing.
    pub heap: bool,
    /// Whether the futex programs (block and mutex) may be attached; without them their maps
    /// are created with one entry, as the heap maps are.
    pub waits: bool,
    /// Whether the thread-creation program may be attached (the same for its maps).
    pub threads: bool,
    /// Whether the off-CPU program may be attached (the same for its maps).
    pub offcpu: bool,
    /// Whether thread dumps are taken: loads the task iterator, after reading the
    /// `task_struct` layout from the kernel's BTF.
    pub thread_dumps: bool,
    /// Turn on the kernel's BPF run-time statistics while the session lives.
    pub enable_stats: bool,
    /// Rows of the unwind-table memory (8 bytes each; a multiple of
    /// `profiler_common::unwind::SHARD_ROWS`).
    pub unwind_rows: u32,
    /// The pid namespace to profile, when not the initial one: only its tasks are counted,
    /// under their ids there.
    pub pid_namespace: Option<PidNamespace>,
    /// Each process's and uid's cap on new stacks per map set (see `profiler_common::share`).
    pub share_caps: ShareCaps,
}

/// Cost of a program as the kernel measures it (needs BPF run-time stats enabled).
#[derive(Clone, Copy, Debug)]
pub struct ProgramStats {
    pub run_count: u64,
    pub run_time: Duration,
    /// Instructions the verifier processed to load it (its limit is 1,000,000), when the
    /// kernel says.
    pub verified_insns: Option<u32>,
}

/// All counters of the kernel side, summed over CPUs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub cpu: CpuCounters,
    pub heap: HeapCounters,
    pub futex: FutexCounters,
    pub threads: ThreadCounters,
    pub offcpu: OffCpuCounters,
    pub unwind: UnwindCounters,
    pub runtimes: RuntimeCounters,
}

/// The loaded programs and maps.
pub struct Session {
    ebpf: Ebpf,
    /// The key the programs hash stacks with (random per load), so that stacks walked in
    /// userspace (thread dumps) get the kernel's ids.
    stack_hash_key: u64,
    /// Map-set flips so far; the low bit is the set the kernel writes to.
    generation: u32,
    heap_loaded: bool,
    /// The heap probes of each probed process, to detach when it is gone.
    heap_links: std::collections::HashMap<Pid, heap::HeapLinks>,
    unwind_rows: u32,
    /// Why execs are not noticed by the kernel, if they are not (tracefs not mounted).
    exec_tracking_error: Option<String>,
    /// The off-CPU program walks a sampled switch's stacks at the switch-out (no
    /// `sched_exit_tp`), as its attach decided.
    offcpu_walks_at_switch_out: bool,
    /// The CPU clock, once attached: what the ticks it missed are counted against.
    cpu_clock: Option<cpu::Clock>,
    /// Registrations of exited processes not deleted from the walker's maps yet (see
    /// [`Session::remove_unwind_process`]), and when the first of them was queued.
    unwind_removals: Vec<(Pid, UnwindMap)>,
    removals_since: Option<std::time::Instant>,
    /// Changes made to the walker's processes and tables, as last written to `CONTROL`.
    unwind_epoch: u32,
    /// Reads of the live-heap map cut short at their step budget.
    live_reads_cut: std::sync::atomic::AtomicU64,
    _stats: Option<OwnedFd>,
}

/// Registrations queued for deletion are deleted once this old...
const REMOVALS_DUE_AFTER: std::time::Duration = std::time::Duration::from_millis(50);
/// ...or this many.
const REMOVALS_DUE_AT: usize = 256;

impl Session {
    /// Loads the object and sets the process filter and heap sampling table. Attaches nothing.
    pub fn load(config: &SessionConfig) -> Result<Self> {
        // Stats must be on before the programs run for their runs to be counted.
        let stats = config.enable_stats.then(enable_run_time_stats).transpose()?;
        let filter: u8 = (!config.pids.is_empty()).into();
        let (pidns_dev, pidns_ino) = config.pid_namespace.map_or((0u64, 0u64), |ns| (ns.dev, ns.ino));
        let task_offsets = if config.thread_dumps { task_offsets()? } else { TaskOffsets::default() };
        let uprobes = uprobe_offsets();
        let stack_key = random_key()?;
        // The per-CPU caches keep to a fixed budget: fewer entries per CPU on a host with many.
        let cpus = aya::util::nr_cpus()
            .map_err(|(path, source)| Error::Io { action: format!("read the possible CPUs from {path}"), source })?
            as u32;
        let row_cache = maps::cache_slot_entries(maps::ROW_CACHE_MAX_SLOT_ENTRIES, maps::ROW_CACHE_BUDGET_BYTES, cpus);
        let stored_stacks =
            maps::cache_slot_entries(maps::STORED_STACKS_MAX_SLOT_ENTRIES, maps::STORED_STACKS_BUDGET_BYTES, cpus);
        let mut loader = EbpfLoader::new();
        loader
            .override_global(globals::ROW_CACHE_SLOT_ENTRIES, &row_cache, true)
            .override_global(globals::STORED_STACKS_SLOT_ENTRIES, &stored_stacks, true)
            .map_max_entries(maps::ROW_CACHE, row_cache * maps::SCRATCH_SLOTS)
            .map_max_entries(maps::STORED_STACKS, stored_stacks * maps::SCRATCH_SLOTS)
            .override_global(globals::FILTER_PIDS, &filter, true)
            .override_global(globals::HEAP_SAMPLE_BYTES, &config.heap_sample_bytes, true)
            .override_global(globals::PIDNS_DEV, &pidns_dev, true)
            .override_global(globals::PIDNS_INO, &pidns_ino, true)
            .override_global(globals::TASK_OFFSETS, &task_offsets, true)
            .override_global(globals::UPROBE_OFFSETS, &uprobes, true)
            .override_global(globals::STACK_HASH_KEY, &stack_key, true)
            .override_global(globals::STACK_SHARE_CAPS, &config.share_caps, true)
            .map_max_entries(maps::HEAP_LIVE, config.heap_max_live)
            .map_max_entries(maps::UNWIND_ROWS, config.unwind_rows);
        let unused: [(bool, &[&str]); 4] = [
            (config.heap, &heap::MAPS),
            (config.waits, &waits::MAPS),
            (config.threads, &threads::MAPS),
            (config.offcpu, &offcpu::MAPS),
        ];
        for map in unused.into_iter().filter(|(used, _)| !used).flat_map(|(_, maps)| maps.iter()) {
            loader.map_max_entries(map, 1);
        }
        // Written only at load: as large as the list.
        loader.map_max_entries(maps::TARGET_PIDS, (config.pids.len() as u32).clamp(1, maps::TARGET_PIDS_MAX_ENTRIES));
        let mut ebpf = loader.load(EBPF_OBJECT).map_err(|e| Error::Load(Box::new(e)))?;
        select_pids(&mut ebpf, &config.pids)?;
        if config.heap {
            heap::fill_intervals(&mut ebpf, config.heap_sample_bytes)?;
        }
        if config.thread_dumps {
            task_iter::load(&mut ebpf)?;
        }
        // Without it a process that calls execve unwinds with its old tables until its
        // mappings are read again; worth a warning, not worth refusing to profile.
        let exec_tracking_error = unwind::attach_exec(&mut ebpf).err().map(|e| {
            let message = crate::error::chain(&e);
            tracing::warn!(
                "exec tracking is off ({message}); is tracefs mounted? (mount -t tracefs tracefs /sys/kernel/tracing)"
            );
            message
        });
        Ok(Self {
            ebpf,
            stack_hash_key: stack_key,
            generation: 0,
            heap_loaded: false,
            heap_links: Default::default(),
            unwind_rows: config.unwind_rows,
            exec_tracking_error,
            offcpu_walks_at_switch_out: false,
            cpu_clock: None,
            unwind_removals: Vec::new(),
            removals_since: None,
            unwind_epoch: 0,
            live_reads_cut: Default::default(),
            _stats: stats,
        })
    }

    /// The key the loaded programs hash stacks with (see `profiler_common::stack`).
    pub fn stack_hash_key(&self) -> u64 {
        self.stack_hash_key
    }

    /// Rows of the unwind-table memory this session was loaded with.
    pub fn unwind_rows(&self) -> u32 {
        self.unwind_rows
    }

    /// Copies up to one shard of unwind-table rows into shard `shard` of the row memory.
    pub fn write_unwind_shard(&mut self, shard: u16, rows: &[UnwindRow]) -> Result<()> {
        unwind::write_shard(&self.ebpf, shard, rows)
    }

    /// Points table slot `slot` at its rows (or empties it with `rows = 0`).
    pub fn set_unwind_table(&mut self, slot: u32, info: &UnwindTableInfo) -> Result<()> {
        let result = unwind::set_table(&mut self.ebpf, slot, info);
        self.unwind_changed()?;
        result
    }

    /// Gives the walker the mappings of process `pid`, whose previous entry (if any) is in map
    /// `was`. Returns which map holds it now; `None` when both are full (nothing written).
    pub fn set_unwind_process(
        &mut self,
        pid: Pid,
        process: &UnwindProcess,
        was: Option<UnwindMap>,
    ) -> Result<Option<UnwindMap>> {
        // A queued deletion of the pid's previous registration must not delete this one.
        if self.unwind_removals.iter().any(|&(queued, _)| queued == pid) {
            self.flush_unwind_removals()?;
        }
        let result = unwind::set_process(&mut self.ebpf, pid.0, process, was);
        self.unwind_changed()?;
        result
    }

    /// Gives a runtime's walker process `pid`'s entry in its map `map`, so that its stacks
    /// get that runtime's frames; `None` makes it forget one (see `crate::runtimes`). Returns
    /// false when the map is full.
    pub fn set_runtime_process<V: aya::Pod>(&mut self, map: &'static str, pid: Pid, entry: Option<&V>) -> Result<bool> {
        match entry {
            Some(entry) => unwind::set_runtime_process(&mut self.ebpf, map, pid.0, entry),
            None => unwind::remove_runtime_process::<V>(&mut self.ebpf, map, pid.0).map(|()| true),
        }
    }

    /// What the kernel filters by cgroup (see `profiler_common::CgroupFilterMode`).
    pub fn set_cgroup_filter(&mut self, mode: CgroupFilterMode, ids: &std::collections::BTreeSet<u64>) -> Result<()> {
        set_cgroup_filter(&mut self.ebpf, mode, ids)
    }

    /// Makes the walker forget process `pid`, whose entry is in map `from` (a no-op if it
    /// is not there). Queued: the entry is deleted with others in one system call by
    /// [`Session::flush_unwind_removals`], when the caller finds them due, or before the
    /// pid is registered again. Until then the walker may find it, for a process that has
    /// exited; the caller flushes at once when a pid is reused.
    pub fn remove_unwind_process(&mut self, pid: Pid, from: UnwindMap) {
        self.removals_since.get_or_insert_with(std::time::Instant::now);
        self.unwind_removals.push((pid, from));
    }

    /// Whether the queued deletions should be made now (enough of them, or old enough).
    pub fn unwind_removals_due(&self) -> bool {
        self.unwind_removals.len() >= REMOVALS_DUE_AT
            || self.removals_since.is_some_and(|since| since.elapsed() >= REMOVALS_DUE_AFTER)
    }

    /// Deletes the queued registrations from the walker's maps: from both, even when the
    /// first fails (the first failure is returned).
    pub fn flush_unwind_removals(&mut self) -> Result<()> {
        self.removals_since = None;
        let queued = std::mem::take(&mut self.unwind_removals);
        let mut result = Ok(());
        for from in [UnwindMap::Small, UnwindMap::Large] {
            let pids: Vec<u32> = queued.iter().filter(|&&(_, map)| map == from).map(|&(pid, _)| pid.0).collect();
            if !pids.is_empty() {
                let removed = unwind::remove_processes(&mut self.ebpf, &pids, from);
                result = result.and(removed);
            }
        }
        if !queued.is_empty() {
            self.unwind_changed()?;
        }
        result
    }

    /// Counts a change to the walker's processes or tables, made just before, in `CONTROL`:
    /// the walkers keep mappings they found from one sample to the next only while the count
    /// is unchanged (see `profiler-ebpf`'s `user_stack::KeptMapping`). Called after every
    /// change, also one that failed part way.
    fn unwind_changed(&mut self) -> Result<()> {
        self.unwind_epoch = self.unwind_epoch.wrapping_add(1);
        let mut control: Array<&mut MapData, u32> = map_mut(&mut self.ebpf, maps::CONTROL)?;
        control.set(maps::CONTROL_UNWIND_EPOCH, self.unwind_epoch, 0).map_err(map_error("write", maps::CONTROL))
    }

    /// Processes that called `execve` since the last call, with the time of the exec
    /// (`CLOCK_MONOTONIC`); the kernel forgot their mappings then.
    pub fn take_execs(&mut self) -> Result<Vec<(Pid, u64)>> {
        unwind::take_execs(&mut self.ebpf)
    }

    /// From now on [`Session::take_execs`] lists only the execs that failed: the caller
    /// follows the successful ones from the side band. Without exec tracking, nothing to do.
    pub fn take_failed_execs_only(&mut self) -> Result<()> {
        if self.exec_tracking_error.is_some() {
            return Ok(());
        }
        unwind::attach_exec_done(&mut self.ebpf)
    }

    /// The walkers' asks to register a process they met unregistered (a ring of tgids):
    /// taken once, by the owner of the wait loop, which reads the side band at once when
    /// one comes.
    pub fn take_register_asks(&mut self) -> Result<RingBuf<MapData>> {
        let map = self.ebpf.take_map(maps::REGISTER_ASKS).ok_or_else(|| missing(maps::REGISTER_ASKS))?;
        RingBuf::try_from(map).map_err(map_error("open", maps::REGISTER_ASKS))
    }

    /// Stops the walkers asking for process `pid`'s registration: the selection leaves it
    /// out. Returns false when the map is full (its walks then keep asking, through the LRU).
    pub fn decline_registration(&mut self, pid: Pid) -> Result<bool> {
        unwind::decline_registration(&mut self.ebpf, pid.0)
    }

    /// Lets process `pid`'s walks ask for its registration again (it exited, or may now be
    /// selected).
    pub fn undecline_registration(&mut self, pid: Pid) -> Result<()> {
        unwind::undecline_registration(&mut self.ebpf, pid.0)
    }

    /// Why execs are not tracked, if they are not.
    pub fn exec_tracking_error(&self) -> Option<&str> {
        self.exec_tracking_error.as_deref()
    }

    /// Samples the CPU clock of every online CPU at `frequency_hz`.
    pub fn attach_cpu(&mut self, frequency_hz: u32) -> Result<()> {
        self.cpu_clock = Some(cpu::attach(&mut self.ebpf, frequency_hz)?);
        Ok(())
    }

    /// Probes the allocator functions of `target`'s C library, for that process only.
    pub fn attach_heap(&mut self, target: &HeapTarget) -> Result<HeapAttachment> {
        if !self.heap_loaded {
            heap::load_programs(&mut self.ebpf)?;
            self.heap_loaded = true;
        }
        let (attachment, links) = heap::attach(&mut self.ebpf, target)?;
        self.heap_links.insert(target.pid, links);
        Ok(attachment)
    }

    /// Detaches the heap probes of processes that are gone (their descriptors, and the
    /// kernel's hold on their tasks, go with them). Returns how many processes had probes.
    pub fn detach_heap(&mut self, pids: &[Pid]) -> Result<usize> {
        let mut detached = 0;
        let mut first = Ok(());
        for pid in pids {
            let Some(links) = self.heap_links.remove(pid) else { continue };
            detached += 1;
            let result = heap::detach(&mut self.ebpf, links);
            if first.is_ok() {
                first = result;
            }
        }
        first.map(|()| detached)
    }

    /// Attaches the futex programs (block and mutex profiles), system-wide but for the
    /// process filter. Call once.
    pub fn attach_waits(&mut self, block_rate_ns: u64, mutex_fraction: u32) -> Result<FutexAttachment> {
        waits::attach(&mut self.ebpf, block_rate_ns, mutex_fraction)
    }

    /// Attaches the thread-creation program (threadcreate profile). Call once.
    pub fn attach_threads(&mut self) -> Result<()> {
        threads::attach(&mut self.ebpf)
    }

    /// Attaches the off-CPU program (offcpu profile), recording intervals by length at
    /// `rate_ns` (or, on kernels without `sched_exit_tp`, 1 in `sample_every` switches).
    /// Call once.
    pub fn attach_offcpu(&mut self, sample_every: u32, rate_ns: u64) -> Result<()> {
        self.offcpu_walks_at_switch_out = offcpu::attach(&mut self.ebpf, sample_every, rate_ns)?;
        Ok(())
    }

    /// Sums the per-CPU counters.
    pub fn counters(&self) -> Result<Counters> {
        Ok(Counters {
            cpu: cpu::counters(&self.ebpf, self.cpu_clock)?,
            heap: heap::counters(&self.ebpf, self.live_reads_cut.load(std::sync::atomic::Ordering::Relaxed))?,
            futex: waits::counters(&self.ebpf)?,
            threads: threads::counters(&self.ebpf)?,
            offcpu: offcpu::counters(&self.ebpf, self.offcpu_walks_at_switch_out)?,
            unwind: unwind::counters(&self.ebpf)?,
            runtimes: unwind::runtime_counters(&self.ebpf)?,
        })
    }

    /// Run count and time of a program, if the kernel has stats on; `None` if it was not
    /// loaded (one of two alternatives, such as the off-CPU programs and their empty
    /// stand-ins for a benchmark's floor).
    pub fn program_stats(&self, program: &'static str) -> Result<Option<ProgramStats>> {
        let prog = self.ebpf.program(program).ok_or_else(|| missing(program))?;
        if prog.fd().is_err() {
            return Ok(None);
        }
        let info = prog.info().map_err(program_error("query", program))?;
        Ok(Some(ProgramStats {
            run_count: info.run_count(),
            run_time: info.run_time(),
            verified_insns: info.verified_instruction_count(),
        }))
    }

    /// One record per thread of process `pid`, as its threads are now (thread dumps must
    /// have been enabled at load).
    pub fn thread_records(&self, pid: Pid) -> Result<Vec<ThreadRecord>> {
        self.thread_iterator()?.read(pid)
    }

    /// The thread iterator, to read on another thread (see [`ThreadIterator`]).
    pub fn thread_iterator(&self) -> Result<ThreadIterator> {
        task_iter::iterator(&self.ebpf)
    }

    /// What the kernel walker knows of process `pid` (its mappings, their tables, the rows),
    /// for a walker in userspace that must read exactly what the kernel's reads.
    pub fn unwind_view(&self, pid: Pid) -> Result<UnwindView> {
        unwind::view(&self.ebpf, pid.0, self.unwind_rows)
    }

    /// Flips the kernel to the other map set, the first half of a drain. Returns when the
    /// set it wrote to until now may be read with [`Session::drain_flipped`]: a program that
    /// read the old set index just before the flip is still writing to it. The caller may
    /// work meanwhile (follow process events).
    pub fn flip(&mut self) -> Result<Instant> {
        // The kernel reads the generation, whose low bit is the set: its notes of stacks
        // stored (`STORED_STACKS`) are per generation, so none outlives the set's clearing.
        let next = self.generation.wrapping_add(1);
        self.set_active(next)?;
        self.generation = next;
        Ok(Instant::now() + FLIP_SETTLE)
    }

    /// Drains the set the kernel wrote to before the last [`Session::flip`].
    pub fn drain_flipped(&mut self) -> Result<Batch> {
        let drained = self.generation.wrapping_sub(1) & 1;
        drain::drain_set(&mut self.ebpf, drained)
    }

    /// Adds to `into` the stacks of sampled off-CPU switches not charged yet, where stacks are
    /// walked at the switch-out (kernels without `sched_exit_tp`): a later drain names them.
    pub fn pending_offcpu_stacks(&self, into: &mut std::collections::HashSet<StackId>) -> Result<()> {
        offcpu::pending_stacks(&self.ebpf, self.offcpu_walks_at_switch_out, into)
    }

    /// Forgets the heap state (live blocks, calls in flight) of processes that are gone.
    pub fn forget_heap(&mut self, pids: &[Pid]) -> Result<usize> {
        heap::forget_processes(&mut self.ebpf, pids)
    }

    /// The sampled heap blocks that are live now, read in place, each once. A read cut short
    /// at its step budget (a kernel before 5.6 walks the map, and heavy freeing restarts the
    /// walk) is counted in the heap counters.
    pub fn live_blocks(&self) -> Result<Vec<LiveBlock>> {
        let (blocks, cut) = heap::live_blocks(&self.ebpf)?;
        if cut {
            self.live_reads_cut.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(
                read = blocks.len(),
                "the live-heap map walk was cut short: blocks were freed faster than it could be walked (this \
                 kernel has no batch lookups); inuse misses some blocks (counted as `live map reads cut short`)"
            );
        }
        Ok(blocks)
    }

    fn set_active(&mut self, generation: u32) -> Result<()> {
        let mut control: Array<&mut MapData, u32> = map_mut(&mut self.ebpf, maps::CONTROL)?;
        control.set(maps::CONTROL_ACTIVE_SET, generation, 0).map_err(map_error("write", maps::CONTROL))
    }
}

/// A random `u64` from the kernel's generator.
fn random_key() -> Result<u64> {
    let mut key = [0u8; 8];
    // SAFETY: getrandom writes at most `key.len()` bytes into the buffer.
    let n = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
    if n != key.len() as isize {
        let source = std::io::Error::last_os_error();
        return Err(Error::Io { action: "draw the stack hash key (getrandom)".into(), source });
    }
    Ok(u64::from_ne_bytes(key))
}

/// The `task_struct` and `struct pid` layout of the running kernel.
fn task_offsets() -> Result<TaskOffsets> {
    let types = btf::Types::vmlinux().map_err(Error::TaskLayout)?;
    btf::task_offsets(&types).map_err(Error::TaskLayout)
}

/// Where this kernel keeps what its uprobes moved; all 0 (walks show the `[uprobes]` page,
/// and the log says so) when its BTF lacks them.
fn uprobe_offsets() -> UprobeOffsets {
    match btf::Types::vmlinux().and_then(|types| btf::uprobe_offsets(&types)) {
        Ok(offsets) => offsets,
        Err(err) => {
            tracing::info!("stacks through a uprobe will show the [uprobes] page: {err}");
            UprobeOffsets::default()
        }
    }
}

fn enable_run_time_stats() -> Result<OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|err| Error::KernelFeature {
        feature: "BPF run-time statistics (BPF_ENABLE_STATS)",
        detail: err.to_string(),
    })
}

/// Replaces the cgroups filtered in the kernel: `mode` and the cgroup ids it applies to.
fn set_cgroup_filter(ebpf: &mut Ebpf, mode: CgroupFilterMode, ids: &std::collections::BTreeSet<u64>) -> Result<()> {
    let old: Vec<u64> = {
        let filter: HashMap<&mut MapData, u64, u8> = map_mut(ebpf, maps::CGROUP_FILTER)?;
        filter.keys().filter_map(|k| k.ok()).filter(|id| !ids.contains(id)).collect()
    };
    // Off while the set changes: a sample meanwhile is counted rather than lost.
    let mut control: Array<&mut MapData, u32> = map_mut(ebpf, maps::CONTROL)?;
    control
        .set(maps::CONTROL_CGROUP_MODE, CgroupFilterMode::Off as u32, 0)
        .map_err(map_error("write", maps::CONTROL))?;
    let mut filter: HashMap<&mut MapData, u64, u8> = map_mut(ebpf, maps::CGROUP_FILTER)?;
    for id in old {
        let _ = filter.remove(&id);
    }
    for &id in ids {
        filter.insert(id, 1, 0).map_err(map_error("write", maps::CGROUP_FILTER))?;
    }
    let mut control: Array<&mut MapData, u32> = map_mut(ebpf, maps::CONTROL)?;
    control.set(maps::CONTROL_CGROUP_MODE, mode as u32, 0).map_err(map_error("write", maps::CONTROL))
}

fn select_pids(ebpf: &mut Ebpf, pids: &[Pid]) -> Result<()> {
    let mut targets: HashMap<&mut MapData, u32, u8> = map_mut(ebpf, maps::TARGET_PIDS)?;
    let mut slots = vec![0u32; maps::TARGET_PID_SLOTS_LEN as usize];
    for pid in pids {
        targets.insert(pid.0, 1, 0).map_err(map_error("write", maps::TARGET_PIDS))?;
        let slot = &mut slots[maps::target_pid_slot(pid.0) as usize];
        *slot = maps::with_target_pid(*slot, pid.0);
    }
    let mut array: Array<&mut MapData, u32> = map_mut(ebpf, maps::TARGET_PID_SLOTS)?;
    for (index, &tgid) in slots.iter().enumerate().filter(|(_, &tgid)| tgid != 0) {
        array.set(index as u32, tgid, 0).map_err(map_error("write", maps::TARGET_PID_SLOTS))?;
    }
    Ok(())
}

/// Opens map `name` as type `M`.
fn map_mut<'a, M>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<M>
where
    M: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.map_mut(name).ok_or_else(|| missing(name))?;
    M::try_from(map).map_err(map_error("open", name))
}

/// The `bpf(2)` command `cmd` with `attr`, a `union bpf_attr` member (`repr(C)`, no
/// padding) the kernel may write back into; the call's non-negative result.
///
/// # Safety
/// Every pointer in `attr` names live memory of the size `attr` states for it, writable
/// where `cmd` writes, for the whole call.
unsafe fn bpf_call<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<i64> {
    // SAFETY: `attr` is live and writable for `size_of::<T>()` bytes; its pointers are the
    // caller's to vouch for.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>() as u32) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ret)
}

/// Opens map `name` read-only as type `M`.
fn map_ref<'a, M>(ebpf: &'a Ebpf, name: &'static str) -> Result<M>
where
    M: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.map(name).ok_or_else(|| missing(name))?;
    M::try_from(map).map_err(map_error("open", name))
}

/// Reads every entry of a counts map (a hash every CPU adds to) and deletes it.
fn drain_counts<K, V>(ebpf: &mut Ebpf, name: &'static str) -> Result<Vec<(K, V)>>
where
    K: aya::Pod,
    V: aya::Pod,
{
    let mut map: HashMap<&mut MapData, K, V> = map_mut(ebpf, name)?;
    let keys: Vec<K> = map.keys().filter_map(|k| k.ok()).collect();
    let mut entries = Vec::with_capacity(keys.len());
    for key in keys {
        if let Ok(value) = map.get(&key, 0) {
            entries.push((key, value));
        }
        map.remove(&key).map_err(map_error("clear", name))?;
    }
    Ok(entries)
}

/// Sums each per-CPU slot of the counter array `name`, `N` counters in index order.
fn sum_counters<const N: usize>(ebpf: &Ebpf, name: &'static str) -> Result<[u64; N]> {
    sum_counters_of(ebpf, name, N as u32)
}

/// The first `count` counters of `name` (up to `N`), summed over CPUs; the rest 0.
fn sum_counters_of<const N: usize>(ebpf: &Ebpf, name: &'static str, count: u32) -> Result<[u64; N]> {
    let array: PerCpuArray<&MapData, u64> = map_ref(ebpf, name)?;
    let mut out = [0; N];
    for (index, slot) in out.iter_mut().enumerate().take(count as usize) {
        let values = array.get(&(index as u32), 0).map_err(map_error("read", name))?;
        *slot = values.iter().sum();
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
