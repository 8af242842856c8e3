//! The single owner of captured data: merges drained batches per process, and captures each
//! process's mappings from `/proc` while it is alive (on first sight, and again when a
//! sampled address is not covered, e.g. after `dlopen`).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use profiler_common::NO_STACK;

use crate::{
    ebpf::{Batch, LiveBlock},
    procs::{self, MapEntry, ProcessInfo},
};

/// What CPU samples are counted under inside one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    pub tid: u32,
    /// User stack hash or `NO_STACK`.
    pub user_stack: u64,
    /// Kernel stack hash or `NO_STACK`.
    pub kernel_stack: u64,
}

/// Sampled (unscaled) heap blocks of one stack: how many and how many bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapCount {
    pub count: u64,
    pub bytes: u64,
}

impl HeapCount {
    fn add(&mut self, count: u64, bytes: u64) {
        self.count += count;
        self.bytes += bytes;
    }
}

/// Everything captured for one process.
#[derive(Debug)]
pub struct ProcessSamples {
    pub pid: u32,
    /// The process name (its `comm`).
    pub name: String,
    /// Mappings captured from `/proc`; `None` when the process was gone before it could be
    /// inspected (its user frames stay unsymbolized and are counted as such).
    pub info: Option<ProcessInfo>,
    /// CPU samples.
    pub counts: HashMap<SampleKey, u64>,
    /// Thread id → thread name.
    pub threads: HashMap<u32, String>,
    /// Total CPU samples.
    pub total: u64,
    /// Sampled allocations by allocating stack, since the probes attached.
    pub heap_allocated: HashMap<u64, HeapCount>,
    /// Sampled blocks still live at the last read, by allocating stack.
    pub heap_live: HashMap<u64, HeapCount>,
}

/// All processes' data and the stacks they reference.
#[derive(Debug, Default)]
pub struct Aggregate {
    processes: BTreeMap<u32, ProcessSamples>,
    stacks: HashMap<u64, Arc<[u64]>>,
    /// Processes that exited before their mappings could be read.
    pub uninspected_processes: u64,
}

impl Aggregate {
    /// Merges a drained batch. Runs `/proc` reads for processes seen for the first time.
    pub fn add(&mut self, batch: Batch) {
        for (hash, frames) in batch.stacks {
            self.stacks.entry(hash).or_insert_with(|| frames.into());
        }
        let mut touched = Vec::new();
        for sample in batch.cpu {
            let process = self.process(sample.tgid, &sample.comm);
            if sample.tid == sample.tgid && process.info.is_none() {
                process.name.clone_from(&sample.comm);
            }
            process.threads.insert(sample.tid, sample.comm);
            let key = SampleKey { tid: sample.tid, user_stack: sample.user_stack, kernel_stack: sample.kernel_stack };
            *process.counts.entry(key).or_default() += sample.count;
            process.total += sample.count;
            touched.push(sample.tgid);
        }
        for totals in batch.heap {
            let process = self.process(totals.tgid, "");
            process.heap_allocated.entry(totals.stack).or_default().add(totals.count, totals.bytes);
            touched.push(totals.tgid);
        }
        touched.sort_unstable();
        touched.dedup();
        for pid in touched {
            self.refresh_mappings(pid);
        }
        self.uninspected_processes = self.processes.values().filter(|p| p.info.is_none()).count() as u64;
    }

    /// Replaces every process's live heap with `blocks` (a full read of the live map).
    pub fn set_live(&mut self, blocks: &[LiveBlock]) {
        for process in self.processes.values_mut() {
            process.heap_live.clear();
        }
        for block in blocks {
            let process = self.process(block.tgid, "");
            process.heap_live.entry(block.stack).or_default().add(1, block.size);
        }
    }

    /// Registers a process before it has data (heap profiling targets), so its mappings are
    /// captured while it is surely alive.
    pub fn track(&mut self, pid: u32) {
        self.process(pid, "");
    }

    /// Processes by pid.
    pub fn processes(&self) -> impl Iterator<Item = &ProcessSamples> {
        self.processes.values()
    }

    /// The frames of a stack hash (leaf first); `None` for a hash not (yet) drained.
    pub fn stack(&self, hash: u64) -> Option<&[u64]> {
        if hash == NO_STACK {
            return Some(&[]);
        }
        self.stacks.get(&hash).map(|frames| &frames[..])
    }

    /// Total CPU samples over all processes.
    pub fn total_samples(&self) -> u64 {
        self.processes.values().map(|p| p.total).sum()
    }

    fn process(&mut self, pid: u32, comm: &str) -> &mut ProcessSamples {
        self.processes.entry(pid).or_insert_with(|| first_sight(pid, comm))
    }

    /// Re-reads the mappings of a live process whose sampled user addresses are not all
    /// covered by the mappings captured so far. Old mappings that the new read no longer has
    /// are kept (samples taken before a `dlclose` still need them).
    fn refresh_mappings(&mut self, pid: u32) {
        let Some(process) = self.processes.get_mut(&pid) else { return };
        let Some(info) = &mut process.info else { return };
        let stacks = &self.stacks;
        let user_stacks = process.counts.keys().map(|k| k.user_stack).chain(process.heap_allocated.keys().copied());
        let uncovered = user_stacks
            .filter_map(|hash| stacks.get(&hash))
            .any(|frames| frames.iter().any(|&ip| info.mapping_of(ip).is_none()));
        if !uncovered {
            return;
        }
        if let Ok(fresh) = procs::read_maps(pid) {
            info.maps = merge_maps(fresh, &info.maps);
        }
    }
}

fn first_sight(pid: u32, comm: &str) -> ProcessSamples {
    let info = procs::read_process(pid).ok();
    let name = info.as_ref().map_or_else(|| comm.to_string(), |i| i.name.clone());
    ProcessSamples {
        pid,
        name,
        info,
        counts: HashMap::new(),
        threads: HashMap::new(),
        total: 0,
        heap_allocated: HashMap::new(),
        heap_live: HashMap::new(),
    }
}

/// `fresh` plus every entry of `old` that overlaps nothing in `fresh`, sorted by address.
fn merge_maps(mut fresh: Vec<MapEntry>, old: &[MapEntry]) -> Vec<MapEntry> {
    let kept: Vec<MapEntry> = old
        .iter()
        .filter(|o| !fresh.iter().any(|f| f.start < o.end && o.start < f.end))
        .cloned()
        .collect();
    fresh.extend(kept);
    fresh.sort_by_key(|m| m.start);
    fresh
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::{RawCpuSample, RawHeapTotals};

    fn sample(tgid: u32, tid: u32, user: u64, count: u64) -> RawCpuSample {
        RawCpuSample { tgid, tid, comm: format!("t{tid}"), user_stack: user, kernel_stack: NO_STACK, count }
    }

    // pids far above pid_max: never alive, so nothing is read from /proc.
    const PID: u32 = 0x7fff_fff0;

    #[test]
    fn merges_batches_per_process_and_thread() {
        let mut agg = Aggregate::default();
        for _ in 0..2 {
            let mut batch = Batch::default();
            batch.stacks.insert(7, vec![0x10, 0x20]);
            batch.cpu.push(sample(PID, PID, 7, 3));
            batch.cpu.push(sample(PID, PID + 1, 7, 1));
            batch.cpu.push(sample(PID + 5, PID + 5, NO_STACK, 2));
            agg.add(batch);
        }
        let procs: Vec<_> = agg.processes().collect();
        assert_eq!(procs.len(), 2);
        assert_eq!(procs[0].total, 8);
        assert_eq!(procs[0].name, format!("t{PID}"), "named after the main thread");
        assert_eq!(procs[0].threads.len(), 2);
        let key = SampleKey { tid: PID, user_stack: 7, kernel_stack: NO_STACK };
        assert_eq!(procs[0].counts[&key], 6);
        assert_eq!(agg.stack(7), Some(&[0x10, 0x20][..]));
        assert_eq!(agg.stack(NO_STACK), Some(&[][..]));
        assert_eq!(agg.stack(99), None);
        assert_eq!(agg.total_samples(), 12);
        assert_eq!(agg.uninspected_processes, 2);
    }

    #[test]
    fn heap_totals_accumulate_and_live_is_replaced() {
        let mut agg = Aggregate::default();
        for _ in 0..2 {
            let mut batch = Batch::default();
            batch.heap.push(RawHeapTotals { tgid: PID, stack: 7, count: 2, bytes: 64 });
            agg.add(batch);
        }
        agg.set_live(&[LiveBlock { tgid: PID, size: 32, stack: 7 }, LiveBlock { tgid: PID, size: 8, stack: 7 }]);
        agg.set_live(&[LiveBlock { tgid: PID, size: 32, stack: 7 }]);
        let p = agg.processes().next().unwrap();
        assert_eq!(p.heap_allocated[&7], HeapCount { count: 4, bytes: 128 });
        assert_eq!(p.heap_live[&7], HeapCount { count: 1, bytes: 32 });
    }

    #[test]
    fn merge_keeps_unmapped_old_entries() {
        let entry = |start, end| MapEntry { start, end, offset: 0, path: "/x".into(), inode: 1 };
        let merged = merge_maps(vec![entry(100, 200)], &[entry(150, 250), entry(300, 400)]);
        assert_eq!(merged, vec![entry(100, 200), entry(300, 400)]);
    }
}
