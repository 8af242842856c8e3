//! Reading the live-heap map (`HEAP_LIVE`) while the kernel's `free` probes delete from it
//! (security-3 F17). A walk with `bpf_map_get_next_key` restarts from the first bucket
//! whenever the key it stands on is deleted, so read naively it yields blocks twice (inuse
//! inflated) and can go quadratic (a collector stall). `BPF_MAP_LOOKUP_BATCH` walks by
//! bucket index instead, each bucket under its lock: a deletion never moves the cursor back
//! and no key comes twice. Kernels before 5.6 lack it; there the walk is deduplicated and
//! bounded. What the entries mean is `heap`'s business, not this module's.

use std::collections::HashSet;
use std::os::fd::{AsRawFd, BorrowedFd};

use profiler_common::{LiveAlloc, LiveKey};

use super::unwind::BatchAttr;

/// `BPF_MAP_LOOKUP_BATCH`.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Entries asked for per batch call: 128 KiB of buffers, 64 calls for a full map of
/// 262,144 entries.
const BATCH_ENTRIES: u32 = 4_096;

/// A walk of the map (the fallback) may step through this many keys per entry the map can
/// hold before it stops: each restart costs up to a whole map.
const WALK_STEPS_PER_ENTRY: usize = 4;

/// The entries of one read of the live map.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct LiveRead {
    /// Each block once.
    pub entries: Vec<(LiveKey, LiveAlloc)>,
    /// The (fallback) walk stopped at its step budget: blocks are missing.
    pub cut: bool,
}

/// Every entry of the live map `fd`, each once: by batch lookup, or where the kernel has
/// none, by the walk `keys` (aya's `keys()`) deduplicated and bounded by `capacity`, each
/// key then looked up with `get` (a block freed since is skipped).
pub(super) fn read<W, E>(
    fd: BorrowedFd<'_>,
    capacity: usize,
    keys: impl FnOnce() -> W,
    get: impl Fn(&LiveKey) -> Option<LiveAlloc>,
) -> std::io::Result<LiveRead>
where
    W: Iterator<Item = Result<LiveKey, E>>,
{
    if let Some(entries) = lookup_batch(fd, capacity)? {
        return Ok(LiveRead { entries, cut: false });
    }
    let walk = unique_keys(keys(), capacity.saturating_mul(WALK_STEPS_PER_ENTRY));
    let entries = walk.keys.into_iter().filter_map(|key| get(&key).map(|value| (key, value))).collect();
    Ok(LiveRead { entries, cut: walk.cut })
}

/// Every entry of the hash map `fd` (keys `LiveKey`, values `LiveAlloc`) by
/// `BPF_MAP_LOOKUP_BATCH`; `None` when the kernel has no batch lookups (before 5.6: the
/// command is unknown, `EINVAL` on the first call).
fn lookup_batch(fd: BorrowedFd<'_>, capacity: usize) -> std::io::Result<Option<Vec<(LiveKey, LiveAlloc)>>> {
    let mut entries = Vec::new();
    let mut chunk = BATCH_ENTRIES;
    let (mut cursor, mut next, mut first) = (0u32, 0u32, true);
    loop {
        let mut keys = vec![LiveKey { tgid: 0, _pad: 0, addr: 0 }; chunk as usize];
        let mut values = vec![LiveAlloc { size: 0, stack: 0 }; chunk as usize];
        let mut attr = BatchAttr {
            // The first call starts at bucket 0; later ones where the last stopped.
            in_batch: if first { 0 } else { &cursor as *const u32 as u64 },
            out_batch: &mut next as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk,
            map_fd: fd.as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: `keys` and `values` hold `count` entries of the map's key and value sizes
        // (16 bytes each, asserted in profiler-common), `cursor` and `next` are u32 (an
        // htab's batch token), all live and writable for the call.
        let result = unsafe { super::bpf_call(BPF_MAP_LOOKUP_BATCH, &mut attr) };
        // The kernel writes back how many entries it copied, on success and at the end
        // (`ENOENT`). It returns `ENOENT` without writing only for a cursor past the last
        // bucket, which it never hands out.
        let read = (attr.count as usize).min(chunk as usize);
        match result {
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {
                entries.extend(keys.into_iter().zip(values).take(read));
                return Ok(Some(entries));
            }
            Err(err) if first && err.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
            // One bucket holds more entries than `chunk`: ask for more at once. A bucket
            // cannot hold more than the map.
            Err(err) if err.raw_os_error() == Some(libc::ENOSPC) && (chunk as usize) < capacity => {
                chunk = chunk.saturating_mul(2);
                continue;
            }
            Err(err) => return Err(err),
        }
        entries.extend(keys.into_iter().zip(values).take(read));
        (cursor, first) = (next, false);
    }
}

/// The distinct keys of one walk of a hash map.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct UniqueKeys<K> {
    /// Each key once, in the order first met.
    pub keys: Vec<K>,
    /// The walk stopped at its step budget, not at its end.
    pub cut: bool,
}

/// Collects the keys of a kernel hash map's walk (`bpf_map_get_next_key`), each once. When
/// the key the walk stands on is deleted before the next step, the kernel restarts it from
/// the first bucket, so keys come again (read as they came, a block would count twice in
/// inuse) and a walk under heavy deletion can go quadratic: it stops after `max_steps` keys,
/// and says so. A failing step ends the walk with what was read.
pub(crate) fn unique_keys<K, E>(walk: impl Iterator<Item = Result<K, E>>, max_steps: usize) -> UniqueKeys<K>
where
    K: Copy + Eq + std::hash::Hash,
{
    let mut seen = HashSet::new();
    let mut keys = Vec::new();
    let mut walk = walk.fuse();
    for _ in 0..max_steps {
        match walk.next() {
            Some(Ok(key)) => {
                if seen.insert(key) {
                    keys.push(key);
                }
            }
            Some(Err(_)) | None => return UniqueKeys { keys, cut: false },
        }
    }
    let cut = walk.next().is_some();
    UniqueKeys { keys, cut }
}

#[cfg(test)]
mod tests;
