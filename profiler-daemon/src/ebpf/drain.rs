//! Draining one map set: read every CPU count, heap total, futex wait total and thread count,
//! and the stacks they reference,
//! then delete them so the set is empty when the kernel flips back to it.
//!
//! Iterate-then-delete is safe only because the kernel writes to the other set meanwhile
//! (see `Session::drain`). Stacks go to userspace with the batch, and since a stack's key is
//! its content hash, a live heap block that names a stack drained long ago still resolves.

use std::collections::HashMap as StdHashMap;

use aya::{
    maps::{HashMap, MapData, PerCpuHashMap},
    Ebpf,
};
use profiler_common::{maps, CpuSampleKey, HeapKey, HeapTotals, Stack, ThreadKey, WaitKey, WaitTotals};

use super::{map_error, map_mut};
use crate::error::Result;

/// One drained set.
#[derive(Debug, Default)]
pub struct Batch {
    pub cpu: Vec<RawCpuSample>,
    pub heap: Vec<RawHeapTotals>,
    /// Completed futex waits by waiting stack (the block profile).
    pub block: Vec<RawWaitTotals>,
    /// Woken futex waits by the stack that woke them (the mutex profile).
    pub mutex: Vec<RawWaitTotals>,
    /// Threads created, by creating stack.
    pub threads: Vec<RawThreadCount>,
    /// Stack hash → frames (leaf first).
    pub stacks: StdHashMap<u64, Vec<u64>>,
}

/// A (process, thread, stacks) entry with the number of samples it got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawCpuSample {
    pub tgid: u32,
    pub tid: u32,
    /// The thread's name at sampling time.
    pub comm: String,
    /// User stack hash, or `NO_STACK`.
    pub user_stack: u64,
    /// Kernel stack hash, or `NO_STACK`.
    pub kernel_stack: u64,
    pub count: u64,
}

/// Sampled allocations of one (process, stack) in the drained interval, unscaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawHeapTotals {
    pub tgid: u32,
    pub stack: u64,
    pub count: u64,
    pub bytes: u64,
}

/// Futex waits of one (process, op, outcome, stack) in the drained interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawWaitTotals {
    pub tgid: u32,
    /// A `profiler_common::WaitOp` as its `u16`.
    pub op: u16,
    /// A `profiler_common::WaitOutcome` as its `u16`.
    pub outcome: u16,
    pub stack: u64,
    pub count: u64,
    pub delay_ns: u64,
}

/// Threads one (process, stack) created in the drained interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawThreadCount {
    pub tgid: u32,
    pub stack: u64,
    pub count: u64,
}

const BLOCK_COUNTS: [&str; 2] = [maps::BLOCK_COUNTS_0, maps::BLOCK_COUNTS_1];
const MUTEX_COUNTS: [&str; 2] = [maps::MUTEX_COUNTS_0, maps::MUTEX_COUNTS_1];
const THREAD_COUNTS: [&str; 2] = [maps::THREAD_COUNTS_0, maps::THREAD_COUNTS_1];
const CPU_COUNTS: [&str; 2] = [maps::CPU_COUNTS_0, maps::CPU_COUNTS_1];
const HEAP_TOTALS: [&str; 2] = [maps::HEAP_TOTALS_0, maps::HEAP_TOTALS_1];
const STACKS: [&str; 2] = [maps::STACKS_0, maps::STACKS_1];

/// Reads and empties map set `set`.
pub(super) fn drain_set(ebpf: &mut Ebpf, set: u32) -> Result<Batch> {
    let set = set as usize;
    let cpu = drain_per_cpu(ebpf, CPU_COUNTS[set], |values: &[u64]| values.iter().sum())?
        .into_iter()
        .map(|(key, count)| raw_cpu_sample(&key, count))
        .collect();
    let heap = drain_per_cpu(ebpf, HEAP_TOTALS[set], |values: &[HeapTotals]| {
        values
            .iter()
            .fold(HeapTotals::default(), |a, v| HeapTotals { count: a.count + v.count, bytes: a.bytes + v.bytes })
    })?
    .into_iter()
    .map(|(key, t): (HeapKey, HeapTotals)| RawHeapTotals {
        tgid: key.tgid,
        stack: key.stack,
        count: t.count,
        bytes: t.bytes,
    })
    .collect();
    let block = drain_waits(ebpf, BLOCK_COUNTS[set])?;
    let mutex = drain_waits(ebpf, MUTEX_COUNTS[set])?;
    let threads = drain_per_cpu(ebpf, THREAD_COUNTS[set], |values: &[u64]| values.iter().sum())?
        .into_iter()
        .map(|(key, count): (ThreadKey, u64)| RawThreadCount { tgid: key.tgid, stack: key.stack, count })
        .collect();
    // Stacks last: every count above names a stack already in the set.
    let stacks = drain_stacks(ebpf, STACKS[set])?;
    Ok(Batch { cpu, heap, block, mutex, threads, stacks })
}

fn drain_waits(ebpf: &mut Ebpf, name: &'static str) -> Result<Vec<RawWaitTotals>> {
    let sum = |values: &[WaitTotals]| {
        values.iter().fold(WaitTotals::default(), |a, v| WaitTotals {
            count: a.count + v.count,
            delay_ns: a.delay_ns.wrapping_add(v.delay_ns),
        })
    };
    Ok(drain_per_cpu(ebpf, name, sum)?
        .into_iter()
        .map(|(key, t): (WaitKey, WaitTotals)| RawWaitTotals {
            tgid: key.tgid,
            op: key.op,
            outcome: key.outcome,
            stack: key.stack,
            count: t.count,
            delay_ns: t.delay_ns,
        })
        .collect())
}

fn raw_cpu_sample(key: &CpuSampleKey, count: u64) -> RawCpuSample {
    let comm_len = key.comm.iter().position(|&b| b == 0).unwrap_or(key.comm.len());
    RawCpuSample {
        tgid: key.tgid,
        tid: key.tid,
        comm: String::from_utf8_lossy(&key.comm[..comm_len]).into_owned(),
        user_stack: key.user_stack,
        kernel_stack: key.kernel_stack,
        count,
    }
}

/// Reads every entry of a per-CPU hash (summing the CPUs with `sum`) and deletes it.
fn drain_per_cpu<K, V, T>(ebpf: &mut Ebpf, name: &'static str, sum: impl Fn(&[V]) -> T) -> Result<Vec<(K, T)>>
where
    K: aya::Pod,
    V: aya::Pod,
{
    let mut map: PerCpuHashMap<&mut MapData, K, V> = map_mut(ebpf, name)?;
    let keys: Vec<K> = map.keys().filter_map(|k| k.ok()).collect();
    let mut entries = Vec::with_capacity(keys.len());
    for key in keys {
        if let Ok(values) = map.get(&key, 0) {
            entries.push((key, sum(&values)));
        }
        map.remove(&key).map_err(map_error("clear", name))?;
    }
    Ok(entries)
}

fn drain_stacks(ebpf: &mut Ebpf, name: &'static str) -> Result<StdHashMap<u64, Vec<u64>>> {
    let mut stacks: HashMap<&mut MapData, u64, Stack> = map_mut(ebpf, name)?;
    let keys: Vec<u64> = stacks.keys().filter_map(|k| k.ok()).collect();
    let mut out = StdHashMap::with_capacity(keys.len());
    for hash in keys {
        if let Ok(stack) = stacks.get(&hash, 0) {
            out.insert(hash, stack.frames().to_vec());
        }
        stacks.remove(&hash).map_err(map_error("clear", name))?;
    }
    Ok(out)
}
