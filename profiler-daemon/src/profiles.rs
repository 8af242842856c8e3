//! What each profile type is: which stacks and values it takes from a process's aggregated
//! data, and its pprof shape (sample types, period), following Go's runtime/pprof.

use std::collections::{HashMap, HashSet};

use crate::{
    aggregate::{HeapCount, ProcessCounts, WaitCount, WaitSite},
    ebpf::{Batch, Counters},
    resolve::{LabelValue, StackSample},
};
use profiler_common::{WaitOp, WaitOutcome, NO_STACK};

/// The pprof header of a profile type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// `(type, unit)` per sample value.
    pub sample_types: &'static [(&'static str, &'static str)],
    pub period_type: (&'static str, &'static str),
    pub period: i64,
    pub default_sample_type: &'static str,
}

/// Go's CPU profile: `samples/count`, `cpu/nanoseconds`; period = 1e9 / frequency.
pub fn cpu(process: &ProcessCounts, frequency_hz: u32) -> (Shape, Vec<StackSample>) {
    let period = 1_000_000_000 / i64::from(frequency_hz.max(1));
    let shape = Shape {
        sample_types: &[("samples", "count"), ("cpu", "nanoseconds")],
        period_type: ("cpu", "nanoseconds"),
        period,
        default_sample_type: "cpu",
    };
    let samples = process
        .cpu
        .iter()
        .map(|(key, &count)| StackSample {
            user_stack: key.user_stack,
            kernel_stack: key.kernel_stack,
            user_leaf_is_return: false,
            values: vec![count as i64, count as i64 * period],
            labels: vec![
                ("tid", LabelValue::Num(i64::from(key.tid), None)),
                ("thread", LabelValue::Str(process.threads.get(&key.tid).cloned().unwrap_or_default())),
            ],
        })
        .collect();
    (shape, samples)
}

/// Go's heap profile: allocated and live objects and bytes per allocating stack, scaled from
/// the byte-sampled counts to unbiased estimates; period = the mean sampling interval.
pub fn heap(process: &ProcessCounts, sample_bytes: u64) -> (Shape, Vec<StackSample>) {
    let shape = Shape {
        sample_types: &[
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ],
        period_type: ("space", "bytes"),
        period: sample_bytes as i64,
        default_sample_type: "inuse_space",
    };
    let mut stacks: Vec<u64> = process.heap_allocated.keys().chain(process.heap_live.keys()).copied().collect();
    stacks.sort_unstable();
    stacks.dedup();
    let samples = stacks
        .into_iter()
        .map(|stack| {
            let alloc = process.heap_allocated.get(&stack).copied().unwrap_or_default();
            let live = process.heap_live.get(&stack).copied().unwrap_or_default();
            let (alloc_objects, alloc_space) = scale_heap(alloc, sample_bytes);
            let (inuse_objects, inuse_space) = scale_heap(live, sample_bytes);
            let sizes = if alloc.count > 0 { alloc } else { live };
            StackSample {
                user_stack: stack,
                kernel_stack: NO_STACK,
                // Taken on return from the allocator: the leaf is the return address into
                // the allocating function.
                user_leaf_is_return: stack != NO_STACK,
                values: vec![alloc_objects, alloc_space, inuse_objects, inuse_space],
                labels: vec![("bytes", LabelValue::Num((sizes.bytes / sizes.count.max(1)) as i64, Some("bytes")))],
            }
        })
        .collect();
    (shape, samples)
}

/// The stacks of a drained batch's samples, by process, as the profile types above resolve
/// them (with no values): what the collector symbolizes ahead of the dump. `only` limits them
/// to samples with a stack in it (stacks new to the aggregate).
pub fn batch_stacks(batch: &Batch, only: &HashSet<u64>) -> Vec<(u32, StackSample)> {
    let sample = |user_stack, kernel_stack, user_leaf_is_return| StackSample {
        user_stack,
        kernel_stack,
        user_leaf_is_return,
        values: Vec::new(),
        labels: Vec::new(),
    };
    // Heap, futex and thread stacks are taken on return from a call (see those profiles).
    let returned = |tgid: u32, stack: u64| (tgid, sample(stack, NO_STACK, stack != NO_STACK));
    let cpu = batch.cpu.iter().map(|s| (s.tgid, sample(s.user_stack, s.kernel_stack, false)));
    let heap = batch.heap.iter().map(|h| returned(h.tgid, h.stack));
    let waits = batch.block.iter().chain(&batch.mutex).map(|w| returned(w.tgid, w.stack));
    let threads = batch.threads.iter().map(|t| returned(t.tgid, t.stack));
    cpu.chain(heap)
        .chain(waits)
        .chain(threads)
        .filter(|(_, s)| only.contains(&s.user_stack) || only.contains(&s.kernel_stack))
        .collect()
}

/// The shape of Go's block and mutex profiles.
const CONTENTION_SHAPE: Shape = Shape {
    sample_types: &[("contentions", "count"), ("delay", "nanoseconds")],
    period_type: ("contentions", "count"),
    period: 1,
    default_sample_type: "delay",
};

/// Go's block profile: completed futex waits and their total delay, by waiting stack, with
/// the futex operation and how the wait ended as labels (`futex_op`, `outcome`).
pub fn block(process: &ProcessCounts) -> (Shape, Vec<StackSample>) {
    (CONTENTION_SHAPE, wait_samples(&process.block))
}

/// Go's mutex profile: woken futex waits and their delay, by the stack that woke them (the
/// unlocker, signaller or poster), labelled like the block profile.
pub fn mutex(process: &ProcessCounts) -> (Shape, Vec<StackSample>) {
    (CONTENTION_SHAPE, wait_samples(&process.mutex))
}

fn wait_samples(waits: &HashMap<WaitSite, WaitCount>) -> Vec<StackSample> {
    let mut sites: Vec<(&WaitSite, &WaitCount)> = waits.iter().collect();
    sites.sort_unstable_by_key(|(site, _)| **site);
    sites
        .into_iter()
        .map(|(site, wait)| {
            let op = WaitOp::from_u16(site.op).map_or("unknown", WaitOp::name);
            let outcome = WaitOutcome::from_u16(site.outcome).map_or("unknown", WaitOutcome::name);
            StackSample {
                user_stack: site.stack,
                kernel_stack: NO_STACK,
                // Taken in the syscall: the leaf is the return point of the syscall instruction.
                user_leaf_is_return: site.stack != NO_STACK,
                values: vec![wait.count as i64, wait.delay_ns.min(i64::MAX as u64) as i64],
                labels: vec![("futex_op", LabelValue::Str(op.into())), ("outcome", LabelValue::Str(outcome.into()))],
            }
        })
        .collect()
}

/// Go's threadcreate profile: threads created (clones with `CLONE_THREAD`), by creating stack.
pub fn threadcreate(process: &ProcessCounts) -> (Shape, Vec<StackSample>) {
    let shape = Shape {
        sample_types: &[("threadcreate", "count")],
        period_type: ("threadcreate", "count"),
        period: 1,
        default_sample_type: "threadcreate",
    };
    let mut stacks: Vec<(u64, u64)> = process.threads_created.iter().map(|(&s, &n)| (s, n)).collect();
    stacks.sort_unstable();
    let samples = stacks
        .into_iter()
        .map(|(stack, count)| StackSample {
            user_stack: stack,
            kernel_stack: NO_STACK,
            user_leaf_is_return: stack != NO_STACK,
            values: vec![count as i64],
            labels: Vec::new(),
        })
        .collect();
    (shape, samples)
}

/// Go's `scaleHeapSample`: a block of average size `s` is sampled with probability
/// `1 − e^(−s/rate)`, so each sampled block stands for `1 / (1 − e^(−s/rate))` blocks.
/// With a rate of 1 byte every allocation was recorded and nothing is scaled.
pub fn scale_heap(sampled: HeapCount, rate: u64) -> (i64, i64) {
    if sampled.count == 0 || sampled.bytes == 0 || rate <= 1 {
        return (sampled.count as i64, sampled.bytes as i64);
    }
    let avg = sampled.bytes as f64 / sampled.count as f64;
    let scale = 1.0 / (1.0 - (-avg / rate as f64).exp());
    ((sampled.count as f64 * scale).round() as i64, (sampled.bytes as f64 * scale).round() as i64)
}

/// The CPU profile's comment lines: what it is and what was dropped (machine-wide counts
/// since the programs were loaded).
pub fn cpu_comments(what: &str, counters: &Counters) -> Vec<String> {
    let c = counters.cpu;
    vec![
        format!("profiler {} cpu profile (on-CPU samples of the CPU clock); {what}", env!("CARGO_PKG_VERSION")),
        format!(
            "dropped samples (whole machine): counts map full {}; stacks without frames: stack not stored \
             (map full or kernel allocation failed) {}, user stack unreadable {}, kernel stack unreadable {}; \
             user stacks cut at {} frames {}",
            c.counts_map_full,
            c.stacks_map_full,
            c.user_stack_failed,
            c.kernel_stack_failed,
            profiler_common::MAX_STACK_DEPTH,
            c.user_stack_truncated
        ),
        unwind_comment(counters),
    ]
}

/// What the user-stack walker did (whole machine, since load): frames stepped with unwind
/// tables and with frame pointers, why frame pointers had to be used, and why walks stopped.
pub fn unwind_comment(counters: &Counters) -> String {
    use profiler_common::UnwindCounter as U;
    let u = counters.unwind;
    let unsupported: Vec<String> = crate::unwind::Unsupported::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| u.unsupported(*i) > 0)
        .map(|(i, r)| format!("{} {}", r.name(), u.unsupported(i)))
        .collect();
    format!(
        "user stack unwinding (whole machine): frames by unwind table {}, by frame pointer {} \
         (no table because: process not registered yet {}, address in no known mapping {}, \
         file has no table loaded {}, no CFI for the address {}); interrupted frames without CFI \
         stepped as leaves {}; signal frames {}; walks ended at \
         the outermost frame {}, at an unreadable stack word {}, at a bad frame {}, at unsupported CFI {}",
        u.get(U::CfiFrames),
        u.get(U::FramePointerFrames),
        u.get(U::NoProcess),
        u.get(U::NoMapping),
        u.get(U::NoTable),
        u.get(U::NoCfi),
        u.get(U::LeafGuesses),
        u.get(U::SignalFrames),
        u.get(U::EndOfStack),
        u.get(U::BadRead),
        u.get(U::BadFrame),
        if unsupported.is_empty() { "0".to_string() } else { unsupported.join(", ") },
    )
}

/// The heap profile's comment lines: what inuse and alloc mean here, the sampling rate, and
/// what was dropped (counts over every probed process since the probes were loaded).
pub fn heap_comments(inuse_at: &str, counters: &Counters, sample_bytes: u64) -> Vec<String> {
    let h = counters.heap;
    vec![
        format!(
            "profiler {} heap profile: inuse = sampled blocks allocated since the probes attached \
             and not freed {inuse_at}; alloc = allocated since the probes attached (in the window)",
            env!("CARGO_PKG_VERSION")
        ),
        format!(
            "sampling: one sample per {sample_bytes} bytes on average (Poisson), values scaled to estimates as Go does"
        ),
        format!(
            "dropped (all probed processes): live map full {} (missing from inuse), totals map full {}, \
             stack lost {}, in-flight map full {}, posix_memalign result unreadable {}",
            h.live_map_full, h.totals_map_full, h.stack_lost, h.pending_map_full, h.out_ptr_unreadable
        ),
        unwind_comment(counters),
    ]
}

/// The block profile's comment lines: what a sample is and what was dropped.
pub fn block_comments(what: &str, counters: &Counters) -> Vec<String> {
    let f = counters.futex;
    vec![
        format!(
            "profiler {} block profile: futex waits (FUTEX_WAIT, WAIT_BITSET, LOCK_PI, LOCK_PI2, WAIT_REQUEUE_PI, \
             futex2 futex_wait/futex_waitv) by waiting stack, delay = syscall exit - entry; labels: primitive \
             (the locking function on the stack), futex_op, outcome (timed out and interrupted waits count too); {what}",
            env!("CARGO_PKG_VERSION")
        ),
        futex_drops(&f),
        unwind_comment(counters),
    ]
}

/// The mutex profile's comment lines.
pub fn mutex_comments(what: &str, counters: &Counters) -> Vec<String> {
    let f = counters.futex;
    vec![
        format!(
            "profiler {} mutex profile: delay of woken futex waits charged to the stack of the thread whose wake, \
             unlock or requeue on the same futex word ended them (as Go charges the unlocker); condvar and other \
             non-lock waits appear too: filter with -tagfocus primitive=...; {what}",
            env!("CARGO_PKG_VERSION")
        ),
        format!("woken waits without a recorded waker (whole machine; not in this profile): {}", f.no_waker),
        futex_drops(&f),
        unwind_comment(counters),
    ]
}

/// The threadcreate profile's comment lines.
pub fn threadcreate_comments(what: &str, counters: &Counters) -> Vec<String> {
    let f = counters.futex;
    vec![
        format!(
            "profiler {} threadcreate profile: clones with CLONE_THREAD by creating stack (forks are not counted); {what}",
            env!("CARGO_PKG_VERSION")
        ),
        format!("dropped (whole machine): threadcreate map full {}; stacks lost {}", f.thread_map_full, f.stack_lost),
        unwind_comment(counters),
    ]
}

fn futex_drops(f: &crate::ebpf::FutexCounters) -> String {
    format!(
        "dropped waits (whole machine): in-flight map full {}, block map full {}, mutex map full {}, waker map \
             update failed {}; stacks lost (counted without frames) {}",
        f.pending_map_full, f.block_map_full, f.mutex_map_full, f.waker_map_full, f.stack_lost
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::{RawCpuSample, RawHeapTotals};

    #[test]
    fn batch_stacks_adjust_leaves_like_the_profiles_and_keep_only_new_stacks() {
        let cpu = |tgid, user_stack, kernel_stack| RawCpuSample {
            tgid,
            tid: tgid,
            comm: String::new(),
            user_stack,
            kernel_stack,
            count: 1,
        };
        let batch = Batch {
            cpu: vec![cpu(1, 10, NO_STACK), cpu(1, 11, 12), cpu(2, 13, NO_STACK)],
            heap: vec![RawHeapTotals { tgid: 3, stack: 14, count: 1, bytes: 8 }],
            ..Batch::default()
        };
        let only: HashSet<u64> = [10, 12, 14].into();
        let got: Vec<(u32, u64, u64, bool)> = batch_stacks(&batch, &only)
            .into_iter()
            .map(|(pid, s)| (pid, s.user_stack, s.kernel_stack, s.user_leaf_is_return))
            .collect();
        // As `cpu` and `heap` build them; pid 2's stack 13 is not new.
        assert_eq!(got, [(1, 10, NO_STACK, false), (1, 11, 12, false), (3, 14, NO_STACK, true)]);
        let (_, heap_samples) = heap(
            &ProcessCounts {
                heap_allocated: [(14, HeapCount { count: 1, bytes: 8 })].into(),
                ..ProcessCounts::default()
            },
            1,
        );
        assert_eq!(heap_samples[0].user_leaf_is_return, got[2].3);
    }

    #[test]
    fn scaling_matches_go() {
        // Every allocation recorded: unscaled.
        assert_eq!(scale_heap(HeapCount { count: 3, bytes: 300 }, 1), (3, 300));
        // Blocks much larger than the rate are always sampled: scale ~1.
        assert_eq!(scale_heap(HeapCount { count: 2, bytes: 2 << 30 }, 512 << 10), (2, 2 << 30));
        // 1 sampled 512 KiB block at rate 512 KiB: scale 1/(1-1/e) = 1.582.
        let (objects, bytes) = scale_heap(HeapCount { count: 1, bytes: 512 << 10 }, 512 << 10);
        assert_eq!(objects, 2);
        assert!((bytes as f64 / (512 << 10) as f64 - 1.582).abs() < 0.001);
        assert_eq!(scale_heap(HeapCount::default(), 512 << 10), (0, 0));
    }

    #[test]
    fn block_samples_carry_op_and_outcome() {
        let mut process = ProcessCounts::default();
        let site = WaitSite { op: WaitOp::WaitBitset as u16, outcome: WaitOutcome::TimedOut as u16, stack: 7 };
        process.block.insert(site, WaitCount { count: 2, delay_ns: 5_000 });
        let (shape, samples) = block(&process);
        assert_eq!(shape.sample_types, &[("contentions", "count"), ("delay", "nanoseconds")]);
        assert_eq!((shape.period_type, shape.period), (("contentions", "count"), 1));
        assert_eq!(samples[0].values, [2, 5_000]);
        assert_eq!(samples[0].labels[0], ("futex_op", LabelValue::Str("FUTEX_WAIT_BITSET".into())));
        assert_eq!(samples[0].labels[1], ("outcome", LabelValue::Str("timed_out".into())));
        process.threads_created.insert(9, 4);
        let (shape, samples) = threadcreate(&process);
        assert_eq!(shape.sample_types, &[("threadcreate", "count")]);
        assert_eq!(samples[0].values, [4]);
    }
}
