//! What was *counted* over one window, per process and per kind: [`Counts`]. Each kind's
//! file owns its part of [`ProcessCounts`] and how a drained batch adds to it.

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

use super::{
    contention::WaitCounts,
    cpu::CpuCounts,
    evicted::{evict, fold},
    exited, heap,
    heap::HeapCounts,
    offcpu::{OffCpuCounts, OffCpuTime},
    threadcreate::ThreadCounts,
    threads::ThreadState,
    ProfileKind,
};
use crate::{
    ebpf::{Batch, LiveBlock},
    ids::{Pid, StackId, Tid},
    thread_dump::ThreadDump,
};

/// What one process got in a window, one part per kind.
#[derive(Debug, Default, Clone)]
pub struct ProcessCounts {
    pub cpu: CpuCounts,
    pub heap: HeapCounts,
    /// Futex waits by waiting stack.
    pub block: WaitCounts,
    /// Woken futex waits by the stack that woke them.
    pub mutex: WaitCounts,
    pub threadcreate: ThreadCounts,
    /// Time off CPU by (thread, state, stacks), sampled.
    pub offcpu: OffCpuCounts,
    /// Point in time: the latest CPU stacks of each thread, and a dump to render.
    pub threads: ThreadState,
}

impl ProcessCounts {
    /// Takes the live heap of `total`: a window's `inuse` is the state at its end, whenever
    /// the block was allocated.
    pub fn with_live_from(mut self, total: &ProcessCounts) -> Self {
        self.heap.live.clone_from(&total.heap.live);
        self
    }
}

/// Counts per process over one window.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    processes: BTreeMap<Pid, ProcessCounts>,
}

impl Counts {
    /// Adds a drained batch: each kind its own part.
    pub fn add(&mut self, batch: &Batch) {
        for kind in ProfileKind::ALL {
            kind.count(batch, self);
        }
    }

    /// Replaces the live heap of the processes in `pids` with their blocks in `blocks` (a
    /// full read of the live map).
    pub fn set_live(&mut self, pids: &[Pid], blocks: &[LiveBlock]) {
        heap::set_live(self, pids, blocks);
    }

    /// Gives `pid` the thread dump its threads profile renders (the state at the time of
    /// the dump, never added to).
    pub fn set_thread_dump(&mut self, pid: Pid, dump: Arc<ThreadDump>) {
        self.process_mut(pid).threads.dump = Some(dump);
    }

    /// Counts of one process.
    pub fn process(&self, pid: Pid) -> Option<&ProcessCounts> {
        self.processes.get(&pid)
    }

    pub(super) fn process_mut(&mut self, pid: Pid) -> &mut ProcessCounts {
        self.processes.entry(pid).or_default()
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (Pid, &mut ProcessCounts)> {
        self.processes.iter_mut().map(|(&pid, c)| (pid, c))
    }

    /// (pid, counts) pairs by pid.
    pub fn iter(&self) -> impl Iterator<Item = (Pid, &ProcessCounts)> {
        self.processes.iter().map(|(&pid, c)| (pid, c))
    }

    /// Keeps the counts of `pid` only.
    pub fn retain_only(&mut self, pid: Pid) {
        self.processes.retain(|&p, _| p == pid);
    }

    /// Folds the CPU and off-CPU counts of exited threads in processes past
    /// [`super::exited::THREADS_KEPT`] threads (see [`super::exited`]), and forgets their
    /// latest CPU stacks. `alive(pid, tid)`: whether the thread exists. Returns the threads
    /// folded, once per kind that named them.
    pub fn fold_exited_threads(&mut self, alive: impl Fn(Pid, Tid) -> bool) -> u64 {
        let mut folded = 0;
        for (&pid, counts) in &mut self.processes {
            let alive = |tid| alive(pid, tid);
            let cpu = &mut counts.cpu;
            folded += exited::fold(&mut cpu.samples, &mut cpu.threads, |k| &mut k.tid, |v, n| *v += n, alive);
            let off = &mut counts.offcpu;
            let merge = |v: &mut OffCpuTime, n: OffCpuTime| {
                v.switches += n.switches;
                v.off_cpu_ns += n.off_cpu_ns;
            };
            folded += exited::fold(&mut off.samples, &mut off.threads, |k| &mut k.tid, merge, alive);
            if counts.threads.on_cpu.len() > exited::THREADS_KEPT {
                counts.threads.on_cpu.retain(|&tid, _| alive(tid));
            }
        }
        folded as u64
    }

    /// Folds the entries naming a stack that `held` says the catalogue no longer has under
    /// [`StackId::EVICTED`], values kept (see [`super::evicted`]). The live heap is left: it
    /// is replaced by each read of the kernel's live map. Returns the entries folded.
    pub fn fold_evicted_stacks(&mut self, held: impl Fn(StackId) -> bool) -> u64 {
        let mut folded = 0;
        for counts in self.processes.values_mut() {
            // `|`, not `||`: both stacks of a key are looked at.
            folded += fold(
                &mut counts.cpu.samples,
                |k| evict(&mut k.user_stack, &held) | evict(&mut k.kernel_stack, &held),
                |v, n| *v += n,
            );
            folded += fold(
                &mut counts.offcpu.samples,
                |k| evict(&mut k.user_stack, &held) | evict(&mut k.kernel_stack, &held),
                |v: &mut OffCpuTime, n| {
                    v.switches += n.switches;
                    v.off_cpu_ns += n.off_cpu_ns;
                },
            );
            for waits in [&mut counts.block, &mut counts.mutex] {
                folded += fold(
                    &mut waits.sites,
                    |k| evict(&mut k.stack, &held),
                    |v, n| {
                        v.count += n.count;
                        v.delay_ns = v.delay_ns.saturating_add(n.delay_ns);
                    },
                );
            }
            folded += fold(
                &mut counts.heap.allocated,
                |k| evict(&mut k.stack, &held),
                |v, n| {
                    v.count += n.count;
                    v.bytes += n.bytes;
                },
            );
            folded += fold(&mut counts.threadcreate.created, |k| evict(k, &held), |v, n| *v += n);
        }
        folded as u64
    }

    /// Drops the counts of these processes.
    pub fn forget(&mut self, pids: &[Pid]) {
        for pid in pids {
            self.processes.remove(pid);
        }
    }

    /// Adds every stack referenced to `out`.
    pub fn stacks(&self, out: &mut HashSet<StackId>) {
        for counts in self.processes.values() {
            for kind in ProfileKind::ALL {
                kind.stacks(counts, out);
            }
        }
    }
}
