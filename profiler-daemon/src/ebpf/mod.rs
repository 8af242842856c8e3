//! The only module that touches aya: loads the embedded eBPF object, attaches the CPU sampler
//! ([`cpu`]), the allocator probes ([`heap`]), the futex tracepoints ([`futex`]) and the
//! thread-creation tracepoint ([`threadcreate`]), drains their maps ([`drain`]), feeds the
//! unwinder's maps ([`unwind`]) and reads thread dumps ([`task_iter`], with the `task_struct`
//! layout from the kernel's BTF, [`btf`]). Errors are [`Error`], which alone carries aya's types.
//!
//! Ownership: one [`Session`] owns the loaded object; dropping it detaches everything. Read
//! what you need (counters, live heap) before dropping it.//!
//! The [`Session`] is here; [`load`] loads the object, [`filters`] sets which processes the
//! programs record, [`walker`] keeps the kernel walker's processes and tables, and
//! [`access`] opens and sums the maps for the other modules.

mod access;
mod btf;
mod cpu;
mod drain;
mod error;
mod filters;
mod futex;
mod go_labels;
mod heap;
mod live;
mod load;
mod offcpu;
mod task_iter;
#[cfg(test)]
mod tests;
mod threadcreate;
mod tracefs;
mod unwind;
mod walker;

use std::{
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use access::{bpf_call, drain_counts, map_mut, map_ref, sum_counters, sum_counters_of};
use aya::{
    maps::{Array, MapData},
    Ebpf,
};
pub use cpu::{CpuCounters, RawCpuSample};
pub use drain::Batch;
use error::{map_error, missing, program_error};
pub use error::{Error, Result};
pub use futex::{FutexAttachment, FutexCounters, RawWaitTotals};
pub use go_labels::{LabelsId, RawLabels};
pub use heap::{HeapAttachment, HeapCounters, HeapTarget, LiveBlock, RawHeapTotals, HEAP_FUNCTIONS};
pub use offcpu::{OffCpuCounters, RawOffCpu};
use profiler_common::{maps, ThreadRecord};
pub use profiler_common::{CgroupFilterMode, ShareCaps};
pub use task_iter::ThreadIterator;
pub use threadcreate::{RawThreadCount, ThreadCounters};
pub use unwind::{RuntimeCounters, UnwindCounters, UnwindView, Where as UnwindMap};
pub use walker::RegisterAsks;

use crate::{
    ids::{Pid, StackId},
    procs::PidNamespace,
};

/// How long after a flip of the map sets the old set is read: a program that read the set
/// index just before the flip is still writing to it, and BPF programs run to completion in
/// microseconds.
const FLIP_SETTLE: Duration = Duration::from_millis(5);

/// The eBPF object built by `build.rs` (aya-build) from the `profiler-ebpf` crate.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-ebpf"));

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
    pub futex: bool,
    /// Whether the thread-creation program may be attached (the same for its maps).
    pub threadcreate: bool,
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
    pub threadcreate: ThreadCounters,
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

impl Session {
    /// The key the loaded programs hash stacks with (see `profiler_common::stack`).
    pub fn stack_hash_key(&self) -> u64 {
        self.stack_hash_key
    }

    /// Rows of the unwind-table memory this session was loaded with.
    pub fn unwind_rows(&self) -> u32 {
        self.unwind_rows
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
    pub fn attach_futex(&mut self, block_rate_ns: u64, mutex_fraction: u32) -> Result<FutexAttachment> {
        futex::attach(&mut self.ebpf, block_rate_ns, mutex_fraction)
    }

    /// Attaches the thread-creation program (threadcreate profile). Call once.
    pub fn attach_threadcreate(&mut self) -> Result<()> {
        threadcreate::attach(&mut self.ebpf)
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
            futex: futex::counters(&self.ebpf)?,
            threadcreate: threadcreate::counters(&self.ebpf)?,
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
