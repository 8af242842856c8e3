//! The ABI between profiler's eBPF programs and its userspace: map key and value layouts, map
//! names and sizes, counter indices and load-time global names.
//!
//! Everything here is `#[repr(C)]`, `Copy`, built from fixed-width integers with explicit
//! padding, and checked for size at compile time, because the kernel side (bpfel, `no_std`)
//! and the userspace side (x86_64) must agree byte for byte. Userspace never spells a map or
//! program name as a literal: it uses the constants below, and a daemon test parses the
//! embedded object and checks that each constant names a map or program in it and that each
//! map in it is named here ([`maps::ALL`], [`programs::ALL`]). The kernel side names a map
//! after its static and a program after its function, so those must equal the constants.
//! The `user` feature adds aya's `Pod` impls; the kernel build never sees aya.
#![no_std]

pub mod cpu;
pub mod frame;
pub mod futex;
pub mod heap;
pub mod offcpu;
pub mod runtimes;
pub mod sampling;
pub mod share;
pub mod stack;
pub mod thread;
pub mod threads;
pub mod tracepoint;
pub mod unwind;
pub mod walk;

pub use cpu::{CgroupFilterMode, CpuCounter, CpuSampleKey};
pub use frame::{FrameKind, InterpretedFrame};
pub use futex::{FutexCounter, PendingWait, WaitKey, WaitOp, WaitOutcome, WaitTotals, Waker, WakerKey, WAIT_COUNT_ONE};
pub use heap::{HeapCounter, HeapKey, HeapTotals, LiveAlloc, LiveKey, PendingAlloc};
pub use offcpu::{OffCpuCounter, OffCpuKey, OffCpuState, OffCpuTotals, SwitchedOut};
pub use share::{ShareCaps, ShareUse};
pub use stack::{
    Stack, KERNEL_STACK_CHUNKS, KERNEL_STACK_DEPTH, MAX_USER_STACK_DEPTH, NO_STACK, OVER_SHARE_STACK, STACK_CHUNKS,
    STACK_PIECE_FRAMES,
};
pub use thread::{ThreadCounter, ThreadKey};
pub use threads::{TaskOffsets, ThreadRecord};
pub use unwind::{
    RegisterAsk, SmallUnwindProcess, Unsupported, UnwindCounter, UnwindKind, UnwindMapping, UnwindProcess,
    UnwindProcessOf, UnwindRow, UnwindTableInfo, UprobeOffsets, WalkTotals, WALK_STATE_BYTES,
};

/// Names of load-time globals (set with `EbpfLoader::set_global`, never recompiled).
pub mod globals {
    /// `u8`: 1 when only processes listed in [`crate::maps::TARGET_PIDS`] are sampled.
    pub const FILTER_PIDS: &str = "FILTER_PIDS";
    /// `u64`: the kernel `dev_t` of the profiler's pid namespace (its `/proc/self/ns/pid`),
    /// when that is not the initial namespace; with [`PIDNS_INO`] the programs then count only
    /// tasks of that namespace, under their ids there. 0 otherwise.
    pub const PIDNS_DEV: &str = "PIDNS_DEV";
    /// `u64`: the inode of that namespace; 0 in the initial namespace.
    pub const PIDNS_INO: &str = "PIDNS_INO";
    /// `u64`: mean bytes between heap samples; 0 or 1 records every allocation.
    pub const HEAP_SAMPLE_BYTES: &str = "HEAP_SAMPLE_BYTES";
    /// [`crate::TaskOffsets`]: where the thread-dump iterator reads `task_struct` fields.
    pub const TASK_OFFSETS: &str = "TASK_OFFSETS";
    /// `u64`: a random key drawn at each load that every stack hash starts from
    /// ([`crate::stack::hash_start`]), so no process can craft stacks whose ids collide.
    pub const STACK_HASH_KEY: &str = "STACK_HASH_KEY";
    /// [`crate::ShareCaps`]: each process's and each uid's cap on new stack-table entries
    /// per map set (see [`crate::share`]).
    pub const STACK_SHARE_CAPS: &str = "STACK_SHARE_CAPS";
    /// `u32`: entries of each context's table in `ROW_CACHE`, a power of two
    /// ([`crate::maps::cache_slot_entries`] for the machine's possible CPUs).
    pub const ROW_CACHE_SLOT_ENTRIES: &str = "ROW_CACHE_SLOT_ENTRIES";
    /// `u32`: the same for `STORED_STACKS`.
    pub const STORED_STACKS_SLOT_ENTRIES: &str = "STORED_STACKS_SLOT_ENTRIES";
    /// [`crate::UprobeOffsets`]: where the kernel keeps what its uprobes moved into the
    /// `[uprobes]` page, so that walks put the frames back.
    pub const UPROBE_OFFSETS: &str = "UPROBE_OFFSETS";
}

/// Map names, shared by both sides, and their sizes.
pub mod maps {
    /// Hash of [`crate::CpuSampleKey`] → sample count, for map set 0. Like every counts map
    /// (`*_COUNTS_*`, `HEAP_TOTALS_*`), shared by all CPUs (atomic adds), so its kernel
    /// memory does not grow with the number of CPUs.
    pub const CPU_COUNTS_0: &str = "CPU_COUNTS_0";
    /// The same for map set 1 (see [`CONTROL`]).
    pub const CPU_COUNTS_1: &str = "CPU_COUNTS_1";
    /// Hash of [`crate::stack::set_key`]`(stack hash or piece key, set)` → [`crate::Stack`]:
    /// both map sets' stacks in one table (the key's low bit is the set), so the set being
    /// drained and the set being filled share its capacity.
    pub const STACKS: &str = "STACKS";
    /// Hash of [`crate::share::ShareKey`] → [`crate::ShareUse`]: what each process and uid
    /// put in (and was refused from) set 0's part of `STACKS` since it was drained.
    pub const STACK_SHARES_0: &str = "STACK_SHARES_0";
    /// The same for set 1.
    pub const STACK_SHARES_1: &str = "STACK_SHARES_1";
    /// Array of `u32` switches userspace changes while the programs run, side by side so that
    /// a program reads them from one cache line: at [`CONTROL_ACTIVE_SET`] the generation,
    /// the number of flips so far, whose low bit is the map set (0 or 1) the kernel programs
    /// write to now (userspace flips it, lets in-flight programs finish, then drains and
    /// clears the other set, so draining never races with the kernel's writes); at
    /// [`CONTROL_CGROUP_MODE`] how [`CGROUP_FILTER`] applies ([`crate::CgroupFilterMode`]);
    /// at [`CONTROL_UNWIND_EPOCH`] and [`CONTROL_EXEC_EPOCH`] the unwind epochs.
    pub const CONTROL: &str = "CONTROL";
    /// Index of the active-set slot in [`CONTROL`].
    pub const CONTROL_ACTIVE_SET: u32 = 0;
    /// Index of the cgroup filter's mode in [`CONTROL`].
    pub const CONTROL_CGROUP_MODE: u32 = 1;
    /// Index in [`CONTROL`] of the number of changes userspace has made to the unwinder's
    /// processes and tables ([`UNWIND_PROCESSES`], [`UNWIND_PROCESSES_LARGE`],
    /// [`UNWIND_TABLES`]), counted after each change. The walker keeps the mappings it found
    /// from one walk to the next, each under the epochs it read before reading the process:
    /// a kept mapping is used only while both epochs are unchanged.
    pub const CONTROL_UNWIND_EPOCH: u32 = 2;
    /// Index in [`CONTROL`] of the number of processes the exec program unregistered (the
    /// kernel's own count, beside userspace's so that neither overwrites the other's).
    pub const CONTROL_EXEC_EPOCH: u32 = 3;
    /// Entries of [`CONTROL`].
    pub const CONTROL_SLOTS: u32 = 4;
    /// Per-CPU array of `u64` event and drop counters, indexed by [`crate::CpuCounter`].
    pub const CPU_COUNTERS: &str = "CPU_COUNTERS";
    /// Hash of tgid (`u32`) → `u8`: the processes sampled when `FILTER_PIDS` is set.
    pub const TARGET_PIDS: &str = "TARGET_PIDS";
    /// Array of [`TARGET_PID_SLOTS_LEN`] `u32`s, a direct-mapped copy of [`TARGET_PIDS`]
    /// that the programs read first: slot [`target_pid_slot`] of a tgid holds it when it is
    /// the only listed tgid of that slot, [`TARGET_PID_SHARED`] when several are (then the
    /// hash decides), 0 when none is. Every futex call of a filtered capture asks; an array
    /// slot costs it a mask where a hash lookup costs it a hash and a bucket walk.
    pub const TARGET_PID_SLOTS: &str = "TARGET_PID_SLOTS";
    pub const TARGET_PID_SLOTS_LEN: u32 = 4_096;
    pub const TARGET_PID_SHARED: u32 = u32::MAX;

    /// The [`TARGET_PID_SLOTS`] slot of `tgid`.
    #[inline(always)]
    pub fn target_pid_slot(tgid: u32) -> u32 {
        tgid & (TARGET_PID_SLOTS_LEN - 1)
    }

    /// What a slot holding `current` holds once `tgid` is listed too.
    pub fn with_target_pid(current: u32, tgid: u32) -> u32 {
        if current == 0 || current == tgid {
            tgid
        } else {
            TARGET_PID_SHARED
        }
    }
    /// Kernel-only scratch maps: per-CPU working memory of the programs (a stack too big for
    /// the 512-byte BPF stack, the stack window a walk copies, the walk's registers, the
    /// caches of stored stacks and found rows, the heap sampler's countdown). Userspace never
    /// opens them; they are named so that every map of the object is accounted for.
    pub const STACK_SCRATCH: &str = "STACK_SCRATCH";
    pub const KERNEL_SCRATCH: &str = "KERNEL_SCRATCH";
    pub const STACK_WINDOW: &str = "STACK_WINDOW";
    pub const STORED_STACKS: &str = "STORED_STACKS";
    pub const ROW_CACHE: &str = "ROW_CACHE";
    /// Tables of each per-CPU scratch map and cache: one per program context that can
    /// interrupt another on a CPU (task, interrupt, scheduler switch).
    pub const SCRATCH_SLOTS: u32 = 3;
    /// Bytes of one entry of `ROW_CACHE` and of `STORED_STACKS`.
    pub const CACHE_ENTRY_BYTES: u64 = 16;
    /// Entries of each context's `ROW_CACHE` table on a machine of up to 64 CPUs.
    pub const ROW_CACHE_MAX_SLOT_ENTRIES: u32 = 512;
    /// Kernel memory all CPUs' `ROW_CACHE` tables may take together (its size at 64 CPUs).
    pub const ROW_CACHE_BUDGET_BYTES: u64 = 3 << 19;
    /// Entries of each context's `STORED_STACKS` table on a machine of up to 64 CPUs.
    pub const STORED_STACKS_MAX_SLOT_ENTRIES: u32 = 256;
    /// Kernel memory all CPUs' `STORED_STACKS` tables may take together.
    pub const STORED_STACKS_BUDGET_BYTES: u64 = 3 << 18;

    /// Entries of each context's table of a per-CPU cache on a machine of `possible_cpus`:
    /// `max` (a power of two), halved until every CPU's tables fit `budget_bytes`, and never
    /// below 16. The caches only save work (a row search, a stack-map lookup), so a host with
    /// hundreds of CPUs gets smaller ones instead of kernel memory that grows with its CPUs.
    pub const fn cache_slot_entries(max: u32, budget_bytes: u64, possible_cpus: u32) -> u32 {
        let mut entries = max;
        while entries > 16
            && entries as u64 * SCRATCH_SLOTS as u64 * CACHE_ENTRY_BYTES * possible_cpus as u64 > budget_bytes
        {
            entries /= 2;
        }
        entries
    }
    /// Per-CPU array of one [`crate::ThreadRecord`]: the thread-dump iterator's record
    /// before it is written out (too big for the BPF stack).
    pub const THREAD_RECORD: &str = "THREAD_RECORD";

    /// Hash of [`crate::HeapKey`] → [`crate::HeapTotals`], for map set 0.
    pub const HEAP_TOTALS_0: &str = "HEAP_TOTALS_0";
    /// The same for map set 1.
    pub const HEAP_TOTALS_1: &str = "HEAP_TOTALS_1";
    /// Hash of [`crate::LiveKey`] → [`crate::LiveAlloc`]: sampled blocks not yet freed. Not
    /// flipped: it is state, read in place.
    pub const HEAP_LIVE: &str = "HEAP_LIVE";
    /// Hash of pid_tgid (`u64`) → [`crate::PendingAlloc`]: allocator calls in flight.
    pub const HEAP_PENDING: &str = "HEAP_PENDING";
    /// Array of [`crate::heap::HEAP_INTERVAL_EDGES`] `u64`: the edges of equal-probability
    /// strata of the exponential distribution of sampling intervals, computed by userspace (BPF
    /// has no floating point); the kernel draws a stratum and a point in it.
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
    /// Hash of tgid (`u32`) → [`crate::SmallUnwindProcess`]: each process's executable
    /// mappings and their tables, when they fit a small entry; the walker looks here first.
    pub const UNWIND_PROCESSES: &str = "UNWIND_PROCESSES";
    /// Hash of tgid (`u32`) → [`crate::UnwindProcess`]: the processes with more mappings.
    /// A process is in at most one of the two maps.
    pub const UNWIND_PROCESSES_LARGE: &str = "UNWIND_PROCESSES_LARGE";
    /// Per-CPU array of `u64`, indexed by [`crate::UnwindCounter`] (the frame counters get
    /// the [`crate::WalkTotals`] in `UNWIND_STATE` added).
    pub const UNWIND_COUNTERS: &str = "UNWIND_COUNTERS";
    /// Per-CPU scratch: the registers of the frame being unwound, one entry per context, each
    /// [`crate::WALK_STATE_BYTES`] long and starting with the context's [`crate::WalkTotals`].
    pub const UNWIND_STATE: &str = "UNWIND_STATE";
    /// Hash of tgid (`u32`) → `u8`: processes that called `execve` since userspace last
    /// looked; the kernel has already forgotten their mappings.
    pub const UNWIND_EXECS: &str = "UNWIND_EXECS";
    /// Ring buffer of [`crate::RegisterAsk`]: processes a walker met unregistered, each told
    /// once (see `REGISTER_ASKED`), with the name of the thread met; a record wakes userspace, which then reads the side band at once
    /// even while it paces a storm of process events.
    pub const REGISTER_ASKS: &str = "REGISTER_ASKS";
    /// LRU hash of tgid (`u32`) → `u8`: the processes already told through `REGISTER_ASKS`
    /// (an exec clears its process's entry: the new image asks again).
    pub const REGISTER_ASKED: &str = "REGISTER_ASKED";
    /// Hash of tgid (`u32`) → `u8`, written by userspace: processes it will not register (the
    /// configuration's selection leaves them out), whose walks therefore do not ask. Without
    /// it, past `REGISTER_ASKED_MAX_ENTRIES` such processes the LRU churns and every walk of
    /// an evicted one wakes userspace again. An exec clears its process's entry (the new image
    /// may be selected); userspace deletes those of exited processes.
    pub const REGISTER_DECLINED: &str = "REGISTER_DECLINED";

    /// Default rows of `UNWIND_ROWS`: 32 MiB, 1,024 shards.
    pub const UNWIND_ROWS_DEFAULT_ENTRIES: u32 = 4 << 20;
    /// Tables loaded at once.
    pub const UNWIND_TABLES_MAX_ENTRIES: u32 = 2_048;
    /// Processes the walker knows at once with small mapping lists (776 B each)...
    pub const UNWIND_PROCESSES_MAX_ENTRIES: u32 = 8_192;
    /// ...and with large ones (6 KiB each): those with more than 32 executable mappings
    /// (a refused one is counted and walked with frame pointers).
    pub const UNWIND_PROCESSES_LARGE_MAX_ENTRIES: u32 = 768;
    /// Execs remembered between two looks.
    pub const UNWIND_EXECS_MAX_ENTRIES: u32 = 4_096;
    /// Bytes of `REGISTER_ASKS` (two pages): 256 asks of 24 bytes (and the ring's 8-byte
    /// headers) between two reads.
    pub const REGISTER_ASKS_BYTES: u32 = 8_192;
    /// Processes remembered as asked (80 KiB whatever the CPUs). One evicted asks again at its
    /// next walk: an extra read of the side band, no more.
    pub const REGISTER_ASKED_MAX_ENTRIES: u32 = 1_024;
    /// Processes declined at once (allocated as used); past it, an unselected process asks
    /// through the LRU as before, and the refusals are counted.
    pub const REGISTER_DECLINED_MAX_ENTRIES: u32 = 32_768;

    /// Distinct (process, allocating stack, size) keys per map set, drained every second: a
    /// stack allocating several sizes takes one key per size sampled in that second.
    ///
    /// Why the exact size, as Go keys its buckets, and not a size class: a block's weight
    /// `1/(1 − e^(−s/rate))` is ≈ `rate/s` for small blocks, so it varies 2× across a
    /// power-of-two class and one scale per class would be biased by up to 2× (F16's error,
    /// smaller); the unbiased per-class estimate, Σ 1/p over the blocks, needs floating point
    /// the kernel does not have. The price is map pressure, which is bounded: keys ≤ samples
    /// per drain, so at the default 512 KiB rate filling the map takes 16 GiB/s allocated by
    /// probed processes (a probed malloc costs microseconds: out of reach). At a fine rate (1
    /// byte: every call) a program of many sizes can fill it; a sample that finds no room is
    /// dropped and counted (`HeapCounter::TotalsMapFull`: `/status` drops
    /// `heap_totals_map_full`, each heap profile's comment, the snapshot summary).
    pub const HEAP_TOTALS_MAX_ENTRIES: u32 = 32_768;
    /// Sampled live blocks tracked at once (all processes), at most: what the object
    /// declares. Userspace sizes the map at load with [`heap_live_entries`].
    pub const HEAP_LIVE_MAX_ENTRIES: u32 = 262_144;
    /// ...and at least, when the sampling rate is coarse.
    pub const HEAP_LIVE_MIN_ENTRIES: u32 = 65_536;
    /// Live heap, in bytes over every profiled process, that the live-block map is sized to
    /// follow at the sampling rate: one entry per `sample_bytes` of it.
    pub const HEAP_LIVE_TRACKED_BYTES: u64 = 32 << 30;

    /// Capacity of the live-block map at `sample_bytes` per sample: [`HEAP_LIVE_TRACKED_BYTES`]
    /// of live heap, within [`HEAP_LIVE_MIN_ENTRIES`]..=[`HEAP_LIVE_MAX_ENTRIES`]. At the
    /// default 512 KiB that is the minimum, 64 Ki entries (~6.5 MiB of kernel memory when
    /// full) instead of the 26 MiB a fixed maximum would take.
    pub const fn heap_live_entries(sample_bytes: u64) -> u32 {
        let wanted = HEAP_LIVE_TRACKED_BYTES / if sample_bytes == 0 { 1 } else { sample_bytes };
        if wanted < HEAP_LIVE_MIN_ENTRIES as u64 {
            HEAP_LIVE_MIN_ENTRIES
        } else if wanted > HEAP_LIVE_MAX_ENTRIES as u64 {
            HEAP_LIVE_MAX_ENTRIES
        } else {
            wanted as u32
        }
    }
    /// Threads inside an allocator call at once: those running one, and those preempted in
    /// one. Even at 256 CPUs a few hundred.
    pub const HEAP_PENDING_MAX_ENTRIES: u32 = 4_096;

    /// Hash of [`crate::WaitKey`] → [`crate::WaitTotals`] by waiting stack (the block
    /// profile), for map set 0.
    pub const BLOCK_COUNTS_0: &str = "BLOCK_COUNTS_0";
    /// The same for map set 1.
    pub const BLOCK_COUNTS_1: &str = "BLOCK_COUNTS_1";
    /// Hash of [`crate::WaitKey`] → [`crate::WaitTotals`] by waking stack (the mutex
    /// profile), for map set 0.
    pub const MUTEX_COUNTS_0: &str = "MUTEX_COUNTS_0";
    /// The same for map set 1.
    pub const MUTEX_COUNTS_1: &str = "MUTEX_COUNTS_1";
    /// Hash of [`crate::ThreadKey`] → threads created (`u64`), for map set 0.
    pub const THREAD_COUNTS_0: &str = "THREAD_COUNTS_0";
    /// The same for map set 1.
    pub const THREAD_COUNTS_1: &str = "THREAD_COUNTS_1";
    /// Array of [`crate::futex::PendingSlot`] by thread id: each thread's futex wait in
    /// flight (see `futex::pending_slot`).
    pub const FUTEX_PENDING: &str = "FUTEX_PENDING";
    /// Hash of pid_tgid (`u64`) → [`crate::PendingWait`]: the wait in flight of a thread
    /// whose `FUTEX_PENDING` slot holds another thread's, from its entry to its exit.
    pub const FUTEX_PENDING_SPILL: &str = "FUTEX_PENDING_SPILL";
    /// Array of one `u64`: the entries in [`FUTEX_PENDING_SPILL`] now.
    pub const FUTEX_SPILLED: &str = "FUTEX_SPILLED";
    /// Per-CPU array of one `u64`: the state of the futex programs' sampling draws.
    pub const FUTEX_RANDOM: &str = "FUTEX_RANDOM";
    /// Array of [`crate::futex::WakerSlot`]: the last wake on each futex word, by
    /// `futex::waker_slot`. Not flipped: it is state.
    pub const FUTEX_WAKERS: &str = "FUTEX_WAKERS";
    /// Per-CPU array of `u64` futex counters, indexed by [`crate::FutexCounter`].
    pub const FUTEX_COUNTERS: &str = "FUTEX_COUNTERS";
    /// Array of `u64` sampling knobs of the futex programs (`crate::futex::FUTEX_CONFIG_*`).
    pub const FUTEX_CONFIG: &str = "FUTEX_CONFIG";
    /// Per-CPU array of `u64` thread-creation counters, indexed by [`crate::ThreadCounter`].
    pub const THREAD_COUNTERS: &str = "THREAD_COUNTERS";

    /// Distinct (process, op, outcome, stack) keys per map set, in each of block and mutex.
    pub const WAIT_COUNTS_MAX_ENTRIES: u32 = 16_384;
    /// Distinct (process, creating stack) keys per map set.
    pub const THREAD_COUNTS_MAX_ENTRIES: u32 = 4_096;
    /// Threads inside a futex wait at the same time as another thread of the same
    /// `FUTEX_PENDING` slot (all processes). With thread ids spread over a `pid_max` of
    /// 4194304, 32,768 threads blocked at once (what the in-flight hash held before the
    /// array) share slots about 12,000 times; this holds that many.
    pub const FUTEX_PENDING_SPILL_MAX_ENTRIES: u32 = 16_384;

    /// Distinct (process, thread, stacks) keys per map set.
    pub const CPU_COUNTS_MAX_ENTRIES: u32 = 16_384;
    /// Stack entries (user and kernel stacks, a piece per 63 frames) of both map sets
    /// together. The drained set's entries are deleted within milliseconds of a flip, so the
    /// set being filled has nearly all of it.
    pub const STACKS_MAX_ENTRIES: u32 = 16_384;
    /// Processes that can be selected with `--pid` (the map is sized to the list at load).
    pub const TARGET_PIDS_MAX_ENTRIES: u32 = 4_096;
    /// Hash of cgroup id (`u64`, the cgroup directory's inode number) → `u8` 1: the cgroups
    /// the configuration's `[processes]` cgroup and unit matchers select (or exclude).
    pub const CGROUP_FILTER: &str = "CGROUP_FILTER";
    /// Cgroups a configuration can select or exclude in the kernel: the matched ones only
    /// (a Kubernetes node runs a few thousand cgroups in all).
    pub const CGROUP_FILTER_MAX_ENTRIES: u32 = 8_192;

    /// Off-CPU time by (thread, state, stacks), per set.
    pub const OFFCPU_COUNTS_0: &str = "OFFCPU_COUNTS_0";
    pub const OFFCPU_COUNTS_1: &str = "OFFCPU_COUNTS_1";
    /// Array of [`crate::offcpu::OutSlot`] by thread id: each thread's switch-out in flight
    /// (see `offcpu::out_slot`).
    pub const OFFCPU_OUT: &str = "OFFCPU_OUT";
    /// Switch-outs not yet switched back in, by `task_struct` address: those walked at the
    /// switch-out, and those of threads whose `OFFCPU_OUT` slot held another's.
    pub const OFFCPU_PENDING: &str = "OFFCPU_PENDING";
    /// Counts of `OFFCPU_PENDING` entries by a hash of their key
    /// (`crate::offcpu::maybe_pending_slot`): a switch-in whose slot is 0 has no entry, and
    /// skips the hash lookup that every switch would otherwise pay.
    pub const OFFCPU_MAYBE_PENDING: &str = "OFFCPU_MAYBE_PENDING";
    /// Array of one `crate::offcpu::OffCpuConfig`, written after load.
    pub const OFFCPU_CONFIG: &str = "OFFCPU_CONFIG";
    pub const OFFCPU_COUNTERS: &str = "OFFCPU_COUNTERS";
    pub const OFFCPU_COUNTS_MAX_ENTRIES: u32 = 16_384;
    /// One entry per thread switched out on a sampled switch and not yet back.
    pub const OFFCPU_PENDING_MAX_ENTRIES: u32 = 16_384;
    /// Slots of `OFFCPU_MAYBE_PENDING` (a power of two): with n entries pending, a switch-in
    /// still looks up with probability about n / slots.
    pub const OFFCPU_MAYBE_PENDING_SLOTS: u32 = 1 << crate::offcpu::MAYBE_PENDING_SLOT_BITS;

    /// Every map of the object, by name (besides the compiler's data sections that hold the
    /// load-time globals and constants, which userspace reaches through [`crate::globals`]):
    /// the core's and every runtime's ([`crate::runtimes::MAPS`]).
    pub const ALL: [&str; 57] = join(CORE, crate::runtimes::MAPS);

    /// `a` then `b`, in a constant.
    const fn join<const A: usize, const B: usize, const N: usize>(
        a: [&'static str; A],
        b: [&'static str; B],
    ) -> [&'static str; N] {
        assert!(A + B == N, "the list's length is the sum of its parts");
        let mut out = [""; N];
        let mut i = 0;
        while i < A {
            out[i] = a[i];
            i += 1;
        }
        while i < N {
            out[i] = b[i - A];
            i += 1;
        }
        out
    }

    /// The maps of the walkers and profile kinds, not of a runtime.
    const CORE: [&str; 54] = [
        CGROUP_FILTER,
        CPU_COUNTS_0,
        CPU_COUNTS_1,
        STACKS,
        STACK_SHARES_0,
        STACK_SHARES_1,
        CONTROL,
        CPU_COUNTERS,
        TARGET_PIDS,
        TARGET_PID_SLOTS,
        STACK_SCRATCH,
        KERNEL_SCRATCH,
        STACK_WINDOW,
        STORED_STACKS,
        ROW_CACHE,
        THREAD_RECORD,
        HEAP_TOTALS_0,
        HEAP_TOTALS_1,
        HEAP_LIVE,
        HEAP_PENDING,
        HEAP_INTERVALS,
        HEAP_COUNTDOWN,
        HEAP_COUNTERS,
        UNWIND_ROWS,
        UNWIND_TABLES,
        UNWIND_PROCESSES,
        UNWIND_PROCESSES_LARGE,
        UNWIND_COUNTERS,
        UNWIND_STATE,
        UNWIND_EXECS,
        REGISTER_ASKS,
        REGISTER_ASKED,
        REGISTER_DECLINED,
        BLOCK_COUNTS_0,
        BLOCK_COUNTS_1,
        MUTEX_COUNTS_0,
        MUTEX_COUNTS_1,
        THREAD_COUNTS_0,
        THREAD_COUNTS_1,
        FUTEX_PENDING,
        FUTEX_PENDING_SPILL,
        FUTEX_SPILLED,
        FUTEX_RANDOM,
        FUTEX_WAKERS,
        FUTEX_COUNTERS,
        THREAD_COUNTERS,
        OFFCPU_COUNTS_0,
        OFFCPU_COUNTS_1,
        OFFCPU_OUT,
        OFFCPU_PENDING,
        OFFCPU_MAYBE_PENDING,
        OFFCPU_CONFIG,
        OFFCPU_COUNTERS,
        FUTEX_CONFIG,
    ];
}

/// Program names: each is the name of its function in `profiler-ebpf`.
pub mod programs {
    /// perf_event on the CPU clock.
    pub const CPU_SAMPLE: &str = "cpu_sample";
    /// Allocator entry uprobes.
    pub const MALLOC_ENTER: &str = "malloc_enter";
    pub const CALLOC_ENTER: &str = "calloc_enter";
    pub const REALLOC_ENTER: &str = "realloc_enter";
    pub const REALLOCARRAY_ENTER: &str = "reallocarray_enter";
    pub const POSIX_MEMALIGN_ENTER: &str = "posix_memalign_enter";
    pub const MEMALIGN_ENTER: &str = "memalign_enter";
    pub const PVALLOC_ENTER: &str = "pvalloc_enter";
    pub const FREE_ENTER: &str = "free_enter";
    /// The uretprobe shared by every allocator function but `free`.
    pub const ALLOC_EXIT: &str = "alloc_exit";
    /// `syscalls:sys_enter_futex`.
    pub const FUTEX_ENTER: &str = "futex_enter";
    /// `syscalls:sys_exit_futex` and the futex2 waits' exits.
    pub const FUTEX_EXIT: &str = "futex_exit";
    pub const FUTEX_WAIT_ENTER: &str = "futex_wait_enter";
    pub const FUTEX_WAITV_ENTER: &str = "futex_waitv_enter";
    pub const FUTEX_WAKE_ENTER: &str = "futex_wake_enter";
    pub const FUTEX_REQUEUE_ENTER: &str = "futex_requeue_enter";
    /// `sched:sched_process_exit` (every thread's exit): drops the thread's wait entry.
    pub const FUTEX_THREAD_EXIT: &str = "futex_thread_exit";
    /// `task:task_newtask`.
    pub const THREAD_CREATE: &str = "thread_create";
    /// `syscalls:sys_enter_execve` and `sys_enter_execveat`.
    pub const UNWIND_EXEC: &str = "unwind_exec";
    /// `syscalls:sys_exit_execve` and `sys_exit_execveat`, attached only while the side band
    /// follows execs: a successful exec leaves `UNWIND_EXECS`, which then tells failed ones.
    pub const UNWIND_EXEC_DONE: &str = "unwind_exec_done";
    /// `iter/task`: one record per thread of one process (the thread dump).
    pub const THREAD_DUMP: &str = "thread_dump";
    /// BTF tracepoint `sched_switch`: the off-CPU profile's sampled switch-outs.
    pub const OFFCPU_SWITCH: &str = "offcpu_switch";
    /// BTF tracepoint `sched_exit_tp` (the end of `__schedule`): the off-CPU profile's
    /// switch-ins, where a sampled switch's stacks are walked and its time charged.
    pub const OFFCPU_SWITCH_IN: &str = "offcpu_switch_in";
    /// Empty programs on the same two tracepoints, attached instead of the two above for a
    /// benchmark's floor (`PROFILER_BENCH_OFFCPU_EMPTY`).
    pub const OFFCPU_EMPTY_SWITCH: &str = "offcpu_empty_switch";
    pub const OFFCPU_EMPTY_SWITCH_IN: &str = "offcpu_empty_switch_in";

    /// The heap profile's programs.
    pub const HEAP: [&str; 9] = [
        MALLOC_ENTER,
        CALLOC_ENTER,
        REALLOC_ENTER,
        REALLOCARRAY_ENTER,
        POSIX_MEMALIGN_ENTER,
        MEMALIGN_ENTER,
        PVALLOC_ENTER,
        FREE_ENTER,
        ALLOC_EXIT,
    ];
    /// The block and mutex profiles' programs.
    pub const FUTEX: [&str; 7] = [
        FUTEX_ENTER,
        FUTEX_EXIT,
        FUTEX_WAIT_ENTER,
        FUTEX_WAITV_ENTER,
        FUTEX_WAKE_ENTER,
        FUTEX_REQUEUE_ENTER,
        FUTEX_THREAD_EXIT,
    ];

    /// Every program of the object.
    pub const ALL: [&str; 25] = [
        CPU_SAMPLE,
        MALLOC_ENTER,
        CALLOC_ENTER,
        REALLOC_ENTER,
        REALLOCARRAY_ENTER,
        POSIX_MEMALIGN_ENTER,
        MEMALIGN_ENTER,
        PVALLOC_ENTER,
        FREE_ENTER,
        ALLOC_EXIT,
        FUTEX_ENTER,
        FUTEX_EXIT,
        FUTEX_WAIT_ENTER,
        FUTEX_WAITV_ENTER,
        FUTEX_WAKE_ENTER,
        FUTEX_REQUEUE_ENTER,
        FUTEX_THREAD_EXIT,
        THREAD_CREATE,
        UNWIND_EXEC,
        UNWIND_EXEC_DONE,
        THREAD_DUMP,
        OFFCPU_SWITCH,
        OFFCPU_EMPTY_SWITCH,
        OFFCPU_EMPTY_SWITCH_IN,
        OFFCPU_SWITCH_IN,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        for (list, what) in [(&maps::ALL[..], "map"), (&programs::ALL[..], "program")] {
            for (i, a) in list.iter().enumerate() {
                assert!(!list[i + 1..].contains(a), "{what} name {a} is listed twice");
            }
        }
    }

    /// Full size up to 64 CPUs, the budget past it, a power of two always.
    #[test]
    fn per_cpu_caches_keep_to_their_budget() {
        use maps::*;
        let row = |cpus| cache_slot_entries(ROW_CACHE_MAX_SLOT_ENTRIES, ROW_CACHE_BUDGET_BYTES, cpus);
        assert_eq!(row(2), 512);
        assert_eq!(row(64), 512);
        assert_eq!(row(65), 256);
        assert_eq!(row(256), 128);
        assert_eq!(row(1 << 20), 16);
        for cpus in [1, 3, 100, 256, 4096] {
            let entries = row(cpus);
            assert!(entries.is_power_of_two());
            let bytes = entries as u64 * SCRATCH_SLOTS as u64 * CACHE_ENTRY_BYTES * cpus as u64;
            assert!(entries == 16 || bytes <= ROW_CACHE_BUDGET_BYTES, "{cpus} CPUs: {bytes} B");
        }
        assert_eq!(cache_slot_entries(STORED_STACKS_MAX_SLOT_ENTRIES, STORED_STACKS_BUDGET_BYTES, 256), 64);
    }

    #[test]
    fn counter_enums_are_numbered_in_order() {
        for (i, c) in CpuCounter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
        for (i, c) in FutexCounter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
        for (i, c) in HeapCounter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
        assert_eq!(UnwindCounter::unsupported(Unsupported::BadCfi), UnwindCounter::COUNT - 1);
        for (i, reason) in Unsupported::ALL.iter().enumerate() {
            assert_eq!(Unsupported::from_index(i as u16), Some(*reason));
        }
        assert_eq!(Unsupported::from_index(Unsupported::COUNT as u16), None);
    }

    #[test]
    fn live_block_capacity_follows_the_sampling_rate() {
        assert_eq!(maps::heap_live_entries(512 * 1024), maps::HEAP_LIVE_MIN_ENTRIES);
        assert_eq!(maps::heap_live_entries(256 * 1024), 131_072);
        assert_eq!(maps::heap_live_entries(1), maps::HEAP_LIVE_MAX_ENTRIES);
        assert_eq!(maps::heap_live_entries(0), maps::HEAP_LIVE_MAX_ENTRIES);
    }

    #[test]
    fn small_process_entries_round_trip() {
        let mut large =
            UnwindProcess { len: 0, flags: 0, mappings: [UnwindMapping::default(); unwind::MAX_PROCESS_MAPPINGS] };
        large.flags = unwind::process_runtime(FrameKind::Python);
        for (i, m) in large.mappings.iter_mut().take(unwind::SMALL_PROCESS_MAPPINGS).enumerate() {
            *m = UnwindMapping::new(i as u64 * 4096, i as u64 * 4096 + 100, 7, i as u32);
        }
        large.len = unwind::SMALL_PROCESS_MAPPINGS as u32;
        let small = large.small().expect("32 mappings fit a small entry");
        let back = small.large();
        assert_eq!(back.len, large.len);
        assert_eq!(back.flags, large.flags, "the flags go with the list");
        assert_eq!(back.mappings[..], large.mappings[..]);
        large.len += 1;
        assert!(large.small().is_none(), "33 mappings do not fit");
    }

    #[test]
    fn target_pid_slots_hold_a_tgid_alone_or_say_shared() {
        use maps::*;
        let listed = [4242u32, 4242 + TARGET_PID_SLOTS_LEN, 17, 17];
        let mut slots = [0u32; TARGET_PID_SLOTS_LEN as usize];
        for tgid in listed {
            let slot = &mut slots[target_pid_slot(tgid) as usize];
            *slot = with_target_pid(*slot, tgid);
        }
        // Two tgids of one slot: the hash decides; a tgid listed twice stays itself.
        assert_eq!(slots[target_pid_slot(4242) as usize], TARGET_PID_SHARED);
        assert_eq!(slots[target_pid_slot(17) as usize], 17);
        assert_eq!(slots.iter().filter(|&&s| s != 0).count(), 2);
    }

    #[test]
    fn waker_slots_spread_words_and_depend_on_the_key() {
        use futex::{waker_slot, FUTEX_WAKERS_SLOTS};
        // Futex words of one process, 8 bytes apart (an array of locks), spread as random ones
        // would be: 4096 in 16384 slots take 16384 (1 - e^-1/4) = 3624 of them on average
        // (standard deviation about 25).
        extern crate std;
        let slots: std::collections::BTreeSet<u32> = (0..4096u64).map(|i| waker_slot(7, 100, 0x5000 + 8 * i)).collect();
        assert!(slots.len() > 3500, "{} distinct slots of 4096 words", slots.len());
        assert!(slots.iter().all(|&s| s < FUTEX_WAKERS_SLOTS));
        // Another key, other slots: a process cannot aim at another's slots without the key.
        let moved = (0..256u64).filter(|&i| waker_slot(7, 100, 0x5000 + 8 * i) != waker_slot(8, 100, 0x5000 + 8 * i));
        assert!(moved.count() > 250);
    }
}
