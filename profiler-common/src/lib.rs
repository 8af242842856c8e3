//! The ABI between profiler's eBPF programs and its userspace: map key and value layouts, map
//! names and sizes, counter indices and load-time global names.
//!
//! Everything here is `#[repr(C)]`, `Copy`, built from fixed-width integers with explicit
//! padding, and checked for size at compile time, because the kernel side (bpfel, `no_std`)
//! and the userspace side (x86_64) must agree byte for byte. Neither side spells a map name as
//! a literal: both use the constants below. The `user` feature adds aya's `Pod` impls; the
//! kernel build never sees aya.
#![no_std]

pub mod cpu;
pub mod futex;
pub mod heap;
pub mod stack;
pub mod unwind;

pub use cpu::{CpuCounter, CpuSampleKey};
pub use futex::{FutexCounter, PendingWait, ThreadKey, WaitKey, WaitOp, WaitOutcome, WaitTotals, Waker, WakerKey};
pub use heap::{HeapCounter, HeapKey, HeapTotals, LiveAlloc, LiveKey, PendingAlloc};
pub use stack::{Stack, MAX_STACK_DEPTH, NO_STACK};
pub use unwind::{UnwindCounter, UnwindKind, UnwindMapping, UnwindProcess, UnwindRow, UnwindTableInfo};

/// Names of load-time globals (set with `EbpfLoader::set_global`, never recompiled).
pub mod globals {
    /// `u8`: 1 when only processes listed in [`crate::maps::TARGET_PIDS`] are sampled.
    pub const FILTER_PIDS: &str = "FILTER_PIDS";
    /// `u64`: mean bytes between heap samples; 0 or 1 records every allocation.
    pub const HEAP_SAMPLE_BYTES: &str = "HEAP_SAMPLE_BYTES";
}

/// Map names, shared by both sides, and their sizes.
pub mod maps {
    /// Per-CPU hash of [`crate::CpuSampleKey`] → sample count, for map set 0.
    pub const CPU_COUNTS_0: &str = "CPU_COUNTS_0";
    /// The same for map set 1 (see [`CONTROL`]).
    pub const CPU_COUNTS_1: &str = "CPU_COUNTS_1";
    /// Hash of stack hash (`u64`) → [`crate::Stack`], for map set 0.
    pub const STACKS_0: &str = "STACKS_0";
    /// The same for map set 1.
    pub const STACKS_1: &str = "STACKS_1";
    /// Array of one `u32`: the generation, the number of flips so far, whose low bit is the
    /// map set (0 or 1) the kernel programs write to now. Userspace flips it, lets in-flight
    /// programs finish, then drains and clears the other set, so draining never races with
    /// the kernel's writes.
    pub const CONTROL: &str = "CONTROL";
    /// Index of the active-set slot in [`CONTROL`].
    pub const CONTROL_ACTIVE_SET: u32 = 0;
    /// Per-CPU array of `u64` event and drop counters, indexed by [`crate::CpuCounter`].
    pub const CPU_COUNTERS: &str = "CPU_COUNTERS";
    /// Hash of tgid (`u32`) → `u8`: the processes sampled when `FILTER_PIDS` is set.
    pub const TARGET_PIDS: &str = "TARGET_PIDS";
    /// Per-CPU scratch array of one [`crate::Stack`] (too big for the 512-byte BPF stack).
    pub const STACK_SCRATCH: &str = "STACK_SCRATCH";
    /// Per-CPU array of one window of user stack words copied during a walk.
    pub const STACK_WINDOW: &str = "STACK_WINDOW";

    /// Per-CPU hash of [`crate::HeapKey`] → [`crate::HeapTotals`], for map set 0.
    pub const HEAP_TOTALS_0: &str = "HEAP_TOTALS_0";
    /// The same for map set 1.
    pub const HEAP_TOTALS_1: &str = "HEAP_TOTALS_1";
    /// Hash of [`crate::LiveKey`] → [`crate::LiveAlloc`]: sampled blocks not yet freed. Not
    /// flipped: it is state, read in place.
    pub const HEAP_LIVE: &str = "HEAP_LIVE";
    /// Hash of pid_tgid (`u64`) → [`crate::PendingAlloc`]: allocator calls in flight.
    pub const HEAP_PENDING: &str = "HEAP_PENDING";
    /// Array of [`crate::heap::HEAP_INTERVALS_LEN`] `u64` sampling intervals drawn by userspace
    /// from an exponential distribution (BPF has no floating point to draw them).
    pub const HEAP_INTERVALS: &str = "HEAP_INTERVALS";
    /// Per-CPU array of one `i64`: bytes left until the next heap sample on this CPU.
    pub const HEAP_COUNTDOWN: &str = "HEAP_COUNTDOWN";
    /// Per-CPU array of `u64` heap counters, indexed by [`crate::HeapCounter`].
    pub const HEAP_COUNTERS: &str = "HEAP_COUNTERS";

    /// Array of [`crate::UnwindRow`]: every loaded unwind table's rows, in shards of
    /// [`crate::unwind::SHARD_ROWS`]. Its size is the unwind-table memory budget (set at load).
    pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
    /// Array of [`crate::UnwindTableInfo`]: table slot → where its rows are.
    pub const UNWIND_TABLES: &str = "UNWIND_TABLES";
    /// Hash of tgid (`u32`) → [`crate::UnwindProcess`]: each process's executable mappings
    /// and their tables.
    pub const UNWIND_PROCESSES: &str = "UNWIND_PROCESSES";
    /// Per-CPU array of `u64`, indexed by [`crate::UnwindCounter`].
    pub const UNWIND_COUNTERS: &str = "UNWIND_COUNTERS";
    /// Per-CPU scratch: the registers of the frame being unwound.
    pub const UNWIND_STATE: &str = "UNWIND_STATE";
    /// Hash of tgid (`u32`) → `u8`: processes that called `execve` since userspace last
    /// looked; the kernel has already forgotten their mappings.
    pub const UNWIND_EXECS: &str = "UNWIND_EXECS";

    /// Default rows of `UNWIND_ROWS`: 32 MiB, 1,024 shards.
    pub const UNWIND_ROWS_DEFAULT_ENTRIES: u32 = 4 << 20;
    /// Tables loaded at once.
    pub const UNWIND_TABLES_MAX_ENTRIES: u32 = 2_048;
    /// Processes the walker knows at once.
    pub const UNWIND_PROCESSES_MAX_ENTRIES: u32 = 8_192;
    /// Execs remembered between two looks.
    pub const UNWIND_EXECS_MAX_ENTRIES: u32 = 4_096;

    /// Distinct (process, allocating stack) keys per map set.
    pub const HEAP_TOTALS_MAX_ENTRIES: u32 = 16_384;
    /// Sampled live blocks tracked at once (all processes).
    pub const HEAP_LIVE_MAX_ENTRIES: u32 = 262_144;
    /// Threads inside an allocator call at once.
    pub const HEAP_PENDING_MAX_ENTRIES: u32 = 16_384;

    /// Per-CPU hash of [`crate::WaitKey`] → [`crate::WaitTotals`] by waiting stack (the block
    /// profile), for map set 0.
    pub const BLOCK_COUNTS_0: &str = "BLOCK_COUNTS_0";
    /// The same for map set 1.
    pub const BLOCK_COUNTS_1: &str = "BLOCK_COUNTS_1";
    /// Per-CPU hash of [`crate::WaitKey`] → [`crate::WaitTotals`] by waking stack (the mutex
    /// profile), for map set 0.
    pub const MUTEX_COUNTS_0: &str = "MUTEX_COUNTS_0";
    /// The same for map set 1.
    pub const MUTEX_COUNTS_1: &str = "MUTEX_COUNTS_1";
    /// Per-CPU hash of [`crate::ThreadKey`] → threads created (`u64`), for map set 0.
    pub const THREAD_COUNTS_0: &str = "THREAD_COUNTS_0";
    /// The same for map set 1.
    pub const THREAD_COUNTS_1: &str = "THREAD_COUNTS_1";
    /// Hash of pid_tgid (`u64`) → [`crate::PendingWait`]: futex waits in flight.
    pub const FUTEX_PENDING: &str = "FUTEX_PENDING";
    /// LRU hash of [`crate::WakerKey`] → [`crate::Waker`]: the last wake on each futex word.
    /// Not flipped: it is state.
    pub const FUTEX_WAKERS: &str = "FUTEX_WAKERS";
    /// Per-CPU array of `u64` futex and thread counters, indexed by [`crate::FutexCounter`].
    pub const FUTEX_COUNTERS: &str = "FUTEX_COUNTERS";

    /// Distinct (process, op, outcome, stack) keys per map set, in each of block and mutex.
    pub const WAIT_COUNTS_MAX_ENTRIES: u32 = 16_384;
    /// Distinct (process, creating stack) keys per map set.
    pub const THREAD_COUNTS_MAX_ENTRIES: u32 = 4_096;
    /// Threads inside a futex wait at once (all processes).
    pub const FUTEX_PENDING_MAX_ENTRIES: u32 = 32_768;
    /// Futex words whose last waker is remembered (least recently woken evicted first).
    pub const FUTEX_WAKERS_MAX_ENTRIES: u32 = 32_768;

    /// Distinct (process, thread, stacks) keys per map set.
    pub const CPU_COUNTS_MAX_ENTRIES: u32 = 16_384;
    /// Distinct stacks (user and kernel together) per map set.
    pub const STACKS_MAX_ENTRIES: u32 = 16_384;
    /// Processes that can be selected with `--pid`.
    pub const TARGET_PIDS_MAX_ENTRIES: u32 = 4_096;
}
