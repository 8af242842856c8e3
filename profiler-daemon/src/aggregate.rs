//! The single owner of captured CPU samples: merges drained batches per process, and
//! captures each process's mappings from `/proc` while it is alive (on first sight, and again
//! when a sampled address is not covered, e.g. after `dlopen`).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use profiler_common::NO_STACK;

use crate::{
    ebpf::CpuBatch,
    procs::{self, MapEntry, ProcessInfo},
};

/// What samples are counted under inside one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    pub tid: u32,
    /// User stack hash or `NO_STACK`.
    pub user_stack: u64,
    /// Kernel stack hash or `NO_STACK`.
    pub kernel_stack: u64,
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
    pub counts: HashMap<SampleKey, u64>,
    /// Thread id → thread name.
    pub threads: HashMap<u32, String>,
    /// Total samples.
    pub total: u64,
}

/// All processes' samples and the stacks they reference.
#[derive(Debug, Default)]
pub struct CpuAggregate {
    processes: BTreeMap<u32, ProcessSamples>,
    stacks: HashMap<u64, Arc<[u64]>>,
    /// Samples that referenced a stack missing from the kernel's stack map.
    pub missing_stacks: u64,
    /// Processes that exited before their mappings could be read.
    pub uninspected_processes: u64,
}

impl CpuAggregate {
    /// Merges a drained batch. Runs `/proc` reads for processes seen for the first time.
    pub fn add(&mut self, batch: CpuBatch) {
        self.missing_stacks += batch.missing_stacks;
        for (hash, frames) in batch.stacks {
            self.stacks.entry(hash).or_insert_with(|| frames.into());
        }
        let mut touched = Vec::new();
        for sample in batch.samples {
            let process = self.processes.entry(sample.tgid).or_insert_with(|| {
                touched.push(sample.tgid);
                first_sight(sample.tgid, &sample.comm)
            });
            if !touched.contains(&sample.tgid) {
                touched.push(sample.tgid);
            }
            if sample.tid == sample.tgid && process.info.is_none() {
                process.name.clone_from(&sample.comm);
            }
            process.threads.insert(sample.tid, sample.comm);
            let key = SampleKey {
                tid: sample.tid,
                user_stack: sample.user_stack,
                kernel_stack: sample.kernel_stack,
            };
            *process.counts.entry(key).or_default() += sample.count;
            process.total += sample.count;
        }
        for pid in touched {
            self.refresh_mappings(pid);
        }
        self.uninspected_processes =
            self.processes.values().filter(|p| p.info.is_none()).count() as u64;
    }

    /// Processes by pid.
    pub fn processes(&self) -> impl Iterator<Item = &ProcessSamples> {
        self.processes.values()
    }

    /// The frames of a stack hash (leaf first); empty for `NO_STACK` or an unknown hash.
    pub fn stack(&self, hash: u64) -> &[u64] {
        if hash == NO_STACK {
            return &[];
        }
        self.stacks.get(&hash).map_or(&[], |frames| frames)
    }

    /// Total samples over all processes.
    pub fn total_samples(&self) -> u64 {
        self.processes.values().map(|p| p.total).sum()
    }

    /// Re-reads the mappings of a live process whose sampled user addresses are not all
    /// covered by the mappings captured so far. Old mappings that the new read no longer has
    /// are kept (samples taken before a `dlclose` still need them).
    fn refresh_mappings(&mut self, pid: u32) {
        let Some(process) = self.processes.get_mut(&pid) else { return };
        let Some(info) = &mut process.info else { return };
        let stacks = &self.stacks;
        let uncovered = process.counts.keys().any(|key| {
            stacks
                .get(&key.user_stack)
                .is_some_and(|frames| frames.iter().any(|&ip| info.mapping_of(ip).is_none()))
        });
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
    use crate::ebpf::RawCpuSample;

    fn sample(tgid: u32, tid: u32, user: u64, count: u64) -> RawCpuSample {
        RawCpuSample {
            tgid,
            tid,
            comm: format!("t{tid}"),
            user_stack: user,
            kernel_stack: NO_STACK,
            count,
        }
    }

    #[test]
    fn merges_batches_per_process_and_thread() {
        let mut agg = CpuAggregate::default();
        // pids far above pid_max: never alive, so nothing is read from /proc.
        let pid = 0x7fff_fff0;
        for _ in 0..2 {
            let mut batch = CpuBatch::default();
            batch.stacks.insert(7, vec![0x10, 0x20]);
            batch.samples.push(sample(pid, pid, 7, 3));
            batch.samples.push(sample(pid, pid + 1, 7, 1));
            batch.samples.push(sample(pid + 5, pid + 5, NO_STACK, 2));
            agg.add(batch);
        }
        let procs: Vec<_> = agg.processes().collect();
        assert_eq!(procs.len(), 2);
        assert_eq!(procs[0].total, 8);
        assert_eq!(procs[0].name, format!("t{pid}"), "named after the main thread");
        assert_eq!(procs[0].threads.len(), 2);
        let key = SampleKey { tid: pid, user_stack: 7, kernel_stack: NO_STACK };
        assert_eq!(procs[0].counts[&key], 6);
        assert_eq!(agg.stack(7), &[0x10, 0x20]);
        assert!(agg.stack(NO_STACK).is_empty());
        assert_eq!(agg.total_samples(), 12);
        assert_eq!(agg.uninspected_processes, 2);
    }

    #[test]
    fn merge_keeps_unmapped_old_entries() {
        let entry = |start, end| MapEntry { start, end, offset: 0, path: "/x".into(), inode: 1 };
        let merged = merge_maps(vec![entry(100, 200)], &[entry(150, 250), entry(300, 400)]);
        assert_eq!(merged, vec![entry(100, 200), entry(300, 400)]);
    }
}
