//! Heap sampling: uprobes on the C allocator's entry points and one uretprobe for all of them.
//!
//! Entry probes decide, with a per-CPU byte countdown over exponentially distributed
//! intervals (Poisson sampling, as Go and jemalloc do), whether the allocation is sampled,
//! and remember the call in `HEAP_PENDING`; the return probe takes the allocating stack
//! there, where the frame chain is intact (at the entry of `malloc` a frame-pointer walk
//! skips the caller), and records the block if it was sampled.
//!
//! Allocator functions call each other inside libc (`realloc(p, 0)` calls `free`) or jump to
//! each other (`reallocarray` to `realloc`, `realloc(NULL, n)` to `malloc`: the same stack
//! pointer). A call entered while an outer allocator call of the same thread is in flight, at
//! the same or a deeper stack pointer, is left to the outer one; returns are matched to their
//! entries by stack pointer, so an inner call's return never completes the outer call.
#![allow(non_upper_case_globals)]

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_F_NO_PREALLOC},
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, generated::bpf_get_prandom_u32},
    macros::{map, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
    Global,
};
use profiler_common::{
    heap::{interval_in_stratum, HEAP_INTERVALS_LEN, HEAP_INTERVAL_EDGES},
    maps::{HEAP_LIVE_MAX_ENTRIES, HEAP_PENDING_MAX_ENTRIES, HEAP_TOTALS_MAX_ENTRIES},
    HeapCounter, HeapKey, HeapTotals, LiveAlloc, LiveKey, PendingAlloc,
};

use crate::{
    maps::{active_set, add_or_insert_in_set, bump, current_task, Scratch, Task, COUNTS_MAP_FLAGS},
    stack::capture_user,
};

/// Mean bytes between heap samples; 0 or 1 samples every allocation (set at load time).
#[unsafe(no_mangle)]
pub static HEAP_SAMPLE_BYTES: Global<u64> = Global::new(524_288);

#[map]
pub static HEAP_TOTALS_0: HashMap<HeapKey, HeapTotals> =
    HashMap::with_max_entries(HEAP_TOTALS_MAX_ENTRIES, COUNTS_MAP_FLAGS);
#[map]
pub static HEAP_TOTALS_1: HashMap<HeapKey, HeapTotals> =
    HashMap::with_max_entries(HEAP_TOTALS_MAX_ENTRIES, COUNTS_MAP_FLAGS);

// Sized for many live blocks; allocate entries as they come instead of preallocating.
#[map]
pub static HEAP_LIVE: HashMap<LiveKey, LiveAlloc> = HashMap::with_max_entries(HEAP_LIVE_MAX_ENTRIES, BPF_F_NO_PREALLOC);

#[map]
pub static HEAP_PENDING: HashMap<u64, PendingAlloc> = HashMap::with_max_entries(HEAP_PENDING_MAX_ENTRIES, 0);

#[map]
pub static HEAP_INTERVALS: Array<u64> = Array::with_max_entries(HEAP_INTERVAL_EDGES, 0);

#[map]
pub static HEAP_COUNTDOWN: PerCpuArray<i64> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static HEAP_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(HeapCounter::COUNT, 0);

const PAGE_SIZE: u64 = 4096;

#[uprobe]
pub fn malloc_enter(ctx: ProbeContext) -> u32 {
    // malloc(size), valloc(size)
    let size: u64 = ctx.arg(0).unwrap_or(0);
    on_entry(&ctx, size, 0, 0);
    0
}

#[uprobe]
pub fn pvalloc_enter(ctx: ProbeContext) -> u32 {
    // pvalloc(size) rounds the size up to whole pages.
    let size: u64 = ctx.arg(0).unwrap_or(0);
    on_entry(&ctx, size.div_ceil(PAGE_SIZE).max(1) * PAGE_SIZE, 0, 0);
    0
}

#[uprobe]
pub fn calloc_enter(ctx: ProbeContext) -> u32 {
    let n: u64 = ctx.arg(0).unwrap_or(0);
    let size: u64 = ctx.arg(1).unwrap_or(0);
    // An overflowing n × size makes calloc fail (NULL), which records nothing.
    on_entry(&ctx, mul_or_max(n, size), 0, 0);
    0
}

#[uprobe]
pub fn memalign_enter(ctx: ProbeContext) -> u32 {
    // memalign(alignment, size), aligned_alloc(alignment, size)
    let size: u64 = ctx.arg(1).unwrap_or(0);
    on_entry(&ctx, size, 0, 0);
    0
}

#[uprobe]
pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
    // posix_memalign(void **memptr, alignment, size): the block comes back through memptr.
    let out: u64 = ctx.arg(0).unwrap_or(0);
    let size: u64 = ctx.arg(2).unwrap_or(0);
    if out != 0 {
        on_entry(&ctx, size, 0, out);
    }
    0
}

#[uprobe]
pub fn realloc_enter(ctx: ProbeContext) -> u32 {
    let old: u64 = ctx.arg(0).unwrap_or(0);
    let size: u64 = ctx.arg(1).unwrap_or(0);
    on_entry(&ctx, size, old, 0);
    0
}

#[uprobe]
pub fn reallocarray_enter(ctx: ProbeContext) -> u32 {
    let old: u64 = ctx.arg(0).unwrap_or(0);
    let n: u64 = ctx.arg(1).unwrap_or(0);
    let size: u64 = ctx.arg(2).unwrap_or(0);
    on_entry(&ctx, mul_or_max(n, size), old, 0);
    0
}

#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    match try_free_enter(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

/// `Err` for a call that frees nothing here (`free(NULL)`, or inside another allocator call).
#[inline(always)]
fn try_free_enter(ctx: &ProbeContext) -> Result<(), ()> {
    let ptr: u64 = ctx.arg(0).unwrap_or(0);
    if ptr == 0 {
        return Err(());
    }
    let task = current_task().ok_or(())?;
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if in_outer_call(task.pid_tgid, stack_pointer(&ctx.regs), now) {
        return Err(());
    }
    forget(task, ptr);
    Ok(())
}

#[uretprobe]
pub fn alloc_exit(ctx: RetProbeContext) -> u32 {
    match try_alloc_exit(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

/// `Err` for a return that is not a pending outermost call's.
#[inline(always)]
fn try_alloc_exit(ctx: &RetProbeContext) -> Result<(), ()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: a plain value read of this thread's entry, copied out before any map update.
    let pending = (unsafe { HEAP_PENDING.get(&pid_tgid) }).copied().ok_or(())?;
    if stack_pointer(&ctx.regs) != pending.entry_sp + 8 {
        // The return of an allocator call made inside the pending one: not ours.
        return Err(());
    }
    let _ = HEAP_PENDING.remove(&pid_tgid);
    let task = current_task().ok_or(())?;
    let ret: u64 = ctx.ret();
    let ptr = if pending.out_ptr != 0 { read_out_ptr(ret, pending.out_ptr) } else { ret };
    // realloc: the old block is gone when a new one came back, or when size 0 freed it.
    if pending.old_ptr != 0 && (ptr != 0 || pending.size == 0) {
        forget(task, pending.old_ptr);
    }
    if ptr != 0 && pending.sampled != 0 {
        record(task, ptr, pending.size);
    }
    Ok(())
}

/// n × size, or `u64::MAX` on overflow, in 32-bit halves: LLVM turns `saturating_mul` and
/// division-based checks into a 128-bit multiply, which BPF lacks.
#[inline(always)]
fn mul_or_max(n: u64, size: u64) -> u64 {
    let (n_hi, n_lo, s_hi, s_lo) = (n >> 32, n & 0xffff_ffff, size >> 32, size & 0xffff_ffff);
    if n_hi != 0 && s_hi != 0 {
        return u64::MAX;
    }
    // One of the two cross terms is zero, so the sum cannot overflow.
    let cross = n_hi * s_lo + s_hi * n_lo;
    if cross >> 32 != 0 {
        return u64::MAX;
    }
    let low = n_lo * s_lo;
    let product = (cross << 32).wrapping_add(low);
    if product < low {
        u64::MAX
    } else {
        product
    }
}

/// Remembers an outermost allocator call for its return probe, with the sampler's decision.
#[inline(always)]
fn on_entry(ctx: &ProbeContext, size: u64, old_ptr: u64, out_ptr: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let sp = stack_pointer(&ctx.regs);
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if in_outer_call(pid_tgid, sp, now) {
        return;
    }
    let sampled = take_sample(size);
    // Field by field, volatile: the struct literal compiled to a call of a byte-at-a-time
    // `memset` for its zero padding, on every allocator call.
    let mut pending = core::mem::MaybeUninit::<PendingAlloc>::uninit();
    let p = pending.as_mut_ptr();
    // SAFETY: writes of every field of a local; the value is read only after all of them.
    let pending = unsafe {
        core::ptr::write_volatile(&raw mut (*p).size, size);
        core::ptr::write_volatile(&raw mut (*p).old_ptr, old_ptr);
        core::ptr::write_volatile(&raw mut (*p).out_ptr, out_ptr);
        core::ptr::write_volatile(&raw mut (*p).entry_sp, sp);
        core::ptr::write_volatile(&raw mut (*p).sampled, sampled as u32);
        core::ptr::write_volatile(&raw mut (*p)._pad, 0);
        core::ptr::write_volatile(&raw mut (*p).entered_ns, now);
        pending.assume_init_ref()
    };
    if HEAP_PENDING.insert(&pid_tgid, pending, BPF_ANY as u64).is_err() {
        count(HeapCounter::PendingMapFull);
    }
}

/// How long an allocator call can plausibly take (calloc of a huge block zeroes it); an entry
/// older than this is left over from a call that never returned.
const MAX_CALL_NS: u64 = 5_000_000_000;

/// Whether this thread is inside an allocator call entered at the same or a higher stack
/// address (the stack grows down; the same address is a tail jump from one allocator
/// function to another). An entry at a lower address, or too old, is stale (a call that
/// never returned, e.g. a longjmp out of a malloc hook) and does not count.
#[inline(always)]
fn in_outer_call(pid_tgid: u64, sp: u64, now: u64) -> bool {
    // SAFETY: a plain value read.
    match unsafe { HEAP_PENDING.get(&pid_tgid) } {
        Some(p) => p.entry_sp >= sp && now.wrapping_sub(p.entered_ns) < MAX_CALL_NS,
        None => false,
    }
}

#[inline(always)]
fn stack_pointer(regs: &*mut aya_ebpf::bindings::pt_regs) -> u64 {
    // SAFETY: the probe context's registers, readable for the whole program.
    unsafe { (**regs).rsp }
}

/// The byte sampler: counts `size` down from an exponentially distributed interval and picks
/// the allocation that crosses zero. Every allocation when the interval is 0 or 1 byte.
#[inline(always)]
fn take_sample(size: u64) -> bool {
    if HEAP_SAMPLE_BYTES.load() <= 1 {
        return true;
    }
    let Some(left) = HEAP_COUNTDOWN.get_ptr_mut(0) else { return false };
    // SAFETY: this CPU's slot; programs do not nest on a CPU for uprobes.
    let left = unsafe { &mut *left };
    if *left == 0 {
        // First use on this CPU: start from a random point, not from a sample.
        *left = next_interval();
    }
    *left -= size.min(i64::MAX as u64) as i64;
    if *left > 0 {
        return false;
    }
    *left = next_interval();
    true
}

/// An exponentially distributed interval: a random stratum of the table, and a random point
/// in it (see [`interval_in_stratum`]). At least 1: 0 means "not started" to [`take_sample`].
#[inline(always)]
fn next_interval() -> i64 {
    // SAFETY: a helper without arguments.
    let idx = unsafe { bpf_get_prandom_u32() } & (HEAP_INTERVALS_LEN - 1);
    match (HEAP_INTERVALS.get(idx), HEAP_INTERVALS.get(idx + 1)) {
        (Some(&lo), Some(&hi)) if hi > 0 => {
            // SAFETY: a helper without arguments.
            let fraction = unsafe { bpf_get_prandom_u32() };
            interval_in_stratum(lo, hi, fraction).clamp(1, i64::MAX as u64) as i64
        }
        _ => HEAP_SAMPLE_BYTES.load().max(1) as i64,
    }
}

#[inline(always)]
fn live_key(task: Task, addr: u64) -> LiveKey {
    LiveKey { tgid: task.tgid, _pad: 0, addr }
}

#[inline(always)]
fn count(counter: HeapCounter) {
    bump(&HEAP_COUNTERS, counter as u32);
}

/// Drops a block from the live map; a block that was never sampled costs one lookup.
#[inline(always)]
fn forget(task: Task, addr: u64) {
    if HEAP_LIVE.remove(&live_key(task, addr)).is_ok() {
        count(HeapCounter::Freed);
    }
}

#[inline(always)]
fn read_out_ptr(ret: u64, out_ptr: u64) -> u64 {
    // posix_memalign returns 0 on success and an errno value on failure.
    if ret != 0 {
        return 0;
    }
    // SAFETY: a fault-safe read of the caller's `void *` that posix_memalign just wrote.
    match unsafe { bpf_probe_read_user(out_ptr as *const u64) } {
        Ok(ptr) => ptr,
        Err(_) => {
            count(HeapCounter::OutPtrUnreadable);
            0
        }
    }
}

/// Records a sampled block: its allocating stack, the (stack, size) totals, the live entry.
#[inline(always)]
fn record(task: Task, ptr: u64, size: u64) {
    let set = active_set();
    let mut truncated = false;
    let stack = match capture_user(set, &mut truncated, Scratch::Task, task.tgid) {
        Ok(hash) => hash,
        Err(_) => {
            count(HeapCounter::StackLost);
            profiler_common::NO_STACK
        }
    };
    let key = HeapKey { tgid: task.tgid, _pad: 0, stack, size };
    if !add_or_insert_in_set(set, &HEAP_TOTALS_0, &HEAP_TOTALS_1, &key, &HeapTotals { count: 1, bytes: size }) {
        count(HeapCounter::TotalsMapFull);
    }
    let live = LiveAlloc { size, stack };
    if HEAP_LIVE.insert(&live_key(task, ptr), &live, BPF_ANY as u64).is_err() {
        count(HeapCounter::LiveMapFull);
    }
    count(HeapCounter::Sampled);
}
