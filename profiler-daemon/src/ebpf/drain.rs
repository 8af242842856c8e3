//! Draining one map set: each program kind's counts (their own files read them) and the
//! stacks they reference, then deleting them so the set is empty when the kernel flips back
//! to it.
//!
//! Iterate-then-delete is safe only because the kernel writes to the other set meanwhile
//! (see `Session::drain`). Stacks go to userspace with the batch, and since a stack's key is
//! its content hash, a live heap block that names a stack drained long ago still resolves.

use std::collections::HashMap as StdHashMap;

use aya::{
    maps::{HashMap, MapData, PerCpuHashMap},
    Ebpf,
};
use profiler_common::{maps, Stack};

use super::{
    cpu::{self, RawCpuSample},
    heap::{self, RawHeapTotals},
    map_error, map_mut,
    threads::{self, RawThreadCount},
    waits::{self, RawWaitTotals},
    Result,
};
use crate::ids::StackId;

/// One drained set: each kind's raw counts, and the stacks they name.
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
    /// Stack → frames (leaf first).
    pub stacks: StdHashMap<StackId, Vec<u64>>,
}

const STACKS: [&str; 2] = [maps::STACKS_0, maps::STACKS_1];

/// Reads and empties map set `set`.
pub(super) fn drain_set(ebpf: &mut Ebpf, set: u32) -> Result<Batch> {
    let set = set as usize;
    let cpu = cpu::drain(ebpf, set)?;
    let heap = heap::drain(ebpf, set)?;
    let (block, mutex) = waits::drain(ebpf, set)?;
    let threads = threads::drain(ebpf, set)?;
    // Stacks last: every count above names a stack already in the set.
    let stacks = drain_stacks(ebpf, STACKS[set])?;
    Ok(Batch { cpu, heap, block, mutex, threads, stacks })
}

/// Reads every entry of a per-CPU hash (summing the CPUs with `sum`) and deletes it.
pub(super) fn drain_per_cpu<K, V, T>(
    ebpf: &mut Ebpf,
    name: &'static str,
    sum: impl Fn(&[V]) -> T,
) -> Result<Vec<(K, T)>>
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

fn drain_stacks(ebpf: &mut Ebpf, name: &'static str) -> Result<StdHashMap<StackId, Vec<u64>>> {
    let mut stacks: HashMap<&mut MapData, u64, Stack> = map_mut(ebpf, name)?;
    let keys: Vec<u64> = stacks.keys().filter_map(|k| k.ok()).collect();
    let mut out = StdHashMap::with_capacity(keys.len());
    for hash in keys {
        if let Ok(stack) = stacks.get(&hash, 0) {
            out.insert(StackId(hash), stack.frames().to_vec());
        }
        stacks.remove(&hash).map_err(map_error("clear", name))?;
    }
    Ok(out)
}
