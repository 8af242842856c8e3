//! Draining one map set: each program kind's counts (their own files read them) and the
//! stacks they reference, then deleting them so the set is empty when the kernel flips back
//! to it.
//!
//! Iterate-then-delete is safe only because the kernel writes to the other set meanwhile
//! (see `Session::drain`); in the one stack map both sets share, to the other set's keys (a
//! key's low bit is its set). Stacks go to userspace with the batch, and since a stack's key
//! is its content hash, a live heap block that names a stack drained long ago still resolves.

use std::collections::{HashMap as StdHashMap, HashSet};

use aya::{
    maps::{HashMap, MapData},
    Ebpf,
};
use profiler_common::{
    maps,
    share::{ShareKey, SHARE_UID},
    stack::{chunk_key, set_key, STACK_CONTINUED},
    ShareUse, Stack, STACK_CHUNKS,
};

use super::{
    cpu::{self, RawCpuSample},
    futex::{self, RawWaitTotals},
    go_labels::{self, LabelsId, RawLabels},
    heap::{self, RawHeapTotals},
    map_error, map_mut,
    offcpu::{self, RawOffCpu},
    threadcreate::{self, RawThreadCount},
    Result,
};
use crate::ids::{Pid, StackId};

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
    pub threadcreate: Vec<RawThreadCount>,
    /// Sampled switches and time off CPU, by (thread, state, stacks), unscaled.
    pub offcpu: Vec<RawOffCpu>,
    /// Stack → frames (leaf first).
    pub stacks: StdHashMap<StackId, Vec<u64>>,
    /// Go goroutines' label sets named by the samples (see [`LabelsId`]).
    pub labels: StdHashMap<LabelsId, RawLabels>,
    /// Samples the kernel refused a new stack, by process, because the process or its uid
    /// held its share of the set's stack table (see `profiler_common::share`).
    pub over_share: Vec<(Pid, u64)>,
}

const SHARES: [&str; 2] = [maps::STACK_SHARES_0, maps::STACK_SHARES_1];

/// Reads and empties map set `set`.
pub(super) fn drain_set(ebpf: &mut Ebpf, set: u32) -> Result<Batch> {
    let set = set as usize;
    let cpu = cpu::drain(ebpf, set)?;
    let heap = heap::drain(ebpf, set)?;
    let (block, mutex) = futex::drain(ebpf, set)?;
    let threadcreate = threadcreate::drain(ebpf, set)?;
    let offcpu = offcpu::drain(ebpf, set)?;
    // Stacks last: every count above names a stack already in the set.
    let stacks = drain_stacks(ebpf, set as u32)?;
    let labels = go_labels::drain(ebpf, set as u32)?;
    // Emptied with its stack map: each set's shares start again at its next second.
    let over_share = super::drain_counts::<ShareKey, ShareUse>(ebpf, SHARES[set])?
        .into_iter()
        .filter(|(key, used)| key & SHARE_UID == 0 && used.refused > 0)
        .map(|(key, used)| (Pid(key as u32), used.refused))
        .collect();
    Ok(Batch { cpu, heap, block, mutex, threadcreate, offcpu, stacks, labels, over_share })
}

/// Reads and deletes set `set`'s entries of the stack map, which the kernel meanwhile fills
/// with the other set's (a key's low bit is its set, see `profiler_common::stack::set_key`).
/// Walking a hash map that takes inserts meanwhile may visit a key twice or miss a new one,
/// never one that was there throughout: the drained set's entries all were.
fn drain_stacks(ebpf: &mut Ebpf, set: u32) -> Result<StdHashMap<StackId, Vec<u64>>> {
    let name = maps::STACKS;
    let mut stacks: HashMap<&mut MapData, u64, Stack> = map_mut(ebpf, name)?;
    let keys: Vec<u64> = stacks.keys().filter_map(|k| k.ok()).filter(|&key| set_key(key & !1, set) == key).collect();
    let mut entries = StdHashMap::with_capacity(keys.len());
    for key in keys {
        if let Ok(stack) = stacks.get(&key, 0) {
            entries.insert(key & !1, stack);
        }
        // A key seen twice is gone the second time.
        match stacks.remove(&key) {
            Err(aya::maps::MapError::SyscallError(err)) if err.io_error.raw_os_error() == Some(libc::ENOENT) => {}
            done => done.map_err(map_error("clear", name))?,
        }
    }
    Ok(join_pieces(&entries))
}

/// Stacks from the map's entries: a deep stack's pieces (see `profiler_common::stack`)
/// joined under its hash, the pieces themselves left out. A chain missing a piece (the map
/// filled between two inserts, which the kernel then refuses the stack for) ends there.
fn join_pieces(entries: &StdHashMap<u64, Stack>) -> StdHashMap<StackId, Vec<u64>> {
    let mut pieces = HashSet::new();
    let mut out = StdHashMap::with_capacity(entries.len());
    for (&hash, stack) in entries {
        let mut frames = stack.frames().to_vec();
        let mut last = stack;
        for n in 1..STACK_CHUNKS as u32 {
            if last.truncated & STACK_CONTINUED == 0 {
                break;
            }
            let key = chunk_key(hash, n);
            let Some(next) = entries.get(&key) else { break };
            pieces.insert(key);
            frames.extend_from_slice(next.frames());
            last = next;
        }
        out.insert(StackId(hash), frames);
    }
    out.retain(|id, _| !pieces.contains(&id.0));
    out
}

#[cfg(test)]
mod tests {
    use profiler_common::STACK_PIECE_FRAMES;

    use super::*;

    fn piece(frames: &[u64], continued: bool) -> Stack {
        let mut stack = Stack { len: frames.len() as u32, truncated: 0, ips: [0; STACK_PIECE_FRAMES] };
        stack.ips[..frames.len()].copy_from_slice(frames);
        if continued {
            stack.truncated = STACK_CONTINUED;
        }
        stack
    }

    #[test]
    fn a_deep_stack_is_joined_and_its_pieces_left_out() {
        let n = STACK_PIECE_FRAMES;
        let deep: Vec<u64> = (1..=2 * n as u64 + 20).collect();
        let (head, shallow) = (0xdee9, 0x5a11);
        let entries = StdHashMap::from([
            (head, piece(&deep[..n], true)),
            (chunk_key(head, 1), piece(&deep[n..2 * n], true)),
            (chunk_key(head, 2), piece(&deep[2 * n..], false)),
            (shallow, piece(&[7, 8], false)),
        ]);
        let stacks = join_pieces(&entries);
        assert_eq!(stacks.len(), 2);
        assert_eq!(stacks[&StackId(head)], deep);
        assert_eq!(stacks[&StackId(shallow)], vec![7, 8]);
    }
}
