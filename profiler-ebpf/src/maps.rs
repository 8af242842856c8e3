//! The maps and globals shared by the programs. Static names equal the constants in
//! `profiler_common::maps` (aya names a map after its static); userspace opens them by those
//! constants.
#![allow(non_upper_case_globals)]

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC, BPF_NOEXIST},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap},
    Global,
};
use profiler_common::{
    heap::HEAP_INTERVALS_LEN,
    maps::{
        CPU_COUNTS_MAX_ENTRIES, FUTEX_PENDING_MAX_ENTRIES, FUTEX_WAKERS_MAX_ENTRIES, HEAP_LIVE_MAX_ENTRIES,
        HEAP_PENDING_MAX_ENTRIES, HEAP_TOTALS_MAX_ENTRIES, STACKS_MAX_ENTRIES, TARGET_PIDS_MAX_ENTRIES,
        THREAD_COUNTS_MAX_ENTRIES, UNWIND_EXECS_MAX_ENTRIES, UNWIND_PROCESSES_MAX_ENTRIES, UNWIND_ROWS_DEFAULT_ENTRIES,
        UNWIND_TABLES_MAX_ENTRIES, WAIT_COUNTS_MAX_ENTRIES,
    },
    stack::STACK_WINDOW_WORDS,
    CpuCounter, CpuSampleKey, FutexCounter, HeapCounter, HeapKey, HeapTotals, LiveAlloc, LiveKey, PendingAlloc,
    PendingWait, Stack, ThreadKey, UnwindCounter, UnwindProcess, UnwindRow, UnwindTableInfo, WaitKey, WaitTotals,
    Waker, WakerKey,
};

use crate::user_stack::WalkState;

/// 1 when only the processes in `TARGET_PIDS` are sampled (set at load time).
#[unsafe(no_mangle)]
pub static FILTER_PIDS: Global<u8> = Global::new(0);

#[map]
pub static CPU_COUNTS_0: PerCpuHashMap<CpuSampleKey, u64> = PerCpuHashMap::with_max_entries(CPU_COUNTS_MAX_ENTRIES, 0);
#[map]
pub static CPU_COUNTS_1: PerCpuHashMap<CpuSampleKey, u64> = PerCpuHashMap::with_max_entries(CPU_COUNTS_MAX_ENTRIES, 0);

// Stacks are 1 KiB each: allocate on insert instead of preallocating 16 MiB per set.
#[map]
pub static STACKS_0: HashMap<u64, Stack> = HashMap::with_max_entries(STACKS_MAX_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
pub static STACKS_1: HashMap<u64, Stack> = HashMap::with_max_entries(STACKS_MAX_ENTRIES, BPF_F_NO_PREALLOC);

/// Mean bytes between heap samples; 0 or 1 samples every allocation (set at load time).
#[unsafe(no_mangle)]
pub static HEAP_SAMPLE_BYTES: Global<u64> = Global::new(524_288);

#[map]
pub static HEAP_TOTALS_0: PerCpuHashMap<HeapKey, HeapTotals> =
    PerCpuHashMap::with_max_entries(HEAP_TOTALS_MAX_ENTRIES, 0);
#[map]
pub static HEAP_TOTALS_1: PerCpuHashMap<HeapKey, HeapTotals> =
    PerCpuHashMap::with_max_entries(HEAP_TOTALS_MAX_ENTRIES, 0);

// Sized for many live blocks; allocate entries as they come instead of preallocating.
#[map]
pub static HEAP_LIVE: HashMap<LiveKey, LiveAlloc> = HashMap::with_max_entries(HEAP_LIVE_MAX_ENTRIES, BPF_F_NO_PREALLOC);

#[map]
pub static HEAP_PENDING: HashMap<u64, PendingAlloc> = HashMap::with_max_entries(HEAP_PENDING_MAX_ENTRIES, 0);

#[map]
pub static HEAP_INTERVALS: Array<u64> = Array::with_max_entries(HEAP_INTERVALS_LEN, 0);

#[map]
pub static HEAP_COUNTDOWN: PerCpuArray<i64> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static HEAP_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(HeapCounter::COUNT, 0);

#[map]
pub static CONTROL: Array<u32> = Array::with_max_entries(1, 0);

#[map]
pub static CPU_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(CpuCounter::COUNT, 0);

#[map]
pub static TARGET_PIDS: HashMap<u32, u8> = HashMap::with_max_entries(TARGET_PIDS_MAX_ENTRIES, 0);

/// Which slot of the per-CPU scratch maps (`STACK_SCRATCH`, `STACK_WINDOW`, `UNWIND_STATE`,
/// `STORED_STACKS`) a program uses. The CPU program runs in the timer interrupt and can
/// interrupt a uprobe program on the same CPU: the kernel keeps tracepoint and perf-event
/// programs from nesting (its per-CPU `bpf_prog_active`), but uprobe programs do not take
/// that guard. With one slot, a CPU sample taken during a heap walk overwrote the walk's
/// frames with its own kernel stack (heap samples with kernel addresses as user frames).
#[derive(Clone, Copy)]
#[repr(u32)]
pub enum Scratch {
    /// Programs in the context of a task: uprobes and tracepoints.
    Task = 0,
    /// The perf-event (CPU sampling) program, in interrupt context.
    Interrupt = 1,
}

/// Slots of each scratch map: one per [`Scratch`].
pub const SCRATCH_SLOTS: u32 = 2;

#[map]
pub static STACK_SCRATCH: PerCpuArray<Stack> = PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

/// Stacks this CPU stored lately, by hash (see [`crate::stack`]): a hit skips the stack-map
/// lookup, which costs about a microsecond per sample on these VMs. One table of
/// [`STORED_STACKS_ENTRIES`] per [`Scratch`] slot.
#[map]
pub static STORED_STACKS: PerCpuArray<StoredStack> =
    PerCpuArray::with_max_entries(STORED_STACKS_ENTRIES * SCRATCH_SLOTS, 0);

/// Entries of one [`STORED_STACKS`] table; a power of two (indexed by the hash's low bits).
pub const STORED_STACKS_ENTRIES: u32 = 256;

/// A stack hash known to be in the stack map of generation `generation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StoredStack {
    pub hash: u64,
    pub generation: u32,
    /// 1 once written (generation 0 is a real generation).
    pub valid: u32,
}

#[map]
pub static STACK_WINDOW: PerCpuArray<[u64; STACK_WINDOW_WORDS]> = PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

#[map]
pub static BLOCK_COUNTS_0: PerCpuHashMap<WaitKey, WaitTotals> =
    PerCpuHashMap::with_max_entries(WAIT_COUNTS_MAX_ENTRIES, 0);
#[map]
pub static BLOCK_COUNTS_1: PerCpuHashMap<WaitKey, WaitTotals> =
    PerCpuHashMap::with_max_entries(WAIT_COUNTS_MAX_ENTRIES, 0);
#[map]
pub static MUTEX_COUNTS_0: PerCpuHashMap<WaitKey, WaitTotals> =
    PerCpuHashMap::with_max_entries(WAIT_COUNTS_MAX_ENTRIES, 0);
#[map]
pub static MUTEX_COUNTS_1: PerCpuHashMap<WaitKey, WaitTotals> =
    PerCpuHashMap::with_max_entries(WAIT_COUNTS_MAX_ENTRIES, 0);
#[map]
pub static THREAD_COUNTS_0: PerCpuHashMap<ThreadKey, u64> =
    PerCpuHashMap::with_max_entries(THREAD_COUNTS_MAX_ENTRIES, 0);
#[map]
pub static THREAD_COUNTS_1: PerCpuHashMap<ThreadKey, u64> =
    PerCpuHashMap::with_max_entries(THREAD_COUNTS_MAX_ENTRIES, 0);

#[map]
pub static FUTEX_PENDING: HashMap<u64, PendingWait> = HashMap::with_max_entries(FUTEX_PENDING_MAX_ENTRIES, 0);

// LRU: words nobody wakes any more age out instead of filling the map.
#[map]
pub static FUTEX_WAKERS: LruHashMap<WakerKey, Waker> = LruHashMap::with_max_entries(FUTEX_WAKERS_MAX_ENTRIES, 0);

#[map]
pub static FUTEX_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(FutexCounter::COUNT, 0);

/// Adds one to a per-CPU futex counter (see [`bump`]).
#[inline(always)]
pub fn bump_futex(counter: FutexCounter) {
    if let Some(slot) = FUTEX_COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: this CPU's slot of a live array map element.
        unsafe { *slot += 1 };
    }
}

/// Every loaded unwind table's rows (resized at load time to the memory budget).
#[map]
// Mmapable: userspace writes whole tables into it directly, not one row per syscall.
pub static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(UNWIND_ROWS_DEFAULT_ENTRIES, BPF_F_MMAPABLE);

#[map]
pub static UNWIND_TABLES: Array<UnwindTableInfo> = Array::with_max_entries(UNWIND_TABLES_MAX_ENTRIES, 0);

/// Rows this CPU found lately, by (table load id, offset): a hit skips the table's binary
/// search, whose ~16 dependent reads spread over the row array were the largest part of a
/// frame's cost (`step_callback` was a third of the futex programs' time). One table of
/// [`ROW_CACHE_ENTRIES`] per [`Scratch`] slot; entries are only ever whole facts about an
/// immutable table (a reloaded slot has a new load id), so a stale entry cannot match.
#[map]
pub static ROW_CACHE: PerCpuArray<CachedRow> = PerCpuArray::with_max_entries(ROW_CACHE_ENTRIES * SCRATCH_SLOTS, 0);

/// Entries of one [`ROW_CACHE`] table; a power of two.
pub const ROW_CACHE_ENTRIES: u32 = 512;

/// The row found for `key` = (table load id << 32) | offset; key 0 is empty.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CachedRow {
    pub key: u64,
    pub row: UnwindRow,
}

// 8 KiB per process: allocate as processes are registered.
#[map]
pub static UNWIND_PROCESSES: HashMap<u32, UnwindProcess> =
    HashMap::with_max_entries(UNWIND_PROCESSES_MAX_ENTRIES, BPF_F_NO_PREALLOC);

#[map]
pub static UNWIND_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(UnwindCounter::COUNT, 0);

#[map]
pub static UNWIND_STATE: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

#[map]
pub static UNWIND_EXECS: HashMap<u32, u8> = HashMap::with_max_entries(UNWIND_EXECS_MAX_ENTRIES, 0);

/// Adds one to a per-CPU unwind counter. Both contexts of [`Scratch`] walk stacks, so a CPU
/// sample interrupting a heap walk between this load and store loses one of the two counts:
/// a rare off-by-one in a diagnostic counter, accepted (the BPF target's `core` offers no
/// atomic add).
#[inline(always)]
pub fn bump_unwind(index: u32) {
    if let Some(slot) = UNWIND_COUNTERS.get_ptr_mut(index) {
        // SAFETY: this CPU's slot of a live array map element.
        unsafe { *slot += 1 };
    }
}

/// Updates this CPU's value for `key` with `add`, or inserts `first` when the key is new.
/// False when the map is full. Another CPU may create the key between the lookup and the
/// insert; then the lookup is tried again.
#[inline(always)]
pub fn add_or_insert<K, V>(map: &PerCpuHashMap<K, V>, key: &K, first: &V, add: impl Fn(&mut V)) -> bool {
    const EEXIST: i32 = 17;
    for _ in 0..2 {
        if let Some(value) = map.get_ptr_mut(key) {
            // SAFETY: this CPU's slot of a live per-CPU value; each such map belongs to
            // programs of one context, which do not nest on a CPU.
            add(unsafe { &mut *value });
            return true;
        }
        match map.insert(key, first, BPF_NOEXIST as u64) {
            Ok(()) => return true,
            Err(err) if err == -EEXIST => continue,
            Err(_) => return false,
        }
    }
    false
}

/// Adds one to a per-CPU counter. Per-CPU slots need no atomics: each counter map belongs
/// to programs of one [`Scratch`] context, and those do not nest on a CPU.
#[inline(always)]
pub fn bump(counter: CpuCounter) {
    if let Some(slot) = CPU_COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: the pointer is to this CPU's slot of a live array map element.
        unsafe { *slot += 1 };
    }
}

/// Adds one to a per-CPU heap counter (see [`bump`]).
#[inline(always)]
pub fn bump_heap(counter: HeapCounter) {
    if let Some(slot) = HEAP_COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: this CPU's slot of a live array map element.
        unsafe { *slot += 1 };
    }
}

/// The map set (0 or 1) the programs write to now.
#[inline(always)]
pub fn active_set() -> u32 {
    active_generation() & 1
}

/// How many times userspace has flipped the map sets; its low bit is the active set.
#[inline(always)]
pub fn active_generation() -> u32 {
    match CONTROL.get(profiler_common::maps::CONTROL_ACTIVE_SET) {
        Some(&generation) => generation,
        None => 0,
    }
}

/// Whether samples of process `tgid` are recorded.
#[inline(always)]
pub fn wanted(tgid: u32) -> bool {
    // SAFETY: the value is a plain u8 that is only ever read.
    FILTER_PIDS.load() == 0 || unsafe { TARGET_PIDS.get(&tgid) }.is_some()
}
