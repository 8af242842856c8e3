//! Captured data, split by lifetime: [`Aggregate`] is what is *known* (each process's
//! identity and mappings, captured from `/proc` while it lives; every stack drained so far,
//! by content hash), and [`Counts`] is what was *counted* over some window (CPU samples,
//! allocations, live blocks). A snapshot has one of each; the daemon keeps one `Aggregate` and
//! several `Counts` (the interval, since start, on-demand windows) fed by the same batches.
//! Futex waits (block, mutex) and thread creations are counted here too, per process.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
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

/// What futex waits are counted under inside one process: the waiting operation, how it
/// ended, and the stack (the waiter's in the block profile, the waker's in the mutex profile).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaitSite {
    /// A `profiler_common::WaitOp` as its `u16`.
    pub op: u16,
    /// A `profiler_common::WaitOutcome` as its `u16`.
    pub outcome: u16,
    /// User stack hash or `NO_STACK`.
    pub stack: u64,
}

/// Completed waits: how many and their summed delay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitCount {
    pub count: u64,
    pub delay_ns: u64,
}

impl WaitCount {
    fn add(&mut self, count: u64, delay_ns: u64) {
        self.count += count;
        self.delay_ns = self.delay_ns.saturating_add(delay_ns);
    }
}

/// A process as known from `/proc` (or only from its samples, if it was gone too soon).
#[derive(Debug, Clone)]
pub struct KnownProcess {
    pub pid: u32,
    /// The process name (its `comm`).
    pub name: String,
    /// Mappings and owner captured from `/proc`; `None` when the process was gone before it
    /// could be inspected (its user frames stay unsymbolized and are counted as such).
    pub info: Option<ProcessInfo>,
    /// When the process was last seen in a batch.
    pub last_seen: Instant,
    /// Bumped each time re-reading `/proc/PID/maps` found new mappings (`dlopen`), so the
    /// unwinder knows to reload the process's tables.
    pub maps_version: u32,
    /// Whether any batch had data of it. Processes are also tracked before their first
    /// sample (every `execve`, heap targets); one that exits with none is forgotten by
    /// [`Aggregate::prune_unsampled`] within seconds rather than after the full grace, or a
    /// machine running thousands of short commands a second would hold a grace period's
    /// worth of them.
    pub sampled: bool,
}

/// Processes and stacks known so far.
#[derive(Debug)]
pub struct Aggregate {
    processes: BTreeMap<u32, KnownProcess>,
    stacks: HashMap<u64, Arc<[u64]>>,
    max_stacks: usize,
    /// Stacks not kept because the table was full (their samples lose their frames).
    pub dropped_stacks: u64,
}

impl Default for Aggregate {
    fn default() -> Self {
        Self::with_max_stacks(usize::MAX)
    }
}

impl Aggregate {
    /// An aggregate that keeps at most `max_stacks` distinct stacks.
    pub fn with_max_stacks(max_stacks: usize) -> Self {
        Self { processes: BTreeMap::new(), stacks: HashMap::new(), max_stacks, dropped_stacks: 0 }
    }

    /// Learns the stacks and processes of a batch. Reads `/proc` for processes seen for the
    /// first time, and again for those with addresses outside their known mappings.
    /// Returns the stacks this batch stored for the first time.
    pub fn learn(&mut self, batch: &Batch) -> HashSet<u64> {
        let mut new_stacks = HashSet::new();
        for (&hash, frames) in &batch.stacks {
            if self.stacks.contains_key(&hash) {
                continue;
            }
            if self.stacks.len() >= self.max_stacks {
                self.dropped_stacks += 1;
                continue;
            }
            self.stacks.insert(hash, frames.as_slice().into());
            new_stacks.insert(hash);
        }
        let now = Instant::now();
        let user_stacks = batch.cpu.iter().map(|s| (s.tgid, s.user_stack, s.tid == s.tgid, s.comm.as_str()));
        let heap_stacks = batch.heap.iter().map(|h| (h.tgid, h.stack, false, ""));
        let wait_stacks = batch.block.iter().chain(&batch.mutex).map(|w| (w.tgid, w.stack, false, ""));
        let thread_stacks = batch.threads.iter().map(|t| (t.tgid, t.stack, false, ""));
        let mut uncovered = Vec::new();
        for (pid, stack, main_thread, comm) in user_stacks.chain(heap_stacks).chain(wait_stacks).chain(thread_stacks) {
            let process = self.processes.entry(pid).or_insert_with(|| first_sight(pid, comm));
            process.last_seen = now;
            process.sampled = true;
            if main_thread && process.info.is_none() && !comm.is_empty() {
                process.name = comm.to_string();
            }
            let frames = batch.stacks.get(&stack).map_or(&[][..], |f| &f[..]);
            if let Some(info) = &process.info {
                if frames.iter().any(|&ip| info.mapping_of(ip).is_none()) {
                    uncovered.push(pid);
                }
            }
        }
        uncovered.sort_unstable();
        uncovered.dedup();
        for pid in uncovered {
            self.refresh_mappings(pid);
        }
        new_stacks
    }

    /// Registers a process before it has data (heap targets), so its mappings are captured
    /// while it is surely alive.
    pub fn track(&mut self, pid: u32) {
        let process = self.processes.entry(pid).or_insert_with(|| first_sight(pid, ""));
        process.last_seen = Instant::now();
    }

    /// A process called `execve`: its mappings are read again (or for the first time), so
    /// its new image is known before its first sample.
    pub fn exec_seen(&mut self, pid: u32) {
        if self.processes.contains_key(&pid) {
            self.refresh_mappings(pid);
        }
        self.track(pid);
    }

    /// A known process.
    pub fn process(&self, pid: u32) -> Option<&KnownProcess> {
        self.processes.get(&pid)
    }

    /// Known processes by pid.
    pub fn processes(&self) -> impl Iterator<Item = &KnownProcess> {
        self.processes.values()
    }

    /// Processes that exited before their mappings could be read.
    pub fn uninspected_processes(&self) -> u64 {
        self.processes.values().filter(|p| p.info.is_none()).count() as u64
    }

    /// Number of stacks kept.
    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }

    /// The frames of a stack hash (leaf first); `None` for a hash not (yet) drained.
    pub fn stack(&self, hash: u64) -> Option<&[u64]> {
        if hash == NO_STACK {
            return Some(&[]);
        }
        self.stacks.get(&hash).map(|frames| &frames[..])
    }

    /// Forgets processes not seen for `grace` that no longer exist, and keeps only the
    /// stacks that `keep` (the counts still held) reference. Returns the pids forgotten.
    pub fn prune(&mut self, grace: Duration, keep: &[&Counts]) -> Vec<u32> {
        let gone = self.forget_exited(grace, |_| true);
        let mut live = HashSet::new();
        for counts in keep {
            live.extend(counts.stack_hashes());
        }
        self.stacks.retain(|hash, _| live.contains(hash));
        gone
    }

    /// Forgets processes that exited without any data and were last seen over `grace` ago
    /// (a few drains: a sample taken just before the exit is drained by then). Returns
    /// their pids.
    pub fn prune_unsampled(&mut self, grace: Duration) -> Vec<u32> {
        self.forget_exited(grace, |p| !p.sampled)
    }

    /// Removes the processes for which `which` holds that were last seen over `grace` ago
    /// and no longer exist.
    fn forget_exited(&mut self, grace: Duration, which: impl Fn(&KnownProcess) -> bool) -> Vec<u32> {
        let now = Instant::now();
        let gone: Vec<u32> = self
            .processes
            .values()
            .filter(|p| which(p) && now.duration_since(p.last_seen) > grace && !procs::exists(p.pid))
            .map(|p| p.pid)
            .collect();
        for pid in &gone {
            self.processes.remove(pid);
        }
        gone
    }

    fn refresh_mappings(&mut self, pid: u32) {
        let Some(process) = self.processes.get_mut(&pid) else { return };
        let Some(info) = process.info.as_mut() else { return };
        if let Ok(fresh) = procs::read_maps(pid) {
            let merged = merge_maps(fresh, &info.maps);
            if merged != info.maps {
                process.maps_version += 1;
            }
            info.maps = merged;
        }
    }
}

/// What one process got in a window.
#[derive(Debug, Default, Clone)]
pub struct ProcessCounts {
    /// CPU samples.
    pub cpu: HashMap<SampleKey, u64>,
    /// Thread id → thread name.
    pub threads: HashMap<u32, String>,
    /// Total CPU samples.
    pub cpu_total: u64,
    /// Sampled allocations by allocating stack.
    pub heap_allocated: HashMap<u64, HeapCount>,
    /// Sampled blocks live at the last read, by allocating stack.
    pub heap_live: HashMap<u64, HeapCount>,
    /// Futex waits by waiting stack (the block profile).
    pub block: HashMap<WaitSite, WaitCount>,
    /// Woken futex waits by the stack that woke them (the mutex profile).
    pub mutex: HashMap<WaitSite, WaitCount>,
    /// Threads created, by creating stack.
    pub threads_created: HashMap<u64, u64>,
}

impl ProcessCounts {
    /// Sampled allocations in the window.
    pub fn heap_samples(&self) -> u64 {
        self.heap_allocated.values().map(|h| h.count).sum()
    }

    /// Futex waits in the window.
    pub fn block_waits(&self) -> u64 {
        self.block.values().map(|w| w.count).sum()
    }

    /// Waits charged to a waker in the window.
    pub fn mutex_waits(&self) -> u64 {
        self.mutex.values().map(|w| w.count).sum()
    }

    /// Threads created in the window.
    pub fn threads_total(&self) -> u64 {
        self.threads_created.values().sum()
    }
}

/// Counts per process over one window.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    processes: BTreeMap<u32, ProcessCounts>,
}

impl Counts {
    /// Adds a batch's CPU samples and allocation totals.
    pub fn add(&mut self, batch: &Batch) {
        for sample in &batch.cpu {
            let p = self.processes.entry(sample.tgid).or_default();
            p.threads.insert(sample.tid, sample.comm.clone());
            let key = SampleKey { tid: sample.tid, user_stack: sample.user_stack, kernel_stack: sample.kernel_stack };
            *p.cpu.entry(key).or_default() += sample.count;
            p.cpu_total += sample.count;
        }
        for totals in &batch.heap {
            let p = self.processes.entry(totals.tgid).or_default();
            p.heap_allocated.entry(totals.stack).or_default().add(totals.count, totals.bytes);
        }
        for (raw, mutex) in batch.block.iter().map(|w| (w, false)).chain(batch.mutex.iter().map(|w| (w, true))) {
            let p = self.processes.entry(raw.tgid).or_default();
            let site = WaitSite { op: raw.op, outcome: raw.outcome, stack: raw.stack };
            let map = if mutex { &mut p.mutex } else { &mut p.block };
            map.entry(site).or_default().add(raw.count, raw.delay_ns);
        }
        for raw in &batch.threads {
            *self.processes.entry(raw.tgid).or_default().threads_created.entry(raw.stack).or_default() += raw.count;
        }
    }

    /// Replaces the live heap of the processes in `pids` with their blocks in `blocks` (a
    /// full read of the live map).
    pub fn set_live(&mut self, pids: &[u32], blocks: &[LiveBlock]) {
        for &pid in pids {
            self.processes.entry(pid).or_default().heap_live.clear();
        }
        for block in blocks.iter().filter(|b| pids.contains(&b.tgid)) {
            self.processes.entry(block.tgid).or_default().heap_live.entry(block.stack).or_default().add(1, block.size);
        }
    }

    /// Counts of one process.
    pub fn process(&self, pid: u32) -> Option<&ProcessCounts> {
        self.processes.get(&pid)
    }

    /// (pid, counts) pairs by pid.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &ProcessCounts)> {
        self.processes.iter().map(|(&pid, c)| (pid, c))
    }

    /// Drops the counts of these processes.
    pub fn forget(&mut self, pids: &[u32]) {
        for pid in pids {
            self.processes.remove(pid);
        }
    }

    /// Total CPU samples over all processes.
    pub fn cpu_total(&self) -> u64 {
        self.processes.values().map(|p| p.cpu_total).sum()
    }

    /// Every stack hash referenced.
    pub fn stack_hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.processes.values().flat_map(|p| {
            p.cpu
                .keys()
                .flat_map(|k| [k.user_stack, k.kernel_stack])
                .chain(p.heap_allocated.keys().copied())
                .chain(p.heap_live.keys().copied())
                .chain(p.block.keys().chain(p.mutex.keys()).map(|site| site.stack))
                .chain(p.threads_created.keys().copied())
        })
    }
}

fn first_sight(pid: u32, comm: &str) -> KnownProcess {
    let info = procs::read_process(pid).ok();
    let name = info.as_ref().map_or_else(|| comm.to_string(), |i| i.name.clone());
    KnownProcess { pid, name, info, last_seen: Instant::now(), maps_version: 0, sampled: false }
}

/// `fresh` plus every entry of `old` that overlaps nothing in `fresh`, sorted by address.
fn merge_maps(mut fresh: Vec<MapEntry>, old: &[MapEntry]) -> Vec<MapEntry> {
    let kept: Vec<MapEntry> =
        old.iter().filter(|o| !fresh.iter().any(|f| f.start < o.end && o.start < f.end)).cloned().collect();
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

    fn batch() -> Batch {
        let mut batch = Batch::default();
        batch.stacks.insert(7, vec![0x10, 0x20]);
        batch.cpu.push(sample(PID, PID, 7, 3));
        batch.cpu.push(sample(PID, PID + 1, 7, 1));
        batch.cpu.push(sample(PID + 5, PID + 5, NO_STACK, 2));
        batch
    }

    #[test]
    fn learns_processes_and_counts_per_thread() {
        let (mut agg, mut counts) = (Aggregate::default(), Counts::default());
        for _ in 0..2 {
            let b = batch();
            agg.learn(&b);
            counts.add(&b);
        }
        assert_eq!(agg.processes().count(), 2);
        assert_eq!(agg.process(PID).unwrap().name, format!("t{PID}"), "named after the main thread");
        assert_eq!(agg.uninspected_processes(), 2);
        let p = counts.process(PID).unwrap();
        assert_eq!(p.cpu_total, 8);
        assert_eq!(p.threads.len(), 2);
        assert_eq!(p.cpu[&SampleKey { tid: PID, user_stack: 7, kernel_stack: NO_STACK }], 6);
        assert_eq!(agg.stack(7), Some(&[0x10, 0x20][..]));
        assert_eq!(agg.stack(NO_STACK), Some(&[][..]));
        assert_eq!(agg.stack(99), None);
        assert_eq!(counts.cpu_total(), 12);
    }

    #[test]
    fn stack_table_is_capped_and_pruned() {
        let mut agg = Aggregate::with_max_stacks(1);
        let mut b = batch();
        b.stacks.insert(8, vec![0x30]);
        agg.learn(&b);
        assert_eq!((agg.stack_count(), agg.dropped_stacks), (1, 1));
        let counts = Counts::default();
        let gone = agg.prune(Duration::ZERO, &[&counts]);
        assert_eq!(agg.stack_count(), 0, "no counts reference the stack");
        assert_eq!(gone.len(), 2, "neither pid exists");
    }

    #[test]
    fn exited_processes_without_data_go_first() {
        let mut agg = Aggregate::default();
        agg.learn(&batch());
        agg.track(PID + 9);
        agg.exec_seen(PID + 10);
        let live = std::process::id();
        agg.track(live);
        let mut gone = agg.prune_unsampled(Duration::ZERO);
        gone.sort_unstable();
        assert_eq!(gone, vec![PID + 9, PID + 10], "only the exited ones without data");
        assert!(agg.process(PID).is_some() && agg.process(PID + 5).is_some(), "sampled ones wait for prune");
        assert!(agg.process(live).is_some(), "a live process stays");
        assert!(agg.prune_unsampled(Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn heap_totals_accumulate_and_live_is_replaced() {
        let mut counts = Counts::default();
        for _ in 0..2 {
            let mut batch = Batch::default();
            batch.heap.push(RawHeapTotals { tgid: PID, stack: 7, count: 2, bytes: 64 });
            counts.add(&batch);
        }
        let block = |size| LiveBlock { tgid: PID, size, stack: 7 };
        counts.set_live(&[PID], &[block(32), block(8), LiveBlock { tgid: 1, size: 1, stack: 7 }]);
        counts.set_live(&[PID], &[block(32)]);
        let p = counts.process(PID).unwrap();
        assert_eq!(p.heap_allocated[&7], HeapCount { count: 4, bytes: 128 });
        assert_eq!(p.heap_live[&7], HeapCount { count: 1, bytes: 32 });
        assert!(counts.process(1).is_none(), "only the listed pids");
    }

    #[test]
    fn waits_and_threads_accumulate_per_site() {
        use crate::ebpf::{RawThreadCount, RawWaitTotals};
        let mut counts = Counts::default();
        for _ in 0..2 {
            let mut batch = Batch::default();
            let wait = RawWaitTotals { tgid: PID, op: 1, outcome: 0, stack: 7, count: 3, delay_ns: 300 };
            batch.block.push(wait);
            batch.block.push(RawWaitTotals { outcome: 1, ..wait });
            batch.mutex.push(RawWaitTotals { stack: 8, ..wait });
            batch.threads.push(RawThreadCount { tgid: PID, stack: 9, count: 4 });
            counts.add(&batch);
        }
        let p = counts.process(PID).unwrap();
        assert_eq!(p.block[&WaitSite { op: 1, outcome: 0, stack: 7 }], WaitCount { count: 6, delay_ns: 600 });
        assert_eq!(p.block.len(), 2, "outcomes are kept apart");
        assert_eq!((p.block_waits(), p.mutex_waits(), p.threads_total()), (12, 6, 8));
        let mut hashes: Vec<u64> = counts.stack_hashes().collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes, [7, 8, 9]);
    }

    #[test]
    fn merge_keeps_unmapped_old_entries() {
        let entry = |start, end| MapEntry { start, end, offset: 0, path: "/x".into(), inode: 1 };
        let merged = merge_maps(vec![entry(100, 200)], &[entry(150, 250), entry(300, 400)]);
        assert_eq!(merged, vec![entry(100, 200), entry(300, 400)]);
    }
}
