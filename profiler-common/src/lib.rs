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
pub mod thread_dump;
pub mod threadcreate;
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
pub use thread_dump::{TaskOffsets, ThreadRecord};
pub use threadcreate::{ThreadCounter, ThreadKey};
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
    /// `u32`: the offset of `task_struct.thread.fsbase` (the thread's TLS base, where Go
    /// finds its current `g`), from the kernel's BTF; 0 when unknown (no Go labels are read).
    pub const TASK_FSBASE: &str = "TASK_FSBASE";
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

pub mod maps;

pub mod programs;

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
        assert_eq!(maps::heap_live_entries(128 * 1024), 131_072);
        assert_eq!(maps::heap_live_entries(1), maps::HEAP_LIVE_MAX_ENTRIES);
        assert_eq!(maps::heap_live_entries(0), maps::HEAP_LIVE_MAX_ENTRIES);
    }

    #[test]
    fn heap_totals_capacity_follows_the_sampling_rate() {
        assert_eq!(maps::heap_totals_entries(512 * 1024), maps::HEAP_TOTALS_MIN_ENTRIES);
        assert_eq!(maps::heap_totals_entries(256 * 1024), 16_384);
        assert_eq!(maps::heap_totals_entries(1), maps::HEAP_TOTALS_MAX_ENTRIES);
        assert_eq!(maps::heap_totals_entries(0), maps::HEAP_TOTALS_MAX_ENTRIES);
    }

    /// Each table takes a shard at least, so the slots never outnumber the shards.
    #[test]
    fn unwind_table_slots_follow_the_row_budget() {
        assert_eq!(maps::unwind_table_slots(maps::UNWIND_ROWS_DEFAULT_ENTRIES), 1_024);
        assert_eq!(maps::unwind_table_slots(unwind::SHARD_ROWS), 1);
        assert_eq!(maps::unwind_table_slots(0), 1);
        assert_eq!(maps::unwind_table_slots(u32::MAX), maps::UNWIND_TABLES_MAX_ENTRIES);
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
