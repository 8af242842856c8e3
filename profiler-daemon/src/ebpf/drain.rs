//! Draining one map set: read every (key, per-CPU counts) entry and the stacks they
//! reference, then delete them so the set is empty when the kernel flips back to it.
//!
//! Iterate-then-delete is safe only because the kernel writes to the other set meanwhile
//! (see `CpuSampler::drain`).

use std::collections::HashMap as StdHashMap;

use aya::{
    maps::{HashMap, MapData, PerCpuHashMap},
    Ebpf,
};
use profiler_common::{maps, CpuSampleKey, Stack, NO_STACK};

use super::{map_error, missing_map};
use crate::error::Result;

/// One drained set: aggregated sample counts and the stacks they reference.
#[derive(Debug, Default)]
pub struct CpuBatch {
    pub samples: Vec<RawCpuSample>,
    /// Stack hash → frames (leaf first). Hashes are content-derived, so the same stack has
    /// the same hash in every set and every batch.
    pub stacks: StdHashMap<u64, Vec<u64>>,
    /// Samples whose stack hash had no entry in the stack map (counted, kept without it).
    pub missing_stacks: u64,
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

const COUNTS: [&str; 2] = [maps::CPU_COUNTS_0, maps::CPU_COUNTS_1];
const STACKS: [&str; 2] = [maps::STACKS_0, maps::STACKS_1];

/// Reads and empties map set `set`.
pub(super) fn drain_set(ebpf: &mut Ebpf, set: u32) -> Result<CpuBatch> {
    let (counts_name, stacks_name) = (COUNTS[set as usize], STACKS[set as usize]);
    let entries = drain_counts(ebpf, counts_name)?;
    let mut batch = CpuBatch::default();
    let stacks = drain_stacks(ebpf, stacks_name)?;
    for (key, count) in entries {
        let sample = raw_sample(&key, count);
        for hash in [sample.user_stack, sample.kernel_stack] {
            if hash != NO_STACK && !batch.stacks.contains_key(&hash) {
                match stacks.get(&hash) {
                    Some(frames) => {
                        batch.stacks.insert(hash, frames.clone());
                    }
                    None => batch.missing_stacks += sample.count,
                }
            }
        }
        batch.samples.push(sample);
    }
    Ok(batch)
}

fn raw_sample(key: &CpuSampleKey, count: u64) -> RawCpuSample {
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

fn drain_counts(ebpf: &mut Ebpf, name: &'static str) -> Result<Vec<(CpuSampleKey, u64)>> {
    let map = ebpf.map_mut(name).ok_or_else(|| missing_map(name))?;
    let mut counts: PerCpuHashMap<&mut MapData, CpuSampleKey, u64> =
        PerCpuHashMap::try_from(map).map_err(map_error("open", name))?;
    let keys: Vec<CpuSampleKey> = counts.keys().filter_map(|k| k.ok()).collect();
    let mut entries = Vec::with_capacity(keys.len());
    for key in keys {
        if let Ok(values) = counts.get(&key, 0) {
            entries.push((key, values.iter().sum()));
        }
        counts.remove(&key).map_err(map_error("clear", name))?;
    }
    Ok(entries)
}

fn drain_stacks(ebpf: &mut Ebpf, name: &'static str) -> Result<StdHashMap<u64, Vec<u64>>> {
    let map = ebpf.map_mut(name).ok_or_else(|| missing_map(name))?;
    let mut stacks: HashMap<&mut MapData, u64, Stack> =
        HashMap::try_from(map).map_err(map_error("open", name))?;
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
