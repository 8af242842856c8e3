//! Go's heap profile: sampled allocations and live blocks by allocating stack and block size,
//! Go's buckets (`alloc_objects`, `alloc_space`, `inuse_objects`, `inuse_space`), each bucket
//! scaled from the byte-sampled counts to unbiased estimates by its own size as Go scales
//! them; period = the mean sampling interval. Also where a process is probed: its C
//! library's allocator functions.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use super::{unwind_comment, Context, Counts, Settings};
use crate::{
    catalog::Sighting,
    ebpf::{Batch, Counters, HeapAttachment, HeapTarget, LiveBlock, RawHeapTotals, HEAP_FUNCTIONS},
    ids::{Pid, StackId},
    pprof::Shape,
    procs::{self, MapEntry},
    resolve::{LabelValue, StackSample},
    symbolize,
};

/// Taken on return from the allocator: the leaf is the return address into the allocating
/// function.
const USER_LEAF_IS_RETURN: bool = true;

/// Go's heap bucket: an allocating stack and the exact size of the blocks counted under it.
/// The scale of a sampled block depends on its size, so one stack allocating 16 B and 1 MiB
/// blocks has two buckets, each scaled exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeapSite {
    pub stack: StackId,
    /// Requested size in bytes.
    pub size: u64,
}

/// Sampled (unscaled) heap blocks of one bucket: how many and how many bytes.
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

/// One process's heap in a window.
#[derive(Clone, Debug, Default)]
pub struct HeapCounts {
    /// Sampled allocations by (allocating stack, size).
    pub allocated: HashMap<HeapSite, HeapCount>,
    /// Sampled blocks live at the last read, by (allocating stack, size): each block is
    /// scaled by its own exact size.
    pub live: HashMap<HeapSite, HeapCount>,
}

impl HeapCounts {
    fn add(&mut self, totals: &RawHeapTotals) {
        let site = HeapSite { stack: totals.stack, size: totals.size };
        self.allocated.entry(site).or_default().add(totals.count, totals.bytes);
    }

    /// Sampled allocations in the window.
    pub fn samples(&self) -> u64 {
        self.allocated.values().map(|h| h.count).sum()
    }
}

pub(super) fn count(batch: &Batch, counts: &mut Counts) {
    for totals in &batch.heap {
        counts.process_mut(totals.pid).heap.add(totals);
    }
}

/// Replaces the live heap of the processes in `pids` with their blocks in `blocks` (a full
/// read of the live map).
pub(super) fn set_live(counts: &mut Counts, pids: &[Pid], blocks: &[LiveBlock]) {
    for &pid in pids {
        counts.process_mut(pid).heap.live.clear();
    }
    for block in blocks.iter().filter(|b| pids.contains(&b.pid)) {
        let site = HeapSite { stack: block.stack, size: block.size };
        counts.process_mut(block.pid).heap.live.entry(site).or_default().add(1, block.size);
    }
}

pub(super) fn sightings<'a>(batch: &'a Batch, out: &mut Vec<Sighting<'a>>) {
    out.extend(batch.heap.iter().map(|h| Sighting {
        pid: h.pid,
        user_stack: h.stack,
        kernel_stack: StackId::NONE,
        user_leaf_is_return: USER_LEAF_IS_RETURN,
        main_thread_name: None,
    }));
}

pub(super) fn stacks(counts: &HeapCounts, out: &mut HashSet<StackId>) {
    out.extend(counts.allocated.keys().chain(counts.live.keys()).map(|site| site.stack));
}

pub(super) fn shape(settings: &Settings) -> Shape {
    Shape {
        sample_types: &[
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ],
        period_type: ("space", "bytes"),
        period: settings.heap_sample_bytes as i64,
        default_sample_type: "inuse_space",
    }
}

/// One sample per bucket, as Go's `writeHeapProto` emits them: alloc and inuse of one
/// (stack, size), each scaled by that size, and the size as the `bytes` label.
pub(super) fn samples(counts: &HeapCounts, settings: &Settings) -> Vec<StackSample> {
    let rate = settings.heap_sample_bytes;
    let mut sites: Vec<HeapSite> = counts.allocated.keys().chain(counts.live.keys()).copied().collect();
    sites.sort_unstable();
    sites.dedup();
    sites
        .into_iter()
        .map(|site| {
            let alloc = counts.allocated.get(&site).copied().unwrap_or_default();
            let live = counts.live.get(&site).copied().unwrap_or_default();
            let (alloc_objects, alloc_space) = scale_heap(alloc, rate);
            let (inuse_objects, inuse_space) = scale_heap(live, rate);
            StackSample {
                user_stack: site.stack,
                kernel_stack: StackId::NONE,
                user_leaf_is_return: USER_LEAF_IS_RETURN,
                values: vec![alloc_objects, alloc_space, inuse_objects, inuse_space],
                unscaled: vec![alloc.count as i64, alloc.bytes as i64, live.count as i64, live.bytes as i64],
                labels: vec![("bytes", LabelValue::Num(site.size as i64, Some("bytes")))],
            }
        })
        .collect()
}

/// Go's `scaleHeapSample` for one bucket of `sampled.count` blocks of one size `s`
/// (`bytes / count`): each is sampled with probability `1 − e^(−s/rate)`, so each sampled
/// block stands for `1 / (1 − e^(−s/rate))` blocks. Exact only when every block of the
/// bucket has the same size, which is why buckets are (stack, size) and never a stack alone.
/// With a rate of 1 byte every allocation was recorded and nothing is scaled. The products
/// are truncated, as Go's runtime and pprof's text reader both do, so a `debug=1` text
/// (sampled counts) reads back to exactly the values of the protobuf profile.
pub fn scale_heap(sampled: HeapCount, rate: u64) -> (i64, i64) {
    if sampled.count == 0 || sampled.bytes == 0 || rate <= 1 {
        return (sampled.count as i64, sampled.bytes as i64);
    }
    let avg = sampled.bytes as f64 / sampled.count as f64;
    let scale = 1.0 / (1.0 - (-avg / rate as f64).exp());
    ((sampled.count as f64 * scale) as i64, (sampled.bytes as f64 * scale) as i64)
}

/// What inuse and alloc mean here, the sampling rate, and what was dropped (counts over
/// every probed process since the probes were loaded).
pub(super) fn comments(context: Context, counters: &Counters, settings: &Settings) -> Vec<String> {
    let h = counters.heap;
    let inuse_at = match context {
        Context::Snapshot => "at the end of the capture",
        Context::Interval => "at the end of the interval",
        Context::Query => "when this profile was taken",
    };
    vec![
        format!(
            "profiler {} heap profile: inuse = sampled blocks allocated since the probes attached \
             and not freed {inuse_at}; alloc = allocated since the probes attached (in the window)",
            env!("CARGO_PKG_VERSION")
        ),
        format!(
            "sampling: one sample per {} bytes on average (Poisson), values scaled to estimates as Go does",
            settings.heap_sample_bytes
        ),
        format!(
            "dropped (all probed processes): live map full {} (missing from inuse), totals map full {}, \
             stack lost {}, in-flight map full {}, posix_memalign result unreadable {}, \
             live map reads cut short {} (inuse incomplete)",
            h.live_map_full,
            h.totals_map_full,
            h.stack_lost,
            h.pending_map_full,
            h.out_ptr_unreadable,
            h.live_reads_cut
        ),
        unwind_comment(counters),
    ]
}

/// The profile comment line naming what was probed in the process.
pub fn attachment_comment(attachment: &HeapAttachment) -> String {
    format!("probed {} in {}", attachment.functions.join(", "), attachment.library)
}

/// Why a process cannot be heap-profiled.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("failed to read /proc/{pid}/maps to find its C library")]
    Maps {
        pid: Pid,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "pid {0} maps no C library exporting malloc and free (statically linked, or a custom allocator?); \
         heap profiling probes the C library's allocator"
    )]
    NoAllocator(Pid),
    #[error("failed to open pid {pid}'s C library {library} through its mapping: it {source}")]
    Unopened {
        pid: Pid,
        library: String,
        #[source]
        source: crate::opened::NotOpened,
    },
}

/// Where to probe process `pid`: the C library it maps, opened through its root (so a
/// process in a container gets its own libc), and the allocator functions it exports.
pub fn target(pid: Pid) -> Result<HeapTarget, TargetError> {
    let maps = procs::read_maps(pid.0).map_err(|source| TargetError::Maps { pid, source })?;
    let library = find_libc(&maps).ok_or(TargetError::NoAllocator(pid))?;
    let path = PathBuf::from(format!("/proc/{pid}/root{library}"));
    // Its symbols are read from the mapping itself, opened once and checked (a FIFO or a
    // symlink the process put at its library's path is never opened here).
    let entry = maps.iter().find(|m| *m.path == *library).ok_or(TargetError::NoAllocator(pid))?;
    let opened = crate::opened::open_mapping(pid, entry).map_err(|source| TargetError::Unopened {
        pid,
        library: library.clone(),
        source,
    })?;
    let found = symbolize::symbol_offsets(&opened.fd_path(), &HEAP_FUNCTIONS);
    let mut offsets = [None; HEAP_FUNCTIONS.len()];
    for (slot, offset) in offsets.iter_mut().zip(found) {
        *slot = offset;
    }
    let exports = |name: &str| HEAP_FUNCTIONS.iter().position(|&f| f == name).is_some_and(|i| offsets[i].is_some());
    if !exports("malloc") || !exports("free") {
        return Err(TargetError::NoAllocator(pid));
    }
    let free = HEAP_FUNCTIONS.iter().position(|&f| f == "free").expect("free is probed");
    offsets[free] = offsets[free].map(|offset| past_null_test(opened.file(), offset));
    Ok(HeapTarget { pid, library, path, offsets })
}

/// Where to probe `free`, whose entry is at file `offset` of `library`. glibc's begins
/// `test rdi, rdi; je …` (free(NULL) returns at once). x86 uprobes emulate a `je` (and a
/// `push`, how the other allocator functions begin) but cannot emulate a `test`: they
/// single-step it from a copy, a second trap per call, which was three quarters of the CPU
/// an allocating loop spent in the probes. So the probe goes on the `je`, 3 bytes in: the
/// registers are the same there (a `test` writes only flags), every call passes it, and
/// nothing else jumps to it. Any other first instruction keeps the probe at the entry.
fn past_null_test(library: &std::fs::File, offset: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    const TEST_RDI_RDI: [u8; 3] = [0x48, 0x85, 0xff];
    let mut code = [0u8; 5];
    if library.read_exact_at(&mut code, offset).is_err() {
        return offset;
    }
    // `je rel8` (74) or `je rel32` (0f 84).
    let je = code[3] == 0x74 || code[3..5] == [0x0f, 0x84];
    if code[..3] == TEST_RDI_RDI && je {
        offset + TEST_RDI_RDI.len() as u64
    } else {
        offset
    }
}

/// The C library a process maps: glibc's `libc.so.6` or musl's `libc.musl-*`/`ld-musl-*`.
fn find_libc(maps: &[MapEntry]) -> Option<String> {
    maps.iter()
        .filter(|m| m.is_file())
        .map(|m| &*m.path)
        .find(|path| {
            let name = path.rsplit('/').next().unwrap_or(path);
            name.starts_with("libc.so")
                || name.starts_with("libc-2.")
                || name.starts_with("libc.musl")
                || name.starts_with("ld-musl")
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PID: Pid = Pid(0x7fff_fff0);

    #[test]
    fn scaling_matches_go() {
        // Every allocation recorded: unscaled.
        assert_eq!(scale_heap(HeapCount { count: 3, bytes: 300 }, 1), (3, 300));
        // Blocks much larger than the rate are always sampled: scale ~1.
        assert_eq!(scale_heap(HeapCount { count: 2, bytes: 2 << 30 }, 512 << 10), (2, 2 << 30));
        // 1 sampled 512 KiB block at rate 512 KiB: scale 1/(1-1/e) = 1.582, truncated as Go does.
        let (objects, bytes) = scale_heap(HeapCount { count: 1, bytes: 512 << 10 }, 512 << 10);
        assert_eq!(objects, 1);
        assert!((bytes as f64 / (512 << 10) as f64 - 1.582).abs() < 0.001);
        assert_eq!(scale_heap(HeapCount::default(), 512 << 10), (0, 0));
    }

    /// splitmix64: a fixed-seed generator, so the simulated sampling below is the same on
    /// every run.
    struct SplitMix(u64);

    impl SplitMix {
        fn uniform(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as f64 / u64::MAX as f64
        }
    }

    /// One stack allocating 2,000,000 × 16 B (500,000 kept) and 200 × 1 MiB (50 kept),
    /// sampled as the kernel samples at 512 KiB (a block of s bytes is taken with p =
    /// 1 − e^(−s/rate), independently: the Poisson process over bytes), then counted and
    /// scaled as the daemon does. Each bucket's four values must be within 3.5σ of the truth:
    /// N blocks of one size estimated as K/p with K ~ Binomial(N, p) have σ = √(N(1−p)/p)
    /// objects, × s bytes (16 B: p ≈ 3.05e-5, σ ≈ 12.8% of 2,000,000; 1 MiB: p = 0.865, σ ≈
    /// 2.8% of 200). Scaled by the stack's average size instead, the 16 B count comes out
    /// ~99% low: asserted too, so the data tells the two apart.
    #[test]
    fn mixed_sizes_from_one_stack_are_scaled_per_size() {
        const RATE: u64 = 512 << 10;
        let stack = StackId(9);
        // (size, allocated, kept live)
        let truth = [(16u64, 2_000_000u64, 500_000u64), (1 << 20, 200, 50)];
        let mut rng = SplitMix(44);
        let (mut counts, mut blocks) = (Counts::default(), Vec::new());
        for (size, allocated, kept) in truth {
            let p = 1.0 - (-(size as f64) / RATE as f64).exp();
            let mut taken = 0;
            for i in 0..allocated {
                if rng.uniform() < p {
                    taken += 1;
                    if i < kept {
                        blocks.push(LiveBlock { pid: PID, size, stack });
                    }
                }
            }
            let totals = RawHeapTotals { pid: PID, stack, size, count: taken, bytes: taken * size };
            count(&Batch { heap: vec![totals], ..Default::default() }, &mut counts);
        }
        set_live(&mut counts, &[PID], &blocks);
        let heap = &counts.process(PID).unwrap().heap;
        let settings = Settings { heap_sample_bytes: RATE, ..test_settings() };
        let samples = samples(heap, &settings);
        assert_eq!(samples.len(), 2, "one sample per (stack, size) bucket");
        for (size, allocated, kept) in truth {
            let p = 1.0 - (-(size as f64) / RATE as f64).exp();
            let sample = samples
                .iter()
                .find(|s| s.labels[0] == ("bytes", LabelValue::Num(size as i64, Some("bytes"))))
                .unwrap_or_else(|| panic!("no sample labelled bytes={size}"));
            let sigma = |n: u64| (n as f64 * (1.0 - p) / p).sqrt();
            let expected = [
                (allocated, sigma(allocated)),
                (allocated * size, sigma(allocated) * size as f64),
                (kept, sigma(kept)),
                (kept * size, sigma(kept) * size as f64),
            ];
            for (i, (value, (truth, sigma))) in sample.values.iter().zip(expected).enumerate() {
                let off = (*value as f64 - truth as f64).abs();
                assert!(off <= 3.5 * sigma, "size {size} value {i}: {value}, truth {truth}, σ {sigma:.0}");
            }
        }
        // The same counts as one per-stack bucket scaled by the average size: biased.
        let merged = heap.allocated.values().fold(HeapCount::default(), |mut all, h| {
            all.add(h.count, h.bytes);
            all
        });
        let (objects, _) = scale_heap(merged, RATE);
        assert!(objects < 20_000, "the average-size scale gives {objects} objects of 2,000,200");
    }

    #[test]
    fn totals_accumulate_and_live_is_replaced() {
        let mut counts = Counts::default();
        for _ in 0..2 {
            let batch = Batch {
                heap: vec![RawHeapTotals { pid: PID, stack: StackId(7), size: 32, count: 2, bytes: 64 }],
                ..Default::default()
            };
            count(&batch, &mut counts);
        }
        let block = |size| LiveBlock { pid: PID, size, stack: StackId(7) };
        set_live(&mut counts, &[PID], &[block(32), block(8), LiveBlock { pid: Pid(1), size: 1, stack: StackId(7) }]);
        set_live(&mut counts, &[PID], &[block(32)]);
        let heap = &counts.process(PID).unwrap().heap;
        let site = HeapSite { stack: StackId(7), size: 32 };
        assert_eq!(heap.allocated[&site], HeapCount { count: 4, bytes: 128 });
        assert_eq!(heap.live[&site], HeapCount { count: 1, bytes: 32 });
        assert_eq!(heap.live.len(), 1, "the 8 B block is gone: {:?}", heap.live);
        assert!(counts.process(Pid(1)).is_none(), "only the listed pids");
    }

    #[test]
    fn samples_have_gos_values_and_the_return_leaf() {
        let mut heap = HeapCounts::default();
        heap.allocated.insert(HeapSite { stack: StackId(14), size: 8 }, HeapCount { count: 1, bytes: 8 });
        let samples = samples(&heap, &test_settings());
        assert_eq!(samples[0].values, [1, 8, 0, 0]);
        assert!(samples[0].user_leaf_is_return);
        assert_eq!(samples[0].labels[0], ("bytes", LabelValue::Num(8, Some("bytes"))));
    }

    fn test_settings() -> Settings {
        Settings {
            frequency_hz: 1,
            heap_sample_bytes: 1,
            offcpu_rate_ns: 1,
            offcpu_sample_every: 1,
            block_rate_ns: 1,
            mutex_fraction: 1,
        }
    }

    #[test]
    fn finds_glibc_and_musl() {
        let entry = |path: &str| MapEntry {
            start: 0,
            end: 1,
            offset: 0,
            path: path.into(),
            inode: 1,
            device: Default::default(),
            generation: 0,
            unmapped: false,
        };
        let glibc = [entry("/usr/bin/app"), entry("/usr/lib/x86_64-linux-gnu/libc.so.6")];
        assert_eq!(find_libc(&glibc).as_deref(), Some("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert_eq!(find_libc(&[entry("/lib/ld-musl-x86_64.so.1")]).as_deref(), Some("/lib/ld-musl-x86_64.so.1"));
        assert_eq!(find_libc(&[entry("/usr/lib/libcrypto.so.3")]), None);
    }

    #[test]
    fn a_process_without_a_c_library_is_refused_with_the_reason() {
        let err = target(Pid(std::process::id())).map(|t| t.library);
        assert!(err.as_deref().is_ok_and(|l| l.contains("libc")), "the test binary maps glibc: {err:?}");
        assert!(matches!(target(PID), Err(TargetError::Maps { .. })));
    }

    #[test]
    fn free_is_probed_past_its_null_test_only_where_that_is_what_it_starts_with() {
        use std::io::Write;
        let code = |bytes: &[u8]| {
            let mut file = tempfile_in_tmp();
            file.write_all(&[0x90; 16]).unwrap();
            file.write_all(bytes).unwrap();
            file
        };
        // glibc 2.36's free: test rdi,rdi; je rel32.
        assert_eq!(past_null_test(&code(&[0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0, 0]), 16), 19);
        assert_eq!(past_null_test(&code(&[0x48, 0x85, 0xff, 0x74, 0x10]), 16), 19, "je rel8");
        assert_eq!(past_null_test(&code(&[0x48, 0x85, 0xff, 0x75, 0x10]), 16), 16, "jne: not free(NULL)'s return");
        assert_eq!(past_null_test(&code(&[0xf3, 0x0f, 0x1e, 0xfa, 0x48]), 16), 16, "endbr64 first");
        assert_eq!(past_null_test(&code(&[0x48, 0x85]), 16), 16, "past the end of the file");
    }

    /// An unnamed file that disappears when closed.
    fn tempfile_in_tmp() -> std::fs::File {
        let path =
            std::env::temp_dir().join(format!("heap-code-{}-{:?}", std::process::id(), std::thread::current().id()));
        let file = std::fs::OpenOptions::new().create_new(true).read(true).write(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }

    /// This machine's C library, where it has one: its `free` gets the probe past the test.
    #[test]
    fn this_machines_glibc_free_begins_with_its_null_test() {
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let Ok(file) = std::fs::File::open(libc) else {
            eprintln!("skipped: no {libc}");
            return;
        };
        let offset = symbolize::symbol_offsets(std::path::Path::new(libc), &["free"])[0].expect("libc exports free");
        assert_eq!(past_null_test(&file, offset), offset + 3, "Debian's glibc free starts test rdi,rdi; je");
    }
}
