//! The threadcreate profile: `task:task_newtask`, which runs in the creating thread's context
//! with the new task's `clone_flags`. Only clones with `CLONE_THREAD` are threads of the
//! creator's process; a fork or vfork (a new process) is not counted.
#![allow(non_upper_case_globals)]

use aya_ebpf::{
    macros::{map, tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::TracePointContext,
};
use profiler_common::{
    maps::THREAD_COUNTS_MAX_ENTRIES, threadcreate::CLONE_THREAD, ThreadCounter, ThreadKey, NO_STACK,
};

use crate::{
    maps::{active_set, add_or_insert_in_set, bump, wanted_task, Scratch, COUNTS_MAP_FLAGS},
    stack::capture_user,
    tracepoint::read_field,
};

#[map]
pub static THREAD_COUNTS_0: HashMap<ThreadKey, u64> =
    HashMap::with_max_entries(THREAD_COUNTS_MAX_ENTRIES, COUNTS_MAP_FLAGS);
#[map]
pub static THREAD_COUNTS_1: HashMap<ThreadKey, u64> =
    HashMap::with_max_entries(THREAD_COUNTS_MAX_ENTRIES, COUNTS_MAP_FLAGS);

#[map]
pub static THREAD_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(ThreadCounter::COUNT, 0);

// `u64 clone_flags` in the record, checked against the kernel's `format` file before
// attaching.
use profiler_common::tracepoint::NEWTASK_CLONE_FLAGS as CLONE_FLAGS;

#[tracepoint]
pub fn thread_create(ctx: TracePointContext) -> u32 {
    match try_thread_create(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

/// `Err` for a clone that is not counted (not a thread, filtered out, or the map full).
#[inline(always)]
fn try_thread_create(ctx: &TracePointContext) -> Result<(), ()> {
    if read_field(ctx, CLONE_FLAGS) & CLONE_THREAD == 0 {
        return Err(());
    }
    let tgid = wanted_task().ok_or(())?.tgid;
    let set = active_set();
    let mut truncated = false;
    let stack = capture_user(set, &mut truncated, Scratch::Task, tgid).unwrap_or_else(|_| {
        count(ThreadCounter::StackLost);
        NO_STACK
    });
    let key = ThreadKey { tgid, _pad: 0, stack };
    if !add_or_insert_in_set(set, &THREAD_COUNTS_0, &THREAD_COUNTS_1, &key, &1) {
        count(ThreadCounter::MapFull);
        return Err(());
    }
    count(ThreadCounter::Created);
    Ok(())
}

#[inline(always)]
fn count(counter: ThreadCounter) {
    bump(&THREAD_COUNTERS, counter as u32);
}
