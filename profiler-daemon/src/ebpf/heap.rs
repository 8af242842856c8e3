//! The heap probes' side of the session: find a process's C library from its memory map,
//! attach the allocator uprobes and the shared uretprobe to that process only, fill the
//! sampling-interval table, and read the live-block map and counters.

use std::num::NonZeroU32;

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    programs::{
        uprobe::{UProbeAttachLocation, UProbeScope},
        ProgramError, UProbe,
    },
    Ebpf,
};
use profiler_common::{heap::HEAP_INTERVALS_LEN, maps, HeapCounter, LiveAlloc, LiveKey};

use super::{map_error, map_mut, map_ref, missing, program_error, sum_counter};
use crate::{
    error::{Error, Result},
    procs, symbolize,
};

/// Allocator functions and the entry program each gets. Every one but `free` also gets
/// the return program.
const ENTRY_POINTS: [(&str, &str); 10] = [
    ("malloc", "malloc_enter"),
    ("calloc", "calloc_enter"),
    ("realloc", "realloc_enter"),
    ("reallocarray", "reallocarray_enter"),
    ("posix_memalign", "posix_memalign_enter"),
    ("aligned_alloc", "memalign_enter"),
    ("memalign", "memalign_enter"),
    ("valloc", "malloc_enter"),
    ("pvalloc", "pvalloc_enter"),
    ("free", "free_enter"),
];
const EXIT_PROGRAM: &str = "alloc_exit";
const PROGRAMS: [&str; 9] = [
    "malloc_enter",
    "calloc_enter",
    "realloc_enter",
    "reallocarray_enter",
    "posix_memalign_enter",
    "memalign_enter",
    "pvalloc_enter",
    "free_enter",
    EXIT_PROGRAM,
];

/// What was probed in one process.
#[derive(Clone, Debug)]
pub struct HeapAttachment {
    pub pid: u32,
    /// The library probed, as the process maps it.
    pub library: String,
    /// Functions probed (those the library exports).
    pub functions: Vec<&'static str>,
}

/// A sampled block that is still live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    pub tgid: u32,
    pub size: u64,
    /// Allocating stack hash or `NO_STACK`.
    pub stack: u64,
}

/// Totals of the heap counters since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapCounters {
    pub sampled: u64,
    pub live_map_full: u64,
    pub totals_map_full: u64,
    pub stack_lost: u64,
    pub pending_map_full: u64,
    pub freed: u64,
    pub out_ptr_unreadable: u64,
}

pub(super) fn load_programs(ebpf: &mut Ebpf) -> Result<()> {
    for name in PROGRAMS {
        uprobe(ebpf, name)?.load().map_err(program_error("load", name))?;
    }
    Ok(())
}

pub(super) fn attach(ebpf: &mut Ebpf, pid: u32) -> Result<HeapAttachment> {
    let maps = procs::read_maps(pid)
        .map_err(|source| Error::Io { action: format!("read /proc/{pid}/maps to find its C library"), source })?;
    let library = find_libc(&maps).ok_or(Error::NoAllocator(pid))?;
    // Through the process's root, so a process in a container gets its own libc.
    let target = format!("/proc/{pid}/root{library}");
    let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).ok_or(Error::NoSuchProcess(pid))?);
    let names = ENTRY_POINTS.map(|(function, _)| function);
    let offsets = symbolize::symbol_offsets(std::path::Path::new(&target), &names);
    let mut functions = Vec::new();
    let mut probed: Vec<u64> = Vec::new();
    for ((function, entry), offset) in ENTRY_POINTS.into_iter().zip(offsets) {
        // Not every C library exports every function (reallocarray, pvalloc).
        let Some(offset) = offset else {
            tracing::debug!(pid, function, library, "not exported; not probed");
            continue;
        };
        // An alias of a function already probed (memalign = aligned_alloc in glibc): a
        // second probe on the same address would run the programs twice per call.
        if probed.contains(&offset) {
            functions.push(function);
            continue;
        }
        let at = || UProbeAttachLocation::AbsoluteOffset(offset);
        uprobe(ebpf, entry)?.attach(at(), &target, scope).map_err(|e| attach_error(pid, function, e))?;
        if function != "free" {
            uprobe(ebpf, EXIT_PROGRAM)?.attach(at(), &target, scope).map_err(|e| attach_error(pid, function, e))?;
        }
        probed.push(offset);
        functions.push(function);
    }
    if !functions.contains(&"malloc") || !functions.contains(&"free") {
        return Err(Error::NoAllocator(pid));
    }
    Ok(HeapAttachment { pid, library, functions })
}

/// An attach failure; permission errors get the capability that fixes them (since Linux
/// 6.16, and in stable backports, uprobes through perf need CAP_SYS_ADMIN again).
fn attach_error(pid: u32, function: &'static str, source: ProgramError) -> Error {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&source);
    let mut denied = false;
    while let Some(err) = cause {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            denied |= matches!(io.raw_os_error(), Some(libc::EACCES | libc::EPERM));
        }
        cause = err.source();
    }
    if denied {
        return Error::Privileges {
            missing: format!("CAP_SYS_ADMIN (needed to put uprobes on {function} in pid {pid})"),
        };
    }
    Error::Program { action: "attach (uprobe)", program: "heap probes", source }
}

/// The C library a process maps: glibc's `libc.so.6` or musl's `libc.musl-*`/`ld-musl-*`.
fn find_libc(maps: &[procs::MapEntry]) -> Option<String> {
    maps.iter()
        .filter(|m| m.is_file())
        .map(|m| m.path.as_str())
        .find(|path| {
            let name = path.rsplit('/').next().unwrap_or(path);
            name.starts_with("libc.so")
                || name.starts_with("libc-2.")
                || name.starts_with("libc.musl")
                || name.starts_with("ld-musl")
        })
        .map(str::to_string)
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut UProbe> {
    ebpf.program_mut(name).ok_or_else(|| missing(name))?.try_into().map_err(program_error("find", name))
}

/// Fills the interval table with the exponential distribution's quantiles at the midpoints
/// of 1024 equal-probability strata: the kernel picks one at random per sample, which makes
/// the gaps between samples exponential with mean `sample_bytes` without floating point in
/// BPF.
pub(super) fn fill_intervals(ebpf: &mut Ebpf, sample_bytes: u64) -> Result<()> {
    let mut table: Array<&mut MapData, u64> = map_mut(ebpf, maps::HEAP_INTERVALS)?;
    for (i, interval) in exponential_quantiles(sample_bytes).into_iter().enumerate() {
        table.set(i as u32, interval, 0).map_err(map_error("write", maps::HEAP_INTERVALS))?;
    }
    Ok(())
}

fn exponential_quantiles(mean: u64) -> Vec<u64> {
    let n = f64::from(HEAP_INTERVALS_LEN);
    (0..HEAP_INTERVALS_LEN)
        .map(|i| {
            let p = (f64::from(i) + 0.5) / n;
            ((-(1.0 - p).ln()) * mean as f64).round().max(1.0) as u64
        })
        .collect()
}

pub(super) fn live_blocks(ebpf: &Ebpf) -> Result<Vec<LiveBlock>> {
    let live: HashMap<&MapData, LiveKey, LiveAlloc> = map_ref(ebpf, maps::HEAP_LIVE)?;
    let mut blocks = Vec::new();
    for entry in live.iter() {
        // Entries freed during the iteration vanish from under it: skip them.
        let Ok((key, value)) = entry else { continue };
        blocks.push(LiveBlock { tgid: key.tgid, size: value.size, stack: value.stack });
    }
    Ok(blocks)
}

/// Deletes the live blocks and in-flight calls of processes that are gone, so they do not
/// fill the maps of a long-running session. Returns the number of entries removed.
pub(super) fn forget_processes(ebpf: &mut Ebpf, tgids: &[u32]) -> Result<usize> {
    if tgids.is_empty() {
        return Ok(0);
    }
    let mut removed = 0;
    let mut live: HashMap<&mut MapData, LiveKey, LiveAlloc> = map_mut(ebpf, maps::HEAP_LIVE)?;
    let dead: Vec<LiveKey> = live.keys().filter_map(|k| k.ok()).filter(|k| tgids.contains(&k.tgid)).collect();
    for key in &dead {
        removed += usize::from(live.remove(key).is_ok());
    }
    let mut pending: HashMap<&mut MapData, u64, profiler_common::PendingAlloc> = map_mut(ebpf, maps::HEAP_PENDING)?;
    let dead: Vec<u64> =
        pending.keys().filter_map(|k| k.ok()).filter(|k| tgids.contains(&((k >> 32) as u32))).collect();
    for key in &dead {
        removed += usize::from(pending.remove(key).is_ok());
    }
    Ok(removed)
}

pub(super) fn counters(ebpf: &Ebpf) -> Result<HeapCounters> {
    let array: PerCpuArray<&MapData, u64> = map_ref(ebpf, maps::HEAP_COUNTERS)?;
    let get = |c: HeapCounter| sum_counter(&array, c as u32, maps::HEAP_COUNTERS);
    Ok(HeapCounters {
        sampled: get(HeapCounter::Sampled)?,
        live_map_full: get(HeapCounter::LiveMapFull)?,
        totals_map_full: get(HeapCounter::TotalsMapFull)?,
        stack_lost: get(HeapCounter::StackLost)?,
        pending_map_full: get(HeapCounter::PendingMapFull)?,
        freed: get(HeapCounter::Freed)?,
        out_ptr_unreadable: get(HeapCounter::OutPtrUnreadable)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_have_the_requested_mean() {
        let q = exponential_quantiles(524_288);
        let mean = q.iter().sum::<u64>() as f64 / q.len() as f64;
        assert!((mean / 524_288.0 - 1.0).abs() < 0.01, "mean {mean}");
        assert!(q.windows(2).all(|w| w[0] <= w[1]));
        assert!(exponential_quantiles(1).iter().all(|&v| v >= 1));
    }

    #[test]
    fn finds_glibc_and_musl() {
        let entry = |path: &str| procs::MapEntry { start: 0, end: 1, offset: 0, path: path.into(), inode: 1 };
        let glibc = [entry("/usr/bin/app"), entry("/usr/lib/x86_64-linux-gnu/libc.so.6")];
        assert_eq!(find_libc(&glibc).as_deref(), Some("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert_eq!(find_libc(&[entry("/lib/ld-musl-x86_64.so.1")]).as_deref(), Some("/lib/ld-musl-x86_64.so.1"));
        assert_eq!(find_libc(&[entry("/usr/lib/libcrypto.so.3")]), None);
    }
}
