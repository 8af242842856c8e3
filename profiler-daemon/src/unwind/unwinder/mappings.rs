//! A process's mappings as the kernel walker's list holds them: which are kept when there
//! are more than it holds, and the bias that maps an address to its file's virtual address.

use crate::{elf::LoadSegment, procs::MapEntry, runtimes};

/// File names every process's stacks run through (the C library, the dynamic loader, the
/// vDSO, the C++ and unwinding runtimes; and an interpreter's library,
/// [`runtimes::is_library`]): kept first when a process maps more files than the walker's
/// list holds.
const RUNTIME_FILES: [&str; 7] =
    ["libc.so", "ld-linux", "[vdso]", "libpthread.so", "libstdc++.so", "libgcc_s.so", "libm.so"];

/// Which of `maps` (sorted by address) the walker's list of `cap` holds: all when they fit,
/// else the runtime's files ([`RUNTIME_FILES`]) and then the lowest addresses (the
/// executable's, below the libraries'), in address order. A process with hundreds of
/// libraries (a plugin host) loses the last ones it loaded, not the C library every stack
/// runs through.
pub(super) fn kept_mappings<'a>(maps: &[&'a MapEntry], cap: usize) -> Vec<&'a MapEntry> {
    if maps.len() <= cap {
        return maps.to_vec();
    }
    let is_runtime = |m: &MapEntry| {
        let name = m.path.rsplit('/').next().unwrap_or("");
        RUNTIME_FILES.iter().any(|runtime| name.starts_with(runtime)) || runtimes::is_library(name)
    };
    let mut chosen: Vec<usize> = (0..maps.len()).filter(|&i| is_runtime(maps[i])).take(cap).collect();
    let rest: Vec<usize> = (0..maps.len()).filter(|&i| !is_runtime(maps[i])).take(cap - chosen.len()).collect();
    chosen.extend(rest);
    chosen.sort_unstable();
    chosen.into_iter().map(|i| maps[i]).collect()
}

/// The bias of an executable mapping: address − bias is the file's virtual address.
pub(super) fn bias(entry: &MapEntry, segments: &[LoadSegment]) -> Option<u64> {
    const PAGE: u64 = 4096;
    // lld packs segments into shared pages, so the page an executable mapping starts at may
    // also hold the end of the read-only segment before it: prefer the executable segment.
    let covers = |s: &&LoadSegment| {
        let first = s.file_offset & !(PAGE - 1);
        (first..s.file_offset + s.file_size.max(1)).contains(&entry.offset)
    };
    let segment = segments.iter().filter(|s| s.executable).find(covers).or_else(|| segments.iter().find(covers))?;
    let vaddr = entry.offset.wrapping_sub(segment.file_offset).wrapping_add(segment.vaddr);
    Some(entry.start.wrapping_sub(vaddr))
}
