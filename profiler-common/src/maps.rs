//! Map names, shared by both sides, and their sizes.

/// Hash of [`crate::CpuSampleKey`] → sample count, for map set 0. Like every counts map
/// (`*_COUNTS_*`, `HEAP_TOTALS_*`), shared by all CPUs (atomic adds), so its kernel
/// memory does not grow with the number of CPUs, and allocated on insert: userspace empties
/// the drained set within milliseconds of a flip, so a pair holds about one set's entries.
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

/// Default rows of `UNWIND_ROWS`: 32 MiB, 1,024 shards. Not smaller: the distinct files
/// mapped executable on a 2-CPU build machine (cargo, rustc's driver and LLVM, libc...) took
/// 28 MiB of tables, and a table that does not fit is walked with frame pointers.
pub const UNWIND_ROWS_DEFAULT_ENTRIES: u32 = 4 << 20;
/// Tables loaded at once, at most: `UNWIND_TABLES` is sized at load with
/// [`unwind_table_slots`].
pub const UNWIND_TABLES_MAX_ENTRIES: u32 = 2_048;

/// Slots of `UNWIND_TABLES` for `rows` rows of `UNWIND_ROWS`: a table takes at least one
/// shard of [`crate::unwind::SHARD_ROWS`] rows, so there are never more tables than shards
/// (1,024 at the default budget; a slot is 1 KiB of kernel memory).
pub const fn unwind_table_slots(rows: u32) -> u32 {
    let shards = rows / crate::unwind::SHARD_ROWS;
    if shards == 0 {
        1
    } else if shards > UNWIND_TABLES_MAX_ENTRIES {
        UNWIND_TABLES_MAX_ENTRIES
    } else {
        shards
    }
}

/// Processes the kernel side is sized for: each map keyed by process holds this many (or,
/// for `UNWIND_PROCESSES_LARGE`, the share of them that needs its large entries). A map of
/// processes is allocated as they come, so a host with fewer pays for fewer; past it, a
/// process is walked with frame pointers (counted: `/status` unwind `process_maps_full`).
/// 4,096 is several times what a large host runs that the profiler walks; 8,192 cost 11 MiB
/// of the kernel memory budget (`cargo xtask bench memory`).
pub const SIZED_PROCESSES: u32 = 4_096;
/// Processes the walker knows at once with small mapping lists (776 B each)...
pub const UNWIND_PROCESSES_MAX_ENTRIES: u32 = SIZED_PROCESSES;
/// ...and with large ones (6 KiB each): those with more than 32 executable mappings, which
/// few processes have (none of the 31 with executable mappings on a build machine; Python
/// with many extension modules, browsers, some JVMs do): 3 in 32 of the processes. A
/// refused one is counted and walked with frame pointers.
pub const UNWIND_PROCESSES_LARGE_MAX_ENTRIES: u32 = SIZED_PROCESSES * 3 / 32;
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
pub const REGISTER_DECLINED_MAX_ENTRIES: u32 = SIZED_PROCESSES;

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
/// The map is sized at load to the sampling rate ([`heap_totals_entries`]); this is its most.
pub const HEAP_TOTALS_MAX_ENTRIES: u32 = 32_768;
/// ...and its least, when the sampling rate is coarse.
pub const HEAP_TOTALS_MIN_ENTRIES: u32 = 8_192;
/// Allocation per second, in bytes over every profiled process, that each set of the totals
/// map is sized to take with every sample a new key (one key per `sample_bytes` of it).
pub const HEAP_TOTALS_SAMPLED_BYTES_PER_SEC: u64 = 4 << 30;

/// Entries of each heap totals set at `sample_bytes` per sample:
/// [`HEAP_TOTALS_SAMPLED_BYTES_PER_SEC`] of allocation a second each sampled under a new key,
/// within [`HEAP_TOTALS_MIN_ENTRIES`]..=[`HEAP_TOTALS_MAX_ENTRIES`]. At the default 512 KiB
/// that is the minimum, 8,192 (0.8 MiB of kernel memory when full): filling it in a second
/// takes 4 GiB/s of allocation by probed processes, all at stacks or sizes not yet seen that
/// second; a finer rate gets more entries.
pub const fn heap_totals_entries(sample_bytes: u64) -> u32 {
    entries_per_sample(
        HEAP_TOTALS_SAMPLED_BYTES_PER_SEC,
        sample_bytes,
        HEAP_TOTALS_MIN_ENTRIES,
        HEAP_TOTALS_MAX_ENTRIES,
    )
}

/// One entry per `sample_bytes` of `bytes`, within `min..=max`: how the heap maps follow the
/// sampling rate.
const fn entries_per_sample(bytes: u64, sample_bytes: u64, min: u32, max: u32) -> u32 {
    let wanted = bytes / if sample_bytes == 0 { 1 } else { sample_bytes };
    if wanted < min as u64 {
        min
    } else if wanted > max as u64 {
        max
    } else {
        wanted as u32
    }
}
/// Sampled live blocks tracked at once (all processes), at most: what the object
/// declares. Userspace sizes the map at load with [`heap_live_entries`].
pub const HEAP_LIVE_MAX_ENTRIES: u32 = 262_144;
/// ...and at least, when the sampling rate is coarse.
pub const HEAP_LIVE_MIN_ENTRIES: u32 = 32_768;
/// Live heap, in bytes over every profiled process, that the live-block map is sized to
/// follow at the sampling rate: one entry per `sample_bytes` of it. Heap profiling is
/// opt-in per process; 16 GiB of live heap in the processes opted in keeps the map to
/// 3.3 MiB of the kernel memory budget at the default rate (32 GiB took 6.5 MiB). Past it, new
/// samples are dropped from `inuse` and counted; a coarser rate tracks more (32 GiB at 1 MiB).
pub const HEAP_LIVE_TRACKED_BYTES: u64 = 16 << 30;

/// Capacity of the live-block map at `sample_bytes` per sample: [`HEAP_LIVE_TRACKED_BYTES`]
/// of live heap, within [`HEAP_LIVE_MIN_ENTRIES`]..=[`HEAP_LIVE_MAX_ENTRIES`]. At the
/// default 512 KiB that is the minimum, 32 Ki entries (~3.3 MiB of kernel memory when
/// full) instead of the 26 MiB a fixed maximum would take.
pub const fn heap_live_entries(sample_bytes: u64) -> u32 {
    entries_per_sample(HEAP_LIVE_TRACKED_BYTES, sample_bytes, HEAP_LIVE_MIN_ENTRIES, HEAP_LIVE_MAX_ENTRIES)
}
/// Threads inside an allocator call at once: those running one, and those preempted in
/// one. Even at 256 CPUs a few hundred.
pub const HEAP_PENDING_MAX_ENTRIES: u32 = 1_024;

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
pub const TARGET_PIDS_MAX_ENTRIES: u32 = SIZED_PROCESSES;
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
pub const ALL: [&str; 60] = join(CORE, crate::runtimes::MAPS);

/// `a` then `b`, in a constant.
pub(crate) const fn join<const A: usize, const B: usize, const N: usize>(
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
